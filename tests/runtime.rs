//! The runtime: pinning verified on every core, CIDs exclusive and compact across runtime threads in both modes,
//! panics propagated and released (I7), typed errors for every bad input (I9), the thread view, joining on drop.

mod common;

use common::patience;
use mmcid::{current, CidKind, CpuSet, Error, Group, Mode, Runtime};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// The CPU the OS runs the calling runtime thread on, pinned to `core`: `sched_getcpu` on Linux; `core` itself on
/// the portable path (macOS, the BSDs, `--cfg mmcid_portable`), where a runtime thread's core is declared to its
/// group but not enforced by the OS (no portable affinity API).
fn running_cpu(core: usize) -> usize {
    #[cfg(all(target_os = "linux", not(mmcid_portable)))]
    {
        let _ = core;
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        assert!(cpu >= 0, "sched_getcpu failed");
        cpu as usize
    }
    #[cfg(not(all(target_os = "linux", not(mmcid_portable))))]
    core
}

/// An independent exclusivity check: one counter per CID, which must go 0 → 1 at enter and back before drop.
struct Occupancy(Vec<AtomicUsize>);

impl Occupancy {
    fn new(n: usize) -> Occupancy {
        Occupancy((0..n).map(|_| AtomicUsize::new(0)).collect())
    }

    fn take(&self, cid: usize) {
        let before = self.0[cid].fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "CID {cid} held by two live guards at once (I1)");
    }

    fn give(&self, cid: usize) {
        self.0[cid].fetch_sub(1, Ordering::SeqCst);
    }
}

/// A barrier that a panicking participant breaks, so a failed assertion fails the test instead of hanging it
/// (every other participant then panics at its next `wait`).
struct Phases {
    state: Mutex<(usize, usize, bool)>, // (generation, arrived, broken)
    changed: Condvar,
    parties: usize,
}

impl Phases {
    fn new(parties: usize) -> Phases {
        Phases { state: Mutex::new((0, 0, false)), changed: Condvar::new(), parties }
    }

    fn wait(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!st.2, "another participant panicked");
        let generation = st.0;
        st.1 += 1;
        if st.1 == self.parties {
            *st = (generation + 1, 0, false);
            self.changed.notify_all();
            return;
        }
        // A participant that never arrives (its prologue failed before the closure made its breaker) fails the
        // test after 30 s (`patience`) instead of hanging it.
        let deadline = std::time::Instant::now() + patience(30);
        while st.0 == generation && !st.2 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "a participant never arrived (generation {generation})");
            st = self.changed.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        assert!(!st.2, "another participant panicked");
    }

    /// Breaks the barrier if the calling thread unwinds while this is alive.
    fn breaker(&self) -> Breaker<'_> {
        Breaker(self)
    }
}

struct Breaker<'a>(&'a Phases);

impl Drop for Breaker<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.state.lock().unwrap_or_else(|e| e.into_inner()).2 = true;
            self.0.changed.notify_all();
        }
    }
}

#[test]
fn pinning_is_verified_on_every_core() {
    let rt = Runtime::new().unwrap();
    let all: Vec<usize> = CpuSet::current().unwrap().iter().collect();
    assert_eq!(rt.cpus().iter().collect::<Vec<_>>(), all);
    let handles = rt.spawn_per_cpu(|ctx| {
        let cpu = ctx.cpu();
        assert_eq!(ctx.registration().cpu(), Some(cpu));
        for i in 0..300 {
            assert_eq!(running_cpu(cpu), cpu, "runtime thread left its core");
            let view = current().unwrap();
            assert_eq!((view.cpu(), view.is_pinned()), (cpu, true));
            if i % 16 == 0 {
                std::thread::yield_now();
            }
        }
        cpu
    });
    let mut seen: Vec<usize> = handles
        .into_iter()
        .map(|h| {
            let planned = h.cpu();
            let cpu = h.join().unwrap();
            assert_eq!(cpu, planned);
            cpu
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, all, "one thread on every core");
    assert_eq!(rt.live_threads(), 0);
    assert_eq!(rt.group().users(), 0);
}

#[test]
fn spawn_places_round_robin_and_oversubscribes_beyond_capacity() {
    let rt = Runtime::new().unwrap();
    let cpus: Vec<usize> = rt.cpus().iter().collect();
    let n = cpus.len();
    let phases = Arc::new(Phases::new(2 * n + 1));
    let _breaker = phases.breaker();
    let handles: Vec<_> = (0..2 * n)
        .map(|_| {
            let phases = Arc::clone(&phases);
            rt.spawn(move |ctx| {
                let _breaker = phases.breaker();
                phases.wait(); // all 2n threads registered and alive at once
                phases.wait(); // checked
                (ctx.cpu(), running_cpu(ctx.cpu()), ctx.index())
            })
        })
        .collect();
    phases.wait();
    let planned: Vec<usize> = handles.iter().map(|h| h.cpu()).collect();
    let expected: Vec<usize> = (0..2 * n).map(|i| cpus[i % n]).collect();
    assert_eq!(planned, expected, "round-robin over the runtime's cores");
    assert_eq!(rt.live_threads(), 2 * n);
    assert_eq!(rt.group().users(), 2 * n);
    assert_eq!(rt.group().mode(), Mode::PerCpu, "oversubscribed: the cores own the CIDs");
    phases.wait();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), (expected[i], expected[i], i));
    }
    assert_eq!(rt.live_threads(), 0);
    assert_eq!(rt.group().users(), 0);
}

