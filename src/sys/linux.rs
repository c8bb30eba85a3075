//! The platform calls on Linux (and Android): `sched_getaffinity`/`sched_setaffinity` as raw system calls (masks of
//! any length), `sched_getcpu` behind the rseq area's `cpu_id`, the possible CPUs from sysfs checked against the
//! kernel's own bound (design.md §12.3), and membarrier.

use super::MAX_CPUS;
use std::sync::OnceLock;

/// The CPU the calling thread runs on now; 0 if unknown. Reads the kernel's rseq `cpu_id` straight from the
/// area glibc registered (a load at a fixed offset from the thread pointer), else asks `sched_getcpu`.
#[inline(always)]
pub(crate) fn current_cpu() -> usize {
    match crate::rseq::cpu_id() {
        Some(cpu) => cpu,
        None => current_cpu_slow(),
    }
}

/// `current_cpu` without a usable rseq area (not found, not probed yet, or not registered for this thread).
/// Never probes: `rseq::probe` takes the loader's lock (`dlsym`), which is neither async-signal-safe nor safe
/// in the child of a multithreaded fork, so it runs only where groups and policies are built.
#[inline(never)]
fn current_cpu_slow() -> usize {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 on error, which we map to 0.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).unwrap_or(0)
}

/// The CPU the calling thread runs on now, or the OS error number when `sched_getcpu` fails (unlike
/// [`current_cpu`], which maps failure to 0). Used where the answer must be trusted: pin verification and the
/// runtime's thread view.
#[inline]
pub(crate) fn try_current_cpu() -> Result<usize, i32> {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 and sets errno on error.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        Err(errno())
    } else {
        Ok(cpu as usize)
    }
}

/// Number of possible CPUs, our `cores`: a bound on every CPU number the kernel can report (its `nr_cpu_ids`,
/// one more than the highest possible CPU, gaps included), so that every CPU has its own slot (design.md
/// §12.3). Read once per process.
pub(crate) fn possible_cpus() -> usize {
    static POSSIBLE: OnceLock<usize> = OnceLock::new();
    *POSSIBLE.get_or_init(|| {
        let sysfs = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok();
        let (kernel, allowed) = kernel_cpu_bound().map_or((None, None), |(k, a)| (Some(k), Some(a)));
        // SAFETY: sysconf has no preconditions.
        let conf = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        possible_from(sysfs.as_deref(), kernel, allowed, usize::try_from(conf).unwrap_or(1))
    })
}

/// `possible_cpus` from its sources, a pure function for the tests (design.md §12.3):
///
/// * `sysfs`: `/sys/devices/system/cpu/possible` (e.g. `0-3,8-11`), exactly `nr_cpu_ids` where it is the
///   kernel's own file; absent where sysfs is not mounted, and possibly not the kernel's in a container;
/// * `kernel`: `kernel_cpu_bound`'s `nr_cpu_ids` rounded up to 64, asked of the kernel itself;
/// * `allowed`: one more than the highest CPU the calling thread may run on, which any answer must cover;
/// * `conf`: `sysconf(_SC_NPROCESSORS_CONF)`, the last resort (glibc falls back to the online count).
///
/// The sysfs list is used where it agrees with the kernel's bound (same multiple of 64) and covers `allowed`:
/// then it is exact, and `cores` stays what the machine has. Otherwise the kernel's bound (a few more slots
/// than CPUs, never fewer). Without either, the larger of `conf` and `allowed`. At most `MAX_CPUS`.
pub(crate) fn possible_from(sysfs: Option<&str>, kernel: Option<usize>, allowed: Option<usize>, conf: usize) -> usize {
    let listed = sysfs.and_then(|s| parse_cpu_list(s.trim())).and_then(|cpus| cpus.into_iter().max()).map(|m| m + 1);
    let floor = allowed.unwrap_or(1).max(1);
    let cores = match (listed, kernel) {
        (Some(n), Some(k)) if n <= k && n + 64 > k && n >= floor => n,
        (_, Some(k)) => k.max(floor),
        (Some(n), None) => n.max(floor),
        (None, None) => conf.max(floor),
    };
    cores.min(MAX_CPUS)
}

