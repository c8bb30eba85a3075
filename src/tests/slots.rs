//! Tests of the core-slot protocol (`inner/slots.rs`) with real threads: restartable-sequence borrows, and an exit
//! that defers its claim.

use crate::inner::Taker;
use crate::state::*;
use crate::stats::Counters;
use crate::stats::Stats;
use crate::Group;

/// Per-CPU borrows of a real-core group go through the restartable sequence (design.md §4.1.1), which is what
/// excludes the threads of one CPU: 4 unpinned threads per core borrow their CPU's idle CID with
/// `borrow_slot`, increment a plain per-core counter (load, store) and give the CID back with the exit's
/// release store. A borrow that two threads of one CPU both won loses increments. (Hand-made mutant when
/// this was written, found by a test audit: `borrow_slot` as a plain load, compare and store on rseq groups
/// passed the whole suite before this test; here it lost 270 000–810 000 of the 4 000 000 increments of a
/// debug build in three runs out of three.)
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(mmcid_portable)))]
fn rseq_borrows_exclude_the_threads_of_one_cpu() {
    use crate::Mode;
    use std::sync::atomic::Ordering::*;
    let g = Group::new();
    if !g.uses_rseq() {
        eprintln!("rseq_borrows_exclude_the_threads_of_one_cpu: no rseq borrows here, nothing to check");
        return;
    }
    let inner = &*g.inner;
    let regs: Vec<_> = (0..inner.cores + 1).map(|_| g.register()).collect();
    assert_eq!(g.mode(), Mode::PerCpu);
    for cpu in 0..inner.cores {
        let slot = inner.slot(slot_at(cpu, 0));
        if slot.load(Acquire) == EMPTY {
            slot.store(slot::owned(inner.bitmap.get()), Release); // as a first enter on the core would
        }
    }
    let rounds: u64 = if cfg!(debug_assertions) { 500_000 } else { 5_000_000 };
    let (holds, total) = crate::tests::rseq::per_cpu_exclusion(rounds, |cpu| {
        let at = slot_at(cpu, 0);
        let word = inner.slot(at).load(Relaxed);
        (slot::idle_cid(word).is_some() && inner.borrow_slot(at, word))
            .then_some(move || inner.slot(at).store(word, Release)) // the exit's X1
    });
    assert_eq!(total, holds, "two threads of one CPU borrowed its CID at once");
    drop(regs);
    assert!(g.audit().is_consistent(), "{:?}", g.audit());
}

/// Claims never wait (design.md §4.1.1): with the claim lock held by someone else, a stealer gives up and an
/// exit leaves its idle slot flagged for the holder, whose unlock takes it. Deterministic, one thread playing
/// the holder; the interleavings are loom model 11f.
#[test]
fn an_exit_that_finds_the_claim_lock_held_defers_to_its_holder() {
    use std::sync::atomic::Ordering::*;
    let _no_fork = crate::tests::FORKS.read().unwrap_or_else(|e| e.into_inner());
    let g = Group::new();
    if !g.uses_rseq() {
        eprintln!("an_exit_that_finds_the_claim_lock_held_defers_to_its_holder: no rseq claims here");
        return;
    }
    let inner = &*g.inner;
    let _reg = g.register(); // per-task mode: no core may own a CID
    let c = inner.bitmap.get();
    let idle = slot::owned(c);
    inner.slot(0).store(idle, Release); // what an exit that lost a switch finds after its X1
    let counters = Counters::default();

    assert!(inner.try_claim_lock(), "the test is the holder");
    assert!(!inner.take_idle(0, idle, Taker::Stealer, &counters), "a stealer gives up");
    assert_eq!(inner.claims_deferred.load(Relaxed), 0, "and flags nothing");
    assert!(!inner.take_idle(0, idle, Taker::Exit, &counters), "an exit does not wait either");
    assert_eq!(inner.claims_deferred.load(Relaxed), 1, "it flags its slot");
    assert_eq!(inner.slot(0).load(Relaxed), idle, "and leaves the CID there");

    inner.claim_unlock(&counters); // the holder's unlock drains the flag
    assert_eq!(inner.slot(0).load(Relaxed), EMPTY);
    assert!(!inner.bitmap.is_set(c), "the deferred CID is free");
    assert_eq!((inner.claims_deferred.load(Relaxed), inner.claim.load(Relaxed)), (0, 0));
    let mut t = Stats::totals();
    counters.add_to(&mut t);
    let s = Stats::from_totals(&t, 0);
    assert_eq!((s.exit_deferred, s.fixup_takes, s.bitmap_clears), (1, 1, 1));

    // With the lock free, the exit claims by itself.
    let c = inner.bitmap.get();
    let at = slot_at(1 % inner.cores, 0);
    inner.slot(at).store(slot::owned(c), Release);
    assert!(inner.take_idle(at, slot::owned(c), Taker::Exit, &counters));
    assert_eq!(inner.claim.load(Relaxed), 0, "unlocked again");
    inner.bitmap.clear(c);
    assert!(g.audit().is_consistent(), "{:?}", g.audit());
}