/// Runs `threads_per_cpu` threads per core looping enter/exit, each CID checked by an independent occupancy
/// counter, in a group whose cores own one CID each (`cids_per_core(1)`: the kernel's per-CPU design, so per-CPU
/// mode lasts and a core lends one CID); returns the group and the kinds of guards seen. In steady state (membership fixed, every thread entered
/// once since) every guard that is not a temporary carries a CID below `max_cids`, computed here from the thread
/// and core counts (I2 soft): a registration's own CID, stable (I3), or its core's CID, the same for every guard of
/// that core (I3 in per-CPU mode).
fn exclusivity_run(threads_per_cpu: usize, expect: Mode) -> (Group, Vec<CidKind>) {
    const ROUNDS: usize = 1500;
    let kernel_design = Group::builder().cids_per_core(1).build().unwrap();
    let rt = Runtime::builder().threads_per_cpu(threads_per_cpu).group(kernel_design).build().unwrap();
    let group = rt.group().clone();
    let cores = rt.cpus().len(); // the runtime's cores, which the group may use (its default: the same mask)
    let users = cores * threads_per_cpu;
    assert_eq!(rt.capacity(), users);
    // I2 hard bound.
    let hard = users + group.cores();
    // design.md §3, from what the test knows: opt = min(allowed cores, users), max_cids = min(opt + opt/4, cores).
    let opt = cores.min(users);
    let soft = (opt + opt / 4).min(group.cores());
    let occupancy = Occupancy::new(hard);
    let phase = Phases::new(users + 1);
    let turn = Mutex::new(());
    // Per thread: its core, and the (kind, CID) of every guard.
    type Run = (usize, Vec<(CidKind, usize)>);
    let runs: Mutex<Vec<Run>> = Mutex::new(Vec::new());
    rt.scope(|s| {
        let _breaker = phase.breaker(); // inside the scope: it must break before the scope joins
        let handles = s.spawn_per_cpu(|ctx| {
            let _breaker = phase.breaker();
            let cpu = ctx.cpu();
            phase.wait(); // everyone registered: membership is now fixed
            {
                // Every thread enters once since the last change, one at a time: no core's CID is busy and no
                // temporary is held, so nothing keeps a core's CID from converging below max_cids (§4.5).
                let _turn = turn.lock().unwrap();
                drop(ctx.enter());
            }
            phase.wait(); // steady state
            let mut seen = Vec::with_capacity(ROUNDS);
            for i in 0..ROUNDS {
                let guard = ctx.enter();
                let cid = guard.cid().get();
                assert!(cid < hard, "CID {cid} beyond users + cores = {hard} (I2)");
                occupancy.take(cid);
                assert_eq!(current().unwrap().cid().map(|c| c.get()), Some(cid));
                match guard.kind() {
                    CidKind::Core(c) => assert_eq!(c, cpu, "borrowed another core's CID"),
                    CidKind::Task | CidKind::Temporary => {}
                }
                if i % 4 == 0 {
                    std::thread::yield_now(); // let a thread on the same core find our CID busy
                }
                seen.push((guard.kind(), cid));
                occupancy.give(cid);
                drop(guard);
            }
            runs.lock().unwrap().push((cpu, seen));
            phase.wait(); // loops done: quiescent
            phase.wait(); // audited
        });
        phase.wait();
        phase.wait();
        assert_eq!(group.mode(), expect);
        assert_eq!(group.max_cids(), soft, "max_cids for {users} users on {cores} of {} cores", group.cores());
        phase.wait();
        let audit = group.audit();
        assert!(audit.is_consistent(), "{audit:?}");
        let owners = match expect {
            Mode::PerTask => users, // one CID per registration
            _ => cores,             // one CID per runtime core, each entered on (the other cores' slots are empty)
        };
        assert_eq!(audit.owners, owners, "{audit:?}");
        phase.wait();
        for h in handles {
            h.join().unwrap();
        }
    });
    assert_eq!(group.users(), 0);
    assert_eq!(group.stats().cids_in_use, 0, "I5: nothing marked once the last thread left");
    let runs = runs.into_inner().unwrap();
    assert_eq!(runs.len(), users);
    // Steady-state checks, against the bound computed above.
    let mut task_cids = Vec::new();
    let mut core_cids: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (cpu, seen) in &runs {
        let mut mine: Vec<usize> = seen.iter().filter(|(k, _)| *k == CidKind::Task).map(|&(_, c)| c).collect();
        mine.dedup();
        assert!(mine.len() <= 1, "per-task CID changed while membership was fixed: {mine:?} (I3)");
        task_cids.extend(mine);
        core_cids
            .entry(*cpu)
            .or_default()
            .extend(seen.iter().filter(|(k, _)| *k == CidKind::Core(*cpu)).map(|&(_, c)| c));
    }
    for (cpu, cids) in core_cids.iter_mut() {
        cids.sort_unstable();
        cids.dedup();
        assert!(cids.len() <= 1, "core {cpu} lent different CIDs in steady state: {cids:?} (I3)");
    }
    let mut core_cids: Vec<usize> = core_cids.into_values().flatten().collect();
    for (what, cids) in [("task", &mut task_cids), ("core", &mut core_cids)] {
        assert!(cids.iter().all(|&c| c < soft), "{what} CIDs {cids:?} not all below max_cids {soft} (I2 soft)");
        let n = cids.len();
        cids.sort_unstable();
        cids.dedup();
        assert_eq!(cids.len(), n, "two registrations or two cores with one CID");
    }
    match expect {
        Mode::PerTask => assert_eq!((task_cids.len(), core_cids.len()), (users, 0)),
        // Every core lent its CID at least once: the first enter of the loop on a core finds it idle.
        _ => assert_eq!((task_cids.len(), core_cids.len()), (0, cores)),
    }
    let kinds: Vec<CidKind> = runs.iter().flat_map(|(_, seen)| seen.iter().map(|&(k, _)| k)).collect();
    assert_eq!(kinds.len(), users * ROUNDS);
    (group, kinds)
}

