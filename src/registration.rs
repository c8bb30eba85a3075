//! `Registration` (≈ a task of the mm) and `CidGuard` (≈ running on a CPU): the enter and exit state machines of
//! design.md §4. The fast paths (`enter_raw` with the per-task test and `enter_cpu_fast`, and `exit_task`) are
//! inlined; everything else is out of line.

use crate::group::*;
use crate::state::*;
use crate::stats::{Counters, Ev};
use crate::sync::{compiler_fence, Arc, AtomicU32, Ordering::*};
use crate::{sys, Error, Group};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// A registration's shared record, on its own cache lines: written by its owner on every enter and exit, and
/// by fixups only with CAS (design.md §2.2). `repr(C)`: the word and `running` come first and the hot counters
/// right after them (`Ev`'s order), so the fast paths and the temporary path touch the record's first 64 bytes
/// only. (Left to itself, Rust places the 8-aligned counters first and the word at byte 152, so every per-task
/// enter would touch two lines of the record.)
#[repr(C, align(128))]
pub(crate) struct RegRec {
    /// Registration word: `UNSET` or the CID this registration owns.
    pub(crate) cid: AtomicU32,
    /// 1 from E1 of every enter until the guard's exit clears it (first thing on task and core exits, last on
    /// temporary ones); written only by the owner, read by task → CPU walks (design.md §2.2).
    pub(crate) running: AtomicU32,
    pub(crate) counters: Counters,
}

impl RegRec {
    pub(crate) fn new() -> RegRec {
        RegRec { cid: AtomicU32::new(UNSET), running: AtomicU32::new(0), counters: Counters::default() }
    }
}

/// A concurrency ID: a small integer that no other live guard of the same group holds (I1).
///
/// A CID is observed again by another thread only after the guard holding it was dropped; whatever the previous
/// holder wrote to memory indexed by the CID is visible to the next holder (I8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cid(u32);

impl Cid {
    #[cfg_attr(loom, allow(dead_code))] // used by the runtime's thread view, not compiled under loom
    pub(crate) fn from_raw(cid: u32) -> Cid {
        Cid(cid)
    }

    /// The CID as an index.
    #[inline]
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for Cid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What a guard holds, and how it must give it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The registration's own CID (per-task ownership).
    Task(u32),
    /// The CID of slot `at` (`slot_at(cpu, j)`: slot `j` of core `cpu`), borrowed (per-CPU ownership); the slot
    /// is BUSY until exit.
    Core { at: u32, cid: u32 },
    /// A temporary CID, dropped at exit (the core's CID was in use).
    Temp(u32),
}

/// Result of `enter_raw`: what is held, packed in one `u64` so the hot path keeps it in a register (a struct with
/// padding was built on the stack with narrow stores and read back wide, which stalls store-to-load forwarding):
/// bits 0..32 the CID, 32..34 the kind, bit 34 "the guard owns its pooled registration", bits 35..64 the slot index
/// (`Held::Core`).
#[derive(Clone, Copy)]
pub(crate) struct Entered(u64);

const KIND_TASK: u64 = 0;
const KIND_CORE: u64 = 1;
const KIND_TEMP: u64 = 2;
const KIND_SHIFT: u32 = 32;
const POOLED_BIT: u64 = 1 << 34;
const AT_SHIFT: u32 = 35;

impl Entered {
    /// No guard, as `Registration::outstanding`: the bits of `Task(0)`, a kind that is never outstanding (zero
    /// makes the test and the clear one instruction each on the per-CPU path).
    const NOTHING: Entered = Entered(0);

    #[inline(always)]
    fn is_nothing(self) -> bool {
        self.0 == Entered::NOTHING.0
    }

    #[inline(always)]
    fn new(held: Held) -> Entered {
        let (cid, kind, cpu) = match held {
            Held::Task(cid) => (cid, KIND_TASK, 0),
            Held::Core { at, cid } => (cid, KIND_CORE, at),
            Held::Temp(cid) => (cid, KIND_TEMP, 0),
        };
        Entered(cid as u64 | kind << KIND_SHIFT | (cpu as u64) << AT_SHIFT)
    }

    /// The same, marked as owning its (pooled) registration.
    #[cfg_attr(loom, allow(dead_code))] // the thread-local pool is not compiled under loom
    #[inline(always)]
    fn into_pooled(self) -> Entered {
        Entered(self.0 | POOLED_BIT)
    }

    #[inline(always)]
    pub(crate) fn cid(self) -> u32 {
        self.0 as u32
    }

    #[inline(always)]
    fn pooled(self) -> bool {
        self.0 & POOLED_BIT != 0
    }

    pub(crate) fn held(self) -> Held {
        let cid = self.cid();
        match (self.0 >> KIND_SHIFT) & 3 {
            KIND_TASK => Held::Task(cid),
            KIND_CORE => Held::Core { at: (self.0 >> AT_SHIFT) as u32, cid },
            _ => Held::Temp(cid),
        }
    }
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered").field("held", &self.held()).field("pooled", &self.pooled()).finish()
    }
}

/// Every this many extra-CID borrows, a registration looks at its group's occupancy (design.md §3.1). Under loom
/// the counters are compiled out (the count reads 1) and only donations look.
const OCCUPANCY_PERIOD: u64 = 4096;

/// How many times the per-CPU slow path retries a slot CAS before it takes a temporary CID instead (I6).
const SLOT_TRIES: usize = 3;

/// A thread's membership in a [`Group`] (≈ a task of the address space). Dropping it releases everything it
/// owns (≈ exit), and may switch the group back to per-task mode before the drop returns.
///
/// `Send`: a registration may move to another thread between guards.
///
/// ```
/// let group = mmcid::Group::new();
/// let mut reg = group.register();
/// let first = reg.enter().cid();
/// let again = reg.enter().cid();
/// assert_eq!(first, again); // I3: stable while membership is unchanged (per-task mode)
/// ```
pub struct Registration {
    group: Group,
    rec: Arc<RegRec>,
    index: usize,
    cpu: Option<usize>,
    /// The per-CPU or temporary guard entered last, until its exit: still set at the next enter or at the drop
    /// only if that guard was passed to `mem::forget`, and then given back there (design.md §4.6).
    outstanding: Entered,
    /// The slot the last per-CPU guard released (`slot_at`), and the idle word it stored there: the per-CPU fast
    /// path borrows that word without loading the slot first when it enters on the same core (§4.1). Only a
    /// prediction: the borrow compares the slot with it, so a stale one just fails the borrow.
    hint_at: u32,
    hint_word: u32,
    /// The slot into which this registration's last steal moved a CID (`slot_at`), or `u32::MAX`: a steal that
    /// takes from it again takes back the CID it carried there, the sign of a steal storm (design.md §4.5.1).
    /// Written only on the steal path.
    stole_into: u32,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("cid", &self.cid()).field("cpu", &self.cpu).finish()
    }
}

impl Registration {
    pub(crate) fn new(group: Group, rec: Arc<RegRec>, index: usize) -> Registration {
        Registration {
            group,
            rec,
            index,
            cpu: None,
            outstanding: Entered::NOTHING,
            hint_at: u32::MAX,
            hint_word: EMPTY,
            stole_into: u32::MAX,
        }
    }

