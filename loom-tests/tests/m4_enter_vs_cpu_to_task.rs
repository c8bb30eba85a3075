//! Model 4: enter racing the CPU → task fixup (design.md §4.2 `Core` exit, §4.4 `exit_slow_core`, §5 sweep, Dekker
//! pair D-core), and an UNSET registration word met by the next task → CPU fixup (kernel fixes
//! 1e83ccd5921a and de3ab9bd3133).
//!
//! Four virtual cores of which two are allowed (`virtual_cpus(4).cpus_virtual([0, 1])`): opt = min(2, users),
//! max_cids = 2, so the third registration switches to per-CPU mode, and thrs = min(2, 4/2) = 2 switches back
//! when users drops to 1. Everything before the spawn is set-up and adds no interleavings.
#![cfg(loom)]

use loom::thread;
use mmcid::{Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, visit, Cids, Reg};

fn group(mutant: Mutant) -> Group {
    Group::builder().virtual_cpus(4).cpus_virtual([0, 1]).mutant(mutant).build().unwrap()
}

/// T1 borrows core 0's CID while the main thread's drop switches the group back to per-task mode and sweeps the
/// core slots (`mmcid_loom_tests::borrower_vs_sweep`).
fn borrower_vs_sweep(name: &'static str, mutant: Mutant) {
    model(name, move || mmcid_loom_tests::borrower_vs_sweep(group(mutant), visit));
}

#[test]
fn borrower_vs_cpu_to_task_sweep() {
    borrower_vs_sweep("borrower_vs_cpu_to_task_sweep", Mutant::None);
}

/// The sweep takes a BUSY slot's CID (kernel 1e83ccd5921a undone: the fixup assumes the state it finds may be
/// dropped): the new registration is born with the CID T1 is still using.
#[test]
#[should_panic(expected = "Causality violation")]
fn borrower_vs_cpu_to_task_sweep_mutant_busy_check() {
    borrower_vs_sweep("borrower_vs_cpu_to_task_sweep_mutant_busy_check", Mutant::FixupIgnoresBusy);
}

/// X2 removed from the core exit (D-core): the sweep saw the slot BUSY, T1's exit reads the old mode: core 0 keeps
/// a CID in per-task mode, where nobody looks at slots any more.
#[test]
#[should_panic(expected = "a core owns a CID in per-task mode")]
fn borrower_vs_cpu_to_task_sweep_mutant_exit_barrier() {
    borrower_vs_sweep("borrower_vs_cpu_to_task_sweep_mutant_exit_barrier", Mutant::NoExitBarrier);
}

/// F2 removed from the CPU → task switch: the same leak from the fixup's side of D-core.
#[test]
#[should_panic(expected = "a core owns a CID in per-task mode")]
fn borrower_vs_cpu_to_task_sweep_mutant_fixup_barrier() {
    borrower_vs_sweep("borrower_vs_cpu_to_task_sweep_mutant_fixup_barrier", Mutant::NoFixupBarrier);
}

/// A registration that entered in per-CPU mode keeps an UNSET word after the switch back to per-task mode until
/// it enters again. T1 enters with it (UNSET → slow path: allocate and install, with `running` set: Rik's
/// scenario) while the main thread's register pushes users over max_cids again: the task → CPU walk meets the
/// UNSET word, idle or running. The main thread then enters on the same core.
fn unset_word_vs_task_to_cpu(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = group(mutant);
        let cids = Cids::new(3 + 4);
        let mut r1 = Reg::new(&group, 0);
        let r2 = Reg::new(&group, 0);
        let r3 = Reg::new(&group, 0); // per-CPU: the walk leaves r1 and r2 UNSET, r3 is born UNSET
        drop(r3);
        drop(r2); // users 1: back to per-task; r1's word stays UNSET until r1 enters
        assert_eq!(group.mode(), Mode::PerTask);
        assert_eq!(r1.cid(), None);
        let r2 = Reg::new(&group, 0); // per-task: born with a CID

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r1);
                r1
            })
        };

        let mut r3 = Reg::new(&group, 0); // users 3 > 2: task → CPU walk over r1 (UNSET) and r2
        assert_eq!(group.mode(), Mode::PerCpu);
        cids.visit(&mut r3);

        let r1 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r2, r3]);
    });
}

#[test]
fn unset_word_vs_task_to_cpu_walk() {
    unset_word_vs_task_to_cpu("unset_word_vs_task_to_cpu_walk", Mutant::None);
}

/// The walk treats the UNSET word as a CID (kernel de3ab9bd3133 undone) and clears bit 2^31.
#[test]
#[should_panic(expected = "cleared a CID beyond the bitmap")]
fn unset_word_vs_task_to_cpu_walk_mutant_unset_check() {
    unset_word_vs_task_to_cpu("unset_word_vs_task_to_cpu_walk_mutant_unset_check", Mutant::FixupTakesUnset);
}
