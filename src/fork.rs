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
//! The handlers are installed when the first group is built (`install`, a state a child may find half-done and
//! finish), and every group is remembered by a weak reference (`track`). The prepare handler first completes the
//! process-wide state made lazily outside the registry lock (`sys::finish_probes`, `local::finish_reaper_key`), then
//! takes the registry lock (which a build holds across its membarrier probes), then each live group's lifecycle
//! lock and claim lock in the order of the groups' ids, and leaves them, as guards that unlock on drop, in a
//! process-wide slot; the parent and child handlers take them out and drop them in the forking thread (which is
//! the child's only thread). Nothing else ever holds two of these locks, or the registry lock and a group's, so the
//! order cannot deadlock. A fork therefore waits for every group build, register, drop, switch, `stats` call and
//! claim in progress, in every group of the process.
//!
//! Limits: `vfork`, `clone` without fork handlers and `_Fork` run no handlers and are not covered; a fork from a
//! signal handler that interrupted its own thread inside one of those operations would wait for itself. The child
//! of a multithreaded process may formally only call async-signal-safe functions; registering allocates, so it
//! relies on the C library making `malloc` usable in the child, as glibc does. A `Runtime`'s threads are not in
//! the child.

use crate::inner::{ForkHold, Inner};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

/// Every group built in this process, weakly (dead ones are pruned as the list grows). Its lock is the registry
/// lock: held by a group build across its process-wide probes and its `track`, and by the forking thread from its
/// prepare handler to its parent or child handler.
static GROUPS: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// The registry lock, held.
pub(crate) type Registry = MutexGuard<'static, Vec<Weak<Inner>>>;

/// What the prepare handler holds until the parent or child handler releases it: the registry lock and each live
/// group's locks, with a strong reference that keeps the group alive until its hold is dropped. Every lock in it
/// is a guard that unlocks on drop (`ForkHold` releases the claim lock, then the lifecycle lock), so whatever
/// drops a `Held`, on whatever path, releases everything; fields drop in order: the groups, then the registry.
struct Held {
    _groups: Vec<(ForkHold<'static>, Arc<Inner>)>,
    _registry: Registry,
}

// SAFETY: a `Held` leaves the thread that made it only in the sense that it sits in the process-wide `HELD`
// between handlers: the prepare handler stores it and the parent handler of the same thread, or the child handler
// in the child's copy of that thread, takes it and drops it, so every lock in it is unlocked by the thread that
// locked it (or its copy in the child). Its other parts (`Arc<Inner>`, `&Inner`) are `Send`.
unsafe impl Send for Held {}

/// The `Held` of the fork in flight: written by a prepare handler, which holds the registry lock inside the value it
/// writes, and taken by that thread's parent or child handler, before it drops the value (and so that lock). Only
/// one fork per process is ever between its handlers, since each holds the registry lock all that time: a
/// process-wide slot, not a thread-local, so that a fork from a thread-local destructor, where the thread's
/// thread-locals may be gone, holds and releases its locks like any other.
static HELD: Mutex<Option<Held>> = Mutex::new(None);

/// `INSTALL` states other than an installing process's id.
const NOT_INSTALLED: i64 = 0;
const INSTALLED: i64 = -1;

/// Whether this process's fork handlers are installed: `NOT_INSTALLED`, `INSTALLED`, or the id of the process a
/// thread of which is installing them now. A process id other than ours is the parent's (or an older ancestor's):
/// it forked us while one of its threads was inside `install`, before the handlers were registered (had they
/// been, our child handler would have stored `INSTALLED`), and that thread does not exist here. So a child may
/// find this half-done and finishes it itself, where a `Once` would make it wait for ever.
static INSTALL: AtomicI64 = AtomicI64::new(NOT_INSTALLED);

/// Installs the fork handlers, once per process. Called at the start of every group build, before the build takes
/// the registry lock for its process-wide probes (`registry`), so that a fork racing the process's first build
/// waits for them.
pub(crate) fn install() {
    // Acquire/Release: nothing is published through `INSTALL` but the fact itself; the C library orders the
    // registration against forks (glibc holds its handler list's lock across a fork's prepare phase).
    if INSTALL.load(Ordering::Acquire) == INSTALLED {
        return;
    }
    let me = i64::from(std::process::id());
    loop {
        match INSTALL.load(Ordering::Acquire) {
            INSTALLED => return,
            // Another thread of this process is registering them: a single `pthread_atfork` call.
            s if s == me => std::thread::yield_now(),
            s => {
                // Not installed, or an ancestor's installation that this process never saw finish.
                if INSTALL.compare_exchange(s, me, Ordering::Acquire, Ordering::Acquire).is_ok() {
                    // SAFETY: pthread_atfork takes three `extern "C" fn()` handlers that live as long as the
                    // process; it fails only with ENOMEM, which leaves forks unprotected (as before there were
                    // handlers) and is not fatal.
                    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
                    INSTALL.store(INSTALLED, Ordering::Release);
                    return;
                }
            }
        }
    }
}

/// The registry lock, for a group build's process-wide probes and its `track`: a fork cannot land inside them.
pub(crate) fn registry() -> Registry {
    GROUPS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Remembers a new group for the handlers; the caller holds the registry lock since before its probes.
pub(crate) fn track(mut groups: Registry, inner: &Arc<Inner>) {
    if groups.len() == groups.capacity() {
        groups.retain(|g| g.strong_count() > 0); // amortised: the list at most doubles between prunes
    }
    groups.push(Arc::downgrade(inner));
}

extern "C" fn prepare() {
    // Process-wide state made lazily outside the registry lock: complete it before the fork, waiting for a thread
    // that is making it now, so that no child finds it half-made (design.md §12.2).
    crate::sys::finish_probes();
    crate::local::finish_reaper_key();
    let registry = registry();
    let mut live: Vec<Arc<Inner>> = registry.iter().filter_map(Weak::upgrade).collect();
    live.sort_unstable_by_key(|g| g.hot.id);
    let groups = live
        .into_iter()
        .map(|g| {
            let hold = g.hold_for_fork();
            // SAFETY: only the lifetime changes: the hold borrows the `Inner` that the `Arc` stored next to it keeps
            // alive, and the hold drops before that `Arc` (a tuple's fields drop in order).
            let hold = unsafe { std::mem::transmute::<ForkHold<'_>, ForkHold<'static>>(hold) };
            (hold, g)
        })
        .collect();
    let held = Held { _groups: groups, _registry: registry };
    let stale = HELD.lock().unwrap_or_else(PoisonError::into_inner).replace(held);
    debug_assert!(stale.is_none(), "the registry lock admits one fork at a time");
}

extern "C" fn parent() {
    release();
}

extern "C" fn child() {
    // The handlers ran, so they are registered in this process, whatever `INSTALL` said at the fork.
    INSTALL.store(INSTALLED, Ordering::Release);
    release();
}

/// Drops the fork's `Held`: every group's claim lock and lifecycle lock, then the registry lock.
fn release() {
    let held = HELD.lock().unwrap_or_else(PoisonError::into_inner).take();
    drop(held);
}