#[test]
fn cids_are_exclusive_and_compact_per_task_one_thread_per_core() {
    let (group, kinds) = exclusivity_run(1, Mode::PerTask);
    assert!(kinds.iter().all(|k| *k == CidKind::Task), "per-task mode hands out registration CIDs");
    assert!(group.stats().enter_task_fast > 0);
}

/// The runtime's own group (CID sets, design.md §2.6): three threads per core that yield inside their guards, so the
/// others on the core borrow its extra CIDs or the group switches to per-task ownership (§3.1). Whatever it does,
/// CIDs stay exclusive (an independent occupancy checker), below I2's hard bound `users + K·cores`, core CIDs come
/// from the thread's own core (runtime threads are pinned), and nothing stays marked once everyone left (I5).
#[test]
fn cids_are_exclusive_with_cid_sets_and_three_threads_per_core() {
    const ROUNDS: usize = 1500;
    let rt = Runtime::builder().threads_per_cpu(3).build().unwrap();
    let group = rt.group().clone();
    let users = rt.capacity();
    let hard = users + group.cids_per_core() * group.cores();
    let occupancy = Occupancy::new(hard);
    rt.scope(|s| {
        let handles = s.spawn_per_cpu(|ctx| {
            let cpu = ctx.cpu();
            for i in 0..ROUNDS {
                let guard = ctx.enter();
                let cid = guard.cid().get();
                assert!(cid < hard, "CID {cid} beyond users + K·cores = {hard} (I2)");
                occupancy.take(cid);
                if let CidKind::Core(c) = guard.kind() {
                    assert_eq!(c, cpu, "borrowed another core's CID");
                }
                if i % 4 == 0 {
                    std::thread::yield_now(); // descheduled inside the guard
                }
                occupancy.give(cid);
                drop(guard);
            }
        });
        for h in handles {
            h.join().unwrap();
        }
    });
    assert_eq!(group.users(), 0);
    let audit = group.audit();
    assert!(audit.is_consistent() && audit.bits == 0, "I5: {audit:?}");
}

