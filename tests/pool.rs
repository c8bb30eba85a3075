//! `Pool<T>` (design.md §13): stress with an independent checker (every object carries an in-use flag that must be
//! clear when it is handed out, and a drop counter that must end equal to what the pool says it caches), objects
//! put back on other threads, reclaim after the group shrinks, the depot limit, panics in the factory and the reset
//! hook, foreign guards, forgotten handles and guards, bad builder input, and a forked child. Scenarios are forced
//! with virtual cores and threads that hold their guards at once, so they run the same on 2 CPUs or 128.

mod common;

use mmcid::{Error, Group, Pool, PoolStats};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

/// The independent checker: how many objects exist, counted by the objects themselves.
#[derive(Default)]
struct Checker {
    made: AtomicUsize,
    alive: AtomicIsize,
    /// Factory calls after which the factory panics (0: never).
    panic_after: AtomicUsize,
}

struct Obj {
    id: usize,
    in_use: AtomicBool,
    payload: [u8; 64],
    checker: Arc<Checker>,
}

impl Drop for Obj {
    fn drop(&mut self) {
        assert!(!self.in_use.load(SeqCst), "object {} dropped while in use", self.id);
        self.checker.alive.fetch_sub(1, SeqCst);
    }
}

fn factory(checker: &Arc<Checker>) -> impl Fn() -> Obj + Send + Sync + 'static {
    let checker = checker.clone();
    move || {
        let n = checker.made.fetch_add(1, SeqCst) + 1;
        let limit = checker.panic_after.load(SeqCst);
        if limit != 0 && n > limit {
            checker.made.fetch_sub(1, SeqCst);
            panic!("factory refuses object {n}");
        }
        checker.alive.fetch_add(1, SeqCst);
        Obj { id: n, in_use: AtomicBool::new(false), payload: [0; 64], checker: checker.clone() }
    }
}

/// Marks `o` handed out: it must not be out already.
fn hand_out(o: &mut Obj, tag: u8) {
    assert!(!o.in_use.swap(true, SeqCst), "object {} handed out twice at once", o.id);
    assert!(o.payload.iter().all(|&b| b == o.payload[0]), "object {} torn", o.id);
    o.payload = [tag; 64];
}

fn give_back(o: &Obj) {
    assert!(o.in_use.swap(false, SeqCst), "object {} given back but not out", o.id);
}

/// At quiescence with nothing out: the pool's accounting matches the objects' own count.
fn balanced(pool: &Pool<Obj>, checker: &Checker) -> PoolStats {
    let s = pool.stats();
    assert_eq!(s.live(), 0, "{s:?}");
    assert_eq!(s.created, checker.made.load(SeqCst) as u64, "{s:?}");
    assert_eq!(s.created, s.dropped + s.cached as u64, "objects lost or counted twice: {s:?}");
    assert_eq!(checker.alive.load(SeqCst), s.cached as isize, "objects alive vs cached: {s:?}");
    s
}

