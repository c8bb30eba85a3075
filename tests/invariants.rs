//! Invariants I1–I9 with real threads, each checked by an independent checker (tests/common). Each test is
//! bounded by iteration counts (the whole file runs in well under a second on 2 cores, plus about 12 s in a debug
//! build for the one that fills a group's whole CID space).

mod common;

use common::{patience, Gate, Occupancy, Payload, StopOnDrop};
use mmcid::{CidKind, CpuSet, Error, Group, Mode};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

/// A group of `cores` virtual cores whose cores own one CID each (`cids_per_core(1)`): the kernel's per-CPU design
/// exactly, where a thread finding its core's CID held takes a temporary. Most scenario tests use it; `sim_sets`
/// gives the default CID sets (design.md §2.6).
fn sim(cores: usize) -> Group {
    Group::builder().virtual_cpus(cores).cids_per_core(1).build().unwrap()
}

/// A group of `cores` virtual cores with the default CID sets (each core may own up to `MAX_CIDS_PER_CORE` CIDs).
fn sim_sets(cores: usize) -> Group {
    Group::builder().virtual_cpus(cores).build().unwrap()
}

fn assert_quiescent_empty(g: &Group) {
    let audit = g.audit();
    assert!(audit.is_consistent(), "I5: {audit:?}");
    assert_eq!(audit.bits, 0, "I5: CIDs left marked after the last registration: {audit:?}");
    assert_eq!(g.users(), 0);
    assert_eq!(g.mode(), Mode::PerTask);
}

/// I1 + I8 under churn that crosses the per-task/per-CPU boundary both ways: workers enter and leave (some yield
/// or sleep inside their guards, several share a core), while churners register and drop registrations.
/// Where the kernel's switch-back threshold, `max(min(opt - opt/4, cores/2), 1)` with `opt` the allowed cores,
/// exceeds 1, the group must be back in per-task mode at the midway drain's one user, who holds a guard: that
/// switch ran under the live guard (the final drops cannot show it: the last drop always crosses back). With a
/// threshold of 1 (2 cores) either mode is right there: only zero users switch back, which may or may not have
/// happened between two workers' rounds before the drain.
fn churn(group: Group, virtual_cores: Option<usize>, workers: usize, rounds: usize) {
    let (allowed, cores) = (group.cpus().len(), group.cores());
    let at_one_user = churn_with(group, virtual_cores, workers, rounds, |_, _| {});
    let thrs = (allowed - allowed / 4).min(cores / 2).max(1);
    if thrs > 1 {
        assert_eq!(at_one_user, Mode::PerTask, "at one user, {allowed} allowed of {cores} cores (thrs {thrs})");
    }
}

/// `churn`, with `alongside` running on its own thread during the churn (e.g. widening the group's cores); it
/// gets the group and the count of guards dropped so far. Returns the group's mode at the midway drain's one
/// user.
fn churn_with(
    group: Group,
    virtual_cores: Option<usize>,
    workers: usize,
    rounds: usize,
    alongside: impl FnOnce(Group, Arc<AtomicU64>) + Send + 'static,
) -> Mode {
    let cores = virtual_cores.unwrap_or(group.cores());
    let occ = Arc::new(Occupancy::new(4096));
    let payload = Arc::new(Payload::new(4096));
    let guards = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Midway drain, so that the run crosses back to per-task while it goes on (the final stats cannot show it:
    // the last drops always cross back): at round rounds / 2 every worker but 0 has unregistered and the churner
    // holds nothing (gate A) while worker 0 holds a guard (a switch back here, where the threshold allows it at
    // one user, runs under that live guard); then worker 0 leaves too (gate C: no user, per-task for sure) and
    // everyone carries on (gate D). The test thread looks at the group between the gates.
    let gate = Arc::new(Gate::new(workers + 2));
    let draining = Arc::new(AtomicBool::new(false));
    // In the first round and the first after the drain every worker registers before any enters: more workers
    // than `max_cids` are users at once, so the group goes per-CPU in both halves on any machine (left to thread
    // start-up, a worker could finish its rounds before the last one started, as in a 16-vCPU guest).
    let registered = Arc::new(Gate::new(workers));
    // I2 hard bound: below users + K·cores, and users never exceed the workers plus the churner's 5 extras.
    let hard_bound = workers + 5 + group.cids_per_core() * group.cores();
    // The workers' last round waits for `alongside` to have returned, so that the churn goes on after it however
    // the threads are scheduled.
    let side_done = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for w in 0..workers {
        let (group, occ, payload, guards) = (group.clone(), occ.clone(), payload.clone(), guards.clone());
        let (gate, draining, side_done) = (gate.clone(), draining.clone(), side_done.clone());
        let registered = registered.clone();
        handles.push(thread::spawn(move || {
            for round in 0..rounds {
                if round == rounds / 2 {
                    draining.store(true, SeqCst);
                    if w == 0 {
                        let mut reg = group.register();
                        let guard = reg.enter();
                        let cid = guard.cid().get();
                        occ.enter(cid);
                        payload.bump(cid);
                        gate.wait(); // A
                        gate.wait(); // B
                        occ.exit(cid);
                        drop(guard);
                        guards.fetch_add(1, SeqCst);
                        drop(reg);
                    } else {
                        gate.wait(); // A
                        gate.wait(); // B
                    }
                    gate.wait(); // C
                    gate.wait(); // D
                }
                if round == rounds - 1 {
                    while !side_done.load(SeqCst) {
                        thread::yield_now();
                    }
                }
                let mut reg = group.register();
                if round == 0 || round == rounds / 2 {
                    registered.wait();
                }
                if virtual_cores.is_some() {
                    reg.set_cpu(Some((w + round) % cores)).unwrap();
                }
                for i in 0..20 {
                    let guard = reg.enter();
                    let cid = guard.cid().get();
                    occ.enter(cid);
                    assert!(cid < hard_bound, "I2 hard bound: CID {cid} not below {hard_bound}");
                    payload.bump(cid);
                    if i == 13 && round % 2 == 1 {
                        // I7 under churn: a panic inside the guard releases the CID during unwinding.
                        occ.exit(cid);
                        guards.fetch_add(1, SeqCst);
                        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                            let _inside = guard;
                            panic!("panic inside a guard (expected by the test)");
                        }));
                        assert!(unwound.is_err());
                        continue;
                    }
                    if i % 7 == 0 {
                        thread::sleep(Duration::from_micros(200)); // descheduled inside the guard
                    }
                    occ.exit(cid);
                    drop(guard);
                    guards.fetch_add(1, SeqCst);
                }
            }
        }));
    }
    let side = {
        let (group, guards, side_done) = (group.clone(), guards.clone(), side_done.clone());
        thread::spawn(move || {
            let _done = StopOnDrop(&side_done);
            alongside(group, guards)
        })
    };
    let churner = {
        let (group, stop) = (group.clone(), stop.clone());
        let (gate, draining) = (gate.clone(), draining.clone());
        thread::spawn(move || {
            let (mut n, mut drained) = (0, false);
            while !stop.load(SeqCst) {
                if !drained && draining.load(SeqCst) {
                    (0..4).for_each(|_| gate.wait()); // A to D, holding nothing
                    drained = true;
                }
                let extra: Vec<_> = (0..(n % 6)).map(|_| group.register()).collect();
                thread::yield_now();
                drop(extra);
                n += 1;
            }
            assert!(drained, "the churner took part in the drain");
            n
        })
    };
    gate.wait(); // A: one user, holding a guard
    let one_user = (group.users(), group.mode());
    gate.wait(); // B
    gate.wait(); // C: nobody
    assert_eq!((one_user.0, group.users(), group.mode()), (1, 0, Mode::PerTask), "midway drain");
    let midway = group.stats();
    gate.wait(); // D
    {
        // Stops the churner even if a worker's failure unwinds through here.
        let _stop = StopOnDrop(&stop);
        for h in handles {
            h.join().unwrap();
        }
    }
    churner.join().unwrap();
    side.join().unwrap();
    assert_eq!(occ.held(), 0);
    assert_eq!(payload.sum(), guards.load(SeqCst), "I8/I1: a plain per-CID increment was lost");
    let stats = group.stats();
    // Both ways before the drain's end, and per-CPU again after it where the workers outnumber the cores.
    assert!(midway.switches_to_per_cpu >= 1 && midway.switches_to_per_task >= 1, "midway: {midway:?}");
    if workers > cores {
        assert!(stats.switches_to_per_cpu > midway.switches_to_per_cpu, "not per-CPU again: {stats:?}");
    }
    eprintln!(
        "churn: at one user (guard live) {:?}; switches to per-CPU {} / to per-task {} by the drain, {} / {} in all",
        one_user.1,
        midway.switches_to_per_cpu,
        midway.switches_to_per_task,
        stats.switches_to_per_cpu,
        stats.switches_to_per_task
    );
    let categorised = stats.enter_task_fast
        + stats.enter_cpu_fast
        + stats.enter_cpu_extra
        + stats.enter_task_slow
        + stats.enter_cpu_slow
        + stats.enter_temporary;
    assert_eq!(categorised, guards.load(SeqCst), "every enter is counted in exactly one path: {stats:?}");
    assert_eq!(stats.bitmap_sets - stats.bitmap_clears, stats.cids_in_use, "bitmap counters balance: {stats:?}");
    assert_quiescent_empty(&group);
    one_user.1
}

