//! Observability: path counters, cheap enough to stay on.
//!
//! Hot-path events are counted in the entering registration's own record (its cache line is written on enter
//! anyway; a `ShardedCounter` sequence update writes it only for the count) with a load and a store, never a
//! read-modify-write: only the owner writes them. Lifecycle events are
//! counted under the lifecycle lock. `Group::stats` sums the live records and the totals of dropped ones.

/// Counted events. The first seven share the registration record's first cache line with its word and
/// `running` flag (`RegRec` is 128-byte aligned: 8 bytes, then these): the fast paths, the extra-CID borrow and
/// the sequence adds touch that one line only (a temporary's exit touches the next one too).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    TaskFast,
    CpuFast,
    CpuExtra,
    Sequence,
    Temporary,
    Alloc,
    BitmapSet,
    BitmapClear,
    TaskSlow,
    CpuSlow,
    Converge,
    Steal,
    Adopt,
    TransitDrop,
    Deferred,
    Forgotten,
    SwitchToCpu,
    SwitchToTask,
    FixupWalk,
    FixupVisit,
    FixupTake,
    BarrierFailed,
}

const EVENTS: usize = Ev::BarrierFailed as usize + 1;

/// A snapshot of a group's counters, from [`Group::stats`](crate::Group::stats).
///
/// Counts are totals since the group was built. `cids_in_use` is a racy count of set bits unless the group is
/// quiescent. `Display` prints the counts that matter on one line (enters per ownership mode, temporaries, mode
/// switches, CIDs in use); `Debug` prints every field.
///
/// ```
/// let group = mmcid::Group::new();
/// let mut reg = group.register();
/// drop(reg.enter());
/// drop(reg.enter());
/// let stats = group.stats();
/// assert_eq!(stats.enter_task_fast, 2);
/// assert_eq!(stats.cids_in_use, 1);
/// assert_eq!(
///     stats.to_string(),
///     "enters: task 2, cpu 0, temporary 0 (slow 0, converged 0); counter sequences 0; \
///      switches: to per-CPU 0, to per-task 0; CIDs in use 1"
/// );
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Enters that took the per-task fast path (no read-modify-write).
    pub enter_task_fast: u64,
    /// Enters that took the per-CPU fast path (borrowed the core's CID with one rseq sequence or CAS).
    pub enter_cpu_fast: u64,
    /// Enters that kept or got the registration's own CID on the slow path (after a switch, out of range, or
    /// first use).
    pub enter_task_slow: u64,
    /// Enters that borrowed (or donated and borrowed) the core's first CID on the slow path.
    pub enter_cpu_slow: u64,
    /// Enters that borrowed one of the core's extra CIDs (or donated one) because its first CID was held by a
    /// guard (design.md §2.6, [`GroupBuilder::cids_per_core`](crate::GroupBuilder::cids_per_core)): a thread
    /// descheduled inside its guard on that core, or a nested guard.
    pub enter_cpu_extra: u64,
    /// Enters that moved a CID back under `max_cids` (I4); also counted in one of the categories above.
    pub enter_converge: u64,
    /// Enters that took a temporary CID because every CID their core may own was in use. Every enter is exactly
    /// one of `enter_task_fast`, `enter_cpu_fast`, `enter_cpu_extra`, `enter_task_slow`, `enter_cpu_slow`,
    /// `enter_temporary`. A large share means more threads per core are descheduled inside their guards (blocked
    /// in a system call, or preempted on a busy core) than the core may keep CIDs for: a temporary costs two bitmap
    /// RMWs more than a borrow, so keep guards around the work on per-CID data.
    pub enter_temporary: u64,
    /// Enters that allocated a CID from the bitmap (also counted in one of the categories above).
    pub enter_alloc: u64,
    /// [`ShardedCounter`](crate::ShardedCounter) updates done as one restartable sequence on the core's idle CID
    /// (per-CPU mode with rseq): no enter, no exit, so counted here and in no `enter_*` field.
    pub counter_sequences: u64,
    /// CIDs taken from another core's idle slot to converge (per-CPU reclaim).
    pub steals: u64,
    /// CIDs adopted at exit after a switch completed (instead of two bitmap operations).
    pub exit_adopt: u64,
    /// Transitional CIDs dropped at exit.
    pub exit_transit_drop: u64,
    /// Exits in rseq groups that found the claim lock held and left their core's idle CID to its holder instead
    /// of waiting (design.md §4.1.1); what the holder's drain takes counts in `fixup_takes`.
    pub exit_deferred: u64,
    /// Per-CPU and temporary guards that were passed to [`std::mem::forget`], found and given back at their
    /// registration's next enter or drop (design.md §4.6); for a guard of [`Group::enter`](crate::Group::enter),
    /// when its thread exits (§9.1.1). (A forgotten per-task guard needs nothing given back and is not counted.)
    pub guards_forgotten: u64,
    /// Bits set in the CID bitmap.
    pub bitmap_sets: u64,
    /// Bits cleared in the CID bitmap.
    pub bitmap_clears: u64,
    /// Switches from per-task to per-CPU ownership.
    pub switches_to_per_cpu: u64,
    /// Switches from per-CPU to per-task ownership.
    pub switches_to_per_task: u64,
    /// Fixup walks (one per switch, plus the sweep of core slots when the last registration leaves).
    pub fixup_walks: u64,
    /// Owners (registrations or slots) visited by fixup walks.
    pub fixup_visits: u64,
    /// CIDs taken away by fixup walks (and by drains of deferred claims, design.md §4.1.1).
    pub fixup_takes: u64,
    /// `membarrier` calls that failed even after retrying transient errors (a kernel short of memory, a seccomp
    /// filter): the switch, claim or drain that needed each went on without taking what the barrier would have
    /// let it take, which costs compactness, never exclusivity (design.md §12, the crate docs' "Platform and
    /// process events").
    pub membarrier_failures: u64,
    /// CIDs marked in use now.
    pub cids_in_use: u64,
}

