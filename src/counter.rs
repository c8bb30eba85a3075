//! `ShardedCounter`: a `u64` counter with one cache-padded shard per CID, updated without read-modify-writes.
//!
//! The shards are a `SharedPerCid<AtomicU64>`: the guard holder of CID `c` (or a restartable
//! sequence on the CPU whose slot holds `c` idle, design.md §9.2) is shard `c`'s only writer (I1) and sees every
//! earlier writer's store (I8), so an update is a load and a store; `sum` only loads. The atomics are there so
//! `sum` may read while holders write, not for the update itself.

use crate::percid::{foreign, SharedPerCid};
use crate::sync::{AtomicU64, Ordering::Relaxed};
use crate::{CidGuard, Error, Group};
use std::fmt;

/// A counter of events from many threads: one cache-padded `u64` shard per CID, `sum` readable at any time.
///
/// Updates from different threads never touch the same shard, and a shard is updated with a plain load and
/// store. Getting the
/// CID costs no atomic read-modify-write while the group has no more threads than cores (per-task mode), nor
/// beyond that where the group uses restartable sequences ([`Group::uses_rseq`]; per-CPU mode): an update on a
/// core whose CID is idle is one sequence, so a thread preempted inside `add` holds nothing. Otherwise a per-CPU
/// update enters in place: it borrows the core's CID (a sequence, or one CAS without rseq), and when that CID is
/// held by a thread descheduled inside its guard it takes a temporary CID (two bitmap RMWs on the core's lane).
///
/// Memory follows real concurrency: shards are allocated on first use of a CID and kept until the counter
/// drops, and in steady state CIDs stay below [`Group::max_cids`] (I2), so there are as many as the most CIDs in
/// use at once — at most about the number of cores the group may use (`max_cids` allows up to 25 % more before a
/// group switches to per-core ownership) — where a thread-id keyed counter has one per
/// thread that ever counted. Without rseq, a thread descheduled inside an update makes the next thread on its
/// core take a temporary CID, which may add a shard beyond `max_cids` (never beyond the group's hard CID bound);
/// so may guards of the group's other users.
///
/// Arithmetic wraps (modulo 2^64): a [`sub`](ShardedCounter::sub) larger than the shard it lands on is fine, the
/// total is still exact. What [`sum`](ShardedCounter::sum) promises while other threads count is documented
/// there.
///
/// ```
/// use mmcid::{Group, ShardedCounter};
///
/// let group = Group::new();
/// let hits = ShardedCounter::new(&group);
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             for _ in 0..1000 {
///                 hits.add(1);
///             }
///         });
///     }
/// });
/// assert_eq!(hits.sum(), 4000);
/// assert!(hits.shards_allocated() <= 4 + group.cids_per_core() * group.cores()); // I2: users + K·cores
/// ```
pub struct ShardedCounter {
    group: Group,
    shards: SharedPerCid<AtomicU64>,
}

impl fmt::Debug for ShardedCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedCounter")
            .field("sum", &self.sum())
            .field("shards_allocated", &self.shards_allocated())
            .finish()
    }
}

impl ShardedCounter {
    /// A counter at zero for the threads of `group`; allocates no shard yet.
    ///
    /// The counter keeps a handle on the group (for [`add`](ShardedCounter::add)).
    pub fn new(group: &Group) -> ShardedCounter {
        ShardedCounter { group: group.clone(), shards: SharedPerCid::new(group) }
    }

