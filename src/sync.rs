//! The model facade: the only module that chooses between std and loom primitives for the code loom
//! checks (code outside the models, such as the runtime and the thread-local layer, names std and parking_lot
//! directly).
//!
//! Under `--cfg loom` every atomic, fence, `Arc`, `Mutex` and spin hint used by the allocator comes from loom, so
//! the loom models in `loom-tests/` check the library's real code, not a copy.

#[cfg(loom)]
mod imp {
    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::hint::spin_loop;
    pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use loom::sync::Arc;

    /// Loom has neither compiler fences nor membarrier, so the models run groups without membarrier, where the
    /// fast paths' compiler fence orders nothing between threads: a no-op here, exactly as weak as on the hardware.
    /// What loom checks is the fallback's full fences (`Inner::light_barrier_rest`), placed where the membarrier
    /// build relies on its compiler fence (docs/loom.md, "How the asymmetric (membarrier) fast path is modelled").
    pub(crate) fn compiler_fence(_order: Ordering) {}

    /// A load of `a` by a thread that holds the lock every store to `a` is made under: loom's unsynchronised
    /// load, which is no scheduling point (the plain read of lock-protected data it stands for is none either) and
    /// which loom checks: a store concurrent with it panics.
    pub(crate) fn load_under_lock(a: &AtomicUsize) -> usize {
        // SAFETY: every store to `a` is made under the lock the caller holds, so none is concurrent with this load
        // (loom panics if one is).
        unsafe { a.unsync_load() }
    }

    /// A mutex with parking_lot's infallible `lock()`.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// parking_lot's `try_lock`: `None` if another thread holds it.
        pub(crate) fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }

        /// The value, through `&mut self`: no lock taken.
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }
    }
}

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::hint::spin_loop;
    pub(crate) use std::sync::MutexGuard;

    /// The lifecycle lock: std's mutex with parking_lot's infallible `lock()` (a panic under the lock leaves
    /// nothing half-done that a later holder must not see, as with parking_lot, which does not poison). Not
    /// parking_lot's, for fork (design.md §12.2): parking_lot queues waiters in a process-wide table, which a child
    /// inherits with entries for threads that do not exist there, so an unlock in the child may hand the lock to
    /// one of them (its fair unlock) or wake one instead of a live waiter; std's waiters sleep in the kernel on
    /// the lock's own word, and the child inherits none.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(std::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// parking_lot's `try_lock`: `None` if another thread holds it.
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(guard) => Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }

        /// The value, through `&mut self`: no lock taken (so it works on a lock a forked child inherited held).
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// `std::cell::UnsafeCell` with loom's access API (`with_mut`), so loom checks the accesses of the code that
    /// uses it (the pool's magazines) for data races.
    #[derive(Debug, Default)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        /// Calls `f` with a pointer to the value; the caller guarantees exclusive access meanwhile.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
    pub(crate) use std::sync::atomic::{compiler_fence, fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use std::sync::Arc;

    /// A load of `a` by a thread that holds the lock every store to `a` is made under. Relaxed: the lock orders
    /// every such store before this load.
    #[inline]
    pub(crate) fn load_under_lock(a: &AtomicUsize) -> usize {
        a.load(Ordering::Relaxed)
    }
}

pub(crate) use imp::*;
