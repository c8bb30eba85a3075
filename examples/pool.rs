//! Object pools as users write them: mmcid's [`mmcid::Pool`] against the allocator, a thread-local magazine cache
//! and the object pools of the ecosystem, in loops shaped like user code (each operation monomorphized and inlined
//! into the worker's loop; no dynamic call and no `black_box` per operation), all measured in the same run.
//!
//! ```text
//! cargo run --release --example pool -- [--compare] [--workloads w1,w2,w3,w4] [--threads LIST] [--seconds S]
//!                                       [--repeats N] [--json FILE]
//! ```
//!
//! Workloads:
//! * `w1`: a hot loop get → write → put, with a 64-byte object and with a 4 KiB buffer (the write stores one word
//!   per 8-byte word of the object, or one per 512 bytes of the buffer: eight cache lines);
//! * `w2`: bursts that hold four 64-byte objects at once (get four, write each, put four), with private work
//!   between bursts sized so that the pool is used 100 %, 10 % and 1 % of each thread's time (calibrated at start
//!   against the thread-local cache at one thread);
//! * `w3`: producer → consumer over a bounded queue (1P1C, 4P1C, 1P4C, 4P4C): every object is put back on
//!   another thread than the one that took it;
//! * `w4`: thread churn: rounds of threads created, each doing 64 bursts of four, and joined; after the last
//!   round one fresh thread takes as many objects as the approach still caches, and every one it has to create
//!   instead is a *stranded* object, cached where no live thread reaches it.
//!
//! Approaches: mmcid's pool through its handle (`Pool::get`, the object put back when the handle drops: one
//! `Group::enter` guard for the get and one for the put) and through an explicit guard (`Registration::enter`, then
//! `take`/`put` under it: one guard per get + put, or per burst); `Box::new` and drop on the system allocator; a
//! thread-local magazine cache (`ThreadLocal<RefCell<Vec<Box<T>>>>`, at most 32 objects a thread, half of them moved
//! to or from a shared overflow list under a `Mutex` when full or empty: the design a user would write); a
//! `parking_lot::Mutex<Vec<Box<T>>>`; a `crossbeam-queue` `ArrayQueue` free list of 1024 objects; the crates
//! `object-pool` (a `parking_lot::Mutex<Vec<Box<T>>>` inside), `lockfree-object-pool` (its `LinearObjectPool`, the
//! objects in its own pages), `opool` (an `ArrayQueue` of 1024) and `sharded-slab`'s `Pool` (objects in per-thread
//! shards, returned by `clear`). `sharded-slab` has no `w3` line: its `RefMut` is not `Send`, so an object cannot
//! be handed to another thread without its `Arc`-counted `OwnedRefMut`, which is another design.
//!
//! Columns: CPU ns per get + put (the workers' thread CPU time over their gets; in `w4` the whole process's, thread
//! creation included; `w3` also wall ns per get + put, its throughput), the bytes cached (objects created and not
//! dropped, minus those the workers hold, times the object's size; peak sampled every millisecond, and final),
//! magazines or shards, misses per 1000 gets (objects created). Every object carries an in-use flag that the
//! harness checks and flips at each get and put, the same for every approach; at the end of every cell the workers
//! hold nothing, the approach's own count of what it caches (where it has one) must equal created − dropped, and
//! once the approach is dropped every object created must have been dropped. A failure exits 1.

use mmcid_harness as common;
use mmcid_harness::peers;

use common::cli::{self, Args, Flag};
use common::{errln, out, outln};
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use mmcid::{CidGuard, Group, Pool, Pooled, Registration};
use peers::thread_cpu_ns;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};
use thread_local::ThreadLocal;

// ---------------------------------------------------------------------------------------------------------------
// Objects and their accounting

/// Per-thread counters of objects created and dropped and of objects the workers took (+1) and gave back (-1):
/// each slot has one writer at a time (plain load + store, no locked instruction), summed by the monitor.
#[derive(Default)]
struct Counts {
    created: AtomicU64,
    dropped: AtomicU64,
    /// Gets minus puts on this thread (wrapping: a consumer's goes below zero).
    held: AtomicU64,
}

impl Counts {
    #[inline(always)]
    fn bump(c: &AtomicU64, by: u64) {
        c.store(c.load(Relaxed).wrapping_add(by), Relaxed);
    }
}

/// A thread's counters, leaked: at most one per thread alive at once.
type Slot = &'static CachePadded<Counts>;

/// Every slot ever made, and those free for a new thread.
static SLOTS: Mutex<(Vec<Slot>, Vec<Slot>)> = Mutex::new((Vec::new(), Vec::new()));
/// Counts from threads whose slot is already gone (a drop in a later thread-local destructor).
static LATE: Counts = Counts { created: AtomicU64::new(0), dropped: AtomicU64::new(0), held: AtomicU64::new(0) };

/// A thread's slot, given back to the free list when the thread ends (its counts stay in the sums).
struct MySlot(Slot);

impl MySlot {
    fn acquire() -> MySlot {
        let mut s = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        let slot = s.1.pop().unwrap_or_else(|| {
            let slot: Slot = Box::leak(Box::default());
            s.0.push(slot);
            slot
        });
        MySlot(slot)
    }
}

impl Drop for MySlot {
    fn drop(&mut self) {
        SLOTS.lock().unwrap_or_else(|e| e.into_inner()).1.push(self.0);
    }
}

thread_local! {
    static MY: MySlot = MySlot::acquire();
}

#[inline(always)]
fn count(field: fn(&Counts) -> &AtomicU64, by: u64) {
    if MY.try_with(|s| Counts::bump(field(s.0), by)).is_err() {
        field(&LATE).fetch_add(by, Relaxed);
    }
}

/// Sums of every slot: (created, dropped, held).
fn totals() -> (u64, u64, u64) {
    let s = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = (LATE.created.load(Relaxed), LATE.dropped.load(Relaxed), LATE.held.load(Relaxed));
    for c in &s.0 {
        t.0 = t.0.wrapping_add(c.created.load(Relaxed));
        t.1 = t.1.wrapping_add(c.dropped.load(Relaxed));
        t.2 = t.2.wrapping_add(c.held.load(Relaxed));
    }
    t
}

/// After a cell that failed its checks: counts what it left (objects alive, objects held) as gone, so that the next
/// cells are checked from zero again instead of all failing on the same objects.
fn rebase() {
    let (c, d, h) = totals();
    LATE.dropped.fetch_add(c.wrapping_sub(d), Relaxed);
    LATE.held.fetch_sub(h, Relaxed);
}

/// Objects the workers hand out twice at once, or give back while not handed out.
static DOUBLE: AtomicU64 = AtomicU64::new(0);

/// The pooled object: `8 * (W + 1)` bytes, an in-use flag and `W` words. Made and dropped through the counters.
#[repr(C, align(64))]
struct Obj<const W: usize> {
    in_use: AtomicBool,
    words: [u64; W],
}

type Small = Obj<7>;
type Page = Obj<511>;
const _: () = assert!(std::mem::size_of::<Small>() == 64 && std::mem::size_of::<Page>() == 4096);

impl<const W: usize> Obj<W> {
    /// One store per word, at most eight spread over the object.
    const STEP: usize = W.div_ceil(8);

    fn new() -> Self {
        count(|c| &c.created, 1);
        Obj { in_use: AtomicBool::new(false), words: [0; W] }
    }

    /// The harness's check at a get: the object was not handed out already.
    #[inline(always)]
    fn check_out(&self) {
        if self.in_use.load(Relaxed) {
            DOUBLE.fetch_add(1, Relaxed);
        }
        self.in_use.store(true, Relaxed);
        count(|c| &c.held, 1);
    }

    /// The harness's check at a put: the object was handed out.
    #[inline(always)]
    fn check_in(&self) {
        if !self.in_use.load(Relaxed) {
            DOUBLE.fetch_add(1, Relaxed);
        }
        self.in_use.store(false, Relaxed);
        count(|c| &c.held, u64::MAX);
    }

    #[inline(always)]
    fn write(&mut self, v: u64) {
        let mut i = 0;
        while i < W {
            self.words[i] = v.wrapping_add(i as u64);
            i += Self::STEP;
        }
    }
}

