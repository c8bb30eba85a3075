//! Sharded data: `PerCid<T>` and `ShardedCounter` under churn, shard lifetime, foreign guards, growth and
//! memory. Every test can fail: conservation and list tests count exactly, lifetime tests count drops,
//! growth compares addresses, the memory test compares shards with `max_cids`.

mod common;

use common::{patience, Gate, StopOnDrop};
use mmcid::{Cid, CidGuard, CpuSet, Error, Group, PerCid, Registration, ShardedCounter, SharedPerCid};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread;

/// Batches of threads per churn test; each batch crosses the mode boundary both ways.
const ROUNDS: usize = 16;
/// Threads per batch: with 4 virtual cores, 5 registered users switch to per-CPU mode (users > max_cids = 4),
/// and the switch back happens below 2 users, when the batch is gone.
const BATCH: usize = 5;
/// Operations per batch thread.
const OPS: u64 = 1_000;

/// A group whose mode boundary a handful of threads cross both ways: one CID per core (the kernel's rules), so that
/// the occupancy switch (design.md §3.1) never keeps it in per-task mode across batches.
fn churn_group() -> Group {
    Group::builder().virtual_cpus(4).cids_per_core(1).build().expect("4 virtual cores")
}

/// Runs `ROUNDS` batches of `BATCH` threads, each `batch(t, barrier)`, while `background()` runs on a long-lived
/// thread until the last batch is joined. Batch threads are joined explicitly (so their thread-local
/// registrations are gone, the switch back to per-task has happened). Returns the background's result.
fn churn<R: Send>(
    group: &Group,
    background: impl FnOnce(&AtomicBool) -> R + Send,
    batch: impl Fn(usize, &Gate) + Sync,
) -> R {
    let stop = AtomicBool::new(false);
    let before = group.stats();
    let result = thread::scope(|s| {
        let bg = s.spawn(|| background(&stop));
        // Stops the background thread however the batches end: a failed batch must fail the test, not hang it.
        let _stop = StopOnDrop(&stop);
        for _ in 0..ROUNDS {
            let barrier = Gate::new(BATCH);
            thread::scope(|inner| {
                let handles: Vec<_> = (0..BATCH)
                    .map(|t| {
                        inner.spawn({
                            let (batch, barrier) = (&batch, &barrier);
                            move || batch(t, barrier)
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().expect("batch thread");
                }
            });
        }
        stop.store(true, Relaxed);
        bg.join().expect("background thread")
    });
    let after = group.stats();
    assert!(
        after.switches_to_per_cpu - before.switches_to_per_cpu >= ROUNDS as u64,
        "each batch must switch to per-CPU mode: {after:?}"
    );
    assert!(
        after.switches_to_per_task - before.switches_to_per_task >= ROUNDS as u64,
        "each batch's exit must switch back to per-task mode: {after:?}"
    );
    result
}

#[test]
fn counter_conservation_under_churn() {
    let group = churn_group();
    let counter = ShardedCounter::new(&group);
    let expected = AtomicU64::new(0);
    let background = |stop: &AtomicBool| {
        // Adds and subtracts through the thread-local path (one user) while batches register, drop and switch
        // modes; a minimum number of operations, then until told to stop (no timing involved).
        let mut net = 0u64;
        let mut i = 0u64;
        while i < 2_000 || !stop.load(Relaxed) {
            let v = i % 7;
            if i % 3 == 2 {
                counter.sub(v);
                net = net.wrapping_sub(v);
            } else {
                counter.add(v);
                net = net.wrapping_add(v);
            }
            i += 1;
        }
        net
    };
    let batch = |t: usize, barrier: &Gate| {
        let mut reg = group.register();
        barrier.wait(); // the whole batch is registered: per-CPU mode
        let mut net = 0u64;
        for i in 0..OPS {
            let v = (i * 13 + t as u64) % 11;
            match i % 4 {
                0 => {
                    counter.add(v); // thread-local registration: one more user
                    net = net.wrapping_add(v);
                }
                1 => {
                    counter.add_with(&reg.enter(), v);
                    net = net.wrapping_add(v);
                }
                2 => {
                    counter.sub_with(&reg.enter(), v + 3); // often below its shard's value: wraps
                    net = net.wrapping_sub(v + 3);
                }
                _ => {
                    counter.sub(v);
                    net = net.wrapping_sub(v);
                }
            }
            if i == OPS / 2 {
                // Membership changes while the others count.
                drop(std::mem::replace(&mut reg, group.register()));
            }
        }
        expected.fetch_add(net, Relaxed);
    };
    let net = churn(&group, background, batch);
    expected.fetch_add(net, Relaxed);
    assert_eq!(counter.sum(), expected.load(Relaxed), "no add or sub lost, none counted twice");
    // I2 hard bound: every CID is below users + cores as its allocator saw them, so the shards (one per CID ever
    // handed out) are at most the most users at once + cores. Users at once: the background thread's thread-local
    // registration, and per batch thread up to 3: its thread-local one (`counter.add`), `reg`, and during
    // `mem::replace(&mut reg, group.register())` the new one, registered before the old one is dropped. Batches
    // do not overlap: each is joined (thread-local destructors included) before the next starts.
    let most_users = 1 + 3 * BATCH;
    assert!(counter.shards_allocated() <= most_users + group.cores(), "{counter:?}");
}

/// Conservation on the machine's real cores, where per-CPU adds are restartable sequences (design.md §9.2) when
/// the platform has rseq: 4 threads per core add and subtract through `add`/`sub` (some of them must commit as
/// sequences, `Stats::counter_sequences`; the share is printed) and, one operation in
/// eight, under a guard of their own registration (`add_with`); 100 000 operations per thread and round on 2
/// cores, the same total spread over the threads of a larger machine (`common::per_thread`); threads
/// re-register every round, so the group crosses into per-CPU mode (on 2 cores it goes back only at the end).
/// The same with rseq off. It checks the whole-counter bookkeeping across both paths; the races themselves are
/// checked where they can be forced: `counter::tests::sequence_adds_never_touch_a_held_cid` (a guard holder and
/// sequence adders on one pinned CPU) and loom models 11d/11e (holder and sweep).
#[test]
fn counter_conservation_with_sequence_adds_on_real_cores() {
    for rseq in [true, false] {
        let group = Group::builder().restartable_sequences(rseq).build().unwrap();
        let counter = ShardedCounter::new(&group);
        let threads = 4 * group.cpus().len();
        let ops = common::per_thread(100_000, threads);
        let start = Gate::new(threads);
        let nets: Vec<u64> = thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (group, counter, start) = (&group, &counter, &start);
                    s.spawn(move || {
                        let mut net = 0u64;
                        for round in 0..4u64 {
                            let mut reg = group.register();
                            start.wait(); // every round runs all threads at once
                            for i in 0..ops {
                                let v = (i * 7 + t as u64 + round) % 13;
                                match i % 8 {
                                    3 => {
                                        counter.add_with(&reg.enter(), v);
                                        net = net.wrapping_add(v);
                                    }
                                    5 | 6 => {
                                        counter.sub(v);
                                        net = net.wrapping_sub(v);
                                    }
                                    _ => {
                                        counter.add(v);
                                        net = net.wrapping_add(v);
                                    }
                                }
                            }
                            drop(reg);
                            group.leave_thread();
                        }
                        net
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expected = nets.iter().fold(0u64, |a, &b| a.wrapping_add(b));
        assert_eq!(counter.sum(), expected, "rseq {rseq}: an add or sub lost or counted twice");
        let stats = group.stats();
        assert!(stats.switches_to_per_cpu >= 1 && stats.enter_cpu_fast > 0, "rseq {rseq}: {stats:?}");
        // Where rseq is on, some adds were sequences (not just possible ones): else this test checked only the
        // in-place enter. Off, none is. No floor on the share: a sequence aborts whenever its thread is preempted
        // or migrated inside it and then falls back to the guard path, so on a loaded machine the share depends on
        // the scheduler (on an idle 2-core machine it is most of the adds); a regression that stops sequences from
        // committing at all still fails here, and the printed share shows a partial one.
        let adds = threads as u64 * 4 * ops * 7 / 8;
        match rseq && group.uses_rseq() {
            true => {
                eprintln!(
                    "rseq: {} of {adds} adds and subs outside add_with committed as sequences ({:.1} %)",
                    stats.counter_sequences,
                    100.0 * stats.counter_sequences as f64 / adds as f64
                );
                assert!(stats.counter_sequences > 0, "no add committed as a sequence ({adds} adds): {stats:?}");
            }
            false => assert_eq!(stats.counter_sequences, 0, "{stats:?}"),
        }
        assert_eq!(group.users(), 0);
        assert_eq!(stats.cids_in_use, 0, "rseq {rseq}: {stats:?}");
    }
}

/// Item ids: thread tag in the high half, sequence number in the low half.
fn item(tag: u64, seq: u64) -> u64 {
    (tag << 32) | seq
}

/// One step of the list test inside `guard`: push what we hold, or make an item, or pop one into our hand.
/// Returns the item made, if any.
fn list_step(lists: &PerCid<Vec<u64>>, guard: &mut CidGuard<'_>, hand: &mut Option<u64>, fresh: u64) -> Option<u64> {
    let list = lists.get_mut(guard);
    if let Some(x) = hand.take() {
        list.push(x);
        None
    } else if fresh % 5 == 0 || list.is_empty() {
        list.push(fresh);
        Some(fresh)
    } else {
        *hand = list.pop();
        None
    }
}

#[test]
fn per_cid_vec_loses_and_duplicates_nothing_under_churn() {
    // The kernel selftests' list test: items move between shards (pop in one guard, push in the next, whose CID
    // may differ); at the end every item made is in exactly one shard.
    let group = churn_group();
    let mut lists: PerCid<Vec<u64>> = PerCid::new(&group);
    let made = Mutex::new(Vec::new());
    let next_tag = AtomicU64::new(1);
    let background = |stop: &AtomicBool| {
        let tag = next_tag.fetch_add(1, Relaxed);
        let (mut mine, mut hand, mut seq) = (Vec::new(), None, 0u64);
        while seq < 2_000 || !stop.load(Relaxed) {
            let mut guard = group.enter();
            mine.extend(list_step(&lists, &mut guard, &mut hand, item(tag, seq)));
            seq += 1;
        }
        if let Some(x) = hand {
            lists.get_mut(&mut group.enter()).push(x);
        }
        mine
    };
    let batch = |t: usize, barrier: &Gate| {
        let tag = next_tag.fetch_add(1, Relaxed);
        let mut reg = group.register();
        barrier.wait();
        let (mut mine, mut hand) = (Vec::new(), None);
        for seq in 0..OPS {
            let fresh = item(tag, seq);
            if (seq + t as u64) % 3 == 0 {
                mine.extend(list_step(&lists, &mut group.enter(), &mut hand, fresh));
            } else {
                mine.extend(list_step(&lists, &mut reg.enter(), &mut hand, fresh));
            }
            if seq == OPS / 2 {
                drop(std::mem::replace(&mut reg, group.register()));
            }
        }
        if let Some(x) = hand {
            lists.get_mut(&mut reg.enter()).push(x);
        }
        made.lock().unwrap().extend(mine);
    };
    let bg_made = churn(&group, background, batch);
    let mut made = made.into_inner().unwrap();
    made.extend(bg_made);
    made.sort_unstable();
    let mut found: Vec<u64> = lists.iter_mut().flat_map(|(_, list)| list.drain(..)).collect();
    found.sort_unstable();
    assert!(!made.is_empty());
    let dups = found.windows(2).filter(|w| w[0] == w[1]).count();
    assert_eq!(dups, 0, "items duplicated");
    assert_eq!(found.len(), made.len(), "items lost or invented");
    assert_eq!(found, made);
}

/// A shard value that counts its drops.
struct Counted {
    drops: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Relaxed);
    }
}

/// A 3-core virtual group and a `PerCid` whose shards `make(index, drops)` builds; returns the counters of shards
/// made and dropped.
fn counting_per_cid<T>(
    make: fn(usize, &Arc<AtomicUsize>) -> T,
) -> (Group, PerCid<T>, Arc<AtomicUsize>, Arc<AtomicUsize>)
where
    T: Send + 'static,
{
    let group = Group::builder().virtual_cpus(3).build().unwrap();
    let (made, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let per_cid = PerCid::with(&group, {
        let (made, drops) = (made.clone(), drops.clone());
        move || make(made.fetch_add(1, Relaxed), &drops)
    });
    (group, per_cid, made, drops)
}

#[test]
fn drop_drops_every_allocated_shard_exactly_once() {
    let (group, per_cid, made, drops) = counting_per_cid(|_, drops| Counted { drops: drops.clone() });
    // Six nested guards: six distinct CIDs (I1), past max_cids (per-CPU mode, temporary CIDs).
    let mut regs: Vec<Registration> = (0..6).map(|_| group.register()).collect();
    let mut guards: Vec<CidGuard<'_>> = regs.iter_mut().map(|r| r.enter()).collect();
    // Six shards, one per guard, each made once: the second pass finds every guard's shard where the first left it.
    let first: Vec<usize> = guards.iter_mut().map(|g| per_cid.get_mut(g) as *mut Counted as usize).collect();
    let mut distinct = first.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "six live CIDs, six shards: {first:?}");
    let again: Vec<usize> = guards.iter_mut().map(|g| per_cid.get_mut(g) as *mut Counted as usize).collect();
    assert_eq!(again, first, "a shard moved or was made twice");
    assert_eq!(made.load(Relaxed), 6);
    // Other threads add shards of their own CIDs.
    thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let _ = per_cid.get_mut(&mut group.enter());
            });
        }
    });
    drop(guards);
    drop(regs);
    let shards = per_cid.shards_allocated();
    assert!(shards >= 6, "six CIDs were live at once");
    assert_eq!(made.load(Relaxed), shards, "one init per shard");
    assert_eq!(drops.load(Relaxed), 0, "nothing dropped while the PerCid lives");
    drop(per_cid);
    assert_eq!(drops.load(Relaxed), shards, "every shard dropped exactly once");

    // A PerCid that never allocated drops nothing.
    let empty = PerCid::with(&group, {
        let drops = drops.clone();
        move || Counted { drops: drops.clone() }
    });
    drop(empty);
    assert_eq!(drops.load(Relaxed), shards);
}

