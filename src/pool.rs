//! `Pool<T>`: a per-CID object cache, the magazine layer of Bonwick and Adams indexed by CID (design.md §13).
//!
//! # Layout
//!
//! Every CID that used the pool has a [`Slot`] (a [`SharedPerCid`] shard, allocated on the CID's first use) with
//! two magazines, `loaded` and `previous`: vectors of at most `magazine_size` boxed objects. Behind them is one
//! depot, a `Mutex` holding full (non-empty) and empty magazines, at most `depot_limit` of each.
//!
//! * **Hot path.** A take pops from `loaded`, a put pushes onto it: plain vector code on memory that only the
//!   holder of the slot's CID touches (I1), handed from holder to holder by the CID's own release/acquire (I8). No
//!   atomic read-modify-write; one Relaxed load and store keep the slot's object count for [`Pool::stats`].
//! * **Magazine exchange** (once per `magazine_size` objects). `loaded` empty: swap with `previous` if that has
//!   objects, else trade an empty magazine for a full one at the depot, else call the factory (a miss). `loaded`
//!   full: swap with `previous` if that has room, else trade the full `previous` for an empty one at the depot
//!   (or a fresh allocation), else (depot at its limit) drop the object.
//! * **Nobody waits for the depot.** Its lock is only ever tried (a few spins): a thread that cannot get it takes
//!   the path of a depot with nothing to give (a miss, or a drop). So a holder preempted inside the lock delays
//!   nobody, and a child process that inherited the lock held (`fork` while another thread held it) still works,
//!   with its magazines and the factory.
//! * **Reclaim.** A CID whose bit is clear in the group's bitmap has no owner: no guard holds it and none can
//!   until someone takes it. [`Pool::trim`] (and a take that finds nothing in its magazines nor in the depot,
//!   before it calls the factory) claims such a CID in the bitmap itself, exactly as a temporary guard
//!   would, moves its magazines to the depot (what does not fit is dropped), and gives the CID back. The claim's
//!   Acquire pairs with the last holder's Release, so the magazines are exclusively the reclaimer's and their
//!   contents visible; its release pairs with the next holder's acquire.

use crate::mutants::{Knob, Mutant};
use crate::percid::SharedPerCid;
use crate::sync::{spin_loop, AtomicUsize, Mutex, Ordering::Relaxed, UnsafeCell};
use crate::{CidGuard, Error, Group};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::mem::{self, ManuallyDrop};
use std::ops::{Deref, DerefMut};

/// Default objects per magazine ([`PoolBuilder::magazine_size`]).
const DEFAULT_MAGAZINE_SIZE: usize = 32;
/// Largest accepted `magazine_size`: 64 Ki pointers, 512 KiB per magazine.
const MAX_MAGAZINE_SIZE: usize = 1 << 16;
/// Largest accepted `depot_limit` (magazines).
const MAX_DEPOT_LIMIT: usize = 1 << 20;
/// Tries at the depot lock before a thread takes the path of an empty (take) or full (put) depot.
#[cfg(not(loom))]
const DEPOT_TRIES: u32 = 64;
#[cfg(loom)]
const DEPOT_TRIES: u32 = 2;

/// A magazine: at most its capacity (`magazine_size`) boxed objects; capacity 0 while not allocated.
type Magazine<T> = Vec<Box<T>>;

/// One CID's magazines.
struct Mags<T> {
    loaded: Magazine<T>,
    previous: Magazine<T>,
}

/// One CID's shard: its magazines, reached only by the holder of the CID (a guard, or a reclaim's claim).
struct Slot<T> {
    mags: UnsafeCell<Mags<T>>,
    /// Objects in `mags`, kept by the holder with a Relaxed load and store (never a read-modify-write): a snapshot
    /// for `stats`, and a reclaim's hint of which idle slots are worth a claim.
    cached: AtomicUsize,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot { mags: UnsafeCell::new(Mags { loaded: Vec::new(), previous: Vec::new() }), cached: AtomicUsize::new(0) }
    }
}

// SAFETY: the magazines are reached only by the holder of the slot's CID: a live guard of the pool's group (I1) or
// a reclaim that claimed the CID's bit; each hands the slot to the next with release/acquire (I8, `try_claim`).
// So a slot moves between threads but is never used by two at once, which needs only `T: Send` (the objects
// move). `cached` is an atomic.
unsafe impl<T: Send> Sync for Slot<T> {}

impl<T> Slot<T> {
    /// Runs `f` on the magazines.
    ///
    /// # Safety
    ///
    /// The caller holds the slot's CID for the whole call: a live guard of the pool's group carrying it, or a
    /// claim of its bit (`Pool::reclaim`), or `&mut Pool`. So no other thread reaches the magazines until the CID
    /// is released (I1), and its last holder's writes are visible (I8, or the claim's Acquire).
    #[inline(always)]
    unsafe fn with<R>(&self, f: impl FnOnce(&mut Mags<T>) -> R) -> R {
        // SAFETY: exclusive by the contract; the reference cannot outlive the closure's call.
        self.mags.with_mut(|m| f(unsafe { &mut *m }))
    }

