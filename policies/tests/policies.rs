//! I1 (exclusivity) for every historical policy of this crate, checked by an independent occupancy checker:
//! one `AtomicUsize` per CID whose `fetch_add` at enter must return 0, under churn (threads yielding inside
//! guards, more threads than cores, threads made and dropped in rounds).

/// mmcid's own test helpers (the gate that holds threads together).
#[path = "../../tests/common/mod.rs"]
mod common;

use mmcid::{CidKind, Error, Group, Mode};
use mmcid_policies::{BitmapCids, LazyCids, LazyConfig, MmCid, MutexCids, NoCid, Policy, PolicyGuard, Scan};
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

/// Threads per round: more than the cores of the CI machine, so guards are preempted and yield inside.
const THREADS: usize = 8;
const ROUNDS: usize = 4;
const ENTERS: usize = 2000;
/// Slots of the checker: every policy keeps CIDs below `threads + cores`.
fn slots() -> usize {
    THREADS + std::thread::available_parallelism().map_or(1, |n| n.get()) + 64
}

/// Occupancy checker: counts, per CID, the guards holding it.
struct Checker {
    held: Vec<AtomicUsize>,
    violations: AtomicUsize,
}

impl Checker {
    fn new(slots: usize) -> Checker {
        Checker { held: (0..slots).map(|_| AtomicUsize::new(0)).collect(), violations: AtomicUsize::new(0) }
    }

    /// Records that a guard holds `cid`; counts a violation if another guard already holds it.
    fn enter(&self, cid: usize) {
        match self.held.get(cid) {
            Some(h) => {
                if h.fetch_add(1, SeqCst) != 0 {
                    self.violations.fetch_add(1, SeqCst);
                }
            }
            None => {
                self.violations.fetch_add(1, SeqCst);
            }
        }
    }

    fn exit(&self, cid: usize) {
        if let Some(h) = self.held.get(cid) {
            h.fetch_sub(1, SeqCst);
        }
    }

    fn violations(&self) -> usize {
        self.violations.load(SeqCst)
    }
}

/// Rounds of `THREADS` fresh threads, each entering `ENTERS` times and yielding inside some guards.
fn churn<P: Policy + 'static>(policy: Arc<P>) -> usize {
    let checker = Arc::new(Checker::new(slots()));
    for _ in 0..ROUNDS {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let policy = Arc::clone(&policy);
                let checker = Arc::clone(&checker);
                std::thread::spawn(move || {
                    let mut t = policy.thread(None);
                    for n in 0..ENTERS {
                        let g = policy.enter(&mut t);
                        let cid = g.cid();
                        checker.enter(cid);
                        if (n + i) % 3 == 0 {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                        checker.exit(cid);
                        drop(g);
                        if n % 7 == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("worker panicked");
        }
    }
    checker.violations()
}

/// All `THREADS` threads hold a guard at the same time (rendezvous inside the guard): their CIDs must all differ.
/// Deterministic: the overlap is forced, not left to the scheduler. Returns the number of repeated CIDs.
fn all_at_once<P: Policy + 'static>(policy: Arc<P>) -> usize {
    let checker = Arc::new(Checker::new(slots()));
    let inside = Arc::new(common::Gate::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (policy, checker, inside) = (Arc::clone(&policy), Arc::clone(&checker), Arc::clone(&inside));
            std::thread::spawn(move || {
                let mut t = policy.thread(None);
                let g = policy.enter(&mut t);
                checker.enter(g.cid());
                inside.wait();
                inside.wait(); // everyone has recorded its CID before anyone leaves
                checker.exit(g.cid());
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker panicked");
    }
    checker.violations()
}

fn lazy_stressed(scan: Scan) -> LazyCids {
    // Compaction on every 2nd enter with a zero period: the scan races with borrowers all the time.
    LazyCids::with_config(LazyConfig { scan, capacity: THREADS, cores: 4, period: Duration::ZERO, check_every: 2 })
        .unwrap()
}

#[test]
fn checker_catches_a_shared_cid() {
    /// A broken policy: everybody gets CID 0.
    struct Zero;
    struct ZeroGuard;
    impl PolicyGuard for ZeroGuard {
        fn cid(&self) -> usize {
            0
        }
    }
    impl Policy for Zero {
        type Thread = ();
        type Guard<'a> = ZeroGuard;
        fn name(&self) -> &'static str {
            "zero"
        }
        fn thread(&self, _cpu: Option<usize>) {}
        fn enter<'a>(&'a self, _t: &'a mut ()) -> ZeroGuard {
            ZeroGuard
        }
        fn cids_in_use(&self) -> usize {
            0
        }
    }
    assert_eq!(all_at_once(Arc::new(Zero)), THREADS - 1);
}

#[test]
fn none_is_exclusive() {
    let p = Arc::new(NoCid::new());
    assert_eq!(all_at_once(Arc::clone(&p)), 0);
    // Indices are per thread state, so churn needs room for every thread ever made.
    let checker = Checker::new(THREADS * ROUNDS + THREADS);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut t = p.thread(None);
                for _ in 0..ENTERS {
                    let g = p.enter(&mut t);
                    checker.enter(g.cid());
                    std::thread::yield_now();
                    checker.exit(g.cid());
                }
            });
        }
    });
    assert_eq!(checker.violations(), 0);
}