/// A shard whose drop panics for one chosen shard: the other shards are still dropped (found in review:
/// the panic used to leak every later shard and the segments).
struct PanicsOnDrop {
    id: usize,
    panic_id: usize,
    drops: Arc<AtomicUsize>,
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Relaxed);
        if self.id == self.panic_id {
            panic!("shard {} refuses to drop", self.id);
        }
    }
}

#[test]
fn a_panicking_shard_drop_drops_the_others() {
    // The first shard made panics when dropped.
    let (group, per_cid, _, drops) =
        counting_per_cid(|id, drops| PanicsOnDrop { id, panic_id: 0, drops: drops.clone() });
    let mut regs: Vec<Registration> = (0..3).map(|_| group.register()).collect();
    let mut guards: Vec<CidGuard<'_>> = regs.iter_mut().map(|r| r.enter()).collect();
    for g in guards.iter_mut() {
        let _ = per_cid.get_mut(g);
    }
    drop(guards);
    drop(regs);
    let shards = per_cid.shards_allocated();
    assert_eq!(shards, 3);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(per_cid)));
    assert!(result.is_err(), "the shard's panic propagates");
    assert_eq!(drops.load(Relaxed), shards, "every shard dropped once, the panicking one included");
}

#[test]
fn foreign_guards_are_rejected() {
    let (ours, theirs) = (Group::new(), Group::new());
    let per_cid: PerCid<u64> = PerCid::new(&ours);
    let counter = ShardedCounter::new(&ours);
    let mut reg = theirs.register();
    let mut guard = reg.enter();
    assert_eq!(per_cid.try_get_mut(&mut guard), Err(Error::ForeignGuard));
    assert_eq!(counter.try_add_with(&guard, 1), Err(Error::ForeignGuard));
    drop(guard);
    assert_eq!((per_cid.shards_allocated(), counter.shards_allocated(), counter.sum()), (0, 0, 0));

    // A clone of the group is the same group.
    let mut reg = ours.clone().register();
    let mut guard = reg.enter();
    *per_cid.get_mut(&mut guard) += 1;
    counter.add_with(&guard, 1);
    assert_eq!((per_cid.shards_allocated(), counter.sum()), (1, 1));
}

