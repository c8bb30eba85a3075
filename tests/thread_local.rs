//! The thread-local convenience layer (`Group::enter`, `ShardedCounter::add`, `Group::leave_thread`), tested on
//! its own: which registration each call uses, and that every path out of a thread gives back what it held (I5, I7).

mod common;

use common::{Gate, Occupancy, Payload};
use mmcid::{CidKind, Group, ShardedCounter};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};
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
            drop(b); // out of order: to the pool (c's registration holds the slot); then c is parked, a pooled
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

/// What a job run from `run_after_the_layer` is told: whether the layer was gone when it ran, and how many
/// destructors it was handed through first.
#[derive(Clone, Copy, Debug)]
struct Late {
    layer_gone: bool,
    hops: usize,
}

/// A job waiting in a thread-local destructor for `layer_gone()`.
struct Pending {
    layer_gone: Box<dyn Fn() -> bool>,
    job: Box<dyn FnOnce(Late)>,
    hops: usize,
}

/// A thread-local whose destructor runs a `Pending` job once the layer is gone, or hands it on to the next `Hook`.
struct Hook(RefCell<Option<Pending>>);

impl Drop for Hook {
    fn drop(&mut self) {
        let Some(pending) = self.0.borrow_mut().take() else { return };
        let next = pending.hops + 1;
        let pending = if !(pending.layer_gone)() && next < HOOKS {
            // Not yet: a destructor registered now runs after the others where they run in registration order.
            let mut handed = Some(Pending { hops: next, ..pending });
            let _ = hook(next).try_with(|h| *h.0.borrow_mut() = handed.take());
            match handed {
                None => return, // handed on
                Some(p) => Pending { hops: next - 1, ..p },
            }
        } else {
            pending
        };
        let layer_gone = (pending.layer_gone)();
        (pending.job)(Late { layer_gone, hops: pending.hops });
    }
}

const HOOKS: usize = 3;

thread_local! {
    static HOOK0: Hook = const { Hook(RefCell::new(None)) };
    static HOOK1: Hook = const { Hook(RefCell::new(None)) };
    static HOOK2: Hook = const { Hook(RefCell::new(None)) };
}

fn hook(i: usize) -> &'static std::thread::LocalKey<Hook> {
    [&HOOK0, &HOOK1, &HOOK2][i]
}

/// Registers the calling thread's first thread-local destructor; call it before anything touches the layer.
fn arm_hook() {
    HOOK0.with(|_| ());
}

/// Runs `job` from a thread-local destructor of the calling thread, once `layer_gone()` says that the layer's own
/// thread-locals (parked slot, pool) are destroyed. std leaves the order of thread-local destructors unspecified;
/// the hook armed first runs last where they run in reverse registration order (glibc, std's own list), and where
/// they run in registration order, it hands the job to a destructor registered during destruction, which runs after
/// the layer's. The job is told whether the layer was gone (an order that defeats both must fail the test, not pass
/// it without reaching the path). A job must not panic: a panic in a thread-local destructor aborts the process.
fn run_after_the_layer(layer_gone: impl Fn() -> bool + 'static, job: impl FnOnce(Late) + 'static) {
    HOOK0.with(|h| *h.0.borrow_mut() = Some(Pending { layer_gone: Box::new(layer_gone), job: Box::new(job), hops: 0 }));
}

/// Fills the calling thread's pool with two registrations of `probe` (its parked slot then holds the second, until
/// another group's registration evicts it to the pool as well): `probe.users()` falls to 0 exactly when the pool is
/// destroyed at thread exit.
fn pool_a_probe(probe: &Group) {
    let a = probe.enter(); // new registration P1, in the slot
    let b = probe.enter(); // nested: new registration P2 takes the slot (P1 stays with `a`)
    drop(b); // P2 parked
    drop(a); // the slot holds P2 of the same group: P1 goes to the pool
}

