//! The thread-local convenience layer (`Group::enter`, `ShardedCounter::add`, `Group::leave_thread`), tested on
//! its own: which registration each call uses, and that every path out of a thread gives back what it held (I5, I7).

mod common;

use common::{Occupancy, Payload};
use mmcid::{Group, ShardedCounter};
use std::cell::RefCell;
use std::sync::Arc;
use std::thread;

/// Quiescent and empty: no user, no bit set, no owner (I5).
fn assert_empty(group: &Group) {
    assert_eq!(group.users(), 0, "a thread-local registration outlived its thread");
    let audit = group.audit();
    assert_eq!((audit.bits, audit.owners), (0, 0), "CIDs left behind: {audit:?}");
}

#[test]
fn one_registration_per_thread_is_reused() {
    let group = Group::new();
    let g = group.clone();
    thread::spawn(move || {
        let first = g.enter().cid();
        for _ in 0..100 {
            assert_eq!(g.enter().cid(), first, "the parked registration keeps its CID (I3)");
        }
        assert_eq!(g.users(), 1, "sequential enters share one registration");
    })
    .join()
    .unwrap();
    assert_empty(&group);
}

#[test]
fn nested_enters_get_distinct_registrations_and_all_return() {
    let group = Group::new();
    let g = group.clone();
    thread::spawn(move || {
        for _ in 0..3 {
            let a = g.enter();
            let b = g.enter();
            let c = g.enter();
            let cids = [a.cid(), b.cid(), c.cid()];
            assert!(cids[0] != cids[1] && cids[1] != cids[2] && cids[0] != cids[2], "I1 on one thread: {cids:?}");
            drop(b); // out of order: parks b, a and c go to the pool
        }
        assert_eq!(g.users(), 3, "the pool reuses the nested registrations");
        assert_eq!(g.leave_thread(), 3, "leave_thread drops the parked one and the pooled ones");
        assert_eq!(g.users(), 0);
        drop(g.enter()); // usable again afterwards
        assert_eq!(g.users(), 1);
    })
    .join()
    .unwrap();
    assert_empty(&group);
}

#[test]
fn two_groups_alternating_on_one_thread() {
    let (x, y) = (Group::new(), Group::new());
    let (gx, gy) = (x.clone(), y.clone());
    thread::spawn(move || {
        let (cx, cy) = (gx.enter().cid(), gy.enter().cid());
        for _ in 0..50 {
            assert_eq!(gx.enter().cid(), cx);
            assert_eq!(gy.enter().cid(), cy);
        }
        assert_eq!((gx.users(), gy.users()), (1, 1), "one registration per group, parked or pooled");
        assert_eq!(gx.leave_thread(), 1);
        assert_eq!((gx.users(), gy.users()), (0, 1), "leave_thread touches only its own group");
    })
    .join()
    .unwrap();
    assert_empty(&x);
    assert_empty(&y);
}

thread_local! {
    // Registered before the layer's own thread-locals (see the tests), so destroyed after them: thread-local
    // destructors run in the reverse order of registration.
    static LATE: RefCell<Option<mmcid::CidGuard<'static>>> = const { RefCell::new(None) };
    static LATE_WORK: RefCell<Option<(Group, std::sync::Arc<ShardedCounter>)>> = const { RefCell::new(None) };
}

/// Drops a guard after the parked slot was closed and the pool destroyed: the registration must be unregistered by
/// the guard itself (the closed-slot and "pool gone" paths).
#[test]
fn guard_that_outlives_the_thread_locals_still_releases() {
    let group = Group::new();
    let g = group.clone();
    thread::spawn(move || {
        LATE.with(|_| ()); // registered first: destroyed last
        drop(g.enter()); // something parked
        let outer = g.enter(); // takes the parked registration
        let inner = g.enter(); // a second one, from the pool path
        LATE.with(|l| *l.borrow_mut() = Some(inner));
        drop(outer);
        assert_eq!(g.users(), 2);
    })
    .join()
    .unwrap();
    assert_empty(&group);
}

/// Enters, nests and adds from a thread-local destructor that runs after the layer's own thread-locals are gone:
/// every registration made there must still be unregistered (I7), and every add counted.
#[test]
fn entering_during_thread_local_destruction() {
    struct Late;
    impl Drop for Late {
        fn drop(&mut self) {
            LATE_WORK.with(|w| {
                if let Some((group, counter)) = w.borrow_mut().take() {
                    let outer = group.enter();
                    let inner = group.enter();
                    assert_ne!(outer.cid(), inner.cid());
                    counter.add(3);
                    drop((outer, inner));
                    counter.add(4);
                }
            });
        }
    }
    thread_local! {
        static LATE_HOOK: Late = const { Late };
    }
    let group = Group::new();
    let counter = std::sync::Arc::new(ShardedCounter::new(&group));
    let (g, c) = (group.clone(), counter.clone());
    thread::spawn(move || {
        LATE_WORK.with(|w| *w.borrow_mut() = Some((g.clone(), c.clone())));
        LATE_HOOK.with(|_| ()); // registered before the layer's thread-locals: destroyed after them
        counter_add_and_enter_once(&g, &c);
    })
    .join()
    .unwrap();
    assert_eq!(counter.sum(), 1 + 3 + 4);
    assert_empty(&group);
}