    /// Sets the snapshot count. Only the CID's holder calls this.
    #[inline(always)]
    fn set_cached(&self, n: usize) {
        // Relaxed: a statistic and a hint; the magazines themselves are ordered by the CID hand-over.
        self.cached.store(n, Relaxed);
    }

    /// Adds `d` (wrapping) to the snapshot count: a load and a store, no read-modify-write (single writer).
    #[inline(always)]
    fn add_cached(&self, d: usize) {
        // Relaxed: as in `set_cached`.
        self.set_cached(self.cached.load(Relaxed).wrapping_add(d));
    }
}

/// The shared depot: full (non-empty) and empty magazines, at most `depot_limit` of each.
struct Depot<T> {
    full: Vec<Magazine<T>>,
    empty: Vec<Magazine<T>>,
    /// Objects in `full`.
    objects: usize,
}

/// Counters, on their own lines: written on slow paths only.
struct Counters {
    misses: AtomicUsize,
    created: AtomicUsize,
    dropped: AtomicUsize,
    depot_trips: AtomicUsize,
    depot_busy: AtomicUsize,
    magazines: AtomicUsize,
    reclaimed: AtomicUsize,
    /// Snapshots of the depot's state, stored under its lock so `stats` never takes it.
    depot_full: AtomicUsize,
    depot_empty: AtomicUsize,
    depot_objects: AtomicUsize,
    /// 1 while a take runs an opportunistic reclaim (one at a time; a try-flag, nobody waits).
    reclaiming: AtomicUsize,
}

impl Counters {
    fn new() -> Self {
        let z = || AtomicUsize::new(0);
        Counters {
            misses: z(),
            created: z(),
            dropped: z(),
            depot_trips: z(),
            depot_busy: z(),
            magazines: z(),
            reclaimed: z(),
            depot_full: z(),
            depot_empty: z(),
            depot_objects: z(),
            reclaiming: z(),
        }
    }

    #[inline]
    fn bump(c: &AtomicUsize, n: usize) {
        // Relaxed: statistics; nothing is published through them.
        c.fetch_add(n, Relaxed);
    }
}

type Factory<T> = Box<dyn Fn() -> T + Send + Sync>;
type Reset<T> = Box<dyn Fn(&mut T) + Send + Sync>;

/// A per-CID object cache: objects made by a factory, kept in per-CID magazines in front of a shared depot, so a
/// get and a put are plain vector operations on the guard's own magazine (no atomic read-modify-write, no lock),
/// as in a thread-local cache, while the memory follows the CIDs in use (about the cores the group runs on), not
/// the threads.
///
/// Use it for objects that are expensive to make or large to keep per thread: buffers, scratch vectors, parsed
/// state, connections' work areas. [`Pool::get`] enters the group through the thread-local layer
/// ([`Group::enter`]) and gives a [`Pooled`] handle that puts the object back when dropped; [`Pool::take`] and
/// [`Pool::put`] work under a guard the caller already holds (a loop that does more per-CID work under one guard
/// saves the enter). Objects may be put back on another thread and under another CID than they were taken on:
/// magazines move between CIDs through the depot, about once per `magazine_size` objects.
///
/// Memory is bounded: each CID keeps at most two magazines, the depot at most [`PoolBuilder::depot_limit`] full
/// ones (a put beyond drops the object), and the magazines of CIDs nobody owns any more go back to the depot
/// ([`Pool::trim`], and opportunistically on misses). Design and argument: design.md §13.
///
/// When not to use it: for objects cheaper than the allocator's fast path (a small `Box`), or where one thread
/// makes and drops every object (a plain `Vec` is simpler). A [`CidGuard`] is not `Send`: across an `.await` hold
/// objects (a [`Pooled`] is `Send` when `T` is), never guards.
///
/// ```
/// use mmcid::{Group, Pool};
///
/// let group = Group::new();
/// let buffers = Pool::builder(&group, || Vec::<u8>::with_capacity(4096))
///     .reset(|v| v.clear())                                  // runs when an object comes back
///     .build()?;
/// std::thread::scope(|s| {
///     for t in 0..4u8 {
///         let buffers = &buffers;
///         s.spawn(move || {
///             let mut buf = buffers.get();                   // from this CID's magazine, or the factory
///             buf.extend_from_slice(&[t; 100]);
///         });                                                // back into the magazine here
///     }
/// });
/// let stats = buffers.stats();
/// assert_eq!(stats.live(), 0);                               // every object is back
/// assert!(stats.created <= 4);
/// # Ok::<(), mmcid::Error>(())
/// ```
///
/// `Send + Sync` when `T: Send` (objects move between threads, none is shared), like `Mutex<T>`:
///
/// ```
/// fn shared<X: Send + Sync>() {}
/// shared::<mmcid::Pool<std::cell::Cell<u64>>>();
/// ```
///
/// ```compile_fail,E0277
/// let group = mmcid::Group::new();
/// let pool = mmcid::Pool::new(&group, || std::rc::Rc::new(0)); // not Send: cannot move between threads
/// ```
pub struct Pool<T: Send + 'static> {
    slots: SharedPerCid<Slot<T>>,
    depot: Mutex<Depot<T>>,
    counters: CachePadded<Counters>,
    factory: Factory<T>,
    reset: Option<Reset<T>>,
    magazine_size: usize,
    depot_limit: usize,
    /// `group.id()`, here so that a guard is checked without following the group's pointer.
    group_id: u64,
    group: Group,
    knob: Knob,
}