/// What the harness does with an object, the same for every approach.
trait Object: Send + 'static {
    fn check_out(&self);
    fn check_in(&self);
    fn write(&mut self, v: u64);
}

impl<const W: usize> Object for Obj<W> {
    #[inline(always)]
    fn check_out(&self) {
        Obj::check_out(self)
    }
    #[inline(always)]
    fn check_in(&self) {
        Obj::check_in(self)
    }
    #[inline(always)]
    fn write(&mut self, v: u64) {
        Obj::write(self, v)
    }
}

impl<const W: usize> Drop for Obj<W> {
    fn drop(&mut self) {
        count(|c| &c.dropped, 1);
    }
}

impl<const W: usize> Default for Obj<W> {
    fn default() -> Self {
        Obj::new()
    }
}

impl<const W: usize> sharded_slab::Clear for Obj<W> {
    fn clear(&mut self) {}
}

// ---------------------------------------------------------------------------------------------------------------
// Approaches

/// One way to pool objects, called from the workers' loops, monomorphized and inlined. `enter` opens what a burst
/// of gets and puts runs under (a guard for the explicit-guard line, nothing for the others).
trait Approach: Sync + Sized + 'static {
    type O: Object;
    type Local;
    type Cx<'l>
    where
        Self: 'l;
    type Item<'a>: DerefMut<Target = Self::O>
    where
        Self: 'a;
    /// Per-thread state, made on the worker's thread.
    fn local(&self) -> Self::Local;
    fn enter<'l>(&'l self, local: &'l mut Self::Local) -> Self::Cx<'l>;
    fn get<'a>(&'a self, cx: &mut Self::Cx<'_>) -> Self::Item<'a>;
    fn put<'a>(&'a self, cx: &mut Self::Cx<'_>, item: Self::Item<'a>);
    /// The objects it caches by its own count, where it keeps one.
    fn cached(&mut self) -> Option<usize> {
        None
    }
    /// Magazines or shards.
    fn shards(&mut self) -> Option<usize> {
        None
    }
    /// The most objects it may cache (mmcid's pool, given the CIDs it has seen).
    fn bound(&mut self) -> Option<usize> {
        None
    }
}

/// mmcid's pool through its handle: `Pool::get`, the object put back when the `Pooled` drops.
struct MmcidHandle<O: Send + 'static>(Pool<O>);

impl<const W: usize> Approach for MmcidHandle<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = Pooled<'a, Obj<W>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get<'a>(&'a self, _: &mut ()) -> Pooled<'a, Obj<W>> {
        self.0.get()
    }
    #[inline(always)]
    fn put<'a>(&'a self, _: &mut (), item: Pooled<'a, Obj<W>>) {
        drop(item);
    }
    fn cached(&mut self) -> Option<usize> {
        Some(self.0.stats().cached)
    }
    fn shards(&mut self) -> Option<usize> {
        Some(self.0.stats().magazines)
    }
    fn bound(&mut self) -> Option<usize> {
        Some((2 * self.0.stats().slots + self.0.depot_limit()) * self.0.magazine_size())
    }
}

/// mmcid's pool under an explicit guard: `Registration::enter`, then `take` and `put`.
struct MmcidGuard<O: Send + 'static>(Group, Pool<O>);

impl<const W: usize> Approach for MmcidGuard<Obj<W>> {
    type O = Obj<W>;
    type Local = Registration;
    type Cx<'l> = CidGuard<'l>;
    type Item<'a> = Box<Obj<W>>;
    fn local(&self) -> Registration {
        self.0.register()
    }
    #[inline(always)]
    fn enter<'l>(&'l self, reg: &'l mut Registration) -> CidGuard<'l> {
        reg.enter()
    }
    #[inline(always)]
    fn get(&self, g: &mut CidGuard<'_>) -> Box<Obj<W>> {
        self.1.take(g)
    }
    #[inline(always)]
    fn put(&self, g: &mut CidGuard<'_>, item: Box<Obj<W>>) {
        self.1.put(g, item);
    }
    fn cached(&mut self) -> Option<usize> {
        Some(self.1.stats().cached)
    }
    fn shards(&mut self) -> Option<usize> {
        Some(self.1.stats().magazines)
    }
    fn bound(&mut self) -> Option<usize> {
        Some((2 * self.1.stats().slots + self.1.depot_limit()) * self.1.magazine_size())
    }
}

/// `Box::new` and drop on the system allocator.
struct Alloc<O>(std::marker::PhantomData<fn() -> O>);

impl<const W: usize> Approach for Alloc<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = Box<Obj<W>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get(&self, _: &mut ()) -> Box<Obj<W>> {
        Box::new(Obj::new())
    }
    #[inline(always)]
    fn put(&self, _: &mut (), item: Box<Obj<W>>) {
        drop(item);
    }
    fn cached(&mut self) -> Option<usize> {
        Some(0)
    }
}

/// Objects a thread of the thread-local cache keeps; half of them move to or from the overflow list at once.
const TL_CAP: usize = 32;

/// The thread-local magazine cache a user would write.
struct TlCache<O: Send> {
    local: ThreadLocal<RefCell<Vec<Box<O>>>>,
    overflow: parking_lot::Mutex<Vec<Box<O>>>,
}

impl<const W: usize> Approach for TlCache<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = Box<Obj<W>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get(&self, _: &mut ()) -> Box<Obj<W>> {
        let mut mine = self.local.get_or(|| RefCell::new(Vec::with_capacity(TL_CAP))).borrow_mut();
        if let Some(o) = mine.pop() {
            return o;
        }
        let mut shared = self.overflow.lock();
        let n = shared.len().min(TL_CAP / 2);
        let at = shared.len() - n;
        mine.extend(shared.drain(at..));
        drop(shared);
        mine.pop().unwrap_or_else(|| Box::new(Obj::new()))
    }
    #[inline(always)]
    fn put(&self, _: &mut (), item: Box<Obj<W>>) {
        let mut mine = self.local.get_or(|| RefCell::new(Vec::with_capacity(TL_CAP))).borrow_mut();
        if mine.len() == TL_CAP {
            self.overflow.lock().extend(mine.drain(TL_CAP / 2..));
        }
        mine.push(item);
    }
    fn cached(&mut self) -> Option<usize> {
        Some(self.local.iter_mut().map(|v| v.get_mut().len()).sum::<usize>() + self.overflow.get_mut().len())
    }
    fn shards(&mut self) -> Option<usize> {
        Some(self.local.iter_mut().count())
    }
}

/// A `parking_lot::Mutex<Vec<Box<T>>>` free list.
struct Locked<O>(parking_lot::Mutex<Vec<Box<O>>>);

impl<const W: usize> Approach for Locked<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = Box<Obj<W>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get(&self, _: &mut ()) -> Box<Obj<W>> {
        let o = self.0.lock().pop();
        o.unwrap_or_else(|| Box::new(Obj::new()))
    }
    #[inline(always)]
    fn put(&self, _: &mut (), item: Box<Obj<W>>) {
        self.0.lock().push(item);
    }
    fn cached(&mut self) -> Option<usize> {
        Some(self.0.get_mut().len())
    }
    fn shards(&mut self) -> Option<usize> {
        Some(1)
    }
}

/// Capacity of the bounded free lists (`ArrayQueue`, `opool`): a put beyond it drops the object.
const QUEUE_CAP: usize = 1024;

/// A `crossbeam-queue` `ArrayQueue` free list.
struct Queue<O>(ArrayQueue<Box<O>>);

impl<const W: usize> Approach for Queue<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = Box<Obj<W>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get(&self, _: &mut ()) -> Box<Obj<W>> {
        self.0.pop().unwrap_or_else(|| Box::new(Obj::new()))
    }
    #[inline(always)]
    fn put(&self, _: &mut (), item: Box<Obj<W>>) {
        drop(self.0.push(item));
    }
    fn cached(&mut self) -> Option<usize> {
        Some(self.0.len())
    }
    fn shards(&mut self) -> Option<usize> {
        Some(1)
    }
}

/// A handle of a peer crate whose object is a `Box<O>`: derefs to the `O`.
struct Boxed<H>(H);

impl<H: Deref<Target = Box<O>>, O> Deref for Boxed<H> {
    type Target = O;
    #[inline(always)]
    fn deref(&self) -> &O {
        &self.0
    }
}