#[test]
#[should_panic(expected = "the guard belongs to another group")]
fn foreign_guard_panics_in_get_mut() {
    let per_cid: PerCid<u64> = PerCid::new(&Group::new());
    let other = Group::new();
    let mut reg = other.register();
    let mut guard = reg.enter();
    let _ = per_cid.get_mut(&mut guard);
}

#[test]
#[should_panic(expected = "the guard belongs to another group")]
fn foreign_guard_panics_in_add_with() {
    let counter = ShardedCounter::new(&Group::new());
    let other = Group::new();
    let mut reg = other.register();
    counter.sub_with(&reg.enter(), 1);
}

#[test]
fn shards_grow_past_a_segment_boundary_without_moving() {
    // 70 registrations in per-task mode own CIDs 0..70: the first segment holds 64 shards.
    let group = Group::builder().virtual_cpus(128).build().unwrap();
    let mut regs: Vec<Registration> = (0..70).map(|_| group.register()).collect();
    let mut per_cid: PerCid<u64> = PerCid::new(&group);
    let mut addrs = HashMap::new();
    for reg in regs.iter_mut() {
        let mut guard = reg.enter();
        let cid = guard.cid().get();
        let shard = per_cid.get_mut(&mut guard);
        *shard = cid as u64 * 10;
        assert!(addrs.insert(cid, shard as *mut u64 as usize).is_none(), "CID {cid} twice");
    }
    assert!(addrs.keys().any(|&c| c >= 64), "a CID past the first segment: {:?}", addrs.keys().max());
    // Every shard is where it was, with its value, after the growth.
    for reg in regs.iter_mut() {
        let mut guard = reg.enter();
        let cid = guard.cid().get();
        let shard = per_cid.get_mut(&mut guard);
        assert_eq!(*shard, cid as u64 * 10);
        assert_eq!(addrs[&cid], shard as *mut u64 as usize, "shard {cid} moved");
    }
    assert_eq!(per_cid.shards_allocated(), 70);
    let visited: Vec<(usize, u64)> = per_cid.iter_mut().map(|(c, v)| (c.get(), *v)).collect();
    let mut want: Vec<(usize, u64)> = addrs.keys().map(|&c| (c, c as u64 * 10)).collect();
    want.sort_unstable();
    assert_eq!(visited, want, "each visited shard once, in CID order");
}

