//! `Group`: one CID space, its limits, its mode and the lifecycle operations that switch modes (design.md §3, §5).

use crate::bitmap::{Bitmap, MAX_BITS};
use crate::registration::{RegRec, Registration};
use crate::state::*;
use crate::stats::{Counters, Ev, Stats};
use crate::sync::{compiler_fence, fence, Arc, AtomicU32, AtomicUsize, Mutex, Ordering};
use crate::{sys, CpuSet, Error};
use crossbeam_utils::CachePadded;

/// One CID space shared by a group of threads: the user-space `mm`.
///
/// Cheap to clone (a shared handle), `Send + Sync`. Threads join with [`Group::register`] and take a CID for a
/// stretch of code with [`Registration::enter`]; code that does not manage registrations uses [`Group::enter`].
///
/// ```
/// use mmcid::{Group, Mode};
/// let group = Group::new();
/// let mut reg = group.register();
/// let guard = reg.enter();
/// assert_eq!(guard.cid().get(), 0);          // compact: one user, CID 0
/// assert_eq!(group.mode(), Mode::PerTask);
/// drop(guard);
/// drop(reg);
/// assert_eq!(group.users(), 0);
/// assert_eq!(group.stats().cids_in_use, 0);  // nothing leaks (I5)
/// ```
pub struct Group {
    pub(crate) inner: Arc<Inner>,
    /// Whether this handle counts in `Inner::handles`: every handle user code can reach does (groups, their
    /// clones, the ones inside explicit registrations); those inside the thread-local layer's own registrations
    /// do not, so the layer can tell when a group is abandoned.
    counted: bool,
}

impl Clone for Group {
    fn clone(&self) -> Group {
        // Relaxed: a count, not a publication; see `is_abandoned`.
        self.inner.handles.fetch_add(1, Ordering::Relaxed);
        Group { inner: self.inner.clone(), counted: true }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.counted {
            // Release: pairs with the Acquire load in `is_abandoned` (everything done through this handle happens
            // before the thread-local layer drops its registrations).
            self.inner.handles.fetch_sub(1, Ordering::Release);
        }
    }
}

/// Read-mostly words every enter reads: one cache line, written only by mode switches and membership changes.
pub(crate) struct Hot {
    /// Mode word (design.md §2.1).
    pub(crate) mode: AtomicU32,
    /// Current compactness bound (design.md §3).
    pub(crate) max_cids: AtomicU32,
    /// Whether light barriers may be compiler fences (membarrier registered).
    pub(crate) asym: bool,
    /// The mode word value for which enter and exit may finish inline after only a compiler fence: `PER_TASK`
    /// when the heavy side is membarrier, else `NOT_A_MODE`, which no mode word ever equals, so the fallback
    /// always reaches `light_barrier_rest` (and so does every loom model: loom has no membarrier).
    pub(crate) fast_task: u32,
    /// The same for per-CPU exits: `PER_CPU` with membarrier, else `NOT_A_MODE`.
    pub(crate) fast_cpu: u32,
    /// Whether slots are borrowed with an rseq critical section instead of a CAS (design.md §4.1.1).
    pub(crate) rseq: bool,
    /// The group's process-unique id (`Group::id`), here so that a guard takes it from the line its enter reads
    /// anyway.
    pub(crate) id: u64,
    /// CIDs a core may own at once (design.md §2.6): slots `0..k` of each core are in use.
    pub(crate) k: u32,
    /// rseq groups: `__rseq_offset` (`sys::rseq::area`), where the borrowing thread's rseq area lies.
    pub(crate) rseq_area: isize,
}

/// The most CIDs a core may own at once (design.md §2.6): its slot words fill one 64-byte line.
pub const MAX_CIDS_PER_CORE: usize = 16;
/// log2 of [`MAX_CIDS_PER_CORE`]: slot `j` of core `cpu` is slot index `cpu << SLOT_SHIFT | j`.
pub(crate) const SLOT_SHIFT: u32 = 4;
const _: () = assert!(1 << SLOT_SHIFT == MAX_CIDS_PER_CORE);

/// A core's slot words (design.md §2.3, §2.6), on the core's own cache lines.
pub(crate) type CoreSlots = CachePadded<[AtomicU32; MAX_CIDS_PER_CORE]>;

/// The core of slot index `at`.
#[inline(always)]
pub(crate) fn core_of(at: usize) -> usize {
    at >> SLOT_SHIFT
}

/// Slot index of slot `j` of core `cpu`.
#[inline(always)]
pub(crate) fn slot_at(cpu: usize, j: usize) -> usize {
    cpu << SLOT_SHIFT | j
}

/// `Hot::fast_task` and `Hot::fast_cpu` of a group without membarrier: not a mode word value.
pub(crate) const NOT_A_MODE: u32 = u32::MAX;

pub(crate) struct Inner {
    pub(crate) hot: CachePadded<Hot>,
    /// Each core's slot words (design.md §2.3, §2.6), on its own cache lines; `slot(at)` reads them by index.
    pub(crate) slots: Box<[CoreSlots]>,
    pub(crate) bitmap: Bitmap,
    /// Possible cores (the kernel's N), or the number of virtual cores.
    pub(crate) cores: usize,
    pub(crate) virtual_cpus: bool,
    users: AtomicUsize,
    /// Counted `Group` handles (see `Group::counted`). A plain std atomic even under loom: its one ordering
    /// argument (the Release decrement in `Drop` against the Acquire load in `is_abandoned`) serves only the
    /// thread-local layer, which is not compiled there.
    handles: std::sync::atomic::AtomicUsize,
    life: Mutex<Life>,
    /// Serialises `idle → EMPTY` claims in rseq groups (design.md §4.1.1): a try-only lock (0 free, 1 held), so
    /// nobody ever waits for a claimer; never held across user code.
    claim: AtomicU32,
    /// 1 when an exit found `claim` held and left its idle slot for the holder to take (`defer_claim`).
    claims_deferred: AtomicU32,
    /// Loom's model of the restartable sequence: one lock per core, held across the sequence (design.md §4.1.1).
    #[cfg(loom)]
    cs: Box<[loom::sync::Mutex<()>]>,
    #[cfg(loom)]
    pub(crate) mutant: Mutant,
    /// Loom: every membarrier fails (`GroupBuilder::failing_barriers`, design.md §12).
    #[cfg(loom)]
    failing_barriers: bool,
    /// Tests: membarrier calls told to fail (design.md §12).
    #[cfg(all(test, not(loom)))]
    pub(crate) fail_barriers: sys::FailBarriers,
}

/// State changed only under the lifecycle lock (the kernel's `mm_cid.mutex` + `mm_cid.lock`).
struct Life {
    users: usize,
    /// The explicit registration list walked by task → CPU fixups (kernel 192d852129b1).
    regs: Vec<Option<Arc<RegRec>>>,
    free: Vec<usize>,
    allowed: CpuSet,
    /// Switch-back threshold; non-zero ⇔ per-CPU mode wanted.
    thrs: usize,
    /// Per-CPU ownership was found to use as many CIDs as per-task ownership would (design.md §3.1): per-task
    /// mode, with `max_cids` at least `users`, until `users` falls below the kernel's switch-back threshold.
    occupied: bool,
    /// Lifecycle events plus the counters of dropped registrations.
    counters: Counters,
}

enum Flip {
    None,
    ToPerCpu,
    ToPerTask,
}

/// Builds a [`Group`] with a chosen CPU set.
///
/// ```
/// use mmcid::{CpuSet, Group};
/// let group = Group::builder().cpus(CpuSet::current()?).build()?;
/// assert!(group.cpus().len() >= 1);
/// // A simulated 8-core group, e.g. to exercise per-CPU mode on a small machine:
/// let sim = Group::builder().virtual_cpus(8).build()?;
/// assert_eq!(sim.cores(), 8);
/// # Ok::<(), mmcid::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct GroupBuilder {
    cpus: Option<CpuSet>,
    virtual_cpus: Option<usize>,
    /// A bad `cpus_virtual` argument, reported by `build`.
    invalid: Option<Error>,
    asymmetric: bool,
    /// `restartable_sequences`: `None` = where available (never under loom).
    rseq: Option<bool>,
    /// `cids_per_core`: `None` = the default (16; 1 under loom, where model 13 sets 2).
    cids_per_core: Option<usize>,
    #[cfg(loom)]
    mutant: Mutant,
    #[cfg(loom)]
    failing_barriers: bool,
}

impl Default for Group {
    fn default() -> Self {
        Group::new()
    }
}

impl Group {
    /// A group whose allowed cores are the calling thread's affinity mask.
    pub fn new() -> Group {
        Group::builder().build().unwrap_or_else(|_| {
            // Only an OS failure of sched_getaffinity gets here: fall back to every possible CPU.
            let all = CpuSet::raw(0..sys::possible_cpus());
            GroupBuilder { cpus: Some(all), ..Group::builder() }.build_unchecked()
        })
    }

    /// A builder for a group with a chosen CPU set or virtual cores.
    pub fn builder() -> GroupBuilder {
        GroupBuilder {
            cpus: None,
            virtual_cpus: None,
            invalid: None,
            asymmetric: true,
            rseq: None,
            cids_per_core: None,
            #[cfg(loom)]
            mutant: Mutant::None,
            #[cfg(loom)]
            failing_barriers: false,
        }
    }

