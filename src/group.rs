//! The group (design.md §1, §2.1, §3, §12.3): `Group`, its public API (register, the queries, `stats`, `audit`,
//! `set_cpus_allowed`) and `GroupBuilder`. Joining a group is here (`register_with`; leaving is
//! `Inner::unregister`); the shared state it builds, and `Inner`'s protocol methods, are `inner/`.

use crate::bitmap::{Bitmap, MAX_BITS};
#[cfg(loom)]
use crate::inner::Taker;
use crate::inner::{Hot, Inner, Life, RegRec};
use crate::mutants::Knob;
#[cfg(loom)]
use crate::mutants::Mutant;
use crate::registration::Registration;
use crate::state::*;
use crate::stats::{Counters, Ev, Stats};
use crate::sync::{Arc, AtomicU32, AtomicUsize, Mutex, Ordering};
use crate::sys::MAX_CPUS;
use crate::{rseq, sys, CpuSet, Error};
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
        let users = inner.users_locked(&life) + 1;
        // I2's hard bound plus one (design.md §2.4, §2.6): every allocation finds a free bit.
        if !inner.bitmap.grow(users + inner.core_share() + 1) {
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
        inner.set_users(&mut life, users);
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
    ///
    /// It follows the registered users, as the kernel's `mm_update_max_cids` does: `opt = min(allowed cores,
    /// users)` and `max_cids = min(opt + opt/4, cores)` ([design §3](crate::docs::design)). So it is 0 while no
    /// thread is registered (no CID is in use, and none may be), and each registration can raise it; a group of
    /// `n` registered threads on at least `n` allowed cores has `max_cids() ≥ n`.
    ///
    /// ```
    /// let group = mmcid::Group::builder().virtual_cpus(8).build()?;
    /// assert_eq!(group.max_cids(), 0); // nobody registered yet
    /// let regs: Vec<_> = (0..4).map(|_| group.register()).collect();
    /// assert_eq!(group.max_cids(), 5); // opt = 4, 4 + 4/4
    /// drop(regs);
    /// assert_eq!(group.max_cids(), 0);
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    ///
    /// # The hard bound, exactly
    ///
    /// At every instant at most `users + K · cores` CIDs are in use ([`Group::users`], [`Group::cores`], `K` =
    /// [`Group::cids_per_core`]): each registration holds at most one, and each core at most `K`. Each CID is below
    /// that bound *when it is handed out*, with `users` as it was then; it is not checked again. A guard keeps its
    /// CID for its whole life while other registrations drop, so a live CID is below the largest bound since it
    /// was taken, not necessarily below today's ([design §12.4](crate::docs::design)). Once membership stops
    /// shrinking, its holder moves below `max_cids` at a later enter, when a lower CID is free:
    ///
    /// ```
    /// use mmcid::{CidKind, Group};
    /// let group = Group::builder().virtual_cpus(1).cids_per_core(1).build()?;
    /// let mut regs: Vec<_> = (0..10).map(|_| group.register()).collect(); // 10 users, 1 core: per-CPU mode
    /// let mut last = regs.pop().unwrap();
    /// let held: Vec<_> = regs.iter_mut().map(|r| r.enter()).collect();  // core 0's CID 0, temporaries 1..=8
    /// let live = last.enter();
    /// assert_eq!((live.kind(), live.cid().get()), (CidKind::Temporary, 9)); // below users + cores = 11
    /// drop(held);
    /// drop(regs);                                                         // membership shrinks to one user
    /// assert_eq!(group.users() + group.cores(), 2);
    /// assert!(live.cid().get() >= group.users() + group.cores());         // live, yet beyond today's bound
    /// assert!(group.stats().cids_in_use as usize <= group.users() + group.cores()); // how many: still bounded
    /// drop(live);
    /// assert_eq!(last.enter().cid().get(), 0);                            // the next enter converges
    /// # Ok::<(), mmcid::Error>(())
    /// ```
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
        self.inner.hot.cids_per_core as usize
    }

    /// Whether light barriers are compiler fences paired with `membarrier` (design.md §5.1).
    pub fn uses_membarrier(&self) -> bool {
        self.inner.hot.membarrier
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
                life.switch_back_below = inner.switch_back_threshold(life.allowed.len());
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
        Audit {
            bits: inner.bitmap.count(),
            owners: owned.len(),
            duplicates,
            unmarked,
            users: inner.users_locked(&life),
            listed,
        }
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
    /// - [`Error::ValueOutOfRange`] naming `virtual_cpus` for 0 or more than 65 536;
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
    /// assert_eq!(Group::builder().virtual_cpus(0).build().unwrap_err().to_string(),
    ///            "virtual_cpus is 0, outside the accepted range 1..=65536");
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
        // First: the fork handlers exist from now on, and a fork waits for this build's membarrier probes and its
        // `track` under the registry lock (design.md §12.2).
        #[cfg(not(loom))]
        crate::fork::install();
        // Here, not on the hot path: it takes the loader's lock (before the registry lock: no loader lock under it).
        rseq::probe();
        #[cfg(not(loom))]
        let registry = crate::fork::registry();
        let cores = self.virtual_cpus.unwrap_or_else(sys::possible_cpus);
        let allowed = self.cpus.unwrap_or_else(|| CpuSet::raw(0..cores));
        let membarrier = self.asymmetric && sys::membarrier_available();
        // Loom has no membarrier; a group whose membarrier fails is still built as one that has it.
        #[cfg(loom)]
        let membarrier = membarrier || self.failing_barriers;

        // Real cores only: the sequence excludes the threads of one CPU, so two CPUs must never share a slot.
        #[cfg(not(loom))]
        let rseq = self.rseq != Some(false)
            && membarrier
            && self.virtual_cpus.is_none()
            && rseq::critical_sections()
            && rseq::cpu_id().is_some()
            && sys::membarrier_rseq_available();
        #[cfg(loom)]
        let rseq = self.rseq == Some(true);
        let cids_per_core = self.cids_per_core.unwrap_or(if cfg!(loom) { 1 } else { cids_per_core_limit(cores) });
        #[cfg(loom)]
        let knob = Knob::new(self.mutant);
        #[cfg(not(loom))]
        let knob = Knob::default();
        let mut bitmap = Bitmap::new(cores);
        bitmap.knob = knob;
        let group = Group {
            inner: Arc::new(Inner {
                hot: CachePadded::new(Hot {
                    mode: AtomicU32::new(PER_TASK),
                    max_cids: AtomicU32::new(0),
                    membarrier,
                    fast_task: if membarrier { PER_TASK } else { NOT_A_MODE },
                    fast_cpu: if membarrier { PER_CPU } else { NOT_A_MODE },
                    rseq,
                    id: next_group_id(),
                    cids_per_core: cids_per_core as u32,
                    rseq_area: if rseq { rseq::area() } else { 0 },
                }),
                slots: (0..cores).map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU32::new(EMPTY)))).collect(),
                bitmap,
                cores,
                virtual_cpus: self.virtual_cpus.is_some(),
                users: AtomicUsize::new(0),
                handles: std::sync::atomic::AtomicUsize::new(1),
                life: Mutex::new(Life {
                    regs: Vec::new(),
                    free: Vec::new(),
                    allowed,
                    switch_back_below: 0,
                    occupied: false,
                    counters: Counters::default(),
                }),
                claim: AtomicU32::new(0),
                claims_deferred: AtomicU32::new(0),
                #[cfg(loom)]
                on_cpu: rseq::OnCpu::new(cores),
                knob,
                #[cfg(loom)]
                failing_barriers: self.failing_barriers,
                #[cfg(all(test, not(loom)))]
                fail_barriers: sys::FailBarriers::default(),
            }),
            counted: true,
        };
        #[cfg(not(loom))]
        crate::fork::track(registry, &group.inner);
        group
    }
}