/// One line: `enters: task T, cpu C, temporary M (slow S, converged V); counter sequences Q; switches: to per-CPU
/// A, to per-task B; CIDs in use N`, where `task` and `cpu` count both the fast and the slow path of their mode and
/// `slow` counts the slow paths of both.
impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "enters: task {}, cpu {}, temporary {} (slow {}, converged {}); counter sequences {}; switches: to \
             per-CPU {}, to per-task {}; CIDs in use {}",
            self.enter_task_fast.saturating_add(self.enter_task_slow),
            self.enter_cpu_fast.saturating_add(self.enter_cpu_slow),
            self.enter_temporary,
            self.enter_task_slow.saturating_add(self.enter_cpu_slow),
            self.enter_converge,
            self.counter_sequences,
            self.switches_to_per_cpu,
            self.switches_to_per_task,
            self.cids_in_use
        )
    }
}

#[cfg(not(loom))]
mod imp {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    /// One writer at a time (the owner, or the lifecycle lock holder); readers anywhere.
    #[derive(Default)]
    pub(crate) struct Counters([AtomicU64; EVENTS]);

    impl Counters {
        /// Single-writer increment: a load and a store, no read-modify-write.
        #[inline(always)]
        pub(crate) fn bump(&self, ev: Ev) {
            self.bumped(ev);
        }

        /// `bump`, returning the new count.
        #[inline(always)]
        pub(crate) fn bumped(&self, ev: Ev) -> u64 {
            let c = &self.0[ev as usize];
            let n = c.load(Relaxed) + 1;
            c.store(n, Relaxed);
            n
        }

        pub(crate) fn add_to(&self, out: &mut [u64; EVENTS]) {
            for (o, c) in out.iter_mut().zip(&self.0) {
                *o += c.load(Relaxed);
            }
        }

        /// Folds `other` into `self` (lifecycle lock held).
        pub(crate) fn absorb(&self, other: &Counters) {
            for (c, o) in self.0.iter().zip(&other.0) {
                c.store(c.load(Relaxed) + o.load(Relaxed), Relaxed);
            }
        }
    }
}

/// Under loom the counters compile to nothing, so they add no interleavings to the models.
#[cfg(loom)]
mod imp {
    use super::*;

    #[derive(Default)]
    pub(crate) struct Counters {}

    impl Counters {
        #[inline(always)]
        pub(crate) fn bump(&self, _ev: Ev) {}
        #[inline(always)]
        pub(crate) fn bumped(&self, _ev: Ev) -> u64 {
            1
        }
        pub(crate) fn add_to(&self, _out: &mut [u64; EVENTS]) {}
        pub(crate) fn absorb(&self, _other: &Counters) {}
    }
}

pub(crate) use imp::Counters;

impl Stats {
    pub(crate) fn from_totals(t: &[u64; EVENTS], cids_in_use: usize) -> Stats {
        Stats {
            enter_task_fast: t[Ev::TaskFast as usize],
            enter_cpu_fast: t[Ev::CpuFast as usize],
            enter_task_slow: t[Ev::TaskSlow as usize],
            enter_cpu_slow: t[Ev::CpuSlow as usize],
            enter_cpu_extra: t[Ev::CpuExtra as usize],
            enter_converge: t[Ev::Converge as usize],
            enter_temporary: t[Ev::Temporary as usize],
            enter_alloc: t[Ev::Alloc as usize],
            counter_sequences: t[Ev::Sequence as usize],
            steals: t[Ev::Steal as usize],
            exit_adopt: t[Ev::Adopt as usize],
            exit_transit_drop: t[Ev::TransitDrop as usize],
            exit_deferred: t[Ev::Deferred as usize],
            guards_forgotten: t[Ev::Forgotten as usize],
            bitmap_sets: t[Ev::BitmapSet as usize],
            bitmap_clears: t[Ev::BitmapClear as usize],
            switches_to_per_cpu: t[Ev::SwitchToCpu as usize],
            switches_to_per_task: t[Ev::SwitchToTask as usize],
            fixup_walks: t[Ev::FixupWalk as usize],
            fixup_visits: t[Ev::FixupVisit as usize],
            fixup_takes: t[Ev::FixupTake as usize],
            membarrier_failures: t[Ev::BarrierFailed as usize],
            cids_in_use: cids_in_use as u64,
        }
    }