/// `threads` threads on a group of `vcpus` virtual cores, each mixing `get` handles, explicit take/put under a
/// registration's guard, bursts of several objects, and objects handed to other threads through a shared list.
fn stress(threads: usize, vcpus: usize) {
    let group = Group::builder().virtual_cpus(vcpus).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(4).depot_limit(4).build().unwrap();
    let ops = common::per_thread(3000, threads);
    let exchange: Mutex<Vec<Box<Obj>>> = Mutex::new(Vec::new());
    thread::scope(|s| {
        for t in 0..threads {
            let (pool, exchange, group) = (&pool, &exchange, &group);
            s.spawn(move || {
                let mut reg = group.register();
                let tag = t as u8;
                for i in 0..ops {
                    match i % 4 {
                        0 => {
                            let mut a = pool.get();
                            hand_out(&mut a, tag);
                            let mut b = pool.get();
                            hand_out(&mut b, tag);
                            give_back(&a);
                            give_back(&b);
                        }
                        1 => {
                            let mut guard = reg.enter();
                            let mut held: Vec<Box<Obj>> = (0..3).map(|_| pool.take(&mut guard)).collect();
                            held.iter_mut().for_each(|o| hand_out(o, tag));
                            for o in held {
                                give_back(&o);
                                pool.put(&mut guard, o);
                            }
                        }
                        2 => {
                            // Taken here, put back by whichever thread pops it next.
                            let mut o = pool.take(&mut reg.enter());
                            hand_out(&mut o, tag);
                            give_back(&o);
                            let other = {
                                let mut x = exchange.lock().unwrap();
                                x.push(o);
                                if x.len() > 2 {
                                    x.pop()
                                } else {
                                    None
                                }
                            };
                            if let Some(o) = other {
                                pool.put(&mut reg.enter(), o);
                            }
                        }
                        _ => {
                            let mut o = pool.get().into_box();
                            hand_out(&mut o, tag);
                            give_back(&o);
                            pool.put(&mut reg.enter(), o);
                        }
                    }
                }
            });
        }
    });
    let mut reg = group.register();
    for o in exchange.into_inner().unwrap() {
        pool.put(&mut reg.enter(), o);
    }
    let s = balanced(&pool, &checker);
    assert!(s.created > 0 && s.depot_full <= 4 && s.depot_empty <= 4, "{s:?}");
    // Bound: two magazines per slot and the depot.
    assert!(s.cached <= (2 * s.slots + 4) * 4, "{s:?}");
    drop(reg);
    drop(pool);
    assert_eq!(checker.alive.load(SeqCst), 0, "the pool's drop frees every cached object");
}

#[test]
fn stress_1_thread() {
    stress(1, 2);
}

#[test]
fn stress_2_threads() {
    stress(2, 2);
}

#[test]
fn stress_8_threads_on_2_cores() {
    stress(8, 2);
}

#[test]
fn stress_32_threads_on_2_cores() {
    stress(32, 2);
}

#[test]
fn stress_8_threads_on_64_cores() {
    stress(8, 64);
}

/// Producer → consumer: every object is taken on one thread and put back on another (another CID): full
/// magazines travel from the consumer's CID through the depot to the producer's.
#[test]
fn objects_put_back_on_another_thread_move_through_the_depot() {
    let group = Group::builder().virtual_cpus(2).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(8).depot_limit(4).build().unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel::<Box<Obj>>(16);
    thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            let mut reg = pool.group().register();
            for i in 0..5000u32 {
                let mut o = pool.take(&mut reg.enter());
                hand_out(&mut o, i as u8);
                tx.send(o).unwrap();
            }
        });
        s.spawn(move || {
            let mut reg = pool.group().register();
            for o in rx {
                give_back(&o);
                pool.put(&mut reg.enter(), o);
            }
        });
    });
    let s = balanced(&pool, &checker);
    assert!(s.depot_trips > 0, "{s:?}");
    // The producer got most objects back through the depot instead of the factory.
    assert!(s.created < 2500, "{s:?}");
}

/// `THREADS` threads register, hold their guards at once (so they carry distinct CIDs), take 3 new objects each and
/// put them back, and exit, dropping their registrations: the group shrinks to the main thread's registration.
/// Returns the threads' CIDs.
fn strand_objects(pool: &Pool<Obj>, threads: usize) -> Vec<usize> {
    let barrier = Barrier::new(threads);
    let mut cids: Vec<usize> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut reg = pool.group().register();
                    let mut guard = reg.enter();
                    barrier.wait(); // all hold their guards at once: distinct CIDs
                    let objs: Vec<_> = (0..3).map(|_| pool.take(&mut guard)).collect();
                    barrier.wait(); // every thread took before any puts back: 3 new objects each
                    let cid = guard.cid().get();
                    objs.into_iter().for_each(|o| pool.put(&mut guard, o));
                    cid
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    cids.sort_unstable();
    cids.dedup();
    assert_eq!(cids.len(), threads, "the threads held distinct CIDs: {cids:?}");
    cids
}