    /// The group whose CIDs index the shards.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Adds `n` (wrapping) from the calling thread; no guard needed.
    ///
    /// The thread enters the group through [`Group::enter`] (it is registered on first use and unregistered at
    /// thread exit).
    ///
    /// Cost: an enter and exit of the group plus a load and a store on this CID's own shard; in rseq groups in
    /// per-CPU mode usually one restartable sequence instead (load, add, store; no enter, no exit). That needs the
    /// thread's parked registration to be of this counter's group: a thread alternating `add`s between counters of
    /// two groups takes the thread-local pool's slow path at every call (about 5 times slower, no sequences; see
    /// [`Group::enter`]), so give such a thread a [`Registration`](crate::Registration) per group and use
    /// [`add_with`](ShardedCounter::add_with). A thread that
    /// already holds a guard of the group should use [`add_with`](ShardedCounter::add_with): a nested
    /// `Group::enter` takes a second registration. Like [`Group::enter`], not for signal handlers (a handler that
    /// interrupts the thread inside the thread-local layer is undefined behaviour, see there) or a
    /// `#[global_allocator]`, and it panics where `Group::enter` does; use [`add_with`](ShardedCounter::add_with)
    /// with a guard of a registration prepared beforehand there.
    ///
    /// ```
    /// let counter = mmcid::ShardedCounter::new(&mmcid::Group::new());
    /// counter.add(40);
    /// counter.add(2);
    /// assert_eq!(counter.sum(), 42);
    /// ```
    #[cfg(not(loom))] // the thread-local layer is not compiled under loom (`add_with` is)
    #[inline]
    pub fn add(&self, n: u64) {
        self.update(n);
    }

    /// Adds `n` (wrapping): in one restartable sequence where the group allows it (design.md §9.2), else inside
    /// an in-place enter of the thread's registration.
    #[cfg(not(loom))]
    #[inline(always)]
    fn update(&self, n: u64) {
        let shards = &self.shards;
        // Groups without rseq cost this one test before the in-place enter.
        if self.group.inner.hot.rseq {
            if let Some(reg) = crate::local::parked(&self.group) {
                // SAFETY: the parked registration stays alive while we use it: `add_in_sequence` only runs the
                // sequence and looks up an installed shard, never reaching the thread-local layer (`peek_parked`).
                if unsafe { reg.as_ref() }.add_in_sequence(&self.group.inner, |c| shards.installed(c), n) {
                    return;
                }
            }
        }
        crate::local::with_cid(&self.group, |cid| bump(shards.get_cid(cid), n));
    }

    /// Subtracts `n` (wrapping) from the calling thread: see [`add`](ShardedCounter::add).
    ///
    /// The shard it lands on may go "below zero"; the total stays exact.
    ///
    /// ```
    /// let counter = mmcid::ShardedCounter::new(&mmcid::Group::new());
    /// std::thread::scope(|s| {
    ///     s.spawn(|| counter.add(10));
    /// });
    /// counter.sub(3); // possibly on another shard than the 10
    /// assert_eq!(counter.sum(), 7);
    /// ```
    #[cfg(not(loom))]
    #[inline]
    pub fn sub(&self, n: u64) {
        self.update(n.wrapping_neg());
    }

    /// Adds `n` (wrapping) on the shard of a guard the caller already holds: no enter, no exit.
    ///
    /// ```
    /// let group = mmcid::Group::new();
    /// let counter = mmcid::ShardedCounter::new(&group);
    /// let mut reg = group.register();
    /// let guard = reg.enter();
    /// for _ in 0..3 {
    ///     counter.add_with(&guard, 2);
    /// }
    /// drop(guard);
    /// assert_eq!(counter.sum(), 6);
    /// ```
    ///
    /// # Panics
    ///
    /// If the guard belongs to another group than the counter's; see
    /// [`try_add_with`](ShardedCounter::try_add_with).
    #[inline]
    pub fn add_with(&self, guard: &CidGuard<'_>, n: u64) {
        if let Err(e) = self.try_add_with(guard, n) {
            foreign(e)
        }
    }

    /// Subtracts `n` (wrapping) on the shard of a guard the caller already holds.
    ///
    /// # Panics
    ///
    /// If the guard belongs to another group than the counter's; see
    /// [`try_add_with`](ShardedCounter::try_add_with).
    #[inline]
    pub fn sub_with(&self, guard: &CidGuard<'_>, n: u64) {
        if let Err(e) = self.try_add_with(guard, n.wrapping_neg()) {
            foreign(e)
        }
    }

