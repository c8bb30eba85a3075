//! Tests of design.md §12 ("Platform and process events") that need the group's internals: membarrier calls made
//! to fail through `Inner::fail_barriers` (per group, so tests running at once do not see each other's failures).
//! A unit-test module; the same failures from a real seccomp filter are `tests/platform.rs`.

use crate::group::*;
use crate::inner::Taker;
use crate::state::*;
use crate::stats::{Counters, Stats};
use crate::sys;
use crate::{CidKind, Mode};
use std::sync::atomic::Ordering::*;

/// A virtual group over `cores` cores (all allowed) with asymmetric fences, or `None` (said on stderr) where this
/// process has no membarrier: then no call can fail.
fn asym_group(test: &str, cores: usize) -> Option<Group> {
    let g = Group::builder().virtual_cpus(cores).build().unwrap();
    if !g.uses_membarrier() {
        eprintln!("{test}: no membarrier in this process, nothing to check");
        return None;
    }
    Some(g)
}

/// Every later membarrier of `g` fails with `errno`.
fn fail_for_good(g: &Group, errno: i32) {
    g.inner.fail_barriers.set(errno, u32::MAX);
}

fn assert_all_free(g: &Group) {
    let audit = g.audit();
    assert!(audit.is_consistent(), "{audit:?}");
    assert_eq!((audit.bits, g.users(), g.mode()), (0, 0, Mode::PerTask), "{audit:?}");
}

/// A task → CPU switch whose F2 fails for good (EPERM, as from a seccomp filter) completes without its walk: the
/// registrations keep their CIDs (no guard of theirs could be told apart from an idle one without the barrier),
/// the failure is counted, and each registration gives its CID up at its next enter, which then borrows the
/// core's (design.md §12.1; a process that aborts on a failed membarrier dies here).
#[test]
fn a_failed_task_to_cpu_barrier_leaves_each_cid_to_its_owner() {
    let Some(g) = asym_group("a_failed_task_to_cpu_barrier", 1) else { return };
    fail_for_good(&g, libc::EPERM);
    let mut r1 = g.register();
    assert_eq!(r1.cid().map(|c| c.get()), Some(0));
    let r2 = g.register(); // users 2 > max_cids 1: the switch (r2 is born in per-CPU mode, with no CID)
    assert_eq!(g.mode(), Mode::PerCpu);
    let s = g.stats();
    assert_eq!((s.switches_to_per_cpu, s.membarrier_failures, s.fixup_walks), (1, 1, 0), "{s:?}");
    assert_eq!((r1.cid().map(|c| c.get()), r2.cid()), (Some(0), None), "r1's CID was not taken");
    assert!(g.audit().is_consistent(), "{:?}", g.audit());
    {
        let guard = r1.enter(); // gives CID 0 up, then the core takes (and we borrow) the lowest free one
        assert_eq!((guard.kind(), guard.cid().get()), (CidKind::Core(0), 0));
    }
    assert_eq!(r1.cid(), None);
    assert!(g.audit().is_consistent(), "{:?}", g.audit());
    drop((r1, r2));
    assert_all_free(&g);
}

/// A registration that kept its CID across a failed task → CPU walk enters while its core's first CID is held
/// and an extra CID of the core is idle: it borrows the extra one and gives its own back to the bitmap (a borrow
/// of an extra slot that kept the given-up CID in hand leaked it: at zero users its bit stayed set, owned by
/// nobody, as a churn with every membarrier failing showed).
#[test]
fn an_own_cid_given_up_for_an_idle_extra_slot_goes_back() {
    let Some(g) = asym_group("an_own_cid_given_up_for_an_idle_extra_slot", 1) else { return };
    assert!(g.cids_per_core() > 1);
    fail_for_good(&g, libc::EPERM);
    let mut r1 = g.register();
    let mut r2 = g.register(); // the switch, without its walk: r1 keeps CID 0
    assert_eq!((g.mode(), r1.cid().map(|c| c.get())), (Mode::PerCpu, Some(0)));
    let mut r3 = g.register();
    let idle: Vec<_> = (0..4).map(|_| g.register()).collect(); // 2 guards of 7 users: no occupancy switch (§3.1)
    let first = r2.enter(); // the core's first CID, held
    drop(r3.enter()); // an extra CID donated to the core, idle again
    let extra = r1.enter(); // gives CID 0 up and borrows the idle extra CID
    assert_ne!(extra.cid(), first.cid());
    let audit = g.audit();
    drop(extra);
    assert!(audit.is_consistent(), "CID 0 leaked: {audit:?}");
    assert_eq!(r1.cid(), None);
    drop(first);
    drop((r1, r2, r3, idle));
    assert_all_free(&g);
}

