//! The barriers of the Dekker pairs (design.md §5.1, §4.1.1, §12.1): the light side that enter and exit run (E2,
//! X2, and the adoption re-check: a compiler fence where the heavy side is `membarrier`, else a full fence), the heavy
//! side that switches run after their flip (F2: `membarrier`, its RSEQ variant in rseq groups, or a full fence), the
//! RSEQ membarrier between a claim and its take, and what a caller does when the system call fails (§12.1: it takes
//! nothing the barrier alone made safe to take).
//!
//! Under loom there is no membarrier (`sync::compiler_fence` is a no-op there), so the models run the full-fence
//! program and `rseq_barrier` is a full fence plus every core's sequence lock taken and released (docs/loom.md).

use super::{Inner, Life};
use crate::mutants::Mutant;
use crate::stats::{Counters, Ev};
use crate::sync::{compiler_fence, fence, Ordering};
#[cfg(not(loom))]
use crate::sys;

impl Inner {
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
        let full = !self.hot.membarrier;
        if full {
            // E2 / X2 without membarrier: pairs with F2's SeqCst fence (Dekker pairs D-enter, D-exit, D-core, §5.1).
            fence(Ordering::SeqCst);
        }
        full
    }

    /// After a fast path's compiler fence and its load `m` of the mode word (E3 or X3): completes the light barrier
    /// (unless loom mutant `skip` removes it) and returns the mode word as read after the whole barrier.
    #[inline(always)]
    pub(crate) fn mode_after_light_barrier(&self, m: u32, skip: Mutant) -> u32 {
        if !self.knob.is(skip) && self.light_barrier_rest() {
            self.hot.mode.load(Ordering::Acquire)
        } else {
            m
        }
    }

    /// Heavy side (F2): membarrier on every CPU running a thread of this process, or a full fence. In rseq groups
    /// the RSEQ membarrier, which also aborts every restartable sequence in flight (design.md §4.1.1). False if
    /// the membarrier failed (design.md §12): then it ordered nothing, and the caller must not rely on it.
    fn heavy_barrier(&self) -> bool {
        if self.hot.rseq && !self.knob.is(Mutant::PlainFixupBarrier) {
            self.rseq_barrier()
        } else if self.hot.membarrier {
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
            self.on_cpu.wait_for_sequences();
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
    pub(crate) fn fixup_barrier(&self, life: &Life) -> bool {
        if self.knob.is(Mutant::NoFixupBarrier) || self.heavy_barrier() {
            return true;
        }
        life.counters.bump(Ev::BarrierFailed);
        self.knob.is(Mutant::IgnoreFailedBarrier)
    }

    /// The RSEQ membarrier between a claim (or a drain's claims) and its take; false, counted in `c`, when it
    /// failed: the claimer then gives its claims back (`unclaim`, design.md §12).
    pub(crate) fn claim_barrier(&self, c: &Counters) -> bool {
        if self.rseq_barrier() {
            return true;
        }
        c.bump(Ev::BarrierFailed);
        self.knob.is(Mutant::IgnoreFailedClaimBarrier)
    }
}
