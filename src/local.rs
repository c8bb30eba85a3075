//! The thread-local convenience layer (design.md §9.1, §9.1.1): `Group::enter` for code that does not manage
//! registrations, the registration it lends each thread, and the guard's give-back of it (`give_back`, which the
//! drop in `guard.rs` calls after the exit). An enter through here runs `Registration::enter_raw`
//! (`registration/enter.rs`).
//!
//! Each thread parks one registration, of the group it used last, in a thread-local slot: `Group::enter` marks it
//! in use there (one plain store: the slot's group id becomes 0) and the guard's drop marks it parked again (one
//! store), so the pair costs a few instructions on top of [`Registration::enter`], and the registration's pointer
//! is only ever read on the fast path (a pointer moved out of the slot and back at every call made each enter wait
//! for the previous drop's store to reach the next load). Registrations of other groups, and the second registration that a nested
//! `enter` on the same thread needs (nested guards never share a CID), wait in a per-thread pool. The slot and the
//! pool are dropped at thread exit, which unregisters their registrations (I7); a guard that outlives them (held
//! by another thread-local's destructor) unregisters its registration itself. No protocol here is concurrent:
//! only the owning thread touches its slot and pool.
//!
//! The layer's registrations hold group handles that do not count as the user's (`Group::register_uncounted`):
//! once user code has dropped every handle of a group, its idle registrations here are dropped when the thread
//! next takes a registration on the slow path (the first enter of another group than the parked one, a nested
//! enter) or evicts it from the slot, instead of living until thread exit. So a thread that creates and drops
//! groups or `ShardedCounter`s one after another keeps at most one dead registration; registrations of groups
//! abandoned since the thread's last slow-path call stay until its next one (or its exit).
//!
//! A guard passed to `mem::forget` cannot be told from a live outer guard at the thread's next enter, so its
//! registration stays its own (in the list of lent registrations) and the slot takes another one: later enters are
//! the fast path again. At thread exit, after every thread-local destructor, a pthread key destructor drops what is
//! still lent, giving back what the forgotten guards held (design.md §9.1.1).
//!
//! Limit: a thread whose first `Group::enter` runs inside a `pthread_key_create` destructor (after Rust's
//! thread-local destructors) can no longer register the thread-exit hook, so its registration is never dropped.

use crate::guard::Entered;
use crate::{Group, Registration};
use std::cell::{Cell, RefCell};
use std::ptr::{self, NonNull};

/// The parked registration. States (`id`, `reg`):
///
/// | `id` | `reg` | state |
/// |---|---|---|
/// | 0 | null | empty |
/// | the group's id | `R` | `R` parked: the slot owns it |
/// | 0 | `R` | `R` in use: a `Group::enter` guard or an in-place enter owns it until it is given back here |
/// | `CLOSED_ID` | the closed marker | closed (thread exit) |
///
/// `R` is a `Box<Registration>` made by `Box::into_raw`; group ids start at 1. No destructor, so the hot path needs
/// no thread-local state check: `Closer`, registered on the first (cold) take, empties it at thread exit.
struct Parked {
    id: Cell<u64>,
    reg: Cell<*mut Registration>,
}

/// After `Closer` ran: an `id` no group has and a non-null `reg` that is never dereferenced, so nothing is taken
/// from or parked in the slot any more.
const CLOSED_ID: u64 = u64::MAX;

/// The `reg` of a closed slot: non-null, never dereferenced.
fn closed_marker() -> *mut Registration {
    NonNull::dangling().as_ptr()
}

impl Parked {
    /// Closes the slot (nothing is taken from or parked in it any more) and returns what it held: null, the closed
    /// marker, or an owned `Box::into_raw` pointer.
    fn close(&self) -> *mut Registration {
        self.id.set(CLOSED_ID);
        self.reg.replace(closed_marker())
    }
}

