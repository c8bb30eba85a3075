//! `PerCid<T>`: one cache-padded `T` per CID, allocated on first use, exclusive inside a guard (I1 + I8); and
//! `SharedPerCid<T>`, the same table used only through shared references, readable while holders write.
//!
//! # Layout
//!
//! Shards are boxed one by one (`Box<CachePadded<T>>`) when a CID first asks for its shard, so memory follows the
//! CIDs really handed out, not the CPU count. The pointers to them live in segments of doubling length: segment
//! `s` holds the pointers of CIDs `64·(2^s − 1) .. 64·(2^(s+1) − 1)`, so 15 segments cover the hard CID bound
//! (`MAX_BITS`, I2) and a segment, once installed, never moves. Segment 0 (CIDs below 64, where CIDs stay in
//! steady state on machines of up to 64 allowed cores) lives inline in the `PerCid`, so a guard's shard is one
//! load away; the others are allocated when a CID of theirs is first used. A parallel set of segments holds the *visited*
//! bitmask: one bit per CID, set once the CID's shard exists, so a scan reads one word per 64 CIDs of the
//! segments in use and one pointer per visited shard, never a slot per possible CPU (the kernel's 2026
//! visited-CPU scan reduction).
//!
//! Segments are installed by CAS (the loser frees its allocation). A shard pointer is written only by the
//! thread whose guard carries that CID, so it is a plain Release store, never contended.
//!
//! # Why `get_mut(&self, &mut CidGuard) -> &mut T` is sound
//!
//! * The guard's CID is exclusive to it among the live guards of its group (I1), and [`PerCid::try_get_mut`]
//!   checks the guard belongs to the group the `PerCid` was made for, so no other thread can obtain a
//!   reference to the same shard through `get_mut` while the guard lives.
//! * The returned `&mut T` borrows the guard mutably, so it cannot outlive the guard (after which another thread
//!   may get the CID), and one guard cannot produce two live `&mut T` of one `PerCid`.
//! * The previous holder of the CID released it with a Release store and the guard took it with an Acquire
//!   (I8), so the previous holder's writes to the shard happen before ours: no atomics are needed inside.
//! * Every other way to reach a shard as a plain reference ([`PerCid::iter_mut`], `into_iter`, `clear`, `Drop`)
//!   takes `&mut self` or `self`, so it cannot run while any `get_mut` borrow is alive. `PerCid` has no shared
//!   view of all shards (an `iter(&self)` would alias the holders' `&mut T`). The shared-reference view is
//!   [`SharedPerCid`], a separate type that never hands out `&mut T` (its `get` borrows the guard shared, and its
//!   `iter` reads every shard at any time) and requires `T: Sync` for both.

use crate::bitmap::MAX_BITS;
use crate::mutants::{Knob, Mutant};
use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, Ordering::*};
use crate::{Cid, CidGuard, Error, Group};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::iter::FusedIterator;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// log2 of the first segment's length; 64 makes every visited word belong to exactly one segment.
const FIRST_SHIFT: u32 = 6;
/// Length of the first segment; segment `s` has `FIRST << s` slots.
const FIRST: usize = 1 << FIRST_SHIFT;
/// Segments needed to cover every CID a guard can carry (`< MAX_BITS`).
const SEGMENTS: usize = locate(MAX_BITS - 1).0 + 1;

/// `(segment, offset in segment)` of CID `cid`.
#[inline(always)]
const fn locate(cid: usize) -> (usize, usize) {
    let j = cid + FIRST;
    let s = (usize::BITS - 1 - j.leading_zeros() - FIRST_SHIFT) as usize;
    (s, j - (FIRST << s))
}

/// Slots in segment `s`.
const fn seg_len(s: usize) -> usize {
    FIRST << s
}

/// First CID of segment `s`.
const fn seg_base(s: usize) -> usize {
    (FIRST << s) - FIRST
}

/// Visited words in segment `s` (one bit per slot).
const fn words_len(s: usize) -> usize {
    seg_len(s) / 64
}

/// A shard slot: null until the CID's first use, then the shard, until drop.
type Slot<T> = AtomicPtr<CachePadded<T>>;

