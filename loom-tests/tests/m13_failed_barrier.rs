//! Model 13: a group whose `membarrier` fails for good (design.md §12), as after a seccomp filter forbade it.
//!
//! `failing_barriers(true)` builds the group as production builds it where membarrier was available at build
//! time: light barriers are compiler fences (no-ops here, exactly as weak as on the hardware), and the fast paths
//! finish after them. Every heavy barrier then fails and orders nothing, so nothing but the fallback keeps the
//! protocol safe: a switch whose F2 failed walks no registration (13a) and, in an rseq group, sweeps no slot (13b);
//! a CAS group's sweep still runs, since its slot CASes need no barrier (13e); a claim (13c) or a drain (13d) whose
//! RSEQ membarrier failed gives its claims back. The end checks are `finish_degraded`: registrations and cores may
//! keep CIDs the mode says they should not own (that is the price of the failure), but nothing is owned twice,
//! every bit has an owner, and the last drop frees everything. Each twin takes anyway, as if the barrier had worked.
#![cfg(loom)]

use loom::thread;
use mmcid::{Group, Mode, Mutant};
use mmcid_loom_tests::{finish_degraded, model, visit, Cids, Reg};

/// 13a: model 3's scenario (T1 enters twice on the per-task fast path while the main thread's `register` switches
/// the group to per-CPU mode and then enters on the same core), every barrier failing.
fn task_to_cpu(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(1).failing_barriers(true).mutant(mutant).build().unwrap();
        assert!(group.uses_membarrier());
        let cids = Cids::new(2 + 1);
        let mut r1 = Reg::new(&group, 0);
        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r1);
                cids.visit(&mut r1);
                r1
            })
        };
        let mut r2 = Reg::new(&group, 0); // users 2 > max_cids 1: the switch, whose F2 fails
        assert_eq!(group.mode(), Mode::PerCpu);
        cids.visit(&mut r2);
        let r1 = t1.join().unwrap();
        finish_degraded(&group, &cids, vec![r1, r2]);
    });
}

#[test]
fn failed_barrier_task_to_cpu() {
    task_to_cpu("failed_barrier_task_to_cpu", Mutant::None);
}

/// The walk runs although F2 failed: with no fence on either side, it can read T1's `running` as 0 while T1's
/// fast path reads the old mode, take CID 0 from T1's word and let the core allocate it while T1 uses it.
#[test]
#[should_panic(expected = "Causality violation")]
fn failed_barrier_task_to_cpu_mutant_walks_anyway() {
    task_to_cpu("failed_barrier_task_to_cpu_mutant_walks_anyway", Mutant::IgnoreFailedBarrier);
}

/// Two of four virtual cores allowed (thrs 2), rseq borrows, every barrier failing: `borrower_vs_sweep`'s group.
fn small(rseq: bool, mutant: Mutant) -> Group {
    Group::builder()
        .virtual_cpus(4)
        .cpus_virtual([0, 1])
        .restartable_sequences(rseq)
        .failing_barriers(true)
        .mutant(mutant)
        .build()
        .unwrap()
}

/// 13b: model 11a's scenario (T1's borrow sequence on core 0 against the CPU → task switch made by the main
/// thread's drop), every barrier failing: the sweep takes nothing, T1's exit (if it sees the new mode) claims in
/// vain, and core 0 keeps its CID until the last drop.
fn sequence_vs_sweep(name: &'static str, mutant: Mutant) {
    model(name, move || mmcid_loom_tests::borrower_vs_sweep_ending(small(true, mutant), visit, None, finish_degraded));
}

#[test]
fn failed_barrier_sequence_vs_sweep() {
    sequence_vs_sweep("failed_barrier_sequence_vs_sweep", Mutant::None);
}

/// The sweep runs although F2 failed: T1's sequence, which read the old mode and core 0's idle word, commits
/// over the EMPTY slot after the sweep freed the CID, and the registration born next gets the same CID.
#[test]
#[should_panic(expected = "Causality violation")]
fn failed_barrier_sequence_vs_sweep_mutant_sweeps_anyway() {
    sequence_vs_sweep("failed_barrier_sequence_vs_sweep_mutant_sweeps_anyway", Mutant::IgnoreFailedBarrier);
}