#[test]
fn i1_i8_churn_crossing_modes_virtual_cores() {
    // 4 virtual cores: 5+ users -> per-CPU, back below thrs 2; 6 workers on 4 cores share cores.
    churn(sim(4), Some(4), 6, 40);
}

/// The same with CID sets (design.md §2.6): workers that sleep inside their guards make the others on their core
/// borrow extra CIDs, and the occupancy switch (§3.1) may take the group back to per-task mode at any time.
#[test]
fn i1_i8_churn_crossing_modes_virtual_cores_cid_sets() {
    churn(sim_sets(4), Some(4), 6, 40);
}

#[test]
fn i1_i8_churn_crossing_modes_real_cores() {
    // The machine's own cores and the kernel's CPU number; more workers than cores forces per-CPU mode. Borrows
    // are restartable sequences where the platform has them (design.md §4.1.1).
    let group = Group::new();
    assert_eq!(group.uses_rseq(), rseq_expected(), "restartable sequences where glibc registered rseq");
    let workers = real_core_workers(&group);
    churn(group, None, workers, 20);
}

/// Workers for a churn over the machine's real cores: more than the cores, so the group goes per-CPU whatever
/// the machine (5 on CI's 2 cores).
fn real_core_workers(group: &Group) -> usize {
    (2 * group.cpus().len() + 1).max(5)
}

#[test]
fn i1_i8_churn_crossing_modes_real_cores_cas() {
    let group = Group::builder().restartable_sequences(false).build().unwrap();
    assert!(!group.uses_rseq());
    let workers = real_core_workers(&group);
    churn(group, None, workers, 20);
}

/// Whether this platform should give real-core groups rseq borrows: Linux on x86_64 with glibc (not built with
/// `--cfg mmcid_portable`), where glibc registered an area (`__rseq_size` is 0 when registration failed, e.g.
/// under valgrind) and the kernel has the RSEQ membarrier. Nowhere else.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(mmcid_portable)))]
fn rseq_expected() -> bool {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no other preconditions.
    let size = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()) };
    // SAFETY: membarrier QUERY (0) takes no pointers; it returns the supported commands.
    let membarrier = unsafe { libc::syscall(libc::SYS_membarrier, 0, 0, 0) };
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 7;
    !size.is_null()
        // SAFETY: glibc defines `__rseq_size` as a `const unsigned int`. At least 16: the area's `rseq_cs`
        // (bytes 8..16), which the sequences arm, must be registered.
        && unsafe { *(size as *const u32) } >= 16
        && membarrier > 0
        && membarrier & (PRIVATE_EXPEDITED | PRIVATE_EXPEDITED_RSEQ) == PRIVATE_EXPEDITED | PRIVATE_EXPEDITED_RSEQ
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu", not(mmcid_portable))))]
fn rseq_expected() -> bool {
    false
}

/// The process's first two allowed CPUs, or `None` (and a line saying `test` has nothing to check) if it has one.
fn two_allowed_cpus(test: &str) -> Option<[usize; 2]> {
    let cpus: Vec<usize> = CpuSet::current().unwrap().iter().take(2).collect();
    let two = <[usize; 2]>::try_from(cpus).ok();
    if two.is_none() {
        eprintln!("{test}: fewer than two allowed CPUs, nothing to check");
    }
    two
}

/// Enters `reg` once from a thread pinned to real CPU `cpu`: the guard's kind and CID. On the portable path (no
/// current-CPU call on macOS, and none used with `--cfg mmcid_portable`) a pinned thread's core is not its CPU, so
/// the thread declares the core instead (`Registration::set_cpu`, as `Runtime` does there): the same enter on
/// the same core.
fn enter_pinned(cpu: usize, reg: &mut mmcid::Registration) -> (CidKind, usize) {
    let portable = cfg!(any(not(target_os = "linux"), mmcid_portable));
    thread::scope(|s| {
        s.spawn(|| {
            if portable {
                reg.set_cpu(Some(cpu)).unwrap();
            } else {
                assert!(core_affinity::set_for_current(core_affinity::CoreId { id: cpu }), "pin to CPU {cpu}");
            }
            let (kind, cid) = {
                let g = reg.enter();
                (g.kind(), g.cid().get())
            };
            reg.set_cpu(None).unwrap();
            (kind, cid)
        })
        .join()
        .unwrap()
    })
}

/// I4 in per-CPU mode through a steal (design.md §4.5), which in rseq groups is a claim (CLAIM, the RSEQ
/// membarrier, CAS; §4.1.1), with real threads pinned to two real CPUs: core A parks CID 0, core B CID 1; once
/// one user is left, `max_cids` is 1 and B's next enter must take CID 0 from A's slot. Needs a machine whose
/// switch-back threshold stays at 1 (two possible CPUs, as on CI); elsewhere the group goes back to per-task mode
/// and the test says so and stops.
#[test]
fn i4_steal_from_an_idle_core_rseq_and_cas() {
    let Some(cpus) = two_allowed_cpus("i4_steal_from_an_idle_core") else { return };
    for rseq in [true, false] {
        // Over exactly two allowed CPUs (so three users are per-CPU mode on any machine).
        let two = CpuSet::from_cpus(cpus).unwrap();
        let group = Group::builder().cpus(two).restartable_sequences(rseq).build().unwrap();
        assert_eq!(group.uses_rseq(), rseq && rseq_expected());
        let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
        assert_eq!(group.mode(), Mode::PerCpu);
        assert_eq!(enter_pinned(cpus[0], &mut regs[0]), (CidKind::Core(cpus[0]), 0));
        assert_eq!(enter_pinned(cpus[1], &mut regs[1]), (CidKind::Core(cpus[1]), 1));
        let mut last = regs.pop().unwrap();
        drop(regs);
        if group.mode() != Mode::PerCpu {
            // With 4 or more possible CPUs the threshold is 2 (min(opt - opt/4, cores/2)), so one user switches back.
            eprintln!(
                "i4_steal_from_an_idle_core (rseq {rseq}): {} possible CPUs, back to per-task at one user: skipped",
                group.cores()
            );
            continue;
        }
        assert_eq!(group.max_cids(), 1);
        assert_eq!(enter_pinned(cpus[1], &mut last), (CidKind::Core(cpus[1]), 0), "CID 0 stolen from CPU {}", cpus[0]);
        let s = group.stats();
        assert_eq!((s.steals, s.enter_converge), (1, 1), "rseq {rseq}: {s:?}");
        assert!(group.audit().is_consistent());
        drop(last);
        assert_quiescent_empty(&group);
    }
}

/// The same steal, on any machine with two allowed CPUs: the group's allowed set is CPU A alone (`max_cids` 1,
/// per-CPU mode with two users, switch-back threshold 1 whatever the number of possible CPUs), so a thread pinned
/// to CPU B, outside the set, finds core B's first CID out of range and must take CID 0 from A's slot (a claim in
/// rseq groups, a CAS otherwise). Where `i4_steal_from_an_idle_core_rseq_and_cas` skips (4 or more possible
/// CPUs), this one still reaches the steal.
#[test]
fn i4_steal_by_a_core_outside_the_allowed_set_rseq_and_cas() {
    let Some([a, b]) = two_allowed_cpus("i4_steal_by_a_core_outside_the_allowed_set") else { return };
    for rseq in [true, false] {
        let only_a = CpuSet::from_cpus([a]).unwrap();
        let group = Group::builder().cpus(only_a).restartable_sequences(rseq).build().unwrap();
        assert_eq!(group.uses_rseq(), rseq && rseq_expected());
        let mut regs: Vec<_> = (0..2).map(|_| group.register()).collect();
        assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 1));
        assert_eq!(enter_pinned(a, &mut regs[0]), (CidKind::Core(a), 0));
        assert_eq!(enter_pinned(b, &mut regs[1]), (CidKind::Core(b), 0), "rseq {rseq}: CID 0 stolen from CPU {a}");
        let s = group.stats();
        assert_eq!((s.steals, s.enter_converge), (1, 1), "rseq {rseq}: {s:?}");
        assert!(group.audit().is_consistent());
        drop(regs);
        assert_quiescent_empty(&group);
    }
}