/// One `T` per CID of a [`Group`]: per-CPU style sharded data indexed by CID, sized by real concurrency.
///
/// Each shard is cache-padded ([`CachePadded`]: 128 bytes on x86_64 and aarch64, so neighbouring shards never
/// share a cache line or an adjacent-line prefetch pair) and allocated the first time a guard carrying its CID
/// asks for it; shards never move and are kept until the `PerCid` drops or is cleared. In steady state CIDs stay below
/// [`Group::max_cids`] (I2), so the shards are as many as the most CIDs in use at once while the data was used
/// — bounded by the group's cores — where thread-id keyed storage holds one per thread that ever touched it. A
/// thread descheduled inside its guard can make another take a temporary CID, which may add a shard beyond
/// `max_cids`; the hard bound is the group's CID space.
///
/// Access is through a guard: [`PerCid::get_mut`] gives `&mut T` for the guard's CID with no atomic operation
/// on `T`, because no other live guard of the group carries that CID (I1) and whatever its previous holder
/// wrote is visible (I8). Reading every shard ([`PerCid::iter_mut`], or by value through `IntoIterator`) needs
/// `&mut self` or `self`: it cannot overlap any guard's access. To read shards while other threads update theirs,
/// use a [`SharedPerCid`] (`T: Sync`, typically atomics), or a [`ShardedCounter`](crate::ShardedCounter) for a
/// plain total. [`PerCid::clear`] drops every shard.
///
/// `PerCid<T>` is `Send + Sync` when `T: Send`: shards are handed from thread to thread, never shared.
///
/// ```
/// use mmcid::{Group, PerCid};
///
/// let group = Group::new();
/// let mut lists: PerCid<Vec<u32>> = PerCid::new(&group);
/// std::thread::scope(|s| {
///     for t in 0..4 {
///         let (group, lists) = (&group, &lists);
///         s.spawn(move || {
///             let mut reg = group.register();
///             let mut guard = reg.enter();
///             lists.get_mut(&mut guard).push(t); // plain Vec push: the guard makes the shard ours
///         });
///     }
/// });
/// let mut all: Vec<u32> = lists.iter_mut().flat_map(|(_cid, v)| v.drain(..)).collect();
/// all.sort();
/// assert_eq!(all, [0, 1, 2, 3]);
/// assert!(lists.shards_allocated() <= 4 + group.cids_per_core() * group.cores()); // I2: users + K·cores
/// ```
///
/// # Several per-CID tables under one guard
///
/// Put the data in one struct and keep one `PerCid` of it: one [`get_mut`](PerCid::get_mut) then reaches all of
/// it, and each field is as exclusive as the whole.
///
/// ```
/// use mmcid::{Group, PerCid};
///
/// #[derive(Default)]
/// struct Stats {
///     requests: u64,
///     bytes: u64,
///     recent: Vec<u32>,
/// }
///
/// let group = Group::new();
/// let stats: PerCid<Stats> = PerCid::new(&group);
/// let mut reg = group.register();
/// let mut guard = reg.enter();
/// let s = stats.get_mut(&mut guard); // one shard, every table
/// s.requests += 1;
/// s.bytes += 512;
/// s.recent.push(200);
/// ```
///
/// Two `PerCid`s cannot be borrowed under one guard at once: `get_mut` borrows the guard mutably for as long as
/// the shard is used, because the guard is what proves the `&mut T` unique. If it took `&guard`, two calls on the
/// *same* `PerCid` would give two `&mut` to one shard, and the compiler cannot tell two tables from one. (Taking
/// the shards one after the other, each borrow ended before the next, does compile.)
///
/// ```compile_fail,E0499
/// let group = mmcid::Group::new();
/// let (requests, bytes): (mmcid::PerCid<u64>, mmcid::PerCid<u64>) =
///     (mmcid::PerCid::new(&group), mmcid::PerCid::new(&group));
/// let mut reg = group.register();
/// let mut guard = reg.enter();
/// let r = requests.get_mut(&mut guard);
/// let b = bytes.get_mut(&mut guard); // second mutable borrow of the guard while `r` lives
/// *r += 1;
/// *b += 512;
/// ```
///
/// [`SharedPerCid::get`] borrows the guard shared, so several shared tables can be used under one guard.
///
/// Thread-safety follows `T: Send`, like `Mutex<T>`:
///
/// ```
/// fn sync<X: Sync + Send>() {}
/// sync::<mmcid::PerCid<std::cell::Cell<u64>>>(); // Send but not Sync: fine, a shard is never shared
/// ```
///
/// ```compile_fail,E0277
/// fn sync<X: Sync>() {}
/// sync::<mmcid::PerCid<std::rc::Rc<u64>>>(); // not Send: could not be handed between threads
/// ```
pub struct PerCid<T> {
    /// Segment 0, the slots of CIDs `0..64`, inline: the shard of a CID below 64 is one load away, with no segment
    /// to find first (the common case: CIDs stay below `max_cids`, at most the group's cores).
    first: [Slot<T>; FIRST],
    /// `shards[s]` for `s ≥ 1`: null, or segment `s` (`seg_len(s)` slots); installed once by CAS, freed in `Drop`.
    /// `shards[0]` stays null (segment 0 is `first`).
    shards: [AtomicPtr<Slot<T>>; SEGMENTS],
    /// `visited[s]`: null, or `words_len(s)` words; bit `i` of word `w` ⇔ slot `64·w + i` of segment `s` is set.
    visited: [AtomicPtr<AtomicU64>; SEGMENTS],
    /// Shards allocated so far.
    allocated: AtomicUsize,
    /// The group whose guards may index this (`Group::id`, never reused).
    group_id: u64,
    /// The group's loom knob, for the publication models (docs/loom.md, model 12); empty outside loom.
    knob: Knob,
    init: Init<T>,
    /// Owns `T`s (drop check).
    _owns: PhantomData<T>,
}

/// How a shard starts. A plain `fn` for [`PerCid::new`], so `T` need not be `'static` there.
enum Init<T> {
    Fn(fn() -> T),
    Boxed(Box<dyn Fn() -> T + Send + Sync>),
}

impl<T> Init<T> {
    fn call(&self) -> T {
        match self {
            Init::Fn(f) => f(),
            Init::Boxed(f) => f(),
        }
    }
}

// SAFETY: moving a `PerCid` moves ownership of every shard (dropped on the new thread), hence `T: Send`; the
// other fields are atomics and a `Send + Sync` closure.
unsafe impl<T: Send> Send for PerCid<T> {}

// SAFETY: through `&PerCid` a thread only reaches the shard of a CID its own guard carries (`get_mut`), exclusive
// by I1 and handed over with release/acquire by I8: a shard moves between threads but is never used by two at
// once, so `T: Send` suffices, as for `Mutex<T>`. Views of all shards need `&mut self` (or `SharedPerCid`,
// whose `&T` paths require `T: Sync`).
unsafe impl<T: Send> Sync for PerCid<T> {}

impl<T> fmt::Debug for PerCid<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCid").field("shards_allocated", &self.shards_allocated()).finish_non_exhaustive()
    }
}

impl<T: Default> PerCid<T> {
    /// A `PerCid` for the guards of `group`, whose shards start as `T::default()`. Allocates no shard.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let per_cid: mmcid::PerCid<u64> = mmcid::PerCid::new(&group);
    /// assert_eq!(per_cid.shards_allocated(), 0);
    /// ```
    pub fn new(group: &Group) -> PerCid<T> {
        PerCid::make(group, Init::Fn(T::default))
    }
}