    /// Takes a CID for the life of the returned guard (≈ schedule-in). Never waits for another thread (I6): it
    /// takes no lock (the claim lock of a steal only with `try_lock`), and its loops are lock-free: a bitmap
    /// allocation retries only while other threads' allocations and frees race with its scan (a free bit always
    /// exists: no registration or core holds more than its share, design.md §2.4), and a steal that got the claim
    /// lock drains the claims other exits deferred to it for as long as they keep deferring (design.md §11). The
    /// per-task and per-CPU fast paths make no system call; two rare paths issue one `membarrier`: taking an idle
    /// CID from another core in a group with restartable sequences, and giving back a guard passed to
    /// `mem::forget`. The kernel completes it without waiting for the group's threads to reach any point, but since
    /// Linux 6.8 serialises it on a kernel mutex, where it can sleep (design.md §11).
    #[inline(always)]
    pub fn enter(&mut self) -> CidGuard<'_> {
        let entered = self.enter_raw();
        CidGuard::borrowed(self, entered)
    }

    /// The group this registration belongs to.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The CID this registration owns between guards (per-task ownership), if any.
    pub fn cid(&self) -> Option<Cid> {
        // Relaxed: a snapshot; fixups only ever store UNSET into it, which publishes nothing.
        let w = self.rec.cid.load(Relaxed);
        (w != UNSET).then_some(Cid(w))
    }

    /// Declares the core this registration's thread runs on (the runtime does this after pinning), so entering
    /// needs no `sched_getcpu`; `None` asks the OS at each per-CPU enter. Any core below [`Group::cores`] is
    /// accepted: a wrong declaration costs locality, never exclusivity. Groups that borrow with restartable
    /// sequences ([`Group::uses_rseq`]) ignore it and use the CPU the kernel reports, which the sequence needs.
    pub fn set_cpu(&mut self, cpu: Option<usize>) -> Result<(), Error> {
        let cores = self.group.inner.cores;
        match cpu {
            Some(c) if c >= cores => Err(Error::CpuOutOfRange { cpu: c, possible: cores }),
            _ => {
                self.cpu = cpu;
                Ok(())
            }
        }
    }

    /// The core declared with [`Registration::set_cpu`].
    pub fn cpu(&self) -> Option<usize> {
        self.cpu
    }

    #[inline(always)]
    fn cpu_index(&self) -> usize {
        // rseq groups borrow on the CPU the kernel says we run on: a sequence on another core's slot never commits.
        // (Loom keeps the declared core: it is the modelled CPU.)
        let g = &*self.group.inner;
        let declared = if cfg!(loom) || !g.hot.rseq { self.cpu } else { None };
        match declared {
            Some(c) => c,
            None => {
                // rseq groups read the area's `cpu_id` at the offset they keep next to the mode word (one load).
                let cpu = if cfg!(not(loom)) && g.hot.rseq {
                    sys::rseq::cpu_id_in(g.hot.rseq_area).unwrap_or_else(sys::current_cpu)
                } else {
                    sys::current_cpu()
                };
                let cores = g.cores;
                // No division on the common path: only virtual groups can see a CPU beyond their cores.
                if cpu < cores {
                    cpu
                } else {
                    cpu % cores
                }
            }
        }
    }

    /// Enter (design.md §4.1). In per-CPU mode a registration that owns no CID borrows its core's CID with one rseq
    /// sequence or CAS (inlined); every other enter starts with D-enter's E1..E3, and the per-task fast path ends
    /// right there, with no read-modify-write; everything else continues out of line.
    #[inline(always)]
    pub(crate) fn enter_raw(&mut self) -> Entered {
        let g = &*self.group.inner;
        let rec = &*self.rec;
        // Per-CPU mode and nothing owned: no E1. `running` matters only to a task → CPU walk deciding whether to take
        // our word, and walks skip an UNSET word whatever `running` says (design.md §4.1). Acquire: as E3 below (a
        // mode read here is the hint that chooses the path; the borrow's sequence or CAS decides). Relaxed word
        // load: UNSET is exact, only we store CIDs into our word.
        if g.hot.mode.load(Acquire) == PER_CPU && self.outstanding.is_nothing() && rec.cid.load(Relaxed) == UNSET {
            return match self.enter_cpu_fast() {
                Ok(entered) => entered,
                Err((s, cpu)) => self.enter_cpu_other(s, cpu),
            };
        }
        // Relaxed: E1 of D-enter; ordered before E3 by the light barrier, and publishes nothing.
        rec.running.store(1, Relaxed);
        if !g.mutant(MUTANT_NO_ENTER_BARRIER) {
            // E2, light side: pairs with F2 of a task → CPU switch. The whole light barrier when F2 is membarrier;
            // otherwise `fast_task` never matches and `enter_other` adds the full fence.
            compiler_fence(SeqCst);
        }
        // Acquire: pairs with the Release completion store F4 (and F1), so the word below reflects every fixup
        // this mode value is the result of.
        let m = g.hot.mode.load(Acquire); // E3
        let w = rec.cid.load(Acquire);
        // UNSET is larger than any max_cids, so one compare checks "owns a CID" and "in range".
        if m == g.hot.fast_task && (w as usize) < g.max_cids() {
            rec.counters.bump(Ev::TaskFast);
            return Entered::new(Held::Task(w));
        }
        if m == PER_CPU {
            return self.enter_cpu_after_e1(w);
        }
        self.enter_other(m)
    }

    /// Per-CPU mode after E1..E3: a forgotten guard to give back, a word to give up, or a switch to per-CPU mode
    /// completed since the first mode load. `w`: our word as E3 read it.
    #[inline(never)]
    fn enter_cpu_after_e1(&mut self, w: u32) -> Entered {
        if !self.outstanding.is_nothing() {
            return self.enter_after_forgotten();
        }
        // No fence needed to choose this path: the slot CAS decides, and the slow path completes E2 itself.
        // The registration must own nothing here: a task → CPU walk that saw our E1 skipped our word, and only
        // the slow path gives it up (`enter_core_owned`). `w` is exact when UNSET: only we store CIDs into it.
        if w != UNSET && !self.group.inner.mutant(MUTANT_CPU_PATH_KEEPS_WORD) {
            return self.enter_slow(false);
        }
        match self.enter_cpu_fast() {
            Ok(entered) => entered,
            Err((s, cpu)) => self.enter_cpu_other(s, cpu),
        }
    }

    /// Per-CPU fast path: borrow the core's idle CID with one CAS on its slot, or one restartable sequence
    /// (design.md §4.1.1). `Err((slot word, core))`: the slot was not idle (or the borrow lost), for
    /// `enter_cpu_other` to decide.
    #[inline(always)]
    fn enter_cpu_fast(&mut self) -> Result<Entered, (u32, usize)> {
        let g = &*self.group.inner;
        let cpu = self.cpu_index();
        let first = slot_at(cpu, 0);
        // The word our last exit left in the slot we used last, if it is on this core: the slot then usually still
        // holds it (whoever borrowed it since gave it back the same), and borrowing it from a register rather than
        // from a load keeps the guard's CID, and so the work on its shard, from waiting for the last exit's store.
        // An extra slot only while the first is busy (I2's soft bound, I4: the first CID is preferred).
        let (at, s) = if self.hint_at as usize == first {
            (first, self.hint_word)
        } else {
            // Relaxed: only a hint, validated by the borrow.
            let s0 = g.slot(first).load(Relaxed);
            if s0 & BUSY != 0 && core_of(self.hint_at as usize) == cpu {
                (self.hint_at as usize, self.hint_word)
            } else {
                (first, s0)
            }
        };
        if let Some(c) = slot::idle_cid(s) {
            if (at != first || (c as usize) < g.max_cids()) && g.borrow_slot(at, s) {
                if at == first {
                    self.rec.counters.bump(Ev::CpuFast);
                } else {
                    self.borrowed_extra();
                }
                return Ok(self.outstanding(Held::Core { at: at as u32, cid: c }));
            }
        }
        // Relaxed: a hint for `enter_cpu_other`, as above.
        Err((g.slot(first).load(Relaxed), cpu))
    }

    /// Per-CPU mode, owning nothing, when core `cpu`'s first slot was not borrowed (word `s`): if that CID is busy
    /// (the common case), one of the core's extra CIDs, else a temporary; else the slow path.
    #[inline(never)]
    fn enter_cpu_other(&mut self, s: u32, cpu: usize) -> Entered {
        if s & BUSY != 0 {
            // The core's first CID is in use by a thread descheduled inside its guard, and we own nothing. No
            // barrier needed here either: the extra slots follow the protocol of the first one (design.md §2.6),
            // and fixups only take registration words (ours is UNSET, only we store CIDs into it, and `running` is
            // set anyway) and idle slots, never a guard's temporary.
            let held = self.borrow_or_temporary(cpu, None);
            return self.outstanding(held);
        }
        // The slow path needs E1 (the first mode load may have chosen this path without it) and completes E2.
        // Relaxed: E1, as in `enter_raw`.
        self.rec.running.store(1, Relaxed);
        compiler_fence(SeqCst);
        self.enter_slow(false)
    }

    /// Core `cpu`'s first CID is busy: borrow one of its extra CIDs (design.md §2.6), else a temporary (from the
    /// core's bitmap lane, §2.5). `spare`: a CID we own and give up (our word's), used before the bitmap's.
    fn borrow_or_temporary(&mut self, cpu: usize, mut spare: Option<u32>) -> Held {
        let g = &*self.group.inner;
        let c = &self.rec.counters;
        if let Some(held) = self.borrow_extra(cpu, &mut spare) {
            self.borrowed_extra();
            return held;
        }
        c.bump(Ev::Temporary);
        Held::Temp(spare.unwrap_or_else(|| {
            c.bump(Ev::Alloc);
            c.bump(Ev::BitmapSet);
            let n = g.bitmap.get_near(cpu, g.temp_bound());
            if g.hot.k > 1 {
                g.check_occupancy(); // every CID of the core is held: is per-task ownership as good (§3.1)?
            }
            n
        }))
    }

    /// Counts an extra-CID borrow, and every `OCCUPANCY_PERIOD`-th one of this registration looks at the group's
    /// occupancy (design.md §3.1): while extras are in use, their donations alone may have stopped long ago.
    #[inline(always)]
    fn borrowed_extra(&self) {
        if self.rec.counters.bumped(Ev::CpuExtra) % OCCUPANCY_PERIOD == 0 {
            self.group.inner.check_occupancy();
        }
    }

    /// An extra slot of core `cpu` (`1..K`, design.md §2.6): the first idle one, borrowed as the first slot is (and
    /// then `spare`, the CID our registration gave up, is surplus and goes back to the bitmap); else the first EMPTY
    /// one, into which `spare` or a fresh CID is donated (`EMPTY → ONCPU|BUSY|n`). `None` if every extra slot is
    /// BUSY or claimed, or the donation lost its race (then `spare` holds the CID it would have donated).
    fn borrow_extra(&self, cpu: usize, spare: &mut Option<u32>) -> Option<Held> {
        let g = &*self.group.inner;
        let mut empty = None;
        for (at, slot) in g.core_slots(cpu).skip(1) {
            // Relaxed: a hint the borrow validates (and acquires through, I8).
            let s = slot.load(Relaxed);
            if let Some(cid) = slot::idle_cid(s) {
                if g.borrow_slot(at, s) {
                    if let Some(x) = spare.take() {
                        g.bitmap.clear(x); // as after the first slot's borrow: the core already owns one
                        self.rec.counters.bump(Ev::BitmapClear);
                    }
                    return Some(Held::Core { at: at as u32, cid });
                }
            } else if s == EMPTY && empty.is_none() {
                empty = Some(at);
            }
        }
        let at = empty?;
        let c = &self.rec.counters;
        let n = spare.take().unwrap_or_else(|| {
            c.bump(Ev::Alloc);
            c.bump(Ev::BitmapSet);
            g.bitmap.get()
        });
        // Relaxed: as the first slot's donation (`enter_core_owned`): nobody reads a BUSY slot for data, `n`'s history
        // came with it and our X1 (Release) hands it on (I8).
        if g.slot(at).compare_exchange(EMPTY, slot::busy(n), Relaxed, Relaxed).is_ok() {
            g.check_occupancy(); // the core needs one more CID: is per-task ownership as good (design.md §3.1)?
            return Some(Held::Core { at: at as u32, cid: n });
        }
        *spare = Some(n);
        None
    }

    /// Enter after E1 and the compiler fence, outside per-CPU mode, when the per-task fast path did not apply: the
    /// per-task fast path of a group without membarrier, or the slow path.
    #[inline(never)]
    fn enter_other(&mut self, m: u32) -> Entered {
        debug_assert_ne!(m, PER_CPU, "handled by enter_raw");
        if !self.outstanding.is_nothing() {
            return self.enter_after_forgotten();
        }
        let g = &*self.group.inner;
        // Without membarrier the full fence of E2 runs only now: E3 again, and the per-task fast path after all.
        if g.mode_after_light_barrier(m, MUTANT_NO_ENTER_BARRIER) == PER_TASK {
            let w = self.rec.cid.load(Acquire);
            if (w as usize) < g.max_cids() {
                self.rec.counters.bump(Ev::TaskFast);
                return Entered::new(Held::Task(w));
            }
        }
        self.enter_slow(true)
    }

    /// Slow path, with `running` set; `fenced`: the light barrier is complete (else E2 is completed here).
    #[cold]
    fn enter_slow(&mut self, fenced: bool) -> Entered {
        let g = &*self.group.inner;
        if !fenced && !g.mutant(MUTANT_NO_ENTER_BARRIER) {
            g.light_barrier_rest(); // E2 (the compiler fence ran in enter_raw)
        }
        let m = g.hot.mode.load(Acquire); // E3
        let held = if m & ONCPU == 0 { self.enter_task_owned() } else { self.enter_core_owned() };
        self.rec.counters.bump(match held {
            Held::Task(_) => Ev::TaskSlow,
            Held::Core { at, .. } if at as usize & (MAX_CIDS_PER_CORE - 1) != 0 => Ev::CpuExtra,
            Held::Core { .. } => Ev::CpuSlow,
            Held::Temp(_) => Ev::Temporary,
        });
        self.outstanding(held)
    }

    /// The guard entered with `held`, noted until its exit if it is a per-CPU or temporary one (design.md §4.6;
    /// a per-task guard needs nothing given back). Where the kind is known, inlining drops the test.
    #[inline(always)]
    fn outstanding(&mut self, held: Held) -> Entered {
        let entered = Entered::new(held);
        if !matches!(held, Held::Task(_)) {
            self.outstanding = entered;
        }
        entered
    }

    /// Enter when the last per-CPU or temporary guard never exited: give it back first. Our E1 is undone by
    /// that exit and redone by the enter; neither matters to a walk, which skips our UNSET word.
    #[cold]
    #[inline(never)]
    fn enter_after_forgotten(&mut self) -> Entered {
        self.give_back_forgotten();
        self.enter_raw()
    }

    /// The last per-CPU or temporary guard of this registration never exited: it was passed to `mem::forget`.
    /// Give back what it holds, as its drop would have (design.md §4.6).
    #[cold]
    fn give_back_forgotten(&mut self) {
        self.rec.counters.bump(Ev::Forgotten);
        self.exit_other(self.outstanding);
    }

    /// Per-task or CPU → task: the registration owns its CID (design.md §4.3). By D-enter no fixup takes our word
    /// while we are here, but every change still goes through a CAS.
    fn enter_task_owned(&mut self) -> Held {
        let g = &*self.group.inner;
        let c = &self.rec.counters;
        let max = g.max_cids();
        // Relaxed: E3's Acquire load of the mode already made every completed walk's UNSET visible (coherence),
        // and no walk of words runs in a mode without ONCPU; otherwise the value is our own.
        let w = self.rec.cid.load(Relaxed);
        if w != UNSET {
            if (w as usize) < max {
                return Held::Task(w);
            }
            if !g.bitmap.has_free_below(max) {
                return Held::Task(w); // nothing free below max yet: keep it, converge at a later enter
            }
            if g.mutant(MUTANT_CONVERGE_TAKES_FIRST) {
                // Loom model 8's twin (`ConvergeTakesFirst`): the new CID taken before `w` is given up.
                let Some(n) = g.bitmap.try_get(max) else {
                    return Held::Task(w);
                };
                if self.rec.cid.compare_exchange(w, n, AcqRel, Acquire).is_ok() {
                    g.bitmap.clear(w);
                    return Held::Task(n);
                }
                return self.install(n);
            }
            // Converge, giving `w` up first so that we never hold two CIDs (design.md §2.4, §4.5). AcqRel: ownership
            // moves in one RMW; pairs with a walk's CAS on the word (the other writer), I5. If it fails, a fixup
            // took `w` (unreachable by D-enter: it saw our E1): our word is UNSET either way.
            let gave_up = self.rec.cid.compare_exchange(w, UNSET, AcqRel, Acquire).is_ok();
            if gave_up {
                g.bitmap.clear(w);
                c.bump(Ev::BitmapClear);
            }
            between_convergence_steps(g);
            // The lowest free CID: below max unless other threads took the free ones meanwhile (then it may even be
            // above `w`, still below users + cores, and we converge at a later enter).
            let n = g.bitmap.get();
            c.bump(Ev::BitmapSet);
            c.bump(if gave_up && (n as usize) < max { Ev::Converge } else { Ev::Alloc });
            return self.install(n);
        }
        let n = g.bitmap.get();
        c.bump(Ev::BitmapSet);
        c.bump(Ev::Alloc);
        self.install(n)
    }

    /// Installs freshly allocated `n` into an UNSET word; only the owner ever stores a CID into its word.
    fn install(&mut self, n: u32) -> Held {
        // AcqRel: ownership moves in one RMW; pairs with a walk's CAS on the word (the other writer), I5.
        match self.rec.cid.compare_exchange(UNSET, n, AcqRel, Acquire) {
            Ok(_) => Held::Task(n),
            Err(_) => Held::Temp(n), // unreachable by design.md §2.2; stay exclusive anyway
        }
    }

    /// Per-CPU or task → CPU: the core owns the CID and we borrow it (design.md §4.3).
    fn enter_core_owned(&mut self) -> Held {
        let g = &*self.group.inner;
        let c = &self.rec.counters;
        let max = g.max_cids();
        // Give up the registration's own CID first: each registration holds at most one CID (§2.4).
        let mut spare = None;
        // Relaxed: a hint the CAS validates.
        let w = self.rec.cid.load(Relaxed);
        // AcqRel: ownership moves in one RMW; pairs with a walk's CAS on the word (the other writer), I5.
        if w != UNSET && self.rec.cid.compare_exchange(w, UNSET, AcqRel, Acquire).is_ok() {
            spare = Some(w);
        }
        let cpu = self.cpu_index();
        let at = slot_at(cpu, 0);
        let slot = g.slot(at);
        for _ in 0..SLOT_TRIES {
            // Relaxed: a hint the borrow or the CAS validates (and acquires through).
            let s = slot.load(Relaxed);
            if let Some(owned) = slot::idle_cid(s) {
                if g.borrow_slot(at, s) {
                    if let Some(x) = spare.take() {
                        g.bitmap.clear(x); // the core already owns one: ours is surplus
                        c.bump(Ev::BitmapClear);
                    }
                    return Held::Core { at: at as u32, cid: self.converge_core(at, owned, max) };
                }
            } else if s == EMPTY {
                let n = spare.take().unwrap_or_else(|| {
                    c.bump(Ev::BitmapSet);
                    c.bump(Ev::Alloc);
                    g.bitmap.get()
                });
                // Relaxed: nobody reads a BUSY slot for data (walks and claims skip it); `n`'s history came
                // with it (our word, or the bitmap's Acquire), and our X1 (Release) hands it on (I8).
                if slot.compare_exchange(EMPTY, slot::busy(n), Relaxed, Relaxed).is_ok() {
                    return Held::Core { at: at as u32, cid: self.converge_core(at, n, max) };
                }
                spare = Some(n);
            } else {
                break; // BUSY: a thread descheduled inside its guard holds the core's CID; never wait for it
            }
        }
        // The first slot is busy (or kept changing under us): an extra CID of the core, else a temporary.
        if let Some(held) = self.borrow_extra(cpu, &mut spare) {
            return held;
        }
        Held::Temp(spare.unwrap_or_else(|| {
            c.bump(Ev::BitmapSet);
            c.bump(Ev::Alloc);
            g.bitmap.get_near(cpu, g.temp_bound())
        }))
    }

    /// We hold the first slot `at` of a core BUSY with CID `cid`: move it under `max` if it is not (I4,
    /// design.md §4.5). Nobody else writes a BUSY slot, so plain stores suffice here.
    fn converge_core(&mut self, at: usize, cid: u32, max: usize) -> u32 {
        if (cid as usize) < max {
            return cid;
        }
        let g = &*self.group.inner;
        let c = &self.rec.counters;
        let slot = g.slot(at);
        if g.bitmap.has_free_below(max) {
            // Give `cid` up first, as per-task convergence does (design.md §2.4). Until the store below, the slot
            // names a CID we no longer own; nothing reads a BUSY slot's CID (walks, claims, borrows and sequences
            // skip it; `audit` runs only at quiescence), and the guard has not begun.
            g.bitmap.clear(cid);
            between_convergence_steps(g);
            // The lowest free CID: below max unless another thread took the free one meanwhile.
            let n = g.bitmap.get();
            // Relaxed: nobody reads a BUSY slot for data; our X1 (Release) publishes at exit.
            slot.store(slot::busy(n), Relaxed);
            c.bump(Ev::BitmapClear);
            c.bump(Ev::BitmapSet);
            c.bump(if (n as usize) < max { Ev::Converge } else { Ev::Alloc });
            return n;
        }
        // Every low CID is owned: reclaim one parked on a core nobody is using (stronger than the kernel), or on an
        // extra slot (design.md §2.6), of any core.
        self.steal(at, cid, max).unwrap_or(cid)
    }

    /// Convergence of the first slot `at` of a core, held BUSY with CID `cid ≥ max`, when no CID below `max` is
    /// free: take an idle one from another slot (design.md §4.5), first from the slot our last steal filled (the
    /// CID we brought there), and if that is where it came from, see whether the group should leave per-CPU mode
    /// (§4.5.1). `None` if no idle CID below `max` could be taken.
    fn steal(&mut self, at: usize, cid: u32, max: usize) -> Option<u32> {
        let g = &*self.group.inner;
        let c = &self.rec.counters;
        let back = self.stole_into as usize;
        let ours = (self.stole_into != u32::MAX && back != at).then(|| (back, g.slot(back)));
        for (i, other) in ours.into_iter().chain(g.all_slots()) {
            if i == at {
                continue;
            }
            let s = other.load(Relaxed); // a hint: `take_idle`'s CAS validates it and acquires through it
            if let Some(low) = slot::idle_cid(s).filter(|&l| (l as usize) < max) {
                // Only tries the claim lock of rseq groups: enter never waits (I6).
                if g.take_idle(i, s, false, c) {
                    g.slot(at).store(slot::busy(low), Relaxed); // as in `converge_core`: a BUSY slot
                    g.bitmap.clear(cid);
                    c.bump(Ev::BitmapClear);
                    c.bump(Ev::Steal);
                    c.bump(Ev::Converge);
                    self.stole_into = at as u32;
                    if i == back {
                        g.check_steal_storm(); // the CID follows this thread from core to core
                    }
                    return Some(low);
                }
            }
        }
        None
    }

    /// Where a whole update may run as one restartable sequence, in an rseq group `g` (this registration's):
    /// per-task on the CID this registration owns, below `max_cids` (design.md §9.3; out of range, the guard
    /// path converges it, I4); per-CPU, with the group in per-CPU mode and this registration owning no CID, on
    /// its core's first CID if idle and in range (§9.2), else on an extra CID if the first is busy (§2.6, looked
    /// up out of line by the caller). The mode is not read for the per-task target: the sequence compares it and
    /// the word inside, and in per-CPU mode the word is UNSET, which no `max_cids` exceeds. The per-CPU target
    /// checks `sequences_apply` here so that no caller can skip it: it is what keeps CAS borrowers away from the
    /// slot. Shared by `add_in_sequence` and its loom twin `update_in_sequence`.
    #[inline(always)]
    fn sequence_target(&self, g: &Inner) -> SequenceTarget {
        // Relaxed: a hint the sequence compares again (the word is our own: only fixups change it, to UNSET).
        let w = self.rec.cid.load(Relaxed);
        if (w as usize) < g.max_cids() {
            return SequenceTarget::Owned(w);
        }
        if w != UNSET || !g.sequences_apply() {
            return SequenceTarget::Guard;
        }
        let Some(cpu) = self.sequence_cpu(g) else { return SequenceTarget::Guard };
        // Relaxed: a hint; the sequence compares the slot again and acquires through it (I8).
        let s = g.slot(slot_at(cpu, 0)).load(Relaxed);
        let c = if g.mutant(MUTANT_SEQUENCE_IGNORES_BUSY) {
            Some(s & VALUE).filter(|_| s & ONCPU != 0)
        } else {
            slot::idle_cid(s)
        };
        match c {
            Some(c) if (c as usize) < g.max_cids() => SequenceTarget::Core { cpu, s, c },
            None if s & BUSY != 0 => SequenceTarget::Extra(cpu),
            _ => SequenceTarget::Guard, // out of range (the guard path converges it, I4), or no CID on the core
        }
    }

    /// The core a per-CPU sequence runs on: the CPU the kernel says we run on (a sequence on another core's slot
    /// never commits), read at the area offset the group keeps next to its mode word; `None` for an unregistered
    /// area (negative) or a CPU beyond the group's slots, which take the guard path. Loom: the declared core.
    #[inline(always)]
    fn sequence_cpu(&self, g: &Inner) -> Option<usize> {
        if cfg!(loom) {
            Some(self.cpu_index())
        } else {
            sys::rseq::cpu_id_in(g.hot.rseq_area).filter(|&c| c < g.cores)
        }
    }

    /// Core `cpu`'s first idle extra CID, if any: `(slot index, idle slot word, its CID)`.
    #[inline(never)]
    fn extra_sequence_target(&self, cpu: usize) -> Option<(usize, u32, u32)> {
        let g = &*self.group.inner;
        // Relaxed: as in `sequence_target`, hints the sequence validates.
        g.core_slots(cpu).skip(1).find_map(|(at, slot)| {
            let s = slot.load(Relaxed);
            slot::idle_cid(s).map(|c| (at, s, c))
        })
    }

    /// `ShardedCounter`'s whole update as one restartable sequence, in an rseq group `g` (this registration's,
    /// passed by the caller, which has it at hand: one dependent load fewer): in per-task mode on the CID this
    /// registration owns (design.md §9.3), in per-CPU mode on its core's idle CID (§9.2), adding `n` to that
    /// CID's shard (`shard` finds it, if installed) only while the CID is ours or nobody borrows it: no guard, no
    /// `running` flag, nothing held that a preemption could strand. False (nothing done) wherever a guard is
    /// needed.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn add_in_sequence<'s>(
        &self,
        g: &Inner,
        shard: impl FnOnce(usize) -> Option<&'s std::sync::atomic::AtomicU64>,
        n: u64,
    ) -> bool {
        debug_assert!(std::ptr::eq(g, &*self.group.inner) && g.hot.rseq);
        let done = match self.sequence_target(g) {
            SequenceTarget::Owned(w) => shard(w as usize)
                .is_some_and(|cell| sys::rseq::add_if_owned(g.hot.rseq_area, &g.hot.mode, &self.rec.cid, w, cell, n)),
            SequenceTarget::Core { cpu, s, c } => shard(c as usize).is_some_and(|cell| {
                sys::rseq::add_if(g.hot.rseq_area, cpu as u32, &g.hot.mode, g.slot(slot_at(cpu, 0)), s, cell, n)
            }),
            SequenceTarget::Extra(cpu) => self.add_on_extra(g, cpu, shard, n),
            SequenceTarget::Guard => false,
        };
        if done {
            self.rec.counters.bump(Ev::Sequence);
        }
        done
    }

    /// `add_in_sequence` when core `cpu`'s first CID is busy: on its first idle extra CID, if any (design.md
    /// §2.6). Out of line, so that the common path keeps its values in registers.
    #[cfg(not(loom))]
    #[inline(never)]
    fn add_on_extra<'s>(
        &self,
        g: &Inner,
        cpu: usize,
        shard: impl FnOnce(usize) -> Option<&'s std::sync::atomic::AtomicU64>,
        n: u64,
    ) -> bool {
        self.extra_sequence_target(cpu).is_some_and(|(at, s, c)| {
            shard(c as usize)
                .is_some_and(|cell| sys::rseq::add_if(g.hot.rseq_area, cpu as u32, &g.hot.mode, g.slot(at), s, cell, n))
        })
    }

    /// Loom only: `add_in_sequence` with the update `f(cid)` run inside the modelled sequence (loom models 11, 14).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn update_in_sequence(&self, f: impl FnOnce(usize)) -> bool {
        let g = &*self.group.inner;
        if !g.hot.rseq {
            return false;
        }
        let (at, s, c) = match self.sequence_target(g) {
            SequenceTarget::Owned(w) => {
                return g.rseq_run_if_owned(self.cpu.unwrap_or(0), &self.rec.cid, w, || f(w as usize));
            }
            SequenceTarget::Core { cpu, s, c } => (slot_at(cpu, 0), s, c),
            SequenceTarget::Extra(cpu) => match self.extra_sequence_target(cpu) {
                Some(t) => t,
                None => return false,
            },
            SequenceTarget::Guard => return false,
        };
        g.rseq_run_if(at, s, || f(c as usize))
    }

    /// Exit (design.md §4.2). The per-task and per-CPU paths are inlined; temporaries are out of line.
    #[cfg_attr(loom, allow(dead_code))] // the in-place enters of the thread-local layer, not compiled under loom
    #[inline(always)]
    pub(crate) fn exit_raw(&mut self, entered: Entered) {
        match entered.held() {
            Held::Task(w) => self.exit_task(w),
            Held::Core { at, cid } => self.exit_core(at as usize, cid),
            Held::Temp(_) => self.exit_other(entered),
        }
    }

    /// Per-CPU exit: D-core's X1..X3 on the slot we borrowed, whichever core we run on now; no read-modify-write.
    #[inline(always)]
    fn exit_core(&mut self, at: usize, cid: u32) {
        let g = &*self.group.inner;
        self.outstanding = Entered::NOTHING;
        // Relaxed: our word is UNSET, so a walk skips it whatever it reads here (not a D-exit X1).
        self.rec.running.store(0, Relaxed);
        // Release: X1 of D-core; hands the slot's CID, with our writes, to the next borrower (I8).
        let at = if g.mutant(MUTANT_EXIT_TO_FIRST_SLOT) { slot_at(core_of(at), 0) } else { at };
        g.slot(at).store(slot::owned(cid), Release);
        (self.hint_at, self.hint_word) = (at as u32, slot::owned(cid));
        if !g.mutant(MUTANT_NO_EXIT_BARRIER) {
            compiler_fence(SeqCst); // X2, light side: pairs with F2 (completed in exit_core_other if needed)
        }
        let m = g.hot.mode.load(Acquire); // X3
        if m != g.hot.fast_cpu {
            self.exit_core_other(at, cid, m);
        }
    }

    /// Per-CPU exit that may need more: the full fence of a group without membarrier, or a switch ran.
    #[inline(never)]
    fn exit_core_other(&mut self, at: usize, cid: u32, m: u32) {
        let m = self.group.inner.mode_after_light_barrier(m, MUTANT_NO_EXIT_BARRIER); // X3 after the whole barrier
        if m & ONCPU == 0 {
            self.exit_slow_core(at, cid, m);
        }
    }

    /// Per-task exit: D-exit's X1..X3, no read-modify-write.
    #[inline(always)]
    fn exit_task(&mut self, w: u32) {
        let g = &*self.group.inner;
        // Release: X1 of D-exit; publishes the guard's writes before a fixup frees the CID (I8).
        self.rec.running.store(0, Release);
        if !g.mutant(MUTANT_NO_EXIT_BARRIER) {
            compiler_fence(SeqCst); // X2, light side: pairs with F2 (completed in exit_task_other if needed)
        }
        let m = g.hot.mode.load(Acquire); // X3
        if m != g.hot.fast_task {
            self.exit_task_other(w, m);
        }
    }

    /// Per-task exit that may need more: the full fence of a group without membarrier, or a switch ran.
    #[inline(never)]
    fn exit_task_other(&mut self, w: u32, m: u32) {
        let m = self.group.inner.mode_after_light_barrier(m, MUTANT_NO_EXIT_BARRIER); // X3 after the whole barrier
        if m != PER_TASK {
            self.exit_slow_task(w, m);
        }
    }

    /// Exit of a per-CPU (D-core's X1..X3) or temporary CID.
    #[inline(never)]
    fn exit_other(&mut self, entered: Entered) {
        let g = &*self.group.inner;
        self.outstanding = Entered::NOTHING;
        match entered.held() {
            Held::Task(_) => unreachable!("handled inline"),
            Held::Core { at, cid } => self.exit_core(at as usize, cid),
            Held::Temp(c) => {
                g.bitmap.clear(c);
                self.rec.counters.bump(Ev::BitmapClear);
                self.rec.running.store(0, Relaxed); // as for a core guard: our word is UNSET
            }
        }
    }

    /// A task → CPU switch ran while we were inside: the CID leaves the registration, adopted by our core if the
    /// switch has completed and the core owns none (kernel 4463c7aa11a6), else dropped (design.md §4.4).
    #[cold]
    fn exit_slow_task(&mut self, w: u32, m: u32) {
        if m & ONCPU == 0 {
            return; // CPU → task running: task ownership is the target, keep it
        }
        let g = &*self.group.inner;
        let c = &self.rec.counters;
        // AcqRel: against the walk's CAS on our word, exactly one of us takes `w` (I5).
        if self.rec.cid.compare_exchange(w, UNSET, AcqRel, Acquire).is_err() {
            return; // the fixup saw us idle and took it
        }
        if m == PER_CPU && (w as usize) < g.max_cids() {
            let at = slot_at(self.cpu_index(), 0);
            // Release: hands `w`, with the guard's writes, to the core's next borrower (its CAS or sequence
            // acquires, I8), or to a sweep's CAS.
            if g.slot(at).compare_exchange(EMPTY, slot::owned(w), Release, Relaxed).is_ok() {
                if self.adopted_for(ONCPU) {
                    c.bump(Ev::Adopt);
                    return;
                }
                // A CPU → task switch may have swept past this slot before our store: take it back.
                if !g.take_idle(at, slot::owned(w), true, c) {
                    return; // someone else took it (theirs now), or we deferred it to the claim holder's drain
                }
            }
        }
        g.bitmap.clear(w);
        c.bump(Ev::BitmapClear);
        c.bump(Ev::TransitDrop);
    }

    /// A CPU → task switch ran while we were inside: the core gives up the CID, adopted by this registration if
    /// the switch has completed and we own none, else dropped (design.md §4.4).
    #[cold]
    fn exit_slow_core(&mut self, at: usize, cid: u32, m: u32) {
        let g = &*self.group.inner;
        let c = &self.rec.counters;
        if !g.take_idle(at, slot::owned(cid), true, c) {
            return; // a fixup or another borrower moved it on, or we deferred it to the claim holder's drain
        }
        if m == PER_TASK
            && (cid as usize) < g.max_cids()
            // AcqRel: against a later walk's CAS on our word, exactly one of us holds `cid` (I5).
            && self.rec.cid.compare_exchange(UNSET, cid, AcqRel, Acquire).is_ok()
        {
            if self.adopted_for(0) {
                c.bump(Ev::Adopt);
                return;
            }
            // A task → CPU switch may have walked past our word before our store: take it back (AcqRel: against
            // the walk's CAS, exactly one of us takes it).
            if self.rec.cid.compare_exchange(cid, UNSET, AcqRel, Acquire).is_err() {
                return; // the fixup took it
            }
        }
        g.bitmap.clear(cid);
        c.bump(Ev::BitmapClear);
        c.bump(Ev::TransitDrop);
    }

    /// After placing an adopted CID: light barrier, then is the ownership still `want` (ONCPU or 0)? This is the
    /// same Dekker pair as X1..X3 (our placement is the store, a new switch's F1..F3 the other side).
    fn adopted_for(&self, want: u32) -> bool {
        let g = &*self.group.inner;
        if g.mutant(MUTANT_NO_ADOPT_RECHECK) {
            return true;
        }
        g.light_barrier();
        g.hot.mode.load(Acquire) & ONCPU == want
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.outstanding.is_nothing() {
            self.give_back_forgotten();
        }
        self.group.inner.unregister(&self.rec, self.index);
    }
}