impl<H: DerefMut<Target = Box<O>>, O> DerefMut for Boxed<H> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut O {
        &mut self.0
    }
}

/// `object-pool`: `pull` with a fallback, the object back when the `Reusable` drops.
struct ObjectPool<O>(object_pool::Pool<Box<O>>);

impl<const W: usize> Approach for ObjectPool<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = Boxed<object_pool::Reusable<'a, Box<Obj<W>>>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get<'a>(&'a self, _: &mut ()) -> Self::Item<'a> {
        Boxed(self.0.pull(|| Box::new(Obj::new())))
    }
    #[inline(always)]
    fn put<'a>(&'a self, _: &mut (), item: Self::Item<'a>) {
        drop(item);
    }
    fn cached(&mut self) -> Option<usize> {
        Some(self.0.len())
    }
    fn shards(&mut self) -> Option<usize> {
        Some(1)
    }
}

/// `lockfree-object-pool`'s `LinearObjectPool`.
struct LockFree<O: 'static>(lockfree_object_pool::LinearObjectPool<O>);

impl<const W: usize> Approach for LockFree<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = lockfree_object_pool::LinearReusable<'a, Obj<W>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get<'a>(&'a self, _: &mut ()) -> Self::Item<'a> {
        self.0.pull()
    }
    #[inline(always)]
    fn put<'a>(&'a self, _: &mut (), item: Self::Item<'a>) {
        drop(item);
    }
}

/// `opool`'s allocator: makes boxed objects.
struct Maker<O>(std::marker::PhantomData<fn() -> O>);

impl<const W: usize> opool::PoolAllocator<Box<Obj<W>>> for Maker<Obj<W>> {
    #[inline(always)]
    fn allocate(&self) -> Box<Obj<W>> {
        Box::new(Obj::new())
    }
}

/// `opool`'s concurrent `Pool` (an `ArrayQueue` of 1024).
struct OPool<const W: usize>(opool::Pool<Maker<Obj<W>>, Box<Obj<W>>>);

impl<const W: usize> Approach for OPool<W> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = Boxed<opool::RefGuard<'a, Maker<Obj<W>>, Box<Obj<W>>>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get<'a>(&'a self, _: &mut ()) -> Self::Item<'a> {
        Boxed(self.0.get())
    }
    #[inline(always)]
    fn put<'a>(&'a self, _: &mut (), item: Self::Item<'a>) {
        drop(item);
    }
    fn cached(&mut self) -> Option<usize> {
        Some(self.0.len())
    }
    fn shards(&mut self) -> Option<usize> {
        Some(1)
    }
}

/// `sharded-slab`'s `Pool`: `create` a slot (the object made by `Default` the first time), `clear` it to put it
/// back.
struct Slab<O: sharded_slab::Clear + Default>(sharded_slab::Pool<O>);

/// A `sharded-slab` slot being written.
struct SlabItem<'a, O: sharded_slab::Clear + Default>(sharded_slab::pool::RefMut<'a, O>);

impl<O: sharded_slab::Clear + Default> Deref for SlabItem<'_, O> {
    type Target = O;
    #[inline(always)]
    fn deref(&self) -> &O {
        &self.0
    }
}

impl<O: sharded_slab::Clear + Default> DerefMut for SlabItem<'_, O> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut O {
        &mut self.0
    }
}

impl<const W: usize> Approach for Slab<Obj<W>> {
    type O = Obj<W>;
    type Local = ();
    type Cx<'l> = ();
    type Item<'a> = SlabItem<'a, Obj<W>>;
    fn local(&self) {}
    #[inline(always)]
    fn enter(&self, _: &mut ()) {}
    #[inline(always)]
    fn get<'a>(&'a self, _: &mut ()) -> Self::Item<'a> {
        SlabItem(self.0.create().expect("sharded-slab: a shard has room"))
    }
    #[inline(always)]
    fn put<'a>(&'a self, _: &mut (), item: Self::Item<'a>) {
        let key = item.0.key();
        drop(item);
        self.0.clear(key);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Workloads

/// Objects a `w2`/`w4` burst holds at once.
const BURST: usize = 4;
/// Get + put pairs between two looks at the stop flag. Small: at 128 threads a core, a lock-free peer spins on
/// the slot of a preempted thread for up to a scheduler round, so one operation can take milliseconds, and a
/// cell must end soon after its time is up.
const BATCH: u64 = 8;
/// Bursts each `w4` thread does before it ends.
const CHURN_BURSTS: u64 = 64;
/// Worker stacks: `lockfree-object-pool` builds its pages of 4 KiB objects on the stack of the thread that grows it
/// (256 KiB overflowed). Below 2 MiB: larger stacks got transparent huge pages, and thread creation took ms.
const STACK: usize = 1 << 20;
/// Capacity of the `w3` queue between producers and consumers.
const CHANNEL: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Work {
    /// Get → write → put.
    Hot,
    /// Bursts of `BURST` with this many rounds of private work between them.
    Burst(u32),
    /// Producers → consumers.
    Channel,
    /// Rounds of threads created and joined.
    Churn,
}

/// One column of a table: a thread count, or (w3) producers and consumers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Conf {
    threads: usize,
    producers: usize,
    consumers: usize,
}

impl Conf {
    fn threads(t: usize) -> Conf {
        Conf { threads: t, producers: 0, consumers: 0 }
    }

    fn label(self) -> String {
        if self.producers > 0 {
            format!("{}P{}C", self.producers, self.consumers)
        } else {
            format!("T={}", self.threads)
        }
    }
}

/// One cell's result.
#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    cpu_ns: f64,
    wall_ns: f64,
    peak_bytes: f64,
    final_bytes: f64,
    shards: Option<usize>,
    misses_per_1000: f64,
    /// w4: bytes of the objects a fresh thread could not reach.
    stranded_bytes: Option<f64>,
    /// mmcid: the most bytes the pool may cache given the CIDs it saw.
    bound_bytes: Option<f64>,
}

/// The rounds of private work a worker does between bursts (`Values::private` in `use_case`).
#[inline(always)]
fn private(mut x: u64, rounds: u32) -> u64 {
    for _ in 0..rounds {
        x = (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    x
}

/// One get → write → put, under one `enter`.
#[inline(always)]
fn hot<A: Approach>(a: &A, local: &mut A::Local, v: u64) {
    let mut cx = a.enter(local);
    let mut it = a.get(&mut cx);
    it.check_out();
    it.write(v);
    it.check_in();
    a.put(&mut cx, it);
}

/// One burst: `BURST` gets, a write to each, `BURST` puts, under one `enter`.
#[inline(always)]
fn burst<A: Approach>(a: &A, local: &mut A::Local, v: u64) {
    let mut cx = a.enter(local);
    let mut items: [A::Item<'_>; BURST] = std::array::from_fn(|_| a.get(&mut cx));
    for (i, it) in items.iter_mut().enumerate() {
        it.check_out();
        it.write(v.wrapping_add(i as u64));
    }
    for it in items {
        it.check_in();
        a.put(&mut cx, it);
    }
}

/// A `w1`/`w2` worker: operations until `stop`. Returns its CPU time in the loop and its gets.
#[inline(never)]
fn worker<A: Approach>(a: &A, local: &mut A::Local, stop: &AtomicBool, thread: usize, work: Work) -> (u64, u64) {
    let mut v = 0x9E37_79B9_7F4A_7C15 ^ (thread as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut gets = 0;
    let t0 = thread_cpu_ns();
    loop {
        match work {
            Work::Burst(rounds) => {
                for _ in 0..BATCH / BURST as u64 {
                    v = private(v.wrapping_add(1), rounds);
                    burst(a, local, v);
                }
                gets += BATCH;
            }
            _ => {
                for _ in 0..BATCH {
                    v = v.wrapping_add(1);
                    hot(a, local, v);
                }
                gets += BATCH;
            }
        }
        if stop.load(Relaxed) {
            break;
        }
    }
    (thread_cpu_ns() - t0, gets)
}

/// What a workload's run gives back: the CPU ns it spent, its wall ns, its gets.
type Timing = (f64, f64, u64);

/// `w1`/`w2`: `threads` workers for `secs` seconds after the last one was started. Each counts its own gets and
/// CPU time from its own start (no barrier: on a loaded machine with 128 threads a core, waiting until every worker
/// has run once took seconds), so the cost per get + put needs no common start.
fn run_loops<A: Approach>(a: &A, work: Work, threads: usize, secs: f64) -> Result<Timing, String> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let handles = (0..threads)
            .map(|i| {
                let stop = &stop;
                std::thread::Builder::new()
                    .stack_size(STACK)
                    .spawn_scoped(s, move || {
                        let mut local = a.local();
                        let r = worker(a, &mut local, stop, i, work);
                        drop(local);
                        r
                    })
                    .map_err(|e| format!("cannot start a worker thread: {e}"))
            })
            .collect::<Result<Vec<_>, _>>();
        let handles = match handles {
            Ok(h) => h,
            Err(e) => {
                stop.store(true, Relaxed);
                return Err(e);
            }
        };
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Relaxed);
        let (mut cpu, mut gets) = (0, 0);
        for h in handles {
            let (c, g) = h.join().map_err(|_| "a worker panicked".to_string())?;
            cpu += c;
            gets += g;
        }
        Ok((cpu as f64, t0.elapsed().as_nanos() as f64, gets))
    })
}