impl<T> PerCid<T> {
    /// A `PerCid` for the guards of `group`, whose shards start as `init()`; allocates no shard.
    ///
    /// `init` is called once per shard, on the thread whose guard first asks for it.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let buffers = mmcid::PerCid::with(&group, || Vec::<u8>::with_capacity(4096));
    /// let mut reg = group.register();
    /// let mut guard = reg.enter();
    /// assert!(buffers.get_mut(&mut guard).capacity() >= 4096);
    /// ```
    pub fn with<F>(group: &Group, init: F) -> PerCid<T>
    where
        F: Fn() -> T + Send + Sync + 'static,
    {
        PerCid::make(group, Init::Boxed(Box::new(init)))
    }

    fn make(group: &Group, init: Init<T>) -> PerCid<T> {
        PerCid {
            first: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            shards: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            visited: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            allocated: AtomicUsize::new(0),
            group_id: group.id(),
            knob: group.inner.knob,
            init,
            _owns: PhantomData,
        }
    }

    /// The shard of the guard's CID, allocated on first use.
    ///
    /// No atomic operation touches `T`: the guard makes the shard exclusively ours (I1) and shows us what its
    /// previous holder wrote (I8).
    ///
    /// The shard borrows the guard, so it cannot outlive it:
    ///
    /// ```compile_fail,E0505
    /// let group = mmcid::Group::new();
    /// let counts: mmcid::PerCid<u64> = mmcid::PerCid::new(&group);
    /// let mut reg = group.register();
    /// let mut guard = reg.enter();
    /// let shard = counts.get_mut(&mut guard);
    /// drop(guard); // the CID may now go to another thread…
    /// *shard += 1; // …so this does not compile
    /// ```
    ///
    /// # Panics
    ///
    /// If the guard belongs to another group than the one this `PerCid` was made for (its CID says nothing about
    /// this group's shards); [`PerCid::try_get_mut`] returns [`Error::ForeignGuard`] instead. Also panics if
    /// `init` panics.
    #[inline]
    pub fn get_mut<'a>(&'a self, guard: &'a mut CidGuard<'_>) -> &'a mut T {
        match self.try_get_mut(guard) {
            Ok(shard) => shard,
            Err(e) => foreign(e),
        }
    }

    /// Like [`PerCid::get_mut`], returning [`Error::ForeignGuard`] for a guard of another group.
    ///
    /// ```
    /// let (ours, theirs) = (mmcid::Group::new(), mmcid::Group::new());
    /// let per_cid: mmcid::PerCid<u64> = mmcid::PerCid::new(&ours);
    /// let mut reg = theirs.register();
    /// let mut guard = reg.enter();
    /// assert_eq!(per_cid.try_get_mut(&mut guard), Err(mmcid::Error::ForeignGuard));
    /// ```
    #[inline]
    pub fn try_get_mut<'a>(&'a self, guard: &'a mut CidGuard<'_>) -> Result<&'a mut T, Error> {
        if guard.group_id() != self.group_id {
            return Err(Error::ForeignGuard);
        }
        let shard = self.shard(guard.cid().get());
        // SAFETY:
        // - `shard` points to a live, initialised shard, freed only by `Drop` (needs `&mut self`, impossible
        //   while `'a` borrows `self`);
        // - no other reference to it exists: only a live guard of this group (checked above) carrying this CID
        //   reaches it through `&self`, that guard is unique (I1) and mutably borrowed for `'a`, and the
        //   `&mut self` paths cannot overlap `'a`. (The library's own CID holders without a guard, `with_cid`'s
        //   in-place enters and rseq sequences, only touch a `ShardedCounter`'s shards, never a user `PerCid`.)
        //   A forgotten guard (`mem::forget`) ended its borrow, and its CID goes back before this registration
        //   enters again (design.md §4.6);
        // - the previous holder's accesses happen before ours (I8).
        Ok(unsafe { &mut **shard.as_ptr() })
    }

    /// Every shard allocated so far, with its CID, in increasing CID order.
    ///
    /// Takes `&mut self`, so no guard can be using a shard meanwhile. Scans only the visited bitmask and the
    /// visited shards, never a slot per possible CPU.
    ///
    /// There is no `iter(&self)`: a shared view while holders write through [`get_mut`](PerCid::get_mut) would
    /// alias their `&mut T`. To read while threads write, use a [`SharedPerCid`].
    ///
    /// ```
    /// use mmcid::{Cid, Group, PerCid};
    ///
    /// let group = Group::new();
    /// let mut counts: PerCid<u64> = PerCid::new(&group);
    /// let mut reg = group.register();
    /// *counts.get_mut(&mut reg.enter()) += 5;
    /// for (_cid, n) in counts.iter_mut() {
    ///     *n *= 2; // e.g. reset every shard to a value: `*n = 0`
    /// }
    /// let visited: Vec<(Cid, u64)> = counts.iter_mut().map(|(cid, n)| (cid, *n)).collect();
    /// assert_eq!(visited.len(), 1);
    /// assert_eq!((visited[0].0.get(), visited[0].1), (0, 10));
    /// ```
    pub fn iter_mut(&mut self) -> PerCidIterMut<'_, T> {
        PerCidIterMut { raw: RawIter::new(self), _shards: PhantomData }
    }

    /// Like [`iter_mut`](PerCid::iter_mut) with the CID as a `usize`; kept for code written before `iter_mut`.
    #[deprecated(note = "use `iter_mut`, which yields the CID as a `Cid` like the rest of the API")]
    #[allow(deprecated)]
    pub fn iter_visited(&mut self) -> IterVisited<'_, T> {
        IterVisited { inner: self.iter_mut() }
    }

    /// Drops every shard; the next guard to ask gets a fresh one.
    ///
    /// A fresh shard comes from `init` (or `T::default()`), and [`shards_allocated`](PerCid::shards_allocated)
    /// is 0 again. The segments of shard
    /// pointers are kept. Memory goes back too, which matters after a burst of temporary CIDs made shards beyond
    /// [`Group::max_cids`]; to reset shards in place instead, assign through [`iter_mut`](PerCid::iter_mut).
    ///
    /// If a `T::drop` panics, the other shards are still dropped and the `PerCid` is left empty.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let mut lists: mmcid::PerCid<Vec<u8>> = mmcid::PerCid::new(&group);
    /// let mut reg = group.register();
    /// lists.get_mut(&mut reg.enter()).push(1);
    /// lists.clear();
    /// assert_eq!(lists.shards_allocated(), 0);
    /// assert!(lists.get_mut(&mut reg.enter()).is_empty()); // a fresh shard
    /// ```
    pub fn clear(&mut self) {
        drop(self.take_shards());
    }

    /// Takes every shard out (nulls its slot, clears its visited bit) and returns them with their CIDs, in CID
    /// order. `&mut self`: no guard's access and no other scan can overlap.
    fn take_shards(&mut self) -> Vec<(usize, Box<CachePadded<T>>)> {
        // Relaxed, here and below: `&mut self` orders every other access before us.
        let mut shards = Vec::with_capacity(self.allocated.load(Relaxed));
        // SAFETY: each visited shard came from `Box::leak` in `install`, is yielded once, and no reference to it
        // survives `&mut self`; a shard's visited bit is set in `install` right after it is stored, and every
        // `install` happened before `&mut self`. Its slot is nulled below before anything can reach it again.
        shards.extend(RawIter::new(self).map(|(cid, shard)| (cid, unsafe { Box::from_raw(shard.as_ptr()) })));
        for &(cid, _) in &shards {
            let (s, off) = locate(cid);
            let slot = if s == 0 {
                &self.first[off]
            } else {
                // SAFETY: the shard's segment is installed (the scan read the shard through it) and of length
                // `seg_len(s) > off`; it lives until `Drop`.
                unsafe { &*self.shards[s].load(Relaxed).add(off) }
            };
            slot.store(ptr::null_mut(), Relaxed);
        }
        for (s, head) in self.visited.iter().enumerate() {
            let words = head.load(Relaxed);
            for w in 0..if words.is_null() { 0 } else { words_len(s) } {
                // SAFETY: `w < words_len(s)`, the length of this installed segment, alive until `Drop`.
                unsafe { &*words.add(w) }.store(0, Relaxed);
            }
        }
        self.allocated.store(0, Relaxed);
        shards
    }

    /// Number of shards allocated so far (each at most once per CID; shards are kept until the `PerCid` drops).
    pub fn shards_allocated(&self) -> usize {
        // Relaxed: a statistic; it orders no shard access (the shards are reached through their own slots).
        self.allocated.load(Relaxed)
    }

    /// The shard of CID `cid`, allocated on first use.
    ///
    /// The caller holds a live guard of this `PerCid`'s group carrying `cid`: shard installation relies on it
    /// (one installer per CID). Breaking that is not undefined behaviour here, only a leaked shard and lost
    /// contents; the `&mut T` of `get_mut` is what needs the guard.
    #[inline]
    fn shard(&self, cid: usize) -> NonNull<CachePadded<T>> {
        // Relaxed: only holders of `cid` store the slot, and every earlier holder's store happens before our
        // guard (I8).
        self.installed_shard(cid, Relaxed).unwrap_or_else(|| self.install(cid))
    }

    /// The shard of CID `cid` if it is installed, its slot loaded with `order`.
    #[inline(always)]
    fn installed_shard(&self, cid: usize, order: Ordering) -> Option<NonNull<CachePadded<T>>> {
        if let Some(slot) = self.first.get(cid) {
            return NonNull::new(slot.load(order));
        }
        let (s, off) = locate(cid);
        // Acquire: pairs with the Release CAS that installed the segment (its null slots are initialised).
        let seg = NonNull::new(self.shards[s].load(Acquire))?;
        // SAFETY: `off < seg_len(s)` by `locate`, and an installed segment of that length lives until `Drop`.
        let slot = unsafe { &*seg.as_ptr().add(off) };
        NonNull::new(slot.load(order))
    }

    /// First use of `cid`: allocate its shard, publish it, mark it visited.
    #[cold]
    #[inline(never)]
    fn install(&self, cid: usize) -> NonNull<CachePadded<T>> {
        let (s, off) = locate(cid);
        let relaxed_segments = self.knob.is(Mutant::RelaxedSegmentInstall);
        let slot = if s == 0 {
            &self.first[off]
        } else {
            let seg = segment(&self.shards[s], seg_len(s), || AtomicPtr::new(ptr::null_mut()), relaxed_segments);
            // SAFETY: `off < seg_len(s)`; the segment lives until `Drop`.
            unsafe { &*seg.as_ptr().add(off) }
        };
        // Relaxed: as in `shard` (only holders of `cid` store it, in I8 order).
        if let Some(shard) = NonNull::new(slot.load(Relaxed)) {
            return shard; // unreachable while I8 holds (the hot path saw it null); harmless
        }
        let shard = NonNull::from(Box::leak(Box::new(CachePadded::new(self.init.call()))));
        // Release: publishes the initialised shard to readers outside the CID's hand-over chain, which load the
        // slot with Acquire (`SharedPerCid::installed`: sequence adders).
        slot.store(shard.as_ptr(), if self.knob.is(Mutant::RelaxedShardSlot) { Relaxed } else { Release });
        let words = segment(&self.visited[s], words_len(s), || AtomicU64::new(0), relaxed_segments);
        // SAFETY: `off / 64 < words_len(s)`; the segment lives until `Drop`.
        let word = unsafe { &*words.as_ptr().add(off / 64) };
        // Release: a scanner that sees the bit (Acquire) also sees the slot store above.
        word.fetch_or(1 << (off % 64), if self.knob.is(Mutant::RelaxedVisitedBit) { Relaxed } else { Release });
        // Relaxed: a statistic (`shards_allocated`); `Drop` reads it with `&mut self`.
        self.allocated.fetch_add(1, Relaxed);
        shard
    }
}