/// ENOMEM (the kernel could not allocate its CPU mask, before sending anything) is retried: three in a row and
/// the fourth call works, so the switch walks as usual and nothing counts as failed; four in a row exhaust the
/// tries and the switch goes without its walk.
#[test]
fn a_transient_enomem_is_retried_a_bounded_number_of_times() {
    for failures in [sys::BARRIER_TRIES - 1, sys::BARRIER_TRIES] {
        let Some(g) = asym_group("a_transient_enomem_is_retried", 1) else { return };
        g.inner.fail_barriers.set(libc::ENOMEM, failures);
        let r1 = g.register();
        let r2 = g.register(); // the switch
        let s = g.stats();
        assert_eq!(g.inner.fail_barriers.failed.load(SeqCst), failures);
        let failed = failures == sys::BARRIER_TRIES;
        assert_eq!(s.membarrier_failures, failed as u64, "{failures} ENOMEM: {s:?}");
        assert_eq!(r1.cid().is_some(), failed, "{failures} ENOMEM: the walk ran iff the barrier did");
        drop((r1, r2));
        assert_all_free(&g);
    }
}

/// A permanent error other than EPERM (ENOSYS, or any errno a filter returns) is not retried.
#[test]
fn a_permanent_error_is_not_retried() {
    let Some(g) = asym_group("a_permanent_error_is_not_retried", 1) else { return };
    g.inner.fail_barriers.set(libc::ENOSYS, 1);
    let regs: Vec<_> = (0..2).map(|_| g.register()).collect();
    assert_eq!((g.inner.fail_barriers.failed.load(SeqCst), g.stats().membarrier_failures), (1, 1));
    drop(regs);
    assert_all_free(&g);
}

/// A CPU → task switch whose F2 fails, in a CAS group: the sweep still takes every idle core CID (a slot CAS
/// against a borrow CAS needs no barrier), and a guard held across the switch resolves its core's CID at its exit.
#[test]
fn a_failed_cpu_to_task_barrier_still_sweeps_a_cas_group() {
    let Some(g) = asym_group("a_failed_cpu_to_task_barrier_cas", 4) else { return };
    let mut regs: Vec<_> = (0..5).map(|_| g.register()).collect(); // 5 > max_cids 4: per-CPU
    assert_eq!(g.mode(), Mode::PerCpu);
    for (i, r) in regs.iter_mut().enumerate() {
        r.set_cpu(Some(i % 4)).unwrap();
        drop(r.enter()); // each core owns a CID now
    }
    fail_for_good(&g, libc::EPERM);
    let mut holder = regs.remove(0);
    let guard = holder.enter(); // core 0's CID, BUSY across the switch
    let taken = g.stats().fixup_takes;
    regs.truncate(0); // one user left < thrs 2: the switch back
    assert_eq!(g.mode(), Mode::PerTask);
    let s = g.stats();
    assert_eq!((s.membarrier_failures, s.switches_to_per_task), (1, 1), "{s:?}");
    assert_eq!(s.fixup_takes - taken, 3, "the three idle cores were swept: {s:?}");
    drop(guard); // its exit sees per-task mode and adopts core 0's CID
    let audit = g.audit();
    assert!(audit.is_consistent() && audit.bits == 1 && audit.owners == 1, "{audit:?}");
    drop(holder);
    assert_all_free(&g);
}