/// `w3`: `producers` threads take objects, write them and send them over a bounded queue to `consumers` threads,
/// which check them and put them back; for `secs` seconds, then the queue is drained.
fn run_channel<A: Approach>(a: &A, producers: usize, consumers: usize, secs: f64) -> Result<Timing, String>
where
    for<'a> A::Item<'a>: Send,
{
    let queue: ArrayQueue<A::Item<'_>> = ArrayQueue::new(CHANNEL);
    let (stop, done) = (AtomicBool::new(false), AtomicUsize::new(0));
    let ready = Barrier::new(producers + consumers + 1);
    let t0 = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for p in 0..producers {
            let (queue, stop, done, ready) = (&queue, &stop, &done, &ready);
            handles.push(std::thread::Builder::new().stack_size(STACK).spawn_scoped(s, move || {
                let mut local = a.local();
                let mut v = p as u64;
                ready.wait();
                let (t0, mut gets) = (thread_cpu_ns(), 0);
                'run: while !stop.load(Relaxed) {
                    v = v.wrapping_add(1);
                    let mut it = {
                        let mut cx = a.enter(&mut local);
                        a.get(&mut cx)
                    };
                    it.check_out();
                    it.write(v);
                    gets += 1;
                    loop {
                        match queue.push(it) {
                            Ok(()) => break,
                            Err(back) if stop.load(Relaxed) => {
                                back.check_in();
                                a.put(&mut a.enter(&mut local), back);
                                break 'run;
                            }
                            Err(back) => {
                                it = back;
                                std::thread::yield_now();
                            }
                        }
                    }
                }
                done.fetch_add(1, Release);
                (thread_cpu_ns() - t0, gets)
            }));
        }
        for _ in 0..consumers {
            let (queue, done, ready) = (&queue, &done, &ready);
            handles.push(std::thread::Builder::new().stack_size(STACK).spawn_scoped(s, move || {
                let mut local = a.local();
                ready.wait();
                let t0 = thread_cpu_ns();
                loop {
                    match queue.pop() {
                        Some(it) => {
                            it.check_in();
                            a.put(&mut a.enter(&mut local), it);
                        }
                        // Acquire: every producer's last push is visible once all of them counted themselves done.
                        None if done.load(Acquire) == producers && queue.is_empty() => break,
                        None => std::thread::yield_now(),
                    }
                }
                (thread_cpu_ns() - t0, 0)
            }));
        }
        ready.wait();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Relaxed);
        let (mut cpu, mut gets) = (0, 0);
        for h in handles {
            let h = h.map_err(|e| format!("cannot start a w3 thread: {e}"))?;
            let (c, g) = h.join().map_err(|_| "a w3 thread panicked".to_string())?;
            cpu += c;
            gets += g;
        }
        Ok::<_, String>((cpu as f64, t0.elapsed().as_nanos() as f64, gets))
    })?;
    Ok(t0)
}

/// The whole process's CPU time (ended threads included), in ns.
fn process_cpu_ns() -> f64 {
    // SAFETY: `ru` is a valid, writable rusage for the duration of the call.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF cannot fail with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e9 + t.tv_usec as f64 * 1e3;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// `w4`: rounds of `threads` threads, each doing `CHURN_BURSTS` bursts and ending, until `secs` seconds passed.
fn run_churn<A: Approach>(a: &A, threads: usize, secs: f64) -> Result<Timing, String> {
    let (t0, c0) = (Instant::now(), process_cpu_ns());
    let mut gets = 0;
    let mut round = 0u64;
    while round == 0 || t0.elapsed().as_secs_f64() < secs {
        std::thread::scope(|s| {
            let handles = (0..threads)
                .map(|i| {
                    std::thread::Builder::new().stack_size(STACK).spawn_scoped(s, move || {
                        let mut local = a.local();
                        let mut v = round.wrapping_mul(1 << 20) ^ i as u64;
                        for _ in 0..CHURN_BURSTS {
                            v = v.wrapping_add(1);
                            burst(a, &mut local, v);
                        }
                    })
                })
                .collect::<Vec<_>>();
            for h in handles {
                h.map_err(|e| format!("cannot start a w4 thread: {e}"))?
                    .join()
                    .map_err(|_| "a w4 thread panicked".to_string())?;
            }
            Ok::<_, String>(())
        })?;
        gets += threads as u64 * CHURN_BURSTS * BURST as u64;
        round += 1;
    }
    Ok((process_cpu_ns() - c0, t0.elapsed().as_nanos() as f64, gets))
}

/// `w4`'s closing check: a fresh thread takes `n` objects (holding them all) and puts them back; returns how many
/// it had to create, the objects cached where it could not reach them.
fn stranded<A: Approach>(a: &A, n: usize) -> u64 {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut local = a.local();
            let before = totals().0;
            let mut cx = a.enter(&mut local);
            let items: Vec<_> = (0..n)
                .map(|_| {
                    let it = a.get(&mut cx);
                    it.check_out();
                    it
                })
                .collect();
            let made = totals().0.wrapping_sub(before);
            for it in items {
                it.check_in();
                a.put(&mut cx, it);
            }
            made
        })
        .join()
        .unwrap_or(u64::MAX)
    })
}

