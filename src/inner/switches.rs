//! The mode switches (design.md §3, §3.1, §4.5.1, §5): the limits every membership change recomputes
//! (`update_limits`: the kernel's `mm_update_max_cids`, `max_cids` and the switch-back threshold), the two-phase
//! switch itself (F1 the flip, F2 the heavy barrier, F3 the fixup walk or sweep, F4 the completion), the last
//! user's sweep, and the two switches an enter may start without waiting (`check_occupancy`: guards held across
//! deschedules, §3.1; `check_steal_storm`: a CID following a thread from core to core, §4.5.1).
//!
//! Every switch runs under the lifecycle lock, held by `Group::register`, a registration's drop
//! (`Inner::unregister`) or `Group::set_cpus_allowed` (`group.rs`), or tried by an enter (the two checks). The
//! mode word's table is `state::mode`; the barrier F2 is in `barriers.rs`.

use super::{Inner, Life};
use crate::mutants::Mutant;
use crate::state::*;
use crate::stats::Ev;
use crate::sync::Ordering;

/// What `update_limits` found due.
pub(crate) enum Flip {
    None,
    ToPerCpu,
    ToPerTask,
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

impl Inner {
    #[inline(always)]
    pub(crate) fn max_cids(&self) -> usize {
        // Relaxed: a stale bound only changes whether converge runs (as the kernel's `READ_ONCE(max_cids)`).
        self.hot.max_cids.load(Ordering::Relaxed) as usize
    }

    /// The I2 hard bound as this thread sees it now, `users + cores`: temporaries from a core's bitmap lane are
    /// taken only below it (`Bitmap::get_near`). Relaxed: `users` changes only under the lifecycle lock, and a
    /// stale value is as good as the one lowest-first allocation would have seen an instant earlier.
    #[inline]
    pub(crate) fn temp_bound(&self) -> usize {
        self.users.load(Ordering::Relaxed) + self.cores
    }

    /// Ordering of the store that ends a switch (F4). Release: whoever sees the final mode sees every effect of
    /// the walk (the kernel's `smp_mb()` before clearing TRANSIT, 47ee94efccf6).
    fn completion_order(&self) -> Ordering {
        if self.knob.is(Mutant::RelaxedCompletion) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        }
    }

    /// The kernel's `opt`: the CIDs the group needs at most, `min(allowed cores, users)`.
    fn opt(life: &Life, users: usize) -> usize {
        life.allowed.len().min(users)
    }

    /// Switch-back threshold, clamped to ≥ 1 (kernel fix e2e2aaec3d3d).
    pub(crate) fn switch_back_threshold(&self, opt: usize) -> usize {
        (opt - opt / 4).min(self.cores / 2).max(1)
    }

    /// Recomputes `max_cids` and decides whether the mode must flip (kernel `mm_update_max_cids`).
    pub(crate) fn update_limits(&self, life: &mut Life) -> Flip {
        let users = self.users_locked(life);
        let opt = Self::opt(life, users);
        // The mark's rule (design.md §3.1.1): it clears below the switch-back threshold of the allowed cores, the one
        // per-CPU mode had when the mark was set (not the threshold of `opt`: `opt ≤ users` puts that below `users`
        // but at 0).
        if life.occupied && users < self.switch_back_threshold(life.allowed.len()) {
            life.occupied = false; // few enough users for the kernel's rules again
        }
        let kernel_max = (opt + opt / 4).min(self.cores);
        let max = if life.occupied { kernel_max.max(users) } else { kernel_max };
        // Relaxed: lock held; a reader's stale value only changes whether it converges (as the kernel's READ_ONCE).
        self.hot.max_cids.store(max as u32, Ordering::Relaxed);
        // Relaxed: the caller holds the lifecycle lock, and only its holder stores the mode.
        if self.hot.mode.load(Ordering::Relaxed) & ONCPU == 0 {
            if users > max && !life.occupied {
                life.switch_back_below = self.switch_back_threshold(opt);
                return Flip::ToPerCpu;
            }
        } else if users < life.switch_back_below {
            life.switch_back_below = 0;
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
            || !occupied_at(self.holders(), self.users_locked(&life), self.max_cids())
        {
            return;
        }
        life.occupied = true;
        life.switch_back_below = 0;
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
        if self.hot.mode.load(Ordering::Relaxed) != PER_CPU || self.users_locked(&life) > self.max_cids() {
            return;
        }
        life.switch_back_below = 0;
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

    pub(crate) fn apply(&self, life: &mut Life, flip: Flip) {
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

        // F2: pairs with E2 and X2. If it failed, the walk takes nothing: every registration keeps its CID until its
        // next enter gives it up (design.md §12).
        if !self.fixup_barrier(life) {
            self.hot.mode.store(PER_CPU, self.completion_order()); // F4
            return;
        }
        life.counters.bump(Ev::FixupWalk);
        for rec in life.regs.iter().flatten() {
            life.counters.bump(Ev::FixupVisit);
            // F3. Acquire: pairs with X1 (running = 0, Release): the guard's writes happen before we free its CID.
            if rec.running.load(Ordering::Acquire) != 0 && !self.knob.is(Mutant::FixupIgnoresRunning) {
                continue; // running: it resolves its CID at exit (D-exit)
            }
            // Relaxed: a hint the CAS validates; the guard's writes were acquired through `running` above.
            let w = rec.cid.load(Ordering::Relaxed);
            if w == UNSET && !self.knob.is(Mutant::FixupTakesUnset) {
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
    pub(crate) fn switch_to_per_task(&self, life: &mut Life) {
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
        if self.users_locked(life) == 0 || self.fixup_barrier(life) || !self.hot.rseq {
            self.sweep_slots(life);
        }
        self.hot.mode.store(PER_TASK, self.completion_order()); // F4
    }

    /// Takes the CID of every core slot that owns one nobody is using (busy ones resolve at their exit, D-core).
    pub(crate) fn sweep_slots(&self, life: &mut Life) {
        life.counters.bump(Ev::FixupWalk);
        for (_, slot) in self.all_slots() {
            life.counters.bump(Ev::FixupVisit);
            // F3. Relaxed: a hint the CAS below validates (and acquires through).
            let s = slot.load(Ordering::Relaxed);
            let take = if self.knob.is(Mutant::FixupIgnoresBusy) {
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
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::{CpuSet, Error, Group, Mode};

    fn sim(cores: usize, allowed: usize) -> Group {
        Group::builder().virtual_cpus(cores).cpus_virtual(0..allowed).build().unwrap()
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
        assert_eq!(g.inner.life.lock().switch_back_below, 2);
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
        assert_eq!(g.inner.life.lock().switch_back_below, 6);
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
        assert_eq!(g.inner.life.lock().switch_back_below, 1);
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