#[test]
fn shards_follow_cores_not_threads() {
    // Eight threads on a group allowed two cores: per-CPU mode, max_cids = 2. Once every thread is registered,
    // entries that do not overlap (a thread descheduled inside its guard would give another a temporary CID)
    // only ever see CIDs below max_cids, so the counter has at most max_cids shards, not one per thread.
    const THREADS: usize = 8;
    let cpus: Vec<usize> = CpuSet::current().unwrap().iter().take(2).collect();
    let group = Group::builder().cpus(CpuSet::from_cpus(cpus.clone()).unwrap()).build().unwrap();
    let counter = ShardedCounter::new(&group);
    let (barrier, turn) = (Gate::new(THREADS), Mutex::new(()));
    let max_cids = Mutex::new(Vec::new());
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                drop(group.enter()); // registers this thread (thread-local registration)
                barrier.wait(); // steady state: membership unchanged from here on
                max_cids.lock().unwrap().push(group.max_cids());
                for _ in 0..3 {
                    let _turn = turn.lock().unwrap();
                    counter.add(1);
                }
                barrier.wait(); // nobody unregisters before everyone is done
            });
        }
    });
    let max_cids = max_cids.into_inner().unwrap();
    assert!(max_cids.iter().all(|&m| m == max_cids[0]));
    assert!(max_cids[0] <= cpus.len(), "max_cids {} with {} allowed cores", max_cids[0], cpus.len());
    assert_eq!(counter.sum(), 3 * THREADS as u64);
    assert!(
        counter.shards_allocated() <= max_cids[0],
        "{} shards for max_cids {}",
        counter.shards_allocated(),
        max_cids[0]
    );
    assert!(counter.shards_allocated() < THREADS, "fewer shards than threads");
}

