//! Platform queries: current CPU, possible CPUs, affinity, membarrier. The algorithm never names a syscall. The
//! kernel's rseq area and the restartable sequences are `rseq/`.
//!
//! One switch picks the implementation (design.md §12.6):
//!
//! * `linux.rs`: Linux (any architecture, glibc or musl): `sched_getcpu`, `sched_getaffinity`/`sched_setaffinity`
//!   as raw system calls, the possible CPUs from sysfs and the kernel, membarrier;
//! * `portable.rs`: every other Unix, and Linux built with `--cfg mmcid_portable` (how CI tests this path): the OS's
//!   current-CPU call where it has one, else a stable per-thread core, no affinity API, no membarrier (fences);
//! * under `cfg(loom)`, deterministic mocks below (tokio's `num_cpus() -> 2` idiom): models choose each thread's
//!   core explicitly with `Registration::set_cpu`.
//!
//! Other platforms (Windows) stop at the `compile_error!` in `lib.rs`.

/// The most cores (virtual or real) a group covers: one cache-padded slot each, and the core number must fit the
/// guard's packed record.
pub(crate) const MAX_CPUS: usize = 1 << 16;

#[cfg(all(not(loom), target_os = "linux", not(mmcid_portable)))]
mod linux;
#[cfg(all(not(loom), target_os = "linux", not(mmcid_portable)))]
use linux as imp;

#[cfg(all(not(loom), unix, any(not(target_os = "linux"), mmcid_portable)))]
mod portable;
#[cfg(all(not(loom), unix, any(not(target_os = "linux"), mmcid_portable)))]
use portable as imp;

/// Whether `pin_current` really pins (Linux), so that a pinned thread's current CPU can be checked against its core.
#[cfg(not(loom))]
pub(crate) const PINS: bool = cfg!(all(target_os = "linux", not(mmcid_portable)));

#[cfg(loom)]
mod imp {
    pub(crate) fn current_cpu() -> usize {
        0
    }
    pub(crate) fn possible_cpus() -> usize {
        2
    }
    pub(crate) fn affinity() -> Result<Vec<usize>, i32> {
        Ok(vec![0, 1])
    }
    pub(crate) fn main_thread_affinity() -> Result<Vec<usize>, i32> {
        affinity()
    }
    #[allow(dead_code)] // only the runtime pins, and loom builds leave it out
    pub(crate) fn pin_current(_cpu: usize) -> Result<(), i32> {
        Ok(())
    }
    pub(crate) fn membarrier_available() -> bool {
        false
    }
}

pub(crate) use imp::*;

/// Runs `issue` (one membarrier) until it succeeds, fails with an error that is not transient, or failed
/// `BARRIER_TRIES` times; between tries it sleeps 100, 200, 400 µs, time for the kernel to reclaim memory
/// (design.md §12). Transient: ENOMEM (the kernel's CPU mask allocation), EAGAIN and EINTR (which membarrier
/// does not return today). The caller holds the lifecycle lock or the claim lock meanwhile, which nobody
/// waits for on enter or exit.
#[cfg(not(loom))]
pub(crate) fn membarrier_retrying(mut issue: impl FnMut() -> Result<(), i32>) -> Result<(), i32> {
    let mut tries = 0;
    loop {
        match issue() {
            Ok(()) => return Ok(()),
            Err(e) => {
                tries += 1;
                if !matches!(e, libc::ENOMEM | libc::EAGAIN | libc::EINTR) || tries == BARRIER_TRIES {
                    return Err(e);
                }
                std::thread::sleep(std::time::Duration::from_micros(50 << tries));
            }
        }
    }
}

/// How many times a membarrier that keeps failing with a transient error is issued in all.
#[cfg(not(loom))]
pub(crate) const BARRIER_TRIES: u32 = 4;

/// Test-only failure injection for a group's membarrier calls (design.md §12): the next calls fail with a chosen
/// errno before they reach the kernel, as a kernel short of memory or a seccomp filter would make them fail. Per
/// group, so tests running at once in one process do not see each other's failures.
#[cfg(all(test, not(loom)))]
#[derive(Debug, Default)]
pub(crate) struct FailBarriers {
    errno: std::sync::atomic::AtomicI32,
    /// Calls left to fail (`u32::MAX`: every call from now on).
    left: std::sync::atomic::AtomicU32,
    /// Calls failed so far.
    pub(crate) failed: std::sync::atomic::AtomicU32,
}

#[cfg(all(test, not(loom)))]
impl FailBarriers {
    /// The next `calls` membarrier calls (`u32::MAX`: all of them) fail with `errno`.
    pub(crate) fn set(&self, errno: i32, calls: u32) {
        use std::sync::atomic::Ordering::SeqCst;
        self.errno.store(errno, SeqCst);
        self.left.store(calls, SeqCst);
    }

    /// Whether this call fails, and with which errno.
    pub(crate) fn next(&self) -> Option<i32> {
        use std::sync::atomic::Ordering::SeqCst;
        let take = |left: u32| match left {
            0 => None,
            u32::MAX => Some(u32::MAX),
            n => Some(n - 1),
        };
        self.left.fetch_update(SeqCst, SeqCst, take).ok()?;
        self.failed.fetch_add(1, SeqCst);
        Some(self.errno.load(SeqCst))
    }
}