/// Per-task mode (16 virtual cores, 9 users): the exited threads' registrations gave their CIDs back, so `trim`
/// claims each, keeps one magazine in the depot (its limit) and frees the rest; the main thread's own CID, owned by
/// its registration, keeps its magazine.
#[test]
fn trim_after_the_group_shrinks_frees_the_magazines_of_high_cids() {
    const THREADS: usize = 8;
    let group = Group::builder().virtual_cpus(16).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(4).depot_limit(1).build().unwrap();
    let mut main_reg = group.register();
    {
        let mut guard = main_reg.enter();
        let objs: Vec<_> = (0..2).map(|_| pool.take(&mut guard)).collect();
        objs.into_iter().for_each(|o| pool.put(&mut guard, o));
    }
    let cids = strand_objects(&pool, THREADS);
    let before = balanced(&pool, &checker);
    assert_eq!((before.cached, before.created), (2 + 3 * THREADS, 2 + 3 * THREADS as u64), "{before:?}");
    assert!(group.max_cids() <= *cids.last().unwrap(), "the group converged below the threads' CIDs: {cids:?}");
    let freed = pool.trim();
    let after = balanced(&pool, &checker);
    // Each exited thread's slot had one magazine of 3; the depot keeps one of them; CID 0's 2 objects stay.
    assert_eq!(freed, 3 * (THREADS - 1), "{after:?}");
    assert_eq!((after.cached, after.depot_full, after.depot_objects), (2 + 3, 1, 3), "{after:?}");
    assert_eq!(after.reclaimed as usize, THREADS, "{after:?}");
    assert_eq!(after.magazines, 2, "the main slot's and the depot's: {after:?}");
    // The main thread's magazine is where it was, and the depot's serves the takes beyond it.
    let mut guard = main_reg.enter();
    let objs: Vec<_> = (0..5).map(|_| pool.take(&mut guard)).collect();
    assert_eq!(pool.stats().misses, before.misses, "served from the slot and the depot");
    objs.into_iter().for_each(|o| pool.put(&mut guard, o));
    drop(guard);
    drop(main_reg);
    // Nobody owns any CID now: everything goes to the depot (limit 1) or is freed.
    pool.trim();
    let last = balanced(&pool, &checker);
    assert!(last.cached <= 4 && last.cached == last.depot_objects && last.magazines <= 1, "{last:?}");
    assert_eq!(group.stats().cids_in_use, 0, "trim gave back every CID it claimed");
}

/// Per-CPU mode (2 virtual cores, 9 users): the threads' CIDs were their cores' (extra CIDs of each core's set,
/// and temporaries), which the cores keep while they are idle; once the last registration drops, nobody owns any
/// CID and `trim` empties every slot.
#[test]
fn trim_after_the_group_shrinks_on_2_cores() {
    let group = Group::builder().virtual_cpus(2).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(4).depot_limit(2).build().unwrap();
    let main_reg = group.register();
    strand_objects(&pool, 8);
    pool.trim(); // whatever is free now
    balanced(&pool, &checker);
    drop(main_reg);
    pool.trim();
    let last = balanced(&pool, &checker);
    assert_eq!(last.cached, last.depot_objects, "no slot keeps objects: {last:?}");
    assert!(last.cached <= 2 * 4 && last.depot_full <= 2, "{last:?}");
    assert_eq!(group.stats().cids_in_use, 0, "trim gave back every CID it claimed");
}

/// `trim` leaves alone the magazine of a CID a registration still owns, even while no guard holds it.
#[test]
fn trim_skips_cids_still_owned() {
    let group = Group::builder().virtual_cpus(4).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).depot_limit(0).build().unwrap();
    let mut reg = group.register();
    let mut guard = reg.enter();
    let o = pool.take(&mut guard);
    pool.put(&mut guard, o);
    drop(guard); // idle, but the registration owns its CID (per-task mode)
    assert_eq!(pool.trim(), 0);
    assert_eq!(pool.stats().cached, 1);
    drop(reg);
    assert_eq!(pool.trim(), 1, "depot limit 0: the reclaimed object is freed");
    balanced(&pool, &checker);
}

