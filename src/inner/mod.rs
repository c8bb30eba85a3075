//! The shared state every role works on (design.md §1, §2): a group's `Inner` with its hot line (`Hot`: the mode
//! word, whose table is `state::mode`, and what enter reads with it), its slots, bitmap, claim lock and knob, and the
//! lifecycle state under its lock (`Life`); a registration's shared record (`RegRec`: the registration word,
//! `running`, the path counters; the word's table is `state::word`); leaving a group (`Inner::unregister`), and the
//! fork handlers' hold on a group's locks (§12.2, `fork.rs`).
//!
//! `Inner`'s protocol methods are the submodules: `slots.rs` (the core-slot protocol), `barriers.rs` (the Dekker
//! pairs' barriers) and `switches.rs` (limits and mode switches). The public API over this state is `group.rs`
//! (`Group`, `GroupBuilder`) and `registration/` (`Registration`, with its enter and exit state machines).

mod barriers;
mod slots;
mod switches;

pub(crate) use slots::Taker;

use crate::bitmap::Bitmap;
use crate::mutants::Knob;
use crate::state::*;
use crate::stats::{Counters, Ev};
use crate::sync::{Arc, AtomicU32, AtomicUsize, Mutex, Ordering};
#[cfg(all(test, not(loom)))]
use crate::sys;
use crate::CpuSet;
use crossbeam_utils::CachePadded;

/// A core's slot words (design.md §2.3, §2.6), on the core's own cache lines.
pub(crate) type CoreSlots = CachePadded<[AtomicU32; MAX_CIDS_PER_CORE]>;

/// Read-mostly words every enter reads: one cache line, written only by mode switches and membership changes.
pub(crate) struct Hot {
    /// Mode word (design.md §2.1).
    pub(crate) mode: AtomicU32,
    /// Current compactness bound (design.md §3).
    pub(crate) max_cids: AtomicU32,
    /// Whether light barriers may be compiler fences (membarrier registered).
    pub(crate) membarrier: bool,
    /// The mode word value for which enter and exit may finish inline after only a compiler fence: `PER_TASK`
    /// when the heavy side is membarrier, else `NOT_A_MODE`, which no mode word ever equals, so the fallback
    /// always reaches `light_barrier_rest` (and so does every loom model: loom has no membarrier).
    pub(crate) fast_task: u32,
    /// The same for per-CPU exits: `PER_CPU` with membarrier, else `NOT_A_MODE`.
    pub(crate) fast_cpu: u32,
    /// Whether slots are borrowed with an rseq critical section instead of a CAS (design.md §4.1.1).
    pub(crate) rseq: bool,
    /// The group's process-unique id (`Group::id`), here so that a guard takes it from the line its enter reads
    /// anyway.
    pub(crate) id: u64,
    /// CIDs a core may own at once (design.md §2.6): slots `0..cids_per_core` of each core are in
    /// use.
    pub(crate) cids_per_core: u32,
    /// rseq groups: `__rseq_offset` (`rseq::area`), where the borrowing thread's rseq area lies.
    pub(crate) rseq_area: isize,
}

pub(crate) struct Inner {
    pub(crate) hot: CachePadded<Hot>,
    /// Each core's slot words (design.md §2.3, §2.6), on its own cache lines; `slot(at)` reads them by index.
    pub(crate) slots: Box<[CoreSlots]>,
    pub(crate) bitmap: Bitmap,
    /// Possible cores (the kernel's N), or the number of virtual cores.
    pub(crate) cores: usize,
    pub(crate) virtual_cpus: bool,
    /// Registrations in the group: stored only under the lifecycle lock (`set_users`), so its holder reads it exactly
    /// (`users_locked`); anyone else reads a snapshot (`temp_bound`, `Group::users`, the switch checks' hints).
    pub(crate) users: AtomicUsize,
    /// Counted `Group` handles (see `Group::counted`). A plain std atomic even under loom: its one ordering
    /// argument (the Release decrement in `Drop` against the Acquire load in `is_abandoned`) serves only the
    /// thread-local layer, which is not compiled there.
    pub(crate) handles: std::sync::atomic::AtomicUsize,
    pub(crate) life: Mutex<Life>,
    /// Serialises `idle → EMPTY` claims in rseq groups (design.md §4.1.1): a try-only lock (0 free, 1 held), so
    /// nobody ever waits for a claimer; never held across user code.
    pub(crate) claim: AtomicU32,
    /// 1 when an exit found `claim` held and left its idle slot for the holder to take (`defer_claim`).
    pub(crate) claims_deferred: AtomicU32,
    /// Loom's model of the restartable sequences: one lock per core, held across each sequence (`rseq::OnCpu`).
    #[cfg(loom)]
    pub(crate) on_cpu: crate::rseq::OnCpu,
    /// Loom's mutation knob (`mutants.rs`); empty elsewhere.
    pub(crate) knob: Knob,
    /// Loom: every membarrier fails (`GroupBuilder::failing_barriers`, design.md §12).
    #[cfg(loom)]
    pub(crate) failing_barriers: bool,
    /// Tests: membarrier calls told to fail (design.md §12).
    #[cfg(all(test, not(loom)))]
    pub(crate) fail_barriers: sys::FailBarriers,
}