#[test]
fn cids_are_exclusive_per_cpu_with_three_threads_per_core() {
    let (group, kinds) = exclusivity_run(3, Mode::PerCpu);
    assert!(kinds.iter().any(|k| matches!(k, CidKind::Core(_))), "per-CPU mode borrows the cores' CIDs");
    assert!(kinds.iter().all(|k| *k != CidKind::Task));
    assert!(group.stats().enter_cpu_fast > 0);
}

#[test]
fn a_panic_propagates_through_join_and_releases_its_cid() {
    let rt = Runtime::new().unwrap();
    let group = rt.group().clone();
    let (go, wait) = mpsc::channel::<()>();
    let (ready_tx, ready) = mpsc::channel::<()>();
    let bystander = rt.spawn(move |ctx| {
        drop(ctx.enter());
        ready_tx.send(()).unwrap();
        wait.recv().unwrap();
        7
    });
    // The bystander registers in its own thread: wait for it, or the counts below race its start.
    ready.recv().unwrap();
    let doomed = rt.spawn(|ctx| {
        let cpu = ctx.cpu();
        let _guard = ctx.enter();
        panic!("boom on core {cpu}");
    });
    let cpu = doomed.cpu();
    let payload = doomed.join().unwrap_err();
    assert_eq!(payload.downcast_ref::<String>(), Some(&format!("boom on core {cpu}")));
    // The bystander is registered and outside any guard: the group is quiescent.
    assert_eq!(group.users(), 1, "the panicking thread's registration was dropped while unwinding (I7)");
    let audit = group.audit();
    assert!(audit.is_consistent(), "{audit:?}");
    assert_eq!(audit.owners, 1);
    go.send(()).unwrap();
    assert_eq!(bystander.join().unwrap(), 7);
    assert_eq!(group.users(), 0);
    assert_eq!(group.stats().cids_in_use, 0);
    assert_eq!(rt.live_threads(), 0);
}

#[test]
fn scoped_panics_propagate_too() {
    let rt = Runtime::new().unwrap();
    let joined = rt.scope(|s| {
        s.spawn(|ctx| {
            let _guard = ctx.enter();
            std::panic::panic_any(41usize);
        })
        .join()
    });
    assert_eq!(joined.unwrap_err().downcast_ref::<usize>(), Some(&41));
    // Not joined: the scope itself panics once every thread is done, so the panic is not lost.
    let unjoined = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.scope(|s| {
            s.spawn(|ctx| {
                let _guard = ctx.enter();
                std::panic::resume_unwind(Box::new("quiet"));
            });
        })
    }));
    assert!(unjoined.is_err());
    assert_eq!(rt.group().users(), 0);
    assert_eq!(rt.group().stats().cids_in_use, 0);
    assert!(rt.group().audit().is_consistent());
}