/// Builds a [`Pool`] with a reset hook, a magazine size or a depot limit other than the defaults.
///
/// ```
/// let group = mmcid::Group::new();
/// let pool = mmcid::Pool::builder(&group, || [0u8; 64]).magazine_size(16).depot_limit(8).build()?;
/// assert_eq!(pool.magazine_size(), 16);
/// let err = mmcid::Pool::builder(&group, || 0u32).magazine_size(0).build().unwrap_err();
/// assert_eq!(err.to_string(), "magazine_size is 0, outside the accepted range 1..=65536");
/// # Ok::<(), mmcid::Error>(())
/// ```
#[must_use]
pub struct PoolBuilder<T: Send + 'static> {
    group: Group,
    factory: Factory<T>,
    reset: Option<Reset<T>>,
    magazine_size: usize,
    depot_limit: Option<usize>,
}

/// An object taken from a [`Pool`] by [`Pool::get`]; dropping it puts the object back (through
/// [`Group::enter`], on whichever thread drops it). [`Pooled::into_box`] keeps the object instead.
///
/// `Send` when `T` is: unlike a guard, it may be held across an `.await` or moved to another thread.
///
/// ```
/// let group = mmcid::Group::new();
/// let pool = mmcid::Pool::new(&group, || String::with_capacity(64));
/// let mut s = pool.get();
/// s.push_str("hello");
/// std::thread::scope(|sc| {
///     sc.spawn(move || assert_eq!(*s, "hello")); // dropped, and put back, on another thread
/// });
/// assert_eq!(pool.stats().cached, 1);
/// ```
pub struct Pooled<'a, T: Send + 'static> {
    pool: &'a Pool<T>,
    obj: ManuallyDrop<Box<T>>,
}

/// A snapshot of a [`Pool`]'s state and counters ([`Pool::stats`]). Each field is read on its own, with no
/// lock, so a snapshot taken while other threads use the pool may be off by what they did meanwhile; at
/// quiescence `created == dropped + cached + live` ([`PoolStats::live`]) for a pool that only gets back its own
/// objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PoolStats {
    /// Objects cached: in the CIDs' magazines and in the depot.
    pub cached: usize,
    /// CIDs with a slot (their magazines; allocated on a CID's first use, kept until the pool drops).
    pub slots: usize,
    /// Magazines allocated (each holds up to `magazine_size` pointers), in slots and in the depot.
    pub magazines: usize,
    /// Full (non-empty) magazines in the depot.
    pub depot_full: usize,
    /// Empty magazines in the depot.
    pub depot_empty: usize,
    /// Objects in the depot's full magazines.
    pub depot_objects: usize,
    /// Magazine exchanges with the depot (one per `magazine_size` objects or so).
    pub depot_trips: u64,
    /// Depot visits given up because its lock stayed busy (the take missed, or the put dropped its object).
    pub depot_busy: u64,
    /// Takes that found nothing to take and called the factory (including calls that panicked).
    pub misses: u64,
    /// Objects the factory made.
    pub created: u64,
    /// Objects the pool dropped: beyond the depot limit, by [`Pool::trim`], after a panic in the reset hook, or
    /// handed to [`Pool::try_put`] with a foreign guard.
    pub dropped: u64,
    /// Magazines moved out of the slots of CIDs nobody owned (by [`Pool::trim`] or a take's reclaim).
    pub reclaimed: u64,
}

impl PoolStats {
    /// Objects handed out and not back yet: `created - dropped - cached` (0 if objects that the factory did not
    /// make were put in).
    pub fn live(&self) -> u64 {
        self.created.saturating_sub(self.dropped).saturating_sub(self.cached as u64)
    }
}

