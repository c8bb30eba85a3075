//! Model 3: enter on the per-task fast path racing the task → CPU fixup (design.md §4.1, §5, Dekker pairs D-enter
//! and D-exit of §5.1).
//!
//! One core (`virtual_cpus(1)`): one registration is per-task (CID 0, max_cids 1); a second `register()` makes
//! users 2 > max_cids 1 and switches the group to per-CPU mode inside the register, walking the first
//! registration. Thread T1 enters and leaves twice with the first registration, racing the walk; the main thread
//! registers, then enters its new registration (per-CPU: the core allocates a CID) and so competes for CID 0.
//! T1 never takes the lifecycle lock, so nothing but the Dekker pairs orders T1 against the fixup.
#![cfg(loom)]

use loom::thread;
use mmcid::{Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, Cids, Reg};

fn scenario(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(1).mutant(mutant).build().unwrap();
        let cids = Cids::new(2 + 1);
        let mut r1 = Reg::new(&group, 0);
        assert_eq!(r1.cid().map(|c| c.get()), Some(0));

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r1);
                cids.visit(&mut r1); // after the switch (or still before it): per-CPU or per-task path
                r1
            })
        };

        let mut r2 = Reg::new(&group, 0); // users 2 > max_cids 1: task → CPU switch with its fixup walk
        assert_eq!(group.mode(), Mode::PerCpu);
        cids.visit(&mut r2);

        let r1 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r2]);
    });
}

#[test]
fn enter_vs_task_to_cpu() {
    scenario("enter_vs_task_to_cpu", Mutant::None);
}

/// The fixup takes the CID of a registration that is inside a guard ("no TRANSIT on running owners"): the main
/// thread's core then allocates the same CID while T1 still uses it.
#[test]
#[should_panic(expected = "Causality violation")]
fn enter_vs_task_to_cpu_mutant_running_check() {
    scenario("enter_vs_task_to_cpu_mutant_running_check", Mutant::FixupIgnoresRunning);
}

/// F2 removed (the kernel's fence after flipping the mode): only the enter side of D-enter fences, so T1 can read the
/// old mode after the flip while the walk reads the old `running`: both use CID 0.
#[test]
#[should_panic(expected = "Causality violation")]
fn enter_vs_task_to_cpu_mutant_fixup_barrier() {
    scenario("enter_vs_task_to_cpu_mutant_fixup_barrier", Mutant::NoFixupBarrier);
}

/// E2 removed: the same store-buffering outcome from the other side of D-enter.
#[test]
#[should_panic(expected = "Causality violation")]
fn enter_vs_task_to_cpu_mutant_enter_barrier() {
    scenario("enter_vs_task_to_cpu_mutant_enter_barrier", Mutant::NoEnterBarrier);
}

/// X2 removed (D-exit): the walk reads `running == 1` and skips the word, T1's exit reads the old mode and keeps
/// its task CID: a registration owns a CID in per-CPU mode at quiescence.
#[test]
#[should_panic(expected = "a registration owns a CID in per-CPU mode")]
fn enter_vs_task_to_cpu_mutant_exit_barrier() {
    scenario("enter_vs_task_to_cpu_mutant_exit_barrier", Mutant::NoExitBarrier);
}