#[test]
fn bad_input_is_a_typed_error() {
    assert_eq!(Runtime::builder().threads_per_cpu(0).build().unwrap_err(), Error::ZeroThreads);
    // A thread count the group could never register: refused before `capacity()` could overflow.
    for n in [usize::MAX, usize::MAX / 2 + 1, 1 << 40] {
        match Runtime::builder().threads_per_cpu(n).build() {
            Err(Error::ValueOutOfRange { what: "threads_per_cpu", value, min: 1, max }) => {
                assert_eq!(value, n);
                assert!(max >= 1 && max < n);
            }
            other => panic!("threads_per_cpu({n}): expected ValueOutOfRange, got {other:?}"),
        }
    }
    // A stack too small for the thread's own start: refused at build, not a stack overflow in the thread.
    let min = mmcid::RuntimeBuilder::MIN_STACK_SIZE;
    for bytes in [0, 16 * 1024, min - 1] {
        let err = Runtime::builder().stack_size(bytes).build().unwrap_err();
        assert_eq!(err, Error::ValueOutOfRange { what: "stack_size", value: bytes, min, max: usize::MAX });
        assert!(err.to_string().contains("stack_size"), "{err}");
    }
    let rt = Runtime::builder().stack_size(min).build().unwrap();
    let (cpu, cid) = rt.spawn(|ctx| (ctx.cpu(), ctx.enter().cid().get())).join().unwrap();
    assert!(rt.cpus().contains(cpu));
    assert_eq!(cid, 0, "the only registration of the group");
    // A stack the OS cannot give: the spawn error says which size it was.
    let rt = Runtime::builder().stack_size(usize::MAX).build().unwrap();
    let err = *rt.spawn(|_| ()).join().unwrap_err().downcast::<Error>().unwrap();
    assert!(matches!(&err, Error::Spawn { reason } if reason.contains(&usize::MAX.to_string())), "{err}");
    assert_eq!(rt.group().users(), 0);
    // An empty set cannot even be made: every public constructor refuses it.
    assert_eq!(CpuSet::from_cpus([]).unwrap_err(), Error::EmptyCpuSet);
    assert_eq!(CpuSet::virtual_set([]).unwrap_err(), Error::EmptyCpuSet);
    // A virtual set is re-validated as real cores.
    let far = 60_000; // beyond any real machine, within what a virtual set may name (65 536)
    match Runtime::builder().cpus(CpuSet::virtual_set([far]).unwrap()).build().unwrap_err() {
        Error::CpuOutOfRange { cpu, possible } => assert!(cpu == far && possible <= far),
        other => panic!("expected CpuOutOfRange, got {other:?}"),
    }
    // A group that may not use a runtime core; the group is left untouched.
    let all = CpuSet::current().unwrap();
    let cpus: Vec<usize> = all.iter().collect();
    let virt = Group::builder().virtual_cpus(1).build().unwrap();
    match cpus.iter().find(|&&c| c >= 1) {
        Some(&c) => assert_eq!(
            Runtime::builder().cpus(all.clone()).group(virt.clone()).build().unwrap_err(),
            Error::CpuNotInGroup { cpu: c }
        ),
        None => assert!(Runtime::builder().cpus(all.clone()).group(virt.clone()).build().is_ok()),
    }
    assert_eq!(virt.users(), 0);
    if cpus.len() < 2 {
        eprintln!("one core only: the one-core group and the runtime-thread cases need two");
        return;
    }
    let small = Group::builder().cpus(CpuSet::from_cpus([cpus[0]]).unwrap()).build().unwrap();
    assert_eq!(
        Runtime::builder().cpus(all.clone()).group(small.clone()).build().unwrap_err(),
        Error::CpuNotInGroup { cpu: cpus[1] }
    );
    assert_eq!(small.users(), 0);
    // Inside a runtime thread the thread's mask is one core, but the process may still run on the others (the
    // main thread's mask has them): naming them is no error. The defaults stay the thread's own mask.
    let rt = Runtime::builder().cpus(CpuSet::from_cpus([cpus[0]]).unwrap()).build().unwrap();
    let (inner, named, widened, default) = rt
        .spawn(move |_| {
            let inner = Runtime::builder().cpus(all.clone()).build().map(|rt| rt.cpus().clone());
            let named = CpuSet::from_cpus(all.iter());
            let widened = Group::new().set_cpus_allowed(&all);
            let default = Runtime::new().map(|rt| rt.cpus().clone());
            (inner, named, widened, default)
        })
        .join()
        .unwrap();
    assert_eq!(inner, Ok(CpuSet::current().unwrap()));
    assert_eq!(named, Ok(CpuSet::current().unwrap()));
    assert_eq!(widened, Ok(()));
    // Without an affinity API (the portable path) the runtime thread's mask is still every core.
    let mask = if cfg!(all(target_os = "linux", not(mmcid_portable))) {
        CpuSet::from_cpus([cpus[0]])
    } else {
        CpuSet::current()
    };
    assert_eq!(default.unwrap(), mask.unwrap(), "default: the thread's mask");
}

/// Pins thread `tid` (0: the calling one) to `cpu`.
#[cfg(all(target_os = "linux", not(mmcid_portable)))]
fn narrow(tid: libc::pid_t, cpu: usize) {
    // SAFETY: cpu_set_t is plain old data; `cpu` is below its bit size (a CPU of this machine).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(rc, 0, "sched_setaffinity({tid}, {{{cpu}}})");
}

