//! The per-thread view (the rseq area idea): the calling thread's current CID and pinned core, kept in
//! thread-local cells that guards and the runtime update, so reading them needs no syscall.

/// Stored when the thread holds no guard.
#[cfg(not(loom))]
pub(crate) const NONE: u32 = u32::MAX;

#[cfg(not(loom))]
mod imp {
    use super::NONE;
    use std::cell::Cell;

    /// `STATE`: bits 0..32 the CID shown (of the innermost live guard, or `NONE`), bits 32..63 the thread's live
    /// guards (at most one per registration, so far below 2^31), bit 63 "a guard was dropped while a later one was
    /// live": from then on a dropped guard shows `NONE` instead of putting back what it replaced, until the
    /// thread's last live guard drops.
    const ONE_LIVE: u64 = 1 << 32;
    const LIVE_BITS: u64 = ((1 << 31) - 1) << 32;
    const OUT_OF_ORDER: u64 = 1 << 63;
    const CLEAN_NONE: u64 = NONE as u64;

    thread_local! {
        static STATE: Cell<u64> = const { Cell::new(CLEAN_NONE) };
        static CPU: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    /// What the view was before a guard: handed back to `exit`.
    pub(crate) type Before = u64;

    /// A guard with CID `cid` was taken: count it and show its CID. Returns the state it replaced.
    #[inline(always)]
    pub(crate) fn enter(cid: u32) -> Before {
        STATE
            .try_with(|c| {
                let s = c.get();
                // Wrapping: only ~2^31 guards passed to `mem::forget` on one thread reach the flag bit (then the
                // view shows `None`); no debug-build overflow panic inside a guard's construction.
                c.set((s & (OUT_OF_ORDER | LIVE_BITS)).wrapping_add(ONE_LIVE) | u64::from(cid));
                s
            })
            .unwrap_or(CLEAN_NONE)
    }

    /// The guard with CID `cid` that `enter` answered with `before` was dropped. If the view is exactly as this
    /// guard set it and clean, the guard is the innermost live one (every later guard was dropped and put back
    /// what it replaced): put back `before`. Otherwise a later guard is still live, or a drop was out of order
    /// since: `exit_other`.
    #[inline(always)]
    pub(crate) fn exit(cid: u32, before: Before) {
        let _ = STATE.try_with(|c| {
            let s = c.get();
            if s == (before & LIVE_BITS).wrapping_add(ONE_LIVE) | u64::from(cid) {
                c.set(before);
            } else {
                exit_other(c, s);
            }
        });
    }

    /// A drop out of order, or any drop after one: count down and show `NONE` (never a CID the thread may no
    /// longer hold; the next guard shows its own) until the thread's last live guard drops.
    #[cold]
    fn exit_other(c: &Cell<u64>, s: u64) {
        let live = ((s & LIVE_BITS) >> 32).saturating_sub(1);
        c.set(if live == 0 { CLEAN_NONE } else { OUT_OF_ORDER | live << 32 | CLEAN_NONE });
    }

    /// The CID of the innermost live guard of the calling thread (`None` after an out-of-order drop, until the
    /// thread's next guard).
    pub(crate) fn cid() -> Option<u32> {
        STATE.try_with(|s| s.get() as u32).ok().filter(|&c| c != NONE)
    }

    /// The core the calling thread was pinned to by the runtime.
    pub(crate) fn cpu() -> Option<usize> {
        CPU.try_with(|c| c.get()).ok().filter(|&c| c != usize::MAX)
    }

    /// Records the core the calling thread is pinned to (`None` when unpinned).
    pub(crate) fn set_cpu(cpu: Option<usize>) {
        let _ = CPU.try_with(|c| c.set(cpu.unwrap_or(usize::MAX)));
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) type Before = ();
    pub(crate) fn enter(_cid: u32) -> Before {}
    pub(crate) fn exit(_cid: u32, _before: Before) {}
}

pub(crate) use imp::*;