/// I1 + I8 for rseq borrows (design.md §4.1.1) with the kernel doing its worst: 4 unpinned threads per core enter
/// in tight loops, so sequences are preempted, migrated and aborted, and every worker leaves and rejoins between
/// rounds, so the population can cross the per-task/per-CPU boundary both ways and pass through one user, where
/// convergence steals a parked CID from the other core (a claim against the sequences; how often is up to the
/// scheduler, so the counts are printed: `i4_steal_from_an_idle_core_rseq_and_cas` makes the steal for sure).
/// Every worker registers before any enters, so the group is per-CPU at the start on any machine. 2000 enters per
/// round on 2 cores, the same total spread over the workers of a larger machine (`common::per_thread`). Run with
/// CAS borrows too, as the baseline of the same checks.
#[test]
fn i1_i8_borrows_against_preemption_and_switches() {
    const ROUNDS: usize = 30;
    for (rseq, k) in [(true, 1), (false, 1), (true, mmcid::MAX_CIDS_PER_CORE), (false, mmcid::MAX_CIDS_PER_CORE)] {
        let group = Group::builder().restartable_sequences(rseq).cids_per_core(k).build().unwrap();
        assert_eq!(group.uses_rseq(), rseq && rseq_expected());
        let workers = 4 * group.cpus().len();
        let enters = common::per_thread(2000, workers) as usize;
        let occ = Arc::new(Occupancy::new(4096));
        let payload = Arc::new(Payload::new(4096));
        let registered = Arc::new(Gate::new(workers));
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (group, occ, payload, registered) =
                    (group.clone(), occ.clone(), payload.clone(), registered.clone());
                thread::spawn(move || {
                    for round in 0..ROUNDS {
                        let mut reg = group.register();
                        if round == 0 {
                            registered.wait(); // 4 users per core: per-CPU mode
                        }
                        for _ in 0..enters {
                            let guard = reg.enter();
                            let cid = guard.cid().get();
                            occ.enter(cid);
                            payload.bump(cid);
                            occ.exit(cid);
                        }
                        drop(reg);
                        thread::sleep(Duration::from_micros(((w + round) % 4 * 300) as u64));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(occ.held(), 0);
        let total = (workers * ROUNDS * enters) as u64;
        assert_eq!(payload.sum(), total, "I8/I1: a plain per-CID increment was lost (rseq {rseq})");
        let s = group.stats();
        // With one CID per core, per-CPU mode lasts until the last rounds (the kernel's rules); with CID sets the
        // occupancy switch (design.md §3.1) may end it early, so only the kernel's design is held to borrowing.
        assert!(k > 1 || s.enter_cpu_fast > 0, "per-CPU borrows exercised: {s:?}");
        // Per-CPU at least once (every worker registered at the start). (How often the rounds cross back before
        // the end, through a moment with no user, is up to the scheduler: printed, not asserted.)
        assert!(s.switches_to_per_cpu >= 1, "never per-CPU: {s:?}");
        eprintln!(
            "rseq {rseq}, {k} CIDs per core: {} borrows, {} extra, {} temporaries, {} steals, switches {} / {}",
            s.enter_cpu_fast,
            s.enter_cpu_extra,
            s.enter_temporary,
            s.steals,
            s.switches_to_per_cpu,
            s.switches_to_per_task
        );
        assert_quiescent_empty(&group);
    }
}

#[test]
fn i1_i8_churn_with_affinity_widening() {
    // 2 of 8 virtual cores allowed at first, widened to 4 then 8 while the workers churn: max_cids and the
    // switch-back threshold move under them.
    // Each widening waits for the workers' progress (not a timer), and records how many guards had been dropped
    // when it was done: fewer than the run's total (the workers' last round waits for the widenings), so the
    // churn went on across both.
    let group = Group::builder().virtual_cpus(8).cpus_virtual(0..2).build().unwrap();
    let widened = Arc::new(std::sync::Mutex::new(Vec::new()));
    let w = widened.clone();
    churn_with(group.clone(), Some(8), 6, 30, move |g, guards| {
        for (upto, after) in [(4, 200), (8, 600)] {
            while guards.load(SeqCst) < after {
                thread::yield_now();
            }
            g.set_cpus_allowed(&CpuSet::virtual_set(0..upto).unwrap()).unwrap();
            w.lock().unwrap().push(guards.load(SeqCst));
        }
    });
    assert_eq!(group.cpus().len(), 8);
    let s = group.stats();
    // Every enter counts in exactly one of these (checked in `churn_with`).
    let total = s.enter_task_fast
        + s.enter_cpu_fast
        + s.enter_cpu_extra
        + s.enter_task_slow
        + s.enter_cpu_slow
        + s.enter_temporary;
    let widened = widened.lock().unwrap().clone();
    assert_eq!(widened.len(), 2);
    for at in widened {
        assert!(at < total, "a widening after the churn: at {at} of at least {total} guards");
    }
}

#[test]
fn i1_i8_churn_membarrier_fallback() {
    let group = Group::builder().virtual_cpus(4).asymmetric_fences(false).build().unwrap();
    assert!(!group.uses_membarrier());
    churn(group, Some(4), 6, 20);
}

/// I2 soft bound: with membership unchanged and every thread having entered once since the last change, every CID
/// handed out is below max_cids, in both modes.
#[test]
fn i2_steady_state_range_both_modes() {
    for threads in [3, 9] {
        let expected = if threads == 3 { Mode::PerTask } else { Mode::PerCpu };
        let group = sim(8);
        let barrier = Arc::new(Gate::new(threads));
        let max_seen = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (group, barrier, max_seen) = (group.clone(), barrier.clone(), max_seen.clone());
                thread::spawn(move || {
                    let mut reg = group.register();
                    reg.set_cpu(Some(t % 8)).unwrap();
                    barrier.wait(); // membership complete
                    drop(reg.enter());
                    barrier.wait(); // everyone entered once since the last change
                    assert_eq!(group.mode(), expected, "{threads} threads on 8 cores");
                    for _ in 0..50 {
                        let g = reg.enter();
                        if g.kind() != CidKind::Temporary {
                            max_seen.fetch_max(g.cid().get(), SeqCst);
                        }
                    }
                    barrier.wait();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(group.mode(), Mode::PerTask, "all gone");
        let max = if threads == 3 { 3 } else { 8 };
        assert!(max_seen.load(SeqCst) < max, "{expected:?}: CID {} >= max_cids {max}", max_seen.load(SeqCst));
    }
}

/// I3: per-task mode keeps a registration's CID across guards; per-CPU mode gives threads alternating on one core
/// that core's CID.
#[test]
fn i3_stability() {
    let group = sim(4);
    let mut a = group.register();
    let mut b = group.register();
    let ca = a.enter().cid();
    let cb = b.enter().cid();
    assert_ne!(ca, cb);
    for _ in 0..10 {
        assert_eq!(a.enter().cid(), ca);
        assert_eq!(b.enter().cid(), cb);
    }
    // 5 users on 4 cores: per-CPU. Two registrations alternating on core 2 both see core 2's CID.
    let rest: Vec<_> = (0..3).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    a.set_cpu(Some(2)).unwrap();
    b.set_cpu(Some(2)).unwrap();
    let core_cid = a.enter().cid();
    for _ in 0..10 {
        let g = b.enter();
        assert_eq!((g.cid(), g.kind()), (core_cid, CidKind::Core(2)));
        drop(g);
        assert_eq!(a.enter().cid(), core_cid);
    }
    drop(rest);
    drop((a, b));
    assert_quiescent_empty(&group);
}

/// I4: shrink to one thread and its next guard has CID 0, in either mode (per-CPU: the CID parked on a core nobody
/// uses is reclaimed).
#[test]
fn i4_convergence_both_modes() {
    // Per-task: the survivor owns CID 3.
    let group = sim(8);
    let mut regs: Vec<_> = (0..4).map(|_| group.register()).collect();
    let mut survivor = regs.pop().unwrap();
    assert_eq!(survivor.enter().cid().get(), 3);
    drop(regs);
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerTask, 1));
    assert_eq!(survivor.enter().cid().get(), 0);
    assert_eq!(group.stats().enter_converge, 1);
    drop(survivor);
    assert_quiescent_empty(&group);

    // Per-CPU with 2 cores (thrs 1: stays per-CPU down to one user). Core 0 owns CID 0, core 1 owns CID 1.
    let group = sim(2);
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    regs[0].set_cpu(Some(0)).unwrap();
    regs[1].set_cpu(Some(1)).unwrap();
    assert_eq!(regs[0].enter().cid().get(), 0);
    assert_eq!(regs[1].enter().cid().get(), 1);
    let mut survivor = regs.remove(1);
    drop(regs);
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 1));
    let g = survivor.enter();
    assert_eq!((g.cid().get(), g.kind()), (0, CidKind::Core(1)), "reclaimed core 0's idle CID");
    drop(g);
    assert_eq!(group.stats().steals, 1);
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 1, "{audit:?}");
    drop(survivor);
    assert_quiescent_empty(&group);
}