/// Drops a guard after the parked slot was closed and the pool destroyed: the registration must be unregistered by
/// the guard itself (the closed-slot and "pool gone" paths), which the group's user count shows at once.
#[test]
fn guard_that_outlives_the_thread_locals_still_releases() {
    let (group, probe) = (Group::new(), Group::new());
    let seen = Arc::new(Mutex::new(None));
    let (g, p, out) = (group.clone(), probe.clone(), seen.clone());
    thread::spawn(move || {
        arm_hook(); // before the layer's thread-locals
        pool_a_probe(&p);
        drop(g.enter()); // G1 takes the slot, P2 goes to the pool
        let outer = g.enter(); // takes the parked G1
        let inner = g.enter(); // a second one, G2, new: takes the slot (G1 stays with `outer`)
        drop(outer); // G1 to the pool: the slot holds G2, in use
        drop(p.enter()); // P2 takes the slot (G2 stays with `inner`) and is parked there
        assert_eq!((g.users(), p.users()), (2, 2));
        // The layer is gone when the pool has dropped G1 (1 user left: G2, in `inner`) and P1, and the slot's closer
        // P2.
        let (g2, p2) = (g.clone(), p.clone());
        run_after_the_layer(
            move || g2.users() == 1 && p2.users() == 0,
            move |late| {
                drop(inner);
                *out.lock().unwrap() = Some((late, g.users()));
            },
        );
    })
    .join()
    .unwrap();
    let (late, users_after) = seen.lock().unwrap().take().expect("the late destructor ran");
    eprintln!("late destructor: handed on {} times, layer gone: {}", late.hops, late.layer_gone);
    assert!(late.layer_gone, "no destructor ran after the layer's ({late:?}): the closed-slot path was not reached");
    assert_eq!(users_after, 0, "the guard's drop with the slot closed and the pool gone kept its registration");
    assert_empty(&group);
    assert_empty(&probe);
}

/// What the enters and adds of `entering_during_thread_local_destruction` saw: the two nested CIDs, users while
/// they were held, after they dropped, and after one more add.
type LateWork = (Late, [mmcid::Cid; 2], usize, usize, usize);

/// Enters, nests and adds from a thread-local destructor that runs after the layer's own thread-locals are gone:
/// every registration made there must be unregistered by its own guard or add at once (nothing is left to park or
/// pool it in, I7), and every add counted.
#[test]
fn entering_during_thread_local_destruction() {
    let (group, probe) = (Group::new(), Group::new());
    let counter = Arc::new(ShardedCounter::new(&group));
    let seen: Arc<Mutex<Option<LateWork>>> = Arc::new(Mutex::new(None));
    let (g, p, c, out) = (group.clone(), probe.clone(), counter.clone(), seen.clone());
    thread::spawn(move || {
        arm_hook(); // before the layer's thread-locals
        pool_a_probe(&p);
        counter_add_and_enter_once(&g, &c); // G1 parked (P2 to the pool)
        assert_eq!((g.users(), p.users()), (1, 2));
        // The layer is gone when the slot's closer has dropped G1 and the pool P1, P2.
        let (g2, p2) = (g.clone(), p.clone());
        run_after_the_layer(
            move || g2.users() == 0 && p2.users() == 0,
            move |late| {
                let outer = g.enter();
                let inner = g.enter();
                let cids = [outer.cid(), inner.cid()];
                let held = g.users();
                c.add(3); // inside the guards: a third registration
                drop((outer, inner));
                let after_guards = g.users();
                c.add(4);
                *out.lock().unwrap() = Some((late, cids, held, after_guards, g.users()));
            },
        );
    })
    .join()
    .unwrap();
    let (late, cids, held, after_guards, after_add) = seen.lock().unwrap().take().expect("the late destructor ran");
    eprintln!("late destructor: handed on {} times, layer gone: {}", late.hops, late.layer_gone);
    assert!(late.layer_gone, "no destructor ran after the layer's ({late:?}): the path was not reached");
    assert_ne!(cids[0], cids[1], "nested guards share a CID");
    assert_eq!(held, 2, "two nested guards, two new registrations");
    assert_eq!(after_guards, 0, "a guard's drop after the layer kept its registration");
    assert_eq!(after_add, 0, "an add after the layer kept its registration");
    assert_eq!(counter.sum(), 1 + 3 + 4);
    assert_empty(&group);
    assert_empty(&probe);
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

/// `Group::enter` guards passed to `mem::forget` (design.md §9.1.1) are given back when their thread exits: what
/// they held (here core 0's only CID, borrowed) and their registrations. Before, each stayed registered and held its
/// CID for the group's life, so every later enter on that core took a temporary. The thread's next enter cannot tell
/// a forgotten guard from a live outer one (nested guards below), so until the thread exits the CID stays with the
/// forgotten guard, and the thread's later enters use another registration (the layer's unit tests check that they
/// are back on the fast path).
#[test]
fn forgotten_guards_are_given_back_at_thread_exit() {
    // One core, one CID per core; the explicit registration and the thread's make 2 users: per-CPU mode.
    let group = Group::builder().virtual_cpus(1).cids_per_core(1).build().unwrap();
    let mut other = group.register();
    let g = group.clone();
    thread::spawn(move || {
        let forgotten = g.enter();
        assert_eq!(forgotten.kind(), CidKind::Core(0));
        std::mem::forget(forgotten);
        for i in 0..100 {
            assert_eq!(g.enter().kind(), CidKind::Temporary, "enter {i}: core 0's CID stays with the forgotten guard");
        }
        assert_eq!(g.users(), 3, "the explicit one, the forgotten guard's, and the one the later enters park");
        // Live nested guards are never taken for forgotten ones; a forgotten nested one goes at thread exit too.
        let outer = g.enter();
        let inner = g.enter();
        assert_ne!(outer.cid(), inner.cid());
        std::mem::forget(inner);
        drop(outer);
        assert_eq!(g.stats().guards_forgotten, 0, "nothing given back before the thread exits");
    })
    .join()
    .unwrap();
    let s = group.stats();
    assert_eq!(group.users(), 1, "the thread's exit unregistered every registration of the thread: {s:?}");
    assert_eq!(s.guards_forgotten, 2, "the borrow and the nested temporary: {s:?}");
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 1, "core 0's CID alone: {audit:?}");
    assert_eq!(other.enter().kind(), CidKind::Core(0), "the core's CID is idle again");
    drop(other);
    assert_empty(&group);

    // A guard forgotten as the thread's last act: its registration is still the slot's, in use, when the slot's
    // closer runs.
    let group = Group::new();
    let g = group.clone();
    thread::spawn(move || std::mem::forget(g.enter())).join().unwrap();
    assert_empty(&group);
}