/// 13e: the same scenario in a CAS group, whose sweep runs without a barrier: a borrow CAS and the sweep's CAS on
/// the idle word cannot both win, and an exit that misses the new mode only leaves its core the CID.
fn cas_borrower_vs_sweep(name: &'static str, mutant: Mutant) {
    model(name, move || mmcid_loom_tests::borrower_vs_sweep_ending(small(false, mutant), visit, None, finish_degraded));
}

#[test]
fn failed_barrier_cas_borrower_vs_sweep() {
    cas_borrower_vs_sweep("failed_barrier_cas_borrower_vs_sweep", Mutant::None);
}

/// The twin shows the model reaches the sweep while T1 borrows: a sweep that also takes BUSY slots (model 4a's
/// `FixupIgnoresBusy`) frees the CID T1 is using.
#[test]
#[should_panic(expected = "Causality violation")]
fn failed_barrier_cas_borrower_vs_sweep_mutant_busy_check() {
    cas_borrower_vs_sweep("failed_barrier_cas_borrower_vs_sweep_mutant_busy_check", Mutant::FixupIgnoresBusy);
}

/// 13c: a convergence steal's claim against a sequence of the robbed core (model 11c), every barrier failing.
/// Two virtual cores, core 0 allowed (max_cids 1). The switch to per-CPU mode walks nothing, so r1 and r2 keep
/// CIDs 0 and 1; r1's enter on core 0 gives 0 to core 0. Then T1 enters r2 on core 1: core 1 gets CID 1, out of
/// range, nothing is free below 1, so T1 tries to steal core 0's idle CID 0 while the main thread borrows it
/// with a sequence on core 0. The claim's barrier fails: the claim goes back and T1 keeps CID 1.
fn steal_vs_sequence(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder()
            .virtual_cpus(2)
            .cpus_virtual([0])
            .restartable_sequences(true)
            .failing_barriers(true)
            .mutant(mutant)
            .build()
            .unwrap();
        let cids = Cids::new(2 + 2);
        let mut r1 = Reg::new(&group, 0);
        let mut r2 = Reg::new(&group, 1);
        assert_eq!(group.mode(), Mode::PerCpu);
        assert_eq!(cids.visit(&mut r1).0, 0);
        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r2);
                r2
            })
        };
        cids.visit(&mut r1);
        let r2 = t1.join().unwrap();
        finish_degraded(&group, &cids, vec![r1, r2]);
    });
}

#[test]
fn failed_barrier_steal_vs_sequence() {
    steal_vs_sequence("failed_barrier_steal_vs_sequence", Mutant::None);
}

/// The steal takes although its RSEQ membarrier failed: the main thread's sequence read the idle word before the
/// claim and commits after T1 took it, so both use CID 0.
#[test]
#[should_panic(expected = "Causality violation")]
fn failed_barrier_steal_vs_sequence_mutant_takes_anyway() {
    steal_vs_sequence("failed_barrier_steal_vs_sequence_mutant_takes_anyway", Mutant::IgnoreFailedClaimBarrier);
}

/// 13d: model 11h's scenario (a third thread drains deferred claims while T1 borrows core 0 with a sequence and
/// the main thread switches back), every barrier failing: the drain's claims go back.
fn drain_vs_sequence(name: &'static str, mutant: Mutant) {
    model(name, move || {
        mmcid_loom_tests::borrower_vs_sweep_ending(
            small(true, mutant),
            visit,
            Some(Group::loom_deferred_drain),
            finish_degraded,
        )
    });
}

#[test]
fn failed_barrier_drain_vs_sequence() {
    drain_vs_sequence("failed_barrier_drain_vs_sequence", Mutant::None);
}

/// The drain takes what it claimed although its RSEQ membarrier failed: T1's sequence commits BUSY over the EMPTY
/// slot, so core 0 owns a CID whose bit the drain cleared.
#[test]
#[should_panic(expected = "inconsistent at quiescence")]
fn failed_barrier_drain_vs_sequence_mutant_takes_anyway() {
    drain_vs_sequence("failed_barrier_drain_vs_sequence_mutant_takes_anyway", Mutant::IgnoreFailedClaimBarrier);
}