    /// Like [`add_with`](ShardedCounter::add_with), returning [`Error::ForeignGuard`] for another group's guard.
    ///
    /// Such a guard counts nothing. Subtract with `n.wrapping_neg()`.
    ///
    /// ```
    /// let counter = mmcid::ShardedCounter::new(&mmcid::Group::new());
    /// let other = mmcid::Group::new();
    /// let mut reg = other.register();
    /// assert_eq!(counter.try_add_with(&reg.enter(), 1), Err(mmcid::Error::ForeignGuard));
    /// assert_eq!(counter.sum(), 0);
    /// ```
    #[inline]
    pub fn try_add_with(&self, guard: &CidGuard<'_>, n: u64) -> Result<(), Error> {
        bump(self.shards.try_get(guard)?, n);
        Ok(())
    }

    /// The total, modulo 2^64: the wrapping sum of one load of each allocated shard.
    ///
    /// At quiescence (no update running, and every update happens before this call, e.g. after joining the
    /// threads that counted) the result is exact. Concurrently with updates, each shard is read exactly once
    /// with no lock and no retry, so the result is the sum of one value of each shard, not an atomic snapshot of
    /// all of them:
    /// - every update that happens before the call is included;
    /// - each update running concurrently is included entirely or not at all (it is a single store), and of one
    ///   shard's updates the included ones are a prefix of that shard's history;
    /// - shards are read one after another, so the result may include a later update on one shard and miss an
    ///   earlier one on another: it may be a total the counter never held, additions only included (5 added on
    ///   one shard, then 3 on another, can read as 3). With additions only it is at least every total the
    ///   counter held before the call and at most every total it holds after.
    ///
    /// Cost: one load per 64 CIDs of the visited bitmask plus one per allocated shard — never one per possible
    /// CPU.
    pub fn sum(&self) -> u64 {
        // Relaxed: each shard's writers store it in one modification order (one writer at a time, I1 + I8), so
        // a Relaxed load returns a value of that order, which is all the promise above needs; the iterator's
        // Acquire loads of the visited mask and the shard pointers make each shard's memory valid to read.
        self.shards.iter().fold(0, |sum, (_, shard)| sum.wrapping_add(shard.load(Relaxed)))
    }

    /// Loom only (model 12): the value of CID `cid`'s shard if it is installed, read as a sequence adder reads
    /// it (`SharedPerCid::installed`, outside the CID's hand-over chain).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_installed(&self, cid: usize) -> Option<u64> {
        self.shards.installed(cid).map(|s| s.load(Relaxed))
    }

    /// Sets the counter to zero, keeping the shards.
    ///
    /// Takes `&mut self`, so no update can run concurrently and the next
    /// [`sum`](ShardedCounter::sum) is exactly 0; allocated shards are kept (zeroed) for reuse.
    ///
    /// ```
    /// let mut counter = mmcid::ShardedCounter::new(&mmcid::Group::new());
    /// counter.add(5);
    /// counter.reset();
    /// assert_eq!((counter.sum(), counter.shards_allocated()), (0, 1));
    /// ```
    pub fn reset(&mut self) {
        for (_, shard) in self.shards.iter_mut() {
            shard.store(0, Relaxed);
        }
    }

    /// Number of shards allocated so far: one per CID that ever counted.
    ///
    /// In steady state task and core CIDs stay
    /// below [`Group::max_cids`] (I2), so this is about the largest `max_cids` while the counter was used, plus
    /// any extra or temporary CIDs (below I2's hard bound as it was when each was taken) that adds with a guard
    /// ([`add_with`](Self::add_with)) or oversubscribed adders took. Shards are freed when the counter drops.
    pub fn shards_allocated(&self) -> usize {
        self.shards.shards_allocated()
    }
}

