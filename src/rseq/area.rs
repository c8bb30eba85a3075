//! The kernel's rseq area as glibc (≥ 2.35) registers it for every thread: `struct rseq` lies at the thread
//! pointer plus `__rseq_offset`, and its `u32 cpu_id` (byte 4) is rewritten by the kernel before the thread
//! returns to user space on a new CPU. It reads -1 (not registered) or -2 (registration failed: no kernel
//! support, `glibc.pthread.rseq=0`, valgrind) where it cannot be used.
//!
//! Linux with glibc, x86_64 and aarch64; the sequences themselves are `x86_64.rs`.

use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};
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

/// Not reached: `critical_sections()` is false on this target.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn cpu_id_in(_area: isize) -> Option<usize> {
    cpu_id()
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