/// I2 and I4 after a shrink that leaves several survivors holding out-of-range CIDs: the survivors converge
/// concurrently (each races the others for the low CIDs at its next enter), and once each has entered, every CID
/// they hold at the same time is distinct and below the new `max_cids`, in both modes. (`i4_convergence_both_modes`
/// shrinks to one survivor, where no race is possible.)
#[test]
fn i2_i4_several_survivors_converge_concurrently() {
    // (cores, users before, survivors, mode after): per-task 8 → 3 on 8 cores (max 3: the survivors own CIDs 5, 6
    // and 7); per-CPU 9 → 2 on 4 cores (max 2, thrs 2: stays per-CPU; the survivors enter on cores 3 and 2, which
    // own CIDs 3 and 2, and race to take cores 0 and 1's idle CIDs).
    for (cores, before, keep, mode) in [(8, 8, 3, Mode::PerTask), (4, 9, 2, Mode::PerCpu)] {
        let group = sim(cores);
        let mut regs: Vec<_> = (0..before).map(|_| group.register()).collect();
        for (i, r) in regs.iter_mut().enumerate() {
            r.set_cpu(Some(i % cores)).unwrap();
            drop(r.enter());
        }
        // The survivors are the last registered: in per-task mode they own the highest CIDs.
        let survivors = regs.split_off(before - keep);
        drop(regs);
        assert_eq!((group.mode(), group.max_cids()), (mode, keep), "{cores} cores, {before} → {keep}");
        let gate = Arc::new(Gate::new(keep));
        let handles: Vec<_> = survivors
            .into_iter()
            .enumerate()
            .map(|(i, mut reg)| {
                let gate = gate.clone();
                reg.set_cpu(Some((cores - 1 - i) % cores)).unwrap();
                thread::spawn(move || {
                    gate.wait();
                    for _ in 0..100 {
                        drop(reg.enter()); // the racing convergence
                    }
                    gate.wait();
                    let g = reg.enter();
                    let cid = g.cid().get();
                    gate.wait(); // every survivor holds its guard now
                    gate.wait();
                    drop(g);
                    (cid, reg)
                })
            })
            .collect();
        let held: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let mut cids: Vec<_> = held.iter().map(|(c, _)| *c).collect();
        cids.sort_unstable();
        cids.dedup();
        assert_eq!(cids.len(), keep, "I1: survivors held the same CID at once: {held:?}");
        assert!(cids.iter().all(|&c| c < keep), "I2: a CID not below max_cids {keep}: {cids:?} ({mode:?})");
        // Every survivor started out of range, so each converged at least once.
        let converged = group.stats().enter_converge;
        assert!(converged >= keep as u64, "{mode:?}: {converged} converged");
        if mode == Mode::PerCpu {
            let steals = group.stats().steals;
            assert!(steals >= 2, "per-CPU: each survivor took an idle core's CID, {steals} steals");
        }
        drop(held);
        assert_quiescent_empty(&group);
    }
}

/// CIDs are virtual, not physical (as the kernel's): numbered from 0 whatever the allowed cores' numbers. A group
/// allowed only cores 4..8 of 8 hands out CIDs 0.. in per-task mode and its cores own CIDs below `max_cids` (never
/// a CPU number) in per-CPU mode; a real group on CPU 1 alone hands out CID 0.
#[test]
fn cids_are_virtual_not_cpu_numbers() {
    let group = Group::builder().virtual_cpus(8).cpus_virtual(4..8).build().unwrap();
    let mut regs: Vec<_> = (0..2).map(|_| group.register()).collect();
    let cids: Vec<_> = regs.iter_mut().map(|r| r.enter().cid().get()).collect();
    assert_eq!(cids, [0, 1], "per-task");
    // 6 users on 4 allowed cores: opt 4, max_cids 5, per-CPU.
    regs.extend((0..4).map(|_| group.register()));
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 5));
    for (i, r) in regs.iter_mut().enumerate() {
        r.set_cpu(Some(4 + i % 4)).unwrap();
    }
    for _ in 0..3 {
        for r in regs.iter_mut() {
            let g = r.enter();
            assert!(matches!(g.kind(), CidKind::Core(c) if (4..8).contains(&c)), "{:?}", g.kind());
            assert!(g.cid().get() < 5, "per-CPU: CID {} on core {:?} is not below max_cids 5", g.cid(), g.kind());
        }
    }
    drop(regs);
    assert_quiescent_empty(&group);

    // Real CPUs: a group allowed CPU 1 alone, with 2 users (max_cids 1: per-CPU), entered on CPU 1: core 1 owns
    // CID 0, not CID 1.
    let Ok(one) = CpuSet::from_cpus([1]) else { return }; // a 1-CPU machine, or CPU 1 outside our affinity
    let group = Group::builder().cpus(one).build().unwrap();
    let (mut a, _b) = (group.register(), group.register());
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 1));
    let seen = thread::scope(|s| {
        s.spawn(|| {
            if !core_affinity::set_for_current(core_affinity::CoreId { id: 1 }) {
                return None;
            }
            a.set_cpu(Some(1)).unwrap(); // for groups without rseq (rseq groups read the CPU themselves)
            let g = a.enter();
            Some((g.cid().get(), g.kind()))
        })
        .join()
        .unwrap()
    });
    match seen {
        Some(seen) => assert_eq!(seen, (0, CidKind::Core(1)), "real CPU 1"),
        None => eprintln!("skipped the real-CPU half: could not pin to CPU 1"),
    }
    drop((a, _b));
    assert_quiescent_empty(&group);
}

/// A thread entering on a core outside the group's allowed set (the set is declared, not the union of the
/// threads' affinities; `Group::set_cpus_allowed` documents the cost): its core's CID is out of range in per-CPU
/// mode, so each of its enters takes an idle in-range CID from another core, exclusively (I1) and below
/// `max_cids` (I2). Once the set is widened to where it runs, its core keeps a CID of its own and the steals stop.
#[test]
fn threads_outside_the_allowed_set_steal_until_it_is_widened() {
    // 4 virtual cores, 2 allowed; 3 users > max_cids 2: per-CPU (thrs 1).
    let group = Group::builder().virtual_cpus(4).cpus_virtual([0, 1]).build().unwrap();
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 2));
    for (r, cpu) in regs.iter_mut().zip([0, 1, 3]) {
        r.set_cpu(Some(cpu)).unwrap();
    }
    let rounds = 20;
    let enter_all = |regs: &mut Vec<mmcid::Registration>, max: usize| {
        for _ in 0..rounds {
            for r in regs.iter_mut() {
                let g = r.enter();
                assert!(g.cid().get() < max, "I2: CID {} on {:?}, max_cids {max}", g.cid(), g.kind());
            }
        }
    };
    enter_all(&mut regs, 2);
    let steals = group.stats().steals;
    // Core 3 steals at each of its enters, and the core it stole from steals back at its next one.
    assert!(steals >= rounds as u64, "{steals} steals in {rounds} rounds");

    // Widened to all 4: opt 3, max_cids 3, thrs 2 (still per-CPU); core 3 converges once, then stays.
    group.set_cpus_allowed(&CpuSet::virtual_set([2, 3]).unwrap()).unwrap();
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 3));
    enter_all(&mut regs, 3);
    let more = group.stats().steals - steals;
    assert!(more <= 1, "{more} steals after widening");
    let cids: Vec<_> = regs.iter_mut().map(|r| r.enter().cid()).collect();
    let again: Vec<_> = regs.iter_mut().map(|r| r.enter().cid()).collect();
    assert_eq!(cids, again, "I3: each core keeps its CID once the set covers it");
    drop(regs);
    assert_quiescent_empty(&group);
}

/// Steal storms (design.md §4.5.1): registrations left in per-CPU mode with fewer users than cores that move between
/// cores would take an idle CID from another core at almost every enter (19 999 steals in 20 000 alternating enters
/// before). Once a registration's steal takes back the CID its previous steal moved, and per-task mode is a state the
/// kernel's rules keep (`users ≤ max_cids`), the group switches to per-task mode. I4 holds at every guard on the way
/// (the lone registration's guards all have CID 0), and per-CPU mode comes back by the kernel's rule alone (a
/// register that makes `users > max_cids`). Where `users > max_cids` (a thread outside the allowed set) the group
/// stays per-CPU and keeps stealing; a single convergence steal after a shrink switches nothing.
#[test]
fn steal_storms_end_in_per_task_mode() {
    // One user alternating between two virtual cores (thrs 1: per-CPU down to one user, max_cids 1).
    let group = sim(2);
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    let mut lone = regs.pop().unwrap();
    drop(regs);
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 1));
    for i in 0..1000 {
        lone.set_cpu(Some(i % 2)).unwrap();
        let g = lone.enter();
        assert_eq!(g.cid().get(), 0, "I4 at enter {i}: {:?}", g.kind());
    }
    let s = group.stats();
    assert_eq!((s.steals, s.switches_to_per_task), (2, 1), "the second steal took back the first one's CID: {s:?}");
    assert_eq!(group.mode(), Mode::PerTask);
    assert_eq!(lone.cid().map(|c| c.get()), Some(0), "the switching guard's exit adopted CID 0");
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 1, "{audit:?}");
    let more: Vec<_> = (0..2).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu, "3 users > max_cids 2: the kernel's rule switches as before");
    drop(more);
    drop(lone);
    assert_quiescent_empty(&group);

    // Two users wandering over four virtual cores (5 users, then 2: thrs 2 keeps per-CPU mode, max_cids 2).
    let group = sim(4);
    let mut regs: Vec<_> = (0..5).map(|_| group.register()).collect();
    let mut two = regs.split_off(3);
    drop(regs);
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 2));
    for round in 0..500 {
        let [a, b] = &mut two[..] else { unreachable!() };
        a.set_cpu(Some(round % 4)).unwrap();
        b.set_cpu(Some((round + 2) % 4)).unwrap();
        let (ga, gb) = (a.enter(), b.enter());
        assert_ne!(ga.cid(), gb.cid(), "I1 at round {round}");
        assert!(ga.cid().get() < 2 && gb.cid().get() < 2, "I2 at round {round}: {ga:?} {gb:?}");
    }
    let s = group.stats();
    assert_eq!(s.switches_to_per_task, 1, "{s:?}");
    assert!(s.steals <= 4, "{} steals in 500 rounds", s.steals);
    drop(two);
    assert_quiescent_empty(&group);

    // users > max_cids: one allowed core of two, two users (max_cids 1); per-task mode would not last, so the
    // registration that alternates between the cores keeps stealing.
    let group = Group::builder().virtual_cpus(2).cpus_virtual([0]).cids_per_core(1).build().unwrap();
    let mut regs: Vec<_> = (0..2).map(|_| group.register()).collect();
    assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 1));
    for i in 0..100 {
        regs[1].set_cpu(Some(i % 2)).unwrap();
        assert_eq!(regs[1].enter().cid().get(), 0, "I2 at enter {i}");
    }
    let s = group.stats();
    assert_eq!((s.steals, s.switches_to_per_task, group.mode()), (99, 0, Mode::PerCpu), "{s:?}");
    drop(regs);
    assert_quiescent_empty(&group);

    // A convergence steal after a shrink (I4's reclaim of a CID another registration left) is no storm.
    let group = sim(2);
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    regs[0].set_cpu(Some(0)).unwrap();
    regs[1].set_cpu(Some(1)).unwrap();
    assert_eq!(regs[0].enter().cid().get(), 0);
    assert_eq!(regs[1].enter().cid().get(), 1);
    let mut survivor = regs.remove(1);
    drop(regs);
    for _ in 0..10 {
        assert_eq!(survivor.enter().cid().get(), 0);
    }
    let s = group.stats();
    assert_eq!((s.steals, s.switches_to_per_task, group.mode()), (1, 0, Mode::PerCpu), "{s:?}");
    drop(survivor);
    assert_quiescent_empty(&group);
}