/// Proof that the holder owns a CID exclusively (≈ running on a CPU). Dropping it gives the CID back
/// (≈ schedule-out): to the registration (per-task), to the core (per-CPU), or to the pool (temporary).
///
/// A guard passed to [`std::mem::forget`] holds its CID until its registration's next enter or drop, which give
/// back what it held as its drop would have; a registration never holds more than one CID. (A forgotten guard of
/// [`Group::enter`] owns its registration, which then stays registered, holding what the guard held, until its
/// thread exits: docs/design.md §9.1.1.)
///
/// ```
/// let group = mmcid::Group::builder().virtual_cpus(1).build()?;
/// let (mut reg, _other) = (group.register(), group.register()); // 2 threads, 1 core: per-CPU mode
/// let forgotten = reg.enter();
/// let cid = forgotten.cid();
/// std::mem::forget(forgotten); // the core's CID stays borrowed...
/// let again = reg.enter(); // ...until this enter gives it back and borrows it again
/// assert_eq!((again.cid(), again.kind()), (cid, mmcid::CidKind::Core(0)));
/// # Ok::<(), mmcid::Error>(())
/// ```
///
/// `!Send`: the CID belongs to the thread that entered, so a guard cannot move to another thread:
///
/// ```compile_fail,E0277
/// let group = mmcid::Group::new();
/// let mut reg = group.register();
/// let guard = reg.enter();
/// std::thread::scope(|s| {
///     s.spawn(move || drop(guard));
/// });
/// ```
///
/// while the registration itself may move between guards:
///
/// ```
/// let group = mmcid::Group::new();
/// let mut reg = group.register();
/// drop(reg.enter());
/// std::thread::spawn(move || drop(reg.enter())).join().unwrap();
/// ```
#[must_use = "dropping the guard releases the CID"]
#[clippy::has_significant_drop]
pub struct CidGuard<'a> {
    /// The registration entered: borrowed mutably for `'a` (`Registration::enter`), or owned by this guard
    /// (`pooled`: taken from the thread's pool by `Group::enter` and given back on drop). A pointer rather than an
    /// enum keeps the drop small enough to inline on the hot path.
    reg: NonNull<Registration>,
    entered: Entered,
    /// The group's id (`Group::id`), carried so that `PerCid` checks a guard without following `reg` to its group.
    group: u64,
    /// What the thread view showed before this guard (`view::enter`), for `view::exit`.
    view_before: crate::view::Before,
    _marker: PhantomData<(&'a mut Registration, *mut ())>,
}

