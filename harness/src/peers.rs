//! The peers' building blocks for the benchmark examples: cache-padded arrays indexed by `sched_getcpu` or by the
//! kernel's rseq `mm_cid` (read through glibc's `__rseq_offset`), and a restartable-sequence increment indexed by
//! `mm_cid`, the way the kernel's rseq selftests and the rseq library count per CPU. Used by `examples/use_case.rs`
//! and the benches (`bench.rs`).

// The kernel-mm_cid peer (`Rseq`) is x86_64 code; elsewhere its probe fails and the rest is not reached.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_variables))]

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Number of possible CPUs, one more than the highest CPU number `getcpu` can return: mmcid's own bound
/// ([`mmcid::CpuSet::possible_cpus`]), so the peers' per-CPU arrays are sized exactly as mmcid's groups are.
pub fn possible_cpus() -> usize {
    mmcid::CpuSet::possible_cpus()
}

/// The CPU the calling thread runs on (glibc reads it from the rseq area); 0 if the call fails. Where libc
/// declares no `sched_getcpu` (macOS, NetBSD, OpenBSD, illumos), the library's own answer there.
#[inline(always)]
pub fn getcpu() -> usize {
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd", target_os = "dragonfly"))]
    {
        // SAFETY: sched_getcpu has no preconditions; -1 (error) maps to 0.
        let cpu = unsafe { libc::sched_getcpu() };
        cpu.max(0) as usize
    }
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd", target_os = "dragonfly")))]
    mmcid::__private::current_cpu()
}

/// One cache-padded `AtomicU64` per index.
pub struct Padded(Box<[CachePadded<AtomicU64>]>);

#[allow(clippy::len_without_is_empty)] // a fixed set of cells, sized once for the machine's CPUs or CIDs
impl Padded {
    pub fn new(n: usize) -> Padded {
        Padded((0..n).map(|_| CachePadded::new(AtomicU64::new(0))).collect())
    }