/// The lone-registration storm of `steal_storms_end_in_per_task_mode` on two real CPUs, where each steal of an rseq
/// group is a claim and an RSEQ membarrier, and the switch's exit resolves the enter's own guard through a claim too
/// (design.md §4.4). The group is allowed both CPUs where that keeps per-CPU mode at one user (2 or 3 possible
/// CPUs), else CPU A alone (threshold 1 on any machine).
#[test]
fn steal_storms_end_in_per_task_mode_on_real_cpus_rseq_and_cas() {
    let Some([a, b]) = two_allowed_cpus("steal_storms_end_in_per_task_mode_on_real_cpus") else { return };
    for rseq in [true, false] {
        let build = |cpus: &[usize]| {
            let group = Group::builder().cpus(CpuSet::from_cpus(cpus.iter().copied()).unwrap());
            let group = group.restartable_sequences(rseq).cids_per_core(1).build().unwrap();
            let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
            let lone = regs.pop().unwrap();
            drop(regs);
            (group, lone)
        };
        let (mut group, mut lone) = build(&[a, b]);
        if group.mode() != Mode::PerCpu {
            (group, lone) = build(&[a]);
        }
        assert_eq!((group.mode(), group.max_cids()), (Mode::PerCpu, 1));
        let seen = thread::scope(|s| {
            s.spawn(|| {
                (0..20)
                    .map(|i| {
                        let cpu = if i % 2 == 0 { a } else { b };
                        // Declaring the core is enough for CAS groups, so pinning may fail where the OS has no
                        // affinity API (macOS on arm64).
                        let pinned = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
                        assert!(pinned || !group.uses_rseq(), "pin to {cpu}");
                        lone.set_cpu(Some(cpu)).unwrap(); // for CAS groups (rseq groups read the CPU themselves)
                        lone.enter().cid().get()
                    })
                    .collect::<Vec<_>>()
            })
            .join()
            .unwrap()
        });
        assert_eq!(seen, [0; 20], "I4 at every guard (rseq {rseq})");
        let s = group.stats();
        assert_eq!((s.steals, s.switches_to_per_task), (2, 1), "rseq {rseq}: {s:?}");
        assert_eq!(group.mode(), Mode::PerTask);
        assert!(group.audit().is_consistent());
        drop(lone);
        assert_quiescent_empty(&group);
    }
}

/// I5: at quiescence the bitmap count equals the owners: registrations in per-task mode, cores in per-CPU mode.
#[test]
fn i5_accounting_both_modes() {
    let group = sim(4);
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    let audit = group.audit();
    assert_eq!((audit.bits, audit.owners), (3, 3), "per-task: one CID per registration from birth");
    regs.extend((0..3).map(|_| group.register()));
    assert_eq!(group.mode(), Mode::PerCpu);
    assert_eq!(group.audit().bits, 0, "the switch took every idle registration's CID");
    for (i, r) in regs.iter_mut().enumerate() {
        r.set_cpu(Some(i % 2)).unwrap();
        drop(r.enter());
    }
    let audit = group.audit();
    assert!(audit.is_consistent(), "{audit:?}");
    assert_eq!(audit.bits, 2, "two cores used, two core-owned CIDs");
    assert_eq!(group.stats().cids_in_use, 2);
    drop(regs);
    assert_quiescent_empty(&group);
}

/// I6: a thread descheduled inside its guard stalls nobody: another thread on the same core enters (temporary
/// CID) and mode switches complete while the guard is held.
#[test]
fn i6_nobody_waits_for_a_guard_holder() {
    // 9 users on 8 cores: per-CPU with thrs = max(min(8 - 2, 4), 1) = 4.
    let group = sim(8);
    let regs: Vec<_> = (0..9).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let mut regs = regs.into_iter();
    let mut holder_reg = regs.next().unwrap();
    let holder = thread::spawn(move || {
        holder_reg.set_cpu(Some(0)).unwrap();
        let g = holder_reg.enter();
        held_tx.send(g.cid()).unwrap();
        release_rx.recv().unwrap(); // blocked inside the guard
        drop(g);
    });
    let held = held_rx.recv().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let group2 = group.clone();
    let mut other = regs.next().unwrap();
    let rest: Vec<_> = regs.collect();
    let worker = thread::spawn(move || {
        other.set_cpu(Some(0)).unwrap();
        let g = other.enter();
        let (cid, kind) = (g.cid(), g.kind());
        drop(g);
        drop(rest); // 9 -> 2 users < 4: switch back to per-task while the holder is inside
        let mode = group2.mode();
        let more: Vec<_> = (0..8).map(|_| group2.register()).collect(); // and forth again
        done_tx.send((cid, kind, mode, group2.mode())).unwrap();
        drop(more);
        drop(other);
    });
    // A deadlock detector, not a time budget.
    let (cid, kind, mode_back, mode_forth) = done_rx.recv_timeout(patience(30)).expect("I6: blocked");
    assert_ne!(cid, held);
    assert_eq!(kind, CidKind::Temporary);
    assert_eq!((mode_back, mode_forth), (Mode::PerTask, Mode::PerCpu));
    worker.join().unwrap();
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    assert_quiescent_empty(&group);
}

/// I2, I5, I6 with guards passed to `mem::forget` (safe code): what a forgotten per-CPU or temporary guard holds
/// goes back at its registration's next enter or drop (design.md §4.6). Forgetting therefore never gives a
/// registration more than one CID, never exhausts the CID space (the loop forgets more temporaries than the
/// group's 1024 CIDs) and never leaves a CID marked after the last drop. Before that rule, each forgotten
/// temporary stayed marked: the second forget already failed the `cids_in_use` check, and the 1023rd enter spun
/// for ever in the bitmap.
#[test]
fn i2_i5_i6_forgotten_guards_give_back_at_next_enter_or_drop() {
    // 1 core, 2 users: per-CPU (thrs 1).
    let group = sim(1);
    let (mut a, mut b) = (group.register(), group.register());
    assert_eq!(group.mode(), Mode::PerCpu);
    let g = a.enter();
    let (cid, kind) = (g.cid(), g.kind());
    assert_eq!(kind, CidKind::Core(0));
    std::mem::forget(g);
    let g = a.enter();
    assert_eq!((g.cid(), g.kind()), (cid, CidKind::Core(0)), "the forgotten borrow was given back first");
    drop(g);

    // b's guard keeps the core's CID busy, so each of a's enters takes a temporary.
    let held = b.enter();
    assert_eq!(held.kind(), CidKind::Core(0));
    let bound = group.users() + group.cores();
    for i in 0..3000 {
        let t = a.enter();
        assert_eq!(t.kind(), CidKind::Temporary, "forget {i}");
        assert!(t.cid().get() < bound, "I2 at forget {i}: CID {} not below users + cores = {bound}", t.cid());
        std::mem::forget(t);
        // b's core CID and a's one forgotten temporary, never more.
        assert_eq!(group.stats().cids_in_use, 2, "I5 at forget {i}");
    }
    assert_eq!(group.stats().guards_forgotten, 1 + 2999, "the borrow, then each temporary but the last");
    drop(held);

    // Both kinds forgotten at once, then given back by the registrations' drops.
    std::mem::forget(a.enter()); // the core's CID again
    let t = b.enter();
    assert_eq!(t.kind(), CidKind::Temporary);
    std::mem::forget(t);
    assert_eq!(group.stats().cids_in_use, 2);
    drop((a, b));
    // The loop's last temporary at a's next enter above, then the two forgotten just now at the drops.
    assert_eq!(group.stats().guards_forgotten, 3000 + 3);
    assert_quiescent_empty(&group);

    // A forgotten borrow across a CPU → task switch: the next enter adopts the core's CID as the registration's
    // own, exactly as the guard's late exit would have.
    let (group, mut a) = forgotten_borrow_then_per_task(0);
    let g = a.enter();
    assert_eq!((g.cid().get(), g.kind()), (0, CidKind::Task));
    drop(g);
    let s = group.stats();
    assert_eq!((s.guards_forgotten, s.exit_adopt, s.exit_transit_drop), (1, 1, 0), "adopted, not dropped: {s:?}");
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 1, "only a's own CID: {audit:?}");
    drop(a);
    assert_quiescent_empty(&group);
}

