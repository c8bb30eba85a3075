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
        use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU32, AtomicU64, Ordering::Relaxed};
        use std::sync::Once;

        /// Byte offset of `cpu_id` in `struct rseq` (after `u32 cpu_id_start`).
        const CPU_ID: isize = 4;
        /// `CPU_ID_AT` before the probe, or when this libc has no rseq area.
        const NONE: isize = isize::MIN;
        /// Offset of the calling thread's `cpu_id` from its thread pointer, the same for every thread.
        /// Relaxed everywhere: written once by `probe` with a value derived from constants glibc set before
        /// `main`, and a reader that still sees NONE just takes the `sched_getcpu` path.
        static CPU_ID_AT: AtomicIsize = AtomicIsize::new(NONE);
        /// Byte offset of `u64 rseq_cs` in `struct rseq`.
        const RSEQ_CS: isize = 8;
        /// Whether `__rseq_size` covers `rseq_cs` too, which the critical sections write (Relaxed: as `CPU_ID_AT`,
        /// and stored before it).
        static RSEQ_CS_COVERED: AtomicBool = AtomicBool::new(false);

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

        /// Whether `store_if` exists on this target (x86_64 only so far), the area was found, and its registered
        /// size covers `rseq_cs`.
        pub(crate) fn critical_sections() -> bool {
            cfg!(target_arch = "x86_64") && CPU_ID_AT.load(Relaxed) != NONE && RSEQ_CS_COVERED.load(Relaxed)
        }

        /// `__rseq_offset`: where every thread's `struct rseq` lies from its thread pointer. Meaningful only once
        /// `critical_sections()` holds; groups keep it next to their mode word, so that their hot paths find the
        /// area without loading this crate's statics.
        pub(crate) fn area() -> isize {
            CPU_ID_AT.load(Relaxed).wrapping_sub(CPU_ID)
        }

        /// `__rseq_offset` once `probe` found glibc's registered area, else `None`: for code that reads other
        /// fields of the area (the examples' kernel `mm_cid` peers, through `__private::rseq_offset`).
        pub(crate) fn offset() -> Option<isize> {
            let at = CPU_ID_AT.load(Relaxed);
            (at != NONE).then(|| at - CPU_ID)
        }

        /// `cpu_id()` for a group built where `critical_sections()` held, with `area` from `area()`: one load.
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        pub(crate) fn cpu_id_in(area: isize) -> Option<usize> {
            let cpu: u32;
            // SAFETY: as in `cpu_id`: `area` is `__rseq_offset`, so fs:[area + 4] is the calling thread's `cpu_id`
            // inside its TCB (alive as long as the thread). A plain load: the kernel writes the field only while
            // the thread is not running user code, and the asm is volatile (never merged with another load).
            unsafe {
                std::arch::asm!(
                    "mov {cpu:e}, dword ptr fs:[{area} + 4]",
                    area = in(reg) area,
                    cpu = lateout(reg) cpu,
                    options(nostack, readonly, preserves_flags),
                )
            };
            // Negative: this thread's area is not registered (see the module docs).
            usize::try_from(cpu as i32).ok()
        }

        /// Not reached: `critical_sections()` is false on this target.
        #[cfg(not(target_arch = "x86_64"))]
        #[inline(always)]
        pub(crate) fn cpu_id_in(_area: isize) -> Option<usize> {
            cpu_id()
        }

        /// One restartable sequence on the calling thread's rseq area (design.md §4.1.1): the check
        /// instructions (each jumping to `7f` on a mismatch), then the commit instructions ending with the one
        /// store that commits; yields true if the commit ran, false on a mismatch or if the kernel aborted the
        /// sequence (the thread was preempted, migrated or signalled before the commit). `$area` is
        /// `__rseq_offset`; the operands the instructions name follow (`tmp` is a free scratch register).
        ///
        /// The `on_cpu` form checks that the thread runs on `$cpu`, `*$mode & ONCPU != 0` and
        /// `*$slot == $expect`.
        #[cfg(target_arch = "x86_64")]
        macro_rules! sequence {
            (
                on_cpu $area:expr, $cpu:expr, $mode:expr, $slot:expr, $expect:expr,
                [$($commit:literal),+], $($operands:tt)*
            ) => {
                sequence!(
                    $area,
                    [
                        "cmp dword ptr fs:[{area} + 4], {cpu:e}",
                        "jne 7f",
                        "test dword ptr [{mode}], {oncpu}",
                        "jz 7f",
                        "cmp dword ptr [{slot}], {expect:e}",
                        "jne 7f"
                    ],
                    [$($commit),+],
                    cpu = in(reg) $cpu,
                    mode = in(reg) $mode,
                    slot = in(reg) $slot,
                    expect = in(reg) $expect,
                    oncpu = const crate::state::ONCPU,
                    $($operands)*
                )
            };
            (
                $area:expr, [$($check:literal),+], [$($commit:literal),+], $($operands:tt)*
            ) => {{
                let ok: u32;
                std::arch::asm!(
                    ".pushsection __rseq_cs, \"aw\"",
                    ".balign 32",
                    "3:",
                    ".long 0, 0",
                    ".quad 4f, (5f - 4f), 6f",
                    ".popsection",
                    "lea {tmp}, [rip + 3b]",
                    "mov qword ptr fs:[{area} + 8], {tmp}",
                    "4:",
                    $($check,)+
                    $($commit,)+
                    "5:",
                    "mov {ok:e}, 1",
                    "jmp 8f",
                    ".pushsection __rseq_failure, \"ax\"",
                    ".byte 0x0f, 0xb9, 0x3d",
                    ".long 0x53053053",
                    "6:",
                    "jmp 7f",
                    ".popsection",
                    "7:",
                    "xor {ok:e}, {ok:e}",
                    "8:",
                    // Disarm: the kernel would clear it lazily, but not before reading the descriptor, which must
                    // not outlive this code (a dlopen'ed library that is unloaded).
                    "mov qword ptr fs:[{area} + 8], 0",
                    area = in(reg) $area,
                    tmp = out(reg) _, // not lateout: written before the inputs are done with
                    ok = out(reg) ok, // not lateout: `area` is still read after `ok` is written
                    $($operands)*
                    options(nostack),
                );
                ok != 0
            }};
        }

        /// `*slot = new` if and only if, in one restartable sequence (design.md §4.1.1), the calling thread runs
        /// on `cpu`, `*mode & ONCPU != 0` and `*slot == expect`. The kernel aborts the sequence (we return false)
        /// if the thread is preempted, migrated or signalled before the commit store, so no other thread of the
        /// same CPU can slip a write in between the compare and the store. Only called when
        /// `critical_sections()` held when the group was built; a thread whose own area is not registered reads
        /// -1 or -2 as its CPU and always gets false.
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        pub(crate) fn store_if(
            area: isize,
            cpu: u32,
            mode: &AtomicU32,
            slot: &AtomicU32,
            expect: u32,
            new: u32,
        ) -> bool {
            // SAFETY: `area` is `__rseq_offset` (the group took it from `area()` when `critical_sections()` held at
            // its build, and the offset never changes), so fs:[area] is this thread's `struct rseq`, inside its TCB: u32 cpu_id at +4, which the
            // kernel writes and we only read, and u64 rseq_cs at +8, which the rseq ABI has user space write (the
            // kernel reads it, and may clear it), covered by `__rseq_size` (`probe`). A thread whose area is not
            // registered still owns that TCB memory, and its cpu_id (-1 or -2) fails the compare. The descriptor is a
            // 32-byte aligned `struct rseq_cs` {version 0, flags 0, start_ip 4f, post_commit_offset 5f - 4f,
            // abort_ip 6f} in section __rseq_cs; the abort handler is preceded by glibc's x86 signature
            // 0x53053053 (the kernel kills the thread on a mismatch) and lies outside [4f, 5f). `mode` and `slot`
            // are live atomics of the caller's group; the commit is a plain aligned 4-byte store, which is
            // atomic on x86, and the only store between 4 and 5, as the ABI requires. Both exits disarm rseq_cs
            // again. No stack is used. Ordering: the asm may read and write memory (no `nomem`/`readonly`), so the
            // compiler moves no access across it, and on x86 (TSO) its loads act as Acquire and its store as
            // Release, which is what a borrow needs (design.md §4.1.1, table §7).
            unsafe {
                sequence!(on_cpu area, cpu, mode.as_ptr(), slot.as_ptr(), expect, ["mov dword ptr [{slot}], {new:e}"],
                    new = in(reg) new,)
            }
        }

        /// `*cell += n` (wrapping) if and only if, in one restartable sequence, the calling thread runs on `cpu`,
        /// `*mode & ONCPU != 0` and `*slot == expect`: `ShardedCounter`'s whole per-CPU update as one borrow,
        /// update and release that no other thread of the CPU can interleave (design.md §9.2).
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        pub(crate) fn add_if(
            area: isize,
            cpu: u32,
            mode: &AtomicU32,
            slot: &AtomicU32,
            expect: u32,
            cell: &AtomicU64,
            n: u64,
        ) -> bool {
            // SAFETY: as in `store_if`; `cell` is a live aligned 8-byte atomic, loaded and then stored with plain
            // x86 moves (each atomic), and that store is the only one between 4 and 5 and the commit.
            unsafe {
                sequence!(on_cpu area, cpu, mode.as_ptr(), slot.as_ptr(), expect,
                    ["mov {tmp}, qword ptr [{cell}]", "add {tmp}, {n}", "mov qword ptr [{cell}], {tmp}"],
                    cell = in(reg) cell.as_ptr(), n = in(reg) n,)
            }
        }

        /// `*cell += n` (wrapping) if and only if, in one restartable sequence, `*mode == PER_TASK` and
        /// `*word == expect`: `ShardedCounter`'s per-task update (design.md §9.3), on the CID `expect` that the
        /// calling thread's registration owns in its `word`. No CPU check: the kernel aborts the sequence on any
        /// preemption, migration or signal before the commit, wherever the thread runs.
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        pub(crate) fn add_if_owned(
            area: isize,
            mode: &AtomicU32,
            word: &AtomicU32,
            expect: u32,
            cell: &AtomicU64,
            n: u64,
        ) -> bool {
            // SAFETY: as in `store_if` (the area, the descriptor, the abort signature, no stack); `mode` and `word`
            // are live atomics of the caller's group and registration, only loaded; `cell` is a live aligned 8-byte
            // atomic, loaded and then stored with plain x86 moves (each atomic), and that store is the only one
            // between 4 and 5 and commits the sequence. Both exits disarm `rseq_cs`.
            unsafe {
                sequence!(
                    area,
                    ["cmp dword ptr [{mode}], {per_task}", "jne 7f", "cmp dword ptr [{word}], {expect:e}", "jne 7f"],
                    ["mov {tmp}, qword ptr [{cell}]", "add {tmp}, {n}", "mov qword ptr [{cell}], {tmp}"],
                    mode = in(reg) mode.as_ptr(),
                    per_task = const crate::state::PER_TASK,
                    word = in(reg) word.as_ptr(),
                    expect = in(reg) expect,
                    cell = in(reg) cell.as_ptr(),
                    n = in(reg) n,
                )
            }
        }

        /// Not reached: `critical_sections()` is false on this target.
        #[cfg(not(target_arch = "x86_64"))]
        #[inline(always)]
        pub(crate) fn add_if_owned(_: isize, _: &AtomicU32, _: &AtomicU32, _: u32, _: &AtomicU64, _: u64) -> bool {
            false
        }

        /// Not reached: `critical_sections()` is false on this target.
        #[cfg(not(target_arch = "x86_64"))]
        #[inline(always)]
        pub(crate) fn store_if(_: isize, _: u32, _: &AtomicU32, _: &AtomicU32, _: u32, _: u32) -> bool {
            false
        }

        /// Not reached: `critical_sections()` is false on this target.
        #[cfg(not(target_arch = "x86_64"))]
        #[inline(always)]
        pub(crate) fn add_if(_: isize, _: u32, _: &AtomicU32, _: &AtomicU32, _: u32, _: &AtomicU64, _: u64) -> bool {
            false
        }

        /// The thread pointer (TLS base) of the calling thread.
        #[inline(always)]
        fn thread_pointer() -> *const u8 {
            let tp: *const u8;
            #[cfg(target_arch = "x86_64")]
            // SAFETY: reading the thread pointer has no side effects; fs:0 holds the TCB's self pointer, which is
            // the thread pointer.
            unsafe {
                std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
            };
            #[cfg(target_arch = "aarch64")]
            // SAFETY: reading the thread pointer has no side effects; tpidr_el0 is the thread pointer.
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
                RSEQ_CS_COVERED.store(size as isize >= RSEQ_CS + 8, Relaxed);
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
        pub(crate) fn offset() -> Option<isize> {
            None
        }
        pub(crate) fn critical_sections() -> bool {
            false
        }
        pub(crate) fn area() -> isize {
            0
        }
        #[inline(always)]
        pub(crate) fn cpu_id_in(_area: isize) -> Option<usize> {
            None
        }
        #[inline(always)]
        pub(crate) fn store_if(
            _area: isize,
            _cpu: u32,
            _mode: &std::sync::atomic::AtomicU32,
            _slot: &std::sync::atomic::AtomicU32,
            _expect: u32,
            _new: u32,
        ) -> bool {
            false
        }
        #[inline(always)]
        pub(crate) fn add_if_owned(
            _: isize,
            _: &std::sync::atomic::AtomicU32,
            _: &std::sync::atomic::AtomicU32,
            _: u32,
            _: &std::sync::atomic::AtomicU64,
            _: u64,
        ) -> bool {
            false
        }
        #[inline(always)]
        pub(crate) fn add_if(
            _: isize,
            _: u32,
            _: &std::sync::atomic::AtomicU32,
            _: &std::sync::atomic::AtomicU32,
            _: u32,
            _: &std::sync::atomic::AtomicU64,
            _: u64,
        ) -> bool {
            false
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
    pub(crate) fn possible_from(
        sysfs: Option<&str>,
        kernel: Option<usize>,
        allowed: Option<usize>,
        conf: usize,
    ) -> usize {
        let listed =
            sysfs.and_then(|s| parse_cpu_list(s.trim())).and_then(|cpus| cpus.into_iter().max()).map(|m| m + 1);
        let floor = allowed.unwrap_or(1).max(1);
        let cores = match (listed, kernel) {
            (Some(n), Some(k)) if n <= k && n + 64 > k && n >= floor => n,
            (_, Some(k)) => k.max(floor),
            (Some(n), None) => n.max(floor),
            (None, None) => conf.max(floor),
        };
        cores.min(crate::group::MAX_CPUS)
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
        let most = crate::group::MAX_CPUS / 64;
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
                Err(libc::EINVAL) if words < crate::group::MAX_CPUS / 64 => words *= 2,
                Err(e) => return Err(e),
            }
        }
    }

    /// Pins the calling thread to one CPU (EINVAL for a CPU the kernel does not have).
    pub(crate) fn pin_current(cpu: usize) -> Result<(), i32> {
        if cpu >= crate::group::MAX_CPUS {
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

    /// Runs `issue` (one membarrier) until it succeeds, fails with an error that is not transient, or failed
    /// `BARRIER_TRIES` times; between tries it sleeps 100, 200, 400 µs, time for the kernel to reclaim memory
    /// (design.md §12). Transient: ENOMEM (the kernel's CPU mask allocation), EAGAIN and EINTR (which membarrier
    /// does not return today). The caller holds the lifecycle lock or the claim lock meanwhile, which nobody
    /// waits for on enter or exit.
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
    pub(crate) const BARRIER_TRIES: u32 = 4;

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
        rseq::probe();
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
    pub(crate) mod rseq {
        pub(crate) fn probe() {}
        pub(crate) fn offset() -> Option<isize> {
            None
        }
        pub(crate) fn area() -> isize {
            0
        }
        pub(crate) fn cpu_id_in(_area: isize) -> Option<usize> {
            None
        }
    }
}

pub(crate) use imp::*;

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

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    use super::*;

    /// `possible_cpus` covers every CPU number the kernel can report wherever sysfs is missing or not the
    /// kernel's (design.md §12.3). The sysfs list with `sysconf`'s count as the fallback would give 8 for the third
    /// row, a machine whose CPUs 8-11 exist (sysfs not mounted, glibc counting the online CPUs), and 2 for the
    /// fourth and fifth, folding CPUs onto slots where restartable sequences never commit (checked by hand).
    #[test]
    fn possible_cpus_cover_every_cpu_the_kernel_can_report() {
        let max = crate::group::MAX_CPUS;
        for (sysfs, kernel, allowed, conf, want) in [
            (Some("0-1\n"), Some(64), Some(2), 2, 2),      // the kernel's file: exact
            (Some("0-3,8-11"), Some(64), Some(12), 8, 12), // gaps: the highest CPU counts, not how many
            (None, Some(64), Some(12), 8, 64),             // no sysfs: the kernel's bound, not the count
            (Some("0-1"), Some(128), Some(2), 2, 128),     // a container's file from another machine
            (Some("0-1"), Some(64), Some(6), 2, 64),       // a file that misses our own CPUs
            (Some("0-255"), Some(256), Some(4), 8, 256),   // exact, a multiple of 64
            (Some("0-7"), None, Some(3), 4, 8),            // no kernel bound (filtered): sysfs
            (None, None, Some(6), 4, 6),                   // nothing: the count, but never below our CPUs
            (None, None, None, 0, 1),                      // nothing at all
            (Some("x"), Some(64), Some(2), 2, 64),         // an unreadable list
            (None, Some(1 << 20), Some(2), 2, max),        // capped at MAX_CPUS
        ] {
            assert_eq!(possible_from(sysfs, kernel, allowed, conf), want, "{sysfs:?} {kernel:?} {allowed:?} {conf}");
        }
    }

    /// The kernel's bound as this machine reports it: a multiple of 64 that the sysfs list (where there is one)
    /// rounds up to, covering every CPU this thread may run on, and exactly the shortest mask the kernel accepts.
    #[test]
    fn the_kernel_cpu_bound_is_nr_cpu_ids_rounded_up() {
        let (bound, allowed) = kernel_cpu_bound().expect("sched_getaffinity answers");
        assert_eq!(bound % 64, 0);
        assert!(allowed >= 1 && allowed <= bound, "{allowed} {bound}");
        assert_eq!(allowed, affinity().unwrap().last().unwrap() + 1);
        if bound > 64 {
            assert_eq!(affinity_words(0, bound / 64 - 1), Err(libc::EINVAL), "a shorter mask is refused");
        }
        if let Some(n) = std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|s| parse_cpu_list(s.trim()))
            .and_then(|c| c.into_iter().max())
        {
            assert!(n < bound && n + 1 + 64 > bound, "sysfs says {} CPUs, the kernel {bound}", n + 1);
            assert_eq!(possible_cpus(), n + 1, "this machine's sysfs list is the kernel's: exact");
        }
    }

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
    pub(crate) fn per_cpu_exclusion<R: FnOnce()>(
        rounds: u64,
        try_hold: impl Fn(usize) -> Option<R> + Sync,
    ) -> (u64, u64) {
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
                            mine +=
                                rseq::add_if(rseq::area(), cpu as u32, &mode, &slots[cpu], idle, &cells[cpu], 1) as u64;
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
        eprintln!(
            "rseq_add_if_excludes_threads_of_one_cpu: {commits} of {} sequences committed",
            threads as u64 * rounds
        );
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

    #[test]
    fn current_cpu_is_possible() {
        assert!(current_cpu() < possible_cpus());
        assert!(affinity().unwrap().iter().all(|&c| c < possible_cpus()));
    }
}