/// The most CIDs a core of a group of `cores` may own: [`MAX_CIDS_PER_CORE`], less where the cores' share would take
/// more than half the CID space (only groups of more than 32 768 cores, virtual ones).
fn cids_per_core_limit(cores: usize) -> usize {
    (MAX_BITS / 2 / cores).clamp(1, MAX_CIDS_PER_CORE)
}

fn next_group_id() -> u64 {
    // A plain std atomic even under loom: ids only need to differ, and loom must not see this static.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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
        // Relaxed: set-up, before the model's threads are spawned, which orders it before everything they do.
        g.slot(slot_at(cpu, 0)).store(slot::busy(c), Ordering::Relaxed);
    }

    /// That guard's exit after the switch (`exit_slow_core` without adoption): X1, then the claim, which may
    /// defer to the lock's holder; a CID taken is freed.
    pub fn loom_exit_core(&self, cpu: usize) {
        let g = &*self.inner;
        // Relaxed: the holder reads its own BUSY word (only it writes a BUSY slot). Release: X1, as the real exit.
        let at = slot_at(cpu, 0);
        let c = g.slot(at).load(Ordering::Relaxed) & VALUE;
        g.slot(at).store(slot::owned(c), Ordering::Release);
        if g.take_idle(at, slot::owned(c), Taker::Exit, &Counters::default()) {
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
