//! Tests of `rseq/` with real threads on real CPUs: the area's `cpu_id`, and the critical sections' exclusion of
//! the threads of one CPU, signals included.

use crate::rseq;
use crate::sys::*;

/// The rseq read agrees with `sched_getcpu` on every allowed CPU, and is really in use where glibc registered
/// an area (glibc sets `__rseq_size` to 0 when registration fails), so a broken probe or a silent fallback
/// fails here.
#[test]
fn rseq_cpu_matches_sched_getcpu() {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no other preconditions.
    let size = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()) };
    // SAFETY: glibc defines `__rseq_size` as a `const unsigned int`.
    let glibc_registered = !size.is_null() && unsafe { *(size as *const u32) } >= 8;
    let expect_rseq = glibc_registered && cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));
    // A thread of its own: pinning it leaves the harness's threads alone.
    std::thread::spawn(move || {
        rseq::probe();
        assert_eq!(rseq::cpu_id().is_some(), expect_rseq, "glibc registered rseq: {glibc_registered}");
        let cpus = affinity().unwrap();
        for &cpu in &cpus {
            pin_current(cpu).unwrap();
            let mut raw = 0u32;
            // SAFETY: getcpu writes one u32 through the first pointer; the others may be null.
            let rc = unsafe { libc::syscall(libc::SYS_getcpu, &mut raw as *mut u32, 0usize, 0usize) };
            assert_eq!((rc, raw as usize), (0, cpu), "the getcpu system call disagrees with the pin");
            assert_eq!(current_cpu(), cpu);
            if expect_rseq {
                assert_eq!(rseq::cpu_id(), Some(cpu), "rseq cpu_id disagrees after pinning to {cpu}");
            }
        }
        if cpus.len() < 2 {
            // One CPU (0): a wrong offset that lands on a zero word would read 0 too.
            eprintln!("rseq_cpu_matches_sched_getcpu: one allowed CPU, wrong offsets reading 0 go unnoticed");
        }
    })
    .join()
    .unwrap();
}

/// Rounds per thread for the sequence tests, or `None` (said on stderr) where there is no rseq area to test.
/// Fewer in debug builds (CI's `cargo test`), where each round is slower and a wrong sequence's window wider.
#[cfg(target_arch = "x86_64")]
fn sequence_rounds(test: &str) -> Option<u64> {
    rseq::probe();
    if !rseq::critical_sections() || rseq::cpu_id().is_none() {
        eprintln!("{test}: no rseq area here, nothing to check");
        return None;
    }
    Some(if cfg!(debug_assertions) { 2_000_000 } else { 10_000_000 })
}

/// How long a deadlock detector waits: `secs` seconds, times the whole number in `MMCID_TEST_TIME_SCALE`
/// (default 1) on a machine far slower than real hardware (as `tests/common`'s `patience`).
#[cfg(target_arch = "x86_64")]
fn patience(secs: u64) -> std::time::Duration {
    let scale = std::env::var("MMCID_TEST_TIME_SCALE").ok().and_then(|s| s.parse::<u64>().ok()).filter(|&s| s >= 1);
    std::time::Duration::from_secs(secs.saturating_mul(scale.unwrap_or(1)))
}

/// Rounds for each of `threads` threads of a test written for `rounds` per thread on 2 CPUs (8 threads): the
/// same total, so that the test costs about the same CPU time on any machine (and as many preemptions and
/// migrations happen in it, which is what these tests count on), but at least `rounds / 32` each.
#[cfg(target_arch = "x86_64")]
pub(crate) fn per_thread_rounds(rounds: u64, threads: usize) -> u64 {
    (rounds * 8 / threads.max(1) as u64).max(rounds / 32).max(1)
}

