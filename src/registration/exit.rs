//! The exit state machine (design.md §4.2, §4.4, §4.6): what a guard's drop runs for the CID it holds. Per-task:
//! X1 (`running = 0`, Release), X2 (the light barrier), X3 (the mode load), no read-modify-write, inlined. Per-CPU:
//! X1 on the slot it borrowed (the Release store of the idle word), X2, X3, inlined. A temporary goes back to the
//! bitmap. When X3 finds that a switch ran meanwhile, the slow paths hand the CID to its new owner or drop it
//! (adoption, §4.4); a forgotten guard's CID is given back the same way at its registration's next enter or drop
//! (§4.6).
//!
//! What an exit reaches outside this module: the light barrier (`inner/barriers.rs`: its full fence in a group without
//! membarrier, and the whole barrier before the adoption re-check), the slot protocol's take (`inner/slots.rs`) and the
//! bitmap.

use crate::guard::{Entered, Held};
use crate::inner::Taker;
use crate::mutants::Mutant;
use crate::registration::Registration;
use crate::state::*;
use crate::stats::Ev;
use crate::sync::{compiler_fence, Ordering::*};

impl Registration {
    /// Exit (design.md §4.2). The per-task and per-CPU paths are inlined; temporaries are out of line.
    #[cfg_attr(loom, allow(dead_code))] // the in-place enters of the thread-local layer, not compiled under loom
    #[inline(always)]
    pub(crate) fn exit_raw(&mut self, entered: Entered) {
        match entered.held() {
            Held::Task(w) => self.exit_task(w),
            Held::Core { at, cid } => self.exit_core(at as usize, cid),
            Held::Temp(_) => self.exit_outstanding(entered),
        }
    }

    /// Per-task exit: D-exit's X1..X3, no read-modify-write.
    #[inline(always)]
    pub(crate) fn exit_task(&mut self, w: u32) {
        let g = &*self.group.inner;
        // Release: X1 of D-exit; publishes the guard's writes before a fixup frees the CID (I8).
        self.rec.running.store(0, Release);
        if !g.knob.is(Mutant::NoExitBarrier) {
            compiler_fence(SeqCst); // X2, light side: pairs with F2 (completed in exit_task_recheck if needed)
        }
        let m = g.hot.mode.load(Acquire); // X3
        if m != g.hot.fast_task {
            self.exit_task_recheck(w, m);
        }
    }

    /// Per-task exit that may need more: the full fence of a group without membarrier, or a switch ran.
    #[inline(never)]
    fn exit_task_recheck(&mut self, w: u32, m: u32) {
        let m = self.group.inner.mode_after_light_barrier(m, Mutant::NoExitBarrier); // X3 after the whole barrier
        if m != PER_TASK {
            self.exit_slow_task(w, m);
        }
    }

    /// Per-CPU exit: D-core's X1..X3 on the slot we borrowed, whichever core we run on now; no read-modify-write.
    #[inline(always)]
    pub(crate) fn exit_core(&mut self, at: usize, cid: u32) {
        let g = &*self.group.inner;
        self.outstanding = Entered::NOTHING;
        // Relaxed: our word is UNSET, so a walk skips it whatever it reads here (not a D-exit X1).
        self.rec.running.store(0, Relaxed);
        // Release: X1 of D-core; hands the slot's CID, with our writes, to the next borrower (I8).
        let at = if g.knob.is(Mutant::ExitToFirstSlot) { slot_at(core_of(at), 0) } else { at };
        g.slot(at).store(slot::owned(cid), Release);
        (self.hint_at, self.hint_word) = (at as u32, slot::owned(cid));
        if !g.knob.is(Mutant::NoExitBarrier) {
            compiler_fence(SeqCst); // X2, light side: pairs with F2 (completed in exit_core_recheck if needed)
        }
        let m = g.hot.mode.load(Acquire); // X3
        if m != g.hot.fast_cpu {
            self.exit_core_recheck(at, cid, m);
        }
    }

    /// Per-CPU exit that may need more: the full fence of a group without membarrier, or a switch ran.
    #[inline(never)]
    fn exit_core_recheck(&mut self, at: usize, cid: u32, m: u32) {
        let m = self.group.inner.mode_after_light_barrier(m, Mutant::NoExitBarrier); // X3 after the whole barrier
        if m & ONCPU == 0 {
            self.exit_slow_core(at, cid, m);
        }
    }

    /// Exit of a per-CPU (D-core's X1..X3) or temporary CID.
    #[inline(never)]
    pub(crate) fn exit_outstanding(&mut self, entered: Entered) {
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
                if !g.take_idle(at, slot::owned(w), Taker::Exit, c) {
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
        if !g.take_idle(at, slot::owned(cid), Taker::Exit, c) {
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
        if g.knob.is(Mutant::NoAdoptRecheck) {
            return true;
        }
        g.light_barrier();
        g.hot.mode.load(Acquire) & ONCPU == want
    }

    /// The last per-CPU or temporary guard of this registration never exited: it was passed to `mem::forget`.
    /// Give back what it holds, as its drop would have (design.md §4.6).
    #[cold]
    pub(crate) fn give_back_forgotten(&mut self) {
        self.rec.counters.bump(Ev::Forgotten);
        self.exit_outstanding(self.outstanding);
    }
}