/// State changed only under the lifecycle lock (the kernel's `mm_cid.mutex` + `mm_cid.lock`).
pub(crate) struct Life {
    /// The explicit registration list walked by task → CPU fixups (kernel 192d852129b1).
    pub(crate) regs: Vec<Option<Arc<RegRec>>>,
    pub(crate) free: Vec<usize>,
    pub(crate) allowed: CpuSet,
    /// Switch-back threshold; non-zero ⇔ per-CPU mode wanted.
    pub(crate) switch_back_below: usize,
    /// Per-CPU ownership was found to use as many CIDs as per-task ownership would (design.md §3.1): per-task
    /// mode, with `max_cids` at least `users`, until `users` falls below the switch-back threshold of the allowed
    /// cores (`switch_back_threshold(allowed)`, the threshold per-CPU mode had when the mark was set; §3.1.1).
    pub(crate) occupied: bool,
    /// Lifecycle events plus the counters of dropped registrations.
    pub(crate) counters: Counters,
}

/// A registration's shared record, on its own cache lines: written by its owner on every enter and exit, and
/// by fixups only with CAS (design.md §2.2). `repr(C)`: the word and `running` come first and the hot counters
/// right after them (`Ev`'s order), so the fast paths and the temporary path touch the record's first 64 bytes
/// only. (Left to itself, Rust places the 8-aligned counters first and the word at byte 152, so every per-task
/// enter would touch two lines of the record.)
#[repr(C, align(128))]
pub(crate) struct RegRec {
    /// Registration word: `UNSET` or the CID this registration owns.
    pub(crate) cid: AtomicU32,
    /// 1 from E1 of every enter until the guard's exit clears it (first thing on task and core exits, last on
    /// temporary ones); written only by the owner, read by task → CPU walks (design.md §2.2).
    pub(crate) running: AtomicU32,
    pub(crate) counters: Counters,
}

impl RegRec {
    pub(crate) fn new() -> RegRec {
        RegRec { cid: AtomicU32::new(UNSET), running: AtomicU32::new(0), counters: Counters::default() }
    }
}

impl Inner {
    /// The number of registrations, for the holder of the lifecycle lock (`life` is its proof): exact, as only the
    /// holder stores it (the previous holder's store happens before our lock, and ours is sequenced before). Under
    /// loom an unsynchronised load, which loom checks against every store, and no scheduling point, as the plain
    /// field it replaces was none (`sync::load_under_lock`).
    pub(crate) fn users_locked(&self, _life: &Life) -> usize {
        crate::sync::load_under_lock(&self.users)
    }

    /// Sets the number of registrations; only under the lifecycle lock (`life`). Relaxed: lock-free readers take
    /// a snapshot (`temp_bound`, `Group::users`, the switch checks' hints), and the lock orders it for the next
    /// holder.
    pub(crate) fn set_users(&self, _life: &mut Life, users: usize) {
        self.users.store(users, Ordering::Relaxed);
    }

    /// Called by `Registration::drop` (≈ exit).
    pub(crate) fn unregister(&self, rec: &RegRec, index: usize) {
        let mut life = self.life.lock();
        life.regs[index] = None;
        life.free.push(index);
        // A forgotten per-task guard (mem::forget) may have left `running` set; the registration is gone either way
        // (`Registration::drop` already gave back a forgotten per-CPU or temporary one, design.md §4.6).
        // Relaxed, both: the record has left the list walks read (under the lock we hold), the owner's own writes
        // are sequenced before this drop, and the bitmap clear (Release) publishes its guards' writes (I8).
        rec.running.store(0, Ordering::Relaxed);
        let w = rec.cid.swap(UNSET, Ordering::Relaxed);
        if w != UNSET {
            self.bitmap.clear(w);
            life.counters.bump(Ev::BitmapClear);
        }
        life.counters.absorb(&rec.counters);
        let users = self.users_locked(&life) - 1;
        self.set_users(&mut life, users);
        let flip = self.update_limits(&mut life);
        self.apply(&mut life, flip);
        if users == 0 {
            // Nobody is left to use a core's CID: nothing stays marked (I5).
            self.sweep_slots(&mut life);
        }
    }
}

/// A group's locks held across a `fork` by the forking thread (design.md §12.2): its lifecycle lock and its claim
/// lock, so the child gets neither held by a thread that does not exist there.
#[cfg(not(loom))]
pub(crate) struct ForkHold<'a> {
    inner: &'a Inner,
    life: crate::sync::MutexGuard<'a, Life>,
}

#[cfg(not(loom))]
impl Inner {
    /// fork's prepare handler: waits for the lifecycle lock (a register, drop, switch or `stats` in progress),
    /// then for the claim lock (a claim or drain in progress: a claim or drain never waits for anything but the
    /// kernel's membarrier, and nobody holding the claim lock takes the lifecycle lock, so this ends).
    pub(crate) fn hold_for_fork(&self) -> ForkHold<'_> {
        let life = self.life.lock();
        while !self.try_claim_lock() {
            std::thread::yield_now();
        }
        ForkHold { inner: self, life }
    }
}

/// Dropping the hold releases both locks, whatever drops it (the fork's parent or child handler, or an unwind):
/// the claim lock the usual way (draining what exits deferred to us meanwhile, counted under the lifecycle lock we
/// still hold), then the lifecycle lock, as the `life` field drops after this.
#[cfg(not(loom))]
impl Drop for ForkHold<'_> {
    fn drop(&mut self) {
        self.inner.claim_unlock(&self.life.counters);
    }
}