/// The same in an rseq group, where a sweep without the RSEQ membarrier could free a CID that a sequence in flight
/// is about to borrow: the sweep takes nothing, the idle core CIDs stay (counted, consistent) until the last drop.
/// The switch is called directly: on a machine with 2 possible CPUs the switch-back threshold is 1, so no drop
/// with users left reaches it.
#[test]
fn a_failed_cpu_to_task_barrier_skips_an_rseq_sweep() {
    let g = Group::new();
    if !g.uses_rseq() {
        eprintln!("a_failed_cpu_to_task_barrier_skips_an_rseq_sweep: no rseq group here, nothing to check");
        return;
    }
    let inner = &*g.inner;
    let regs: Vec<_> = (0..inner.cores + 1).map(|_| g.register()).collect();
    assert_eq!(g.mode(), Mode::PerCpu);
    let owned: Vec<u32> = (0..inner.cores).map(|_| inner.bitmap.get()).collect();
    for (cpu, &c) in owned.iter().enumerate() {
        inner.slot(slot_at(cpu, 0)).store(slot::owned(c), Release); // every core owns a CID, idle
    }
    fail_for_good(&g, libc::EPERM);
    let taken = g.stats().fixup_takes;
    inner.switch_to_per_task(&mut inner.life.lock());
    assert_eq!(g.mode(), Mode::PerTask);
    let swept = owned.iter().enumerate().any(|(cpu, &c)| inner.slot(slot_at(cpu, 0)).load(Relaxed) != slot::owned(c));
    assert!(!swept, "nothing swept");
    let s = g.stats();
    assert_eq!((s.membarrier_failures, s.fixup_takes - taken), (1, 0), "{s:?}");
    assert!(g.audit().is_consistent(), "{:?}", g.audit());
    drop(regs); // the last drop's sweep needs no barrier (lock order): everything is free
    assert_all_free(&g);
}

/// An rseq claim (an exit that lost a switch, an adoption take-back, a steal) whose RSEQ membarrier fails gives
/// its claim back: the slot is idle again, the core keeps its CID, the claim lock is free, and the failure counts.
/// A drain of deferred exits does the same with every slot it claimed.
#[test]
fn a_failed_claim_barrier_gives_the_claim_back() {
    let _no_fork = crate::tests::FORKS.read().unwrap_or_else(|e| e.into_inner());
    let g = Group::new();
    if !g.uses_rseq() {
        eprintln!("a_failed_claim_barrier_gives_the_claim_back: no rseq group here, nothing to check");
        return;
    }
    let inner = &*g.inner;
    let _reg = g.register(); // per-task mode: no core may own a CID, as after a switch an exit lost
    fail_for_good(&g, libc::EPERM);
    let counters = Counters::default();
    let c = inner.bitmap.get();
    let idle = slot::owned(c);
    inner.slot(0).store(idle, Release);
    assert!(!inner.take_idle(0, idle, Taker::Exit, &counters), "no barrier, no take");
    assert_eq!(inner.slot(0).load(Relaxed), idle, "the claim went back");
    assert!(inner.bitmap.is_set(c));
    assert_eq!(inner.claim.load(Relaxed), 0, "the claim lock is free");

    // A drain: the test holds the claim lock, an exit defers its slot to it, the unlock drains and fails.
    let d = inner.bitmap.get();
    let other = slot_at(1 % inner.cores, 0);
    inner.slot(other).store(slot::owned(d), Release);
    assert!(inner.try_claim_lock());
    assert!(!inner.take_idle(other, slot::owned(d), Taker::Exit, &counters), "deferred");
    inner.claim_unlock(&counters);
    assert_eq!(inner.slot(0).load(Relaxed), idle, "the drain gave its claims back");
    assert_eq!(inner.slot(other).load(Relaxed), slot::owned(d));
    assert_eq!((inner.claim.load(Relaxed), inner.claims_deferred.load(Relaxed)), (0, 0));
    let mut t = Stats::totals();
    counters.add_to(&mut t);
    let s = Stats::from_totals(&t, 0);
    assert_eq!((s.membarrier_failures, s.fixup_takes, s.exit_deferred), (2, 0, 1), "{s:?}");

    // Once membarrier works again, the next claim takes.
    inner.fail_barriers.set(0, 0);
    assert!(inner.take_idle(0, idle, Taker::Exit, &counters));
    inner.bitmap.clear(c);
    assert!(inner.take_idle(other, slot::owned(d), Taker::Exit, &counters));
    inner.bitmap.clear(d);
    assert!(g.audit().is_consistent(), "{:?}", g.audit());
}