fn counter_add_and_enter_once(group: &Group, counter: &ShardedCounter) {
    drop(group.enter());
    counter.add(1);
}

#[test]
fn counter_add_inside_a_guard_uses_another_registration() {
    let group = Group::new();
    let counter = std::sync::Arc::new(ShardedCounter::new(&group));
    let (g, c) = (group.clone(), counter.clone());
    // A plain spawn + join, not a scope: join waits for the thread's thread-local destructors, a scope does not.
    thread::spawn(move || {
        let guard = g.enter();
        c.add(5); // nested: takes a second registration (so a different CID) instead of the guard's
        assert_eq!(g.users(), 2);
        drop(guard);
        for _ in 0..10 {
            c.add(1);
        }
        assert_eq!(g.users(), 2, "no registration per call");
    })
    .join()
    .unwrap();
    assert_eq!(counter.sum(), 15);
    assert_empty(&group);
}

#[test]
fn panic_inside_thread_local_guards_releases() {
    // A panic while a `Group::enter` guard is live unwinds through its drop (I7); the thread's registrations are
    // released at thread exit.
    let group = Group::new();
    let g = group.clone();
    let r = thread::spawn(move || {
        let _guard = g.enter();
        let _second = g.enter();
        panic!("inside two thread-local guards");
    })
    .join();
    assert!(r.is_err());
    assert_empty(&group);
}

/// Churn through the thread-local layer only: threads come and go (registering on first use, unregistering at
/// exit, so both groups cross the per-task/per-CPU boundary on 2 virtual cores), switch between two groups in
/// streaks and alternately (the parked slot moves, the pool fills), nest guards, and add to a counter per group.
/// Independent checkers: a per-CID occupancy counter per group (I1), a plain per-CID payload whose sum must equal
/// the number of guards (I1 + I8), exact counter sums, and an empty group at the end (I5, I7).
#[test]
fn churn_through_group_enter_and_counter_add() {
    const WAVES: usize = 3;
    const THREADS: usize = 5;
    const ROUNDS: u64 = 300;
    let groups: Vec<Group> = (0..2).map(|_| Group::builder().virtual_cpus(2).build().unwrap()).collect();
    let counters: Vec<Arc<ShardedCounter>> = groups.iter().map(|g| Arc::new(ShardedCounter::new(g))).collect();
    let occ: Vec<Arc<Occupancy>> = (0..2).map(|_| Arc::new(Occupancy::new(256))).collect();
    let payload: Vec<Arc<Payload>> = (0..2).map(|_| Arc::new(Payload::new(256))).collect();
    let mut guards_taken = [0u64; 2];
    for wave in 0..WAVES {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (groups, counters) = (groups.clone(), counters.clone());
                let (occ, payload) = (occ.clone(), payload.clone());
                thread::spawn(move || {
                    let mut taken = [0u64; 2];
                    for round in 0..ROUNDS {
                        // Streaks of one group for some threads, strict alternation for others.
                        let which = if t % 2 == 0 { (round / 25 % 2) as usize } else { (round % 2) as usize };
                        let guard = groups[which].enter();
                        let cid = guard.cid().get();
                        occ[which].enter(cid);
                        payload[which].bump(cid);
                        taken[which] += 1;
                        if round % 7 == 0 {
                            let inner = groups[which].enter(); // nested: another registration, another CID
                            let inner_cid = inner.cid().get();
                            occ[which].enter(inner_cid);
                            payload[which].bump(inner_cid);
                            taken[which] += 1;
                            occ[which].exit(inner_cid);
                        }
                        counters[which].add(1 + wave as u64);
                        occ[which].exit(cid);
                        drop(guard);
                    }
                    taken
                })
            })
            .collect();
        for h in handles {
            let taken = h.join().unwrap();
            guards_taken[0] += taken[0];
            guards_taken[1] += taken[1];
        }
    }
    for i in 0..2 {
        let stats = groups[i].stats();
        assert!(
            stats.switches_to_per_cpu > 0 && stats.switches_to_per_task > 0,
            "group {i} crossed the boundary both ways: {stats:?}"
        );
        assert_eq!(payload[i].sum(), guards_taken[i], "group {i}: lost per-CID updates (I1/I8)");
        assert!(occ[i].max_seen.load(std::sync::atomic::Ordering::SeqCst) < 2 + 5 * 2, "group {i}: hard bound");
        assert_empty(&groups[i]);
    }
    let expected: u64 = (0..WAVES as u64).map(|w| (1 + w) * THREADS as u64 * ROUNDS / 2).sum();
    assert_eq!(counters[0].sum() + counters[1].sum(), 2 * expected);
}