/// The harness of the exclusion tests: 4 unpinned threads per allowed CPU, started together, each makes
/// `per_thread_rounds(rounds)` successful `try_hold(cpu)` calls on the CPU it runs on, increments a plain
/// per-CPU counter (load, store) while holding, then runs the release `try_hold` returned. Returns the holds
/// made and the sum of the counters, which falls short of the holds if two threads of one CPU held at once.
#[cfg(target_arch = "x86_64")]
pub(crate) fn per_cpu_exclusion<R: FnOnce()>(rounds: u64, try_hold: impl Fn(usize) -> Option<R> + Sync) -> (u64, u64) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let counts: Vec<AtomicU64> = (0..possible_cpus()).map(|_| AtomicU64::new(0)).collect();
    let threads = 4 * affinity().unwrap().len();
    let rounds = per_thread_rounds(rounds, threads);
    let start = std::sync::Barrier::new(threads);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                start.wait(); // all at once: the threads of a CPU must overlap
                let (mut done, mut tries) = (0, 0u64);
                while done < rounds {
                    // A hold that (almost) never succeeds (a broken sequence, a wrong mode check) fails the
                    // test instead of spinning forever.
                    tries += 1;
                    assert!(tries <= 1000 * rounds, "only {done} of {rounds} holds succeeded in {tries} tries");
                    let cpu = rseq::cpu_id().expect("glibc registers rseq for every thread it starts");
                    if let Some(release) = try_hold(cpu) {
                        let v = counts[cpu].load(Relaxed);
                        std::hint::black_box(());
                        counts[cpu].store(v + 1, Relaxed);
                        release();
                        done += 1;
                    }
                }
            });
        }
    });
    (threads as u64 * rounds, counts.iter().map(|c| c.load(Relaxed)).sum())
}

/// The restartable sequence excludes the threads of one CPU (design.md §4.1.1): 4 unpinned threads per
/// core borrow their CPU's slot with `store_if` and then increment a plain per-slot counter (load, store), so
/// a borrow that two threads both won would lose increments. A plain compare-and-store in place of the
/// sequence loses millions of the 80 million increments of a release build, and about two million of the
/// 16 million of a debug build (checked by hand when written); the sequence must lose none.
#[test]
#[cfg(target_arch = "x86_64")]
fn rseq_store_if_excludes_threads_of_one_cpu() {
    use crate::state::{BUSY, ONCPU};
    use std::sync::atomic::{AtomicU32, Ordering::*};
    let Some(rounds) = sequence_rounds("rseq_store_if_excludes_threads_of_one_cpu") else { return };
    let cpus = possible_cpus();
    let idle = ONCPU | 7;
    let mode = AtomicU32::new(ONCPU);
    let slots: Vec<AtomicU32> = (0..cpus).map(|_| AtomicU32::new(idle)).collect();
    let (holds, total) = per_cpu_exclusion(rounds, |cpu| {
        let slot = &slots[cpu];
        (slot.load(Relaxed) == idle && rseq::store_if(rseq::area(), cpu as u32, &mode, slot, idle, idle | BUSY))
            .then_some(move || slot.store(idle, Release))
    });
    assert_eq!(total, holds, "two threads held one CPU's slot at once");
    // The mode check inside the sequence: without ONCPU nothing commits.
    mode.store(0, Relaxed);
    let cpu = rseq::cpu_id().unwrap();
    assert!(!rseq::store_if(rseq::area(), cpu as u32, &mode, &slots[cpu], idle, idle | BUSY));
    // A CPU number we cannot be running on never commits (`cpus` is no CPU, and unlike u32::MAX it is not
    // what an unregistered area reads either).
    mode.store(ONCPU, Relaxed);
    assert!(!rseq::store_if(rseq::area(), cpus as u32, &mode, &slots[cpu], idle, idle | BUSY));
    assert!(slots.iter().all(|s| s.load(Relaxed) == idle), "a failed sequence stored");
}