/// `sched_getaffinity` of thread `tid` (0: the caller) into a mask of `words` 64-bit words: the mask, or the
/// errno (EINVAL: the mask is shorter than the kernel's `nr_cpu_ids` bits). The raw system call, not glibc's
/// wrapper with its fixed 1024-bit `cpu_set_t`.
pub(crate) fn affinity_words(tid: libc::pid_t, words: usize) -> Result<Vec<u64>, i32> {
    let mut mask = vec![0u64; words];
    // SAFETY: the kernel writes at most `words * 8` bytes to `mask`, which lives across the call.
    let rc = unsafe { libc::syscall(libc::SYS_sched_getaffinity, tid, words * 8, mask.as_mut_ptr()) };
    if rc < 0 {
        Err(errno())
    } else {
        Ok(mask)
    }
}

/// The CPUs set in `mask`.
fn cpus_in(mask: &[u64]) -> Vec<usize> {
    (0..mask.len() * 64).filter(|&c| mask[c / 64] & (1 << (c % 64)) != 0).collect()
}

/// The kernel's `nr_cpu_ids` rounded up to 64, and one more than the highest CPU the calling thread may run
/// on: `sched_getaffinity` refuses (EINVAL) a mask shorter than `nr_cpu_ids` bits and wants whole 8-byte
/// words, so the shortest mask it accepts has `nr_cpu_ids` rounded up to 64 bits. Found by doubling, then
/// halving the interval (a dozen calls at most, once per process). `None` if the call fails otherwise (a
/// seccomp filter) or no mask up to `MAX_CPUS` bits is accepted.
pub(crate) fn kernel_cpu_bound() -> Option<(usize, usize)> {
    let most = MAX_CPUS / 64;
    let (mut refused, mut accepted) = (0, 1);
    let mut mask = loop {
        match affinity_words(0, accepted) {
            Ok(mask) => break mask,
            Err(libc::EINVAL) if accepted < most => (refused, accepted) = (accepted, accepted * 2),
            Err(_) => return None,
        }
    };
    while accepted - refused > 1 {
        let mid = (refused + accepted) / 2;
        match affinity_words(0, mid) {
            Ok(m) => (accepted, mask) = (mid, m),
            Err(libc::EINVAL) => refused = mid,
            Err(_) => return None,
        }
    }
    let allowed = cpus_in(&mask).last().map_or(0, |&c| c + 1);
    Some((accepted * 64, allowed))
}

/// The calling thread's affinity mask as a list of CPUs.
pub(crate) fn affinity() -> Result<Vec<usize>, i32> {
    affinity_of(0)
}

/// The affinity mask of the process's main thread (the thread whose id is the process id): what threads the
/// process starts inherit unless something narrowed them.
pub(crate) fn main_thread_affinity() -> Result<Vec<usize>, i32> {
    // SAFETY: getpid has no preconditions.
    affinity_of(unsafe { libc::getpid() })
}

/// Thread `tid`'s affinity, in a mask as long as the possible CPUs (at least 1024 bits, doubled while the
/// kernel says it is too short), so machines with more than glibc's 1024-CPU `cpu_set_t` work too.
fn affinity_of(tid: libc::pid_t) -> Result<Vec<usize>, i32> {
    let mut words = possible_cpus().div_ceil(64).max(16);
    loop {
        match affinity_words(tid, words) {
            Ok(mask) => return Ok(cpus_in(&mask)),
            Err(libc::EINVAL) if words < MAX_CPUS / 64 => words *= 2,
            Err(e) => return Err(e),
        }
    }
}

