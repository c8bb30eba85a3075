//! Platform queries: current CPU, possible CPUs, affinity, membarrier. The algorithm never names a syscall.
//!
//! Under `cfg(loom)` these are deterministic mocks (tokio's `num_cpus() -> 2` idiom): models choose each thread's
//! core explicitly with `Registration::set_cpu`.

#[cfg(not(loom))]
mod imp {
    use std::sync::OnceLock;

    /// The CPU the calling thread runs on now; 0 if unknown. Reads the kernel's rseq `cpu_id` straight from the
    /// area glibc registered (a load at a fixed offset from the thread pointer), else asks `sched_getcpu`.
    #[inline(always)]
    pub(crate) fn current_cpu() -> usize {
        match rseq::cpu_id() {
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

    /// The kernel's rseq area as glibc (≥ 2.35) registers it for every thread: `struct rseq` lies at the thread
    /// pointer plus `__rseq_offset`, and its `u32 cpu_id` (byte 4) is rewritten by the kernel before the thread
    /// returns to user space on a new CPU. It reads -1 (not registered) or -2 (registration failed: no kernel
    /// support, `glibc.pthread.rseq=0`, valgrind) where it cannot be used.
    #[cfg(all(target_os = "linux", target_env = "gnu", any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub(crate) mod rseq {
        use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
        use std::sync::Once;

        /// Byte offset of `cpu_id` in `struct rseq` (after `u32 cpu_id_start`).
        const CPU_ID: isize = 4;
        /// `CPU_ID_AT` before the probe, or when this libc has no rseq area.
        const NONE: isize = isize::MIN;
        /// Offset of the calling thread's `cpu_id` from its thread pointer, the same for every thread.
        /// Relaxed everywhere: written once by `probe` with a value derived from constants glibc set before
        /// `main`, and a reader that still sees NONE just takes the `sched_getcpu` path.
        static CPU_ID_AT: AtomicIsize = AtomicIsize::new(NONE);

        /// The calling thread's CPU from its rseq area; `None` until `probe` found the area, or where the thread
        /// has no registered area.
        #[inline(always)]
        pub(crate) fn cpu_id() -> Option<usize> {
            let at = CPU_ID_AT.load(Relaxed);
            if at == NONE {
                return None;
            }
            // SAFETY: `probe` stored `at` only after finding `__rseq_offset` exported and `__rseq_size` covering
            // `cpu_id`: glibc then places every thread's `struct rseq` at thread pointer + `__rseq_offset`, inside
            // the thread's TCB, which lives as long as the thread. Volatile: the kernel writes it.
            let cpu = unsafe { std::ptr::read_volatile(thread_pointer().wrapping_offset(at) as *const u32) };
            // Negative: this thread's area is not registered (see the module docs).
            usize::try_from(cpu as i32).ok()
        }

        /// The thread pointer (TLS base) of the calling thread.
        #[inline(always)]
        fn thread_pointer() -> *const u8 {
            let tp: *const u8;
            // SAFETY: reading the thread pointer has no side effects. x86_64: fs:0 holds the TCB's self pointer,
            // which is the thread pointer; aarch64: tpidr_el0 is the thread pointer.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
            };
            #[cfg(target_arch = "aarch64")]
            unsafe {
                std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags))
            };
            tp
        }

        /// Finds glibc's rseq area once. Looked up with `dlsym` rather than linked, so the crate still links
        /// against glibc < 2.35 (which lacks the symbols) and static builds, and falls back to `sched_getcpu`.
        /// Called when a group or a policy is built (ordinary code, never a signal handler), not on the hot path.
        pub(crate) fn probe() {
            static PROBE: Once = Once::new();
            PROBE.call_once(|| {
                // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no other preconditions.
                let (off, size) = unsafe {
                    (
                        libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                        libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
                    )
                };
                if off.is_null() || size.is_null() {
                    return;
                }
                // SAFETY: glibc defines `__rseq_offset` as `const ptrdiff_t` and `__rseq_size` as `const unsigned
                // int`, both set before `main` and never written again.
                let (off, size) = unsafe { (*(off as *const isize), *(size as *const u32)) };
                if size as isize >= CPU_ID + 4 {
                    if let Some(at) = off.checked_add(CPU_ID).filter(|&at| at != NONE) {
                        CPU_ID_AT.store(at, Relaxed);
                    }
                }
            });
        }
    }

    /// No rseq area to read on this platform: `current_cpu` always asks `sched_getcpu`.
    #[cfg(not(all(target_os = "linux", target_env = "gnu", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    pub(crate) mod rseq {
        #[inline(always)]
        pub(crate) fn cpu_id() -> Option<usize> {
            None
        }
        pub(crate) fn probe() {}
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

    /// Number of possible CPUs (the kernel's `num_possible_cpus()`, our `cores`).
    pub(crate) fn possible_cpus() -> usize {
        static POSSIBLE: OnceLock<usize> = OnceLock::new();
        *POSSIBLE.get_or_init(|| {
            let from_sys = std::fs::read_to_string("/sys/devices/system/cpu/possible")
                .ok()
                .and_then(|s| parse_cpu_list(s.trim()))
                .and_then(|cpus| cpus.into_iter().max())
                .map(|max| max + 1);
            // SAFETY: sysconf has no preconditions.
            let conf = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
            from_sys.unwrap_or(if conf > 0 { conf as usize } else { 1 }).max(1)
        })
    }

    /// The calling thread's affinity mask as a list of CPUs.
    pub(crate) fn affinity() -> Result<Vec<usize>, i32> {
        // SAFETY: cpu_set_t is plain old data; all-zero is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the pointer and size describe `set`, which lives across the call.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return Err(errno());
        }
        let max = (std::mem::size_of::<libc::cpu_set_t>() * 8).min(possible_cpus().max(1024));
        // SAFETY: CPU_ISSET only reads `set`; every index is below the set's bit size.
        Ok((0..max).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
    }

    /// Pins the calling thread to one CPU.
    pub(crate) fn pin_current(cpu: usize) -> Result<(), i32> {
        if cpu >= std::mem::size_of::<libc::cpu_set_t>() * 8 {
            return Err(libc::EINVAL);
        }
        // SAFETY: cpu_set_t is plain old data; all-zero is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below the set's bit size (checked above).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: the pointer and size describe `set`.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
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

    /// Whether `membarrier(PRIVATE_EXPEDITED)` is usable in this process; registers it on first call.
    pub(crate) fn membarrier_available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            // SAFETY: membarrier with QUERY takes no pointers.
            let cmds = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
            if cmds < 0 || cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED == 0 {
                return false;
            }
            // SAFETY: registration takes no pointers; it only marks the process.
            let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) };
            rc == 0
        })
    }

    /// A full memory barrier on every CPU running a thread of this process. Only called after
    /// `membarrier_available()` returned true.
    pub(crate) fn membarrier() {
        // SAFETY: PRIVATE_EXPEDITED takes no pointers; the process is registered (membarrier_available).
        let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
        if rc != 0 {
            // Cannot happen after a successful registration; a full fence keeps us safe only on our side, so
            // refuse to continue rather than break exclusivity.
            std::process::abort();
        }
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
}

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
    #[allow(dead_code)] // only the runtime pins, and loom builds leave it out
    #[allow(dead_code)]
    pub(crate) fn pin_current(_cpu: usize) -> Result<(), i32> {
        Ok(())
    }
    pub(crate) fn membarrier_available() -> bool {
        false
    }
    pub(crate) fn membarrier() {}
    pub(crate) mod rseq {
        pub(crate) fn probe() {}
    }
}

pub(crate) use imp::*;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn cpu_list_parsing() {
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

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

    #[test]
    fn current_cpu_is_possible() {
        assert!(current_cpu() < possible_cpus());
        assert!(affinity().unwrap().iter().all(|&c| c < possible_cpus()));
    }
}