impl std::fmt::Debug for CidGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CidGuard").field("cid", &self.cid()).field("held", &self.entered.held()).finish()
    }
}

impl<'a> CidGuard<'a> {
    #[inline(always)]
    pub(crate) fn borrowed(reg: &'a mut Registration, entered: Entered) -> CidGuard<'a> {
        let view_before = crate::view::enter(entered.cid());
        let group = reg.group.inner.hot.id;
        CidGuard { reg: NonNull::from(reg), entered, group, view_before, _marker: PhantomData }
    }

    /// A guard that owns `reg` (a `Box::into_raw` pointer from the thread-local layer) and gives it back on drop.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn pooled(reg: NonNull<Registration>, entered: Entered) -> CidGuard<'static> {
        let view_before = crate::view::enter(entered.cid());
        // SAFETY: the caller hands us ownership of a live registration (`Box::into_raw`); reading its group's id
        // aliases nothing mutable.
        let group = unsafe { reg.as_ref() }.group.inner.hot.id;
        CidGuard { reg, entered: entered.into_pooled(), group, view_before, _marker: PhantomData }
    }

    /// The CID this guard holds.
    #[inline]
    pub fn cid(&self) -> Cid {
        Cid(self.entered.cid())
    }

    /// Whether the CID is borrowed from a core (per-CPU ownership), owned by the registration (per-task), or
    /// temporary.
    pub fn kind(&self) -> CidKind {
        match self.entered.held() {
            Held::Task(_) => CidKind::Task,
            Held::Core { at, .. } => CidKind::Core(core_of(at as usize)),
            Held::Temp(_) => CidKind::Temporary,
        }
    }