/// A guard held by a thread-local is still live when the layer's thread-locals are destroyed: its registration is
/// the slot's, in use, when the slot's closer runs. Its owner then drops it (the registration goes at once) or
/// passes it to `mem::forget` (the registration goes after the thread-local destructors, with what the guard held).
#[test]
fn guard_in_use_when_the_slot_closes_is_given_back_dropped_or_forgotten() {
    for forget in [false, true] {
        let (group, probe) = (Group::new(), Group::new());
        let seen = Arc::new(Mutex::new(None));
        let (g, p, out) = (group.clone(), probe.clone(), seen.clone());
        thread::spawn(move || {
            arm_hook(); // before the layer's thread-locals
            pool_a_probe(&p);
            drop(g.enter()); // G1 takes the slot, P2 goes to the pool
            let held = g.enter(); // G1, in use in the slot
            assert_eq!((g.users(), p.users()), (1, 2));
            let p2 = p.clone();
            run_after_the_layer(
                move || p2.users() == 0,
                move |late| {
                    if forget {
                        std::mem::forget(held);
                    } else {
                        drop(held);
                    }
                    *out.lock().unwrap() = Some((late, g.users()));
                },
            );
        })
        .join()
        .unwrap();
        let (late, users_then) = seen.lock().unwrap().take().expect("the late destructor ran");
        eprintln!("late destructor: handed on {} times, layer gone: {}", late.hops, late.layer_gone);
        assert!(late.layer_gone, "no destructor ran after the layer's ({late:?})");
        assert_eq!(
            users_then, forget as usize,
            "forget {forget}: a dropped guard's registration goes at once, a forgotten one's after the destructors"
        );
        assert_empty(&group);
        assert_empty(&probe);
    }
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
        let registered = Arc::new(Gate::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (groups, counters) = (groups.clone(), counters.clone());
                let (occ, payload, registered) = (occ.clone(), payload.clone(), registered.clone());
                thread::spawn(move || {
                    // Every thread registered in both groups before anyone goes on (the registrations stay
                    // parked until thread exit): 5 users over 2 cores, per-CPU in every wave whatever the timing.
                    groups.iter().for_each(|g| drop(g.enter()));
                    registered.wait();
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
        // Every wave starts with no user (the previous wave's threads have exited, thread-locals included) and
        // registers all 5 threads in both groups before they go on: over 2 cores, so per-CPU at least once a wave,
        // and back to per-task by the wave's end.
        assert!(stats.switches_to_per_cpu >= WAVES as u64, "group {i}: not per-CPU in every wave: {stats:?}");
        assert_eq!(payload[i].sum(), guards_taken[i], "group {i}: lost per-CID updates (I1/I8)");
        // I2 hard bound, users + K·cores: 5 threads with up to 2 registrations each (the parked one and a nested
        // guard's), and the cores' CID sets (where a thread stalls inside its guard, the core's other threads
        // borrow its extra CIDs: the more parallel the machine, the more of them in use at once).
        let hard = THREADS * 2 + groups[i].cids_per_core() * groups[i].cores();
        let max_cid = occ[i].max_seen.load(std::sync::atomic::Ordering::SeqCst);
        assert!(max_cid < hard, "group {i}: CID {max_cid} not below the hard bound {hard}");
        assert_empty(&groups[i]);
    }
    let expected: u64 = (0..WAVES as u64).map(|w| (1 + w) * THREADS as u64 * ROUNDS / 2).sum();
    assert_eq!(counters[0].sum() + counters[1].sum(), 2 * expected);
}