/// Runs `body` on approach `make()` while a monitor samples the bytes cached; then checks the accounting (nothing
/// held, nothing handed out twice, the approach's own count, every object dropped with it).
fn measure<A: Approach>(
    make: impl FnOnce() -> A,
    work: Work,
    body: impl FnOnce(&A) -> Result<Timing, String>,
) -> Result<Cell, String> {
    let (c0, d0, h0) = totals();
    if c0 != d0 || h0 != 0 {
        return Err(format!("an earlier cell left {} objects alive, {} held", c0.wrapping_sub(d0), h0 as i64));
    }
    let double0 = DOUBLE.load(Relaxed);
    let mut a = make();
    let size = std::mem::size_of::<A::O>() as f64;
    let finished = AtomicBool::new(false);
    let (timing, peak) = std::thread::scope(|s| {
        let monitor = s.spawn(|| {
            let mut peak = 0i64;
            while !finished.load(Relaxed) {
                let (c, d, h) = totals();
                peak = peak.max(c.wrapping_sub(d).wrapping_sub(h) as i64);
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        });
        let timing = body(&a);
        finished.store(true, Relaxed);
        (timing, monitor.join().unwrap_or(0))
    });
    let (cpu, wall, gets) = match timing {
        Ok(t) => t,
        Err(e) => {
            drop(a);
            rebase();
            return Err(e);
        }
    };
    let (c1, d1, h1) = totals();
    if h1 != 0 {
        drop(a);
        rebase();
        return Err(format!("the workers still hold {} objects", h1 as i64));
    }
    let created = c1 - c0;
    let mut cached = c1 - d1;
    if let Some(own) = a.cached() {
        if own as u64 != cached {
            drop(a);
            rebase();
            return Err(format!("caches {own} objects by its own count, {cached} by the objects' (lost or leaked)"));
        }
    }
    let stranded_bytes = (work == Work::Churn).then(|| {
        let n = stranded(&a, cached.min(1 << 20) as usize);
        n as f64 * size
    });
    if stranded_bytes.is_some() {
        let (c, d, _) = totals();
        cached = c - d;
    }
    let peak = peak.max(cached as i64).max(0) as f64;
    let (shards, bound) = (a.shards(), a.bound());
    drop(a);
    let (c2, d2, h2) = totals();
    if c2 != d2 || h2 != 0 {
        rebase();
        return Err(format!("{} objects were not dropped with the approach (lost)", c2.wrapping_sub(d2)));
    }
    let double = DOUBLE.load(Relaxed) - double0;
    if double != 0 {
        return Err(format!("{double} objects handed out twice at once, or put back twice"));
    }
    let gets_f = gets.max(1) as f64;
    Ok(Cell {
        cpu_ns: cpu / gets_f,
        wall_ns: wall / gets_f,
        peak_bytes: peak * size,
        final_bytes: cached as f64 * size,
        shards,
        misses_per_1000: created as f64 * 1000.0 / gets_f,
        stranded_bytes,
        bound_bytes: bound.map(|b| b as f64 * size),
    })
}

// ---------------------------------------------------------------------------------------------------------------
// The lines of each table

/// Runs one cell of an approach.
type RunCell = dyn Fn(Conf, f64) -> Result<Cell, String>;

struct Line {
    name: &'static str,
    /// mmcid's pool (what the goals judge).
    ours: bool,
    /// A global or lock-free pool, or the allocator: what W1 and W3 must beat.
    global: bool,
    run: Box<RunCell>,
}

/// The approaches of a table, for object `Obj<W>` and `work`.
fn lines<const W: usize>(work: Work) -> Vec<Line> {
    fn line<A: Approach>(
        name: &'static str,
        ours: bool,
        global: bool,
        work: Work,
        make: impl Fn() -> A + Copy + 'static,
    ) -> Line
    where
        for<'a> A::Item<'a>: Send,
    {
        Line {
            name,
            ours,
            global,
            run: Box::new(move |conf, secs| match work {
                Work::Hot | Work::Burst(_) => measure(make, work, |a| run_loops(a, work, conf.threads, secs)),
                Work::Channel => measure(make, work, |a| run_channel(a, conf.producers, conf.consumers, secs)),
                Work::Churn => measure(make, work, |a| run_churn(a, conf.threads, secs)),
            }),
        }
    }
    let mut v = vec![
        line("mmcid Pool::get (handle)", true, false, work, || MmcidHandle(Pool::new(&Group::new(), Obj::<W>::new))),
        line("mmcid reg.enter + take/put", true, false, work, || {
            let g = Group::new();
            let p = Pool::new(&g, Obj::<W>::new);
            MmcidGuard(g, p)
        }),
        line("Box::new + drop", false, true, work, || Alloc::<Obj<W>>(std::marker::PhantomData)),
        line("thread-local cache", false, false, work, || TlCache::<Obj<W>> {
            local: ThreadLocal::new(),
            overflow: parking_lot::Mutex::new(Vec::new()),
        }),
        line("parking_lot::Mutex<Vec>", false, true, work, || Locked::<Obj<W>>(parking_lot::Mutex::new(Vec::new()))),
        line("crossbeam ArrayQueue", false, true, work, || Queue::<Obj<W>>(ArrayQueue::new(QUEUE_CAP))),
        line("object-pool", false, true, work, || ObjectPool::<Obj<W>>(object_pool::Pool::new(0, || unreachable!()))),
        line("lockfree-object-pool", false, true, work, || {
            LockFree::<Obj<W>>(lockfree_object_pool::LinearObjectPool::new(Obj::new, |_| {}))
        }),
        line("opool", false, true, work, || OPool::<W>(opool::Pool::new(QUEUE_CAP, Maker(std::marker::PhantomData)))),
    ];
    if work != Work::Channel {
        // Not `Send` (see the module docs): no w3 line. Its W1/W2/W4 runs go through `measure` directly.
        v.push(Line {
            name: "sharded-slab Pool",
            ours: false,
            global: true,
            run: Box::new(move |conf, secs| {
                let make = || Slab::<Obj<W>>(sharded_slab::Pool::new());
                match work {
                    Work::Churn => measure(make, work, |a| run_churn(a, conf.threads, secs)),
                    _ => measure(make, work, |a| run_loops(a, work, conf.threads, secs)),
                }
            }),
        });
    }
    v
}

// ---------------------------------------------------------------------------------------------------------------
// Tables

/// One table: a workload with one object size (and, for w2, one share of the pool), its columns and its lines.
struct Table {
    id: String,
    title: String,
    work: Work,
    object_bytes: usize,
    confs: Vec<Conf>,
    lines: Vec<Line>,
}

/// The `w3` shapes: (producers, consumers).
const SHAPES: [(usize, usize); 4] = [(1, 1), (4, 1), (1, 4), (4, 4)];

/// The tables of `workloads` (1..=4), with the `w2` private rounds for 10 % and 1 %.
fn tables(workloads: &[u8], threads: &[usize], rounds: (u32, u32)) -> Vec<Table> {
    let confs: Vec<Conf> = threads.iter().map(|&t| Conf::threads(t)).collect();
    let mut v = Vec::new();
    let mut table = |id: &str, title: String, work: Work, object_bytes: usize, confs: Vec<Conf>, lines| {
        v.push(Table { id: id.into(), title, work, object_bytes, confs, lines })
    };
    for &w in workloads {
        match w {
            1 => {
                table(
                    "w1-64B",
                    "W1 get -> write -> put, 64-byte object".into(),
                    Work::Hot,
                    64,
                    confs.clone(),
                    lines::<7>(Work::Hot),
                );
                table(
                    "w1-4KiB",
                    "W1 get -> write -> put, 4 KiB buffer".into(),
                    Work::Hot,
                    4096,
                    confs.clone(),
                    lines::<511>(Work::Hot),
                );
            }
            2 => {
                for (id, pct, r) in [("w2-100", 100, 0), ("w2-10", 10, rounds.0), ("w2-1", 1, rounds.1)] {
                    let title = format!(
                        "W2 bursts of {BURST} 64-byte objects, pool {pct} % of the time ({r} rounds of private work)"
                    );
                    table(id, title, Work::Burst(r), 64, confs.clone(), lines::<7>(Work::Burst(r)));
                }
            }
            3 => {
                let shapes = SHAPES.iter().map(|&(p, c)| Conf { threads: p + c, producers: p, consumers: c }).collect();
                let title = format!(
                    "W3 producers -> consumers over a queue of {CHANNEL}, 64-byte objects put back on another thread"
                );
                table("w3", title, Work::Channel, 64, shapes, lines::<7>(Work::Channel));
            }
            _ => {
                let title = format!("W4 thread churn: rounds of T threads, each {CHURN_BURSTS} bursts of {BURST} 64-byte objects, then joined");
                table("w4", title, Work::Churn, 64, confs.clone(), lines::<7>(Work::Churn));
            }
        }
    }
    v
}

/// The median of one field over a cell's repeats.
fn med(cells: &[Cell], f: impl Fn(&Cell) -> f64) -> f64 {
    common::median(&cells.iter().map(f).collect::<Vec<_>>())
}

/// What the goals of a table compare: CPU ns per get + put, or (w3) wall ns per get + put.
fn primary(work: Work) -> fn(&Cell) -> f64 {
    if work == Work::Channel {
        |c| c.wall_ns
    } else {
        |c| c.cpu_ns
    }
}

/// `n` bytes, short: `512B`, `4.0K`, `1.5M`.
fn bytes(n: f64) -> String {
    if !n.is_finite() {
        "-".into()
    } else if n < 1024.0 {
        format!("{n:.0}B")
    } else if n < 1024.0 * 1024.0 {
        format!("{:.1}K", n / 1024.0)
    } else {
        format!("{:.1}M", n / (1024.0 * 1024.0))
    }
}

/// A goal's verdict from the per-repeat values of `x` (paired ratios or differences) against `ok`: met when every
/// repeat meets it, not met when none does, inconclusive when they disagree.
fn judge(xs: &[f64], ok: impl Fn(f64) -> bool) -> &'static str {
    let met = xs.iter().filter(|&&x| ok(x)).count();
    if xs.is_empty() {
        "inconclusive"
    } else if met == xs.len() {
        "met"
    } else if met == 0 {
        "NOT met"
    } else {
        "inconclusive"
    }
}

