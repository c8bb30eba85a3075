//! Model 17: I2's user bound (design.md §2.7). Three users on two virtual cores (per-CPU mode, one CID per core):
//! core 1's CID is parked idle, core 0's is held by a guard, and two threads of core 0 enter at once. The first to
//! find core 0 busy takes a temporary (CID 2); the second finds every CID below `users` = 3 taken and must take
//! core 1's parked CID rather than a fresh CID 3. Every guard's CID is checked below `users`; the cells check that
//! the parked CID's take excludes any other holder of it (I1, I8).
//!
//! Twin `NoParkedTake`: the second keeps the fresh CID 3, at the user bound.
#![cfg(loom)]

use loom::thread;
use mmcid::{Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, Cids, Reg};

const USERS: usize = 3;

fn visit_below_users(cids: &Cids, reg: &mut Reg) {
    let (cid, _) = cids.visit(reg);
    assert!(cid < USERS, "CID {cid} at or above users = {USERS} (I2's user bound)");
}

fn parked_take(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(2).cids_per_core(1).mutant(mutant).build().unwrap();
        let cids = Cids::new(USERS + 2);
        let mut r1 = Reg::new(&group, 0);
        let mut r2 = Reg::new(&group, 0);
        let mut r3 = Reg::new(&group, 1);
        assert_eq!(group.mode(), Mode::PerCpu, "users 3 > max_cids 2");
        visit_below_users(&cids, &mut r3); // core 1 owns a CID, parked idle
        r3.set_cpu(Some(0)).unwrap();
        let held = r1.enter(); // core 0's CID, held
        cids.touch(held.cid().get());

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                visit_below_users(&cids, &mut r3);
                r3
            })
        };
        visit_below_users(&cids, &mut r2);
        drop(held);
        let r3 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r2, r3]);
    });
}

#[test]
fn fresh_cid_takes_a_parked_one_below_users() {
    parked_take("fresh_cid_takes_a_parked_one_below_users", Mutant::None);
}

#[test]
#[should_panic(expected = "at or above users")]
fn fresh_cid_takes_a_parked_one_below_users_mutant_no_parked_take() {
    parked_take("fresh_cid_takes_a_parked_one_below_users_mutant_no_parked_take", Mutant::NoParkedTake);
}