/// Thread-exit hook of `PARKED`: drops the parked registration (unregistering it) and closes the slot. A
/// registration in use goes to `LENT`: its guard, if live (held by another thread-local's destructor), finds the
/// slot closed at its give-back and drops it; if the guard was passed to `mem::forget`, `reap` drops it after the
/// thread-local destructors (design.md §9.1.1).
struct Closer;

impl Drop for Closer {
    fn drop(&mut self) {
        let _ = PARKED.try_with(|p| {
            let in_use = p.id.get() == 0;
            let reg = p.close();
            if let Some(reg) = NonNull::new(reg).filter(|&r| r.as_ptr() != closed_marker()) {
                if in_use {
                    lend(reg);
                } else {
                    // SAFETY: a non-null `reg` other than the closed marker (set here and by `take_slow`) is a
                    // `Box::into_raw` pointer owned by the slot; the slot no longer refers to it.
                    drop(unsafe { Box::from_raw(reg.as_ptr()) });
                }
            }
        });
    }
}

/// Registrations the layer handed out that are not the slot's: owned by their guards (or in-place enters) until
/// given back, by a guard that may also have been passed to `mem::forget` (design.md §9.1.1).
type Lent = Vec<NonNull<Registration>>;

thread_local! {
    static PARKED: Parked = const { Parked { id: Cell::new(0), reg: Cell::new(ptr::null_mut()) } };
    /// The thread's `Lent` list: null, or an owned `Box::into_raw` pointer. A raw pointer in a const `Cell` has no
    /// destructor, so the list is still there when `reap` runs, after every thread-local destructor.
    static LENT: Cell<*mut Lent> = const { Cell::new(ptr::null_mut()) };
    static CLOSER: Closer = const { Closer };
    // Boxed: a `Group::enter` guard owns its registration through a raw pointer, and moving a box in and out of the
    // pool moves one pointer, not the registration.
    #[allow(clippy::vec_box)]
    static POOL: RefCell<Vec<(u64, Vec<Box<Registration>>)>> = const { RefCell::new(Vec::new()) };
}

/// Takes the parked registration out of the slot if it belongs to group `id`: the caller owns the returned
/// `Box::into_raw` pointer, and the slot is empty.
fn unpark(id: u64) -> Option<NonNull<Registration>> {
    PARKED
        .try_with(|p| {
            if p.id.get() != id {
                return None;
            }
            p.id.set(0);
            NonNull::new(p.reg.replace(ptr::null_mut()))
        })
        .ok()
        .flatten()
}

/// Marks the parked registration in use if it belongs to group `id`, and returns it: the caller owns it until it
/// gives it back with `give_back` (which finds it still in the slot and marks it parked again).
#[inline(always)]
fn use_parked(id: u64) -> Option<NonNull<Registration>> {
    PARKED
        .try_with(|p| {
            if p.id.get() != id {
                return None;
            }
            p.id.set(0);
            NonNull::new(p.reg.get())
        })
        .ok()
        .flatten()
}

/// Runs `f` on the calling thread's registration of `group` while it stays parked (no take, no give-back);
/// `None` if none is parked for `group`.
///
/// # Safety
///
/// `f` must not reach this layer again (`Group::enter`, `with_cid`, `take`, `forget`, `leave_thread`, a
/// `ShardedCounter` update): that could unpark and drop the registration `f` is looking at.
#[cfg(test)]
pub(crate) unsafe fn peek_parked<R>(group: &Group, f: impl FnOnce(&Registration) -> R) -> Option<R> {
    // SAFETY: a parked pointer (its id matched: parked, not in use) is an owned, live `Box::into_raw`
    // registration; it stays parked, and so alive, while `f` runs: only this thread's layer takes it, `f` does not
    // call into the layer (the caller's contract), and no signal handler does either (`Group::enter`'s documented
    // contract).
    parked(group).map(|reg| f(unsafe { reg.as_ref() }))
}