/// Takes that miss while the pool has more slots than `max_cids` reclaim the idle slots above it, so objects
/// stranded by exited threads come back without a `trim`.
#[test]
fn misses_reclaim_the_magazines_of_idle_high_cids() {
    let group = Group::builder().virtual_cpus(16).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(4).depot_limit(64).build().unwrap();
    let barrier = Barrier::new(8);
    thread::scope(|s| {
        for _ in 0..8 {
            let (pool, barrier) = (&pool, &barrier);
            s.spawn(move || {
                let mut reg = pool.group().register();
                let mut guard = reg.enter();
                barrier.wait();
                let objs: Vec<_> = (0..4).map(|_| pool.take(&mut guard)).collect();
                barrier.wait();
                objs.into_iter().for_each(|o| pool.put(&mut guard, o));
            });
        }
    });
    assert_eq!(pool.stats().cached, 32);
    // Threads of `scope` may still be finishing their thread-local teardown: registrations here are explicit and
    // dropped inside the closures, so every CID but the next one's is free now.
    let mut reg = group.register();
    let mut guard = reg.enter();
    assert!(pool.stats().slots > group.max_cids());
    let held: Vec<_> = (0..100).map(|_| pool.take(&mut guard)).collect();
    let s = pool.stats();
    assert!(s.reclaimed > 0, "{s:?}");
    assert!(s.created < 32 + 100, "stranded objects were reused: {s:?}");
    held.into_iter().for_each(|o| pool.put(&mut guard, o));
    drop(guard);
    balanced(&pool, &checker);
}

/// A put beyond the depot limit drops the object: the pool never caches more than two magazines per CID plus the
/// depot's limit.
#[test]
fn the_depot_limit_bounds_what_is_cached() {
    let group = Group::builder().virtual_cpus(4).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(4).depot_limit(2).build().unwrap();
    let mut reg = group.register();
    let mut guard = reg.enter();
    let objs: Vec<_> = (0..40).map(|_| pool.take(&mut guard)).collect();
    objs.into_iter().for_each(|o| pool.put(&mut guard, o));
    let s = balanced(&pool, &checker);
    assert_eq!((s.cached, s.depot_full, s.depot_objects, s.dropped), (16, 2, 8, 24), "{s:?}");
    // A second CID takes 20 (8 through the depot) and puts them back: it fills its own two magazines, then the depot.
    let mut reg2 = group.register();
    let mut guard2 = reg2.enter();
    let objs: Vec<_> = (0..20).map(|_| pool.take(&mut guard2)).collect();
    objs.into_iter().for_each(|o| pool.put(&mut guard2, o));
    let s = balanced(&pool, &checker);
    assert!(s.cached <= 2 * 2 * 4 + 2 * 4 && s.depot_full <= 2 && s.depot_empty <= 2, "{s:?}");
}

#[test]
fn a_panicking_factory_leaves_the_pool_as_it_was() {
    let group = Group::new();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(2).build().unwrap();
    checker.panic_after.store(2, SeqCst);
    let mut reg = group.register();
    let mut guard = reg.enter();
    let a = pool.take(&mut guard);
    let b = pool.take(&mut guard);
    let r = catch_unwind(AssertUnwindSafe(|| pool.take(&mut guard)));
    assert!(r.is_err(), "the third factory call panics");
    let r = catch_unwind(AssertUnwindSafe(|| drop(pool.get())));
    assert!(r.is_err(), "and so does get's");
    let s = pool.stats();
    assert_eq!((s.misses, s.created, s.cached), (4, 2, 0), "{s:?}");
    pool.put(&mut guard, a);
    pool.put(&mut guard, b);
    let again: Vec<_> = (0..2).map(|_| pool.take(&mut guard)).collect();
    assert_eq!(pool.stats().misses, 4, "served from the magazine");
    again.into_iter().for_each(|o| pool.put(&mut guard, o));
    drop(guard);
    balanced(&pool, &checker);
}

