//! The per-thread view (the rseq area idea): the calling thread's current CID and pinned core, kept in
//! thread-local cells that guards and the runtime update, so reading them needs no syscall.

/// Stored when the thread holds no guard.
pub(crate) const NONE: u32 = u32::MAX;

#[cfg(not(loom))]
mod imp {
    use super::NONE;
    use std::cell::Cell;

    thread_local! {
        static CID: Cell<u32> = const { Cell::new(NONE) };
        static CPU: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    /// A guard was taken: publish its CID, return the previous one (guards nest).
    #[inline(always)]
    pub(crate) fn enter(cid: u32) -> u32 {
        CID.try_with(|c| c.replace(cid)).unwrap_or(NONE)
    }

    /// A guard was dropped: restore the previous CID.
    #[inline(always)]
    pub(crate) fn exit(prev: u32) {
        let _ = CID.try_with(|c| c.set(prev));
    }

    /// The CID of the innermost live guard of the calling thread.
    pub(crate) fn cid() -> Option<u32> {
        CID.try_with(|c| c.get()).ok().filter(|&c| c != NONE)
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
    pub(crate) fn enter(_cid: u32) -> u32 {
        NONE
    }
    pub(crate) fn exit(_prev: u32) {}
}

pub(crate) use imp::*;
