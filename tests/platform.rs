//! Platform and process events (design.md §12, the crate docs' "Platform and process events"): a `membarrier`
//! that fails for good (a seccomp filter installed after the group was built) and `fork` while other threads are
//! inside lifecycle operations. Each scenario runs in a forked child that the test waits for with a time limit,
//! so an abort or a hang fails the test instead of killing or stalling the harness.
//!
//! Children of this (multithreaded) test process allocate: they rely on the C library's fork handling of malloc
//! (glibc's), and print nothing (another thread may have held the output lock at the fork). A child reports what
//! went wrong through its exit status.

// Elsewhere only the fork and signal scenarios build; the seccomp one needs Linux.
#![cfg_attr(not(target_os = "linux"), allow(unused_imports, dead_code))]

mod common;

use common::{in_child, Child, Occupancy};
use mmcid::{CidKind, CpuSet, Group, Mode, ShardedCounter};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

/// Writes `line` to the process's standard error directly: in a forked child, `eprintln!` would go to the test
/// harness's capture buffer of the thread that forked, which the child never hands back.
fn to_stderr(line: &str) {
    let line = format!("{line}\n");
    // SAFETY: the pointer and length describe `line`'s bytes, alive for the call.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Installs a seccomp filter on the calling process's threads that makes every `membarrier` fail with EPERM
/// (`SECCOMP_RET_ERRNO`), everything else allowed. `Err(code)` for the child to exit with if that is refused.
// seccomp and membarrier: Linux's.
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn deny_membarrier() -> Result<(), i32> {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ALLOW: u32 = 0x7fff_0000; // SECCOMP_RET_ALLOW
    const RET_ERRNO: u32 = 0x0005_0000; // SECCOMP_RET_ERRNO
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut filter = [
        op(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        op(JEQ_K, 0, 3, AUDIT_ARCH),
        op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        op(JEQ_K, 0, 1, libc::SYS_membarrier as u32),
        op(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
        op(RET_K, 0, 0, RET_ALLOW),
    ];
    let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_mut_ptr() };
    // SAFETY: prctl with integer arguments; then seccomp(SET_MODE_FILTER, TSYNC) reads `prog`, which points at
    // `filter`, both alive across the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(90);
        }
        if libc::syscall(libc::SYS_seccomp, 1 /* SET_MODE_FILTER */, 1 /* TSYNC */, &prog) != 0 {
            return Err(91);
        }
        // The filter took: membarrier(QUERY) fails too now.
        if libc::syscall(libc::SYS_membarrier, 0, 0, 0) != -1 {
            return Err(92);
        }
    }
    Ok(())
}