#[test]
fn a_panicking_reset_hook_drops_the_object_and_leaves_the_magazines_whole() {
    let group = Group::new();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker))
        .magazine_size(2)
        .reset(|o: &mut Obj| {
            if o.payload[0] == 0xff {
                panic!("reset refuses object {}", o.id);
            }
            o.payload = [0; 64];
        })
        .build()
        .unwrap();
    let mut reg = group.register();
    let mut guard = reg.enter();
    let objs: Vec<_> = (0..5).map(|_| pool.take(&mut guard)).collect();
    for (i, mut o) in objs.into_iter().enumerate() {
        if i == 2 {
            o.payload = [0xff; 64];
            let r = catch_unwind(AssertUnwindSafe(|| pool.put(&mut guard, o)));
            assert!(r.is_err());
        } else {
            o.payload = [1; 64];
            pool.put(&mut guard, o);
        }
    }
    let s = balanced(&pool, &checker);
    assert_eq!((s.created, s.dropped, s.cached), (5, 1, 4), "{s:?}");
    // The magazines still work, and every cached object was reset.
    let objs: Vec<_> = (0..4).map(|_| pool.take(&mut guard)).collect();
    assert!(objs.iter().all(|o| o.payload == [0; 64]));
    assert_eq!(pool.stats().misses, 5);
    objs.into_iter().for_each(|o| pool.put(&mut guard, o));
    drop(guard);
    // A handle dropped while its thread unwinds skips the hook and drops the object.
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _held = pool.get();
        panic!("unwinding with a handle");
    }));
    assert!(r.is_err());
    let s = balanced(&pool, &checker);
    assert_eq!(s.dropped, 2, "{s:?}");
}

#[test]
fn foreign_guards_are_refused_with_a_typed_error() {
    let (ours, theirs) = (Group::new(), Group::new());
    let checker = Arc::new(Checker::default());
    let pool = Pool::new(&ours, factory(&checker));
    let mut reg = theirs.register();
    let mut guard = reg.enter();
    assert_eq!(pool.try_take(&mut guard).err().map(|e| e.to_string()), Some(Error::ForeignGuard.to_string()));
    let obj = Box::new(factory(&checker)());
    assert_eq!(pool.try_put(&mut guard, obj), Err(Error::ForeignGuard));
    assert_eq!(checker.alive.load(SeqCst), 0, "try_put dropped the object");
    let r = catch_unwind(AssertUnwindSafe(|| drop(pool.take(&mut guard))));
    let msg = *r.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains("another group"), "{msg}");
    assert_eq!(pool.stats().slots, 0, "a foreign guard touches no slot");
}

#[test]
fn forgotten_handles_and_guards_leave_the_pool_sound() {
    let group = Group::new();
    let checker = Arc::new(Checker::default());
    let pool = Pool::new(&group, factory(&checker));
    std::mem::forget(pool.get()); // one object leaked, never back
    assert_eq!(pool.stats().live(), 1);
    let mut reg = group.register();
    let mut guard = reg.enter();
    let o = pool.take(&mut guard);
    std::mem::forget(guard); // the CID stays held until the registration's next enter
    let mut guard = reg.enter();
    pool.put(&mut guard, o);
    let o = pool.take(&mut guard);
    pool.put(&mut guard, o);
    drop(guard);
    let s = pool.stats();
    assert_eq!((s.created, s.cached, s.live()), (2, 1, 1), "{s:?}");
    drop(pool);
    assert_eq!(checker.alive.load(SeqCst), 1, "only the forgotten handle's object is left");
}

#[test]
fn bad_builder_input_is_a_typed_error() {
    let group = Group::new();
    let build = |m: usize, d: Option<usize>| {
        let b = Pool::builder(&group, || 0u8).magazine_size(m);
        match d {
            Some(d) => b.depot_limit(d).build(),
            None => b.build(),
        }
    };
    for m in [0, (1 << 16) + 1, usize::MAX] {
        let err = build(m, None).unwrap_err();
        assert_eq!(err, Error::ValueOutOfRange { what: "magazine_size", value: m, min: 1, max: 1 << 16 });
        assert!(err.to_string().starts_with("magazine_size is"), "{err}");
    }
    let err = build(8, Some(usize::MAX)).unwrap_err();
    assert_eq!(err, Error::ValueOutOfRange { what: "depot_limit", value: usize::MAX, min: 0, max: 1 << 20 });
    assert!(build(1, Some(0)).is_ok() && build(1 << 16, Some(1 << 20)).is_ok(), "the bounds themselves are accepted");
}