/// The calling thread's parked registration of `group`, if any: a pointer that stays valid until this thread's
/// layer is reached again (the contract of `peek_parked`). Only the slot's two words are read inside the
/// thread-local access, a closure small enough to inline always; the caller's work runs outside it.
#[inline(always)]
pub(crate) fn parked(group: &Group) -> Option<NonNull<Registration>> {
    let id = group.id();
    PARKED.try_with(|p| if p.id.get() == id { NonNull::new(p.reg.get()) } else { None }).ok().flatten()
}

/// A registration of `group` for the calling thread, as an owned `Box::into_raw` pointer: the parked one (marked in
/// use), one from the pool, or a new one. Give it back with `give_back`.
#[inline(always)]
pub(crate) fn take(group: &Group) -> NonNull<Registration> {
    use_parked(group.id()).unwrap_or_else(|| take_slow(group))
}

#[cold]
fn take_slow(group: &Group) -> NonNull<Registration> {
    // Registers the slot's thread-exit hook (a no-op after the first time). If the thread is already past its
    // thread-local destructors, close the slot instead: nothing parked after this point could be dropped.
    if CLOSER.try_with(|_| ()).is_err() {
        let _ = PARKED.try_with(|p| {
            if p.reg.get().is_null() {
                p.close();
            }
        });
    }
    let id = group.id();
    let (pooled, dead) = POOL
        .try_with(|pool| {
            let Ok(mut pool) = pool.try_borrow_mut() else { return (None, Vec::new()) };
            // Registrations of abandoned groups: taken out here, dropped after the borrow ends.
            let mut dead = Vec::new();
            // Entries emptied by earlier takes go too: an entry is made again when a registration comes back.
            pool.retain_mut(|(_, regs)| {
                let abandoned = regs.first().is_some_and(|r| r.group().is_abandoned());
                if abandoned {
                    dead.append(regs);
                }
                !regs.is_empty()
            });
            (pool.iter_mut().find(|(g, _)| *g == id).and_then(|(_, regs)| regs.pop()), dead)
        })
        .unwrap_or_default();
    drop(dead);
    let reg = NonNull::from(Box::leak(pooled.unwrap_or_else(|| Box::new(group.register_uncounted()))));
    use_in_slot(reg);
    reg
}

/// `reg` was just taken for a guard or an in-place enter: make it the slot's registration in use, so that its
/// give-back is the fast path. An empty slot takes it; so does a slot whose registration is in use, by a guard that
/// is live (nested enters) or was passed to `mem::forget` (the two cannot be told apart, design.md §9.1.1): that
/// registration stays its guard's, in `LENT`, and the thread's later enters find `reg` parked instead of taking the
/// slow path for ever. A slot parked for another group keeps its registration (`give_back_slow` evicts it), and a
/// closed one takes nothing: `reg` is lent then.
fn use_in_slot(reg: NonNull<Registration>) {
    let lent = PARKED
        .try_with(|p| {
            let (id, slot) = (p.id.get(), p.reg.get());
            if slot.is_null() {
                p.id.set(0);
                p.reg.set(reg.as_ptr());
                None
            } else if id == 0 {
                NonNull::new(p.reg.replace(reg.as_ptr()))
            } else {
                Some(reg)
            }
        })
        .unwrap_or(Some(reg));
    if let Some(lent) = lent {
        lend(lent);
    }
}

/// Gives back a registration of group `id` taken with `take` (an owned `Box::into_raw` pointer): marks it parked
/// if it is the slot's registration in use (the common case: one store); else see `give_back_slow`.
#[inline(always)]
pub(crate) fn give_back(reg: NonNull<Registration>, id: u64) {
    let parked = PARKED
        .try_with(|p| {
            if p.reg.get() == reg.as_ptr() {
                p.id.set(id);
                return true;
            }
            false
        })
        .unwrap_or(false);
    if !parked {
        give_back_slow(reg);
    }
}

