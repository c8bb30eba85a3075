//! Model 11: borrows as restartable sequences (design.md §4.1.1) against the writers of idle slots on other cores:
//! the CPU → task sweep (F2 is the RSEQ membarrier), the claim of an exit that lost a switch
//! (`exit_slow_core`: CLAIM, RSEQ membarrier, CAS) and the claim of a convergence steal. The adoption take-back of
//! `exit_slow_task` is the same claim and has no model of its own. 11d and 11e check `ShardedCounter`'s
//! whole-update sequence (design.md §9.2) against a guard holder and against the sweep; 11f two exits claiming
//! at once, where the claim lock is only ever tried and an exit that finds it held defers to its holder; 11g
//! three exits (the holder's drain loop); 11h a drain between a switch's F1 and F2 against a borrow sequence
//! (the drain's own RSEQ membarrier).
//!
//! The group models the sequence with one lock per core held across it, and the RSEQ membarrier as a SeqCst fence
//! followed by taking and releasing every core's lock: once the barrier returns, each sequence either committed
//! before it or starts after it, which is what the kernel's abort guarantees. Writers on other cores interleave
//! with the sequence freely, as on the hardware. (The model's commit is a `swap`: see `rseq::OnCpu::store_if`,
//! `litmus_m11_loom_gap.rs` and docs/loom.md for the loom coherence gap a plain store runs into.)
#![cfg(loom)]

use loom::thread;
use mmcid::{CidKind, Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, visit, Cids, Reg};

/// Two of four virtual cores allowed, as in model 4: the third registration switches to per-CPU mode, and the
/// drop back to one user switches to per-task mode (thrs 2).
fn small(mutant: Mutant) -> Group {
    Group::builder().virtual_cpus(4).cpus_virtual([0, 1]).restartable_sequences(true).mutant(mutant).build().unwrap()
}

/// Six virtual cores of which four are allowed: six users switch to per-CPU mode (max_cids 5), thrs 3, so a drop
/// from three users to two switches back with two registrations still there.
fn six(mutant: Mutant) -> Group {
    Group::builder().virtual_cpus(6).cpus_virtual(0..4).restartable_sequences(true).mutant(mutant).build().unwrap()
}

/// Model 4's first scenario (`mmcid_loom_tests::borrower_vs_sweep`) with sequence borrows: T1's borrow is a
/// sequence racing the CPU → task switch's F2 and sweep.
fn sequence_vs_sweep(name: &'static str, mutant: Mutant) {
    model(name, move || mmcid_loom_tests::borrower_vs_sweep(small(mutant), visit));
}

#[test]
fn sequence_vs_cpu_to_task_sweep() {
    sequence_vs_sweep("sequence_vs_cpu_to_task_sweep", Mutant::None);
}

/// F2 a full fence that does not abort sequences in flight: T1's sequence reads the old mode and the idle slot,
/// the sweep takes the CID and frees it, T1 commits over the EMPTY slot, and the new registration is born with
/// the CID T1 is using.
#[test]
#[should_panic(expected = "Causality violation")]
fn sequence_vs_cpu_to_task_sweep_mutant_plain_barrier() {
    sequence_vs_sweep("sequence_vs_cpu_to_task_sweep_mutant_plain_barrier", Mutant::PlainFixupBarrier);
}