    /// Registers a thread (≈ fork): the returned registration is how that thread enters. In per-task mode the new
    /// registration owns a CID from birth; a registration that makes `users > max_cids` switches the group to
    /// per-CPU mode before this returns.
    ///
    /// # Panics
    ///
    /// Only past a million registrations at once (the CID space's hard size); [`Group::try_register`] returns the
    /// error instead.
    pub fn register(&self) -> Registration {
        match self.try_register() {
            Ok(reg) => reg,
            Err(e) => panic!("{e}"),
        }
    }

    /// Like [`Group::register`], returning [`Error::TooManyRegistrations`] instead of panicking.
    pub fn try_register(&self) -> Result<Registration, Error> {
        self.register_with(self.clone())
    }

    /// A registration for the thread-local layer's own use: its group handle does not count, so the layer can
    /// drop it once user code has dropped every handle ([`Group::is_abandoned`]).
    #[cfg(not(loom))]
    pub(crate) fn register_uncounted(&self) -> Registration {
        match self.register_with(Group { inner: self.inner.clone(), counted: false }) {
            Ok(reg) => reg,
            Err(e) => panic!("{e}"),
        }
    }

    /// Whether user code has dropped every counted handle: nothing can enter this group any more except the
    /// registrations the thread-local layer holds, which it may then drop. Once true, stays true (a counted handle
    /// is only ever made from another one).
    #[cfg(not(loom))]
    pub(crate) fn is_abandoned(&self) -> bool {
        // Acquire: pairs with the Release decrement in `Drop`.
        self.inner.handles.load(Ordering::Acquire) == 0
    }

    /// The most registrations the group can have at once (its CID space's hard size less what the cores may own,
    /// and the one free bit allocation relies on).
    pub(crate) fn registration_limit(&self) -> usize {
        MAX_BITS - self.inner.core_share() - 1
    }

    fn register_with(&self, handle: Group) -> Result<Registration, Error> {
        let inner = &*self.inner;
        let mut life = inner.life.lock();
        // I2's hard bound plus one (design.md §2.4, §2.6): every allocation finds a free bit.
        if !inner.bitmap.grow(life.users + 1 + inner.core_share() + 1) {
            return Err(Error::TooManyRegistrations { limit: self.registration_limit() });
        }
        let rec = Arc::new(RegRec::new());
        let index = match life.free.pop() {
            Some(i) => {
                life.regs[i] = Some(rec.clone());
                i
            }
            None => {
                life.regs.push(Some(rec.clone()));
                life.regs.len() - 1
            }
        };
        life.users += 1;
        // Relaxed: stored under the lock; readers take a snapshot (`temp_bound`, `Group::users`).
        inner.users.store(life.users, Ordering::Relaxed);
        let flip = inner.update_limits(&mut life);
        inner.apply(&mut life, flip);
        // Relaxed: we hold the lifecycle lock, and only its holder stores the mode.
        if inner.hot.mode.load(Ordering::Relaxed) & ONCPU == 0 {
            // Per-task: the child owns a CID from birth (kernel `sched_mm_cid_fork`). Nobody else can see `rec`'s
            // word yet except fixups, which need the lock we hold.
            let cid = inner.bitmap.get();
            life.counters.bump(Ev::BitmapSet);
            // Relaxed: fixups read it under the lock we hold, and the owner receives the registration from us.
            rec.cid.store(cid, Ordering::Relaxed);
        }
        drop(life);
        Ok(Registration::new(handle, rec, index))
    }

    /// Number of registered threads.
    pub fn users(&self) -> usize {
        // Relaxed: a snapshot of a value stored under the lifecycle lock.
        self.inner.users.load(Ordering::Relaxed)
    }

    /// The current compactness bound (I2): in steady state every CID a registration owns and every core's first
    /// CID, and so every per-task guard's CID and every per-CPU guard's on a core whose first CID was idle, is
    /// below it. A core's extra CIDs ([`GroupBuilder::cids_per_core`]) and temporary CIDs
    /// ([`CidKind::Temporary`](crate::CidKind::Temporary)) serve guards entered while a thread descheduled inside
    /// its guard holds the core's first CID; they are only below the hard bound, `users + K · cores` as it was when
    /// the CID was handed out: a guard keeps its CID while membership shrinks (the crate docs' "The range bound,
    /// exactly").
    pub fn max_cids(&self) -> usize {
        self.inner.max_cids()
    }

    /// Who owns CIDs now.
    pub fn mode(&self) -> crate::Mode {
        // Acquire: pairs with F1/F4, as in enter: a caller that sees the final mode sees the switch's effects.
        crate::Mode::from_word(self.inner.hot.mode.load(Ordering::Acquire))
    }

    /// Number of cores the group's slots cover: the machine's possible CPUs, or the virtual CPUs.
    pub fn cores(&self) -> usize {
        self.inner.cores
    }

    /// The cores the group may use (grows only).
    pub fn cpus(&self) -> CpuSet {
        self.inner.life.lock().allowed.clone()
    }

    /// The most CIDs a core may own at once in per-CPU mode ([`GroupBuilder::cids_per_core`]). With `users`
    /// registrations, every CID handed out is below `users + cids_per_core() · cores()` (I2's hard bound).
    pub fn cids_per_core(&self) -> usize {
        self.inner.hot.k as usize
    }

    /// Whether light barriers are compiler fences paired with `membarrier` (design.md §5.1).
    pub fn uses_membarrier(&self) -> bool {
        self.inner.hot.asym
    }

    /// Whether per-CPU borrows are restartable sequences instead of CAS (design.md §4.1.1): set where the
    /// kernel, glibc and the target allow it, for groups over the machine's real CPUs (see
    /// [`GroupBuilder::restartable_sequences`]).
    pub fn uses_rseq(&self) -> bool {
        self.inner.hot.rseq
    }

    /// Path counters and CIDs in use.
    pub fn stats(&self) -> Stats {
        let life = self.inner.life.lock();
        let mut totals = Stats::totals();
        life.counters.add_to(&mut totals);
        for rec in life.regs.iter().flatten() {
            rec.counters.add_to(&mut totals);
        }
        Stats::from_totals(&totals, self.inner.bitmap.count())
    }

    /// Widens the cores the group may use (`nr_cpus_allowed` grows only, as in the kernel). If the group is in
    /// per-CPU mode and the wider set raises the switch-back threshold above `users`, the group switches back to
    /// per-task mode before this returns (the kernel defers this through irq_work; we hold no scheduler lock).
    ///
    /// Unlike the kernel's, the set is what the user declares, not the union of the threads' affinities: call this
    /// when the group's threads may run on more cores. A thread entering on a core outside the set stays correct
    /// (I1), but in per-CPU mode that core's CID is usually out of range, so its enters converge by taking an idle
    /// in-range CID from another core ([`Stats::steals`]; in a group with restartable sequences each steal is a
    /// `membarrier` system call) and its CID does not stay stable (I3).
    ///
    /// ```
    /// let group = mmcid::Group::builder().virtual_cpus(4).cpus_virtual([0]).build()?;
    /// assert_eq!(group.cpus().len(), 1);
    /// group.set_cpus_allowed(&mmcid::CpuSet::virtual_set([1, 2])?)?;
    /// assert_eq!(group.cpus().len(), 3);
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    pub fn set_cpus_allowed(&self, cpus: &CpuSet) -> Result<(), Error> {
        let inner = &*self.inner;
        if cpus.is_empty() {
            return Err(Error::EmptyCpuSet);
        }
        if let Some(cpu) = cpus.iter().find(|&c| c >= inner.cores) {
            return Err(Error::CpuOutOfRange { cpu, possible: inner.cores });
        }
        if !inner.virtual_cpus {
            cpus.validate_real()?;
        }
        let mut life = inner.life.lock();
        if life.allowed.union_with(cpus) {
            // Relaxed: we hold the lifecycle lock, and only its holder stores the mode.
            if inner.hot.mode.load(Ordering::Relaxed) & ONCPU != 0 {
                // The kernel recomputes the threshold from opt = min(allowed, users) ≤ users, so `users < thrs`
                // can never hold there and widening never switches back. We take it from the allowed cores:
                // switch back once users are below ~3/4 of the cores now allowed (capped at cores/2, as the
                // kernel caps it). design.md §3.
                life.thrs = inner.thrs(life.allowed.len());
            }
            let flip = inner.update_limits(&mut life);
            inner.apply(&mut life, flip);
        }
        Ok(())
    }

    /// A process-unique id, used to match guards with data of the same group.
    pub(crate) fn id(&self) -> u64 {
        self.inner.hot.id
    }

    /// Checks the ownership invariant (design.md §2.4) at quiescence: returns the number of set bits and the number
    /// of owners (registration words and core slots), every CID owned twice, and the user count against the
    /// registrations in the list the walks read (kernel b2e48c429ec5: a counted user the walks cannot see). Only
    /// meaningful when no guard is alive and no lifecycle operation runs. Used by tests and loom models.
    #[doc(hidden)]
    pub fn audit(&self) -> Audit {
        let inner = &*self.inner;
        let life = inner.life.lock();
        let mut owned: Vec<u32> =
            life.regs.iter().flatten().map(|r| r.cid.load(Ordering::Acquire)).filter(|&w| w != UNSET).collect();
        owned.extend(
            inner.all_slots().map(|(_, s)| s.load(Ordering::Acquire)).filter(|&s| s & ONCPU != 0).map(|s| s & VALUE),
        );
        let mut sorted = owned.clone();
        sorted.sort_unstable();
        let mut duplicates: Vec<u32> = sorted.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect();
        duplicates.dedup();
        let unmarked = owned.iter().copied().filter(|&c| !inner.bitmap.is_set(c)).collect();
        let listed = life.regs.iter().flatten().count();
        Audit { bits: inner.bitmap.count(), owners: owned.len(), duplicates, unmarked, users: life.users, listed }
    }
}