impl<T> Drop for PerCid<T> {
    /// Takes every shard out first (through the visited mask, like every scan: only visited shards are touched)
    /// and frees the segments, then drops the shards as one `Vec`: a `T::drop` that panics cannot leak the other
    /// shards or the segments (the slice drop goes on with the remaining elements).
    fn drop(&mut self) {
        let shards = self.take_shards();
        for s in 0..SEGMENTS {
            // Relaxed: `&mut self` orders every other access before us.
            let seg = self.shards[s].load(Relaxed);
            if !seg.is_null() {
                // SAFETY: `seg` came from `segment` with length `seg_len(s)` and is freed once.
                unsafe { free_segment(seg, seg_len(s)) };
            }
            let words = self.visited[s].load(Relaxed);
            if !words.is_null() {
                // SAFETY: as above, with length `words_len(s)`.
                unsafe { free_segment(words, words_len(s)) };
            }
        }
        drop(shards);
    }
}

impl<T> IntoIterator for PerCid<T> {
    type Item = (Cid, T);
    type IntoIter = PerCidIntoIter<T>;

    /// Every shard with its CID, by value, in CID order: the `PerCid` is consumed (its `into_inner`).
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let lists: mmcid::PerCid<Vec<u32>> = mmcid::PerCid::new(&group);
    /// let mut reg = group.register();
    /// lists.get_mut(&mut reg.enter()).push(7);
    /// let all: Vec<u32> = lists.into_iter().flat_map(|(_cid, list)| list).collect();
    /// assert_eq!(all, [7]);
    /// ```
    fn into_iter(mut self) -> PerCidIntoIter<T> {
        PerCidIntoIter { shards: self.take_shards().into_iter() }
    }
}