#[test]
fn wrapping_sub_keeps_the_total_exact_and_reset_zeroes() {
    let group = Group::new();
    let mut counter = ShardedCounter::new(&group);
    let (mut a, mut b) = (group.register(), group.register());
    let (ga, gb) = (a.enter(), b.enter());
    assert_ne!(ga.cid(), gb.cid());
    counter.add_with(&ga, 3);
    counter.sub_with(&gb, 10); // shard b "below zero"
    assert_eq!(counter.sum(), 3u64.wrapping_sub(10));
    counter.add_with(&ga, 10);
    assert_eq!(counter.sum(), 3);
    drop((ga, gb));
    assert_eq!(counter.shards_allocated(), 2);
    counter.reset();
    assert_eq!((counter.sum(), counter.shards_allocated()), (0, 2));
    counter.add_with(&b.enter(), 4);
    assert_eq!(counter.sum(), 4);
}

/// A `PerCid` shard for the hand-over test: a plain counter and who wrote it last (1 + thread index, 0: nobody).
#[derive(Default)]
struct Tally {
    count: u64,
    last: usize,
}

#[test]
fn hand_over_needs_no_atomics_inside_the_guard() {
    // I8 through PerCid: threads take turns on a plain u64 per CID; with any lost hand-over the total is off.
    // 4 registrations on 2 virtual cores (users 4 > max_cids 2: per-CPU mode), two threads declared on each core,
    // so a core's CID really passes from thread to thread (a thread finding it busy takes a temporary, which other
    // threads of that core get in turn as well). Every 16th increment yields between its read and its write, so
    // the core's other thread runs while the CID is held. Each thread goes on past its 2000 increments until 200
    // hand-overs (a shard last written by another thread) were seen, counted in the shards themselves: without
    // them the total would check nothing. Not reaching them in 30 s (`patience`) fails the test (a deadlock detector: an idle
    // 2-core machine sees thousands in well under a second).
    const THREADS: usize = 4;
    const MIN_OPS: u64 = 2_000;
    const MIN_HAND_OVERS: usize = 200;
    // One CID per core (the kernel's design): with CID sets each thread would keep borrowing its own extra CID of
    // its core, or the group would switch to per-task ownership, and hand-overs would be rare (design.md §2.6).
    let group = Group::builder().virtual_cpus(2).cids_per_core(1).build().unwrap();
    let mut per_cid: PerCid<Tally> = PerCid::new(&group);
    let (registered, hand_overs) = (Gate::new(THREADS), AtomicUsize::new(0));
    let deadline = std::time::Instant::now() + patience(30);
    let ops: u64 = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (group, per_cid, registered, hand_overs) = (&group, &per_cid, &registered, &hand_overs);
                s.spawn(move || {
                    let mut reg = group.register();
                    reg.set_cpu(Some(t % 2)).unwrap();
                    registered.wait();
                    assert_eq!(group.mode(), mmcid::Mode::PerCpu, "4 users on 2 cores");
                    let mut i = 0u64;
                    while i < MIN_OPS || hand_overs.load(Relaxed) < MIN_HAND_OVERS {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "{} hand-overs in {:?}",
                            hand_overs.load(Relaxed),
                            patience(30)
                        );
                        let mut guard = reg.enter();
                        let tally = per_cid.get_mut(&mut guard);
                        let v = tally.count;
                        if i % 16 == 0 {
                            thread::yield_now();
                        }
                        tally.count = v + 1;
                        let handed = tally.last != 0 && tally.last != t + 1;
                        tally.last = t + 1;
                        drop(guard);
                        hand_overs.fetch_add(handed as usize, Relaxed);
                        // Outside the guard for a while too: else a thread is nearly always inside its guard,
                        // and the core's other thread nearly always finds the CID busy.
                        thread::yield_now();
                        i += 1;
                    }
                    i
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let stats = group.stats();
    assert!(stats.enter_cpu_fast > 0, "no core CID was borrowed: {stats:?}");
    // (Every thread left its loop with MIN_HAND_OVERS seen, or failed.)
    eprintln!("hand-over test: {ops} increments, {} hand-overs, {stats:?}", hand_overs.load(Relaxed));
    assert_eq!(per_cid.iter_mut().map(|(_, t)| t.count).sum::<u64>(), ops, "an increment was lost (I1/I8)");
    // I2 hard bound: 4 users + 2 cores.
    assert!(per_cid.shards_allocated() <= THREADS + 2, "{} shards", per_cid.shards_allocated());
}

/// 70 registrations of a 128-core group own CIDs 0..70 (per-task mode), across the first segment's end.
fn seventy_owners() -> (Group, Vec<Registration>) {
    let group = Group::builder().virtual_cpus(128).build().unwrap();
    let regs: Vec<Registration> = (0..70).map(|_| group.register()).collect();
    (group, regs)
}

/// Which CIDs of [`seventy_owners`] the iteration tests write: both ends of the first segment and the second.
const WRITTEN: [usize; 5] = [0, 3, 63, 64, 69];

/// Every iteration, of `PerCid` and `SharedPerCid`, by reference and by value, yields exactly the shards written:
/// each once, in CID order, with its `Cid` and value; CIDs whose guards never asked for a shard are not there.
#[test]
fn iteration_sees_exactly_the_shards_written() {
    let (group, mut regs) = seventy_owners();
    let mut per_cid: PerCid<u64> = PerCid::new(&group);
    let shared: SharedPerCid<AtomicU64> = SharedPerCid::new(&group);
    for reg in regs.iter_mut() {
        let mut guard = reg.enter();
        let cid = guard.cid().get();
        if WRITTEN.contains(&cid) {
            *per_cid.get_mut(&mut guard) = cid as u64 * 10;
            shared.get(&guard).store(cid as u64 * 10, Relaxed);
        }
    }
    let want: Vec<(usize, u64)> = WRITTEN.iter().map(|&c| (c, c as u64 * 10)).collect();
    assert_eq!((per_cid.shards_allocated(), shared.shards_allocated()), (5, 5));

    let seen: Vec<(usize, u64)> = per_cid.iter_mut().map(|(c, v)| (c.get(), *v)).collect();
    assert_eq!(seen, want, "PerCid::iter_mut");
    let mut seen = Vec::new();
    for (cid, v) in &mut per_cid {
        *v += 1;
        seen.push((cid.get(), *v - 1));
    }
    assert_eq!(seen, want, "&mut PerCid");
    let seen: Vec<(Cid, u64)> = per_cid.into_iter().collect();
    let want_plus: Vec<(usize, u64)> = want.iter().map(|&(c, v)| (c, v + 1)).collect();
    assert_eq!(seen.iter().map(|&(c, v)| (c.get(), v)).collect::<Vec<_>>(), want_plus, "PerCid::into_iter");

    let load = |(c, v): (Cid, &AtomicU64)| (c.get(), v.load(Relaxed));
    assert_eq!(shared.iter().map(load).collect::<Vec<_>>(), want, "SharedPerCid::iter");
    assert_eq!((&shared).into_iter().map(load).collect::<Vec<_>>(), want, "&SharedPerCid");
    let mut shared = shared;
    let seen: Vec<(usize, u64)> = (&mut shared).into_iter().map(|(c, v)| (c.get(), *v.get_mut())).collect();
    assert_eq!(seen, want, "&mut SharedPerCid");
    let seen: Vec<(usize, u64)> = shared.into_iter().map(|(c, v)| (c.get(), v.into_inner())).collect();
    assert_eq!(seen, want, "SharedPerCid::into_iter");
}

/// The deprecated `iter_visited` still yields what `iter_mut` does, with the CID as a `usize`.
#[test]
#[allow(deprecated)]
fn iter_visited_is_iter_mut_with_usize_cids() {
    let (group, mut regs) = seventy_owners();
    let mut per_cid: PerCid<u64> = PerCid::new(&group);
    for reg in regs.iter_mut() {
        let mut guard = reg.enter();
        let cid = guard.cid().get();
        if WRITTEN.contains(&cid) {
            *per_cid.get_mut(&mut guard) = cid as u64;
        }
    }
    let old: Vec<(usize, u64)> = per_cid.iter_visited().map(|(c, v)| (c, *v)).collect();
    let new: Vec<(usize, u64)> = per_cid.iter_mut().map(|(c, v)| (c.get(), *v)).collect();
    assert_eq!(old, new);
    assert_eq!(old.len(), WRITTEN.len());
}

/// `clear` drops every shard once (both segments), leaves nothing to iterate, and the next guard gets a fresh shard
/// from `init`; `SharedPerCid::clear` too.
#[test]
fn clear_drops_every_shard_and_starts_afresh() {
    let (group, mut per_cid, made, drops) = counting_per_cid(|_, drops| Counted { drops: drops.clone() });
    let mut regs: Vec<Registration> = (0..3).map(|_| group.register()).collect();
    for reg in regs.iter_mut() {
        let _ = per_cid.get_mut(&mut reg.enter());
    }
    assert_eq!((made.load(Relaxed), per_cid.shards_allocated()), (3, 3));
    per_cid.clear();
    assert_eq!(drops.load(Relaxed), 3, "every shard dropped once");
    assert_eq!(per_cid.shards_allocated(), 0);
    assert_eq!(per_cid.iter_mut().count(), 0);
    let _ = per_cid.get_mut(&mut regs[0].enter());
    assert_eq!((made.load(Relaxed), per_cid.shards_allocated(), drops.load(Relaxed)), (4, 1, 3), "a fresh shard");
    per_cid.clear();
    per_cid.clear(); // nothing left: a no-op
    drop(per_cid);
    assert_eq!(drops.load(Relaxed), 4, "each shard dropped once, by clear or by drop");

    let (group, mut regs) = seventy_owners();
    let mut shared: SharedPerCid<AtomicU64> = SharedPerCid::new(&group);
    for reg in regs.iter_mut() {
        shared.get(&reg.enter()).store(7, Relaxed);
    }
    assert_eq!(shared.shards_allocated(), 70);
    shared.clear();
    assert_eq!((shared.shards_allocated(), shared.iter().count()), (0, 0));
    for reg in regs.iter_mut() {
        let guard = reg.enter();
        if WRITTEN.contains(&guard.cid().get()) {
            assert_eq!(shared.get(&guard).load(Relaxed), 0, "a fresh shard, not the cleared one");
            shared.get(&guard).store(1, Relaxed);
        }
    }
    let seen: Vec<usize> = shared.iter().map(|(c, _)| c.get()).collect();
    assert_eq!(seen, WRITTEN, "only the shards written since the clear");
}

/// A shard whose drop panics in `clear`: the others are dropped too, and the table is left empty and usable.
#[test]
fn clear_with_a_panicking_shard_drop_leaves_the_table_empty() {
    let (group, mut per_cid, made, drops) =
        counting_per_cid(|id, drops| PanicsOnDrop { id, panic_id: 1, drops: drops.clone() });
    let mut regs: Vec<Registration> = (0..3).map(|_| group.register()).collect();
    for reg in regs.iter_mut() {
        let _ = per_cid.get_mut(&mut reg.enter());
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| per_cid.clear()));
    assert!(result.is_err(), "the shard's panic propagates");
    assert_eq!(drops.load(Relaxed), 3, "every shard dropped once, the panicking one included");
    assert_eq!((per_cid.shards_allocated(), per_cid.iter_mut().count()), (0, 0));
    let _ = per_cid.get_mut(&mut regs[0].enter());
    assert_eq!((made.load(Relaxed), per_cid.shards_allocated()), (4, 1));
}

