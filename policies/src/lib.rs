//! The Linux kernel's historical CID policies, for mmcid's benchmarks and comparisons (a workspace crate, not
//! published).
//!
//! Each type here hands out CIDs the way one generation of the Linux kernel's `mm_cid` did, behind one trait,
//! [`Policy`], so the workloads in mmcid's `examples/` can run every policy in the same harness and the same run:
//!
//! | policy | kernel | enter | exit |
//! |---|---|---|---|
//! | [`NoCid`] | `CONFIG_SCHED_MM_CID=n` | nothing (the baseline) | nothing |
//! | [`MutexCids`] | v6.3 (v1) | group lock, take the smallest free ID | group lock, give it back |
//! | [`BitmapCids`] | 2025 naive (v3) | first-zero test-and-set on atomic words | clear the bit |
//! | [`LazyCids`] | v6.4–v6.17 (v2) | borrow the core's lazily kept CID (one CAS) | give it back to the core |
//! | [`MmCid`] | v6.19+ design, mmcid | [`Registration::enter`] | [`CidGuard`] drop |
//!
//! Every policy keeps mmcid's invariant I1, exclusivity (no two live guards of one policy instance carry the same
//! CID, when each was entered with a thread state that instance's [`Policy::thread`] made), and I8, hand-over
//! visibility (what a CID's previous holder wrote is visible to its next one), and every CID stays below the number
//! of threads holding guards at once plus the number of possible cores, so `threads + cores` slots are
//! enough for per-CID data. A guard is a value whose drop gives the CID back (≈ schedule-out), so the measured
//! path of [`MmCid`] is the library's real [`CidGuard`].
//!
//! ```
//! use mmcid_policies::{BitmapCids, Policy, PolicyGuard};
//!
//! let policy = BitmapCids::new(4)?;
//! let mut a = policy.thread(None);
//! let mut b = policy.thread(None);
//! let ga = policy.enter(&mut a);
//! let gb = policy.enter(&mut b);
//! assert_ne!(ga.cid(), gb.cid());
//! drop((ga, gb));
//! assert_eq!(policy.cids_in_use(), 0);
//! # Ok::<(), mmcid::Error>(())
//! ```

use crossbeam_utils::CachePadded;
use mmcid::{CidGuard, Error, Group, Registration};
use parking_lot::Mutex;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::time::{Duration, Instant};

/// A CID policy: per-thread state made once per thread (≈ fork), and a guard per stretch of work (≈ running).
pub trait Policy: Send + Sync {
    /// Per-thread state (≈ the kernel's per-task CID state). Dropping it ends the thread's membership (≈ exit).
    type Thread: Send;
    /// Proof that the holder owns [`PolicyGuard::cid`] exclusively; dropping it gives the CID back.
    type Guard<'a>: PolicyGuard
    where
        Self: 'a;

    /// Short name used by the examples (`none`, `mutex`, `bitmap`, `lazy-all`, `lazy-visited`, `mmcid`).
    fn name(&self) -> &'static str;

    /// Per-thread state for a new thread. `cpu` is the core the thread is pinned to, if it is: policies that
    /// look up the current core use it instead of `sched_getcpu`.
    fn thread(&self, cpu: Option<usize>) -> Self::Thread;

    /// Takes a CID for the life of the returned guard (≈ schedule-in). `thread` must come from this instance's
    /// [`Policy::thread`]: a thread state of another instance enters that other instance's CID space (with
    /// [`MmCid`], another group's), so its guard may share a CID with this instance's guards.
    fn enter<'a>(&'a self, thread: &'a mut Self::Thread) -> Self::Guard<'a>;

    /// CIDs marked in use now (racy unless quiescent); 0 for [`NoCid`].
    fn cids_in_use(&self) -> usize;
}

/// A live guard of some [`Policy`].
pub trait PolicyGuard {
    /// The CID this guard holds.
    fn cid(&self) -> usize;
}

impl PolicyGuard for CidGuard<'_> {
    #[inline]
    fn cid(&self) -> usize {
        CidGuard::cid(self).get()
    }
}

/// The calling thread's core (0 if the OS cannot tell): mmcid's own read, so every policy pays the same.
#[inline]
fn current_cpu() -> usize {
    mmcid::__private::current_cpu()
}

/// `Ok(value)` if `min <= value <= max`, else [`Error::ValueOutOfRange`] naming `what` (as mmcid's own checks).
fn check_range(what: &'static str, value: usize, min: usize, max: usize) -> Result<usize, Error> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(Error::ValueOutOfRange { what, value, min, max })
    }
}