/// Pins the calling thread to `cpu`.
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn pin(cpu: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

/// A seccomp filter installed after the groups were built makes every later `membarrier` fail with EPERM. A
/// process that aborts on a failed membarrier dies at its first mode switch (SIGABRT at the first `register` past
/// the bound). Without the barrier, each switch goes without its walk's takes and each claim gives its slot back:
/// in the child, a virtual group crosses both ways many times under threads that check exclusivity, and (where
/// the group borrows with restartable sequences and two CPUs are allowed) a steal's claim fails; the audits stay
/// consistent, every CID is free at the end, and the failures are counted.
#[test]
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn a_membarrier_refused_for_good_does_not_abort_and_stays_exclusive() {
    let real = Group::new();
    let sim = Group::builder().virtual_cpus(4).build().unwrap();
    if !sim.uses_membarrier() {
        eprintln!("a_membarrier_refused_for_good: no membarrier in this process, nothing to check");
        return;
    }
    let two: Vec<usize> = CpuSet::current().unwrap().iter().take(2).collect();
    let steal = real.uses_rseq() && two.len() == 2;
    if !steal {
        eprintln!("a_membarrier_refused_for_good: no rseq group with two CPUs here, the claim is not reached");
    }
    let child = in_child(Duration::from_secs(120), || {
        if let Err(code) = deny_membarrier() {
            return code;
        }
        // 1. Both switches, deterministically: 5 users of 4 cores are per-CPU (max_cids 4), 1 is per-task (thrs 2).
        let mut regs: Vec<_> = (0..5).map(|_| sim.register()).collect();
        if sim.mode() != Mode::PerCpu {
            return 10;
        }
        for (i, r) in regs.iter_mut().enumerate() {
            r.set_cpu(Some(i % 4)).unwrap();
            drop(r.enter());
        }
        regs.truncate(1);
        if sim.mode() != Mode::PerTask || !sim.audit().is_consistent() {
            return 11;
        }
        drop(regs);
        let audit = sim.audit();
        if !audit.is_consistent() || audit.bits != 0 {
            return 12;
        }
        // 2. Churn across both modes with an independent exclusivity check. In the first round every worker
        // registers before any enters: 6 users of 4 cores, per-CPU at least once on any machine.
        let occ = Arc::new(Occupancy::new(4096));
        let registered = Arc::new(Barrier::new(6));
        let workers: Vec<_> = (0..6)
            .map(|w| {
                let (sim, occ, registered) = (sim.clone(), occ.clone(), registered.clone());
                thread::spawn(move || {
                    for round in 0..200 {
                        let mut reg = sim.register();
                        if round == 0 {
                            registered.wait();
                        }
                        reg.set_cpu(Some((w + round) % 4)).unwrap();
                        for _ in 0..20 {
                            let g = reg.enter();
                            occ.enter(g.cid().get());
                            thread::yield_now();
                            occ.exit(g.cid().get());
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            if w.join().is_err() {
                return 13;
            }
        }
        let audit = sim.audit();
        if !audit.is_consistent() || audit.bits != 0 || sim.mode() != Mode::PerTask {
            to_stderr(&format!("after the churn: mode {:?}, {audit:?}, {:?}", sim.mode(), sim.stats()));
            return 14;
        }
        let s = sim.stats();
        if s.switches_to_per_cpu == 0 || s.switches_to_per_task < 2 {
            return 15;
        }
        if s.membarrier_failures == 0 {
            return 16; // the filter must have made the switches' barriers fail
        }
        // 3. A steal's claim (rseq groups: CLAIM, RSEQ membarrier, take) on real CPUs: the group allows CPU A
        // alone, so max_cids is 1 and a thread on CPU B must take CID 0 from A's idle slot.
        if steal {
            let (a, b) = (two[0], two[1]);
            let group = Group::builder().cpus(CpuSet::from_cpus([a]).unwrap()).build().unwrap();
            let mut regs: Vec<_> = (0..2).map(|_| group.register()).collect();
            if (group.mode(), group.max_cids()) != (Mode::PerCpu, 1) {
                return 20;
            }
            let enter_on = |cpu: usize, reg: &mut mmcid::Registration| {
                thread::scope(|s| {
                    s.spawn(|| {
                        if !pin(cpu) {
                            return None;
                        }
                        let g = reg.enter();
                        Some((g.kind(), g.cid().get()))
                    })
                    .join()
                    .unwrap()
                })
            };
            let Some((CidKind::Core(_), on_a)) = enter_on(a, &mut regs[0]) else { return 21 };
            let Some((CidKind::Core(_), on_b)) = enter_on(b, &mut regs[1]) else { return 22 };
            if on_a == on_b || !group.audit().is_consistent() {
                return 23;
            }
            drop(regs);
            let audit = group.audit();
            if !audit.is_consistent() || audit.bits != 0 {
                return 24;
            }
            if group.stats().membarrier_failures < 2 {
                return 25; // the switch's F2 and the steal's claim both failed
            }
        }
        0
    });
    assert_eq!(child, Child::Exited(0), "the child (exit codes: see the test's returns)");
}

/// fork while other threads register, enter, drop and add: 100 children, each of which must enter through the
/// thread-local layer, add to a `ShardedCounter`, register, enter, drop and exit within 10 s. Without the fork
/// handlers (design.md §12.2), a child forked while another thread held a group's lifecycle lock inherits it held
/// by a thread that does not exist in the child, and hangs at its first register or drop (about half the children
/// here). Where the fork lands is up to the scheduler: the unit tests of `src/tests/platform.rs` hold the locks on
/// purpose.
#[test]
fn forks_while_other_threads_churn() {
    const FORKS: usize = 100;
    let group = Group::new();
    let counter = Arc::new(ShardedCounter::new(&group));
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let churners: Vec<_> = (0..3)
        .map(|i| {
            let (group, counter, stop, ops) = (group.clone(), counter.clone(), stop.clone(), ops.clone());
            thread::spawn(move || {
                // Enough registrations of this thread to cross the per-task/per-CPU boundary with the others'.
                let mut extra = Vec::new();
                while !stop.load(SeqCst) {
                    let mut reg = group.register();
                    drop(reg.enter());
                    if i == 0 {
                        drop(group.enter());
                        counter.add(1);
                    }
                    extra.push(reg);
                    if extra.len() > 3 {
                        extra.clear();
                    }
                    ops.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    while ops.load(SeqCst) < 100 {
        thread::yield_now();
    }
    let mut failed = Vec::new();
    for i in 0..FORKS {
        let child = in_child(Duration::from_secs(10), || {
            drop(group.enter());
            counter.add(1);
            let mut reg = group.register();
            drop(reg.enter());
            drop(reg);
            if group.audit().duplicates.is_empty() {
                0
            } else {
                1
            }
        });
        if child != Child::Exited(0) {
            failed.push((i, child));
        }
    }
    stop.store(true, SeqCst);
    for c in churners {
        c.join().unwrap();
    }
    eprintln!("forks_while_other_threads_churn: {} lifecycle operations by the churners", ops.load(SeqCst));
    assert!(failed.is_empty(), "{} of {FORKS} children failed: {failed:?}", failed.len());
    assert!(group.audit().is_consistent());
}

/// The crate docs' "Signals": a handler may enter and leave with a registration of its own, whatever its thread
/// was doing. A worker enters and leaves its own registration in a loop, marking its CID held in an independent
/// occupancy table while inside; another thread does the same on the same group; the test sends the worker 500
/// signals, one at a time, and the handler enters with the worker's second registration and checks that its CID is
/// not held by anyone. Three registrations: per-CPU mode on a 2-CPU machine, where the handler also meets the
/// worker's busy core slot (a temporary) and aborts its restartable sequences.
#[test]
fn a_signal_handler_may_enter_with_a_registration_of_its_own() {
    use std::sync::atomic::AtomicPtr;
    static HELD: [AtomicBool; 1024] = [const { AtomicBool::new(false) }; 1024];
    static HANDLER_REG: AtomicPtr<mmcid::Registration> = AtomicPtr::new(std::ptr::null_mut());
    static HANDLED: AtomicUsize = AtomicUsize::new(0);
    static CLASHES: AtomicUsize = AtomicUsize::new(0);
    fn hold(cid: usize) -> bool {
        cid < HELD.len() && !HELD[cid].swap(true, SeqCst)
    }
    extern "C" fn handler(_: libc::c_int) {
        let reg = HANDLER_REG.load(SeqCst);
        if !reg.is_null() {
            // SAFETY: the worker's handler registration, used by nothing else while the handler runs (the
            // worker only uses its other one, and SIGUSR1 is blocked during its own handler).
            let guard = unsafe { &mut *reg }.enter();
            let cid = guard.cid().get();
            if hold(cid) {
                HELD[cid].store(false, SeqCst);
            } else {
                CLASHES.fetch_add(1, SeqCst);
            }
        }
        HANDLED.fetch_add(1, SeqCst);
    }
    // SAFETY: sigaction with a zeroed struct, a valid handler and an empty mask; SIGUSR1 is used by no other test
    // of this binary.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let group = Group::new();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = |group: Group, stop: Arc<AtomicBool>| {
        move || {
            let mut reg = group.register();
            let mut clashes = 0;
            while !stop.load(SeqCst) {
                let guard = reg.enter();
                let cid = guard.cid().get();
                if !hold(cid) {
                    clashes += 1;
                    continue;
                }
                std::hint::black_box(cid);
                HELD[cid].store(false, SeqCst);
            }
            clashes
        }
    };
    let other = thread::spawn(churn(group.clone(), stop.clone()));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let worker = thread::spawn({
        let (group, stop) = (group.clone(), stop.clone());
        move || {
            let handler_reg = Box::into_raw(Box::new(group.register()));
            HANDLER_REG.store(handler_reg, SeqCst);
            // As an integer: `pthread_t` is one on glibc, a pointer on musl (and std's `as_pthread_t` is neither).
            // SAFETY: pthread_self has no preconditions.
            ready_tx.send(unsafe { libc::pthread_self() } as usize).unwrap();
            let clashes = churn(group, stop)();
            HANDLER_REG.store(std::ptr::null_mut(), SeqCst);
            // SAFETY: made by Box::into_raw above; no handler runs any more (every signal was handled before
            // `stop`, and none is sent after).
            drop(unsafe { Box::from_raw(handler_reg) });
            clashes
        }
    });
    let worker_thread = ready_rx.recv().unwrap() as libc::pthread_t;
    const SIGNALS: usize = 500;
    for sent in 0..SIGNALS {
        // SAFETY: the worker is not joined yet, so its pthread_t is valid.
        assert_eq!(unsafe { libc::pthread_kill(worker_thread, libc::SIGUSR1) }, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while HANDLED.load(SeqCst) == sent {
            assert!(Instant::now() < deadline, "signal {} not handled in 30 s", sent + 1);
            thread::yield_now();
        }
    }
    stop.store(true, SeqCst);
    let clashes = worker.join().unwrap() + other.join().unwrap();
    assert_eq!((clashes, CLASHES.load(SeqCst), HANDLED.load(SeqCst)), (0, 0, SIGNALS));
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 0, "{audit:?}");
}