#[test]
fn mutex_is_exclusive() {
    let p = Arc::new(MutexCids::new());
    assert_eq!(all_at_once(Arc::clone(&p)), 0);
    assert_eq!(churn(Arc::clone(&p)), 0);
    assert_eq!(p.cids_in_use(), 0);
}

#[test]
fn mutex_hands_out_the_smallest_free_id() {
    let p = MutexCids::new();
    let (mut a, mut b, mut c) = (p.thread(None), p.thread(None), p.thread(None));
    let ga = p.enter(&mut a);
    let gb = p.enter(&mut b);
    assert_eq!((ga.cid(), gb.cid()), (0, 1));
    drop(ga);
    assert_eq!(p.enter(&mut c).cid(), 0);
}

#[test]
fn bitmap_is_exclusive() {
    let p = Arc::new(BitmapCids::new(THREADS).unwrap());
    assert_eq!(all_at_once(Arc::clone(&p)), 0);
    assert_eq!(churn(Arc::clone(&p)), 0);
    assert_eq!(p.cids_in_use(), 0);
}

#[test]
fn bitmap_spans_words() {
    let p = BitmapCids::new(130).unwrap();
    let mut threads: Vec<()> = vec![(); 130];
    let guards: Vec<_> = threads.iter_mut().map(|t| p.enter(t)).collect();
    let mut cids: Vec<usize> = guards.iter().map(|g| g.cid()).collect();
    cids.sort_unstable();
    assert_eq!(cids, (0..130).collect::<Vec<_>>());
    assert_eq!(p.cids_in_use(), 130);
    drop(guards);
    assert_eq!(p.cids_in_use(), 0);
}

#[test]
fn lazy_all_is_exclusive_under_compaction() {
    let p = Arc::new(lazy_stressed(Scan::All));
    assert_eq!(all_at_once(Arc::clone(&p)), 0);
    assert_eq!(churn(Arc::clone(&p)), 0);
    assert!(p.scans() > 0, "the compaction scan never ran");
    // Quiescent: only core slots keep CIDs; two scans with no enter give them all back.
    assert!(p.cids_in_use() <= 4);
    p.compact();
    p.compact();
    assert_eq!(p.cids_in_use(), 0);
}

#[test]
fn lazy_visited_is_exclusive_under_compaction() {
    let p = Arc::new(lazy_stressed(Scan::Visited));
    assert_eq!(all_at_once(Arc::clone(&p)), 0);
    assert_eq!(churn(Arc::clone(&p)), 0);
    assert!(p.scans() > 0, "the compaction scan never ran");
    p.compact();
    p.compact();
    assert_eq!(p.cids_in_use(), 0);
}

#[test]
fn lazy_keeps_the_core_cid_and_compaction_ages_it() {
    let p = LazyCids::with_config(LazyConfig {
        scan: Scan::Visited,
        capacity: 4,
        cores: 4,
        period: Duration::from_secs(3600),
        check_every: 1,
    })
    .unwrap();
    let mut a = p.thread(Some(2));
    let mut b = p.thread(Some(2));
    let first = p.enter(&mut a).cid();
    // Same core, previous holder gone: the core's CID is reused without touching the bitmap.
    assert_eq!(p.enter(&mut b).cid(), first);
    assert_eq!(p.cids_in_use(), 1);
    // The core is busy: a second thread on it gets a temporary CID, given back at exit.
    let ga = p.enter(&mut a);
    let gb = p.enter(&mut b);
    assert_ne!(ga.cid(), gb.cid());
    assert_eq!(p.cids_in_use(), 2);
    // A busy slot survives any number of scans.
    assert_eq!(p.compact() + p.compact() + p.compact(), 0);
    drop((ga, gb));
    assert_eq!(p.cids_in_use(), 1);
    // First scan clears the RECENT mark, second gives the idle core's CID back.
    assert_eq!(p.compact(), 0);
    assert_eq!(p.compact(), 1);
    assert_eq!(p.cids_in_use(), 0);
    assert_eq!(p.reclaimed(), 1);
}

#[test]
fn lazy_visited_scans_only_used_cores() {
    let p = LazyCids::with_config(LazyConfig {
        scan: Scan::Visited,
        capacity: 2,
        cores: 256,
        period: Duration::from_secs(3600),
        check_every: 1,
    })
    .unwrap();
    let mut t = p.thread(Some(200));
    drop(p.enter(&mut t));
    p.compact();
    assert_eq!(p.compact(), 1, "core 200 was visited and idle");
}

#[test]
fn mmcid_is_exclusive() {
    let p = Arc::new(MmCid::new(Group::new()));
    assert_eq!(all_at_once(Arc::clone(&p)), 0);
    assert_eq!(churn(Arc::clone(&p)), 0);
    assert_eq!(p.cids_in_use(), 0);
    assert_eq!(p.group().users(), 0);
}

