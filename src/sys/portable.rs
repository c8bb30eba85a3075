//! The platform calls on every other Unix (macOS, the BSDs, illumos, Android, ...), and on Linux built with
//! `--cfg mmcid_portable`: no membarrier (groups use fences on both sides of each Dekker pair instead, design.md
//! §12.6), no affinity API, and the current CPU from the OS where it has a call for it, else a stable per-thread
//! core. Only `std` and the few libc calls declared for those systems, checked in the libc crate's sources
//! (0.2.191):
//!
//! * `sched_getcpu`: declared for FreeBSD and DragonFly (`unix/bsd/freebsdlike/{freebsd,dragonfly}/mod.rs`) and
//!   Android (`unix/linux_like/android/mod.rs`), not for macOS, NetBSD, OpenBSD or illumos;
//! * `sched_getaffinity`/`sched_setaffinity`: Linux, Android, FreeBSD and DragonFly only; FreeBSD's own API is
//!   `cpuset_getaffinity`/`cpuset_setaffinity`, NetBSD's `pthread_{get,set}affinity_np`; macOS has none (its
//!   `thread_policy_set` affinity tags are hints, not masks). This path uses none of them;
//! * `std::thread::available_parallelism` (std, every platform) for the number of cores.
//!
//! The rest of the crate needs `pthread_key_create`/`pthread_setspecific` (`unix/mod.rs`: every Unix) and
//! `pthread_atfork` (`unix/bsd/mod.rs` for macOS and the BSDs, and each other Unix's module).
//!
//! Linux built with `mmcid_portable` takes the per-thread core, not `sched_getcpu`: the forced path then runs the
//! test suite the way macOS runs it, the most common Unix without the Linux calls.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

/// The CPU the calling thread runs on now: the OS's answer where it has a current-CPU call, else (or where that
/// call fails) the thread's stable core (`thread_core`). Always below `possible_cpus()` with the fallback; an OS answer beyond it is folded
/// by the caller (`Registration::cpu_index`), as a virtual group's is.
#[inline(always)]
pub(crate) fn current_cpu() -> usize {
    try_current_cpu().unwrap_or_else(|_| thread_core())
}

/// As [`current_cpu`]; `Err(errno)` only where the OS's call fails.
#[cfg(all(any(target_os = "freebsd", target_os = "dragonfly", target_os = "android"), not(mmcid_portable)))]
#[inline]
pub(crate) fn try_current_cpu() -> Result<usize, i32> {
    // SAFETY: sched_getcpu has no preconditions; it returns -1 and sets errno on error.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).map_err(|_| std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// As [`current_cpu`]; never fails: the thread's stable core.
#[cfg(not(all(any(target_os = "freebsd", target_os = "dragonfly", target_os = "android"), not(mmcid_portable))))]
#[inline]
pub(crate) fn try_current_cpu() -> Result<usize, i32> {
    Ok(thread_core())
}

/// The calling thread's core where the OS cannot say which CPU it runs on: the `n`th thread to ask gets core
/// `n % possible_cpus()`, chosen on its first call and kept for its whole life. Stable, so a thread's per-core
/// slot and counter shard stay the same (what the kernel's CPU number gives a thread that does not migrate), and
/// compact, so the threads of a program spread evenly over the cores a group covers instead of piling onto
/// core 0. Threads are not cores: two threads with one core share its slot as two threads preempted on one CPU
/// do, which the algorithm handles (design.md §12.6).
#[inline]
pub(crate) fn thread_core() -> usize {
    thread_local! {
        // No destructor, so readable while other thread-locals are destroyed (the registration reaper).
        static CORE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    // Relaxed: a ticket; its value only spreads threads, nothing is published through it.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    CORE.try_with(|core| {
        if core.get() == usize::MAX {
            core.set(NEXT.fetch_add(1, Relaxed) % possible_cpus());
        }
        core.get()
    })
    .unwrap_or(0)
}

/// The number of cores: `available_parallelism` (the CPUs the process may use, where the OS says), read once per
/// process. Every CPU number the fallback gives is below it.
pub(crate) fn possible_cpus() -> usize {
    static POSSIBLE: OnceLock<usize> = OnceLock::new();
    *POSSIBLE.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(super::MAX_CPUS))
}

/// The cores the calling thread may use: all of them (no portable affinity API: the OS may run the thread on
/// fewer, which costs locality, never exclusivity).
pub(crate) fn affinity() -> Result<Vec<usize>, i32> {
    Ok((0..possible_cpus()).collect())
}

/// The main thread's cores: as [`affinity`].
pub(crate) fn main_thread_affinity() -> Result<Vec<usize>, i32> {
    affinity()
}

/// Pinning without an affinity API: nothing to do. A `Runtime` thread still declares its core to the group
/// (`Registration::set_cpu`), so its CID and per-core slot are its core's; only the OS's placement is not
/// enforced. Best effort rather than an error, so that programs written for Linux run unchanged, as
/// `core_affinity` does on macOS.
pub(crate) fn pin_current(cpu: usize) -> Result<(), i32> {
    if cpu >= possible_cpus() {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// No membarrier: groups fall back to fences (design.md §12.6).
pub(crate) fn membarrier_available() -> bool {
    false
}

/// No membarrier with rseq either.
pub(crate) fn membarrier_rseq_available() -> bool {
    false
}

/// Not reached: `membarrier_available()` is false.
pub(crate) fn membarrier() -> Result<(), i32> {
    Err(libc::ENOSYS)
}

/// Not reached: `membarrier_rseq_available()` is false.
pub(crate) fn membarrier_rseq() -> Result<(), i32> {
    Err(libc::ENOSYS)
}

/// For fork's prepare handler: completes the lazily made process-wide state (the core count).
pub(crate) fn finish_probes() {
    possible_cpus();
}