/// T1 holds core 0's CID when the main thread's drop switches the group to per-task mode, so T1's exit claims the
/// idle slot back (`exit_slow_core`); meanwhile T2, on core 0 too, enters: its sequence may have read the old
/// mode and T1's idle word before the claim. Six virtual cores of which four are allowed: six users switch to
/// per-CPU mode (max_cids 5), thrs 3, so the drop from three users to two switches back with T1 and T2 still
/// registered (`six`).
fn claim_vs_sequence(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = six(mutant);
        let cids = Cids::new(6 + 6);
        let mut r1 = Reg::new(&group, 0);
        let r2 = Reg::new(&group, 0);
        let mut extra: Vec<_> = (0..4).map(|_| Reg::new(&group, 1)).collect();
        assert_eq!(group.mode(), Mode::PerCpu);
        cids.visit(&mut r1); // core 0 owns a CID, idle
        extra.truncate(1); // three users: still per-CPU (3 is not < thrs 3)
        assert_eq!(group.mode(), Mode::PerCpu);
        let last = extra.pop().unwrap();

        let spawn = |mut r: Reg| {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r);
                r
            })
        };
        let t1 = spawn(r1);
        let t2 = spawn(r2);

        drop(last); // two users < thrs 3: CPU → task switch
        let mut r5 = Reg::new(&group, 0); // per-task: born with the lowest free CID
        cids.visit(&mut r5);

        let r1 = t1.join().unwrap();
        let r2 = t2.join().unwrap();
        assert_eq!(group.mode(), Mode::PerTask);
        finish(&group, &cids, vec![r1, r2, r5]);
    });
}

#[test]
fn claim_vs_sequence_on_one_core() {
    claim_vs_sequence("claim_vs_sequence_on_one_core", Mutant::None);
}

/// The claim without its RSEQ membarrier: T2's sequence, which read the idle word before the claim, commits after
/// T1 took the slot EMPTY and freed the CID, so T2 borrows a CID the slot no longer owns, and frees it again at its
/// own exit.
#[test]
#[should_panic(expected = "released twice")]
fn claim_vs_sequence_on_one_core_mutant_no_claim_barrier() {
    claim_vs_sequence("claim_vs_sequence_on_one_core_mutant_no_claim_barrier", Mutant::NoClaimBarrier);
}

/// A convergence steal (design.md §4.5: a claim from enter, with `try_lock`) against a sequence of the robbed
/// core. One allowed core of two virtual ones, so `max_cids` is 1 and two users are per-CPU mode: core 1 owns
/// CID 0, idle; T1 enters on core 0, allocates CID 1 for it, must converge below 1 and steals core 1's CID 0,
/// while the main thread enters on core 1 with a sequence on that same idle word.
fn steal_vs_sequence(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder()
            .virtual_cpus(2)
            .cpus_virtual([0])
            .restartable_sequences(true)
            .mutant(mutant)
            .build()
            .unwrap();
        let cids = Cids::new(2 + 2);
        let mut r1 = Reg::new(&group, 0); // per-task: born with CID 0
        let mut r2 = Reg::new(&group, 1); // users 2 > max_cids 1: per-CPU, the walk frees CID 0
        assert_eq!(group.mode(), Mode::PerCpu);
        assert_eq!(cids.visit(&mut r2), (0, CidKind::Core(1))); // core 1 owns CID 0, idle

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r1);
                r1
            })
        };
        cids.visit(&mut r2);

        let r1 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r2]);
    });
}

#[test]
fn steal_vs_sequence_of_the_robbed_core() {
    steal_vs_sequence("steal_vs_sequence_of_the_robbed_core", Mutant::None);
}

/// The steal's claim without its RSEQ membarrier: the main thread's sequence read the idle word before the claim
/// and commits after T1 took it, so both use CID 0.
#[test]
#[should_panic(expected = "Causality violation")]
fn steal_vs_sequence_of_the_robbed_core_mutant_no_claim_barrier() {
    steal_vs_sequence("steal_vs_sequence_of_the_robbed_core_mutant_no_claim_barrier", Mutant::NoClaimBarrier);
}

/// 11f: two exits that lost a switch claim their slots at once, and the claim lock is try-only (nobody waits for
/// a claimer): the main thread holds core 0's CID, T1 borrows core 1's and, inside its guard, drops the
/// registration that switches the group to per-task mode (the sweep skips both BUSY slots); both exits then
/// claim. An exit that finds the lock held flags its slot and leaves; the holder must drain the flag after its
/// unlock, or core 0 keeps a CID in per-task mode.
fn exits_claim_at_once(name: &'static str, mutant: Mutant) {
    model(name, move || exits_claim_at_once_body(mutant));
}

