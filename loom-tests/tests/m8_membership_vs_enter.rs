//! Model 8: registration and drop racing enter (design.md §3 limits, §4.3 and §4.5 convergence; I2, I4).
//!
//! Two cores, per-task mode throughout (never more than two registrations). T1 enters and leaves twice with r2 (CID 1
//! at first) while the main thread, inside a guard of r1, writes CID 0's data, then drops r1 (max_cids shrinks to 1:
//! r2's CID 1 is now out of range), registers r3 (max_cids grows back to 2; r3 is born with the lowest free CID, below
//! 2 because T1 never holds two, design.md §2.4) and drops it again (max_cids 1). T1 reads `max_cids` racily (Relaxed,
//! as the kernel reads it with READ_ONCE): each of its enters keeps CID 1 or converges to a free CID below the bound it
//! read. After the join, r2 is alone and its next guard has CID 0 (I4), whatever T1 did.
//!
//! CID 0 moves from r1 (dropped under the lifecycle lock) to T1's converging enter (no lock) through the bitmap
//! only, so the per-CID data written under r1's guard must reach T1 through the bitmap's Release / Acquire (I8).
#![cfg(loom)]

use loom::thread;
use mmcid::{CidKind, Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, Cids, Reg};

fn scenario(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(2).mutant(mutant).build().unwrap();
        let cids = Cids::new(2 + 2);
        let mut r1 = Reg::new(&group, 0);
        let mut r2 = Reg::new(&group, 1);
        assert_eq!((r1.cid().unwrap().get(), r2.cid().unwrap().get(), group.max_cids()), (0, 1, 2));

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    let (cid, kind) = cids.visit(&mut r2);
                    assert_eq!(kind, CidKind::Task);
                    assert!(cid < 2, "CID {cid} beyond users + cores");
                }
                r2
            })
        };

        assert_eq!(cids.visit(&mut r1), (0, CidKind::Task));
        // max_cids 2 → 1.
        drop(r1);
        // max_cids 1 → 2. Born with the lowest free CID, which is below 2: T1 holds at most one CID at any instant,
        // even between its convergence's two steps (design.md §2.4).
        let mut r3 = Reg::new(&group, 0);
        let born = r3.cid().unwrap().get();
        assert!(born < 2, "r3 born with CID {born}: T1's convergence held two CIDs at once");
        cids.visit(&mut r3);
        drop(r3); // max_cids 2 → 1

        let mut r2 = t1.join().unwrap();
        assert_eq!((group.mode(), group.users(), group.max_cids()), (Mode::PerTask, 1, 1));
        assert_eq!(cids.visit(&mut r2), (0, CidKind::Task), "I4: alone again, the next guard has CID 0");
        finish(&group, &cids, vec![r2]);
    });
}

#[test]
fn membership_vs_enter() {
    scenario("membership_vs_enter", Mutant::None);
}

/// Convergence in its former order (take the new CID, then give the old one up): between the two
/// steps T1 holds CIDs 0 and 1, and r3 is born with CID 2.
#[test]
#[should_panic(expected = "r3 born with CID 2")]
fn membership_vs_enter_mutant_converge_takes_first() {
    scenario("membership_vs_enter_mutant_converge_takes_first", Mutant::ConvergeTakesFirst);
}

/// Relaxed bitmap: T1's converging enter takes CID 0 without synchronising with r1's release of it.
#[test]
#[should_panic(expected = "Causality violation")]
fn membership_vs_enter_mutant_release_acquire() {
    scenario("membership_vs_enter_mutant_release_acquire", Mutant::RelaxedBitmap);
}
