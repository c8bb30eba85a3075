//! Model 15: CID sets (design.md §2.6). With two CIDs per core, a guard that finds its core's first CID held
//! borrows the core's second slot (donating a fresh CID into it), and its exit releases that slot, whichever core
//! it runs on, while a CPU → task switch sweeps every slot of every core. (The occupancy switch of §3.1 needs more
//! holders than twice the cores, more than this model has; the switch it runs is §5's, checked by models 3, 4, 6.)
//!
//! Four virtual cores of which two are allowed (max_cids 2, thrs 2 in per-CPU mode), `cids_per_core(2)`.
#![cfg(loom)]

use loom::thread;
use mmcid::{CidKind, Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, Cids, Reg};

fn group(mutant: Mutant) -> Group {
    Group::builder().virtual_cpus(4).cpus_virtual([0, 1]).cids_per_core(2).mutant(mutant).build().unwrap()
}

/// The main thread holds core 0's first CID in a guard while T1, on core 0 too, enters (the core's second slot) and
/// leaves; meanwhile the main thread drops its guard and two users, which
/// switches the group back to per-task mode and sweeps both slots of every core, registers again and enters.
fn extra_vs_sweep(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = group(mutant);
        let cids = Cids::new(4 + 2 * 4);
        let mut r1 = Reg::new(&group, 0);
        let mut r2 = Reg::new(&group, 0);
        let r3 = Reg::new(&group, 1); // users 3 > 2: per-CPU
        assert_eq!(group.mode(), Mode::PerCpu);
        let held = r2.enter(); // core 0's first CID, BUSY
        assert_eq!(held.kind(), CidKind::Core(0));
        cids.touch(held.cid().get());

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r1);
                r1
            })
        };

        drop(held);
        drop(r3);
        drop(r2); // users 1 < thrs 2 (unless the occupancy switch already ran): CPU → task, every slot swept
        let mut r4 = Reg::new(&group, 1);
        cids.visit(&mut r4);

        let r1 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r4]);
    });
}

#[test]
fn extra_cid_vs_cpu_to_task_sweep() {
    extra_vs_sweep("extra_cid_vs_cpu_to_task_sweep", Mutant::None);
}

/// T1's exit releases its second-slot CID into the first slot, over the main thread's: the main thread's CID is
/// lost (marked, owned by nobody) and the second slot stays BUSY with nobody inside.
#[test]
#[should_panic(expected = "CID owned twice at quiescence")]
fn extra_cid_vs_cpu_to_task_sweep_mutant_exit_to_first_slot() {
    extra_vs_sweep("extra_cid_vs_cpu_to_task_sweep_mutant_exit_to_first_slot", Mutant::ExitToFirstSlot);
}