/// Threads churn a virtual group across both switches while every membarrier fails: an independent occupancy
/// check sees no CID held twice, and everything is free at the end.
#[test]
fn churn_with_every_membarrier_failing_stays_exclusive() {
    let Some(g) = asym_group("churn_with_every_membarrier_failing", 4) else { return };
    fail_for_good(&g, libc::EPERM);
    let held: Vec<std::sync::atomic::AtomicBool> = (0..1024).map(|_| Default::default()).collect();
    // In the first round every worker registers before any enters: 6 users of 4 cores, per-CPU at least once on
    // any machine (left to thread start-up, the workers of a many-CPU machine can run one after another).
    let registered = std::sync::Barrier::new(6);
    std::thread::scope(|s| {
        for w in 0..6 {
            let (g, held, registered) = (&g, &held, &registered);
            s.spawn(move || {
                for round in 0..100 {
                    let mut reg = g.register();
                    if round == 0 {
                        registered.wait();
                    }
                    reg.set_cpu(Some((w + round) % 4)).unwrap();
                    for _ in 0..20 {
                        let guard = reg.enter();
                        let cid = guard.cid().get();
                        assert!(!held[cid].swap(true, SeqCst), "CID {cid} held twice");
                        std::thread::yield_now();
                        held[cid].store(false, SeqCst);
                    }
                }
            });
        }
    });
    let s = g.stats();
    assert!(s.membarrier_failures > 0 && s.switches_to_per_task > 0, "{s:?}");
    assert_all_free(&g);
}

/// How a forked child ended.
#[derive(Debug, PartialEq, Eq)]
enum Child {
    /// `_exit(code)`: 0 success, 101 a panic.
    Exited(i32),
    /// Killed by this signal.
    Signalled(i32),
    /// Still running after the limit (then killed).
    Hung,
}

/// No other test forks, or holds a group's claim lock by hand, while this is alive (`tests::FORKS`).
fn forks_excluded() -> std::sync::RwLockWriteGuard<'static, ()> {
    crate::tests::FORKS.write().unwrap_or_else(|e| e.into_inner())
}

/// Forks: the child runs `child` and `_exit`s with its result (101 if it panicked); the parent runs `parent` as
/// soon as `fork` returns there, then waits up to 10 s for the child. The child prints nothing (another thread may
/// have held the output lock at the fork).
fn in_child(parent: impl FnOnce(), child: impl FnOnce() -> i32) -> Child {
    let forking = forks_excluded();
    fork_excluded(&forking, parent, child)
}

/// `in_child` for a caller that already excludes other tests' forks.
fn fork_excluded(
    _forking: &std::sync::RwLockWriteGuard<'static, ()>,
    parent: impl FnOnce(),
    child: impl FnOnce() -> i32,
) -> Child {
    // SAFETY: fork has no preconditions; the child runs `child` and `_exit`s, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: _exit has no preconditions.
        unsafe { libc::_exit(code) }
    }
    parent();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut status = 0;
        // SAFETY: our own child; `status` is a valid out-pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(rc >= 0, "waitpid: {}", std::io::Error::last_os_error());
        if rc == pid {
            return if libc::WIFEXITED(status) {
                Child::Exited(libc::WEXITSTATUS(status))
            } else {
                Child::Signalled(libc::WTERMSIG(status))
            };
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: kill and reap our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Child::Hung;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Another thread holds `lock` (taken by `take`, given back by `give_back`) for 200 ms; the test forks while it
/// does (it waits until the lock is held). Returns whether the lock was being given back by the time `fork`
/// returned in the parent, and how the child ended.
///
/// Other tests' forks are excluded from before the lock is taken: every fork's prepare handler holds every live
/// group's locks, this test's group included, so a claim lock tried during another test's fork is found held
/// (that made this test's holder fail to take it, in some runs in many-CPU guests). And the holder owns the
/// sender: a holder that fails before it holds the lock fails the test instead of leaving it waiting for ever.
fn fork_while_held<L>(
    take: impl FnOnce() -> L + Send,
    give_back: impl FnOnce(L) + Send,
    child: impl FnOnce() -> i32,
) -> (bool, Child) {
    let forking = forks_excluded();
    let released = &std::sync::atomic::AtomicBool::new(false);
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            let lock = take();
            held_tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(200));
            // Before the release: a fork that waited for the release (which happens-before its prepare handler's
            // acquire) reads true; one that did not wait ran during the sleep and reads false.
            released.store(true, SeqCst);
            give_back(lock);
        });
        held_rx.recv().expect("the other thread did not take the lock");
        let mut released_at_fork = false;
        let child = fork_excluded(&forking, || released_at_fork = released.load(SeqCst), child);
        (released_at_fork, child)
    })
}