impl<T: Send + 'static> Pool<T> {
    /// A pool for the guards of `group` whose objects `factory` makes, with the default magazine size (32) and
    /// depot limit (twice the group's cores, at least 8). Allocates no magazine.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let pool = mmcid::Pool::new(&group, || vec![0u64; 16]);
    /// assert_eq!(pool.get().len(), 16);
    /// ```
    pub fn new(group: &Group, factory: impl Fn() -> T + Send + Sync + 'static) -> Pool<T> {
        match Pool::builder(group, factory).build() {
            Ok(pool) => pool,
            Err(e) => unreachable!("the default settings are valid: {e}"),
        }
    }

    /// A builder for a pool of `group` whose objects `factory` makes.
    pub fn builder(group: &Group, factory: impl Fn() -> T + Send + Sync + 'static) -> PoolBuilder<T> {
        PoolBuilder {
            group: group.clone(),
            factory: Box::new(factory),
            reset: None,
            magazine_size: DEFAULT_MAGAZINE_SIZE,
            depot_limit: None,
        }
    }

    /// The group whose guards index this pool.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Objects per magazine.
    pub fn magazine_size(&self) -> usize {
        self.magazine_size
    }

    /// The most full magazines (and the most empty ones) the depot keeps.
    pub fn depot_limit(&self) -> usize {
        self.depot_limit
    }

    /// An object, from the magazine of the CID the calling thread enters with ([`Group::enter`]), or from the
    /// depot, or new from the factory. Dropping the handle puts it back.
    ///
    /// # Panics
    ///
    /// If the factory panics (the pool is unchanged, only [`PoolStats::misses`] counts the call), or if
    /// [`Group::enter`] does (a group at its maximum registrations).
    #[cfg(not(loom))]
    #[inline]
    pub fn get(&self) -> Pooled<'_, T> {
        // The thread's parked registration, entered in place for the take only: no guard, no view of the CID.
        let obj = crate::local::with_cid(&self.group, |cid| self.take_at(cid));
        Pooled { pool: self, obj: ManuallyDrop::new(obj) }
    }

    /// An object, under a guard of the pool's group that the caller holds.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let pool = mmcid::Pool::new(&group, || 7u32);
    /// let mut reg = group.register();
    /// let mut guard = reg.enter();
    /// let obj = pool.take(&mut guard);
    /// assert_eq!(*obj, 7);
    /// pool.put(&mut guard, obj);
    /// assert_eq!(pool.stats().cached, 1);
    /// ```
    ///
    /// # Panics
    ///
    /// If the guard belongs to another group (as [`PerCid::get_mut`](crate::PerCid::get_mut) does;
    /// [`Pool::try_take`] returns [`Error::ForeignGuard`] instead), or if the factory panics.
    #[inline]
    pub fn take(&self, guard: &mut CidGuard<'_>) -> Box<T> {
        match self.try_take(guard) {
            Ok(obj) => obj,
            Err(e) => foreign(e),
        }
    }

    /// Like [`Pool::take`], returning [`Error::ForeignGuard`] for a guard of another group.
    ///
    /// ```
    /// let (ours, theirs) = (mmcid::Group::new(), mmcid::Group::new());
    /// let pool = mmcid::Pool::new(&ours, || 0u8);
    /// let mut reg = theirs.register();
    /// assert_eq!(pool.try_take(&mut reg.enter()).unwrap_err(), mmcid::Error::ForeignGuard);
    /// ```
    #[inline]
    pub fn try_take(&self, guard: &mut CidGuard<'_>) -> Result<Box<T>, Error> {
        if guard.group_id() != self.group_id {
            return Err(Error::ForeignGuard);
        }
        Ok(self.take_at(guard.cid().get()))
    }

    /// Puts `obj` back under a guard of the pool's group that the caller holds: into this CID's magazine, which
    /// need not be the one it was taken from. Runs the reset hook first. Any `Box<T>` may be put, also one the
    /// factory did not make.
    ///
    /// # Panics
    ///
    /// If the guard belongs to another group ([`Pool::try_put`] returns [`Error::ForeignGuard`] instead), or if
    /// the reset hook panics (the object is dropped and counted in [`PoolStats::dropped`]; the magazines are
    /// untouched).
    #[inline]
    pub fn put(&self, guard: &mut CidGuard<'_>, obj: Box<T>) {
        if let Err(e) = self.try_put(guard, obj) {
            foreign(e)
        }
    }

    /// Like [`Pool::put`], returning [`Error::ForeignGuard`] for a guard of another group; the object is then
    /// dropped (and counted in [`PoolStats::dropped`]).
    #[inline]
    pub fn try_put(&self, guard: &mut CidGuard<'_>, obj: Box<T>) -> Result<(), Error> {
        if guard.group_id() != self.group_id {
            self.discard(obj);
            return Err(Error::ForeignGuard);
        }
        self.put_at(guard.cid().get(), obj);
        Ok(())
    }

    /// Moves the magazines of every CID that nobody owns now (no registration, core or guard holds it: the
    /// group converged below it, its threads exited, or it was a temporary) to the depot, drops what does not fit
    /// under the depot limit, and frees the depot's empty magazines. Returns the objects dropped.
    ///
    /// Slots themselves stay (a pointer-sized slot per CID ever used, as in [`PerCid`](crate::PerCid)); the
    /// magazines of CIDs still owned (a parked thread's, an idle core's in per-CPU mode) stay with their CID.
    /// Never waits: a CID taken meanwhile, or a depot lock held by another thread, is skipped.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let pool = mmcid::Pool::builder(&group, || 0u64).magazine_size(4).depot_limit(0).build()?;
    /// {
    ///     let mut reg = group.register();
    ///     let mut guard = reg.enter();
    ///     let objs: Vec<_> = (0..3).map(|_| pool.take(&mut guard)).collect();
    ///     objs.into_iter().for_each(|o| pool.put(&mut guard, o));
    /// } // the registration's CID is free again
    /// assert_eq!(pool.stats().cached, 3);
    /// assert_eq!(pool.trim(), 3);            // depot limit 0: nothing kept
    /// assert_eq!(pool.stats().cached, 0);
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    pub fn trim(&self) -> usize {
        let mut freed = 0;
        for (cid, slot) in self.slots.iter() {
            let cid = cid.get();
            freed += self.reclaim(cid, slot, false);
        }
        if let Some(mut depot) = self.depot() {
            let empties = mem::take(&mut depot.empty);
            self.note_depot(&depot);
            drop(depot);
            freed += self.free_magazines(empties);
        }
        freed
    }

    /// A snapshot of the pool's state and counters; takes no lock.
    pub fn stats(&self) -> PoolStats {
        let c = &*self.counters;
        // Relaxed (every load here): statistics, each read on its own (see `PoolStats`).
        let in_slots: usize = self.slots.iter().map(|(_, s)| s.cached.load(Relaxed)).sum();
        let depot_objects = c.depot_objects.load(Relaxed);
        PoolStats {
            cached: in_slots + depot_objects,
            slots: self.slots.shards_allocated(),
            magazines: c.magazines.load(Relaxed),
            depot_full: c.depot_full.load(Relaxed),
            depot_empty: c.depot_empty.load(Relaxed),
            depot_objects,
            depot_trips: c.depot_trips.load(Relaxed) as u64,
            depot_busy: c.depot_busy.load(Relaxed) as u64,
            misses: c.misses.load(Relaxed) as u64,
            created: c.created.load(Relaxed) as u64,
            dropped: c.dropped.load(Relaxed) as u64,
            reclaimed: c.reclaimed.load(Relaxed) as u64,
        }
    }

    /// The hot take: pop from the loaded magazine of CID `cid`, which the caller holds (a live guard of this
    /// pool's group) for the whole call.
    #[inline]
    fn take_at(&self, cid: usize) -> Box<T> {
        let slot = self.slots.get_cid(cid);
        // SAFETY: the caller holds `cid` through a guard of this pool's group, so no other thread reaches this
        // slot's magazines until the guard drops (I1; a reclaim only claims a CID with no owner), and the last
        // holder's writes are visible (I8). No reference into the magazines outlives the closure, and no user
        // code runs inside it.
        let hit = unsafe { slot.with(|m| m.loaded.pop()) };
        match hit {
            Some(obj) => {
                slot.add_cached(usize::MAX); // −1
                obj
            }
            None => self.take_slow(slot),
        }
    }

    /// The hot put: reset, then push onto the loaded magazine of CID `cid`, held by the caller as in `take_at`.
    #[inline]
    fn put_at(&self, cid: usize, mut obj: Box<T>) {
        if let Some(reset) = &self.reset {
            self.run_reset(reset, &mut obj);
        }
        self.push_at(cid, obj);
    }

    /// `put_at` after the reset hook: the push itself.
    #[inline(always)]
    fn push_at(&self, cid: usize, obj: Box<T>) {
        let slot = self.slots.get_cid(cid);
        // SAFETY: as in `take_at`.
        let full = unsafe {
            slot.with(|m| {
                let loaded = &mut m.loaded;
                if loaded.len() < loaded.capacity() {
                    loaded.push(obj);
                    None
                } else {
                    Some(obj)
                }
            })
        };
        match full {
            None => slot.add_cached(1),
            Some(obj) => self.put_slow(slot, obj),
        }
    }

    /// `loaded` is empty: swap with `previous`, or trade at the depot, or reclaim, or call the factory.
    #[cold]
    #[inline(never)]
    fn take_slow(&self, slot: &Slot<T>) -> Box<T> {
        if let Some(obj) = self.exchange_full(slot) {
            return obj;
        }
        // Nothing here nor in the depot: before the factory, give back the magazines of CIDs nobody owns (their
        // threads exited, or the group converged below them), so objects stranded there are found again.
        if self.slots.shards_allocated() > 1 && self.reclaim_idle() {
            if let Some(obj) = self.exchange_full(slot) {
                return obj;
            }
        }
        Counters::bump(&self.counters.misses, 1);
        let obj = Box::new((self.factory)());
        Counters::bump(&self.counters.created, 1);
        obj
    }

    /// An object from `previous` or from a full magazine of the depot, if either has one. The caller holds the
    /// slot's CID.
    fn exchange_full(&self, slot: &Slot<T>) -> Option<Box<T>> {
        // SAFETY: as in `take_at`; the depot's lock is taken inside, but no user code runs.
        unsafe {
            slot.with(|m| {
                if !m.previous.is_empty() {
                    mem::swap(&mut m.loaded, &mut m.previous);
                } else {
                    let mut depot = self.depot()?;
                    let full = depot.full.pop()?;
                    depot.objects -= full.len();
                    // `loaded` and `previous` are both empty: `previous` goes back to the depot if it is allocated.
                    let spare = mem::replace(&mut m.previous, mem::replace(&mut m.loaded, full));
                    let extra = (spare.capacity() != 0).then_some(spare).and_then(|spare| {
                        if depot.empty.len() < self.depot_limit {
                            depot.empty.push(spare);
                            None
                        } else {
                            Some(spare)
                        }
                    });
                    self.note_depot(&depot);
                    drop(depot);
                    Counters::bump(&self.counters.depot_trips, 1);
                    self.free_magazines(extra); // empty: no user code
                }
                let obj = m.loaded.pop();
                slot.set_cached(m.loaded.len() + m.previous.len());
                obj
            })
        }
    }

    /// `loaded` is full (or not allocated yet): swap with `previous`, or trade the full `previous` at the depot,
    /// or drop the object.
    #[cold]
    #[inline(never)]
    fn put_slow(&self, slot: &Slot<T>, obj: Box<T>) {
        // SAFETY: as in `take_at`; no user code runs inside (the object, if refused, is dropped after).
        let refused = unsafe {
            slot.with(|m| {
                if m.previous.len() < m.previous.capacity() {
                    mem::swap(&mut m.loaded, &mut m.previous);
                } else {
                    let empty = if m.previous.capacity() == 0 {
                        None // no `previous` yet: `loaded` becomes it, no depot trip
                    } else {
                        // `previous` is full: it goes to the depot, which gives an empty one back if it has one.
                        let Some(mut depot) = self.depot() else { return Some(obj) };
                        if depot.full.len() >= self.depot_limit {
                            return Some(obj);
                        }
                        let full = mem::take(&mut m.previous);
                        depot.objects += full.len();
                        depot.full.push(full);
                        let empty = depot.empty.pop();
                        self.note_depot(&depot);
                        drop(depot);
                        Counters::bump(&self.counters.depot_trips, 1);
                        empty
                    };
                    let empty = empty.unwrap_or_else(|| self.new_magazine());
                    m.previous = mem::replace(&mut m.loaded, empty);
                }
                m.loaded.push(obj);
                slot.set_cached(m.loaded.len() + m.previous.len());
                None
            })
        };
        if let Some(obj) = refused {
            self.discard(obj);
        }
    }

    /// Reclaims the slots of CIDs that look idle with objects in them: a missing take's reclaim, one thread at a
    /// time (the others go on to the factory). Returns whether it moved any magazine to the depot. Costs a Relaxed
    /// load per slot, and a claim per idle slot with objects.
    #[cold]
    fn reclaim_idle(&self) -> bool {
        // Relaxed: a try-flag that keeps scans from piling up; it orders nothing (claims do).
        if self.counters.reclaiming.swap(1, Relaxed) != 0 {
            return false;
        }
        let before = self.counters.reclaimed.load(Relaxed);
        for (cid, slot) in self.slots.iter() {
            self.reclaim(cid.get(), slot, true);
        }
        self.counters.reclaiming.store(0, Relaxed);
        self.counters.reclaimed.load(Relaxed) != before
    }

    /// If CID `cid` has no owner, claims it, moves its magazines to the depot (what does not fit is freed) and
    /// gives it back. `hinted`: skip a slot whose snapshot count is 0. Returns the objects freed.
    fn reclaim(&self, cid: usize, slot: &Slot<T>, hinted: bool) -> usize {
        // Relaxed: a hint; the claim orders the magazines.
        if hinted && slot.cached.load(Relaxed) == 0 {
            return 0;
        }
        let bitmap = &self.group.inner.bitmap;
        let unclaimed = self.knob.is(Mutant::PoolReclaimUnclaimed);
        let claimed = if unclaimed {
            !bitmap.is_set(cid as u32)
        } else {
            bitmap.try_claim(cid as u32, self.knob.is(Mutant::RelaxedPoolClaim))
        };
        if !claimed {
            return 0;
        }
        let mut out: Vec<Magazine<T>> = Vec::new();
        if let Some(mut depot) = self.depot() {
            // SAFETY: we hold `cid` (claimed: no guard holds it until we clear its bit, and the Acquire claim made
            // its last holder's writes visible); no user code runs inside.
            let mags = unsafe { slot.with(|m| [mem::take(&mut m.loaded), mem::take(&mut m.previous)]) };
            slot.set_cached(0);
            for mag in mags {
                if mag.is_empty() {
                    if mag.capacity() != 0 && depot.empty.len() < self.depot_limit {
                        depot.empty.push(mag);
                    } else {
                        out.push(mag);
                    }
                } else if depot.full.len() < self.depot_limit {
                    depot.objects += mag.len();
                    depot.full.push(mag);
                    Counters::bump(&self.counters.reclaimed, 1);
                } else {
                    Counters::bump(&self.counters.reclaimed, 1);
                    out.push(mag);
                }
            }
            self.note_depot(&depot);
        }
        if !unclaimed {
            // Release (in `clear`): our magazine writes happen before the CID's next holder's accesses.
            bitmap.clear(cid as u32);
        }
        self.free_magazines(out)
    }

    /// The depot, if its lock can be had within a few tries (never waits for a holder).
    #[inline]
    fn depot(&self) -> Option<impl DerefMut<Target = Depot<T>> + '_> {
        for _ in 0..DEPOT_TRIES {
            if let Some(depot) = self.depot.try_lock() {
                return Some(depot);
            }
            spin_loop();
        }
        Counters::bump(&self.counters.depot_busy, 1);
        None
    }

    /// Stores the depot's snapshot counts; the caller holds its lock (the only writer).
    fn note_depot(&self, depot: &Depot<T>) {
        let c = &*self.counters;
        // Relaxed: snapshots for `stats`.
        c.depot_full.store(depot.full.len(), Relaxed);
        c.depot_empty.store(depot.empty.len(), Relaxed);
        c.depot_objects.store(depot.objects, Relaxed);
    }

    fn new_magazine(&self) -> Magazine<T> {
        Counters::bump(&self.counters.magazines, 1);
        Vec::with_capacity(self.magazine_size)
    }

    /// Frees magazines and their objects (user code: `T::drop`); returns the objects. Counters first, so a panicking
    /// `T::drop` leaves them right (the other objects are still dropped as the unwind goes on).
    fn free_magazines(&self, mags: impl IntoIterator<Item = Magazine<T>>) -> usize {
        let mags: Vec<Magazine<T>> = mags.into_iter().collect();
        let objects: usize = mags.iter().map(Vec::len).sum();
        let allocated = mags.iter().filter(|m| m.capacity() != 0).count();
        // Relaxed: a statistic.
        self.counters.magazines.fetch_sub(allocated, Relaxed);
        Counters::bump(&self.counters.dropped, objects);
        drop(mags);
        objects
    }

    /// Drops an object the pool will not keep.
    fn discard(&self, obj: Box<T>) {
        Counters::bump(&self.counters.dropped, 1);
        drop(obj);
    }

    /// Runs the reset hook; if it panics, the object (dropped by the caller's unwind) is counted as dropped.
    fn run_reset(&self, reset: &Reset<T>, obj: &mut T) {
        struct Unwinding<'a>(&'a AtomicUsize);
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                Counters::bump(self.0, 1);
            }
        }
        let bomb = Unwinding(&self.counters.dropped);
        reset(obj);
        mem::forget(bomb);
    }

    /// `Pooled::drop`: puts `obj` back through the thread-local layer. While the thread unwinds, a pool with a
    /// reset hook drops the object instead (a hook that panicked then would abort the process).
    #[cfg(not(loom))]
    #[inline(always)]
    fn put_local(&self, mut obj: Box<T>) {
        if let Some(reset) = &self.reset {
            if std::thread::panicking() {
                return self.discard(obj);
            }
            // Before the enter: user code runs holding no CID.
            self.run_reset(reset, &mut obj);
        }
        crate::local::with_cid(&self.group, |cid| self.push_at(cid, obj));
    }
}