/// A registration on core `cpu` whose per-CPU guard was passed to `mem::forget`, in a group that has since
/// switched back to per-task mode (4 cores, 5 users: per-CPU; the other 4 leave, and 1 user is below thrs = 2)
/// while that guard still borrows the core's CID.
fn forgotten_borrow_then_per_task(cpu: usize) -> (Group, mmcid::Registration) {
    let group = sim(4);
    let mut a = group.register();
    a.set_cpu(Some(cpu)).unwrap();
    let others: Vec<_> = (0..4).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    let g = a.enter();
    assert_eq!(g.kind(), CidKind::Core(cpu));
    std::mem::forget(g);
    drop(others);
    assert_eq!(group.mode(), Mode::PerTask);
    (group, a)
}

/// I1, I5 with a per-task guard passed to `mem::forget`: the registration then counts as a holder descheduled
/// inside its guard for good. A task → CPU walk skips its word (it is "running"), so it keeps its CID in per-CPU
/// mode, as a real long-running holder would, until its next enter gives the word up (the per-CPU enter of an
/// owning registration goes the slow way) or its drop releases it. The drop case is the closest user-space
/// analogue of kernel fix 1e83ccd5921a: the holder's own departure runs the switch back while the word the walk
/// skipped still holds a CID. A forgotten borrow given back by the drop after a switch back to per-task mode ends
/// the test.
#[test]
fn i1_i5_forgotten_per_task_guards_across_switches() {
    // 2 cores: 3 users switch to per-CPU, and only the last drop switches back (thrs 1).
    for via_enter in [true, false] {
        let group = sim(2);
        let mut a = group.register();
        a.set_cpu(Some(0)).unwrap();
        let g = a.enter();
        let own = g.cid();
        assert_eq!(g.kind(), CidKind::Task);
        std::mem::forget(g);
        let mut others: Vec<_> = (0..2).map(|_| group.register()).collect();
        assert_eq!(group.mode(), Mode::PerCpu);
        assert_eq!(a.cid(), Some(own), "the walk skipped a's word: its guard still 'runs'");
        let audit = group.audit();
        assert!(audit.is_consistent(), "{audit:?}");
        // The other users enter on both cores while a holds its CID: exclusivity against the skipped word.
        for (i, r) in others.iter_mut().enumerate() {
            r.set_cpu(Some(i)).unwrap();
            let g = r.enter();
            assert_ne!(g.cid(), own, "I1: user {i} got the CID a's forgotten guard holds");
            drop(g);
        }
        if via_enter {
            let g = a.enter();
            assert_ne!(g.kind(), CidKind::Task, "per-CPU mode: a borrows or takes a temporary");
            drop(g);
            assert_eq!(a.cid(), None, "the next enter gave the word up");
            let audit = group.audit();
            assert!(audit.is_consistent(), "{audit:?}");
            assert_eq!(audit.owners as u64, group.stats().cids_in_use, "{audit:?}");
        }
        drop(others);
        assert_eq!(group.mode(), Mode::PerCpu, "thrs 1: a alone keeps the group per-CPU");
        drop(a);
        assert_quiescent_empty(&group);
    }

    // A forgotten borrow given back by the drop after the group switched back to per-task mode.
    let (group, a) = forgotten_borrow_then_per_task(1);
    drop(a);
    assert_eq!(group.stats().guards_forgotten, 1);
    assert_quiescent_empty(&group);
}

/// I7: a panic inside a guard releases what it held; a thread that exits without dropping its thread-local
/// registration releases it.
#[test]
fn i7_unwind_and_thread_exit_release() {
    let group = sim(2);
    let g2 = group.clone();
    let result = thread::spawn(move || {
        let mut reg = g2.register();
        let _guard = reg.enter();
        panic!("inside a guard");
    })
    .join();
    assert!(result.is_err());
    assert_quiescent_empty(&group);

    let mut reg = group.register();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _guard = reg.enter();
        panic!("caught");
    }));
    assert!(caught.is_err());
    assert_eq!(reg.enter().cid().get(), 0, "usable again after the unwind");
    drop(reg);
    assert_quiescent_empty(&group);

    let g3 = group.clone();
    thread::spawn(move || {
        let a = g3.enter();
        let b = g3.enter(); // nested: a second pooled registration
        assert_ne!(a.cid(), b.cid());
        assert_eq!(g3.users(), 2);
    })
    .join()
    .unwrap();
    assert_quiescent_empty(&group);

    let g4 = group.clone();
    let r = thread::spawn(move || {
        let _g = g4.enter();
        panic!("thread-local guard");
    })
    .join();
    assert!(r.is_err());
    assert_quiescent_empty(&group);
    assert_eq!(group.leave_thread(), 0);
}

/// I9: bad input gets a typed error naming the problem.
#[test]
fn i9_bad_input() {
    assert_eq!(CpuSet::from_cpus([]), Err(Error::EmptyCpuSet));
    assert_eq!(CpuSet::virtual_set([]), Err(Error::EmptyCpuSet));
    let possible = Group::new().cores();
    assert!(matches!(CpuSet::from_cpus([possible]), Err(Error::CpuOutOfRange { .. })));
    assert_eq!(
        Group::builder().virtual_cpus(0).build().unwrap_err(),
        Error::ValueOutOfRange { what: "virtual_cpus", value: 0, min: 1, max: 1 << 16 }
    );
    for n in [65_537, 1 << 20, usize::MAX] {
        let err = Group::builder().virtual_cpus(n).build().unwrap_err();
        assert_eq!(err, Error::ValueOutOfRange { what: "virtual_cpus", value: n, min: 1, max: 65_536 });
        assert!(err.to_string().contains(&format!("virtual_cpus is {n}")), "{err}");
    }
    // The last call that sets the cores counts, a rejected one included.
    let fixed = Group::builder().virtual_cpus(4).cpus_virtual([70_000]).cpus_virtual([0]).build().unwrap();
    assert_eq!(fixed.cpus(), CpuSet::virtual_set([0]).unwrap());
    let broke = Group::builder().virtual_cpus(4).cpus_virtual([1]).cpus_virtual([70_000]).build();
    assert!(matches!(broke, Err(Error::CpuOutOfRange { cpu: 70_000, .. })), "{broke:?}");
    let real = Group::builder().cpus_virtual([]).cpus(CpuSet::current().unwrap()).build().unwrap();
    assert_eq!(real.cpus(), CpuSet::current().unwrap());
    assert_eq!(
        Group::builder().virtual_cpus(2).cpus_virtual([5]).build().unwrap_err(),
        Error::CpuOutOfRange { cpu: 5, possible: 2 }
    );
    assert_eq!(Group::builder().virtual_cpus(2).cpus_virtual([]).build().unwrap_err(), Error::EmptyCpuSet);
    // Huge CPU numbers: a typed error, not an aborted multi-terabyte allocation.
    for cpu in [1usize << 40, usize::MAX] {
        assert!(matches!(CpuSet::from_cpus([cpu]), Err(Error::CpuOutOfRange { cpu: c, .. }) if c == cpu));
        assert!(matches!(CpuSet::virtual_set([cpu]), Err(Error::CpuOutOfRange { cpu: c, .. }) if c == cpu));
        let built = Group::builder().virtual_cpus(2).cpus_virtual([0, cpu]).build();
        assert!(matches!(built, Err(Error::CpuOutOfRange { cpu: c, .. }) if c == cpu), "{built:?}");
    }
    let group = sim(2);
    let mut reg = group.register();
    assert_eq!(reg.set_cpu(Some(2)), Err(Error::CpuOutOfRange { cpu: 2, possible: 2 }));
    assert_eq!(reg.cpu(), None, "a rejected core is not recorded");
    assert!(group.set_cpus_allowed(&CpuSet::virtual_set([7]).unwrap()).is_err());
    drop(reg);
    assert_quiescent_empty(&group);
}