/// Number of possible cores of this machine: the library's own bound on CPU numbers (design.md §12.3).
fn possible_cpus() -> usize {
    mmcid::__private::possible_cpus()
}

// ---------------------------------------------------------------------------------------------------------------
// none

/// No CID management (the baseline): each thread uses its own index, fixed when its state is made.
///
/// The index is unique per [`Policy::thread`] call (so I1 holds), but neither compact nor bounded by cores: it is
/// what a program without CIDs would use, a per-thread shard.
#[derive(Debug, Default)]
pub struct NoCid {
    next: AtomicUsize,
}

impl NoCid {
    /// A new baseline policy.
    pub fn new() -> NoCid {
        NoCid::default()
    }
}

/// [`NoCid`]'s per-thread state: the thread's index.
#[derive(Debug)]
pub struct NoCidThread {
    index: usize,
}

/// [`NoCid`]'s guard: the thread's index, no work at enter or exit.
#[derive(Debug)]
pub struct NoCidGuard<'a> {
    index: usize,
    _thread: PhantomData<&'a mut NoCidThread>,
}

impl PolicyGuard for NoCidGuard<'_> {
    #[inline]
    fn cid(&self) -> usize {
        self.index
    }
}

impl Policy for NoCid {
    type Thread = NoCidThread;
    type Guard<'a> = NoCidGuard<'a>;

    fn name(&self) -> &'static str {
        "none"
    }

    fn thread(&self, _cpu: Option<usize>) -> NoCidThread {
        NoCidThread { index: self.next.fetch_add(1, Relaxed) }
    }

    #[inline]
    fn enter<'a>(&'a self, thread: &'a mut NoCidThread) -> NoCidGuard<'a> {
        NoCidGuard { index: thread.index, _thread: PhantomData }
    }

    fn cids_in_use(&self) -> usize {
        0
    }
}

// ---------------------------------------------------------------------------------------------------------------
// mutex (kernel v1)

/// Kernel v1 (v6.3): one group lock around "take the smallest free ID" at every enter and "give it back" at
/// every exit. The lock hand-over makes the previous holder's writes visible to the next one (I8).
#[derive(Debug, Default)]
pub struct MutexCids {
    ids: Mutex<Vec<u64>>,
}

impl MutexCids {
    /// A new v1 policy.
    pub fn new() -> MutexCids {
        MutexCids::default()
    }
}

/// [`MutexCids`]'s guard.
#[derive(Debug)]
pub struct MutexCidGuard<'a> {
    policy: &'a MutexCids,
    cid: usize,
    _thread: PhantomData<&'a mut ()>,
}

impl PolicyGuard for MutexCidGuard<'_> {
    #[inline]
    fn cid(&self) -> usize {
        self.cid
    }
}

impl Drop for MutexCidGuard<'_> {
    fn drop(&mut self) {
        let mut ids = self.policy.ids.lock();
        ids[self.cid / 64] &= !(1u64 << (self.cid % 64));
    }
}

impl Policy for MutexCids {
    type Thread = ();
    type Guard<'a> = MutexCidGuard<'a>;