/// Result of [`Group::audit`].
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    /// Bits set in the bitmap.
    pub bits: usize,
    /// Owners found: registration words holding a CID plus core slots owning one.
    pub owners: usize,
    /// CIDs held by two owners.
    pub duplicates: Vec<u32>,
    /// CIDs held by an owner whose bit is clear.
    pub unmarked: Vec<u32>,
    /// The group's user count ([`Group::users`]).
    pub users: usize,
    /// Registrations in the list the fixup walks read.
    pub listed: usize,
}

impl Audit {
    /// Bits equal owners, nothing owned twice, nothing owned without its bit, every user listed.
    pub fn is_consistent(&self) -> bool {
        self.bits == self.owners && self.duplicates.is_empty() && self.unmarked.is_empty() && self.users == self.listed
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("users", &self.users())
            .field("max_cids", &self.max_cids())
            .field("mode", &self.mode())
            .field("cores", &self.cores())
            .finish()
    }
}

impl GroupBuilder {
    /// The cores the group may use (default: the calling thread's affinity mask). Threads should run on these
    /// only; widen with [`Group::set_cpus_allowed`] (what a thread outside them costs is described there).
    pub fn cpus(mut self, cpus: CpuSet) -> Self {
        // The last call that sets the cores wins, a rejected one included.
        (self.cpus, self.invalid) = (Some(cpus), None);
        self
    }

    /// Simulate `n` cores numbered `0..n`, whatever the machine has: threads map to core `cpu % n` (or the core
    /// given to [`Registration::set_cpu`]). Lets a small machine exercise per-CPU mode and mode switches the way a
    /// large one would; CIDs stay exclusive whatever the mapping.
    pub fn virtual_cpus(mut self, n: usize) -> Self {
        self.virtual_cpus = Some(n);
        self
    }

    /// With virtual cores, the subset the group may use at first (default: all of them). A CPU beyond the
    /// virtual cores is reported by [`build`](GroupBuilder::build).
    pub fn cpus_virtual<I: IntoIterator<Item = usize>>(mut self, cpus: I) -> Self {
        match CpuSet::below(cpus, MAX_CPUS) {
            Ok(set) => (self.cpus, self.invalid) = (Some(set), None),
            Err(e) => (self.cpus, self.invalid) = (None, Some(e)),
        }
        self
    }

    /// Use `membarrier` for the rare side of the Dekker pairs so that enter/exit need only compiler fences
    /// (default true; falls back to full fences where membarrier is unavailable). `false` forces the fallback,
    /// and with it CAS borrows ([`GroupBuilder::restartable_sequences`] needs the membarrier).
    pub fn asymmetric_fences(mut self, on: bool) -> Self {
        self.asymmetric = on;
        self
    }

    /// Borrow core CIDs with an rseq critical section instead of a CAS, so a per-CPU enter+exit needs no atomic
    /// read-modify-write (design.md §4.1.1). Default: on wherever it can work (x86_64 Linux, glibc's rseq area
    /// registered, `membarrier` with RSEQ support, asymmetric fences on, real rather than virtual cores);
    /// `false` forces the CAS. [`Group::uses_rseq`] says what the group got.
    pub fn restartable_sequences(mut self, on: bool) -> Self {
        self.rseq = Some(on);
        self
    }

    /// The most CIDs a core may own at once in per-CPU mode (design.md §2.6), from 1 to
    /// [`MAX_CIDS_PER_CORE`] (default: the maximum; for more than 32 768 cores, less, so that the cores' share stays
    /// within half the CID space). When a thread descheduled inside its guard holds its core's
    /// first CID, the next thread entering on that core borrows one of the core's extra CIDs (a borrow like the
    /// first one's: a restartable sequence or one CAS, then a plain store at exit) instead of taking a temporary
    /// CID from the bitmap and giving it back at exit (two atomic read-modify-writes). A core keeps as many CIDs as
    /// the most guards its threads held at once, up to this; 1 makes every enter on a busy core take a temporary.
    ///
    /// ```
    /// let group = mmcid::Group::builder().virtual_cpus(1).cids_per_core(2).build()?;
    /// let (mut a, mut b, _c) = (group.register(), group.register(), group.register()); // per-CPU mode
    /// let first = a.enter(); // the core's first CID
    /// let second = b.enter(); // the core's CID is held: its second one, not a temporary
    /// assert_eq!((first.kind(), second.kind()), (mmcid::CidKind::Core(0), mmcid::CidKind::Core(0)));
    /// assert_ne!(first.cid(), second.cid());
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    pub fn cids_per_core(mut self, k: usize) -> Self {
        self.cids_per_core = Some(k);
        self
    }

    /// Loom only: build the group with one mutant step (docs/loom.md).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn mutant(mut self, mutant: Mutant) -> Self {
        self.mutant = mutant;
        self
    }

    /// Loom only: a group whose light barriers are compiler fences (the membarrier build) and whose every
    /// membarrier fails, as after a seccomp filter forbade it (design.md §12, loom model 13).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn failing_barriers(mut self, on: bool) -> Self {
        self.failing_barriers = on;
        self
    }

    /// Builds the group, validating the CPU set (I9). Of the calls that set the cores ([`GroupBuilder::cpus`],
    /// [`GroupBuilder::cpus_virtual`]) the last one counts, a rejected one included.
    ///
    /// # Errors
    ///
    /// - [`Error::ZeroThreads`] for `virtual_cpus(0)`, [`Error::ValueOutOfRange`] for more than 65 536;
    /// - [`Error::EmptyCpuSet`] for an empty set;
    /// - [`Error::CpuOutOfRange`] for a CPU at or beyond the virtual cores, or (real cores) the machine's possible
    ///   CPUs;
    /// - real cores: [`Error::CpuNotAllowed`] for one outside the affinity masks of the calling thread and of the
    ///   process's main thread, unless the set came from [`CpuSet::current`] or [`CpuSet::from_cpus`], which
    ///   checked it when it was made (a thread may narrow its own mask after taking the set, e.g. pin itself to
    ///   one core and then build a group over all of them);
    /// - [`Error::Os`] if the calling thread's affinity mask cannot be read.
    ///
    /// ```
    /// use mmcid::{Error, Group};
    /// assert_eq!(Group::builder().virtual_cpus(4).cpus_virtual([4]).build().unwrap_err(),
    ///            Error::CpuOutOfRange { cpu: 4, possible: 4 });
    /// assert!(matches!(Group::builder().virtual_cpus(1 << 20).build(), Err(Error::ValueOutOfRange { .. })));
    /// // Without `virtual_cpus` the cores are real: a CPU the machine cannot have is refused.
    /// assert!(matches!(Group::builder().cpus_virtual([60_000]).build(), Err(Error::CpuOutOfRange { .. })));
    /// ```
    pub fn build(self) -> Result<Group, Error> {
        if let Some(e) = self.invalid.clone() {
            return Err(e);
        }
        if let Some(k) = self.cids_per_core {
            let cores = self.virtual_cpus.unwrap_or_else(sys::possible_cpus).max(1);
            Error::check_range("cids_per_core", k, 1, cids_per_core_limit(cores))?;
        }
        match self.virtual_cpus {
            Some(0) => Err(Error::ZeroThreads),
            Some(n) => {
                Error::check_range("virtual_cpus", n, 1, MAX_CPUS)?;
                let cpus = self.cpus.clone().unwrap_or_else(|| CpuSet::raw(0..n));
                if cpus.is_empty() {
                    return Err(Error::EmptyCpuSet);
                }
                if let Some(cpu) = cpus.iter().find(|&c| c >= n) {
                    return Err(Error::CpuOutOfRange { cpu, possible: n });
                }
                Ok(GroupBuilder { cpus: Some(cpus), ..self }.build_unchecked())
            }
            None => {
                let cpus = match self.cpus.clone() {
                    Some(c) => c,
                    None => CpuSet::current()?,
                };
                cpus.validate_real()?;
                Ok(GroupBuilder { cpus: Some(cpus), ..self }.build_unchecked())
            }
        }
    }

    fn build_unchecked(self) -> Group {
        // First: a fork from now on waits for this build's process-wide probes below (design.md §12.2).
        #[cfg(not(loom))]
        crate::fork::install();
        let cores = self.virtual_cpus.unwrap_or_else(sys::possible_cpus);
        let allowed = self.cpus.unwrap_or_else(|| CpuSet::raw(0..cores));
        let asym = self.asymmetric && sys::membarrier_available();
        // Loom has no membarrier; a group whose membarrier fails is still built as one that has it.
        #[cfg(loom)]
        let asym = asym || self.failing_barriers;
        sys::rseq::probe(); // here, not on the hot path: it takes the loader's lock

        // Real cores only: the sequence excludes the threads of one CPU, so two CPUs must never share a slot.
        #[cfg(not(loom))]
        let rseq = self.rseq != Some(false)
            && asym
            && self.virtual_cpus.is_none()
            && sys::rseq::critical_sections()
            && sys::rseq::cpu_id().is_some()
            && sys::membarrier_rseq_available();
        #[cfg(loom)]
        let rseq = self.rseq == Some(true);
        let k = self.cids_per_core.unwrap_or(if cfg!(loom) { 1 } else { cids_per_core_limit(cores) });
        #[allow(unused_mut)]
        let mut bitmap = Bitmap::new(cores);
        #[cfg(loom)]
        {
            bitmap.relaxed = self.mutant == Mutant::RelaxedBitmap;
        }
        let group = Group {
            inner: Arc::new(Inner {
                hot: CachePadded::new(Hot {
                    mode: AtomicU32::new(PER_TASK),
                    max_cids: AtomicU32::new(0),
                    asym,
                    fast_task: if asym { PER_TASK } else { NOT_A_MODE },
                    fast_cpu: if asym { PER_CPU } else { NOT_A_MODE },
                    rseq,
                    id: next_group_id(),
                    k: k as u32,
                    rseq_area: if rseq { sys::rseq::area() } else { 0 },
                }),
                slots: (0..cores).map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU32::new(EMPTY)))).collect(),
                bitmap,
                cores,
                virtual_cpus: self.virtual_cpus.is_some(),
                users: AtomicUsize::new(0),
                handles: std::sync::atomic::AtomicUsize::new(1),
                life: Mutex::new(Life {
                    users: 0,
                    regs: Vec::new(),
                    free: Vec::new(),
                    allowed,
                    thrs: 0,
                    occupied: false,
                    counters: Counters::default(),
                }),
                claim: AtomicU32::new(0),
                claims_deferred: AtomicU32::new(0),
                #[cfg(loom)]
                cs: (0..cores).map(|_| loom::sync::Mutex::new(())).collect(),
                #[cfg(loom)]
                mutant: self.mutant,
                #[cfg(loom)]
                failing_barriers: self.failing_barriers,
                #[cfg(all(test, not(loom)))]
                fail_barriers: sys::FailBarriers::default(),
            }),
            counted: true,
        };
        #[cfg(not(loom))]
        crate::fork::track(&group.inner);
        group
    }
}