/// The registration limit is a typed error, and a refused registration changes nothing: the group fills its
/// whole CID space (about a million registrations, one CID per core kept free), one more is refused with the
/// limit named, and after dropping one a registration fits again; at the end nothing is left marked (I5).
#[test]
fn registrations_beyond_the_cid_space_are_a_typed_error() {
    let group = Group::builder().virtual_cpus(65_536).build().unwrap();
    let mut regs = Vec::new();
    let limit = loop {
        match group.try_register() {
            Ok(reg) => regs.push(reg),
            Err(Error::TooManyRegistrations { limit }) => break limit,
            Err(other) => panic!("expected TooManyRegistrations, got {other:?}"),
        }
        assert!(regs.len() <= 1 << 20, "no limit after {} registrations", regs.len());
    };
    assert_eq!(regs.len(), limit);
    assert_eq!(group.users(), limit);
    let err = group.try_register().unwrap_err();
    assert!(err.to_string().contains(&limit.to_string()), "{err}");
    regs.pop();
    let again = group.try_register().expect("room for one after a drop");
    assert_eq!(group.users(), limit);
    drop(again);
    drop(regs);
    assert_quiescent_empty(&group);
}

/// Kernel 4327fb13fa47 (BPF CI): 4 CPUs, a 5th thread created while the others run and migrate between cores.
/// Every round, four workers register (per-task, one CID each) and enter on a different core at every enter;
/// worker 0 is inside its guard when the 5th registration switches the group to per-CPU (the walk must leave its
/// CID to it, and its exit resolves it: adopted by its core or dropped); the others keep entering across the
/// switch. Then everyone leaves, which crosses back. Each round must switch exactly once each way, never livelock
/// (a deadlock detector bounds every round) and keep every CID below `users + cores` (I2, the checker's range).
#[test]
fn kernel_bpf_ci_fifth_thread_while_migrating() {
    const ROUNDS: u64 = 20;
    let group = sim(4);
    // I2 hard bound: at most 5 users (4 workers and the 5th) plus 4 cores.
    let occ = Arc::new(Occupancy::new(5 + 4));
    for round in 0..ROUNDS {
        let ready = Arc::new(Gate::new(5));
        let inside = Arc::new(Gate::new(2)); // worker 0 inside its guard, and the test thread
        let switched = Arc::new(AtomicBool::new(false));
        let (done_tx, done_rx) = mpsc::channel();
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (group, occ, ready, inside) = (group.clone(), occ.clone(), ready.clone(), inside.clone());
                let (switched, done_tx) = (switched.clone(), done_tx.clone());
                thread::spawn(move || {
                    let mut reg = group.register();
                    ready.wait();
                    // Registered until the switch at least: 200 enters, and on until the 5th has registered.
                    let mut i = 0;
                    while i < 200 || !switched.load(SeqCst) {
                        reg.set_cpu(Some((t + i) % 4)).unwrap(); // migrate every enter
                        let g = reg.enter();
                        occ.enter(g.cid().get());
                        if t == 0 && i == 0 {
                            assert_eq!(g.kind(), CidKind::Task);
                            inside.wait();
                            while !switched.load(SeqCst) {
                                thread::yield_now(); // inside the guard across the whole switch
                            }
                        } else {
                            thread::yield_now();
                        }
                        occ.exit(g.cid().get());
                        drop(g);
                        i += 1;
                    }
                    drop(reg);
                    done_tx.send(()).unwrap();
                })
            })
            .collect();
        ready.wait();
        inside.wait();
        let fifth = group.register(); // 5 users > 4 cores: task → CPU while worker 0 is inside
        assert_eq!(group.mode(), Mode::PerCpu, "round {round}");
        switched.store(true, SeqCst);
        for _ in 0..4 {
            // A deadlock detector, not a time budget.
            done_rx.recv_timeout(patience(30)).expect("a worker livelocked or died");
        }
        handles.into_iter().for_each(|h| h.join().unwrap());
        drop(fifth);
        let s = group.stats();
        assert_eq!((s.switches_to_per_cpu, s.switches_to_per_task), (round + 1, round + 1), "round {round}: {s:?}");
        assert!(s.exit_adopt + s.exit_transit_drop > round, "worker 0's CID not resolved at its exit: {s:?}");
        assert_quiescent_empty(&group);
    }
}

/// Kernel 1e83ccd5921a: T1 is inside its guard when T0's registration switches to per-CPU; T2..T4 leave and the
/// group switches back while T1 is still inside; then T1 exits and leaves. Deterministic, one thread. While T1 is
/// inside in per-CPU mode, the others enter on every core: none may get T1's CID (the walk must have left it to
/// T1, and nobody may free it for T1); after the switch back T1 still owns exactly that CID, marked once.
#[test]
fn kernel_exit_after_transit_without_rescheduling() {
    let group = sim(4);
    let mut t1 = group.register();
    let mut others: Vec<_> = (0..3).map(|_| group.register()).collect();
    t1.set_cpu(Some(1)).unwrap();
    let g1 = t1.enter();
    let c1 = g1.cid();
    let mut t0 = group.register(); // 5 users > 4: per-CPU; T1 is running: the fixup leaves its CID to it
    assert_eq!(group.mode(), Mode::PerCpu);
    assert_eq!(group.stats().fixup_takes, 3, "the walk took the three idle CIDs, not T1's");
    for cpu in 0..4 {
        for r in others.iter_mut().chain([&mut t0]) {
            r.set_cpu(Some(cpu)).unwrap();
            let g = r.enter();
            assert_ne!(g.cid(), c1, "T1's CID handed out on core {cpu} while T1 is inside: {:?}", g.kind());
        }
    }
    drop(others); // 2 users... then 1 after t0 goes below
    drop(t0);
    assert_eq!(group.mode(), Mode::PerTask, "back while T1 is inside");
    assert_eq!(g1.cid(), c1, "T1 kept its CID throughout");
    drop(g1);
    assert_eq!(t1.cid(), Some(c1), "T1 owns its CID after its exit");
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 1, "only T1's CID is marked: {audit:?}");
    drop(t1);
    assert_quiescent_empty(&group);
}

/// Kernel de3ab9bd3133: a running registration whose word is UNSET (it borrows a core's CID in per-CPU mode) while
/// the CPU → task switch runs; its core CID is resolved at exit (adopted), never treated as a CID of its own.
#[test]
fn kernel_unset_runner_during_cpu_to_task_switch() {
    let group = sim(4);
    let mut regs: Vec<_> = (0..5).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    let mut runner = regs.pop().unwrap();
    runner.set_cpu(Some(3)).unwrap();
    assert_eq!(runner.cid(), None, "UNSET word in per-CPU mode");
    let g = runner.enter();
    assert_eq!(g.kind(), CidKind::Core(3));
    let cid = g.cid();
    drop(regs); // 1 user < thrs 2: CPU -> task switch; the busy slot is left to its borrower
    assert_eq!(group.mode(), Mode::PerTask);
    drop(g);
    // The switch to per-CPU took every idle CID, so the runner's core allocated the lowest, 0: in range of
    // max_cids 1, so adopted into the runner's word at exit.
    assert_eq!(cid.get(), 0);
    assert_eq!((runner.cid(), group.stats().exit_adopt), (Some(cid), 1));
    assert_eq!(runner.enter().cid().get(), 0);
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 1, "{audit:?}");
    drop(runner);
    assert_quiescent_empty(&group);
}

/// Kernel 28b5a1395036 / 192d852129b1: a fixup walk visits every registration exactly once and never stops early;
/// it takes every idle owner's CID and no running one's. The CPU → task sweep visits every core slot once and
/// takes every idle core's CID (kernel 007d84287c74: core CIDs are dropped when the group leaves per-CPU mode).
/// Deterministic, one thread: the stats count each visit.
#[test]
fn kernel_walks_visit_everyone_once_and_drop_cpu_cids() {
    let group = sim(4); // max_cids 4 up to 4 users; thrs 2 in per-CPU mode
    let mut regs: Vec<_> = (0..4).map(|_| group.register()).collect();
    let mut runner = regs.pop().unwrap();
    let g = runner.enter(); // inside its guard during the walk: its CID must stay with it
    let held = g.cid();
    let before = group.stats();
    let fifth = group.register(); // 5 users > 4: task → CPU walk over the 5 registrations
    let s = group.stats();
    assert_eq!(group.mode(), Mode::PerCpu);
    assert_eq!(s.switches_to_per_cpu - before.switches_to_per_cpu, 1);
    assert_eq!(s.fixup_walks - before.fixup_walks, 1);
    assert_eq!(s.fixup_visits - before.fixup_visits, 5, "each registration visited once, the new one included");
    assert_eq!(s.fixup_takes - before.fixup_takes, 3, "the three idle owners' CIDs, not the runner's");
    assert_eq!(g.cid(), held);
    drop(g); // the runner's CID leaves it at exit (adopted by its core or dropped)
    assert_eq!(runner.cid(), None);

    // Each of four cores comes to own a CID.
    regs.push(runner);
    regs.push(fifth);
    for (i, r) in regs.iter_mut().enumerate() {
        r.set_cpu(Some(i % 4)).unwrap();
        assert_eq!(r.enter().kind(), CidKind::Core(i % 4));
    }
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 4, "one CID per core: {audit:?}");
    let before = group.stats();
    regs.truncate(1); // 1 user < thrs 2: CPU → task sweep over the 4 idle slots
    let s = group.stats();
    assert_eq!(group.mode(), Mode::PerTask);
    assert_eq!(s.switches_to_per_task - before.switches_to_per_task, 1);
    assert_eq!(s.fixup_visits - before.fixup_visits, 4, "each core slot visited once");
    assert_eq!(s.fixup_takes - before.fixup_takes, 4, "every core's CID dropped");
    let audit = group.audit();
    assert!(audit.is_consistent(), "{audit:?}");
    assert_eq!(audit.bits, 0, "no core keeps a CID, and the survivor owns none until it enters: {audit:?}");
    assert_eq!(regs[0].enter().cid().get(), 0);
    assert_eq!(group.audit().bits, 1);
    drop(regs);
    assert_quiescent_empty(&group);
}