/// `into_iter` hands every shard out by value (nothing dropped until the caller drops it); a partly consumed
/// iterator drops the rest.
#[test]
fn into_iter_hands_out_each_shard_once() {
    let (group, per_cid, _, drops) = counting_per_cid(|_, drops| Counted { drops: drops.clone() });
    let mut regs: Vec<Registration> = (0..3).map(|_| group.register()).collect();
    for reg in regs.iter_mut() {
        let _ = per_cid.get_mut(&mut reg.enter());
    }
    let mut it = per_cid.into_iter();
    assert_eq!(it.len(), 3);
    let first = it.next().unwrap();
    assert_eq!(drops.load(Relaxed), 0, "handed out, not dropped");
    drop(it);
    assert_eq!(drops.load(Relaxed), 2, "the two not taken are dropped with the iterator");
    drop(first);
    assert_eq!(drops.load(Relaxed), 3);
}

#[test]
fn shared_per_cid_rejects_foreign_guards() {
    let (ours, theirs) = (Group::new(), Group::new());
    let table: SharedPerCid<AtomicU64> = SharedPerCid::new(&ours);
    assert_eq!(table.try_get(&theirs.enter()).err(), Some(Error::ForeignGuard));
    assert_eq!(table.shards_allocated(), 0);
    assert!(table.try_get(&ours.enter()).is_ok());
}