impl<T: Send + 'static> PoolBuilder<T> {
    /// A hook run on every object put back (by [`Pool::put`] or a [`Pooled`]'s drop), before it is cached: clear
    /// a buffer, zero a secret. If it panics, the object is dropped and counted in [`PoolStats::dropped`].
    pub fn reset(mut self, f: impl Fn(&mut T) + Send + Sync + 'static) -> Self {
        self.reset = Some(Box::new(f));
        self
    }

    /// Objects per magazine: 1 to 65 536, default 32. A CID caches up to two magazines; a CID's depot trip
    /// happens about once per this many objects.
    pub fn magazine_size(mut self, n: usize) -> Self {
        self.magazine_size = n;
        self
    }

    /// The most full magazines the depot keeps (and the most empty ones): 0 to 1 048 576, default twice the
    /// group's cores, at least 8. With the CIDs' own two magazines this bounds the objects cached to
    /// `(2 · slots + depot_limit) · magazine_size`, and right after a [`Pool::trim`] at quiescence to
    /// `(2 · CIDs still owned + depot_limit) · magazine_size`.
    pub fn depot_limit(mut self, magazines: usize) -> Self {
        self.depot_limit = Some(magazines);
        self
    }

    /// The pool; [`Error::ValueOutOfRange`] naming the setting if one is out of range.
    pub fn build(self) -> Result<Pool<T>, Error> {
        let magazine_size = Error::check_range("magazine_size", self.magazine_size, 1, MAX_MAGAZINE_SIZE)?;
        let depot_limit = match self.depot_limit {
            Some(n) => Error::check_range("depot_limit", n, 0, MAX_DEPOT_LIMIT)?,
            None => (2 * self.group.cores()).max(8),
        };
        Ok(Pool {
            slots: SharedPerCid::new(&self.group),
            depot: Mutex::new(Depot { full: Vec::new(), empty: Vec::new(), objects: 0 }),
            counters: CachePadded::new(Counters::new()),
            factory: self.factory,
            reset: self.reset,
            magazine_size,
            depot_limit,
            group_id: self.group.id(),
            knob: self.group.inner.knob,
            group: self.group,
        })
    }
}