/// The results of one table: `runs[line][conf]`, one cell per repeat.
type Runs = Vec<Vec<Vec<Cell>>>;

/// One verdict line: goal, mmcid line, verdict, detail.
struct Verdict {
    table: String,
    goal: &'static str,
    line: &'static str,
    verdict: &'static str,
    detail: String,
}

/// Prints one table and appends its JSON cells.
// A column's index reads both `t.confs` and every line's runs.
#[allow(clippy::needless_range_loop)]
fn report(t: &Table, runs: &Runs, json: &mut Vec<String>) {
    let width = t.lines.iter().map(|l| l.name.len()).max().unwrap_or(10) + 2;
    let tl = t.lines.iter().position(|l| l.name == "thread-local cache");
    let what = if t.work == Work::Channel { "wall ns per get + put" } else { "CPU ns per get + put" };
    let head = |what: &str| {
        outln!("{what}");
        out!("  {:width$}", "approach");
        for c in &t.confs {
            out!(" {:>15}", c.label());
        }
        outln!();
    };
    outln!("\n{} [{}]", t.title, t.id);
    head(&format!("{what} (x the thread-local cache)"));
    let p = primary(t.work);
    let best_peer = |ci: usize| {
        t.lines
            .iter()
            .enumerate()
            .filter(|(li, l)| !l.ours && !runs[*li][ci].is_empty())
            .map(|(li, _)| med(&runs[li][ci], p))
            .fold(f64::INFINITY, f64::min)
    };
    for (li, l) in t.lines.iter().enumerate() {
        out!("  {:width$}", l.name);
        for ci in 0..t.confs.len() {
            let cells = &runs[li][ci];
            if cells.is_empty() {
                out!(" {:>15}", "failed");
                continue;
            }
            let m = med(cells, p);
            let base = tl.filter(|&b| !runs[b][ci].is_empty()).map(|b| med(&runs[b][ci], p));
            let ratio = base.map_or(f64::NAN, |b| m / b);
            out!(" {:>15}", format!("{m:.2} ({ratio:.2})"));
            let list = |f: fn(&Cell) -> f64| common::json_list(&cells.iter().map(f).collect::<Vec<_>>(), 3);
            let c = t.confs[ci];
            json.push(format!(
                "{{\"table\":\"{}\",\"approach\":{},\"mmcid\":{},\"object_bytes\":{},\"threads\":{},\"producers\":{},\
                 \"consumers\":{},\"cpu_ns\":{},\"wall_ns\":{},\"vs_thread_local\":{},\"vs_best_peer\":{},\
                 \"peak_bytes\":{},\"final_bytes\":{},\"shards\":{},\"misses_per_1000\":{},\"stranded_bytes\":{},\
                 \"bound_bytes\":{},\"cpu_ns_runs\":[{}],\"wall_ns_runs\":[{}],\"peak_bytes_runs\":[{}]}}",
                t.id,
                common::json_str(l.name),
                l.ours,
                t.object_bytes,
                c.threads,
                c.producers,
                c.consumers,
                common::json_num(med(cells, |c| c.cpu_ns), 3),
                common::json_num(med(cells, |c| c.wall_ns), 3),
                common::json_num(ratio, 4),
                common::json_num(m / best_peer(ci), 4),
                common::json_num(med(cells, |c| c.peak_bytes), 0),
                common::json_num(med(cells, |c| c.final_bytes), 0),
                cells.iter().filter_map(|c| c.shards).max().map_or("null".into(), |s| s.to_string()),
                common::json_num(med(cells, |c| c.misses_per_1000), 3),
                common::json_num(med(cells, |c| c.stranded_bytes.unwrap_or(f64::NAN)), 0),
                common::json_num(med(cells, |c| c.bound_bytes.unwrap_or(f64::NAN)), 0),
                list(|c| c.cpu_ns),
                list(|c| c.wall_ns),
                list(|c| c.peak_bytes),
            ));
        }
        outln!();
    }
    for (li, l) in t.lines.iter().enumerate().filter(|(_, l)| l.ours) {
        out!("  {:width$}", format!("{} / best peer", l.name.strip_prefix("mmcid ").unwrap_or(l.name)));
        for ci in 0..t.confs.len() {
            match runs[li][ci].is_empty() {
                false => out!(" {:>15}", format!("{:.2}x", med(&runs[li][ci], p) / best_peer(ci))),
                true => out!(" {:>15}", "-"),
            }
        }
        outln!();
    }
    head("bytes cached, peak / final");
    for (li, l) in t.lines.iter().enumerate() {
        out!("  {:width$}", l.name);
        for ci in 0..t.confs.len() {
            let cells = &runs[li][ci];
            let text = format!("{} / {}", bytes(med(cells, |c| c.peak_bytes)), bytes(med(cells, |c| c.final_bytes)));
            out!(" {:>15}", text);
        }
        outln!();
    }
    head("magazines or shards; misses per 1000 gets");
    for (li, l) in t.lines.iter().enumerate() {
        out!("  {:width$}", l.name);
        for ci in 0..t.confs.len() {
            let cells = &runs[li][ci];
            let shards = cells.iter().filter_map(|c| c.shards).max().map_or("-".into(), |s| s.to_string());
            out!(" {:>15}", format!("{shards}; {:.1}", med(cells, |c| c.misses_per_1000)));
        }
        outln!();
    }
    if t.work == Work::Churn {
        head("stranded: bytes a fresh thread could not reach after the last round");
        for (li, l) in t.lines.iter().enumerate() {
            out!("  {:width$}", l.name);
            for ci in 0..t.confs.len() {
                out!(" {:>15}", bytes(med(&runs[li][ci], |c| c.stranded_bytes.unwrap_or(f64::NAN))));
            }
            outln!();
        }
    }
}

/// Per-repeat values of `f(ours, other)` over the repeats both have.
fn paired(ours: &[Cell], other: &[Cell], f: impl Fn(&Cell, &Cell) -> f64) -> Vec<f64> {
    ours.iter().zip(other).map(|(a, b)| f(a, b)).collect()
}