#[test]
fn mmcid_is_exclusive_in_per_cpu_mode() {
    // 4 virtual cores, 8 threads: per-CPU mode with busy cores and temporaries. One CID per core (the kernel's
    // design): with CID sets the busy cores would lend extra CIDs, and half the users holding guards at once would
    // switch the group to per-task mode (mmcid's design.md §2.6, §3.1; tests/cid_sets.rs checks those).
    let p = Arc::new(MmCid::new(Group::builder().virtual_cpus(4).cids_per_core(1).build().expect("group")));
    assert_eq!(all_at_once(Arc::clone(&p)), 0);
    assert_eq!(churn(Arc::clone(&p)), 0);
    assert_eq!(p.cids_in_use(), 0);
    // Busy cores and temporaries, forced rather than left to the scheduler: all 8 threads registered first (8 users
    // > max_cids 4: per-CPU mode, fixed membership), then all 8 inside a guard at once. At most one guard per core
    // borrows the core's CID, so at least 8 - 4 guards found their core busy and hold temporaries; none is a
    // per-task guard. Two threads per core (`thread(Some(i % 4))`): each core is borrowed by exactly one of them.
    let registered = Arc::new(common::Gate::new(THREADS));
    let inside = Arc::new(common::Gate::new(THREADS));
    let checker = Arc::new(Checker::new(slots()));
    let kinds: Vec<CidKind> = (0..THREADS)
        .map(|i| {
            let (p, registered, inside, checker) =
                (Arc::clone(&p), Arc::clone(&registered), Arc::clone(&inside), Arc::clone(&checker));
            std::thread::spawn(move || {
                let mut t = p.thread(Some(i % 4));
                registered.wait();
                assert_eq!(p.group().mode(), Mode::PerCpu, "8 users on 4 cores");
                let g = p.enter(&mut t);
                checker.enter(g.cid().get());
                inside.wait();
                inside.wait(); // every guard recorded before any leaves
                checker.exit(g.cid().get());
                g.kind()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("worker panicked"))
        .collect();
    assert_eq!(checker.violations(), 0, "two live guards with one CID");
    let mut cores: Vec<usize> =
        kinds.iter().filter_map(|k| if let CidKind::Core(c) = k { Some(*c) } else { None }).collect();
    let temporaries = kinds.iter().filter(|k| **k == CidKind::Temporary).count();
    cores.sort_unstable();
    assert_eq!(cores, [0, 1, 2, 3], "one guard per core borrows its CID, the other finds it busy: {kinds:?}");
    assert_eq!(temporaries, THREADS - 4, "the rest hold temporaries: {kinds:?}");
    assert!(p.group().stats().enter_temporary >= (THREADS - 4) as u64);
    assert_eq!((p.cids_in_use(), p.group().users()), (0, 0));
}

#[test]
fn names() {
    assert_eq!(NoCid::new().name(), "none");
    assert_eq!(MutexCids::new().name(), "mutex");
    assert_eq!(BitmapCids::new(1).unwrap().name(), "bitmap");
    // Sizes the policies cannot hold: a typed error, not an aborted allocation or CIDs beyond the slot mask.
    let max = mmcid_policies::MAX_CAPACITY;
    for capacity in [0, max + 1, usize::MAX] {
        let want = Error::ValueOutOfRange { what: "capacity", value: capacity, min: 1, max };
        assert_eq!(BitmapCids::new(capacity).unwrap_err(), want);
    }
    let lazy = |capacity, cores| {
        LazyCids::with_config(LazyConfig { scan: Scan::All, capacity, cores, period: Duration::ZERO, check_every: 1 })
            .map(|_| ())
    };
    let out = |what, value, max| Err(Error::ValueOutOfRange { what, value, min: 1, max });
    assert_eq!(lazy(4, 0), out("cores", 0, 65_536));
    assert_eq!(lazy(4, usize::MAX), out("cores", usize::MAX, 65_536));
    assert_eq!(lazy(0, 4), out("capacity", 0, max - 4));
    assert_eq!(lazy(max, 4), out("capacity", max, max - 4));
    assert_eq!(lazy(usize::MAX, 65_536), out("capacity", usize::MAX, max - 65_536));
    assert_eq!(lazy(max - 4, 4), Ok(()));
    assert_eq!(LazyCids::new(Scan::All, 1).unwrap().name(), "lazy-all");
    assert_eq!(LazyCids::new(Scan::Visited, 1).unwrap().name(), "lazy-visited");
    assert_eq!(MmCid::new(Group::new()).name(), "mmcid");
}

/// `Policy::enter` needs a thread state of the same instance; `MmCid` checks it in debug builds (a registration of
/// another group would enter that group's CID space, so its CID could be one this policy's guards also hold).
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "a registration of another group")]
fn mmcid_rejects_a_registration_of_another_group_in_debug_builds() {
    let (a, b) = (MmCid::new(Group::new()), MmCid::new(Group::new()));
    let mut foreign = b.thread(None);
    drop(a.enter(&mut foreign));
}
