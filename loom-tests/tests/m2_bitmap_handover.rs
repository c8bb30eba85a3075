//! Model 2: bitmap allocate / release with payload hand-over (I8; design.md §6). In the kernel only atomic RMWs
//! change the CID bitmap and the run-queue lock orders a CID's hand-over; mmcid has no such lock, so its bitmap's
//! Release clear and Acquire set carry the hand-over.
//!
//! One core in per-CPU mode. The main thread borrows the core's CID for the whole model (its slot is BUSY), so
//! T1 and the main thread's second registration both take temporary CIDs from the bitmap: when one releases its
//! temporary (`fetch_and`, Release) before the other allocates (`fetch_or`, Acquire), the CID — and the per-CID
//! data written under it — is handed over through the bitmap alone, with no lifecycle lock in between.
#![cfg(loom)]

use loom::thread;
use mmcid::{CidKind, Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, Cids, Reg};

fn scenario(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(1).mutant(mutant).build().unwrap();
        let cids = Cids::new(3 + 1);
        let mut r1 = Reg::new(&group, 0);
        let mut r2 = Reg::new(&group, 0); // users 2 > max_cids 1: per-CPU
        let mut r3 = Reg::new(&group, 0);
        assert_eq!(group.mode(), Mode::PerCpu);
        let core = r1.enter(); // core 0 allocates CID 0; its slot stays BUSY until the end
        assert_eq!((core.cid().get(), core.kind()), (0, CidKind::Core(0)));
        cids.touch(0);

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                assert_eq!(cids.visit(&mut r2).1, CidKind::Temporary);
                r2
            })
        };
        assert_eq!(cids.visit(&mut r3).1, CidKind::Temporary);

        let r2 = t1.join().unwrap();
        drop(core);
        finish(&group, &cids, vec![r1, r2, r3]);
    });
}

#[test]
fn bitmap_handover() {
    scenario("bitmap_handover", Mutant::None);
}

/// Relaxed `fetch_or` / `fetch_and`: the bitmap still hands out each CID once (atomicity), but the next holder of a
/// temporary no longer sees the previous holder's writes: loom reports the unsynchronised per-CID data.
#[test]
#[should_panic(expected = "Causality violation")]
fn bitmap_handover_mutant_release_acquire() {
    scenario("bitmap_handover_mutant_release_acquire", Mutant::RelaxedBitmap);
}