/// Pins the calling thread to one CPU (EINVAL for a CPU the kernel does not have).
pub(crate) fn pin_current(cpu: usize) -> Result<(), i32> {
    if cpu >= MAX_CPUS {
        return Err(libc::EINVAL);
    }
    let mut mask = vec![0u64; cpu / 64 + 1];
    mask[cpu / 64] |= 1 << (cpu % 64);
    // SAFETY: the kernel reads at most `mask.len() * 8` bytes from `mask`, which lives across the call (bits
    // beyond its own mask size are ignored, so a CPU it does not have leaves an empty mask: EINVAL).
    let rc = unsafe { libc::syscall(libc::SYS_sched_setaffinity, 0, mask.len() * 8, mask.as_ptr()) };
    if rc != 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_long = 1 << 8;

/// Whether membarrier command `cmd` is supported, after registering the process for it with `register`.
fn membarrier_register(cmd: libc::c_long, register: libc::c_long) -> bool {
    // SAFETY: membarrier with QUERY takes no pointers.
    let cmds = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
    if cmds < 0 || cmds & cmd == 0 {
        return false;
    }
    // SAFETY: registration takes no pointers; it only marks the process.
    unsafe { libc::syscall(libc::SYS_membarrier, register, 0, 0) == 0 }
}

/// Issues membarrier command `cmd` once: `Err(errno)` if the kernel refused it. That happens after a
/// successful registration too (design.md §12): the private expedited commands return ENOMEM when the kernel
/// cannot allocate its CPU mask (`CONFIG_CPUMASK_OFFSTACK`) before sending anything, and a seccomp filter
/// installed later makes every call fail with whatever it says.
fn membarrier_issue(cmd: libc::c_long) -> Result<(), i32> {
    // SAFETY: the PRIVATE_EXPEDITED commands take no pointers; the caller registered the process.
    if unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Whether `membarrier(PRIVATE_EXPEDITED)` is usable in this process; registers it on first call. Called only
/// by a group build, under the registry lock, so a fork (whose prepare handler takes that lock) never finds the
/// registration half done (design.md §12.2).
pub(crate) fn membarrier_available() -> bool {
    *MEMBARRIER.get_or_init(|| {
        membarrier_register(MEMBARRIER_CMD_PRIVATE_EXPEDITED, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
    })
}

static MEMBARRIER: OnceLock<bool> = OnceLock::new();
static MEMBARRIER_RSEQ: OnceLock<bool> = OnceLock::new();

/// For fork's prepare handler (design.md §12.2): completes the process-wide probes that run outside the
/// registry lock (possible CPUs, which validation and `CpuSet::possible_cpus` ask for too, and the rseq area),
/// waiting for another thread's, so a child never inherits one half done (a `OnceLock` or `Once` whose
/// initialiser does not exist in the child would block its first build for ever). Both are cheap, read-only
/// probes, so the handler runs them even where no thread asked yet.
pub(crate) fn finish_probes() {
    possible_cpus();
    crate::rseq::probe();
}

/// A full memory barrier on every CPU running a thread of this process, or the error that stopped it (then
/// no CPU was sent anything we may rely on). Only called after `membarrier_available()` returned true.
pub(crate) fn membarrier() -> Result<(), i32> {
    membarrier_issue(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
}

/// Whether `membarrier(PRIVATE_EXPEDITED_RSEQ)` is usable in this process; registers it on first call.
/// As `membarrier_available`, under the registry lock.
pub(crate) fn membarrier_rseq_available() -> bool {
    *MEMBARRIER_RSEQ.get_or_init(|| {
        membarrier_register(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ)
    })
}

/// A full memory barrier on every CPU running a thread of this process, which also aborts the restartable
/// sequence each of them may be in (the kernel's `ipi_rseq`: `smp_mb(); rseq_preempt()`), or the error that
/// stopped it. Only called after `membarrier_rseq_available()` returned true.
pub(crate) fn membarrier_rseq() -> Result<(), i32> {
    membarrier_issue(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)
}

/// Parses a kernel CPU list such as `0-3,8,10-11`.
pub(crate) fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}