impl<'a, T> IntoIterator for &'a mut PerCid<T> {
    type Item = (Cid, &'a mut T);
    type IntoIter = PerCidIterMut<'a, T>;

    /// [`PerCid::iter_mut`].
    fn into_iter(self) -> PerCidIterMut<'a, T> {
        self.iter_mut()
    }
}

/// The segment behind `head`, installing a fresh one of `len` elements made by `fresh` if there is none yet.
/// Lock-free: when two threads race, the CAS loser frees its own allocation and uses the winner's. `mutant`:
/// loom's `RelaxedSegmentInstall` (every ordering here Relaxed; always false in normal builds).
#[cold]
fn segment<U>(head: &AtomicPtr<U>, len: usize, fresh: impl Fn() -> U, mutant: bool) -> NonNull<U> {
    let (load, success, failure) = if mutant { (Relaxed, Relaxed, Relaxed) } else { (Acquire, Release, Acquire) };
    // Acquire: pairs with the Release CAS below in whichever thread installed it.
    if let Some(seg) = NonNull::new(head.load(load)) {
        return seg;
    }
    let new = Box::into_raw((0..len).map(|_| fresh()).collect::<Box<[U]>>()).cast::<U>();
    // Release (success): publishes the initialised elements. Acquire (failure): we use the winner's.
    match head.compare_exchange(ptr::null_mut(), new, success, failure) {
        Ok(_) => NonNull::new(new).expect("Box pointers are non-null"),
        Err(winner) => {
            // SAFETY: `new` came from `Box<[U]>::into_raw` with length `len` and was never published.
            unsafe { free_segment(new, len) };
            NonNull::new(winner).expect("the CAS failed on a non-null segment")
        }
    }
}

/// Frees a segment made by [`segment`].
///
/// # Safety
///
/// `seg` came from `Box<[U]>::into_raw` with length `len` (as in [`segment`]), is freed only once, and no
/// reference into it is alive.
unsafe fn free_segment<U>(seg: *mut U, len: usize) {
    // SAFETY: by the contract, this rebuilds the original `Box<[U]>`.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(seg, len)) });
}

#[cold]
#[inline(never)]
#[track_caller]
pub(crate) fn foreign(e: Error) -> ! {
    panic!("{e}: a PerCid or ShardedCounter can only be used with guards of the group it was made for")
}

/// Walks the visited bitmask: yields `(cid, shard)` for every allocated shard, in CID order.
struct RawIter<'a, T> {
    per_cid: &'a PerCid<T>,
    /// Current segment.
    seg: usize,
    /// Shard segment `seg` (null until entered or if absent).
    slots: *mut Slot<T>,
    /// Next word to load in segment `seg`.
    word: usize,
    /// Unvisited set bits of the last loaded word.
    bits: u64,
    /// CID of bit 0 of the last loaded word.
    base: usize,
}

impl<'a, T> RawIter<'a, T> {
    fn new(per_cid: &'a PerCid<T>) -> Self {
        RawIter { per_cid, seg: 0, slots: ptr::null_mut(), word: 0, bits: 0, base: 0 }
    }
}

impl<T> Iterator for RawIter<'_, T> {
    type Item = (usize, NonNull<CachePadded<T>>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.bits != 0 {
                let bit = self.bits.trailing_zeros() as usize;
                self.bits &= self.bits - 1;
                let cid = self.base + bit;
                if self.slots.is_null() {
                    // Unreachable: a visited bit is set after its segment and slot, and the orderings carry that to
                    // every scan (the exception: a mutant's failing loom execution drops the `PerCid` while it
                    // unwinds, with no happens-before to the install).
                    debug_assert!(
                        cfg!(loom) && std::thread::panicking(),
                        "visited bit of CID {cid} seen before its segment"
                    );
                    continue;
                }
                // SAFETY: `cid` lies in segment `self.seg`, and `slots` is `first` (segment 0) or `shards[self.seg]`,
                // loaded (Acquire) when the scan reached word 0 of this segment: installed before any visited bit of
                // the segment is set, so non-null here (checked above), and it lives as long as `per_cid`.
                let slot = unsafe { &*self.slots.add(cid - seg_base(self.seg)) };
                // Acquire: pairs with the Release store in `install` (the shard's initialisation is visible).
                match NonNull::new(slot.load(Acquire)) {
                    Some(shard) => return Some((cid, shard)),
                    None => {
                        // Unreachable: the bit is set after the slot (loom model 12a's `RelaxedVisitedBit` twin makes
                        // it reachable; the loom exception as above).
                        debug_assert!(
                            cfg!(loom) && std::thread::panicking(),
                            "visited bit of CID {cid} seen before its slot"
                        );
                        continue;
                    }
                }
            }
            if self.seg >= SEGMENTS {
                return None;
            }
            // Acquire: pairs with the installing CAS in `segment`.
            let words = self.per_cid.visited[self.seg].load(Acquire);
            if words.is_null() || self.word >= words_len(self.seg) {
                self.seg += 1;
                self.word = 0;
                continue;
            }
            if self.word == 0 {
                self.slots = if self.seg == 0 {
                    // Inline, always there.
                    self.per_cid.first.as_ptr().cast_mut()
                } else {
                    // Acquire: as above; loaded after `words` so it is installed whenever a bit of it is visible.
                    self.per_cid.shards[self.seg].load(Acquire)
                };
            }
            // SAFETY: `self.word < words_len(self.seg)`; the segment lives as long as `per_cid`.
            let word = unsafe { &*words.add(self.word) };
            // Acquire: pairs with the Release `fetch_or` in `install`.
            self.bits = word.load(Acquire);
            self.base = seg_base(self.seg) + self.word * 64;
            self.word += 1;
        }
    }
}