impl<T: Send + 'static> Drop for Pool<T> {
    /// Drops every cached object. Takes each magazine out first and drops them as one `Vec`, so a `T::drop` that
    /// panics cannot leak the others. Takes no lock (`&mut self`), so it also works on a depot lock that a forked
    /// child inherited held.
    fn drop(&mut self) {
        let mut all: Vec<Magazine<T>> = Vec::new();
        for (_, slot) in self.slots.iter_mut() {
            // SAFETY: `&mut self`: no guard can be using the pool's slots.
            let mags = unsafe { slot.with(|m| [mem::take(&mut m.loaded), mem::take(&mut m.previous)]) };
            all.extend(mags);
        }
        let depot = self.depot.get_mut();
        all.append(&mut depot.full);
        all.append(&mut depot.empty);
        drop(all);
    }
}

impl<'a, T: Send + 'static> Pooled<'a, T> {
    /// Keeps the object: it will not go back to the pool (put it back with [`Pool::put`] if you like).
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let pool = mmcid::Pool::new(&group, || 1u8);
    /// let kept: Box<u8> = pool.get().into_box();
    /// assert_eq!(pool.stats().live(), 1);
    /// drop(kept);
    /// ```
    pub fn into_box(self) -> Box<T> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so `obj` is taken exactly once.
        unsafe { ManuallyDrop::take(&mut this.obj) }
    }

    /// The pool the object goes back to.
    pub fn pool(&self) -> &'a Pool<T> {
        self.pool
    }
}