/// I9 for the whole process, in a child process of this test that narrows its main thread and the test's thread
/// to one CPU after taking the set of all: a second CPU given as a number, or in a set that skipped the check
/// (`virtual_set`), is refused by every path that takes real cores; virtual groups do not care; and the set taken
/// before narrowing stays valid for groups (checked when it was made: a thread may pin itself after taking it).
// Narrows affinity masks: Linux's calls.
#[cfg(all(target_os = "linux", not(mmcid_portable)))]
#[test]
fn a_cpu_outside_every_mask_is_refused_by_every_path() {
    const CHILD: &str = "MMCID_TEST_ONE_CPU_CHILD";
    const NAME: &str = "a_cpu_outside_every_mask_is_refused_by_every_path";
    if let Some(arg) = std::env::var_os(CHILD) {
        let (first, other) = arg
            .to_str()
            .and_then(|s| s.split_once(','))
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
            .expect("the parent passes two CPU numbers");
        let wide = CpuSet::current().unwrap();
        assert!(wide.contains(first) && wide.contains(other), "the child starts on both CPUs: {wide:?}");
        // SAFETY: getpid has no preconditions.
        narrow(unsafe { libc::getpid() }, first); // the main thread
        narrow(0, first); // this one
        assert_eq!(CpuSet::current().unwrap().len(), 1, "the child runs on one CPU");
        let refused: Result<(), Error> = Err(Error::CpuNotAllowed { cpu: other });
        let virt = CpuSet::virtual_set([other]).unwrap();
        assert_eq!(CpuSet::from_cpus([other]).map(|_| ()), refused);
        assert_eq!(Group::builder().cpus_virtual([other]).build().map(|_| ()), refused);
        assert_eq!(Group::builder().cpus(virt.clone()).build().map(|_| ()), refused);
        assert_eq!(Group::new().set_cpus_allowed(&virt), refused);
        assert_eq!(Runtime::builder().cpus(virt).build().map(|_| ()), refused);
        assert!(Group::builder().virtual_cpus(other + 1).cpus_virtual([other]).build().is_ok());
        assert_eq!(Group::builder().cpus(wide.clone()).build().map(|g| g.cpus()), Ok(wide.clone()));
        assert_eq!(Group::new().set_cpus_allowed(&wide), Ok(()));
        println!("child: every path refused CPU {other}");
        return;
    }
    let cpus: Vec<usize> = CpuSet::current().unwrap().iter().collect();
    if cpus.len() < 2 {
        eprintln!("one core only: nothing to refuse");
        return;
    }
    let (first, other) = (cpus[0], cpus[1]);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{first},{other}"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains(&format!("child: every path refused CPU {other}")),
        "the child skipped its checks:\n{stdout}"
    );
}

#[test]
fn current_agrees_with_the_guard() {
    // A thread the runtime did not start: its core comes from sched_getcpu, it is not pinned.
    let view = current().unwrap();
    assert!(!view.is_pinned());
    assert!(view.cpu() < 4096);
    assert_eq!(view.cid(), None);
    let group = Group::new();
    {
        let guard = group.enter();
        assert_eq!(current().unwrap().cid().map(|c| c.get()), Some(guard.cid().get()));
    }
    assert_eq!(current().unwrap().cid(), None);

    let rt = Runtime::new().unwrap();
    let other = group.clone();
    rt.spawn(move |ctx| {
        let cpu = ctx.cpu();
        let view = current().unwrap();
        assert_eq!((view.cpu(), view.is_pinned(), view.cid()), (cpu, true, None));
        for _ in 0..50 {
            let guard = ctx.enter();
            let cid = guard.cid().get();
            assert_eq!(current().unwrap().cid().map(|c| c.get()), Some(cid));
            {
                let inner = other.enter(); // another group: the view shows the innermost guard
                assert_eq!(current().unwrap().cid().map(|c| c.get()), Some(inner.cid().get()));
            }
            assert_eq!(current().unwrap().cid().map(|c| c.get()), Some(cid), "restored when the inner guard drops");
            assert_eq!(current().unwrap().cpu(), cpu);
            drop(guard);
            assert_eq!(current().unwrap().cid(), None);
        }
        other.leave_thread();
    })
    .join()
    .unwrap();
}

/// Guards dropped out of order (found in review): the view never shows a CID the thread no longer holds; after
/// an out-of-order drop it shows only guards entered since, while each is the innermost, until the last drops.
#[test]
fn current_after_out_of_order_drops() {
    let cid = || current().unwrap().cid().map(|c| c.get());
    let group = Group::new();
    let other = Group::new(); // CIDs of two groups may coincide: the view must not be fooled by equal values
    let (mut r1, mut r2, mut r3) = (group.register(), group.register(), other.register());
    let g1 = r1.enter();
    let g2 = r2.enter();
    assert_eq!(cid(), Some(g2.cid().get()));
    drop(g1); // g2 is still live: out of order
    assert_eq!(cid(), None, "unknown, not g1's released CID");
    let g3 = r3.enter();
    assert_eq!(cid(), Some(g3.cid().get()), "the next guard is shown");
    drop(g2); // out of order again (g3 is innermost)
    assert_eq!(cid(), None);
    drop(g3);
    assert_eq!(cid(), None, "no guard left, and not g2's released CID");
    // Back to normal: nested guards in order.
    let g1 = r1.enter();
    let g2 = r2.enter();
    assert_eq!(cid(), Some(g2.cid().get()));
    drop(g2);
    assert_eq!(cid(), Some(g1.cid().get()));
    drop(g1);
    assert_eq!(cid(), None);
    // Three guards, the middle one dropped first: neither of the others may put its CID back.
    let (g1, g2, g3) = (r1.enter(), r2.enter(), r3.enter());
    drop(g2);
    assert_eq!(cid(), None);
    drop(g3);
    assert_eq!(cid(), None, "not g2's released CID");
    drop(g1);
    assert_eq!(cid(), None);
    let g1 = r1.enter();
    assert_eq!(cid(), Some(g1.cid().get()));
}

