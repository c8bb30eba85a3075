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
    /// since: `exit_out_of_order`.
    #[inline(always)]
    pub(crate) fn exit(cid: u32, before: Before) {
        let _ = STATE.try_with(|c| {
            let s = c.get();
            if s == (before & LIVE_BITS).wrapping_add(ONE_LIVE) | u64::from(cid) {
                c.set(before);
            } else {
                exit_out_of_order(c, s);
            }
        });
    }

    /// A drop out of order, or any drop after one: count down and show `NONE` (never a CID the thread may no
    /// longer hold; the next guard shows its own) until the thread's last live guard drops.
    #[cold]
    fn exit_out_of_order(c: &Cell<u64>, s: u64) {
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
    /// Nothing to remember: loom builds keep no view.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Before;
    pub(crate) fn enter(_cid: u32) -> Before {
        Before
    }
    pub(crate) fn exit(_cid: u32, _before: Before) {}
}

pub(crate) use imp::*;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Each test runs on its own thread, so the thread-local view starts clean.
    #[test]
    fn nested_guards_dropped_in_order_restore_what_they_replaced() {
        assert_eq!(cid(), None);
        let a = enter(3);
        assert_eq!(cid(), Some(3));
        let b = enter(7);
        assert_eq!(cid(), Some(7));
        exit(7, b);
        assert_eq!(cid(), Some(3), "the outer guard shows again");
        exit(3, a);
        assert_eq!(cid(), None);
        let e = enter(5);
        assert_eq!(e, CLEAN_NONE_FOR_TESTS, "clean after the last guard");
        exit(5, e);
    }

    /// Out of order (`g1, g2, drop(g1), drop(g2)`): the view must never show a CID the thread no longer holds, so
    /// it shows `None` until the last live guard drops; a new guard still shows its own CID.
    #[test]
    fn out_of_order_drops_never_show_a_released_cid() {
        let a = enter(1);
        let b = enter(2);
        exit(1, a); // g1 dropped first: CID 1 is released
        assert_eq!(cid(), None, "neither the released 1 nor (by a blind restore) anything stale");
        let c = enter(4);
        assert_eq!(cid(), Some(4), "a new guard shows its CID");
        exit(4, c);
        assert_eq!(cid(), None, "still out of order: g2 is live but the view no longer knows which CID it shows");
        exit(2, b);
        assert_eq!(cid(), None);
        let d = enter(6);
        assert_eq!(cid(), Some(6), "clean again once the last guard dropped");
        exit(6, d);
        assert_eq!(cid(), None);
    }

    #[test]
    fn the_core_is_shown_only_while_set() {
        assert_eq!(cpu(), None);
        set_cpu(Some(3));
        assert_eq!(cpu(), Some(3));
        set_cpu(None);
        assert_eq!(cpu(), None);
    }

    const CLEAN_NONE_FOR_TESTS: Before = NONE as u64;
}