/// Kernel 007d84287c74 at the last drop: when the last registration leaves a group that is still in per-CPU mode
/// (on one core thrs is 1, so only the last drop switches back), the cores' CIDs go with it.
#[test]
fn kernel_last_drop_releases_core_cids() {
    let group = sim(2); // max_cids 2, thrs 1
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    let before = group.stats();
    for (i, r) in regs.iter_mut().enumerate() {
        r.set_cpu(Some(i % 2)).unwrap();
        drop(r.enter());
    }
    assert_eq!(group.stats().enter_alloc - before.enter_alloc, 2, "one allocation per core, then borrows");
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 2, "{audit:?}");
    regs.truncate(1);
    assert_eq!(group.mode(), Mode::PerCpu, "one user is not below thrs 1");
    assert_eq!(group.audit().bits, 2, "both cores keep their CIDs while anyone is registered");
    let takes = group.stats().fixup_takes;
    drop(regs);
    assert_eq!(group.stats().fixup_takes - takes, 2, "the last drop swept both cores' CIDs");
    assert_quiescent_empty(&group);
}

/// Kernel b2e48c429ec5 / 192d852129b1: registrations racing each other across the switch are all seen by the
/// fixup walk (an invisible new registration would keep a CID the walk never takes). Here the fix is structural:
/// `register` lists the record and counts the user in one section under the lifecycle lock, so the racing
/// registrations serialise, and this test checks what that must leave: every counted user listed (the audit's
/// `users == listed`) and no task-owned CID after the switch.
#[test]
fn kernel_concurrent_registrations_during_switch() {
    for _ in 0..20 {
        let group = sim(4);
        let barrier = Arc::new(Gate::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (group, barrier) = (group.clone(), barrier.clone());
                thread::spawn(move || {
                    barrier.wait();
                    group.register()
                })
            })
            .collect();
        let regs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(group.mode(), Mode::PerCpu);
        let audit = group.audit();
        assert!(audit.is_consistent(), "{audit:?}");
        assert_eq!(audit.bits, 0, "no registration kept a task-owned CID after the switch: {audit:?}");
        drop(regs);
        assert_quiescent_empty(&group);
    }
}

/// Adoption (kernel 4463c7aa11a6): a registration inside its guard across a completed task → CPU switch gives its CID
/// to its core at exit instead of two bitmap operations.
#[test]
fn transitional_cid_adopted_by_core_after_switch() {
    let group = sim(4);
    let mut runner = group.register();
    runner.set_cpu(Some(2)).unwrap();
    let g = runner.enter();
    assert_eq!(g.kind(), CidKind::Task);
    let cid = g.cid();
    let more: Vec<_> = (0..4).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    drop(g);
    assert_eq!(group.stats().exit_adopt, 1);
    assert_eq!(runner.cid(), None);
    let g = runner.enter();
    assert_eq!((g.cid(), g.kind()), (cid, CidKind::Core(2)), "the core owns the adopted CID");
    drop(g);
    drop(more);
    drop(runner);
    assert_quiescent_empty(&group);
}

/// I1 on the per-CPU fast path: many threads entering on one core race for its slot; only the CAS keeps two of
/// them from borrowing the same CID. Both paths are forced, whatever the machine: first a guard holds the core's
/// CID while every thread enters on that core, so each of those enters must take a temporary; then the threads,
/// started together, race for the free slot (how often they collide is up to the scheduler, and the occupancy
/// checker holds either way).
#[test]
fn i1_same_core_contention_per_cpu() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 3000;
    let group = sim(2);
    let occ = Arc::new(Occupancy::new(64));
    let payload = Arc::new(Payload::new(64));
    let mut holder = group.register();
    holder.set_cpu(Some(0)).unwrap();
    let regs: Vec<_> = (0..THREADS).map(|_| group.register()).collect();
    assert_eq!(group.mode(), Mode::PerCpu);
    let held = holder.enter();
    assert_eq!(held.kind(), CidKind::Core(0));
    occ.enter(held.cid().get());
    // Every thread enters once while the core's CID is held, then all wait for the release.
    let (entered, released) = (Arc::new(Gate::new(THREADS + 1)), Arc::new(Gate::new(THREADS + 1)));
    let start = Arc::new(Gate::new(THREADS));
    let handles: Vec<_> = regs
        .into_iter()
        .map(|mut reg| {
            let (occ, payload) = (occ.clone(), payload.clone());
            let (entered, released, start) = (entered.clone(), released.clone(), start.clone());
            thread::spawn(move || {
                reg.set_cpu(Some(0)).unwrap();
                {
                    let g = reg.enter();
                    assert_eq!(g.kind(), CidKind::Temporary, "core 0's CID is held by another guard");
                    occ.enter(g.cid().get());
                    payload.bump(g.cid().get());
                    occ.exit(g.cid().get());
                }
                entered.wait();
                released.wait();
                start.wait(); // all at once, so that the threads of the core overlap where the machine lets them
                for _ in 0..ROUNDS {
                    let g = reg.enter();
                    let cid = g.cid().get();
                    occ.enter(cid);
                    payload.bump(cid);
                    occ.exit(cid);
                }
            })
        })
        .collect();
    entered.wait();
    occ.exit(held.cid().get());
    drop(held);
    released.wait();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(payload.sum(), (THREADS * (ROUNDS + 1)) as u64);
    let s = group.stats();
    assert!(s.enter_cpu_fast >= 1 && s.enter_temporary >= THREADS as u64, "both paths exercised: {s:?}");
    drop(holder);
    assert_quiescent_empty(&group);
}

/// I1 and I2 with temporaries taken on both cores at once, from both bitmap lanes (design.md §2.5): every core's
/// CID is held by a guard for the whole run, so every enter takes a temporary; core 0 has as many threads as its
/// lane has CIDs below `users + cores`, so some of its temporaries usually come from the lowest-first fallback
/// (odd CIDs in three runs out of three when written).
#[test]
fn i1_i2_temporaries_from_both_lanes() {
    const ON_CORE0: usize = 7;
    const ON_CORE1: usize = 2;
    const ROUNDS: usize = 2000;
    let group = sim(2);
    let occ = Arc::new(Occupancy::new(64));
    let payload = Arc::new(Payload::new(64));
    let mut holders: Vec<_> = (0..2).map(|_| group.register()).collect();
    let regs: Vec<_> = (0..ON_CORE0 + ON_CORE1).map(|_| group.register()).collect();
    let users = group.users();
    assert_eq!(group.mode(), Mode::PerCpu);
    for (cpu, h) in holders.iter_mut().enumerate() {
        h.set_cpu(Some(cpu)).unwrap();
    }
    let (h0, h1) = holders.split_at_mut(1);
    let held = [h0[0].enter(), h1[0].enter()];
    assert_eq!(held.iter().map(|g| g.kind()).collect::<Vec<_>>(), [CidKind::Core(0), CidKind::Core(1)]);
    let seen: Arc<[std::sync::Mutex<std::collections::BTreeSet<usize>>; 2]> = Arc::new(Default::default());
    let handles: Vec<_> = regs
        .into_iter()
        .enumerate()
        .map(|(i, mut reg)| {
            let (occ, payload, seen) = (occ.clone(), payload.clone(), seen.clone());
            let cpu = usize::from(i >= ON_CORE0);
            thread::spawn(move || {
                reg.set_cpu(Some(cpu)).unwrap();
                let mut mine = std::collections::BTreeSet::new();
                for r in 0..ROUNDS {
                    let g = reg.enter();
                    assert_eq!(g.kind(), CidKind::Temporary, "the core's CID is held");
                    let cid = g.cid().get();
                    assert!(cid < users + 2, "I2 hard bound: CID {cid} with {users} users on 2 cores");
                    occ.enter(cid);
                    payload.bump(cid);
                    if r % 8 == 0 {
                        thread::yield_now(); // overlap with the other threads of this core
                    }
                    occ.exit(cid);
                    mine.insert(cid);
                }
                seen[cpu].lock().unwrap().extend(mine);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    drop(held);
    assert_eq!(payload.sum(), ((ON_CORE0 + ON_CORE1) * ROUNDS) as u64);
    // Core 1's temporaries come from lane 1 (odd CIDs): it never has more temporaries at once than lane 1 has
    // CIDs below the bound, and a lost race retries in the lane.
    let odd_only = seen[1].lock().unwrap().iter().all(|c| c % 2 == 1);
    assert!(odd_only, "core 1's temporaries left its lane: {:?}", seen[1].lock().unwrap());
    assert!(seen[0].lock().unwrap().iter().any(|c| c % 2 == 0), "core 0 never used its lane");
    drop(holders);
    assert_quiescent_empty(&group);
}