/// Random enter/drop orders over two groups: the view shows a live guard's CID or `None`, never a released one,
/// and right after an enter it shows that guard's CID.
#[test]
fn current_never_shows_a_released_cid() {
    let groups = [Group::new(), Group::new()];
    let mut live: Vec<(usize, mmcid::CidGuard<'static>)> = Vec::new(); // (group index, guard)
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..5000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if live.len() < 6 && (live.is_empty() || x % 2 == 0) {
            let gi = (x >> 8) as usize % 2;
            let guard = groups[gi].enter();
            let shown = current().unwrap().cid();
            assert_eq!(shown, Some(guard.cid()), "an enter shows its own CID");
            live.push((gi, guard));
        } else {
            let at = (x >> 8) as usize % live.len();
            drop(live.remove(at));
        }
        if let Some(shown) = current().unwrap().cid() {
            assert!(live.iter().any(|(_, g)| g.cid() == shown), "shows {shown:?}, held by no live guard");
        }
    }
    drop(live);
    assert_eq!(current().unwrap().cid(), None);
    for g in &groups {
        g.leave_thread();
    }
}

#[test]
fn dropping_the_runtime_joins_its_threads() {
    let rt = Runtime::new().unwrap();
    let group = rt.group().clone();
    let n = rt.cpus().len();
    let done = Arc::new(AtomicUsize::new(0));
    let kept = {
        let done = Arc::clone(&done);
        rt.spawn(move |ctx| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            done.fetch_add(1, Ordering::SeqCst);
            ctx.cpu()
        })
    };
    for _ in 0..n {
        let done = Arc::clone(&done);
        let group = group.clone();
        drop(rt.spawn(move |ctx| {
            drop(ctx.enter());
            // A thread-local registration, dropped only at thread exit: joining means waiting for that too.
            drop(group.enter());
            std::thread::sleep(std::time::Duration::from_millis(20));
            done.fetch_add(1, Ordering::SeqCst);
        }));
    }
    drop(rt);
    assert_eq!(done.load(Ordering::SeqCst), n + 1, "every thread finished before drop returned");
    assert_eq!(group.users(), 0, "thread-exit destructors ran too");
    assert_eq!(group.stats().cids_in_use, 0);
    assert!(kept.is_finished());
    let cpu = kept.cpu();
    assert_eq!(kept.join().unwrap(), cpu, "a result outlives the runtime in its handle");
}

/// Runs a closure in a thread-local destructor of the calling thread: for a runtime thread, after its closure has
/// returned and its result is in its handle, while its OS thread is still alive (joining the OS thread waits for it).
/// The closure must not panic: a panic in a thread-local destructor aborts the process.
struct AtExit(Option<Box<dyn FnOnce()>>);