/// `add_if` is the same sequence with a load, an add and the committing store: 4 unpinned threads per core
/// add 1 to their CPU's counter through it, with nothing else guarding the counter, so the total is the
/// number of commits only if no thread of a CPU interleaved another's load and store. (A plain load and
/// store in its place, made by hand when this was written, lost 55–62 % of the 80 million adds of a release
/// build in three runs out of three, and 46 % of the 16 million of a debug build.)
#[test]
#[cfg(target_arch = "x86_64")]
fn rseq_add_if_excludes_threads_of_one_cpu() {
    use crate::state::ONCPU;
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
    let Some(rounds) = sequence_rounds("rseq_add_if_excludes_threads_of_one_cpu") else { return };
    let idle = ONCPU | 3;
    let mode = AtomicU32::new(ONCPU);
    let cpus = possible_cpus();
    let slots: Vec<AtomicU32> = (0..cpus).map(|_| AtomicU32::new(idle)).collect();
    let cells: Vec<AtomicU64> = (0..cpus).map(|_| AtomicU64::new(0)).collect();
    let threads = 4 * affinity().unwrap().len();
    let rounds = per_thread_rounds(rounds, threads);
    let start = std::sync::Barrier::new(threads);
    let commits: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let mut mine = 0;
                    for _ in 0..rounds {
                        let cpu = rseq::cpu_id().expect("glibc registers rseq for every thread it starts");
                        mine += rseq::add_if(rseq::area(), cpu as u32, &mode, &slots[cpu], idle, &cells[cpu], 1) as u64;
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let total: u64 = cells.iter().map(|c| c.load(Relaxed)).sum();
    // A sequence aborts only if its thread is preempted, migrated or signalled within a few instructions:
    // well under 1 % of them when idle. A tenth is a floor no load reaches, which still catches a sequence
    // that mostly fails.
    eprintln!("rseq_add_if_excludes_threads_of_one_cpu: {commits} of {} sequences committed", threads as u64 * rounds);
    assert!(commits > threads as u64 * rounds / 10, "{commits} commits");
    assert_eq!(total, commits, "an add of one CPU interleaved another's");
    // Nothing commits on another slot word or without ONCPU (on a pinned thread, so that a migration cannot
    // be why): the same call with the right word and the mode back commits.
    std::thread::scope(|s| {
        s.spawn(|| {
            let cpu = affinity().unwrap()[0];
            pin_current(cpu).unwrap();
            assert!(!rseq::add_if(rseq::area(), cpu as u32, &mode, &slots[cpu], idle + 1, &cells[cpu], 1));
            mode.store(0, Relaxed);
            assert!(!rseq::add_if(rseq::area(), cpu as u32, &mode, &slots[cpu], idle, &cells[cpu], 1));
            assert_eq!(cells.iter().map(|c| c.load(Relaxed)).sum::<u64>(), total);
            mode.store(ONCPU, Relaxed);
            // A pinned thread's sequence still aborts when it is preempted inside it (seen once in thirty runs
            // of a 16-vCPU guest): one of a thousand tries must commit, and only one add lands.
            let committed =
                (0..1000).any(|_| rseq::add_if(rseq::area(), cpu as u32, &mode, &slots[cpu], idle, &cells[cpu], 1));
            assert!(committed, "no sequence committed in 1000 tries with the right word and mode");
            assert_eq!(cells.iter().map(|c| c.load(Relaxed)).sum::<u64>(), total + 1);
        });
    });
}

/// Signals abort sequences too (the kernel checks for one in flight before running a handler): a thread
/// runs `add_if` sequences on its CPU's counter while another keeps sending it a signal whose handler itself
/// runs sequences on the same counter. Every commit must be counted exactly once, whoever made it, and the
/// thread must survive (an abort that jumped to a wrong address, or a bad signature, would kill it). A plain
/// load and store in place of the sequence, made by hand when this was written, lost 166–2475 of the
/// handlers' increments in three runs out of three; with the worker stopping after 100 handled signals it
/// lost only 1–11 and escaped in one run in twenty, so the worker now goes on until
/// 2000 signals were handled. The sender sends the next signal only once the last one was handled (signals
/// pending at once coalesce into one, so sending blindly made the count depend on how often the worker ran);
/// 30 s for one signal is only a deadlock detector.
#[test]
#[cfg(target_arch = "x86_64")]
fn rseq_sequences_survive_signals() {
    use crate::state::ONCPU;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
    static MODE: AtomicU32 = AtomicU32::new(ONCPU);
    static SLOTS: [AtomicU32; 1024] = [const { AtomicU32::new(ONCPU | 1) }; 1024];
    static CELLS: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];
    static IN_HANDLER: AtomicU64 = AtomicU64::new(0);
    static HANDLED: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn handler(_: libc::c_int) {
        // Async-signal-safe: a TLS load and the sequence, no allocation, no lock.
        if let Some(cpu) = rseq::cpu_id().filter(|&c| c < 1024) {
            let ok = rseq::add_if(rseq::area(), cpu as u32, &MODE, &SLOTS[cpu], ONCPU | 1, &CELLS[cpu], 1);
            IN_HANDLER.fetch_add(ok as u64, Relaxed);
        }
        HANDLED.fetch_add(1, Relaxed);
    }
    let Some(rounds) = sequence_rounds("rseq_sequences_survive_signals") else { return };
    if possible_cpus() > 1024 {
        return;
    }
    // SAFETY: sigaction with a zeroed struct, a valid handler and an empty mask; SIGUSR2 is not used
    // elsewhere in this test binary.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    use std::os::unix::thread::JoinHandleExt;
    const SIGNALS: usize = 2000;
    static SENT_ALL: AtomicBool = AtomicBool::new(false);
    // The worker runs sequences until it has made its rounds and every signal was handled.
    let worker = std::thread::spawn(move || {
        let (mut mine, mut done) = (0, 0);
        while done < rounds / 4 || !SENT_ALL.load(Acquire) {
            let cpu = rseq::cpu_id().expect("glibc registers rseq for every thread it starts");
            mine += rseq::add_if(rseq::area(), cpu as u32, &MODE, &SLOTS[cpu], ONCPU | 1, &CELLS[cpu], 1) as u64;
            done += 1;
        }
        mine
    });
    // Stops the worker however the sender ends: a failed assertion must fail the test, not leave it spinning.
    struct SentAll;
    impl Drop for SentAll {
        fn drop(&mut self) {
            SENT_ALL.store(true, Release);
        }
    }
    let sent_all = SentAll;
    for sent in 0..SIGNALS {
        // SAFETY: the worker is not joined yet, so its pthread_t names a live or finished-but-unjoined thread,
        // to which pthread_kill may send (or report ESRCH).
        let rc = unsafe { libc::pthread_kill(worker.as_pthread_t(), libc::SIGUSR2) };
        assert_eq!(rc, 0, "pthread_kill failed after {sent} signals");
        let deadline = std::time::Instant::now() + patience(30);
        while HANDLED.load(Relaxed) == sent {
            assert!(!worker.is_finished(), "the worker ended with signal {} pending", sent + 1);
            assert!(std::time::Instant::now() < deadline, "signal {} not handled in {:?}", sent + 1, patience(30));
            std::thread::yield_now();
        }
    }
    drop(sent_all);
    let commits = worker.join().unwrap();
    let total: u64 = CELLS.iter().map(|c| c.load(Relaxed)).sum();
    let (handled, in_handler) = (HANDLED.load(Relaxed), IN_HANDLER.load(Relaxed));
    eprintln!("rseq_sequences_survive_signals: {handled} signals handled ({in_handler} commits inside)");
    assert_eq!(handled, SIGNALS, "a signal handled twice, or one the test did not send");
    assert_eq!(total, commits + IN_HANDLER.load(Relaxed), "a sequence interrupted by a signal was counted wrong");
}