/// The goals' verdicts for one table.
fn verdicts(t: &Table, runs: &Runs, cores: usize) -> Vec<Verdict> {
    let mut out = Vec::new();
    let Some(tl) = t.lines.iter().position(|l| l.name == "thread-local cache") else { return out };
    let p = primary(t.work);
    let globals: Vec<usize> = (0..t.lines.len()).filter(|&i| t.lines[i].global).collect();
    // Per repeat, the best of the global pools and the allocator in that repeat.
    let best_global = |ci: usize| -> Vec<f64> {
        let n = globals.iter().map(|&g| runs[g][ci].len()).min().unwrap_or(0);
        (0..n).map(|r| globals.iter().map(|&g| p(&runs[g][ci][r])).fold(f64::INFINITY, f64::min)).collect()
    };
    for (li, l) in t.lines.iter().enumerate().filter(|(_, l)| l.ours) {
        let mut push = |goal, per_conf: Vec<(String, Vec<f64>)>, ok: &dyn Fn(f64) -> bool, unit: &str| {
            let all: Vec<f64> = per_conf.iter().flat_map(|(_, xs)| xs.iter().copied()).collect();
            let worst_word = per_conf
                .iter()
                .map(|(_, xs)| judge(xs, ok))
                .max_by_key(|w| match *w {
                    "met" => 0,
                    "inconclusive" => 1,
                    _ => 2,
                })
                .unwrap_or("inconclusive");
            let detail = per_conf
                .iter()
                .map(|(label, xs)| format!("{label} {:.2}{unit}", common::median(xs)))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = all;
            out.push(Verdict { table: t.id.clone(), goal, line: l.name, verdict: worst_word, detail });
        };
        let confs = 0..t.confs.len();
        match t.work {
            Work::Hot => {
                let vs_tl = confs
                    .clone()
                    .map(|ci| (t.confs[ci].label(), paired(&runs[li][ci], &runs[tl][ci], |a, b| p(a) / p(b))));
                push("W1 time <= 1.2 x thread-local cache", vs_tl.collect(), &|x| x <= 1.2, "x");
                let vs_g = confs.map(|ci| {
                    let g = best_global(ci);
                    (t.confs[ci].label(), runs[li][ci].iter().zip(g).map(|(a, b)| p(a) / b).collect())
                });
                push("W1 faster than the allocator and every global pool", vs_g.collect(), &|x| x < 1.0, "x");
            }
            Work::Burst(_) => {
                let big: Vec<usize> = confs.filter(|&ci| t.confs[ci].threads >= 16 * cores).collect();
                let mem = big.iter().map(|&ci| {
                    (t.confs[ci].label(), paired(&runs[li][ci], &runs[tl][ci], |a, b| a.peak_bytes / b.peak_bytes))
                });
                push("W2 peak bytes cached <= 1/4 thread-local (T >= 16 x cores)", mem.collect(), &|x| x <= 0.25, "x");
                let time = big
                    .iter()
                    .map(|&ci| (t.confs[ci].label(), paired(&runs[li][ci], &runs[tl][ci], |a, b| p(a) / p(b))));
                push("W2 time <= 1.3 x thread-local (T >= 16 x cores)", time.collect(), &|x| x <= 1.3, "x");
            }
            Work::Channel => {
                let mem = confs.clone().map(|ci| {
                    let xs = runs[li][ci].iter().map(|c| c.peak_bytes / c.bound_bytes.unwrap_or(f64::NAN)).collect();
                    (t.confs[ci].label(), xs)
                });
                push(
                    "W3 peak bytes cached within the pool's bound (2 x CIDs + depot limit) x magazine",
                    mem.collect(),
                    &|x| x <= 1.0,
                    "x bound",
                );
                let thr = confs.map(|ci| {
                    let g = best_global(ci);
                    (t.confs[ci].label(), runs[li][ci].iter().zip(g).map(|(a, b)| p(a) / b).collect())
                });
                push(
                    "W3 throughput ahead of every global pool (wall ns / best global's)",
                    thr.collect(),
                    &|x| x < 1.0,
                    "x",
                );
            }
            Work::Churn => {
                let st = confs.map(|ci| {
                    let xs = runs[li][ci].iter().map(|c| c.stranded_bytes.unwrap_or(f64::NAN)).collect();
                    (t.confs[ci].label(), xs)
                });
                push("W4 nothing stranded by exited threads (bytes)", st.collect(), &|x| x == 0.0, "B");
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Command line, main

struct Opts {
    workloads: Vec<u8>,
    threads: Vec<usize>,
    seconds: f64,
    repeats: usize,
    /// `--only SUBSTRING`: run only the approaches whose name contains it (a diagnostic).
    only: Option<String>,
    json: Option<common::JsonFile>,
}

const USAGE: &str = "\
object pools as users write them: mmcid's Pool against the allocator, a thread-local cache and the ecosystem's pools

usage: pool [options]

      --compare             accepted for symmetry with the other benchmarks (comparing is all this does)
      --workloads LIST      comma-separated: w1, w2, w3, w4 (default: all four)
  -t, --threads LIST        comma-separated thread counts of w1, w2 and w4 (default: 1, cores, 4, 16 and 128 x cores);
                            w3 runs its four shapes 1P1C, 4P1C, 1P4C, 4P4C
      --seconds S           each cell's run time in seconds (default 0.03)
  -r, --repeats N           interleaved repeats; medians are reported (default 1: about 2 minutes on 2 cores)
      --json FILE           also write every cell and verdict as JSON
      --only SUBSTRING      run only the approaches whose name contains SUBSTRING (a diagnostic: no verdicts)
  -h, --help                this text

W1: get -> write -> put (64 bytes, 4 KiB); W2: bursts of 4 with the pool 100, 10 and 1 % of the time; W3: producers
-> consumers; W4: thread churn. One table per workload: CPU ns per get + put (W3: wall ns) with the ratio to the
thread-local cache, each mmcid line against the best peer, bytes cached (peak / final), magazines or shards and
misses per 1000 gets (W4: bytes stranded), then the goals' verdicts. Every cell checks that no object was handed
out twice at once and none was lost; exits 1 if one failed.
";

const FLAGS: &[Flag] = &[
    Flag::switch("--compare", None),
    Flag::value("--workloads", None),
    Flag::value("--threads", Some("-t")),
    Flag::value("--seconds", None),
    Flag::value("--repeats", Some("-r")),
    Flag::value("--json", None),
    Flag::value("--only", None),
];

fn config(args: &Args, cpus: usize) -> Result<Opts, String> {
    let workloads = match args.value("--workloads") {
        None => vec![1, 2, 3, 4],
        Some(list) => {
            let mut v = Vec::new();
            for s in list.split(',') {
                let w = match s {
                    "w1" => 1,
                    "w2" => 2,
                    "w3" => 3,
                    "w4" => 4,
                    _ => {
                        return Err(format!("{}: unknown workload {s:?} (w1, w2, w3, w4)", args.spelled("--workloads")))
                    }
                };
                if v.contains(&w) {
                    return Err(format!("{}: {s} named twice", args.spelled("--workloads")));
                }
                v.push(w);
            }
            v
        }
    };
    let threads = match args.value("--threads") {
        None => {
            let mut v = Vec::new();
            for t in [1, cpus, 4 * cpus, 16 * cpus, 128 * cpus] {
                if !v.contains(&t) && t <= common::MAX_THREADS {
                    v.push(t);
                }
            }
            v
        }
        Some(list) => list
            .split(',')
            .map(|s| match s.parse::<usize>() {
                Ok(t) if (1..=common::MAX_THREADS).contains(&t) => Ok(t),
                _ => Err(format!(
                    "{}: {s:?} is not a thread count from 1 to {}",
                    args.spelled("--threads"),
                    common::MAX_THREADS
                )),
            })
            .collect::<Result<_, _>>()?,
    };
    let seconds = args.get("--seconds", |v| {
        v.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
            .ok_or_else(|| "expected a number of seconds in (0, 3600]".to_string())
    })?;
    Ok(Opts {
        workloads,
        threads,
        seconds: seconds.unwrap_or(0.03),
        repeats: args.positive("--repeats")?.unwrap_or(1),
        only: args.value("--only").map(str::to_string),
        json: args.value("--json").map(common::JsonFile::create).transpose()?,
    })
}

/// The `w2` private rounds that make the pool 10 % and 1 % of a thread's time: a burst of the thread-local cache at
/// one thread against one round of private work, both timed here.
fn calibrate() -> Result<(u32, u32), String> {
    let make = || TlCache::<Small> { local: ThreadLocal::new(), overflow: parking_lot::Mutex::new(Vec::new()) };
    let cell = measure(make, Work::Burst(0), |a| run_loops(a, Work::Burst(0), 1, 0.02))?;
    let burst_ns = cell.cpu_ns * BURST as f64;
    let n = 1_000_000u32;
    let t0 = thread_cpu_ns();
    std::hint::black_box(private(std::hint::black_box(1), n));
    let round_ns = (thread_cpu_ns() - t0) as f64 / n as f64;
    let rounds = |times: f64| ((times * burst_ns / round_ns.max(1e-3)).round() as u32).max(1);
    Ok((rounds(9.0), rounds(99.0)))
}

/// Runs every table's cells, `repeats` times interleaved; returns each table's runs and whether every check passed.
fn run_all(tables: &[Table], seconds: f64, repeats: usize, progress: bool) -> (Vec<Runs>, bool) {
    let mut runs: Vec<Runs> = tables.iter().map(|t| vec![vec![Vec::new(); t.confs.len()]; t.lines.len()]).collect();
    let total: usize = tables.iter().map(|t| t.lines.len() * t.confs.len()).sum::<usize>() * repeats;
    let mut bar = common::Progress::new(total);
    let mut ok = true;
    for rep in 0..repeats {
        for (ti, t) in tables.iter().enumerate() {
            for (ci, &conf) in t.confs.iter().enumerate() {
                // Every approach once per repeat and column, in an order that rotates.
                for k in 0..t.lines.len() {
                    let li = (k + rep + ci) % t.lines.len();
                    if progress {
                        bar.step(format_args!("{} {} {}", t.id, t.lines[li].name, conf.label()));
                    }
                    match (t.lines[li].run)(conf, seconds) {
                        Ok(cell) => runs[ti][li][ci].push(cell),
                        Err(e) => {
                            bar.interrupt();
                            errln!("pool: {} {} {}: {e}", t.id, t.lines[li].name, conf.label());
                            ok = false;
                        }
                    }
                }
            }
        }
    }
    if progress {
        bar.finish();
    }
    (runs, ok)
}

fn main() -> ExitCode {
    let cpus = match mmcid::CpuSet::current() {
        Ok(set) => set.iter().count(),
        Err(e) => {
            errln!("pool: cannot read this thread's CPUs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = cli::parse_or_exit("pool", USAGE, FLAGS, |args| config(args, cpus));
    let rounds = if opts.workloads.contains(&2) {
        match calibrate() {
            Ok(r) => r,
            Err(e) => {
                errln!("pool: calibration failed: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        (0, 0)
    };
    let probe = Pool::new(&Group::new(), || 0u8);
    outln!(
        "pool: {cpus} allowed CPUs; {} s per cell, median of {} repeats; mmcid Pool: magazines of {}, depot limit {}; \
         thread-local cache: {TL_CAP} a thread; ArrayQueue and opool: {QUEUE_CAP}",
        opts.seconds,
        opts.repeats,
        probe.magazine_size(),
        probe.depot_limit()
    );
    drop(probe);
    let mut tables = tables(&opts.workloads, &opts.threads, rounds);
    if let Some(only) = &opts.only {
        for t in &mut tables {
            t.lines.retain(|l| l.name.contains(only.as_str()));
        }
    }
    let (runs, ok) = run_all(&tables, opts.seconds, opts.repeats, true);
    let mut json = Vec::new();
    let mut all_verdicts = Vec::new();
    for (t, r) in tables.iter().zip(&runs) {
        report(t, r, &mut json);
        all_verdicts.extend(verdicts(t, r, cpus));
    }
    outln!("\ngoals (each mmcid line; per repeat, paired with the peers' runs of the same repeat):");
    for v in &all_verdicts {
        outln!("  {} {} [{}]: {} ({})", v.table, v.goal, v.line, v.verdict, v.detail);
    }
    if let Some(file) = opts.json {
        let verdicts: Vec<String> = all_verdicts
            .iter()
            .map(|v| {
                format!(
                    "{{\"table\":{},\"goal\":{},\"approach\":{},\"verdict\":{},\"detail\":{}}}",
                    common::json_str(&v.table),
                    common::json_str(v.goal),
                    common::json_str(v.line),
                    common::json_str(v.verdict),
                    common::json_str(&v.detail)
                )
            })
            .collect();
        let body = format!(
            "{{\"benchmark\":\"pool\",\"seconds\":{},\"repeats\":{},\"allowed_cpus\":{cpus},\"w2_private_rounds\":[0,{},{}],\
             \"results\":[{}],\"verdicts\":[{}]}}\n",
            opts.seconds,
            opts.repeats,
            rounds.0,
            rounds.1,
            json.join(","),
            verdicts.join(",")
        );
        if let Err(e) = file.write(&body) {
            errln!("pool: {e}");
            return ExitCode::FAILURE;
        }
    }
    if !ok {
        errln!("pool: some cells failed their checks (above)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The accounting is global: the tests that run cells take turns.
    static CELLS: Mutex<()> = Mutex::new(());

    fn turn() -> std::sync::MutexGuard<'static, ()> {
        CELLS.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn parse(words: &[&str]) -> Result<Option<Opts>, String> {
        cli::parse_words(FLAGS, words, |a| config(a, 2))
    }

    /// Defaults (2 allowed CPUs) and errors naming the argument; the usage lists every flag.
    #[test]
    fn command_line() {
        let o = parse(&[]).unwrap().unwrap();
        assert_eq!((o.threads, o.workloads, o.repeats), (vec![1, 2, 8, 32, 256], vec![1, 2, 3, 4], 1));
        let o = parse(&["-t", "3,1", "--workloads=w3,w1", "--seconds", "0.5", "--compare"]).unwrap().unwrap();
        assert_eq!((o.threads, o.workloads, o.seconds), (vec![3, 1], vec![3, 1], 0.5));
        assert!(parse(&["--help"]).unwrap().is_none());
        for (words, want) in [
            (&["--threads", "0"][..], r#"--threads: "0" is not a thread count"#),
            (&["--workloads", "w5"], r#"--workloads: unknown workload "w5""#),
            (&["--workloads", "w1,w1"], "--workloads: w1 named twice"),
            (&["--seconds", "0"], r#"--seconds: expected a number of seconds in (0, 3600], got "0""#),
            (&["-r", "0"], r#"-r: expected a positive integer, got "0""#),
            (&["8"], r#"unexpected argument "8""#),
        ] {
            let e = parse(words).map(|_| ()).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }

    /// Every approach runs every workload once at tiny sizes, and every cell's checks pass; the verdicts and the
    /// report come out for each table.
    #[test]
    fn every_approach_and_workload_passes_its_checks() {
        let _turn = turn();
        let tables = tables(&[1, 2, 3, 4], &[1, 3], (2, 20));
        assert_eq!(tables.len(), 7);
        let (runs, ok) = run_all(&tables, 0.002, 1, false);
        assert!(ok, "a cell failed its checks (stderr)");
        for (t, r) in tables.iter().zip(&runs) {
            assert!(r.iter().all(|line| line.iter().all(|cells| cells.len() == 1)), "{}", t.id);
            let v = verdicts(t, r, 2);
            assert!(!v.is_empty(), "{}", t.id);
        }
        // The churn table measured what a fresh thread could not reach: nothing for the global pools.
        let w4 = tables.iter().position(|t| t.id == "w4").unwrap();
        let mutex = tables[w4].lines.iter().position(|l| l.name == "parking_lot::Mutex<Vec>").unwrap();
        assert_eq!(runs[w4][mutex][0][0].stranded_bytes, Some(0.0));
    }

    /// The checkers catch what they are for: an object handed out twice at once, one put back twice, and an approach
    /// that loses objects.
    #[test]
    fn the_checkers_fail_on_a_broken_pool() {
        let _turn = turn();
        /// Hands out the same object to every get: a pool that gives an object twice at once.
        struct Twice;
        /// A pointer to the thread's one object.
        struct Alias(*mut Small);
        impl Deref for Alias {
            type Target = Small;
            fn deref(&self) -> &Small {
                // SAFETY: the object is the worker's `Local` box, alive for the whole loop; the references made here
                // and in `deref_mut` are temporaries of one statement each on the worker's thread, never live at once.
                unsafe { &*self.0 }
            }
        }
        impl DerefMut for Alias {
            fn deref_mut(&mut self) -> &mut Small {
                // SAFETY: as in `deref`.
                unsafe { &mut *self.0 }
            }
        }
        impl Approach for Twice {
            type O = Small;
            type Local = Box<Small>;
            type Cx<'l> = *mut Small;
            type Item<'a> = Alias;
            fn local(&self) -> Box<Small> {
                Box::new(Small::new())
            }
            fn enter<'l>(&'l self, l: &'l mut Box<Small>) -> *mut Small {
                &mut **l
            }
            fn get(&self, cx: &mut *mut Small) -> Alias {
                Alias(*cx)
            }
            fn put(&self, _: &mut *mut Small, _: Alias) {}
        }
        let e = measure(|| Twice, Work::Burst(0), |a| run_loops(a, Work::Burst(0), 1, 0.001)).unwrap_err();
        assert!(e.contains("handed out twice"), "{e}");

        /// Forgets every object put back: objects lost.
        struct Leaky;
        impl Approach for Leaky {
            type O = Small;
            type Local = ();
            type Cx<'l> = ();
            type Item<'a> = Box<Small>;
            fn local(&self) {}
            fn enter(&self, _: &mut ()) {}
            fn get(&self, _: &mut ()) -> Box<Small> {
                Box::new(Small::new())
            }
            fn put(&self, _: &mut (), item: Box<Small>) {
                std::mem::forget(item);
            }
        }
        let e = measure(|| Leaky, Work::Hot, |a| run_loops(a, Work::Hot, 1, 0.001)).unwrap_err();
        assert!(e.contains("not dropped"), "{e}");
        // `measure` rebased the accounting: the next cell starts from zero.
        let (c, d, h) = totals();
        assert_eq!((c - d, h), (0, 0));
    }
}
