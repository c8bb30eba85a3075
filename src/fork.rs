//! `fork` (design.md §12.2): handlers that hold every live group's lifecycle and claim locks across the fork, so
//! a child never inherits one of them held by a thread that does not exist in the child.
//!
//! What a group is in the child: the same group as in the parent at the instant of the fork, in the child's own
//! copy of memory. The forking thread's registrations (explicit ones and the thread-local layer's) work there as
//! before, guards it held across the fork included. Every other thread's registrations are frozen: their threads
//! do not exist in the child, so they keep whatever they held (a word's CID, a guard's CID, a core slot held
//! busy) and count as users until the child exits; that is a state the protocol already tolerates (threads
//! descheduled for ever inside or between guards), so CIDs stay exclusive and below the hard bound, at worst less
//! compact. New registrations, `Group::enter`, `ShardedCounter` and `PerCid` work in the child.
//!
//! The handlers are installed when the first group is built (`install`), and every group is remembered by a weak
//! reference (`track`). The prepare handler first completes the process-wide probes a build makes
//! (`sys::finish_probes`), then takes the registry's lock, then each live group's lifecycle lock and claim lock in
//! the order of the groups' ids; the parent and child handlers release them in the forking thread (which is the
//! child's only thread). Nothing else ever holds two of these locks, or the registry's lock and a group's, so the
//! order cannot deadlock. A fork therefore waits for every register, drop, switch, `stats` call and claim in
//! progress, in every group of the process.
//!
//! Limits: `vfork`, `clone` without fork handlers and `_Fork` run no handlers and are not covered; a fork from a
//! signal handler that interrupted its own thread inside one of those operations would wait for itself. The child
//! of a multithreaded process may formally only call async-signal-safe functions; registering allocates, so it
//! relies on the C library making `malloc` usable in the child, as glibc does. A `Runtime`'s threads are not in
//! the child.

use crate::inner::{ForkHold, Inner};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError, Weak};

/// Every group built in this process, weakly (dead ones are pruned as the list grows).
static GROUPS: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// What the prepare handler holds until the parent or child handler releases it: the registry's lock and each
/// live group's locks, with a strong reference that keeps the group alive until its hold is released.
struct Held {
    groups: Vec<(ForkHold<'static>, Arc<Inner>)>,
    _registry: MutexGuard<'static, Vec<Weak<Inner>>>,
}

thread_local! {
    /// The forking thread's `Held`, from its prepare handler to its parent or child handler (the same thread).
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Installs the fork handlers, once per process. Called at the start of every group build, before the build's
/// process-wide probes, so that a fork racing the process's first build waits for them.
pub(crate) fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: pthread_atfork takes three `extern "C" fn()` handlers that live as long as the process; it fails
        // only with ENOMEM, which leaves forks unprotected (as before there were handlers) and is not fatal.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// Remembers a new group for the handlers.
pub(crate) fn track(inner: &Arc<Inner>) {
    let mut groups = GROUPS.lock().unwrap_or_else(PoisonError::into_inner);
    if groups.len() == groups.capacity() {
        groups.retain(|g| g.strong_count() > 0); // amortised: the list at most doubles between prunes
    }
    groups.push(Arc::downgrade(inner));
}

extern "C" fn prepare() {
    crate::sys::finish_probes();
    let registry = GROUPS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut live: Vec<Arc<Inner>> = registry.iter().filter_map(Weak::upgrade).collect();
    live.sort_unstable_by_key(|g| g.hot.id);
    let groups = live
        .into_iter()
        .map(|g| {
            let hold = g.hold_for_fork();
            // SAFETY: only the lifetime changes: the hold borrows the `Inner` that the `Arc` stored next to it keeps
            // alive, and `release` consumes the hold before that `Arc` is dropped.
            let hold = unsafe { std::mem::transmute::<ForkHold<'_>, ForkHold<'static>>(hold) };
            (hold, g)
        })
        .collect();
    // If the thread's locals are gone (a fork from a thread-local destructor), the locks are released right here
    // and that fork is not protected.
    let _ = HELD.try_with(|h| *h.borrow_mut() = Some(Held { groups, _registry: registry }));
}

extern "C" fn parent() {
    release();
}

extern "C" fn child() {
    release();
}

fn release() {
    let held = HELD.try_with(|h| h.borrow_mut().take()).ok().flatten();
    if let Some(held) = held {
        for (hold, group) in held.groups {
            hold.release();
            drop(group);
        }
    }
}