fn exits_claim_at_once_body(mutant: Mutant) {
    let group = six(mutant);
    let cids = Cids::new(6 + 6);
    let mut r1 = Reg::new(&group, 0);
    let mut r2 = Reg::new(&group, 1);
    let mut extra: Vec<_> = (0..4).map(|_| Reg::new(&group, 2)).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    extra.truncate(1); // three users: still per-CPU (3 is not < thrs 3)
    let last = extra.pop().unwrap();

    let g1 = r1.enter();
    assert_eq!(g1.kind(), CidKind::Core(0));
    cids.touch(g1.cid().get());
    let t1 = {
        let cids = cids.clone();
        thread::spawn(move || {
            let g2 = r2.enter();
            cids.touch(g2.cid().get());
            drop(last); // two users < thrs 3: CPU → task switch while both guards are live
            drop(g2);
            r2
        })
    };
    drop(g1);

    let r2 = t1.join().unwrap();
    assert_eq!(group.mode(), Mode::PerTask);
    finish(&group, &cids, vec![r1, r2]);
}

#[test]
fn exits_claim_at_once_nobody_waits() {
    exits_claim_at_once("exits_claim_at_once_nobody_waits", Mutant::None);
}

/// The holder unlocks without draining: the exit that found the lock held left core 0's CID on its slot, and
/// nobody takes it.
#[test]
#[should_panic(expected = "a core owns a CID in per-task mode")]
fn exits_claim_at_once_mutant_no_deferred_drain() {
    exits_claim_at_once("exits_claim_at_once_mutant_no_deferred_drain", Mutant::NoDeferredDrain);
}

/// The exit that finds the lock held does not try it again after flagging: if the holder unlocked and checked the
/// flag in between, nobody drains. Needs three preemptions (found in review), hence the bound.
#[test]
#[should_panic(expected = "a core owns a CID in per-task mode")]
fn exits_claim_at_once_mutant_no_defer_retry() {
    mmcid_loom_tests::model_at_least("exits_claim_at_once_mutant_no_defer_retry", 3, || {
        exits_claim_at_once_body(Mutant::NoDeferRetry)
    });
}

/// 11g: three exits that lost a switch claim at once (`Group::loom_hold_core` / `loom_exit_core`: the claim of
/// `exit_slow_core`, nothing else), on three cores of a per-task group: one may defer while the holder drains
/// another's deferral, and the holder must drain until no deferral is left.
fn three_exits(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(3).restartable_sequences(true).mutant(mutant).build().unwrap();
        let r0 = Reg::new(&group, 0);
        for cpu in 0..3 {
            group.loom_hold_core(cpu);
        }
        let exits: Vec<_> = (1..3)
            .map(|cpu| {
                let group = group.clone();
                thread::spawn(move || group.loom_exit_core(cpu))
            })
            .collect();
        group.loom_exit_core(0);
        for t in exits {
            t.join().unwrap();
        }
        assert_eq!(group.mode(), Mode::PerTask);
        finish(&group, &Cids::new(1 + 3), vec![r0]);
    });
}

#[test]
fn three_exits_claim_at_once() {
    three_exits("three_exits_claim_at_once", Mutant::None);
}

/// The holder drains once: a third exit that flagged its slot during that drain is left behind.
#[test]
#[should_panic(expected = "a core owns a CID in per-task mode")]
fn three_exits_claim_at_once_mutant_no_drain_loop() {
    three_exits("three_exits_claim_at_once_mutant_no_drain_loop", Mutant::NoDrainLoop);
}