/// The most CIDs a core of a group of `cores` may own: [`MAX_CIDS_PER_CORE`], less where the cores' share would take
/// more than half the CID space (only groups of more than 32 768 cores, virtual ones).
fn cids_per_core_limit(cores: usize) -> usize {
    (MAX_BITS / 2 / cores).clamp(1, MAX_CIDS_PER_CORE)
}

/// Whether `holders` guards held at once in per-CPU mode, with `cores` the group's `max_cids` (in per-CPU mode the
/// cores it may use), make per-task ownership of `users` CIDs
/// worth it (design.md §3.1): at least half the users, so per-task ownership needs at most twice the CIDs the
/// holders need anyway, and more than twice the cores, so most holders are descheduled threads and per-CPU ownership
/// could not stay compact (without the second condition, threads that start one after another, a few of them
/// already inside guards while the rest still register, would switch a group that needs only its cores).
fn occupied_at(holders: usize, users: usize, cores: usize) -> bool {
    holders * 2 >= users && holders > 2 * cores
}

/// The most cores (virtual or real) a group covers: one cache-padded slot each, and the core number must fit the
/// guard's packed record.
pub(crate) const MAX_CPUS: usize = 1 << 16;

fn next_group_id() -> u64 {
    // A plain std atomic even under loom: ids only need to differ, and loom must not see this static.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Inner {
    #[inline(always)]
    pub(crate) fn max_cids(&self) -> usize {
        // Relaxed: a stale bound only changes whether converge runs (as the kernel's `READ_ONCE(max_cids)`).
        self.hot.max_cids.load(Ordering::Relaxed) as usize
    }

    /// Slot word `at` (`slot_at(cpu, j)`, design.md §2.6).
    #[inline(always)]
    pub(crate) fn slot(&self, at: usize) -> &AtomicU32 {
        &self.slots[core_of(at)][at & (MAX_CIDS_PER_CORE - 1)]
    }

    /// The slot words in use of core `cpu`, with their indexes: `0..k`.
    pub(crate) fn core_slots(&self, cpu: usize) -> impl Iterator<Item = (usize, &AtomicU32)> {
        self.slots[cpu][..self.hot.k as usize].iter().enumerate().map(move |(j, s)| (slot_at(cpu, j), s))
    }

    /// Every slot word in use, with its index: what sweeps, drains and audits visit.
    pub(crate) fn all_slots(&self) -> impl Iterator<Item = (usize, &AtomicU32)> {
        (0..self.cores).flat_map(move |cpu| self.core_slots(cpu))
    }

    /// The most CIDs the cores may own at once: `K · cores` (I2's hard bound is `users` more, design.md §2.6).
    pub(crate) fn core_share(&self) -> usize {
        self.hot.k as usize * self.cores
    }

    /// Whether the loom mutant `m` is active (always false in normal builds).
    #[inline(always)]
    #[allow(unused_variables)]
    pub(crate) fn mutant(&self, m: MutantId) -> bool {
        #[cfg(loom)]
        {
            self.mutant == m
        }
        #[cfg(not(loom))]
        {
            false
        }
    }

    /// The I2 hard bound as this thread sees it now, `users + cores`: temporaries from a core's bitmap lane are
    /// taken only below it (`Bitmap::get_near`). Relaxed: `users` changes only under the lifecycle lock, and a
    /// stale value is as good as the one lowest-first allocation would have seen an instant earlier.
    #[inline]
    pub(crate) fn temp_bound(&self) -> usize {
        self.users.load(Ordering::Relaxed) + self.cores
    }

    /// Light side of the Dekker pairs (E2, X2): a compiler fence when the heavy side uses membarrier, else a
    /// full fence. Pairs with `heavy_barrier` (F2). See design.md §5.1. The fast paths split it in two: the
    /// compiler fence inline, `light_barrier_rest` out of line.
    #[inline(always)]
    pub(crate) fn light_barrier(&self) {
        compiler_fence(Ordering::SeqCst);
        self.light_barrier_rest();
    }

    /// The part of the light barrier that the inline fast paths leave out: after their compiler fence, the full
    /// fence of a group without membarrier. Returns whether it fenced, i.e. whether loads made before it must be
    /// made again.
    #[inline(always)]
    pub(crate) fn light_barrier_rest(&self) -> bool {
        let full = !self.hot.asym;
        if full {
            // E2 / X2 without membarrier: pairs with F2's SeqCst fence (Dekker pairs D-enter, D-exit, D-core, §5.1).
            fence(Ordering::SeqCst);
        }
        full
    }

    /// After a fast path's compiler fence and its load `m` of the mode word (E3 or X3): completes the light barrier
    /// (unless loom mutant `skip` removes it) and returns the mode word as read after the whole barrier.
    #[inline(always)]
    pub(crate) fn mode_after_light_barrier(&self, m: u32, skip: MutantId) -> u32 {
        if !self.mutant(skip) && self.light_barrier_rest() {
            self.hot.mode.load(Ordering::Acquire)
        } else {
            m
        }
    }

    /// Heavy side (F2): membarrier on every CPU running a thread of this process, or a full fence. In rseq groups
    /// the RSEQ membarrier, which also aborts every restartable sequence in flight (design.md §4.1.1). False if
    /// the membarrier failed (design.md §12): then it ordered nothing, and the caller must not rely on it.
    fn heavy_barrier(&self) -> bool {
        if self.hot.rseq && !self.mutant(MUTANT_PLAIN_FIXUP_BARRIER) {
            self.rseq_barrier()
        } else if self.hot.asym {
            self.membarrier(false)
        } else {
            fence(Ordering::SeqCst);
            true
        }
    }

    /// The RSEQ membarrier: once it returns true, every borrow sequence has either committed (and its store is
    /// visible to us) or will start after it (and see everything we stored before). False if it failed (design.md
    /// §12). Loom: a full fence, then every core's sequence lock taken and released.
    fn rseq_barrier(&self) -> bool {
        #[cfg(not(loom))]
        {
            self.membarrier(true)
        }
        #[cfg(loom)]
        {
            if self.failing_barriers {
                return false;
            }
            fence(Ordering::SeqCst);
            for cs in self.cs.iter() {
                drop(cs.lock().unwrap_or_else(|e| e.into_inner()));
            }
            true
        }
    }

    /// One membarrier, the RSEQ command if `rseq`: retried while it fails with a transient error, false if it
    /// failed after all (design.md §12). Tests can make it fail (`fail_barriers`).
    #[cfg(not(loom))]
    fn membarrier(&self, rseq: bool) -> bool {
        sys::membarrier_retrying(|| {
            #[cfg(test)]
            if let Some(errno) = self.fail_barriers.next() {
                return Err(errno);
            }
            if rseq {
                sys::membarrier_rseq()
            } else {
                sys::membarrier()
            }
        })
        .is_ok()
    }

    /// Loom has no membarrier: a group has asymmetric fences only when built with `failing_barriers`.
    #[cfg(loom)]
    fn membarrier(&self, _rseq: bool) -> bool {
        !self.failing_barriers
    }

    /// F2 of a switch: whether its walk may take what the light side could still be using. False, counted, when
    /// the barrier failed: the task → CPU walk then takes nothing, and the CPU → task sweep of an rseq group
    /// neither (design.md §12).
    fn fixup_barrier(&self, life: &Life) -> bool {
        if self.mutant(MUTANT_NO_FIXUP_BARRIER) || self.heavy_barrier() {
            return true;
        }
        life.counters.bump(Ev::BarrierFailed);
        self.mutant(MUTANT_IGNORE_FAILED_BARRIER)
    }

    /// The RSEQ membarrier between a claim (or a drain's claims) and its take; false, counted in `c`, when it
    /// failed: the claimer then gives its claims back (`unclaim`, design.md §12).
    fn claim_barrier(&self, c: &Counters) -> bool {
        if self.rseq_barrier() {
            return true;
        }
        c.bump(Ev::BarrierFailed);
        self.mutant(MUTANT_IGNORE_FAILED_CLAIM_BARRIER)
    }

    /// Gives back a claim `s | CLAIM` whose barrier failed: the core owns `c` idle again, as before the claim.
    /// Release: the idle word hands `c` to its next borrower with its last borrower's writes, which the claim CAS
    /// acquired (an RMW, this CAS also continues X1's release sequence). It fails only if a sequence that read `s`
    /// before the claim committed BUSY over it: that borrower keeps `c`, exactly as after a successful barrier.
    fn unclaim(slot: &AtomicU32, s: u32) {
        let _ = slot.compare_exchange(s | CLAIM, s, Ordering::Release, Ordering::Relaxed);
    }

    /// Whether whole per-CPU updates may be restartable sequences now (design.md §9.2): an rseq group in per-CPU
    /// mode. Relaxed: a hint; the sequence checks the mode again inside.
    #[inline(always)]
    pub(crate) fn sequences_apply(&self) -> bool {
        self.hot.rseq && self.hot.mode.load(Ordering::Relaxed) == PER_CPU
    }

    /// The borrow `expect → expect | BUSY` of core `cpu`'s slot (design.md §4.1, §4.1.1), `expect` an idle word:
    /// a CAS, or in rseq groups a restartable sequence that commits only while we run on `cpu` and the mode has
    /// ONCPU. Either way the slot's load pairs with the previous borrower's X1 Release store (I8): the CAS's
    /// Acquire, or an x86 load (acquire by TSO) inside the sequence.
    #[inline(always)]
    pub(crate) fn borrow_slot(&self, at: usize, expect: u32) -> bool {
        if self.hot.rseq {
            self.rseq_store_if(at, expect, expect | BUSY)
        } else {
            self.slot(at).compare_exchange(expect, expect | BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok()
        }
    }

    #[cfg(not(loom))]
    #[inline(always)]
    fn rseq_store_if(&self, at: usize, expect: u32, new: u32) -> bool {
        sys::rseq::store_if(self.hot.rseq_area, core_of(at) as u32, &self.hot.mode, self.slot(at), expect, new)
    }

    /// Loom's restartable sequence: nothing else of core `cpu` runs between the compares and the store, which is
    /// what the kernel's abort guarantees; writers on other cores still interleave freely.
    ///
    /// The commit is a `swap` whose result is ignored, i.e. the same unconditional store. Loom 0.7 orders a plain
    /// store only partially against RMWs it has not seen, and then lets a later CAS read a value that a store
    /// happening-before that CAS already overwrote: a coherence violation C11 forbids, which made model 11 report
    /// false duplicates (reproduced with seven lines of loom, no mmcid: plain store → false report, swap → none;
    /// docs/loom.md). As an RMW the store is placed after everything it raced in modification order.
    #[cfg(loom)]
    fn rseq_store_if(&self, at: usize, expect: u32, new: u32) -> bool {
        let _on_cpu = self.cs[core_of(at)].lock().unwrap_or_else(|e| e.into_inner());
        let slot = self.slot(at);
        // Acquire, both: what the real sequence's x86 loads are (acquire by TSO); the slot load pairs with the
        // previous borrower's X1 (I8), the mode load with F1/F4.
        if self.hot.mode.load(Ordering::Acquire) & ONCPU == 0 || slot.load(Ordering::Acquire) != expect {
            return false;
        }
        // Relaxed: the commit publishes nothing (the borrower's X1 does at exit), and the RMW only fixes its place
        // in modification order (above).
        slot.swap(new, Ordering::Relaxed);
        true
    }

    /// Loom's whole-update sequence (design.md §9.2): `f` runs where the commit store would, under the same
    /// checks as `rseq_store_if`, and the slot is not written.
    #[cfg(loom)]
    pub(crate) fn rseq_run_if(&self, at: usize, expect: u32, f: impl FnOnce()) -> bool {
        let _on_cpu = self.cs[core_of(at)].lock().unwrap_or_else(|e| e.into_inner());
        // Acquire, both: as in `rseq_store_if` (x86 loads; I8 through the previous borrower's X1).
        let s = self.slot(at).load(Ordering::Acquire);
        let same = if self.mutant(MUTANT_SEQUENCE_IGNORES_BUSY) { s & !BUSY == expect & !BUSY } else { s == expect };
        if self.hot.mode.load(Ordering::Acquire) & ONCPU == 0 || !same {
            return false;
        }
        f();
        true
    }

    /// Loom's per-task whole-update sequence (design.md §9.3) on core `cpu` (the registration's modelled CPU): `f`
    /// runs where the commit store would, only if the mode is `PER_TASK` and `word` still holds `w`.
    #[cfg(loom)]
    pub(crate) fn rseq_run_if_owned(&self, cpu: usize, word: &AtomicU32, w: u32, f: impl FnOnce()) -> bool {
        let _on_cpu = self.cs[cpu].lock().unwrap_or_else(|e| e.into_inner());
        // Acquire, both: what the real sequence's x86 loads are (acquire by TSO).
        let mode_ok =
            self.mutant(MUTANT_OWNED_SEQUENCE_IGNORES_MODE) || self.hot.mode.load(Ordering::Acquire) == PER_TASK;
        let word_ok = self.mutant(MUTANT_OWNED_SEQUENCE_IGNORES_WORD) || word.load(Ordering::Acquire) == w;
        if !(mode_ok && word_ok) {
            return false;
        }
        f();
        true
    }

    /// Takes idle word `s` (`ONCPU | c`) of slot `at`, leaving it EMPTY: on success `c` is the caller's.
    /// For every `idle → EMPTY` write outside a fixup walk. A CAS; in rseq groups a claim (design.md §4.1.1):
    /// `s → s | CLAIM`, the RSEQ membarrier, `s | CLAIM → EMPTY`, under the claim lock. Nobody waits for that
    /// lock: a stealer (`exit = false`) that finds it held gives up (it converges at a later enter, I6), and an
    /// exit leaves its slot to the holder (`defer_claim`) and returns false, as if someone else had taken `c`.
    /// `c`: the calling registration's counters, for what a drain takes.
    pub(crate) fn take_idle(&self, at: usize, s: u32, exit: bool, c: &Counters) -> bool {
        let slot = self.slot(at);
        // AcqRel: takes the CID with its last borrower's writes (pairs with X1's Release store).
        if !self.hot.rseq {
            return slot.compare_exchange(s, EMPTY, Ordering::AcqRel, Ordering::Acquire).is_ok();
        }
        if slot.load(Ordering::Relaxed) != s {
            return false; // moved on already: no lock, no barrier (Relaxed: the CAS below is what decides)
        }
        let locked = self.try_claim_lock() || (exit && self.defer_claim(c));
        if !locked {
            return false; // a stealer gives up; an exit deferred its slot to the holder
        }
        // AcqRel, both CASes: they take the CID with its last borrower's writes (pairs with X1's Release store);
        // the claim lock (Acquire/Release) orders them against other claimers.
        let taken = slot.compare_exchange(s, s | CLAIM, Ordering::AcqRel, Ordering::Acquire).is_ok() && {
            if self.mutant(MUTANT_NO_CLAIM_BARRIER) || self.claim_barrier(c) {
                // Fails only if a sequence that read `s` before the claim committed over it: its borrower keeps
                // `c`.
                slot.compare_exchange(s | CLAIM, EMPTY, Ordering::AcqRel, Ordering::Acquire).is_ok()
            } else {
                Self::unclaim(slot, s); // no barrier, no take: as if someone else had the slot (design.md §12)
                false
            }
        };
        self.claim_unlock(c);
        taken
    }

    /// The claim lock, tried once. Acquire: pairs with `claim_unlock`'s Release, so claimers are serialised and a
    /// claim word that survives the barrier is ours (no ABA through another claimer, design.md §4.1.1).
    fn try_claim_lock(&self) -> bool {
        self.claim.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// An exit found the claim lock held: flag its idle slot for the holder, which drains after unlocking
    /// (`claim_unlock`). Returns true if the lock turned out free after all (the caller then claims itself; it
    /// also drains the flag at its own unlock).
    #[cold]
    fn defer_claim(&self, c: &Counters) -> bool {
        // Release, as an RMW so that every deferring exit's flag continues the release sequence: the drainer's
        // Acquire swap then sees each deferring exit's X1, the idle word it must take.
        self.claims_deferred.swap(1, Ordering::Release);
        // Store-buffering pair with `claim_unlock`'s fence: either we see the lock free, or the holder that we saw
        // holding it sees our flag after its unlock.
        fence(Ordering::SeqCst);
        let locked = !self.mutant(MUTANT_NO_DEFER_RETRY) && self.try_claim_lock();
        if !locked {
            c.bump(Ev::Deferred);
        }
        locked
    }

    /// Releases the claim lock, then drains what exits deferred while it was held: as long as the flag is set
    /// and the lock can be had, take every idle slot the mode says no core may own (`take_deferred`).
    fn claim_unlock(&self, c: &Counters) {
        let mut drained = false;
        loop {
            self.claim.store(0, Ordering::Release);
            if self.mutant(MUTANT_NO_DEFERRED_DRAIN) || (drained && self.mutant(MUTANT_NO_DRAIN_LOOP)) {
                return;
            }
            // Pairs with `defer_claim`'s fence.
            fence(Ordering::SeqCst);
            // Relaxed: the fence above orders it (a stale 0 is excluded by the store-buffering argument). Nothing
            // deferred, or the new holder drains at its own unlock: done.
            if self.claims_deferred.load(Ordering::Relaxed) == 0 || !self.try_claim_lock() {
                return;
            }
            // Acquire: pairs with `defer_claim`'s Release swap (the deferring exits' X1 stores). Exits may defer
            // again while we drain: hence the loop.
            if self.claims_deferred.swap(0, Ordering::Acquire) != 0 {
                self.take_deferred(c);
            }
            drained = true;
        }
    }

    /// With the claim lock held, on behalf of exits that deferred: while the mode lacks ONCPU no core may own a
    /// CID (I5), so claim every idle slot, issue one RSEQ membarrier, and take them. With ONCPU back (a switch to
    /// per-CPU mode ran since), idle core CIDs are legitimate and stay.
    #[cold]
    fn take_deferred(&self, c: &Counters) {
        // Acquire, as every mode load outside the lock (pairs with F1/F4); it also sees at least the mode each
        // deferring exit saw, through the flag's release → acquire.
        if self.hot.mode.load(Ordering::Acquire) & ONCPU != 0 {
            return;
        }
        let mut claimed = false;
        for (_, slot) in self.all_slots() {
            // Relaxed, and still sees each deferring exit's X1 (or later): X1 → the exit's Release swap of the
            // flag → our Acquire swap (`claim_unlock`) → this load. So a deferred slot is never skipped as stale;
            // other values are hints the CAS validates. AcqRel CAS: as `take_idle`'s claim (pairs with X1);
            // failure Relaxed: nothing is read from a slot we did not claim.
            let s = slot.load(Ordering::Relaxed);
            if slot::idle_cid(s).is_some()
                && slot.compare_exchange(s, s | CLAIM, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                claimed = true;
            }
        }
        if !claimed {
            return;
        }
        // As in every claim: a sequence that read an idle word before our claim has committed or was aborted. If
        // the barrier failed, every claim goes back and the deferred CIDs stay on their cores (design.md §12).
        let fenced = self.mutant(MUTANT_NO_DRAIN_BARRIER) || self.claim_barrier(c);
        for (_, slot) in self.all_slots() {
            // Every CLAIM word is ours (we hold the lock); our own claim is the latest we can read, or a sequence's
            // BUSY that committed over it (then its borrower keeps the CID, and the CAS fails). Relaxed load and
            // failure: hints; the AcqRel CAS takes the CID with the writes its claim acquired.
            let s = slot.load(Ordering::Relaxed);
            if s & CLAIM != 0 && !fenced {
                Self::unclaim(slot, s & !CLAIM);
            } else if s & CLAIM != 0 && slot.compare_exchange(s, EMPTY, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.bitmap.clear(s & VALUE);
                c.bump(Ev::BitmapClear);
                c.bump(Ev::FixupTake);
            }
        }
    }

    /// Ordering of the store that ends a switch (F4). Release: whoever sees the final mode sees every effect of
    /// the walk (the kernel's `smp_mb()` before clearing TRANSIT, 47ee94efccf6).
    fn completion_order(&self) -> Ordering {
        if self.mutant(MUTANT_RELAXED_COMPLETION) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        }
    }

    fn opt(&self, life: &Life) -> usize {
        life.allowed.len().min(life.users)
    }

    /// Switch-back threshold, clamped to ≥ 1 (kernel fix e2e2aaec3d3d).
    fn thrs(&self, opt: usize) -> usize {
        (opt - opt / 4).min(self.cores / 2).max(1)
    }

    /// Recomputes `max_cids` and decides whether the mode must flip (kernel `mm_update_max_cids`).
    fn update_limits(&self, life: &mut Life) -> Flip {
        let opt = self.opt(life);
        if life.occupied && life.users < self.thrs(opt) {
            life.occupied = false; // few enough users for the kernel's rules again (design.md §3.1)
        }
        let kernel_max = (opt + opt / 4).min(self.cores);
        let max = if life.occupied { kernel_max.max(life.users) } else { kernel_max };
        // Relaxed: lock held; a reader's stale value only changes whether it converges (as the kernel's READ_ONCE).
        self.hot.max_cids.store(max as u32, Ordering::Relaxed);
        // Relaxed: the caller holds the lifecycle lock, and only its holder stores the mode.
        if self.hot.mode.load(Ordering::Relaxed) & ONCPU == 0 {
            if life.users > max && !life.occupied {
                life.thrs = self.thrs(opt);
                return Flip::ToPerCpu;
            }
        } else if life.users < life.thrs {
            life.thrs = 0;
            return Flip::ToPerTask;
        }
        Flip::None
    }

    /// Per-CPU mode, and an enter found its core's first CID held (design.md §3.1): if at least half the users, and
    /// more than twice the cores, hold a guard right now (borrowed slots and temporaries), per-CPU ownership saves at
    /// most half the CIDs, and the group switches to per-task ownership. Only tries the lifecycle lock: an enter never waits (I6).
    #[cold]
    #[inline(never)]
    pub(crate) fn check_occupancy(&self) {
        // Relaxed: a hint (the decision is taken again under the lock).
        if !occupied_at(self.holders(), self.users.load(Ordering::Relaxed), self.max_cids()) {
            return;
        }
        let Some(mut life) = self.life.try_lock() else { return };
        // Relaxed: we hold the lifecycle lock, and only its holder stores the mode.
        if self.hot.mode.load(Ordering::Relaxed) != PER_CPU
            || life.occupied
            || !occupied_at(self.holders(), life.users, self.max_cids())
        {
            return;
        }
        life.occupied = true;
        life.thrs = 0;
        let flip = self.update_limits(&mut life);
        debug_assert!(matches!(flip, Flip::None), "per-CPU mode, occupied: only this switch is due");
        self.apply(&mut life, Flip::ToPerTask);
    }

    /// A registration's steal took back the CID its previous steal had moved (design.md §4.5.1): per-CPU ownership
    /// makes a CID follow a thread from core to core. If per-task ownership is a state the kernel's rules keep at
    /// this membership (`users ≤ max_cids`: no register since would have switched back to per-CPU mode), switch to
    /// it. Only tries the lifecycle lock: an enter never waits (I6).
    #[cold]
    #[inline(never)]
    pub(crate) fn check_steal_storm(&self) {
        // Relaxed: a hint (the decision is taken again under the lock).
        if self.users.load(Ordering::Relaxed) > self.max_cids() {
            return;
        }
        let Some(mut life) = self.life.try_lock() else { return };
        // Relaxed: we hold the lifecycle lock, and only its holder stores the mode and `max_cids`.
        if self.hot.mode.load(Ordering::Relaxed) != PER_CPU || life.users > self.max_cids() {
            return;
        }
        life.thrs = 0;
        let flip = self.update_limits(&mut life);
        debug_assert!(matches!(flip, Flip::None), "per-CPU mode, no threshold: only this switch is due");
        self.apply(&mut life, Flip::ToPerTask);
    }

    /// Guards holding a CID now, as a racy snapshot in per-CPU mode: BUSY slots, plus the set bits no slot owns
    /// (temporaries; registration words are UNSET in per-CPU mode but for transitions).
    fn holders(&self) -> usize {
        let (mut busy, mut owned) = (0, 0);
        for (_, slot) in self.all_slots() {
            // Relaxed: a snapshot that only decides whether to look again under the lock.
            let s = slot.load(Ordering::Relaxed);
            owned += (s & ONCPU != 0) as usize;
            busy += (s & BUSY != 0) as usize;
        }
        busy + self.bitmap.count().saturating_sub(owned)
    }

    fn apply(&self, life: &mut Life, flip: Flip) {
        match flip {
            Flip::None => {}
            Flip::ToPerCpu => self.switch_to_per_cpu(life),
            Flip::ToPerTask => self.switch_to_per_task(life),
        }
    }

    /// Task → CPU switch (design.md §5): flip, fence, take idle registrations' CIDs, complete.
    fn switch_to_per_cpu(&self, life: &mut Life) {
        life.counters.bump(Ev::SwitchToCpu);
        self.hot.mode.store(TO_PER_CPU, Ordering::Release); // F1
                                                            // F2: pairs with E2 and X2. If it failed, the walk takes nothing: every registration keeps its CID until
                                                            // its next enter gives it up (design.md §12).
        if !self.fixup_barrier(life) {
            self.hot.mode.store(PER_CPU, self.completion_order()); // F4
            return;
        }
        life.counters.bump(Ev::FixupWalk);
        for rec in life.regs.iter().flatten() {
            life.counters.bump(Ev::FixupVisit);
            // F3. Acquire: pairs with X1 (running = 0, Release): the guard's writes happen before we free its CID.
            if rec.running.load(Ordering::Acquire) != 0 && !self.mutant(MUTANT_FIXUP_IGNORES_RUNNING) {
                continue; // running: it resolves its CID at exit (D-exit)
            }
            // Relaxed: a hint the CAS validates; the guard's writes were acquired through `running` above.
            let w = rec.cid.load(Ordering::Relaxed);
            if w == UNSET && !self.mutant(MUTANT_FIXUP_TAKES_UNSET) {
                continue; // kernel de3ab9bd3133: never treat UNSET as a CID
            }
            // AcqRel: against the owner's word CASes at exit or enter, exactly one side takes `w` (I5); the
            // owner's guard writes were acquired through `running` above (F3), not through this CAS.
            if rec.cid.compare_exchange(w, UNSET, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.bitmap.clear(w);
                life.counters.bump(Ev::FixupTake);
                life.counters.bump(Ev::BitmapClear);
            }
        }
        self.hot.mode.store(PER_CPU, self.completion_order()); // F4
    }

    /// CPU → task switch: flip, fence, take idle cores' CIDs, complete.
    fn switch_to_per_task(&self, life: &mut Life) {
        life.counters.bump(Ev::SwitchToTask);
        // F1.
        self.hot.mode.store(TO_PER_TASK, Ordering::Release);
        // F2: pairs with X2 of borrowers. The last registration's drop needs none: every registration's drop came
        // after all its guards and sequences and took the lifecycle lock before us (happens-before), so nothing
        // runs on the light side; the last-user sweep in `unregister` has always relied on the same argument.
        // That saves one (RSEQ) membarrier per round to groups that empty and refill (thread pools). If F2
        // failed, the sweep of a CAS group still runs (a slot CAS against a borrow CAS needs no barrier), an rseq
        // group's does not (a sequence in flight could commit over the EMPTY slot): its idle core CIDs stay until
        // a later switch or the last drop (design.md §12).
        if life.users == 0 || self.fixup_barrier(life) || !self.hot.rseq {
            self.sweep_slots(life);
        }
        self.hot.mode.store(PER_TASK, self.completion_order()); // F4
    }

    /// Takes the CID of every core slot that owns one nobody is using (busy ones resolve at their exit, D-core).
    fn sweep_slots(&self, life: &mut Life) {
        life.counters.bump(Ev::FixupWalk);
        for (_, slot) in self.all_slots() {
            life.counters.bump(Ev::FixupVisit);
            // F3. Relaxed: a hint the CAS below validates (and acquires through).
            let s = slot.load(Ordering::Relaxed);
            let take = if self.mutant(MUTANT_FIXUP_IGNORES_BUSY) {
                s & ONCPU != 0 // kernel 1e83ccd5921a undone: assumes what it finds may be dropped
            } else {
                slot::idle_cid(s).is_some()
            };
            // AcqRel: takes the CID together with the last borrower's writes (pairs with its X1 Release store).
            if take && slot.compare_exchange(s, EMPTY, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.bitmap.clear(s & VALUE);
                life.counters.bump(Ev::FixupTake);
                life.counters.bump(Ev::BitmapClear);
            }
        }
    }

    /// Called by `Registration::drop` (≈ exit).
    pub(crate) fn unregister(&self, rec: &RegRec, index: usize) {
        let mut life = self.life.lock();
        life.regs[index] = None;
        life.free.push(index);
        // A forgotten per-task guard (mem::forget) may have left `running` set; the registration is gone either way
        // (`Registration::drop` already gave back a forgotten per-CPU or temporary one, design.md §4.6).
        // Relaxed, both: the record has left the list walks read (under the lock we hold), the owner's own writes
        // are sequenced before this drop, and the bitmap clear (Release) publishes its guards' writes (I8).
        rec.running.store(0, Ordering::Relaxed);
        let w = rec.cid.swap(UNSET, Ordering::Relaxed);
        if w != UNSET {
            self.bitmap.clear(w);
            life.counters.bump(Ev::BitmapClear);
        }
        life.counters.absorb(&rec.counters);
        life.users -= 1;
        // Relaxed: stored under the lock; readers take a snapshot (`temp_bound`, `Group::users`).
        self.users.store(life.users, Ordering::Relaxed);
        let flip = self.update_limits(&mut life);
        self.apply(&mut life, flip);
        if life.users == 0 {
            // Nobody is left to use a core's CID: nothing stays marked (I5).
            self.sweep_slots(&mut life);
        }
    }
}

/// A group's locks held across a `fork` by the forking thread (design.md §12.2): its lifecycle lock and its claim
/// lock, so the child gets neither held by a thread that does not exist there.
#[cfg(not(loom))]
pub(crate) struct ForkHold<'a> {
    inner: &'a Inner,
    life: crate::sync::MutexGuard<'a, Life>,
}

