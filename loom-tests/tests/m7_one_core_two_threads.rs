//! Model 7: two threads on one core in per-CPU mode (design.md §2.3 BUSY slot, §4.3 temporaries): the core's CID
//! is borrowed by one of them, the other takes a temporary CID; both are released (the core keeps its CID, the
//! temporary goes back to the bitmap), whichever order the slot CAS, the allocation and the exits take.
//!
//! One core (`virtual_cpus(1)`), three registrations (per-CPU mode since the second). Nobody holds the core's CID
//! at the spawn (it is owned by core 0, idle); T1 and T2 each enter and leave twice on core 0, and the main thread
//! once more after the spawn, so up to three guards share the core: one borrows, the others take temporaries. Core CID hand-overs go through the slot (Release store → Acquire CAS), temporaries through the bitmap.
#![cfg(loom)]

use loom::thread;
use mmcid::{CidKind, Group, Mode, Mutant};
use mmcid_loom_tests::{all_free, model, quiescent, Cids, Reg};

fn scenario(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(1).mutant(mutant).build().unwrap();
        let cids = Cids::new(3 + 1);
        let r1 = Reg::new(&group, 0);
        let r2 = Reg::new(&group, 0);
        let mut r3 = Reg::new(&group, 0);
        assert_eq!(group.mode(), Mode::PerCpu);
        assert_eq!(cids.visit(&mut r3), (0, CidKind::Core(0))); // core 0 owns CID 0, idle

        let spawn = |mut r: Reg| {
            let cids = cids.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    let (cid, kind) = cids.visit(&mut r);
                    match kind {
                        CidKind::Core(0) => assert_eq!(cid, 0, "core 0's CID changed"),
                        CidKind::Temporary => assert_ne!(cid, 0, "a temporary equal to the core's CID"),
                        k => panic!("unexpected kind {k:?}"),
                    }
                }
                r
            })
        };
        let t1 = spawn(r1);
        let t2 = spawn(r2);
        let (cid, kind) = cids.visit(&mut r3);
        assert!(kind == CidKind::Core(0) && cid == 0 || kind == CidKind::Temporary && cid != 0);

        let r1 = t1.join().unwrap();
        let r2 = t2.join().unwrap();
        cids.check_total();
        quiescent(&group, &[&r1, &r2, &r3]);
        let audit = group.audit();
        assert_eq!((audit.bits, audit.owners), (1, 1), "core 0 keeps CID 0, every temporary is back: {audit:?}");
        drop(r1);
        drop(r2);
        drop(r3);
        all_free(&group);
    });
}

#[test]
fn one_core_two_threads() {
    scenario("one_core_two_threads", Mutant::None);
}

/// Relaxed bitmap: a temporary released by one thread and allocated by another while a third holds the core's CID
/// carries no happens-before.
#[test]
#[should_panic(expected = "Causality violation")]
fn one_core_two_threads_mutant_release_acquire() {
    scenario("one_core_two_threads_mutant_release_acquire", Mutant::RelaxedBitmap);
}