    /// The id of the guard's group.
    #[inline]
    pub(crate) fn group_id(&self) -> u64 {
        self.group
    }
}

/// Where a guard's CID comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CidKind {
    /// Owned by the registration (per-task ownership).
    Task,
    /// Borrowed from this core (per-CPU ownership).
    Core(usize),
    /// Temporary: the core's CID was in use, or a switch was running.
    Temporary,
}

impl Drop for CidGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        crate::view::exit(self.entered.cid(), self.view_before);
        // Copies: the rest of the drop works from registers, not from the guard.
        let (reg, entered, group) = (self.reg, self.entered, self.group);
        // SAFETY: `reg` came from `&'a mut Registration` (and `_marker` keeps that borrow alive for the guard's
        // life), or is owned by this pooled guard until it is given back below; nothing else accesses it now.
        let r = unsafe { &mut *reg.as_ptr() };
        match entered.held() {
            Held::Task(w) => r.exit_task(w),
            Held::Core { at, cid } => r.exit_core(at as usize, cid),
            Held::Temp(_) => return drop_other(reg, entered, group),
        }
        if entered.pooled() {
            #[cfg(not(loom))]
            crate::local::give_back(reg, group);
        }
        #[cfg(loom)]
        let _ = group;
    }
}

/// Drop of a temporary guard: its exit, then, for a guard of `Group::enter` (pooled) of group `id`, the
/// registration back to the thread-local layer.
#[inline(never)]
fn drop_other(reg: NonNull<Registration>, entered: Entered, id: u64) {
    // SAFETY: `reg` is borrowed for the guard's life or owned by the pooled guard (`CidGuard::pooled`), a live
    // `Box::into_raw` pointer; nothing else accesses it during the guard's drop.
    unsafe { &mut *reg.as_ptr() }.exit_other(entered);
    if entered.pooled() {
        #[cfg(not(loom))]
        crate::local::give_back(reg, id);
        #[cfg(loom)]
        // SAFETY: as above; under loom pooled guards are never made, so this only keeps the type honest.
        drop(unsafe { Box::from_raw(reg.as_ptr()) });
    }
    #[cfg(loom)]
    let _ = id;
}