/// The CID of a scanned shard (below `MAX_BITS`, so it fits a `Cid`).
fn cid_of(cid: usize) -> Cid {
    debug_assert!(cid < MAX_BITS);
    Cid::from_raw(cid as u32)
}

/// Iterator over the shards of a [`PerCid`] or [`SharedPerCid`] as `(Cid, &mut T)`, in CID order.
///
/// Made by [`PerCid::iter_mut`] and [`SharedPerCid::iter_mut`]; it borrows the table mutably, so no guard can use a
/// shard meanwhile.
pub struct PerCidIterMut<'a, T> {
    raw: RawIter<'a, T>,
    _shards: PhantomData<&'a mut T>,
}

impl<T> fmt::Debug for PerCidIterMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCidIterMut").field("next_segment", &self.raw.seg).finish_non_exhaustive()
    }
}

impl<'a, T> Iterator for PerCidIterMut<'a, T> {
    type Item = (Cid, &'a mut T);

    fn next(&mut self) -> Option<Self::Item> {
        let (cid, shard) = self.raw.next()?;
        // SAFETY: `iter_mut` borrowed the `PerCid` mutably for `'a`, so no other reference to any shard exists;
        // each CID (hence each shard) is yielded once; shards live until the `PerCid` drops or is cleared, which
        // needs `&mut` again.
        Some((cid_of(cid), unsafe { &mut **shard.as_ptr() }))
    }
}

impl<T> FusedIterator for PerCidIterMut<'_, T> {}

// SAFETY: the iterator is an exclusive borrow of the `PerCid` that yields `&mut T`: moving it to another thread
// moves those exclusive references, which needs `T: Send` (as for `&mut T: Send`); the raw segment pointer it
// caches is only read while the borrow lasts.
unsafe impl<T: Send> Send for PerCidIterMut<'_, T> {}

/// Iterator over the shards of a [`SharedPerCid`] as `(Cid, &T)`, in CID order, while guards may be using them.
///
/// Made by [`SharedPerCid::iter`]; each shard is reached once, through the visited bitmask.
pub struct PerCidIter<'a, T> {
    raw: RawIter<'a, T>,
    _shards: PhantomData<&'a T>,
}

impl<T> fmt::Debug for PerCidIter<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCidIter").field("next_segment", &self.raw.seg).finish_non_exhaustive()
    }
}

impl<'a, T: Sync> Iterator for PerCidIter<'a, T> {
    type Item = (Cid, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        let (cid, shard) = self.raw.next()?;
        // SAFETY: the iterator borrows a `SharedPerCid` for `'a`, through which only shared references to shards
        // are ever made (`get`, `iter`; the `&mut T` paths need `&mut self`), and `T: Sync`; shards live until the
        // table drops or is cleared, which needs `&mut` again.
        Some((cid_of(cid), unsafe { &**shard.as_ptr() }))
    }
}

impl<T: Sync> FusedIterator for PerCidIter<'_, T> {}

// SAFETY: the iterator yields `&T` from a shared borrow; sending it sends those shared references, which needs
// `T: Sync` (as for `&T: Send`); the raw segment pointer it caches is only read while the borrow lasts.
unsafe impl<T: Sync> Send for PerCidIter<'_, T> {}

/// Owning iterator over the shards of a [`PerCid`] or [`SharedPerCid`] as `(Cid, T)`, in CID order.
///
/// Made by their `into_iter` (`IntoIterator`).
pub struct PerCidIntoIter<T> {
    shards: std::vec::IntoIter<(usize, Box<CachePadded<T>>)>,
}

impl<T> fmt::Debug for PerCidIntoIter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCidIntoIter").field("remaining", &self.shards.len()).finish()
    }
}

impl<T> Iterator for PerCidIntoIter<T> {
    type Item = (Cid, T);

    fn next(&mut self) -> Option<Self::Item> {
        self.shards.next().map(|(cid, shard)| (cid_of(cid), CachePadded::into_inner(*shard)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.shards.size_hint()
    }
}

impl<T> ExactSizeIterator for PerCidIntoIter<T> {}

impl<T> FusedIterator for PerCidIntoIter<T> {}

/// The iterator of the deprecated [`PerCid::iter_visited`]: [`PerCid::iter_mut`] with the CID as a `usize`.
#[deprecated(note = "use `PerCid::iter_mut` and `PerCidIterMut`, which yield the CID as a `Cid`")]
pub struct IterVisited<'a, T> {
    inner: PerCidIterMut<'a, T>,
}

#[allow(deprecated)]
impl<T> fmt::Debug for IterVisited<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IterVisited").field("next_segment", &self.inner.raw.seg).finish_non_exhaustive()
    }
}

#[allow(deprecated)]
impl<'a, T> Iterator for IterVisited<'a, T> {
    type Item = (usize, &'a mut T);

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|(cid, shard)| (cid.get(), shard))
    }
}

#[allow(deprecated)]
impl<T> FusedIterator for IterVisited<'_, T> {}