/// Adds `delta` to `shard`, whose only writer is the caller (it holds the shard's CID).
#[inline(always)]
fn bump(shard: &AtomicU64, delta: u64) {
    // Relaxed load and store, no read-modify-write: the guard makes us the shard's only writer (I1) and orders
    // us after its previous writer (I8, release/acquire in the library), so the load returns the latest value and
    // nothing is lost; `sum` only loads.
    shard.store(shard.load(Relaxed).wrapping_add(delta), Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;

    /// Sequence adds against a guard holder on the same CPU (design.md §9.2), with the kernel scheduling them:
    /// one pinned thread holds the core's CID in a guard and does a load, `yield_now`, store on the shard, 3
    /// pinned adders on the same CPU `add(1)` meanwhile. An add that ran on the held CID would be overwritten by
    /// the holder's store (a sequence that ignores BUSY, made by hand when this was written, left a sum of 2.5–3.1
    /// million for 169 million adds, in two runs out of two).
    #[test]
    fn sequence_adds_never_touch_a_held_cid() {
        const HOLDS: u64 = 200;
        // One CID per core: per-CPU mode for the whole test (with CID sets the adders' guard-path fallbacks could
        // make the occupancy switch take the group to per-task mode, design.md §3.1).
        let group = Group::builder().cids_per_core(1).build().unwrap();
        if !group.uses_rseq() {
            eprintln!("sequence_adds_never_touch_a_held_cid: no rseq borrows here, nothing to check");
            return;
        }
        let cpu = crate::sys::affinity().unwrap()[0];
        let counter = ShardedCounter::new(&group);
        let extra: Vec<_> = (0..group.cores()).map(|_| group.register()).collect(); // per-CPU from the start
        let done = std::sync::atomic::AtomicBool::new(false);
        let adds = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    crate::sys::pin_current(cpu).unwrap();
                    let mut mine = 0;
                    while !done.load(Relaxed) {
                        counter.add(1);
                        mine += 1;
                    }
                    adds.fetch_add(mine, Relaxed);
                    group.leave_thread();
                });
            }
            s.spawn(|| {
                // Stops the adders however the holder ends: a failed assertion fails the test, not hangs it.
                struct Done<'a>(&'a std::sync::atomic::AtomicBool);
                impl Drop for Done<'_> {
                    fn drop(&mut self) {
                        self.0.store(true, Relaxed);
                    }
                }
                let _done = Done(&done);
                crate::sys::pin_current(cpu).unwrap();
                let mut reg = group.register();
                assert_eq!(group.mode(), Mode::PerCpu);
                for _ in 0..HOLDS {
                    let guard = reg.enter();
                    let shard = counter.shards.try_get(&guard).unwrap();
                    let v = shard.load(Relaxed);
                    std::thread::yield_now(); // the adders run on this CPU while we hold the CID
                    shard.store(v + 1, Relaxed);
                    drop(guard);
                    // And while the CID is idle, so that sequence adds run too (without this yield the adders
                    // could run only inside the holds, and one run in about twenty saw no sequence at all).
                    std::thread::yield_now();
                }
            });
        });
        assert_eq!(counter.sum(), HOLDS + adds.load(Relaxed), "an add landed on a CID a guard held");
        // The adds between the holds took the sequence (else this checked the guard path only).
        assert!(group.stats().counter_sequences > 0, "{:?}", group.stats());
        drop(extra);
    }

    /// In an rseq group in per-task mode, an add is one restartable sequence on the registration's own CID (design.md
    /// §9.3): it commits (at least 900 of 1000 tries: only a preemption aborts one), enters no guard (the
    /// registration's per-task enter count does not move), and the total is exact; once the group is in per-CPU mode
    /// and the registration's word is UNSET, the per-task sequence steps aside.
    #[test]
    fn per_task_adds_are_one_sequence_where_rseq_is_on() {
        let group = Group::new();
        if !group.uses_rseq() {
            eprintln!("per_task_adds_are_one_sequence: no rseq here, nothing to check");
            return;
        }
        std::thread::spawn(move || {
            let counter = ShardedCounter::new(&group);
            counter.add(1); // registers this thread (per-task: it owns CID 0) and installs its shard
            assert_eq!(group.mode(), Mode::PerTask);
            let before = group.stats();
            // SAFETY: the closure never reaches the thread-local layer.
            let sequence = |n| unsafe {
                crate::local::peek_parked(&group, |reg| {
                    reg.add_in_sequence(&group.inner, |c| counter.shards.installed(c), n)
                })
            };
            let committed = (0..1000).filter(|_| sequence(2) == Some(true)).count();
            assert!(committed > 900, "only {committed} of 1000 sequence adds committed");
            let after = group.stats();
            assert_eq!(after.counter_sequences - before.counter_sequences, committed as u64);
            assert_eq!(after.enter_task_fast, before.enter_task_fast, "no guard entered");
            assert_eq!(counter.sum(), 1 + 2 * committed as u64);
            // Per-CPU mode: the walk took the word (this thread was not inside a guard), so the per-task sequence
            // cannot run; the add still counts (per-CPU sequence or guard path).
            let others: Vec<_> = (0..group.cores()).map(|_| group.register()).collect();
            assert_eq!(group.mode(), Mode::PerCpu);
            // SAFETY: as above.
            let owns = unsafe { crate::local::peek_parked(&group, |reg| reg.cid()) };
            assert_eq!(owns, Some(None), "the walk took the parked registration's CID");
            counter.add(5);
            assert_eq!(counter.sum(), 6 + 2 * committed as u64);
            drop(others);
            group.leave_thread();
        })
        .join()
        .unwrap();
    }

    /// In an rseq group in per-CPU mode, an add on an idle core is one restartable sequence (design.md §9.2):
    /// the sequence itself commits (at least 900 of 1000 tries, on a pinned thread: only a preemption aborts
    /// one), the total is exact, and a core's CID borrowed by a guard makes it step aside for the guard path.
    #[test]
    fn per_cpu_adds_are_one_sequence_where_rseq_is_on() {
        let group = Group::new();
        if !group.uses_rseq() {
            eprintln!("per_cpu_adds_are_one_sequence: no rseq borrows here, nothing to check");
            return;
        }
        let cpu = crate::sys::affinity().unwrap()[0];
        // A thread of its own, pinned, so "this core" stays one core; the harness's threads stay unpinned.
        std::thread::spawn(move || {
            crate::sys::pin_current(cpu).unwrap();
            let counter = ShardedCounter::new(&group);
            let others: Vec<_> = (0..group.cores()).map(|_| group.register()).collect();
            counter.add(1); // registers this thread (one user more than cores: per-CPU) and installs its shard
            assert_eq!(group.mode(), Mode::PerCpu);
            // SAFETY: the closure never reaches the thread-local layer.
            let sequence = |n| unsafe {
                crate::local::peek_parked(&group, |reg| {
                    reg.add_in_sequence(&group.inner, |c| counter.shards.installed(c), n)
                })
            };
            let committed = (0..1000).filter(|_| sequence(2) == Some(true)).count();
            assert!(committed > 900, "only {committed} of 1000 sequence adds committed");
            assert_eq!(group.stats().counter_sequences, committed as u64, "each commit counted, nothing else");
            assert_eq!(counter.sum(), 1 + 2 * committed as u64);
            // The core's CID borrowed by a guard of this thread: the sequence must step aside.
            let mut reg = group.register();
            let guard = reg.enter();
            assert_eq!(guard.kind(), crate::CidKind::Core(cpu));
            assert_eq!(sequence(1000), Some(false), "added under a borrowed CID");
            drop(guard);
            assert_eq!(counter.sum(), 1 + 2 * committed as u64);
            drop((reg, others));
            group.leave_thread();
        })
        .join()
        .unwrap();
    }
}