#[cfg(not(loom))]
impl Inner {
    /// fork's prepare handler: waits for the lifecycle lock (a register, drop, switch or `stats` in progress),
    /// then for the claim lock (a claim or drain in progress: a claim or drain never waits for anything but the
    /// kernel's membarrier, and nobody holding the claim lock takes the lifecycle lock, so this ends).
    pub(crate) fn hold_for_fork(&self) -> ForkHold<'_> {
        let life = self.life.lock();
        while !self.try_claim_lock() {
            std::thread::yield_now();
        }
        ForkHold { inner: self, life }
    }
}

#[cfg(not(loom))]
impl ForkHold<'_> {
    /// After the fork, in the parent and in the child alike: the claim lock is unlocked the usual way (draining
    /// what exits deferred to us meanwhile, counted under the lifecycle lock we still hold), then the lifecycle lock.
    pub(crate) fn release(self) {
        self.inner.claim_unlock(&self.life.counters);
    }
}

/// Loom only: the claim protocol's participants in isolation, for models 11g and 11h (docs/loom.md), where a
/// real scenario would need more threads or preemptions than loom can explore.
#[cfg(loom)]
#[doc(hidden)]
impl Group {
    /// Core `cpu` owns a fresh CID and a guard holds it (BUSY): the state a CPU → task switch leaves behind for
    /// a borrower that was inside its guard.
    pub fn loom_hold_core(&self, cpu: usize) {
        let g = &*self.inner;
        let c = g.bitmap.get();
        // Set-up, before the model's threads are spawned (their spawn orders it); Release is not needed.
        g.slot(slot_at(cpu, 0)).store(slot::busy(c), Ordering::Release);
    }