    pub(crate) fn totals() -> [u64; EVENTS] {
        [0; EVENTS]
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Event `i` bumped `i + 1` times: every field shows its own event's count, so two fields swapped or one
    /// event read twice fails.
    #[test]
    fn each_event_lands_in_its_own_field() {
        let events = [
            Ev::TaskFast,
            Ev::CpuFast,
            Ev::CpuExtra,
            Ev::Sequence,
            Ev::TaskSlow,
            Ev::CpuSlow,
            Ev::Converge,
            Ev::Temporary,
            Ev::Alloc,
            Ev::Steal,
            Ev::Adopt,
            Ev::TransitDrop,
            Ev::Deferred,
            Ev::Forgotten,
            Ev::BitmapSet,
            Ev::BitmapClear,
            Ev::SwitchToCpu,
            Ev::SwitchToTask,
            Ev::FixupWalk,
            Ev::FixupVisit,
            Ev::FixupTake,
            Ev::BarrierFailed,
        ];
        assert_eq!(events.len(), EVENTS, "every event listed once");
        let c = Counters::default();
        for ev in events {
            for _ in 0..=ev as usize {
                c.bump(ev);
            }
        }
        let mut t = Stats::totals();
        c.add_to(&mut t);
        let s = Stats::from_totals(&t, 7);
        let n = |ev: Ev| ev as u64 + 1;
        let fields = [
            (s.enter_task_fast, n(Ev::TaskFast)),
            (s.enter_cpu_fast, n(Ev::CpuFast)),
            (s.enter_cpu_extra, n(Ev::CpuExtra)),
            (s.counter_sequences, n(Ev::Sequence)),
            (s.enter_task_slow, n(Ev::TaskSlow)),
            (s.enter_cpu_slow, n(Ev::CpuSlow)),
            (s.enter_converge, n(Ev::Converge)),
            (s.enter_temporary, n(Ev::Temporary)),
            (s.enter_alloc, n(Ev::Alloc)),
            (s.steals, n(Ev::Steal)),
            (s.exit_adopt, n(Ev::Adopt)),
            (s.exit_transit_drop, n(Ev::TransitDrop)),
            (s.exit_deferred, n(Ev::Deferred)),
            (s.guards_forgotten, n(Ev::Forgotten)),
            (s.bitmap_sets, n(Ev::BitmapSet)),
            (s.bitmap_clears, n(Ev::BitmapClear)),
            (s.switches_to_per_cpu, n(Ev::SwitchToCpu)),
            (s.switches_to_per_task, n(Ev::SwitchToTask)),
            (s.fixup_walks, n(Ev::FixupWalk)),
            (s.fixup_visits, n(Ev::FixupVisit)),
            (s.fixup_takes, n(Ev::FixupTake)),
            (s.membarrier_failures, n(Ev::BarrierFailed)),
        ];
        for (i, (got, want)) in fields.into_iter().enumerate() {
            assert_eq!(got, want, "field {i} of {s:?}");
        }
        assert_eq!(s.cids_in_use, 7);
    }

    /// `Display` sums each mode's fast and slow paths and shows every count it names from its own field: distinct
    /// values everywhere, so a field shown twice or in the wrong place fails.
    #[test]
    fn display_is_one_line_of_the_counts_that_matter() {
        let s = Stats {
            enter_task_fast: 10,
            enter_task_slow: 1,
            enter_cpu_fast: 20,
            enter_cpu_slow: 2,
            enter_temporary: 3,
            enter_converge: 4,
            counter_sequences: 5,
            switches_to_per_cpu: 6,
            switches_to_per_task: 7,
            cids_in_use: 8,
            ..Stats::default()
        };
        assert_eq!(
            s.to_string(),
            "enters: task 11, cpu 22, temporary 3 (slow 3, converged 4); counter sequences 5; switches: to per-CPU \
             6, to per-task 7; CIDs in use 8"
        );
        let max = Stats { enter_task_fast: u64::MAX, enter_task_slow: 1, ..Stats::default() };
        assert!(max.to_string().starts_with(&format!("enters: task {}, ", u64::MAX)), "{max}");
        assert!(!s.to_string().contains('\n'));
    }

    /// `absorb` folds a leaving registration's counts into the group's, adding, not replacing.
    #[test]
    fn absorb_adds() {
        let (group, leaving) = (Counters::default(), Counters::default());
        group.bump(Ev::Alloc);
        leaving.bump(Ev::Alloc);
        leaving.bump(Ev::Alloc);
        leaving.bump(Ev::Steal);
        group.absorb(&leaving);
        let mut t = Stats::totals();
        group.add_to(&mut t);
        assert_eq!((t[Ev::Alloc as usize], t[Ev::Steal as usize], t[Ev::TaskFast as usize]), (3, 1, 0));
    }
}
