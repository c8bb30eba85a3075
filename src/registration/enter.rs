//! The enter state machine (design.md §4.1, §4.3, §4.5): from `Registration::enter` to the guard's CID. Per-task
//! mode: E1 (`running = 1`), E2 (the light barrier), E3 (the mode load) and the registration's own word, no
//! read-modify-write, inlined. Per-CPU mode with nothing owned: the borrow of the core's idle CID (`borrow_slot`, a
//! restartable sequence or one CAS), inlined, else one of the core's extra CIDs or a temporary. Everything else is
//! out of line: the slow paths of both modes, convergence below `max_cids` (I4) and its steals, and the give-back of
//! a forgotten guard before entering again (§4.6).
//!
//! What an enter reaches outside this module: the slot protocol (`inner/slots.rs`: the borrow, a steal's take), the
//! light barrier's full fence without membarrier (`inner/barriers.rs`), the bitmap, and the two switches an enter may
//! try to start (`inner/switches.rs`); the returned guard is `guard.rs`'s.

use crate::guard::{CidGuard, Entered, Held};
use crate::inner::{Inner, Taker};
use crate::mutants::Mutant;
use crate::registration::Registration;
use crate::state::*;
use crate::stats::Ev;
use crate::sync::{compiler_fence, Ordering::*};

/// Every this many extra-CID borrows, a registration looks at its group's occupancy (design.md §3.1). Under loom
/// the counters are compiled out (the count reads 1) and only donations look.
const OCCUPANCY_PERIOD: u64 = 4096;

/// How many times the per-CPU slow path retries a slot CAS before it takes a temporary CID instead (I6).
const SLOT_TRIES: usize = 3;

impl Registration {
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
                Err((s, cpu)) => self.enter_cpu_busy(s, cpu),
            };
        }
        // Relaxed: E1 of D-enter; ordered before E3 by the light barrier, and publishes nothing.
        rec.running.store(1, Relaxed);
        if !g.knob.is(Mutant::NoEnterBarrier) {
            // E2, light side: pairs with F2 of a task → CPU switch. The whole light barrier when F2 is membarrier;
            // otherwise `fast_task` never matches and `enter_task_fenced` adds the full fence.
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
        self.enter_task_fenced(m)
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
        if w != UNSET && !self.group.inner.knob.is(Mutant::CpuPathKeepsWord) {
            return self.enter_slow(false);
        }
        match self.enter_cpu_fast() {
            Ok(entered) => entered,
            Err((s, cpu)) => self.enter_cpu_busy(s, cpu),
        }
    }

    /// Per-CPU fast path: borrow the core's idle CID with one CAS on its slot, or one restartable sequence
    /// (design.md §4.1.1). `Err((slot word, core))`: the slot was not idle (or the borrow lost), for
    /// `enter_cpu_busy` to decide.
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
        // Relaxed: a hint for `enter_cpu_busy`, as above.
        Err((g.slot(first).load(Relaxed), cpu))
    }

    /// Per-CPU mode, owning nothing, when core `cpu`'s first slot was not borrowed (word `s`): if that CID is busy
    /// (the common case), one of the core's extra CIDs, else a temporary; else the slow path.
    #[inline(never)]
    fn enter_cpu_busy(&mut self, s: u32, cpu: usize) -> Entered {
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
            if g.hot.cids_per_core > 1 {
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

    /// A borrow succeeded while we still held `spare` (the CID our registration gave up): the core already owns
    /// the CID we borrowed, so ours is surplus and goes back to the bitmap (I5: no set bit without an owner).
    fn free_spare(&self, spare: &mut Option<u32>) {
        if let Some(x) = spare.take() {
            self.group.inner.bitmap.clear(x);
            self.rec.counters.bump(Ev::BitmapClear);
        }
    }

    /// The CID to donate into an EMPTY slot: `spare` if we hold one, else a fresh one from the bitmap.
    fn spare_or_fresh(&self, spare: &mut Option<u32>) -> u32 {
        spare.take().unwrap_or_else(|| {
            self.rec.counters.bump(Ev::Alloc);
            self.rec.counters.bump(Ev::BitmapSet);
            self.group.inner.bitmap.get()
        })
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
                    self.free_spare(spare);
                    return Some(Held::Core { at: at as u32, cid });
                }
            } else if s == EMPTY && empty.is_none() {
                empty = Some(at);
            }
        }
        let at = empty?;
        let n = self.spare_or_fresh(spare);
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
    fn enter_task_fenced(&mut self, m: u32) -> Entered {
        debug_assert_ne!(m, PER_CPU, "handled by enter_raw");
        if !self.outstanding.is_nothing() {
            return self.enter_after_forgotten();
        }
        let g = &*self.group.inner;
        // Without membarrier the full fence of E2 runs only now: E3 again, and the per-task fast path after all.
        if g.mode_after_light_barrier(m, Mutant::NoEnterBarrier) == PER_TASK {
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
        if !fenced && !g.knob.is(Mutant::NoEnterBarrier) {
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
            Err(w) => {
                // Unreachable by design.md §2.2: only the owner stores a CID into its word, and we own none. Should it
                // happen in a release build, `n` stays exclusive as a temporary.
                debug_assert!(false, "install: our UNSET word became {w:#x}");
                Held::Temp(n)
            }
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
                    self.free_spare(&mut spare);
                    return Held::Core { at: at as u32, cid: self.converge_core(at, owned, max) };
                }
            } else if s == EMPTY {
                let n = self.spare_or_fresh(&mut spare);
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
                if g.take_idle(i, s, Taker::Stealer, c) {
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

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::guard::Cid;
    use crate::{Group, Registration};
    use std::cell::RefCell;

    thread_local! {
        /// The bitmap's count at each `between_convergence_steps` of this test's thread.
        pub(super) static MID_CONVERGENCE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }

    /// `reg`'s next enter must converge from its one out-of-range CID to CID 0, with no bit set in the bitmap
    /// where a preempted converger would sit (taking first, the former order that
    /// `loom-tests/tests/litmus_m8_convergence_order.rs` keeps, shows two there).
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
        assert_eq!((r0.cid(), r1.cid(), group.max_cids()), (Some(Cid::from_raw(0)), Some(Cid::from_raw(1)), 2));
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
}
