//! The per-thread view (the rseq area idea): the calling thread's current CID and pinned core, kept in
//! thread-local cells that guards and the runtime update, so reading them needs no syscall.

/// Stored when the thread holds no guard.
pub(crate) const NONE: u32 = u32::MAX;

#[cfg(not(loom))]
mod imp {
    use super::NONE;
    use std::cell::Cell;

    thread_local! {
        /// What the view shows: the CID of the innermost live guard (or `NONE`), and which guard set it: its
        /// registration's address, unique among the thread's live guards (each live guard has its own
        /// registration); 0 with `NONE`.
        static SHOWN: Cell<Before> = const { Cell::new(Before { token: 0, cid: NONE }) };
        static CPU: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    /// What the view showed before a guard: handed back to `exit`.
    #[derive(Clone, Copy)]
    pub(crate) struct Before {
        token: usize,
        cid: u32,
    }

    /// A guard of registration `token` with CID `cid` was taken: show it. Returns what it replaced.
    #[inline(always)]
    pub(crate) fn enter(token: usize, cid: u32) -> Before {
        SHOWN.try_with(|s| s.replace(Before { token, cid })).unwrap_or(Before { token: 0, cid: NONE })
    }

    /// The guard of registration `token` was dropped. If the view still shows it (it was the innermost live
    /// guard), show what it replaced. Otherwise a guard entered after it is still live (dropped out of order):
    /// show `NONE`, which also keeps every later drop from putting back a CID of a dropped guard (a guard puts
    /// back its predecessor only while the view shows the guard itself, and once `NONE` replaced a token no
    /// drop shows it again), until the thread's next guard.
    #[inline(always)]
    pub(crate) fn exit(token: usize, before: Before) {
        let _ = SHOWN.try_with(|s| {
            let innermost = s.get().token == token;
            s.set(if innermost { before } else { Before { token: 0, cid: NONE } });
        });
    }

    /// The CID of the innermost live guard of the calling thread (`None` after an out-of-order drop, until the
    /// thread's next guard).
    pub(crate) fn cid() -> Option<u32> {
        SHOWN.try_with(|s| s.get().cid).ok().filter(|&c| c != NONE)
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
    use super::NONE;
    #[derive(Clone, Copy)]
    pub(crate) struct Before;
    pub(crate) fn enter(_token: usize, _cid: u32) -> Before {
        Before
    }
    pub(crate) fn exit(_token: usize, _before: Before) {}
}

pub(crate) use imp::*;