impl Drop for AtExit {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

thread_local! {
    static AT_EXIT: std::cell::RefCell<AtExit> = const { std::cell::RefCell::new(AtExit(None)) };
}

fn at_exit(f: impl FnOnce() + 'static) {
    AT_EXIT.with(|a| a.borrow_mut().0 = Some(Box::new(f)));
}

/// The runtime's drop, run by one of its own threads, joins the others. The other thread cannot exit before the
/// drop is about to start (its thread-local destructor waits for the dropping thread's word), so it is still
/// running when the drop starts; it then takes 50 ms more to exit, so a drop that returned without joining it would
/// find its exit flag unset (unless the dropping thread itself stalled that long). A joining drop always finds it
/// set, whatever the scheduler does.
#[test]
fn a_runtime_dropped_by_its_own_thread_joins_the_others() {
    let rt = Arc::new(Runtime::new().unwrap());
    let group = rt.group().clone();
    let exited = Arc::new(AtomicBool::new(false));
    let (dropping_tx, dropping) = mpsc::channel::<()>();
    let (go, wait) = mpsc::channel::<()>();
    let own = Arc::clone(&rt);
    let seen = Arc::clone(&exited);
    // Spawned first: a spawn joins the runtime's threads whose closures have returned, and `other`'s returns early.
    let last = rt.spawn(move |_| {
        wait.recv().unwrap();
        dropping_tx.send(()).unwrap(); // `other` may exit from now on
        drop(own); // the last reference: Runtime::drop runs here, on one of its own threads
        seen.load(Ordering::SeqCst)
    });
    let flag = Arc::clone(&exited);
    let other = rt.spawn(move |_| {
        at_exit(move || {
            // No word in 30 s (a deadlock; `patience`): leave the flag unset, for the test to fail.
            if dropping.recv_timeout(patience(30)).is_ok() {
                thread::sleep(Duration::from_millis(50));
                flag.store(true, Ordering::SeqCst);
            }
        })
    });
    drop(rt);
    go.send(()).unwrap();
    assert!(last.join().unwrap(), "the drop returned before the other thread had exited");
    other.join().unwrap();
    assert_eq!(group.users(), 0);
}

/// A runtime thread joining another while the runtime is dropped (found in review): the drop joined the
/// threads one after another and used to fill each result only after joining it, so B, joining C, waited for a
/// result that only the blocked drop would fill. B joins C after the drop has started (the main thread's word, then
/// a pause); whether the drop had already taken C out of the registry is then checked, not assumed: C's exit
/// waits for B (up to the pause plus 200 ms), so if C's OS thread has not exited when B's join returns, the join did not join it
/// itself, the drop held it. An attempt that did not reach that is run again with a longer pause. Each attempt
/// runs on a helper thread and fails after 30 s (a deadlock).
#[test]
fn drop_while_a_runtime_thread_joins_another() {
    const ATTEMPTS: u32 = 8;
    for attempt in 0..ATTEMPTS {
        let pause = Duration::from_millis(10 << attempt.min(5));
        let (done_tx, done_rx) = mpsc::channel();
        thread::spawn(move || {
            let rt = Runtime::new().unwrap();
            let (c_tx, c_rx) = mpsc::channel::<mmcid::JoinHandle<u32>>();
            let (dropping_tx, dropping) = mpsc::channel::<()>();
            let (release_tx, release) = mpsc::channel::<()>();
            let (result_tx, result) = mpsc::channel();
            let c_exited = Arc::new(AtomicBool::new(false));
            let seen = Arc::clone(&c_exited);
            let b = rt.spawn(move |_| {
                let c = c_rx.recv().unwrap();
                dropping.recv().unwrap();
                thread::sleep(pause); // for the drop to take C (and B) out of the registry
                let joined = c.join().ok();
                let drop_held_c = !seen.load(Ordering::SeqCst);
                let _ = release_tx.send(()); // C may exit now
                result_tx.send((joined, drop_held_c)).unwrap();
            });
            let c = rt.spawn(move |_| {
                at_exit(move || {
                    // Longer than B's pause, so that C is still there when B's join starts.
                    let _ = release.recv_timeout(pause + Duration::from_millis(200));
                    c_exited.store(true, Ordering::SeqCst);
                });
                7
            });
            c_tx.send(c).unwrap();
            drop(b);
            dropping_tx.send(()).unwrap();
            drop(rt);
            done_tx.send(result.recv().unwrap()).unwrap();
        });
        let (joined, drop_held_c) = done_rx.recv_timeout(patience(30)).expect("dropping the runtime deadlocked");
        assert_eq!(joined, Some(7), "B's join of C");
        if drop_held_c {
            return;
        }
        eprintln!("attempt {attempt}: B joined C before the drop took it; again with a longer pause");
    }
    panic!("in {ATTEMPTS} attempts B's join never ran while the drop held C");
}

/// A runtime thread joining its own handle gets a typed error instead of a hang or std's panic (found in review),
/// and the runtime still joins it when dropped.
#[test]
fn joining_oneself_is_a_typed_error() {
    let (done_tx, done_rx) = mpsc::channel();
    thread::spawn(move || {
        let rt = Runtime::new().unwrap();
        let (tx, rx) = mpsc::channel::<mmcid::JoinHandle<()>>();
        let (err_tx, err_rx) = mpsc::channel();
        let me = rt.spawn(move |_| {
            let own = rx.recv().unwrap();
            let err = own.join().unwrap_err();
            err_tx.send(err.downcast_ref::<Error>().cloned()).unwrap();
        });
        tx.send(me).unwrap();
        assert_eq!(err_rx.recv().unwrap(), Some(Error::JoinSelf));
        drop(rt);
        done_tx.send(()).unwrap();
    });
    assert!(done_rx.recv_timeout(patience(20)).is_ok(), "joining oneself hung");
}
