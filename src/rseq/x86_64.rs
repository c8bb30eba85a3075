//! The restartable sequences on x86_64 (design.md §4.1.1, §9.2, §9.3): the inline asm of each critical section,
//! its `struct rseq_cs` descriptor and abort handler, and the one-load `cpu_id_in`. Each sequence encodes the
//! protocol's words it compares: the mode word's `ONCPU` and `PER_TASK` (`state::mode`) and the slot word.

use std::sync::atomic::{AtomicU32, AtomicU64};

/// `cpu_id()` for a group built where `critical_sections()` held, with `area` from `area()`: one load.
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

/// One restartable sequence on the calling thread's rseq area (design.md §4.1.1): the check
/// instructions (each jumping to `7f` on a mismatch), then the commit instructions ending with the one
/// store that commits; yields true if the commit ran, false on a mismatch or if the kernel aborted the
/// sequence (the thread was preempted, migrated or signalled before the commit). `$area` is
/// `__rseq_offset`; the operands the instructions name follow (`tmp` is a free scratch register).
///
/// The `on_cpu` form checks that the thread runs on `$cpu`, `*$mode & ONCPU != 0` and
/// `*$slot == $expect`.
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
#[inline(always)]
pub(crate) fn store_if(area: isize, cpu: u32, mode: &AtomicU32, slot: &AtomicU32, expect: u32, new: u32) -> bool {
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