impl<T: Send + 'static> Deref for Pooled<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.obj
    }
}

impl<T: Send + 'static> DerefMut for Pooled<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        &mut self.obj
    }
}

impl<T: Send + 'static> Drop for Pooled<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here; `self.obj` is not used again.
        let obj = unsafe { ManuallyDrop::take(&mut self.obj) };
        #[cfg(not(loom))]
        self.pool.put_local(obj);
        #[cfg(loom)]
        self.pool.discard(obj);
    }
}

impl<T: Send + 'static> fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("magazine_size", &self.magazine_size)
            .field("depot_limit", &self.depot_limit)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> fmt::Debug for PoolBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuilder")
            .field("magazine_size", &self.magazine_size)
            .field("depot_limit", &self.depot_limit)
            .field("reset", &self.reset.is_some())
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static + fmt::Debug> fmt::Debug for Pooled<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Pooled").field(&**self.obj).finish()
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn foreign(e: Error) -> ! {
    panic!("{e}: a Pool can only be used with guards of the group it was made for")
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn one_cid_pool(magazine: usize, depot: usize) -> (Pool<u64>, crate::Registration) {
        let group = Group::builder().virtual_cpus(2).build().unwrap();
        let pool = Pool::builder(&group, || 7).magazine_size(magazine).depot_limit(depot).build().unwrap();
        let reg = group.register();
        (pool, reg)
    }

    /// The magazine state machine of design.md §13.2, step by step: a CID fills `loaded`, then `previous` (no depot
    /// trip), then trades its full `previous` at the depot; takes drain `loaded`, swap in `previous`, then trade
    /// at the depot; alternating at a magazine boundary stays off the depot.
    #[test]
    fn magazines_fill_swap_and_trade_at_the_depot() {
        let (pool, mut reg) = one_cid_pool(2, 4);
        let mut g = reg.enter();
        let objs: Vec<_> = (0..6).map(|_| pool.take(&mut g)).collect();
        assert_eq!(pool.stats().misses, 6);
        objs.into_iter().for_each(|o| pool.put(&mut g, o));
        // 2 in `loaded`, 2 in `previous`, then the full `previous` went to the depot once.
        let s = pool.stats();
        assert_eq!((s.cached, s.depot_full, s.depot_objects, s.depot_trips, s.magazines), (6, 1, 2, 1, 3), "{s:?}");
        let objs: Vec<_> = (0..6).map(|_| pool.take(&mut g)).collect();
        let s = pool.stats();
        // Drained `loaded`, swapped in `previous`, traded an empty magazine for the depot's full one.
        assert_eq!((s.misses, s.depot_full, s.depot_empty, s.depot_trips), (6, 0, 1, 2), "{s:?}");
        let mut objs = objs.into_iter();
        pool.put(&mut g, objs.next().unwrap());
        for _ in 0..100 {
            let o = pool.take(&mut g);
            pool.put(&mut g, o);
        }
        assert_eq!(pool.stats().depot_trips, 2, "no trip while the two magazines absorb the flow");
        objs.for_each(|o| pool.put(&mut g, o));
    }

    /// A depot lock that stays held (another thread preempted inside it, or a lock a forked child inherited held)
    /// delays nobody: takes miss and puts drop instead, `trim` skips the depot, and the pool still drops cleanly.
    #[test]
    fn a_held_depot_lock_blocks_nobody() {
        let (pool, mut reg) = one_cid_pool(1, 4);
        let mut g = reg.enter();
        let objs: Vec<_> = (0..3).map(|_| pool.take(&mut g)).collect();
        let held = pool.depot.lock();
        objs.into_iter().for_each(|o| pool.put(&mut g, o)); // the third needs the depot: dropped
        let s = pool.stats();
        assert_eq!((s.cached, s.dropped, s.depot_busy), (2, 1, 1), "{s:?}");
        let objs: Vec<_> = (0..3).map(|_| pool.take(&mut g)).collect(); // the third misses
        assert_eq!(pool.stats().misses, 4);
        assert_eq!(pool.trim(), 0);
        drop(g);
        objs.into_iter().for_each(|o| pool.put(&mut reg.enter(), o));
        mem::forget(held); // as in a child: the lock is never released
        drop(pool); // takes no lock
    }
}
