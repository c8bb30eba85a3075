//! Model 16: the per-CID object cache (`Pool`, design.md §13; the orderings are in `src/pool.rs` and
//! `Bitmap::try_claim`). A CID's magazines are plain memory behind a loom `UnsafeCell`, so two accesses to one
//! slot that happens-before does not order (a reclaim against the CID's holder, or against its last holder's
//! writes) are a reported causality violation. The objects carry a loom cell too, written before a put and read
//! after a take, so an object handed over without an ordering is reported the same way, and an in-use flag that
//! catches an object handed out twice.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering::Relaxed};
use loom::thread;
use mmcid::{Group, Mutant, Pool};
use mmcid_loom_tests::{model, Reg};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Executions that reached the scenario a model is about (std atomics: counted across loom's executions, outside
/// the model), so that a model that stopped reaching it fails instead of passing vacuously.
static REACHED: AtomicUsize = AtomicUsize::new(0);
/// Executions of 16b where the consumer took an object the producer wrote (through the depot).
static DEPOT_HANDOVERS: AtomicUsize = AtomicUsize::new(0);
/// Executions of 16c where the consumer got the producer's object through a reclaim.
static REACHED_C: AtomicUsize = AtomicUsize::new(0);

/// A pooled object: a payload written by whoever holds it, and a flag that must be clear when it is handed out.
struct Obj {
    payload: UnsafeCell<u64>,
    in_use: AtomicBool,
}

// SAFETY: deliberately shared only through the pool: whoever holds the `Box` is its only user, and loom's cell
// records every access, so a hand-over without happens-before is reported, never undefined behaviour.
unsafe impl Sync for Obj {}

fn obj() -> Obj {
    Obj { payload: UnsafeCell::new(0), in_use: AtomicBool::new(false) }
}

/// Marks `o` taken (it must not be in use already) and writes `v` into it after reading what it held.
fn use_obj(o: &Obj, v: u64) -> u64 {
    assert!(!o.in_use.swap(true, Relaxed), "an object handed out twice at once");
    // SAFETY: loom's cell, checked: see `Obj`.
    let old = o.payload.with_mut(|p| unsafe { std::mem::replace(&mut *p, v) });
    o.in_use.store(false, Relaxed);
    old
}

/// Two virtual cores, per-task mode: each registration owns its CID from birth until it drops.
fn pool(mutant: Mutant, magazine: usize, depot: usize) -> Arc<Pool<Obj>> {
    let group = Group::builder().virtual_cpus(2).mutant(mutant).build().unwrap();
    Arc::new(Pool::builder(&group, obj).magazine_size(magazine).depot_limit(depot).build().unwrap())
}

/// `created == dropped + cached` once every object is back.
fn balanced(pool: &Pool<Obj>) {
    let s = pool.stats();
    assert_eq!(s.created, s.dropped + s.cached as u64, "objects lost or counted twice: {s:?}");
}

/// 16a: a reclaim against the CID it reclaims. T1 owns CID 0 (its registration, made by the main thread), takes an
/// object (a miss: the factory), writes it, puts it back (its slot's first magazine) and drops its registration,
/// which frees CID 0; T2 trims at the same time. The trim may find CID 0 owned (skip), or free after T1's drop: it
/// must then claim it and see T1's magazine writes (the claim's Acquire against the unregister's Release clear).
fn reclaim_vs_holder(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let pool = pool(mutant, 2, 2);
        let r1 = Reg::new(pool.group(), 0);
        let t1 = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut r1 = r1;
                let mut guard = r1.enter();
                let o = pool.take(&mut guard);
                use_obj(&o, 1);
                pool.put(&mut guard, o);
                drop(guard);
                drop(r1);
            })
        };
        let t2 = {
            let pool = pool.clone();
            thread::spawn(move || {
                assert_eq!(pool.trim(), 0, "depot limit 2: nothing to drop");
            })
        };
        t1.join().unwrap();
        t2.join().unwrap();
        balanced(&pool);
        if mutant == Mutant::None && pool.stats().reclaimed > 0 {
            REACHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // The object is in the depot (reclaimed) or still in CID 0's slot: a new holder of CID 0 gets it either way.
        let mut r = Reg::new(pool.group(), 0);
        let mut guard = r.enter();
        let o = pool.take(&mut guard);
        assert_eq!(use_obj(&o, 2), 1, "the object written before the put");
        pool.put(&mut guard, o);
        drop(guard);
        assert_eq!(pool.stats().created, 1);
    });
}

#[test]
fn pool_reclaim_vs_holder() {
    REACHED.store(0, std::sync::atomic::Ordering::Relaxed);
    reclaim_vs_holder("pool_reclaim_vs_holder", Mutant::None);
    assert!(REACHED.load(std::sync::atomic::Ordering::Relaxed) > 0, "no execution reclaimed CID 0's magazine");
}

/// The reclaim checks the CID's bit instead of claiming it: it empties the slot while T1 uses it, or without
/// seeing T1's writes.
#[test]
#[should_panic(expected = "Causality violation")]
fn pool_reclaim_vs_holder_mutant_unclaimed() {
    reclaim_vs_holder("pool_reclaim_vs_holder_mutant_unclaimed", Mutant::PoolReclaimUnclaimed);
}