/// One `T: Sync` per CID, readable at any time: holders get `&T` through their guard, readers iterate all.
///
/// [`iter`](SharedPerCid::iter) reads every shard while the holders update theirs.
///
/// The layout and the allocation on first use are [`PerCid`]'s. What differs is access: [`get`](SharedPerCid::get)
/// gives a shared `&T` (never `&mut T`), so `T` must be [`Sync`], and is typically made of atomics, per-CID
/// statistics that a monitoring thread sums while the workers record. The guard still makes its holder the only
/// thread that *writes* the shard of its CID (I1), and shows it what the CID's previous holder wrote (I8), so a
/// holder updates an atomic with a plain load and store (no read-modify-write, nothing lost) while readers only
/// load: that is how [`ShardedCounter`](crate::ShardedCounter) is built on it. The shard borrows the guard, so it
/// cannot be used after the CID goes to another thread.
///
/// A reader sees each shard once, with no lock and no retry: the result is not an atomic snapshot of all shards
/// (see [`ShardedCounter::sum`](crate::ShardedCounter::sum) for what a sum of such reads promises), but it is exact
/// once the writers are done (joined, or their updates otherwise happen before the read).
///
/// A live histogram: each CID records into its own buckets, a reader sums them while the threads record
/// (`examples/histogram.rs` is the full program).
///
/// ```
/// use mmcid::{Group, SharedPerCid};
/// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
///
/// let group = Group::new();
/// let hist: SharedPerCid<[AtomicU64; 4]> = SharedPerCid::new(&group); // 4 buckets per CID
/// std::thread::scope(|s| {
///     for t in 0..4u64 {
///         let (group, hist) = (&group, &hist);
///         s.spawn(move || {
///             for v in 0..1000 {
///                 let guard = group.enter();
///                 let bucket = &hist.get(&guard)[((v + t) % 4) as usize];
///                 bucket.store(bucket.load(Relaxed) + 1, Relaxed); // only this CID's holder writes it
///             }
///         });
///     }
///     // Meanwhile: a reader sums every CID's buckets.
///     let seen: u64 = hist.iter().flat_map(|(_cid, b)| b).map(|n| n.load(Relaxed)).sum();
///     assert!(seen <= 4000);
/// });
/// let total: u64 = hist.iter().flat_map(|(_cid, b)| b).map(|n| n.load(Relaxed)).sum();
/// assert_eq!(total, 4000); // exact once the recorders are joined
/// ```
pub struct SharedPerCid<T>(PerCid<T>);

impl<T: Default> SharedPerCid<T> {
    /// A `SharedPerCid` for the guards of `group`, whose shards start as `T::default()`. Allocates no shard.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let hits: mmcid::SharedPerCid<std::sync::atomic::AtomicU64> = mmcid::SharedPerCid::new(&group);
    /// assert_eq!(hits.shards_allocated(), 0);
    /// ```
    pub fn new(group: &Group) -> Self {
        SharedPerCid(PerCid::new(group))
    }
}

impl<T> SharedPerCid<T> {
    /// A `SharedPerCid` for the guards of `group`, whose shards start as `init()`; allocates no shard.
    ///
    /// `init` is called once per shard, on the thread whose guard first asks for it.
    ///
    /// ```
    /// use std::sync::atomic::AtomicU64;
    /// let group = mmcid::Group::new();
    /// let buckets = mmcid::SharedPerCid::with(&group, || (0..64).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    /// assert_eq!(buckets.get(&group.enter()).len(), 64);
    /// ```
    pub fn with<F>(group: &Group, init: F) -> Self
    where
        F: Fn() -> T + Send + Sync + 'static,
    {
        SharedPerCid(PerCid::with(group, init))
    }

    /// Every shard with its CID, exclusively, in CID order: see [`PerCid::iter_mut`].
    pub fn iter_mut(&mut self) -> PerCidIterMut<'_, T> {
        self.0.iter_mut()
    }

    /// Drops every shard; the next guard to ask gets a fresh one (see [`PerCid::clear`]).
    ///
    /// To zero shards in place instead, store through [`iter_mut`](SharedPerCid::iter_mut) or
    /// [`iter`](SharedPerCid::iter).
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Number of shards allocated so far (one per CID that asked for its shard since the last `clear`).
    pub fn shards_allocated(&self) -> usize {
        self.0.shards_allocated()
    }

    /// [`SharedPerCid::try_get`] for a guard the caller knows is of this group (e.g. from its own `Group::enter`).
    /// A foreign guard would not be undefined behaviour (see `PerCid::shard`), only wrong.
    #[inline]
    pub(crate) fn get_unchecked(&self, guard: &CidGuard<'_>) -> &T
    where
        T: Sync,
    {
        debug_assert_eq!(guard.group_id(), self.0.group_id, "guard of another group");
        self.get_cid(guard.cid().get())
    }

    /// The shard of CID `cid`, allocated on first use. The caller holds `cid` through a guard (or an in-place
    /// enter) of this group: only the holder installs a CID's shard (see `PerCid::shard`).
    #[inline]
    pub(crate) fn get_cid(&self, cid: usize) -> &T
    where
        T: Sync,
    {
        let shard = self.0.shard(cid);
        // SAFETY: the shard is live until the table drops or is cleared (both need `&mut`); only shared references
        // to shards are ever made through a `SharedPerCid` while it is shared (no `get_mut`; the `&mut T` paths
        // need `&mut self`), and `T: Sync`.
        unsafe { &*shard.as_ptr() }
    }

    /// The shard of CID `cid` if it is installed, for a caller that does not hold `cid` (yet): nothing is
    /// installed here.
    #[inline]
    pub(crate) fn installed(&self, cid: usize) -> Option<&T>
    where
        T: Sync,
    {
        // Acquire: pairs with the Release store in `install` (the shard is initialised), since we are not in the
        // CID's hand-over chain.
        let shard = self.0.installed_shard(cid, Acquire)?;
        // SAFETY: as in `get_cid`.
        Some(unsafe { &*shard.as_ptr() })
    }
}