/// A child forked while other threads use the pool (one of which may hold the depot's lock at the fork) takes and
/// puts through handles and guards, and trims; its own objects all come back.
#[test]
fn a_forked_child_can_use_the_pool() {
    let group = Group::builder().virtual_cpus(2).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Arc::new(Pool::builder(&group, factory(&checker)).magazine_size(2).depot_limit(2).build().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..2)
        .map(|_| {
            let (pool, stop) = (pool.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(SeqCst) {
                    let held: Vec<_> = (0..5).map(|_| pool.get()).collect();
                    drop(held);
                }
                pool.group().leave_thread();
            })
        })
        .collect();
    for _ in 0..20 {
        // SAFETY: fork has no preconditions; the child only runs the closure below and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let child = || {
                // Objects the parent's other threads had out at the fork stay out in the child (their threads are
                // not here): the child's own takes and puts must balance.
                let live = pool.stats().live();
                for _ in 0..1000 {
                    let held: Vec<_> = (0..5).map(|_| pool.get()).collect();
                    drop(held);
                }
                let mut reg = pool.group().register();
                let mut guard = reg.enter();
                let o = pool.take(&mut guard);
                pool.put(&mut guard, o);
                drop(guard);
                drop(reg);
                pool.trim();
                pool.stats().live() == live
            };
            let ok = catch_unwind(AssertUnwindSafe(child)).unwrap_or(false);
            // SAFETY: _exit has no preconditions.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        let deadline = std::time::Instant::now() + common::patience(10);
        let status = loop {
            let mut status = 0;
            // SAFETY: `pid` is our child; `status` is a valid out-pointer.
            let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if rc == pid {
                break Some(status);
            }
            if std::time::Instant::now() >= deadline {
                // SAFETY: our own unreaped child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break None;
            }
            thread::sleep(std::time::Duration::from_millis(1));
        };
        let status = status.expect("the child hung");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    }
    stop.store(true, SeqCst);
    churners.into_iter().for_each(|c| c.join().unwrap());
    let pool = Arc::into_inner(pool).unwrap();
    balanced(&pool, &checker);
}

/// A thread that exits leaves its objects in its CID's magazine; the next take that misses (its own magazines and
/// the depot empty) reclaims them before calling the factory, with no `trim` and however few slots the pool has
/// (thread churn: nothing stays stranded).
#[test]
fn a_miss_finds_the_magazine_of_an_exited_thread() {
    let group = Group::builder().virtual_cpus(16).build().unwrap();
    let checker = Arc::new(Checker::default());
    let pool = Pool::builder(&group, factory(&checker)).magazine_size(8).depot_limit(4).build().unwrap();
    let mut reg = group.register();
    let mut guard = reg.enter(); // holds a CID, so the thread below takes another one
    thread::scope(|s| {
        s.spawn(|| {
            let mut reg = pool.group().register();
            let mut guard = reg.enter();
            let objs: Vec<_> = (0..3).map(|_| pool.take(&mut guard)).collect();
            objs.into_iter().for_each(|o| pool.put(&mut guard, o));
        }); // its registration drops: its CID is free, its magazine holds 3 objects
    });
    let s = pool.stats();
    assert_eq!((s.slots, s.cached, s.created), (1, 3, 3), "{s:?}");
    assert!(s.slots <= group.max_cids());
    let held: Vec<_> = (0..3).map(|_| pool.take(&mut guard)).collect();
    let s = pool.stats();
    assert_eq!((s.created, s.reclaimed), (3, 1), "the exited thread's objects were reused: {s:?}");
    held.into_iter().for_each(|o| pool.put(&mut guard, o));
    drop(guard);
    balanced(&pool, &checker);
}