    /// That guard's exit after the switch (`exit_slow_core` without adoption): X1, then the claim, which may
    /// defer to the lock's holder; a CID taken is freed.
    pub fn loom_exit_core(&self, cpu: usize) {
        let g = &*self.inner;
        // Relaxed: the holder reads its own BUSY word (only it writes a BUSY slot). Release: X1, as the real exit.
        let at = slot_at(cpu, 0);
        let c = g.slot(at).load(Ordering::Relaxed) & VALUE;
        g.slot(at).store(slot::owned(c), Ordering::Release);
        if g.take_idle(at, slot::owned(c), true, &Counters::default()) {
            g.bitmap.clear(c);
        }
    }

    /// An exit's deferral (`defer_claim`: the flag, the fence, the lock tried again), then, if the lock was free,
    /// what its holder does (unlock and drain).
    pub fn loom_deferred_drain(&self) {
        let g = &*self.inner;
        let c = Counters::default();
        if g.defer_claim(&c) {
            g.claim_unlock(&c);
        }
    }
}

/// Mutant identifiers, usable in both builds (the check is constant-false outside loom).
#[cfg(loom)]
pub(crate) type MutantId = Mutant;
#[cfg(not(loom))]
pub(crate) type MutantId = u8;

macro_rules! mutant_ids {
    ($($name:ident = $variant:ident = $n:expr;)*) => {$(
        #[cfg(loom)]
        pub(crate) const $name: MutantId = Mutant::$variant;
        #[cfg(not(loom))]
        #[allow(dead_code)] // some knobs sit only in loom's models of the sequences
        pub(crate) const $name: MutantId = $n;
    )*};
}