/// fork while another thread holds a group's lifecycle lock (inside a register, drop, switch or `stats`): the
/// fork handlers wait for it, so the child can register, enter and drop. Without them the fork returned at once
/// and the child hung in its first `register` (checked by hand with `install` emptied: `(false, Hung)`).
#[test]
fn a_fork_waits_for_a_lifecycle_lock_another_thread_holds() {
    let g = Group::builder().virtual_cpus(2).build().unwrap();
    let (released_at_fork, child) = fork_while_held(
        || g.inner.life.lock(),
        drop,
        || {
            let mut reg = g.register();
            drop(reg.enter());
            drop(reg);
            i32::from(g.users() != 0)
        },
    );
    assert_eq!((released_at_fork, child), (true, Child::Exited(0)));
}

/// fork while another thread holds a group's claim lock (inside a claim or a drain): the handlers wait for it, so
/// the child's claims can take the lock. Without them the child found it held for ever: its exits would defer to
/// a holder that does not exist, its stealers give up, and CIDs would stay on cores.
#[test]
fn a_fork_waits_for_a_claim_lock_another_thread_holds() {
    let g = Group::new();
    let inner = &*g.inner;
    let (released_at_fork, child) = fork_while_held(
        || assert!(inner.try_claim_lock()),
        |()| inner.claim_unlock(&Counters::default()),
        || {
            if !inner.try_claim_lock() {
                return 1;
            }
            inner.claim_unlock(&Counters::default());
            0
        },
    );
    assert_eq!((released_at_fork, child), (true, Child::Exited(0)));
}

/// A child forked while the parent's groups were in use gets them as they were: the forking thread's
/// registrations work (an explicit one, and the thread-local layer's, whose guard it held across the fork),
/// another thread's registration keeps its CID and counts as a user, and the child's new registrations never get
/// a CID the frozen one holds.
#[test]
fn in_the_child_other_threads_registrations_are_frozen_with_their_cids() {
    let g = Group::builder().virtual_cpus(4).build().unwrap();
    let mut mine = g.register();
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn({
        let g = g.clone();
        move || {
            let mut reg = g.register();
            let guard = reg.enter();
            tx.send(guard.cid().get()).unwrap();
            done_rx.recv().unwrap(); // inside the guard until the test is done
        }
    });
    let theirs = rx.recv().unwrap();
    let guard = g.enter(); // the thread-local layer's registration, inside a guard across the fork
    let my_cid = guard.cid().get();
    let child = in_child(
        || {},
        || {
            let before = g.users();
            drop(guard);
            drop(g.enter());
            let mut regs: Vec<_> = (0..6).map(|_| g.register()).collect(); // crosses into per-CPU mode
            for (i, r) in regs.iter_mut().enumerate() {
                r.set_cpu(Some(i % 4)).unwrap();
                let cid = r.enter().cid().get();
                if cid == theirs {
                    return 1; // the frozen guard's CID handed out again
                }
            }
            drop(regs);
            let cid = mine.enter().cid().get();
            // Three users are still per-CPU mode here (thrs 2): `mine` borrows a core's CID.
            if g.users() != before || cid == theirs || g.mode() != Mode::PerCpu {
                return 2;
            }
            i32::from(!g.audit().duplicates.is_empty()) * 3
        },
    );
    assert_eq!(child, Child::Exited(0), "my CID {my_cid}, theirs {theirs}");
    done_tx.send(()).unwrap();
    other.join().unwrap();
}
