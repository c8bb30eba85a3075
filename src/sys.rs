//! Platform queries: current CPU, possible CPUs, affinity, membarrier. The algorithm never names a syscall.
//!
//! Under `cfg(loom)` these are deterministic mocks (tokio's `num_cpus() -> 2` idiom): models choose each thread's
//! core explicitly with `Registration::set_cpu`.

#[cfg(not(loom))]
mod imp {
    use std::sync::OnceLock;

    /// The CPU the calling thread runs on now (glibc reads it from the rseq area: a few ns). 0 if unknown.
    #[inline]
    pub(crate) fn current_cpu() -> usize {
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on error, which we map to 0.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu < 0 {
            0
        } else {
            cpu as usize
        }
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

    #[test]
    fn current_cpu_is_possible() {
        assert!(current_cpu() < possible_cpus());
        assert!(affinity().unwrap().iter().all(|&c| c < possible_cpus()));
    }
}
