//! The thread-local convenience layer: `Group::enter` for code that does not manage registrations.
//!
//! Each thread keeps a pool of registrations per group. `Group::enter` takes one (registering on first use),
//! the guard owns it while alive and gives it back on drop; a nested `enter` on the same thread finds the pool
//! empty and registers a second one, so nested guards never share a CID. The pool is dropped at thread exit, which
//! unregisters its registrations (I7). No protocol here is concurrent: only the owning thread touches its pool.

use crate::registration::Entered;
use crate::{view, Group, Registration};
use std::cell::RefCell;

thread_local! {
    // Boxed: a `Group::enter` guard owns its registration through a raw pointer, and moving a box in and out of the
    // pool moves one pointer, not the registration.
    #[allow(clippy::vec_box)]
    static POOL: RefCell<Vec<(u64, Vec<Box<Registration>>)>> = const { RefCell::new(Vec::new()) };
}

/// A registration of `group` for the calling thread: from the pool, or a new one.
pub(crate) fn take(group: &Group) -> Box<Registration> {
    let id = group.id();
    let pooled = POOL
        .try_with(|pool| {
            let mut pool = pool.try_borrow_mut().ok()?;
            pool.iter_mut().find(|(g, _)| *g == id)?.1.pop()
        })
        .ok()
        .flatten();
    pooled.unwrap_or_else(|| Box::new(group.register()))
}

/// Gives a registration back to the calling thread's pool; drops (unregisters) it if the pool is gone.
pub(crate) fn release(reg: Box<Registration>) {
    let id = reg.group().id();
    let mut reg = Some(reg);
    let _ = POOL.try_with(|pool| {
        if let Ok(mut pool) = pool.try_borrow_mut() {
            let reg = reg.take().expect("released once");
            match pool.iter_mut().find(|(g, _)| *g == id) {
                Some((_, regs)) => regs.push(reg),
                None => pool.push((id, vec![reg])),
            }
        }
    });
    drop(reg); // still Some only if the pool is gone or busy: unregister now
}

/// Runs `f` with a CID of `group`, entering the calling thread's pooled registration in place: no move out of the
/// pool and no guard object, which is what makes `ShardedCounter::add` a few ns. Falls back to `Group::enter` when
/// the thread has no pooled registration yet (first use) or its pool is in use (`f` itself enters again).
#[inline]
pub(crate) fn with_cid<R>(group: &Group, f: impl FnOnce(usize) -> R) -> R {
    let id = group.id();
    let mut f = Some(f);
    let fast = POOL.try_with(|pool| {
        let mut pool = pool.try_borrow_mut().ok()?;
        let reg = pool.iter_mut().find(|(g, _)| *g == id)?.1.last_mut()?;
        let inside = InPlace::enter(reg);
        let f = f.take()?;
        Some(f(inside.entered.cid() as usize))
    });
    match (fast, f) {
        (Ok(Some(r)), _) => r,
        (_, Some(f)) => {
            let guard = group.enter();
            f(guard.cid().get())
        }
        (_, None) => unreachable!("f ran on the fast path but produced no result"),
    }
}

/// An in-place enter whose drop exits, so a panic in the caller's closure still releases the CID (I7).
struct InPlace<'a> {
    reg: &'a mut Registration,
    entered: Entered,
    prev_view: u32,
}

impl<'a> InPlace<'a> {
    #[inline(always)]
    fn enter(reg: &'a mut Registration) -> InPlace<'a> {
        let entered = reg.enter_raw();
        let prev_view = view::enter(entered.cid());
        InPlace { reg, entered, prev_view }
    }
}

impl Drop for InPlace<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        view::exit(self.prev_view);
        self.reg.exit_raw(self.entered);
    }
}

/// Drops the calling thread's pooled registrations of `group` (they would otherwise live until thread exit).
pub(crate) fn forget(group: &Group) -> usize {
    let id = group.id();
    let regs = POOL
        .try_with(|pool| {
            let mut pool = pool.try_borrow_mut().ok()?;
            let at = pool.iter().position(|(g, _)| *g == id)?;
            Some(pool.swap_remove(at).1)
        })
        .ok()
        .flatten()
        .unwrap_or_default();
    let n = regs.len();
    drop(regs);
    n
}

impl Group {
    /// Enters the group from the calling thread without managing a registration: the thread is registered on
    /// first use and unregistered when it exits (I7).
    ///
    /// Cost: a thread-local lookup and a move of the boxed pooled registration out and back on top of
    /// [`Registration::enter`]: about 160 instructions and 7.7 ns per enter+exit against 43 and 1.9 ns for the
    /// explicit API (docs/benchmarks.md, 2-core EPYC VM); the first call on a thread also registers it. The pooled registration keeps the
    /// group alive until the thread exits or calls [`Group::leave_thread`]. Nested calls on one thread get
    /// distinct CIDs (a second registration is made).
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let outer = group.enter();
    /// let inner = group.enter();
    /// assert_ne!(outer.cid(), inner.cid());
    /// ```
    #[inline]
    pub fn enter(&self) -> crate::CidGuard<'static> {
        let mut reg = take(self);
        let entered = reg.enter_raw();
        crate::CidGuard::pooled(reg, entered)
    }

    /// Unregisters the calling thread's pooled registrations of this group now instead of at thread exit;
    /// returns how many there were.
    pub fn leave_thread(&self) -> usize {
        forget(self)
    }
}