mutant_ids! {
    MUTANT_NO_ENTER_BARRIER = NoEnterBarrier = 1;
    MUTANT_NO_EXIT_BARRIER = NoExitBarrier = 2;
    MUTANT_NO_FIXUP_BARRIER = NoFixupBarrier = 3;
    MUTANT_RELAXED_COMPLETION = RelaxedCompletion = 5;
    MUTANT_FIXUP_IGNORES_RUNNING = FixupIgnoresRunning = 6;
    MUTANT_FIXUP_IGNORES_BUSY = FixupIgnoresBusy = 7;
    MUTANT_FIXUP_TAKES_UNSET = FixupTakesUnset = 8;
    MUTANT_NO_ADOPT_RECHECK = NoAdoptRecheck = 9;
    MUTANT_CPU_PATH_KEEPS_WORD = CpuPathKeepsWord = 10;
    MUTANT_NO_CLAIM_BARRIER = NoClaimBarrier = 11;
    MUTANT_PLAIN_FIXUP_BARRIER = PlainFixupBarrier = 12;
    MUTANT_SEQUENCE_IGNORES_BUSY = SequenceIgnoresBusy = 13;
    MUTANT_NO_DEFERRED_DRAIN = NoDeferredDrain = 14;
    MUTANT_RELAXED_SHARD_SLOT = RelaxedShardSlot = 15;
    MUTANT_RELAXED_SEGMENT_INSTALL = RelaxedSegmentInstall = 16;
    MUTANT_NO_DEFER_RETRY = NoDeferRetry = 17;
    MUTANT_NO_DRAIN_LOOP = NoDrainLoop = 18;
    MUTANT_NO_DRAIN_BARRIER = NoDrainBarrier = 19;
    MUTANT_RELAXED_VISITED_BIT = RelaxedVisitedBit = 20;
    MUTANT_CONVERGE_TAKES_FIRST = ConvergeTakesFirst = 21;
    MUTANT_OWNED_SEQUENCE_IGNORES_MODE = OwnedSequenceIgnoresMode = 22;
    MUTANT_OWNED_SEQUENCE_IGNORES_WORD = OwnedSequenceIgnoresWord = 23;
    MUTANT_EXIT_TO_FIRST_SLOT = ExitToFirstSlot = 26;
    MUTANT_IGNORE_FAILED_BARRIER = IgnoreFailedBarrier = 24;
    MUTANT_IGNORE_FAILED_CLAIM_BARRIER = IgnoreFailedClaimBarrier = 25;
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::Mode;

    /// Taken for writing by the tests that fork and for reading by those that check a group's claim lock: the
    /// fork handlers take every live group's locks for the fork's duration (design.md §12.2), which such a test
    /// would see as another claimer's (more often the more CPUs run the tests at once).
    pub(super) static FORKS: std::sync::RwLock<()> = std::sync::RwLock::new(());

    fn sim(cores: usize, allowed: usize) -> Group {
        Group::builder().virtual_cpus(cores).cpus_virtual(0..allowed).build().unwrap()
    }

    /// Per-CPU borrows of a real-core group go through the restartable sequence (design.md §4.1.1), which is what
    /// excludes the threads of one CPU: 4 unpinned threads per core borrow their CPU's idle CID with
    /// `borrow_slot`, increment a plain per-core counter (load, store) and give the CID back with the exit's
    /// release store. A borrow that two threads of one CPU both won loses increments. (Hand-made mutant when
    /// this was written, found by a test audit: `borrow_slot` as a plain load, compare and store on rseq groups
    /// passed the whole suite before this test; here it lost 270 000–810 000 of the 4 000 000 increments of a
    /// debug build in three runs out of three.)
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn rseq_borrows_exclude_the_threads_of_one_cpu() {
        use std::sync::atomic::Ordering::*;
        let g = Group::new();
        if !g.uses_rseq() {
            eprintln!("rseq_borrows_exclude_the_threads_of_one_cpu: no rseq borrows here, nothing to check");
            return;
        }
        let inner = &*g.inner;
        let regs: Vec<_> = (0..inner.cores + 1).map(|_| g.register()).collect();
        assert_eq!(g.mode(), Mode::PerCpu);
        for cpu in 0..inner.cores {
            let slot = inner.slot(slot_at(cpu, 0));
            if slot.load(Acquire) == EMPTY {
                slot.store(slot::owned(inner.bitmap.get()), Release); // as a first enter on the core would
            }
        }
        let rounds: u64 = if cfg!(debug_assertions) { 500_000 } else { 5_000_000 };
        let (holds, total) = sys::tests::per_cpu_exclusion(rounds, |cpu| {
            let at = slot_at(cpu, 0);
            let word = inner.slot(at).load(Relaxed);
            (slot::idle_cid(word).is_some() && inner.borrow_slot(at, word))
                .then_some(move || inner.slot(at).store(word, Release)) // the exit's X1
        });
        assert_eq!(total, holds, "two threads of one CPU borrowed its CID at once");
        drop(regs);
        assert!(g.audit().is_consistent(), "{:?}", g.audit());
    }

    /// Claims never wait (design.md §4.1.1): with the claim lock held by someone else, a stealer gives up and an
    /// exit leaves its idle slot flagged for the holder, whose unlock takes it. Deterministic, one thread playing
    /// the holder; the interleavings are loom model 11f.
    #[test]
    fn an_exit_that_finds_the_claim_lock_held_defers_to_its_holder() {
        use std::sync::atomic::Ordering::*;
        let _no_fork = FORKS.read().unwrap_or_else(|e| e.into_inner());
        let g = Group::new();
        if !g.uses_rseq() {
            eprintln!("an_exit_that_finds_the_claim_lock_held_defers_to_its_holder: no rseq claims here");
            return;
        }
        let inner = &*g.inner;
        let _reg = g.register(); // per-task mode: no core may own a CID
        let c = inner.bitmap.get();
        let idle = slot::owned(c);
        inner.slot(0).store(idle, Release); // what an exit that lost a switch finds after its X1
        let counters = Counters::default();

        assert!(inner.try_claim_lock(), "the test is the holder");
        assert!(!inner.take_idle(0, idle, false, &counters), "a stealer gives up");
        assert_eq!(inner.claims_deferred.load(Relaxed), 0, "and flags nothing");
        assert!(!inner.take_idle(0, idle, true, &counters), "an exit does not wait either");
        assert_eq!(inner.claims_deferred.load(Relaxed), 1, "it flags its slot");
        assert_eq!(inner.slot(0).load(Relaxed), idle, "and leaves the CID there");

        inner.claim_unlock(&counters); // the holder's unlock drains the flag
        assert_eq!(inner.slot(0).load(Relaxed), EMPTY);
        assert!(!inner.bitmap.is_set(c), "the deferred CID is free");
        assert_eq!((inner.claims_deferred.load(Relaxed), inner.claim.load(Relaxed)), (0, 0));
        let mut t = Stats::totals();
        counters.add_to(&mut t);
        let s = Stats::from_totals(&t, 0);
        assert_eq!((s.exit_deferred, s.fixup_takes, s.bitmap_clears), (1, 1, 1));

        // With the lock free, the exit claims by itself.
        let c = inner.bitmap.get();
        let at = slot_at(1 % inner.cores, 0);
        inner.slot(at).store(slot::owned(c), Release);
        assert!(inner.take_idle(at, slot::owned(c), true, &counters));
        assert_eq!(inner.claim.load(Relaxed), 0, "unlocked again");
        inner.bitmap.clear(c);
        assert!(g.audit().is_consistent(), "{:?}", g.audit());
    }

    /// The kernel's limits (`mm_update_max_cids`, design.md §3) on worked examples, row by row.
    #[test]
    fn limits_follow_the_kernel_table() {
        // N=4, 4 allowed: users 1..4 -> max 1,2,3,4 per-task; 5 -> per-CPU with thrs 2.
        let g = sim(4, 4);
        let mut regs = Vec::new();
        for (users, max) in [(1, 1), (2, 2), (3, 3), (4, 4)] {
            regs.push(g.register());
            assert_eq!((g.users(), g.max_cids(), g.mode()), (users, max, Mode::PerTask));
        }
        regs.push(g.register());
        assert_eq!((g.max_cids(), g.mode()), (4, Mode::PerCpu));
        assert_eq!(g.inner.life.lock().thrs, 2);
        regs.truncate(2);
        assert_eq!(g.mode(), Mode::PerCpu, "users 2 is not < thrs 2");
        regs.truncate(1);
        assert_eq!((g.max_cids(), g.mode()), (1, Mode::PerTask), "users 1 < thrs 2: back");

        // N=256, 8 allowed: 10 users still per-task (allowance), 11 -> per-CPU with thrs 6.
        let g = sim(256, 8);
        let mut regs: Vec<_> = (0..10).map(|_| g.register()).collect();
        assert_eq!((g.max_cids(), g.mode()), (10, Mode::PerTask));
        regs.push(g.register());
        assert_eq!((g.max_cids(), g.mode()), (10, Mode::PerCpu));
        assert_eq!(g.inner.life.lock().thrs, 6);
        drop(regs);
        assert_eq!((g.users(), g.max_cids(), g.mode()), (0, 0, Mode::PerTask));
    }

    /// Kernel e2e2aaec3d3d: with one core the threshold must be 1, not 0 (0 means "per-CPU off").
    #[test]
    fn limits_one_core() {
        let g = sim(1, 1);
        let a = g.register();
        let b = g.register();
        assert_eq!((g.max_cids(), g.mode()), (1, Mode::PerCpu));
        assert_eq!(g.inner.life.lock().thrs, 1);
        drop(b);
        assert_eq!(g.mode(), Mode::PerCpu, "never switches back while a user exists");
        drop(a);
        assert_eq!(g.mode(), Mode::PerTask);
        assert_eq!(g.audit().bits, 0);
    }

    #[test]
    fn affinity_widening_switches_back() {
        // 2 of 8 virtual cores allowed: 3 users > max 2 -> per-CPU, thrs = max(min(2, 4), 1) = 2.
        let g = sim(8, 2);
        let regs: Vec<_> = (0..3).map(|_| g.register()).collect();
        assert_eq!((g.max_cids(), g.mode()), (2, Mode::PerCpu));
        // 4 allowed: max 3, thrs = min(4 - 1, 4) = 3; 3 users are not below it.
        g.set_cpus_allowed(&CpuSet::virtual_set(2..4).unwrap()).unwrap();
        assert_eq!((g.cpus().len(), g.max_cids(), g.mode()), (4, 3, Mode::PerCpu));
        // Narrowing is ignored (grows only).
        g.set_cpus_allowed(&CpuSet::virtual_set([0]).unwrap()).unwrap();
        assert_eq!(g.cpus().len(), 4);
        // 8 allowed: thrs = min(8 - 2, 4) = 4 > 3 users: back to per-task before the call returns.
        g.set_cpus_allowed(&CpuSet::virtual_set(0..8).unwrap()).unwrap();
        assert_eq!((g.max_cids(), g.mode()), (3, Mode::PerTask));
        let stats = g.stats();
        assert_eq!((stats.switches_to_per_cpu, stats.switches_to_per_task, stats.fixup_walks), (1, 1, 2));
        assert!(matches!(
            g.set_cpus_allowed(&CpuSet::virtual_set([8]).unwrap()),
            Err(Error::CpuOutOfRange { cpu: 8, possible: 8 })
        ));
        drop(regs);
        assert!(g.audit().is_consistent() && g.audit().bits == 0);
    }
}

#[cfg(all(test, not(loom)))]
#[path = "platform_tests.rs"]
mod platform_tests;