#[test]
#[should_panic(expected = "the guard belongs to another group")]
fn foreign_guard_panics_in_shared_get() {
    let table: SharedPerCid<AtomicU64> = SharedPerCid::new(&Group::new());
    let _ = table.get(&Group::new().enter());
}

/// A histogram read while 8 threads record into it: 8 buckets per CID in a `SharedPerCid`, each recorder the only
/// writer of its CID's buckets (a plain load and store, no read-modify-write). Three phases, separated by gates:
/// a scan between the first two sees at least the first phase's counts and at most the second's in every bucket;
/// the scans of the third phase never see a bucket go down (one reader: each shard's values come in its
/// modification order); the sum after the recorders are joined is exact. Half the recorders use a registration
/// of their own, half `Group::enter`; with 4 virtual cores and one CID per core the group is in per-CPU mode, with
/// temporary CIDs whenever a recorder is preempted inside its guard.
#[test]
fn a_shared_table_read_while_eight_threads_write_sums_exactly() {
    const THREADS: usize = 8;
    const BUCKETS: usize = 8;
    let phase = common::per_thread(30_000, THREADS) / BUCKETS as u64 * BUCKETS as u64; // a multiple of BUCKETS
    let per_bucket = |phases: u64| phases * phase * THREADS as u64 / BUCKETS as u64;
    let group = Group::builder().virtual_cpus(4).cids_per_core(1).build().unwrap();
    let table: SharedPerCid<[AtomicU64; BUCKETS]> = SharedPerCid::new(&group);
    let gate = Gate::new(THREADS + 1);
    let running = AtomicUsize::new(THREADS);
    let sums = || -> [u64; BUCKETS] {
        let mut sums = [0; BUCKETS];
        for (_, buckets) in &table {
            for (sum, b) in sums.iter_mut().zip(buckets) {
                *sum += b.load(Relaxed);
            }
        }
        sums
    };
    let scans = thread::scope(|s| {
        for t in 0..THREADS {
            let (group, table, gate, running) = (&group, &table, &gate, &running);
            s.spawn(move || {
                let mut own = (t % 2 == 0).then(|| group.register());
                for p in 0..3 {
                    for i in 0..phase {
                        let guard = match own.as_mut() {
                            Some(reg) => reg.enter(),
                            None => group.enter(),
                        };
                        let bucket = &table.get(&guard)[i as usize % BUCKETS];
                        bucket.store(bucket.load(Relaxed) + 1, Relaxed);
                    }
                    if p < 2 {
                        gate.wait();
                    }
                }
                running.fetch_sub(1, Relaxed);
            });
        }
        gate.wait(); // the first phase is done everywhere
        let between = sums();
        for (b, &n) in between.iter().enumerate() {
            assert!(n >= per_bucket(1) && n <= per_bucket(2), "bucket {b}: {n} between phases 1 and 2");
        }
        gate.wait(); // the second phase is done everywhere; the third runs while we scan
        let (mut last, mut scans) = (sums(), 0);
        while running.load(Relaxed) > 0 {
            let now = sums();
            for b in 0..BUCKETS {
                assert!(now[b] >= last[b], "bucket {b} went down: {} then {}", last[b], now[b]);
                assert!(now[b] <= per_bucket(3), "bucket {b}: {} is more than was recorded", now[b]);
            }
            (last, scans) = (now, scans + 1);
        }
        scans
    });
    assert_eq!(sums(), [per_bucket(3); BUCKETS], "a record was lost (I1/I8), {scans} scans during the last phase");
    assert!(table.shards_allocated() <= THREADS + 4, "I2 hard bound: {} shards", table.shards_allocated());
}