/// 11h: model 4a's scenario (a borrow sequence on core 0 against the CPU → task switch) with a third thread that
/// drains deferred claims (`Group::loom_deferred_drain`), as a claim-lock holder does after an exit deferred to
/// it: the drain, between F1 and the switch's F2, claims core 0's idle word that the sequence read, and must wait
/// for the sequence with its own RSEQ membarrier before taking it.
fn drain_vs_sequence(name: &'static str, mutant: Mutant) {
    model(name, move || {
        mmcid_loom_tests::borrower_vs_sweep_and(small(mutant), visit, Some(Group::loom_deferred_drain))
    });
}

#[test]
fn drain_vs_sequence_during_a_switch() {
    drain_vs_sequence("drain_vs_sequence_during_a_switch", Mutant::None);
}

/// The drain takes what it claimed without its RSEQ membarrier: the sequence commits BUSY over the EMPTY slot and
/// uses a CID the drain freed, and its exit frees it a second time.
#[test]
#[should_panic(expected = "released twice")]
fn drain_vs_sequence_during_a_switch_mutant_no_drain_barrier() {
    drain_vs_sequence("drain_vs_sequence_during_a_switch_mutant_no_drain_barrier", Mutant::NoDrainBarrier);
}

/// T1's part in 11e: `ShardedCounter`'s whole-update sequence (design.md §9.2) on core 0's idle CID, touching the
/// CID's cell where the sequence commits; if the sequence does not apply or fails, the guard path (a visit).
fn sequence_update(cids: &Cids, reg: &mut Reg) {
    if !reg.update_in_sequence(|cid| cids.touch(cid)) {
        cids.visit(reg);
    }
}

/// 11e: model 4a's scenario with T1 updating through the whole-update sequence, which never makes the slot
/// BUSY: the sweep may take the CID right after it, and the RSEQ membarrier (F2) must order T1's update before
/// the CID's next holder.
fn update_vs_sweep(name: &'static str, mutant: Mutant) {
    model(name, move || mmcid_loom_tests::borrower_vs_sweep(small(mutant), sequence_update));
}

#[test]
fn update_sequence_vs_cpu_to_task_sweep() {
    update_vs_sweep("update_sequence_vs_cpu_to_task_sweep", Mutant::None);
}

/// F2 without the sequence abort: T1's update reads the old mode and the idle slot, the sweep frees the CID and
/// the new registration uses it while T1 still writes its cell.
#[test]
#[should_panic(expected = "Causality violation")]
fn update_sequence_vs_cpu_to_task_sweep_mutant_plain_barrier() {
    update_vs_sweep("update_sequence_vs_cpu_to_task_sweep_mutant_plain_barrier", Mutant::PlainFixupBarrier);
}

/// 11d: a guard holder against the whole-update sequence on one core. T1 holds core 0's CID in a guard (BUSY)
/// while the main thread, on core 0 too, updates through the sequence, which must step aside (then it takes the
/// guard path: a temporary).
fn holder_vs_update(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = small(mutant);
        let cids = Cids::new(3 + 4);
        let mut r1 = Reg::new(&group, 0);
        let mut r2 = Reg::new(&group, 0);
        let r3 = Reg::new(&group, 0);
        assert_eq!(group.mode(), Mode::PerCpu);
        cids.visit(&mut r1); // core 0 owns a CID, idle

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r1);
                r1
            })
        };
        sequence_update(&cids, &mut r2);

        let r1 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r2, r3]);
    });
}

#[test]
fn guard_holder_vs_update_sequence() {
    holder_vs_update("guard_holder_vs_update_sequence", Mutant::None);
}

/// The sequence also runs on a BUSY slot's CID: it updates the cell T1's guard is using.
#[test]
#[should_panic(expected = "Causality violation")]
fn guard_holder_vs_update_sequence_mutant_ignores_busy() {
    holder_vs_update("guard_holder_vs_update_sequence_mutant_ignores_busy", Mutant::SequenceIgnoresBusy);
}