/// The claim is a Relaxed `fetch_or`: it takes CID 0 after T1's drop without seeing T1's magazine writes.
#[test]
#[should_panic(expected = "Causality violation")]
fn pool_reclaim_vs_holder_mutant_relaxed_claim() {
    reclaim_vs_holder("pool_reclaim_vs_holder_mutant_relaxed_claim", Mutant::RelaxedPoolClaim);
}

/// 16b: the depot exchange between two CIDs, magazines of one object. The producer (CID 0) takes three objects
/// (misses), writes each, and puts them back: its third put sends its full `previous` magazine to the depot. The
/// consumer (CID 1) takes one object at the same time: from the depot if the producer's magazine is there (and it
/// must then see what the producer wrote), else from the factory; it writes it and puts it back. Depot limit 1:
/// the consumer's put may meet a full depot and drop. Checks: no object out twice at once, the payload hand-over
/// through the depot (its mutex), nothing lost (`created == dropped + cached`), the depot within its limit.
fn depot_exchange(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let pool = pool(mutant, 1, 1);
        let (r0, r1) = (Reg::new(pool.group(), 0), Reg::new(pool.group(), 1));
        let producer = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut r0 = r0;
                let mut guard = r0.enter();
                let objs: Vec<_> = (0..3).map(|_| pool.take(&mut guard)).collect();
                for (i, o) in objs.iter().enumerate() {
                    use_obj(o, 10 + i as u64);
                }
                for o in objs {
                    pool.put(&mut guard, o);
                }
                drop(guard);
                r0
            })
        };
        let consumer = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut r1 = r1;
                let mut guard = r1.enter();
                let o = pool.take(&mut guard);
                let seen = use_obj(&o, 20);
                assert!(matches!(seen, 0 | 10..=12), "payload {seen}: neither new nor the producer's");
                if mutant == Mutant::None && seen != 0 {
                    DEPOT_HANDOVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                pool.put(&mut guard, o);
                drop(guard);
                r1
            })
        };
        let r0 = producer.join().unwrap();
        let r1 = consumer.join().unwrap();
        balanced(&pool);
        let s = pool.stats();
        assert!(s.depot_full <= 1 && s.depot_empty <= 1, "depot limit 1 exceeded: {s:?}");
        drop((r0, r1));
    });
}

#[test]
fn pool_depot_exchange() {
    DEPOT_HANDOVERS.store(0, std::sync::atomic::Ordering::Relaxed);
    depot_exchange("pool_depot_exchange", Mutant::None);
    assert!(DEPOT_HANDOVERS.load(std::sync::atomic::Ordering::Relaxed) > 0, "the consumer never got the producer's");
}

/// 16c: an object moved between CIDs by a reclaim. The producer (CID 0) takes an object, writes it, puts it back
/// and drops its registration; a trim meanwhile may reclaim CID 0's magazine into the depot; the consumer (CID 1)
/// takes an object: the producer's, through the depot, if the trim got there first (it must then see the payload:
/// the producer's Release clear, the claim's Acquire, the depot's lock), else a new one. Checks as in 16b.
fn reclaim_to_another_cid(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let pool = pool(mutant, 1, 1);
        let (r0, r1) = (Reg::new(pool.group(), 0), Reg::new(pool.group(), 1));
        let producer = {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut r0 = r0;
                let mut guard = r0.enter();
                let o = pool.take(&mut guard);
                use_obj(&o, 10);
                pool.put(&mut guard, o);
                drop(guard);
                drop(r0);
            })
        };
        let trimmer = {
            let pool = pool.clone();
            thread::spawn(move || {
                pool.trim();
            })
        };
        let mut r1 = r1;
        {
            let mut guard = r1.enter();
            let o = pool.take(&mut guard);
            let seen = use_obj(&o, 20);
            assert!(matches!(seen, 0 | 10), "payload {seen}: neither new nor the producer's");
            if mutant == Mutant::None && seen == 10 {
                REACHED_C.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            pool.put(&mut guard, o);
        }
        producer.join().unwrap();
        trimmer.join().unwrap();
        balanced(&pool);
        drop(r1);
    });
}

/// 16c: the real code.
#[test]
fn pool_reclaim_to_another_cid() {
    REACHED_C.store(0, std::sync::atomic::Ordering::Relaxed);
    reclaim_to_another_cid("pool_reclaim_to_another_cid", Mutant::None);
    assert!(REACHED_C.load(std::sync::atomic::Ordering::Relaxed) > 0, "no object went through a reclaim");
}

/// 16c with the reclaim checking the bit instead of claiming the CID.
#[test]
#[should_panic(expected = "Causality violation")]
fn pool_reclaim_to_another_cid_mutant_unclaimed() {
    reclaim_to_another_cid("pool_reclaim_to_another_cid_mutant_unclaimed", Mutant::PoolReclaimUnclaimed);
}

/// 16c with a Relaxed claim.
#[test]
#[should_panic(expected = "Causality violation")]
fn pool_reclaim_to_another_cid_mutant_relaxed_claim() {
    reclaim_to_another_cid("pool_reclaim_to_another_cid_mutant_relaxed_claim", Mutant::RelaxedPoolClaim);
}