/// A lent registration comes back (`LENT`). Into an empty slot (`leave_thread` emptied it meanwhile): parked. Most
/// recently used wins: a registration of another group than the parked one takes the slot and the parked one goes
/// to the pool, so a thread that moves on to another group gets the fast path there after one call. Same group
/// (nested guards), a slot registration in use (its guard gives it back later), closed slot, or thread-locals gone:
/// to the pool, which drops (unregisters) it if the pool is gone too.
#[cold]
fn give_back_slow(reg: NonNull<Registration>) {
    unlend(reg);
    // SAFETY: the caller owns `reg` (a live `Box::into_raw` pointer); reading its group id aliases nothing mutable.
    let id = unsafe { reg.as_ref() }.group().id();
    // Ok(evicted occupant, if any): `reg` is parked now; Err: it is not.
    let parked = PARKED.try_with(|p| {
        let occupant = p.id.get();
        if !p.reg.get().is_null() && (occupant == id || occupant == CLOSED_ID || occupant == 0) {
            return Err(());
        }
        p.id.set(id);
        Ok(NonNull::new(p.reg.replace(reg.as_ptr())))
    });
    let to_pool = match parked {
        Ok(Ok(Some(evicted))) => evicted,
        Ok(Ok(None)) => return, // the slot was empty: parked
        Ok(Err(())) | Err(_) => reg,
    };
    // SAFETY: `to_pool` is an owned `Box::into_raw` pointer that the slot (or the caller) no longer refers to.
    release(unsafe { Box::from_raw(to_pool.as_ptr()) });
}

/// Adds `reg` (owned by a guard or an in-place enter, not by the slot) to `LENT`; the first registration lent
/// since the list was last freed makes the list and arms `reap` for this thread.
#[cold]
fn lend(reg: NonNull<Registration>) {
    let _ = LENT.try_with(|l| {
        if l.get().is_null() {
            l.set(Box::into_raw(Box::default()));
            arm_reaper();
        }
        // SAFETY: a non-null `LENT` is an owned `Box::into_raw` list that only this thread reaches, and nothing
        // else borrows it now (`lend`, `unlend` and `reap` hold no reference across calls).
        unsafe { &mut *l.get() }.push(reg);
    });
}

/// Removes `reg` from `LENT` if it is there (a guard of it came back after all).
fn unlend(reg: NonNull<Registration>) {
    let _ = LENT.try_with(|l| {
        // SAFETY: as in `lend`.
        if let Some(lent) = unsafe { l.get().as_mut() } {
            // From the end: a nested guard usually comes back before the ones lent earlier.
            if let Some(at) = lent.iter().rposition(|&r| r == reg) {
                lent.swap_remove(at);
            }
        }
    });
}

/// The process's pthread key whose destructor is `reap` (made on first use; `None` if the C library had no key
/// left, and then lent registrations of forgotten guards leak as they did before).
fn reaper_key() -> Option<libc::pthread_key_t> {
    static KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> = std::sync::OnceLock::new();
    *KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is a valid out-pointer and `reap` an `extern "C"` destructor for the key's values.
        (unsafe { libc::pthread_key_create(&mut key, Some(reap)) } == 0).then_some(key)
    })
}

/// For fork's prepare handler (design.md §12.2): makes the reaper's key now, or waits for the thread making it,
/// so that a child never inherits the `OnceLock` half-initialised (its first lend would wait for ever).
pub(crate) fn finish_reaper_key() {
    reaper_key();
}

/// Makes the C library run `reap` when this thread exits (a non-null value for the key).
fn arm_reaper() {
    if let Some(key) = reaper_key() {
        // SAFETY: any pointer may be stored; `reap` never dereferences it. Failure (ENOMEM) leaves `reap` unarmed:
        // forgotten guards' registrations then leak, as they did before.
        let _ = unsafe { libc::pthread_setspecific(key, NonNull::<u8>::dangling().as_ptr().cast()) };
    }
}