    fn name(&self) -> &'static str {
        "mutex"
    }

    fn thread(&self, _cpu: Option<usize>) {}

    #[inline]
    fn enter<'a>(&'a self, _thread: &'a mut ()) -> MutexCidGuard<'a> {
        let mut ids = self.ids.lock();
        let cid = match ids.iter().position(|&w| w != u64::MAX) {
            Some(i) => {
                let bit = ids[i].trailing_ones() as usize;
                ids[i] |= 1 << bit;
                i * 64 + bit
            }
            None => {
                ids.push(1);
                (ids.len() - 1) * 64
            }
        };
        drop(ids);
        MutexCidGuard { policy: self, cid, _thread: PhantomData }
    }

    fn cids_in_use(&self) -> usize {
        self.ids.lock().iter().map(|w| w.count_ones() as usize).sum()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// bitmap (kernel 2025 naive)

/// A fixed array of atomic words: first-zero scan validated by `fetch_or` (Acquire), clear by `fetch_and`
/// (Release), so whatever the previous holder of a bit wrote is visible to the next one.
#[derive(Debug)]
struct AtomicBits {
    words: Box<[AtomicU64]>,
}

impl AtomicBits {
    fn new(bits: usize) -> AtomicBits {
        AtomicBits { words: (0..bits.div_ceil(64).max(1)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Sets the lowest clear bit and returns it; yields and rescans while every bit is set (the caller sized the
    /// array for the most bits held at once, so that wait ends when a holder exits).
    #[inline]
    fn alloc(&self) -> usize {
        loop {
            for (i, word) in self.words.iter().enumerate() {
                let mut v = word.load(Relaxed);
                while v != u64::MAX {
                    let bit = (!v).trailing_zeros();
                    let old = word.fetch_or(1 << bit, Acquire);
                    if old & (1 << bit) == 0 {
                        return i * 64 + bit as usize;
                    }
                    v = old;
                }
            }
            std::thread::yield_now();
        }
    }

    #[inline]
    fn free(&self, bit: usize) {
        self.words[bit / 64].fetch_and(!(1u64 << (bit % 64)), Release);
    }

    fn count(&self) -> usize {
        self.words.iter().map(|w| w.load(Relaxed).count_ones() as usize).sum()
    }
}

/// Kernel 2025 naive design (Gleixner's first simplification): first-zero test-and-set on atomic words at every
/// enter, clear at exit, no caching.
#[derive(Debug)]
pub struct BitmapCids {
    bits: AtomicBits,
}

impl BitmapCids {
    /// A policy for at most `capacity` guards alive at once (an enter beyond that yields until a guard is
    /// dropped, like the kernel's retry).
    ///
    /// # Errors
    ///
    /// [`Error::ValueOutOfRange`] for a capacity of 0 or above [`MAX_CAPACITY`].
    pub fn new(capacity: usize) -> Result<BitmapCids, Error> {
        check_range("capacity", capacity, 1, MAX_CAPACITY)?;
        Ok(BitmapCids { bits: AtomicBits::new(capacity) })
    }
}

/// [`BitmapCids`]'s guard.
#[derive(Debug)]
pub struct BitmapGuard<'a> {
    policy: &'a BitmapCids,
    cid: usize,
    _thread: PhantomData<&'a mut ()>,
}

impl PolicyGuard for BitmapGuard<'_> {
    #[inline]
    fn cid(&self) -> usize {
        self.cid
    }
}

impl Drop for BitmapGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.policy.bits.free(self.cid);
    }
}

impl Policy for BitmapCids {
    type Thread = ();
    type Guard<'a> = BitmapGuard<'a>;

    fn name(&self) -> &'static str {
        "bitmap"
    }

    fn thread(&self, _cpu: Option<usize>) {}

    #[inline]
    fn enter<'a>(&'a self, _thread: &'a mut ()) -> BitmapGuard<'a> {
        BitmapGuard { policy: self, cid: self.bits.alloc(), _thread: PhantomData }
    }

    fn cids_in_use(&self) -> usize {
        self.bits.count()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// lazy (kernel v6.4 – v6.17)

/// Which cores the [`LazyCids`] compaction scan walks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    /// Every possible core (kernel v6.4–v6.17).
    All,
    /// Only the cores the group has used (the 2026 visited-CPU reduction).
    Visited,
}

/// The most guards a [`BitmapCids`] or [`LazyCids`] can be sized for: mmcid's own CID space (2^20).
pub const MAX_CAPACITY: usize = mmcid::__private::MAX_CIDS;

/// Settings of a [`LazyCids`] policy.
#[derive(Clone, Copy, Debug)]
pub struct LazyConfig {
    /// Which cores the compaction scan walks.
    pub scan: Scan,
    /// The most guards alive at once (sizes the bitmap together with `cores`).
    pub capacity: usize,
    /// Number of core slots (default: the machine's possible cores; at most 65 536); threads map to
    /// `cpu % cores`.
    pub cores: usize,
    /// Compaction period (kernel: 100 ms), one per policy instance.
    pub period: Duration,
    /// A thread checks the clock at its first enter and then every this many of its enters (kernel: on the tick
    /// of whichever task of the mm is running), so the period holds however short-lived the threads are.
    pub check_every: u32,
}

impl LazyConfig {
    /// Kernel defaults: every possible core, 100 ms period, clock checked at a thread's first enter and every
    /// 256 enters after.
    pub fn new(scan: Scan, capacity: usize) -> LazyConfig {
        LazyConfig { scan, capacity, cores: possible_cpus(), period: Duration::from_millis(100), check_every: 256 }
    }
}

/// Slot word: `EMPTY`, or `VALID | [BUSY] | [RECENT] | cid`.
const EMPTY: u32 = 0;
const VALID: u32 = 1 << 31;
/// A thread entered on this core is using the core's CID: only that thread writes the slot until it clears BUSY.
const BUSY: u32 = 1 << 30;
/// Used since the last compaction scan.
const RECENT: u32 = 1 << 29;
const CID_MASK: u32 = RECENT - 1;

/// Kernel v6.4–v6.17 (Desnoyers' lazy per-CPU CIDs): each core keeps the CID last used on it; a thread entering
/// on the core borrows it with one CAS, and a periodic compaction scan (every `period` of the policy instance, run
/// by whichever thread notices the period elapsed) gives back the CIDs of cores not used since the previous scan.
///
/// The kernel starts the scan from the scheduler tick of whichever task of the mm is running, so it runs every
/// period however short-lived the tasks are. Here each thread looks at the clock at its first enter and then every
/// `check_every` enters: a long-lived thread pays one countdown decrement per enter, and threads that enter only a
/// couple of times in their life (thread-pool churn) still keep the period, one clock read per thread.
///
/// I1: a borrowed slot is marked BUSY by the borrowing CAS and nobody else writes a BUSY slot, so two threads on
/// one core never share; a thread that finds its core's CID busy (the holder was descheduled inside its guard)
/// takes a temporary CID from the bitmap and clears it at exit. The compaction releases a slot's CID only by a CAS
/// from a non-busy value, so it never takes a CID in use.
#[derive(Debug)]
pub struct LazyCids {
    slots: Box<[CachePadded<AtomicU32>]>,
    bits: AtomicBits,
    visited: Box<[AtomicU64]>,
    scan: Scan,
    start: Instant,
    period_ns: u64,
    check_every: u32,
    next_scan: CachePadded<AtomicU64>,
    scans: AtomicU64,
    reclaimed: AtomicU64,
}

impl LazyCids {
    /// A policy with kernel defaults ([`LazyConfig::new`]) for at most `capacity` guards alive at once; errors as
    /// [`LazyCids::with_config`].
    pub fn new(scan: Scan, capacity: usize) -> Result<LazyCids, Error> {
        LazyCids::with_config(LazyConfig::new(scan, capacity))
    }

    /// A policy with explicit settings.
    ///
    /// # Errors
    ///
    /// [`Error::ValueOutOfRange`] for a capacity of 0 or above [`MAX_CAPACITY`] less the cores, or for 0 or more
    /// than 65 536 cores (CIDs come from `capacity + cores` bits).
    pub fn with_config(config: LazyConfig) -> Result<LazyCids, Error> {
        let cores = config.cores;
        check_range("cores", cores, 1, mmcid::__private::MAX_CPUS)?;
        check_range("capacity", config.capacity, 1, MAX_CAPACITY - cores)?;
        mmcid::__private::probe_rseq(); // the same core lookup as mmcid's (`current_cpu`)
        let period_ns = u64::try_from(config.period.as_nanos()).unwrap_or(u64::MAX);
        Ok(LazyCids {
            slots: (0..cores).map(|_| CachePadded::new(AtomicU32::new(EMPTY))).collect(),
            bits: AtomicBits::new(config.capacity + cores),
            visited: (0..cores.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            scan: config.scan,
            start: Instant::now(),
            period_ns,
            check_every: config.check_every.max(1),
            next_scan: CachePadded::new(AtomicU64::new(period_ns)),
            scans: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
        })
    }

    /// Number of core slots (threads map to `cpu % cores`): the most CIDs the policy keeps with no guard alive.
    pub fn cores(&self) -> usize {
        self.slots.len()
    }

    /// Compaction scans run so far.
    pub fn scans(&self) -> u64 {
        self.scans.load(Relaxed)
    }

    /// CIDs given back by compaction scans so far.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Relaxed)
    }

    /// Runs one compaction scan now: a core used since the previous scan loses its RECENT mark, a core not used
    /// since then loses its CID (CAS from the idle value, so a busy slot is never touched). Returns the number of
    /// CIDs given back.
    pub fn compact(&self) -> usize {
        self.scans.fetch_add(1, Relaxed);
        let mut freed = 0;
        match self.scan {
            Scan::All => {
                for cpu in 0..self.slots.len() {
                    freed += self.compact_slot(cpu);
                }
            }
            Scan::Visited => {
                for (i, word) in self.visited.iter().enumerate() {
                    let mut w = word.load(Relaxed);
                    while w != 0 {
                        let bit = w.trailing_zeros() as usize;
                        w &= w - 1;
                        freed += self.compact_slot(i * 64 + bit);
                    }
                }
            }
        }
        self.reclaimed.fetch_add(freed as u64, Relaxed);
        freed
    }

    fn compact_slot(&self, cpu: usize) -> usize {
        let slot = &self.slots[cpu];
        let s = slot.load(Relaxed);
        if s & VALID == 0 || s & BUSY != 0 {
            return 0;
        }
        if s & RECENT != 0 {
            // Aging: used since the last scan; a failed CAS means someone borrowed it meanwhile (used again).
            let _ = slot.compare_exchange(s, s & !RECENT, Relaxed, Relaxed);
            0
        } else if slot.compare_exchange(s, EMPTY, Acquire, Relaxed).is_ok() {
            // Acquire: the last borrower's writes (its Release store of `s`) happen before our Release clear, so
            // they are visible to the next holder of the bit (I8).
            self.bits.free((s & CID_MASK) as usize);
            1
        } else {
            0
        }
    }

    #[cold]
    fn maybe_compact(&self) {
        let now = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let next = self.next_scan.load(Relaxed);
        if now >= next
            && self.next_scan.compare_exchange(next, now.saturating_add(self.period_ns), Relaxed, Relaxed).is_ok()
        {
            self.compact();
        }
    }

    #[cold]
    fn mark_visited(&self, cpu: usize) {
        let word = &self.visited[cpu / 64];
        let bit = 1u64 << (cpu % 64);
        if word.load(Relaxed) & bit == 0 {
            word.fetch_or(bit, Relaxed);
        }
    }

    #[cold]
    fn enter_slow(&self, cpu: usize) -> Held {
        let slot = &self.slots[cpu];
        for _ in 0..3 {
            let s = slot.load(Relaxed);
            if s == EMPTY {
                self.mark_visited(cpu);
                let cid = self.bits.alloc() as u32;
                // Relaxed: nobody reads a BUSY slot's value for data (enters and the scan skip it), and the
                // guard's Release store at drop hands the CID, with the history its allocation acquired from the
                // bitmap, to the next taker (I8); nothing to acquire: an EMPTY slot holds no CID.
                return match slot.compare_exchange(EMPTY, VALID | BUSY | RECENT | cid, Relaxed, Relaxed) {
                    Ok(_) => Held::Slot { cpu, cid },
                    // Another thread on this core installed a CID meanwhile: ours serves as a temporary.
                    Err(_) => Held::Temp(cid),
                };
            }
            if s & BUSY != 0 {
                break;
            }
            if slot.compare_exchange(s, s | BUSY | RECENT, Acquire, Relaxed).is_ok() {
                return Held::Slot { cpu, cid: s & CID_MASK };
            }
        }
        Held::Temp(self.bits.alloc() as u32)
    }
}

/// What a [`LazyGuard`] holds.
#[derive(Clone, Copy, Debug)]
enum Held {
    Slot { cpu: usize, cid: u32 },
    Temp(u32),
}

/// [`LazyCids`]'s per-thread state: the pinned core, if any, and a countdown to its next look at the compaction
/// clock.
#[derive(Debug)]
pub struct LazyThread {
    cpu: Option<usize>,
    /// Enters until the next clock check (1 for a new thread: its first enter checks).
    until_check: u32,
}

/// [`LazyCids`]'s guard: a borrowed core CID or a temporary one.
#[derive(Debug)]
pub struct LazyGuard<'a> {
    policy: &'a LazyCids,
    held: Held,
    _thread: PhantomData<&'a mut LazyThread>,
}