/// Where a converger gives up its out-of-range CID and has not taken the new one yet: the point a preempted
/// converger sits at (design.md §2.4). Unit tests record the bitmap there; elsewhere it is nothing.
#[cfg(all(test, not(loom)))]
fn between_convergence_steps(g: &Inner) {
    tests::MID_CONVERGENCE.with(|seen| seen.borrow_mut().push(g.bitmap.count()));
}

#[cfg(not(all(test, not(loom))))]
#[inline(always)]
fn between_convergence_steps(_g: &Inner) {}

/// What `Registration::sequence_target` found: where a whole update may run as one restartable sequence.
#[derive(Clone, Copy)]
enum SequenceTarget {
    /// Per-task: on the CID the registration owns (design.md §9.3).
    Owned(u32),
    /// Per-CPU: on core `cpu`'s first CID `c`, whose slot word read `s` (idle) (§9.2).
    Core { cpu: usize, s: u32, c: u32 },
    /// Per-CPU, core `cpu`'s first CID busy: maybe on one of its extra CIDs (§2.6).
    Extra(usize),
    /// Nowhere: a guard is needed.
    Guard,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// The bitmap's count at each `between_convergence_steps` of this test's thread.
        pub(super) static MID_CONVERGENCE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }

    /// `reg`'s next enter must converge from its one out-of-range CID to CID 0, with no bit set in the bitmap
    /// where a preempted converger would sit (taking first, `ConvergeTakesFirst`'s order, shows two there).
    fn assert_converges_holding_nothing(group: &Group, reg: &mut Registration) {
        let cid = reg.enter().cid().get();
        let seen = MID_CONVERGENCE.with(|seen| seen.take());
        assert_eq!(seen, vec![0], "bits set between the converger's two steps; it owns one CID");
        assert_eq!((cid, group.stats().enter_converge), (0, 1), "converged to CID 0");
    }

    /// Per-task convergence gives the out-of-range CID up before it takes the new one (design.md §2.4): preempted
    /// between the two, the converger holds nothing, so the bitmap holds no more bits than the registrations own
    /// and an allocation always finds a free bit below `users + cores`.
    #[test]
    fn per_task_convergence_never_holds_two_cids() {
        let group = Group::builder().virtual_cpus(2).build().unwrap();
        let r0 = group.register();
        let mut r1 = group.register();
        assert_eq!((r0.cid(), r1.cid(), group.max_cids()), (Some(Cid(0)), Some(Cid(1)), 2));
        drop(r0); // max_cids 1: r1's CID 1 is out of range, CID 0 is free
        assert_converges_holding_nothing(&group, &mut r1);
    }

    /// The same for a core (design.md §4.5): core 1 adopted CID 1 from a guard that was inside during the switch
    /// to per-CPU mode; once one user is left (`max_cids` 1, CID 0 free) the next borrower there converges, and
    /// between its steps the bitmap holds nothing.
    #[test]
    fn per_cpu_convergence_never_holds_two_cids() {
        let group = Group::builder().virtual_cpus(2).build().unwrap();
        let r0 = group.register();
        let mut r1 = group.register();
        r1.set_cpu(Some(1)).unwrap();
        let guard = r1.enter();
        assert_eq!(guard.cid().get(), 1);
        // The task → CPU switch takes r0's idle CID 0 and skips r1, inside its guard.
        let r2 = group.register();
        assert_eq!(group.mode(), crate::Mode::PerCpu);
        drop(guard); // adopted by core 1 (the switch has completed and core 1 owns none)
        assert_eq!(group.stats().exit_adopt, 1, "{:?}", group.stats());
        drop((r0, r2));
        assert_eq!((group.mode(), group.max_cids()), (crate::Mode::PerCpu, 1));
        assert_converges_holding_nothing(&group, &mut r1);
    }

    /// The hot paths touch the record's first 64 bytes only: the word, `running`, and the counters the fast paths,
    /// the extra-CID borrow, the sequence adds and a temporary's enter bump (`Ev`'s first seven). A field reordering (a lost `repr(C)`) or an event inserted
    /// early fails this.
    #[test]
    fn hot_fields_share_the_records_first_line() {
        use crate::stats::Ev;
        use std::mem::offset_of;
        assert_eq!(std::mem::align_of::<RegRec>(), 128);
        assert!(offset_of!(RegRec, cid) + 4 <= 64 && offset_of!(RegRec, running) + 4 <= 64);
        for ev in [Ev::TaskFast, Ev::CpuFast, Ev::CpuExtra, Ev::Sequence, Ev::Temporary, Ev::Alloc, Ev::BitmapSet] {
            let end = offset_of!(RegRec, counters) + 8 * (ev as usize + 1);
            assert!(end <= 64, "counter {ev:?} ends at byte {end} of the record");
        }
    }

    /// The guard's packed record round-trips every kind at the extremes it must hold (29-bit CIDs, 16-bit cores and
    /// 4-bit slot numbers),
    /// and the kind test the inline drop makes (`is_task`) is true for exactly the task kind, pooled or not.
    #[test]
    fn entered_packs_every_kind() {
        let max_cid = VALUE;
        let max_at = slot_at(MAX_CPUS - 1, MAX_CIDS_PER_CORE - 1) as u32;
        for held in [
            Held::Task(0),
            Held::Task(max_cid),
            Held::Core { at: 0, cid: 0 },
            Held::Core { at: max_at, cid: max_cid },
            Held::Temp(max_cid),
        ] {
            let e = Entered::new(held);
            assert_eq!(e.held(), held);
            assert_eq!(e.into_pooled().held(), held, "the pooled bit leaves the rest alone");
            let cid = match held {
                Held::Task(c) | Held::Temp(c) | Held::Core { cid: c, .. } => c,
            };
            assert_eq!((e.cid(), e.into_pooled().cid()), (cid, cid));
            let task = matches!(held, Held::Task(_));
            assert_eq!((e.held(), e.into_pooled().held()), (held, held), "{held:?}");
            let _ = task;
            assert!(!e.pooled() && e.into_pooled().pooled());
        }
    }

    #[test]
    fn set_cpu_refuses_cores_beyond_the_group() {
        let g = Group::builder().virtual_cpus(4).build().unwrap();
        let mut r = g.register();
        assert_eq!(r.set_cpu(Some(4)), Err(Error::CpuOutOfRange { cpu: 4, possible: 4 }));
        assert_eq!(r.cpu(), None, "a refused declaration changes nothing");
        assert_eq!(r.set_cpu(Some(3)), Ok(()));
        assert_eq!(r.cpu(), Some(3));
        assert_eq!(r.set_cpu(None), Ok(()));
        assert_eq!(r.cpu(), None);
    }

    /// `Registration::cid` shows per-task ownership only: a CID from birth in per-task mode, none in per-CPU mode
    /// (the walk took it), and what a guard holds is the core's, not the registration's.
    #[test]
    fn cid_is_the_registration_s_own() {
        let g = Group::builder().virtual_cpus(2).build().unwrap();
        let mut a = g.register();
        assert_eq!(a.cid().map(Cid::get), Some(0));
        let more: Vec<_> = (0..2).map(|_| g.register()).collect();
        assert_eq!(g.mode(), crate::Mode::PerCpu);
        assert_eq!(a.cid(), None, "the task → CPU walk took it");
        a.set_cpu(Some(1)).unwrap();
        let guard = a.enter();
        assert_eq!(guard.kind(), CidKind::Core(1));
        drop(guard);
        assert_eq!(a.cid(), None, "a borrowed CID stays the core's");
        drop(more);
    }
}