    #[inline(always)]
    pub fn at(&self, i: usize) -> &AtomicU64 {
        &self.0[i]
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Indexes whose value is not zero (the slots the run used).
    pub fn touched(&self) -> usize {
        self.0.iter().filter(|c| c.load(Relaxed) != 0).count()
    }

    pub fn sum(&self) -> u64 {
        self.0.iter().map(|c| c.load(Relaxed)).fold(0, u64::wrapping_add)
    }

    /// The first cell's address: the restartable-sequence increment indexes from it.
    fn base(&self) -> *const CachePadded<AtomicU64> {
        self.0.as_ptr()
    }
}

/// The kernel's rseq area as glibc (≥ 2.35) registered it for every thread, with the kernel's `mm_cid` (Linux 6.3+):
/// `struct rseq` lies at the thread pointer plus `__rseq_offset`; `cpu_id` is the `u32` at byte 4, `rseq_cs` the
/// `u64` at byte 8 and `mm_cid` the `u32` at byte 24. The kernel refuses registrations shorter than 32 bytes, so a
/// registered area covers all three; glibc up to 2.39 reports `__rseq_size = 20`, the part glibc itself uses.
#[derive(Clone, Copy)]
pub struct Rseq {
    offset: isize,
}

/// Byte offset of `mm_cid` in `struct rseq`.
const MM_CID: isize = 24;
/// `getauxval` key for the kernel's rseq feature size.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
const AT_RSEQ_FEATURE_SIZE: libc::c_ulong = 27;

impl Rseq {
    /// Whether `mm_cid` is readable and restartable sequences can be armed on this thread's area; `Err` says why
    /// not (the benchmarks print it and skip the peer).
    pub fn probe() -> Result<Rseq, String> {
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
        {
            Err("only implemented for x86_64 Linux with glibc".into())
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        {
            // The library's own probe of glibc's area (the one `dlsym` lookup of `__rseq_offset` in the workspace).
            let Some(offset) = mmcid::__private::rseq_offset() else {
                return Err("no rseq area registered by glibc (glibc >= 2.35 with rseq enabled needed)".into());
            };
            // SAFETY: getauxval has no preconditions; 0 means unknown.
            let kernel = unsafe { libc::getauxval(AT_RSEQ_FEATURE_SIZE) };
            if (kernel as isize) < MM_CID + 4 {
                return Err(format!("the kernel's rseq has no mm_cid (feature size {kernel} < 28; Linux 6.3+)"));
            }
            let rseq = Rseq { offset };
            if rseq.mm_cid() >= possible_cpus() {
                return Err(format!("mm_cid reads {}, not a CID", rseq.mm_cid()));
            }
            Ok(rseq)
        }
    }

    /// The calling thread's `mm_cid` (rewritten by the kernel before the thread returns to user space).
    #[inline(always)]
    pub fn mm_cid(self) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let tp: *const u8;
            // SAFETY: on x86_64 Linux fs:0 holds the TCB's self pointer, the thread pointer; reading it has no side
            // effects.
            unsafe { std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags)) };
            // SAFETY: `probe` checked that glibc registered an area with mm_cid for every thread, at tp +
            // __rseq_offset, alive as long as the thread. Volatile: the kernel rewrites it.
            unsafe { std::ptr::read_volatile(tp.offset(self.offset + MM_CID) as *const u32) as usize }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("Rseq::probe fails on this architecture")
        }
    }

    /// `cells[mm_cid] += n` with no atomic instruction: one restartable sequence that the kernel aborts if the thread
    /// is preempted, migrated or signalled before its committing store, retried until it commits. The rseq library's
    /// `rseq_load_add_store__ptr` with `RSEQ_PERCPU_MM_CID`, as its per-CPU counter test (`param_test -T i`) runs
    /// it: the CID is read before the sequence and compared again inside, and `rseq_cs` is left armed (the kernel
    /// clears it lazily).
    ///
    /// The sequence is this peer's own copy, not the library's (`src/rseq/`): the peer stands for the kernel's
    /// `mm_cid` with the rseq library's code, independent of mmcid, so that the comparison measures the two designs.
    #[inline(always)]
    pub fn add(self, cells: &Padded, n: u64) {
        #[cfg(target_arch = "x86_64")]
        loop {
            let cid = self.mm_cid();
            assert!(cid < cells.len(), "mm_cid {cid} beyond the {} cells", cells.len());
            // In bounds: checked above.
            let cell = cells.base().wrapping_add(cid) as *mut u64;
            let ok: u32;
            // SAFETY: `self.offset` is `__rseq_offset` (`probe`), so fs:[offset] is this thread's `struct rseq`
            // inside its TCB: `rseq_cs` at +8, which the rseq ABI has user space write, and `mm_cid` at +24, which we
            // only read. The descriptor is a 32-byte aligned `struct rseq_cs` {version 0, flags 0, start 4f,
            // post-commit offset 5f - 4f, abort 6f} in section __rseq_cs; the abort handler is preceded by glibc's
            // x86 signature 0x53053053 and lies outside [4f, 5f). `cell` is a live, aligned `AtomicU64` of `cells`
            // (index checked above), loaded and stored with plain moves (atomic on x86); the store is the only one
            // between 4 and 5 and commits the sequence. No stack is used.
            unsafe {
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
                    "cmp dword ptr fs:[{area} + 24], {cid:e}",
                    "jne 7f",
                    "mov {tmp}, qword ptr [{cell}]",
                    "add {tmp}, {n}",
                    "mov qword ptr [{cell}], {tmp}",
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
                    area = in(reg) self.offset,
                    cid = in(reg) cid,
                    cell = in(reg) cell,
                    n = in(reg) n,
                    tmp = out(reg) _,
                    ok = out(reg) ok,
                    options(nostack),
                );
            }
            if ok != 0 {
                return;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("Rseq::probe fails on this architecture")
    }
}

/// The calling thread's CPU time, in ns. `#[inline]`: callers in other crates may inline it, as they could when the
/// examples and benches included this file.
#[inline]
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