impl PolicyGuard for LazyGuard<'_> {
    #[inline]
    fn cid(&self) -> usize {
        match self.held {
            Held::Slot { cid, .. } | Held::Temp(cid) => cid as usize,
        }
    }
}

impl Drop for LazyGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        match self.held {
            // Release: the next borrower's Acquire CAS (or the compaction's) sees our writes (I8). Only we write a
            // BUSY slot, so a plain store is enough.
            Held::Slot { cpu, cid } => self.policy.slots[cpu].store(VALID | RECENT | cid, Release),
            Held::Temp(cid) => self.policy.bits.free(cid as usize),
        }
    }
}

impl Policy for LazyCids {
    type Thread = LazyThread;
    type Guard<'a> = LazyGuard<'a>;

    fn name(&self) -> &'static str {
        match self.scan {
            Scan::All => "lazy-all",
            Scan::Visited => "lazy-visited",
        }
    }

    fn thread(&self, cpu: Option<usize>) -> LazyThread {
        LazyThread { cpu, until_check: 1 }
    }

    #[inline]
    fn enter<'a>(&'a self, thread: &'a mut LazyThread) -> LazyGuard<'a> {
        thread.until_check -= 1;
        if thread.until_check == 0 {
            thread.until_check = self.check_every;
            self.maybe_compact();
        }
        let cpu = thread.cpu.unwrap_or_else(current_cpu) % self.slots.len();
        let slot = &self.slots[cpu];
        let s = slot.load(Relaxed);
        let held =
            if s & (VALID | BUSY) == VALID && slot.compare_exchange(s, s | BUSY | RECENT, Acquire, Relaxed).is_ok() {
                Held::Slot { cpu, cid: s & CID_MASK }
            } else {
                self.enter_slow(cpu)
            };
        LazyGuard { policy: self, held, _thread: PhantomData }
    }

    fn cids_in_use(&self) -> usize {
        self.bits.count()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// mmcid

/// mmcid itself: [`Registration::enter`] and the real [`CidGuard`].
#[derive(Debug, Clone)]
pub struct MmCid {
    group: Group,
}

impl MmCid {
    /// Wraps a group.
    pub fn new(group: Group) -> MmCid {
        MmCid { group }
    }

    /// The group.
    pub fn group(&self) -> &Group {
        &self.group
    }
}

impl Policy for MmCid {
    type Thread = Registration;
    type Guard<'a> = CidGuard<'a>;

    fn name(&self) -> &'static str {
        "mmcid"
    }

    fn thread(&self, cpu: Option<usize>) -> Registration {
        let mut reg = self.group.register();
        if let Some(cpu) = cpu {
            // A core the group does not have is only a locality hint lost: ask the OS at each enter instead.
            if reg.set_cpu(Some(cpu)).is_err() {
                let _ = reg.set_cpu(None);
            }
        }
        reg
    }

    #[inline(always)]
    fn enter<'a>(&'a self, thread: &'a mut Registration) -> CidGuard<'a> {
        debug_assert_eq!(
            mmcid::__private::group_id(thread.group()),
            mmcid::__private::group_id(&self.group),
            "a registration of another group (Policy::enter)"
        );
        thread.enter()
    }

    fn cids_in_use(&self) -> usize {
        usize::try_from(self.group.stats().cids_in_use).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads that enter twice in their life (thread-pool churn) still run the periodic scan: each looks at the
    /// clock at its first enter. With a zero period, each of 20 threads in turn runs one scan; with the clock
    /// checked only every 256th enter of a thread, none would.
    #[test]
    fn short_lived_threads_run_the_compaction_scan() {
        for scan in [Scan::All, Scan::Visited] {
            let p = LazyCids::with_config(LazyConfig { period: Duration::ZERO, ..LazyConfig::new(scan, 4) }).unwrap();
            for _ in 0..20 {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        let mut t = p.thread(None);
                        drop(p.enter(&mut t));
                        drop(p.enter(&mut t));
                    });
                });
            }
            assert_eq!(p.scans(), 20, "{scan:?}");
        }
    }

    /// A long-lived thread checks the clock at its 1st enter and then every `check_every` enters: 1, 5, 9.
    #[test]
    fn a_long_lived_thread_checks_the_clock_every_check_every_enters() {
        let config = LazyConfig { period: Duration::ZERO, check_every: 4, ..LazyConfig::new(Scan::All, 1) };
        let p = LazyCids::with_config(config).unwrap();
        let mut t = p.thread(Some(0));
        let scans: Vec<u64> = (0..9)
            .map(|_| {
                drop(p.enter(&mut t));
                p.scans()
            })
            .collect();
        assert_eq!(scans, [1, 1, 1, 1, 2, 2, 2, 2, 3]);
        // A check_every of 0 counts as 1 (every enter checks).
        let p = LazyCids::with_config(LazyConfig { check_every: 0, ..config }).unwrap();
        let mut t = p.thread(Some(0));
        for _ in 0..3 {
            drop(p.enter(&mut t));
        }
        assert_eq!(p.scans(), 3);
    }
}