/// Thread exit, after the thread's thread-local destructors (the C library runs pthread-key destructors after
/// them: glibc's `__call_tls_dtors` comes before `__nptl_deallocate_tsd`): every registration still in `LENT`
/// belongs to a guard passed to `mem::forget`, since a guard held by a thread-local was dropped by its destructor
/// by now. Drop each: `Registration`'s drop gives back what the guard held (design.md §4.6) and unregisters it.
/// If the slot is not closed yet, `Closer` has not run (a C library that runs key destructors first, or interleaves
/// them): ask for another round.
extern "C" fn reap(_: *mut libc::c_void) {
    if PARKED.try_with(|p| p.id.get() != CLOSED_ID).unwrap_or(false) {
        return arm_reaper();
    }
    let lent = LENT.try_with(|l| l.replace(ptr::null_mut())).unwrap_or(ptr::null_mut());
    if lent.is_null() {
        return;
    }
    // SAFETY: a non-null `LENT` is an owned `Box::into_raw` list; `LENT` no longer refers to it.
    let lent = unsafe { Box::from_raw(lent) };
    for reg in *lent {
        // SAFETY: a lent registration is an owned `Box::into_raw` pointer; its guard never ran its drop (it would
        // have taken it out of `LENT`), and never will: every thread-local that could hold it is destroyed, a guard
        // cannot leave its thread (`!Send`), and `Group::enter` forbids unsafe code to keep one alive past this.
        drop(unsafe { Box::from_raw(reg.as_ptr()) });
    }
}

/// Puts a registration in the calling thread's pool; drops (unregisters) it if the pool is gone or its group is
/// abandoned.
#[cold]
fn release(reg: Box<Registration>) {
    if reg.group().is_abandoned() {
        return drop(reg);
    }
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

/// Runs `f` with a CID of `group`, entering the thread's parked registration in place: no guard object and no
/// thread-view update (`f` is the library's own code, which never reads `mmcid::current()`), which is what makes
/// `ShardedCounter::add` a few ns. Exits even if `f` panics (I7).
#[inline(always)]
pub(crate) fn with_cid<R>(group: &Group, f: impl FnOnce(usize) -> R) -> R {
    let inside = InPlace::enter(take(group), group.id());
    f(inside.entered.cid() as usize)
}

/// An in-place enter of a registration taken with `take`, whose drop exits and gives the registration back.
struct InPlace {
    reg: NonNull<Registration>,
    entered: Entered,
    id: u64,
}

impl InPlace {
    #[inline(always)]
    fn enter(reg: NonNull<Registration>, id: u64) -> InPlace {
        // SAFETY: `take` handed us ownership of a live `Box::into_raw` pointer; nothing else refers to it.
        let entered = unsafe { &mut *reg.as_ptr() }.enter_raw();
        InPlace { reg, entered, id }
    }
}

impl Drop for InPlace {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: as in `enter`: we own the pointer until `give_back` below.
        unsafe { &mut *self.reg.as_ptr() }.exit_raw(self.entered);
        give_back(self.reg, self.id);
    }
}

/// Drops the calling thread's idle registrations of `group` (they would otherwise live until thread exit).
pub(crate) fn forget(group: &Group) -> usize {
    let id = group.id();
    let parked = unpark(id).map(|reg| {
        // SAFETY: `unpark` handed us ownership of the `Box::into_raw` pointer.
        drop(unsafe { Box::from_raw(reg.as_ptr()) });
    });
    let regs = POOL
        .try_with(|pool| {
            let mut pool = pool.try_borrow_mut().ok()?;
            let at = pool.iter().position(|(g, _)| *g == id)?;
            Some(pool.swap_remove(at).1)
        })
        .ok()
        .flatten()
        .unwrap_or_default();
    let n = regs.len() + parked.is_some() as usize;
    drop(regs);
    n
}