impl<T: Sync> SharedPerCid<T> {
    /// The shard of the guard's CID, allocated on first use; it cannot outlive the guard.
    ///
    /// The holder is the shard's only writer (I1) and sees what earlier holders wrote (I8); readers may load it
    /// any time.
    ///
    /// Several tables under one guard are fine here (`get` borrows the guard shared):
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    /// let group = mmcid::Group::new();
    /// let (hits, bytes) = (mmcid::SharedPerCid::<AtomicU64>::new(&group), mmcid::SharedPerCid::<AtomicU64>::new(&group));
    /// let guard = group.enter();
    /// let (h, b) = (hits.get(&guard), bytes.get(&guard));
    /// h.store(h.load(Relaxed) + 1, Relaxed);
    /// b.store(b.load(Relaxed) + 512, Relaxed);
    /// drop(guard);
    /// assert_eq!(bytes.iter().map(|(_, b)| b.load(Relaxed)).sum::<u64>(), 512);
    /// ```
    ///
    /// # Panics
    ///
    /// If the guard belongs to another group than the one this table was made for;
    /// [`try_get`](SharedPerCid::try_get) returns [`Error::ForeignGuard`] instead. Also panics if `init` panics.
    #[inline]
    pub fn get<'a>(&'a self, guard: &'a CidGuard<'_>) -> &'a T {
        match self.try_get(guard) {
            Ok(shard) => shard,
            Err(e) => foreign(e),
        }
    }

    /// Like [`SharedPerCid::get`], returning [`Error::ForeignGuard`] for a guard of another group.
    ///
    /// ```
    /// let (ours, theirs) = (mmcid::Group::new(), mmcid::Group::new());
    /// let table: mmcid::SharedPerCid<std::sync::atomic::AtomicU64> = mmcid::SharedPerCid::new(&ours);
    /// assert_eq!(table.try_get(&theirs.enter()).err(), Some(mmcid::Error::ForeignGuard));
    /// ```
    #[inline]
    pub fn try_get<'a>(&'a self, guard: &'a CidGuard<'_>) -> Result<&'a T, Error> {
        if guard.group_id() != self.0.group_id {
            return Err(Error::ForeignGuard);
        }
        Ok(self.get_unchecked(guard))
    }

    /// Every shard allocated so far, with its CID, in CID order, while guards may be updating theirs.
    ///
    /// Scans only the visited bitmask and the visited shards: one load per 64 CIDs and one per shard, never a slot
    /// per possible CPU. A shard installed during the scan may or may not be seen.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    /// let group = mmcid::Group::new();
    /// let hits: mmcid::SharedPerCid<AtomicU64> = mmcid::SharedPerCid::new(&group);
    /// hits.get(&group.enter()).store(3, Relaxed);
    /// let seen: Vec<(usize, u64)> = hits.iter().map(|(cid, n)| (cid.get(), n.load(Relaxed))).collect();
    /// assert_eq!(seen.len(), 1);
    /// assert_eq!(seen[0].1, 3);
    /// ```
    pub fn iter(&self) -> PerCidIter<'_, T> {
        PerCidIter { raw: RawIter::new(&self.0), _shards: PhantomData }
    }
}

impl<T> fmt::Debug for SharedPerCid<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedPerCid").field("shards_allocated", &self.shards_allocated()).finish_non_exhaustive()
    }
}

impl<T> IntoIterator for SharedPerCid<T> {
    type Item = (Cid, T);
    type IntoIter = PerCidIntoIter<T>;

    /// Every shard with its CID, by value, in CID order: see [`PerCid`]'s `into_iter`.
    fn into_iter(self) -> PerCidIntoIter<T> {
        self.0.into_iter()
    }
}

impl<'a, T: Sync> IntoIterator for &'a SharedPerCid<T> {
    type Item = (Cid, &'a T);
    type IntoIter = PerCidIter<'a, T>;

    /// [`SharedPerCid::iter`].
    fn into_iter(self) -> PerCidIter<'a, T> {
        self.iter()
    }
}

impl<'a, T> IntoIterator for &'a mut SharedPerCid<T> {
    type Item = (Cid, &'a mut T);
    type IntoIter = PerCidIterMut<'a, T>;

    /// [`SharedPerCid::iter_mut`].
    fn into_iter(self) -> PerCidIterMut<'a, T> {
        self.iter_mut()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn locate_covers_the_cid_space_without_gaps() {
        let mut expect = (0, 0);
        for cid in 0..4 * FIRST + 10 {
            assert_eq!(locate(cid), expect, "cid {cid}");
            assert_eq!(seg_base(expect.0) + expect.1, cid);
            expect.1 += 1;
            if expect.1 == seg_len(expect.0) {
                expect = (expect.0 + 1, 0);
            }
        }
        let (s, off) = locate(MAX_BITS - 1);
        assert_eq!(s, SEGMENTS - 1);
        assert!(off < seg_len(s));
        assert!(seg_base(SEGMENTS) >= MAX_BITS, "the segments cover the hard CID bound");
        assert_eq!(SEGMENTS, 15);
    }

    #[test]
    fn scan_reads_only_installed_segments() {
        let group = Group::builder().virtual_cpus(2).build().unwrap();
        let mut per_cid: PerCid<u32> = PerCid::new(&group);
        // CIDs 70 and 200 (segments 1 and 2) without segment 0.
        for cid in [200, 70] {
            // No guard carries these CIDs and nothing else uses `per_cid`: this thread is the only installer.
            let p = per_cid.shard(cid);
            // SAFETY: the shard is live and no other reference to it exists.
            unsafe { **p.as_ptr() = cid as u32 };
        }
        assert!(per_cid.visited[0].load(Relaxed).is_null(), "segment 0's visited words never made");
        let seen: Vec<(usize, u32)> = per_cid.iter_mut().map(|(c, v)| (c.get(), *v)).collect();
        assert_eq!(seen, [(70, 70), (200, 200)]);
        assert_eq!(per_cid.shards_allocated(), 2);
    }
}