impl Group {
    /// Enters the group from the calling thread without managing a registration: the thread is registered on
    /// first use and unregistered when it exits (I7).
    ///
    /// Cost: a thread-local compare and two stores on top of [`Registration::enter`] while the thread keeps using
    /// one group (its registration stays parked in a thread-local slot): about 54 instructions per enter+exit
    /// against 28 for the explicit API (docs/benchmarks.md); the first call on a thread also registers it, and a
    /// thread alternating between groups on every call takes a pooled path (~100 instructions more). The thread's
    /// registration stays registered (it counts in [`Group::users`]) until the thread exits, calls
    /// [`Group::leave_thread`], or, once every handle of the group is dropped, next uses another group. Nested
    /// calls on one thread get distinct CIDs (a second registration is made).
    ///
    /// "Thread exit" means the thread's thread-local destructors: a thread of [`std::thread::scope`] may still be
    /// running them after the scope returns (join its handle, or call [`Group::leave_thread`] at the end of its
    /// closure, to count on [`Group::users`] right after).
    ///
    /// A guard passed to [`std::mem::forget`] keeps its CID and its registration until the thread exits, which
    /// gives both back after the thread's thread-local destructors (a guard a thread-local holds may be dropped in
    /// its destructor as usual); the thread's later calls use another registration. Unsafe code must not keep a
    /// guard alive past that point (in a value under a `pthread_key_create` key, say): it is taken for a forgotten
    /// one.
    ///
    /// Not for signal handlers or a `#[global_allocator]`: a thread's first call allocates its registration, and
    /// a handler that interrupts the thread inside this layer (this call, a guard's drop, [`Group::leave_thread`],
    /// `ShardedCounter::add` or `sub`) reaches the same thread-local slot and pool as the interrupted call, so it
    /// could free or alias the registration that call is using: undefined behaviour, which installing a handler
    /// (an `unsafe` call) makes the installer's responsibility. Give those a [`Registration`] of their own and use
    /// [`Registration::enter`].
    ///
    /// # Panics
    ///
    /// If the thread needs a new registration (first call, or nested calls) and the group already has its maximum
    /// (about a million, [`Group::try_register`]).
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let outer = group.enter();
    /// let inner = group.enter();
    /// assert_ne!(outer.cid(), inner.cid());
    /// ```
    #[inline(always)]
    pub fn enter(&self) -> crate::CidGuard<'static> {
        let reg = take(self);
        // SAFETY: `take` hands us ownership of a live `Box::into_raw` pointer; nothing else refers to it. Nothing
        // can unwind between here and the guard that takes ownership: `enter_raw` runs no user code, allocates
        // nothing, and its only panics are unreachable invariant checks (allocation of a CID spins, never
        // fails); an unwind there would leak the registration, nothing worse.
        let entered = unsafe { &mut *reg.as_ptr() }.enter_raw();
        crate::CidGuard::pooled(reg, entered)
    }

    /// Unregisters the calling thread's pooled registrations of this group now instead of at thread exit;
    /// returns how many there were. A guard of [`Group::enter`] still live on the thread keeps its registration,
    /// which goes back to the layer when the guard drops: call this after dropping them. Not for signal handlers (see
    /// [`Group::enter`]).
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// drop(group.enter());
    /// let live = group.enter();
    /// assert_eq!(group.leave_thread(), 0); // the one registration is in use by `live`
    /// drop(live);
    /// assert_eq!(group.leave_thread(), 1);
    /// assert_eq!(group.users(), 0);
    /// ```
    pub fn leave_thread(&self) -> usize {
        forget(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A group dropped by user code while its registration is parked here is freed at the thread's next use of
    /// another group (review L1: before, every such group lived until thread exit).
    #[test]
    fn abandoned_groups_are_freed_at_the_next_slow_call() {
        std::thread::spawn(|| {
            let mut weaks = Vec::new();
            for i in 0..200 {
                let group = Group::new();
                weaks.push(Arc::downgrade(&group.inner));
                let counter = crate::ShardedCounter::new(&group);
                counter.add(i);
                drop(group.enter());
                assert_eq!(counter.sum(), i);
            }
            // Each new group's first call evicted the previous one's parked registration and dropped it: only the
            // last group is still alive, parked in the slot.
            let alive = weaks.iter().filter(|w| w.upgrade().is_some()).count();
            assert_eq!(alive, 1, "abandoned groups kept alive by the thread-local layer");
        })
        .join()
        .unwrap();
    }

    /// Pool entries of dead groups do not pile up: an entry emptied by a take goes at the next take, with those of
    /// abandoned groups, so 100 short-lived groups leave at most two.
    #[test]
    fn pool_entries_do_not_pile_up() {
        std::thread::spawn(|| {
            let x = Group::new();
            for _ in 0..100 {
                let t = Group::new();
                drop(t.enter());
                drop(x.enter());
                drop(t.enter());
            }
            let entries = POOL.with(|pool| pool.borrow().len());
            assert!(entries <= 2, "{entries} pool entries after 100 short-lived groups");
        })
        .join()
        .unwrap();
    }

    /// The registrations `LENT` holds, in order.
    fn lent() -> Vec<*mut Registration> {
        // SAFETY: as in `lend`: nothing else borrows the list during this read.
        LENT.with(|l| unsafe { l.get().as_ref() }.map(|l| l.iter().map(|r| r.as_ptr()).collect()).unwrap_or_default())
    }

    /// After a `Group::enter` guard passed to `mem::forget` (design.md §9.1.1), the thread's next enter takes the slot
    /// for a new registration, which its guard's drop parks: later enters are the fast path again (before, the slot
    /// stayed "in use" for ever and every enter went to the pool). The forgotten guard's registration waits in
    /// `LENT`, as does the registration of a live outer guard while a nested enter runs, which comes back out.
    #[test]
    fn a_forgotten_guard_leaves_the_slot_to_another_registration() {
        std::thread::spawn(|| {
            let group = Group::new();
            std::mem::forget(group.enter());
            let forgotten = PARKED.with(|p| p.reg.get());
            assert!(lent().is_empty());
            drop(group.enter());
            let (id, parked) = PARKED.with(|p| (p.id.get(), p.reg.get()));
            assert_eq!(id, group.id(), "a registration is parked again: the next enter is the fast path");
            assert_ne!(parked, forgotten);
            assert_eq!(lent(), [forgotten]);
            for _ in 0..10 {
                drop(group.enter());
                assert_eq!(PARKED.with(|p| (p.id.get(), p.reg.get())), (group.id(), parked));
            }
            let outer = group.enter();
            let inner = group.enter();
            assert_eq!(lent(), [forgotten, parked], "the outer guard's registration, while the inner one runs");
            drop(inner);
            drop(outer);
            assert_eq!(lent(), [forgotten], "given back");
            assert_eq!(group.users(), 3);
        })
        .join()
        .unwrap();
    }

    /// A group that user code still holds keeps its registration pooled while the thread uses another group.
    #[test]
    fn live_groups_keep_their_pooled_registration() {
        std::thread::spawn(|| {
            let (a, b) = (Group::new(), Group::new());
            drop(a.enter());
            drop(b.enter()); // evicts a's registration to the pool
            assert_eq!(a.users(), 1, "a's registration was dropped while a is alive");
            drop(a.enter()); // and takes it back
            assert_eq!(a.users(), 1);
            // A clone made from a registration's handle counts too.
            let mut reg = a.register();
            let handle = reg.group().clone();
            drop(reg.enter());
            drop((a, reg));
            drop(b.enter());
            assert_eq!(handle.users(), 1, "the registration parked for `a` must survive while `handle` lives");
        })
        .join()
        .unwrap();
    }
}
