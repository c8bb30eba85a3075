//! Packed words and their named predicates (state tables in docs/design.md §2).

/// Mode word bit: CIDs are owned by cores (per-CPU ownership).
pub(crate) const ONCPU: u32 = 1 << 30;
/// Mode word bit: a mode switch is running.
pub(crate) const TRANSIT: u32 = 1 << 29;

/// Mode word: per-task ownership (steady).
pub(crate) const PER_TASK: u32 = 0;
/// Mode word: task → CPU switch running.
pub(crate) const TO_PER_CPU: u32 = ONCPU | TRANSIT;
/// Mode word: per-CPU ownership (steady).
pub(crate) const PER_CPU: u32 = ONCPU;
/// Mode word: CPU → task switch running.
pub(crate) const TO_PER_TASK: u32 = TRANSIT;

/// Registration word: the registration owns no CID. Larger than any `max_cids`, so one compare tests both.
pub(crate) const UNSET: u32 = 1 << 31;

/// Slot word: the core owns no CID.
pub(crate) const EMPTY: u32 = 0;
/// Slot word bit: the core's CID is borrowed by a thread inside a guard.
pub(crate) const BUSY: u32 = 1 << 29;
/// Slot word bit: an `idle → EMPTY` take is claiming the core's CID (rseq groups only, design.md §4.1.1).
pub(crate) const CLAIM: u32 = 1 << 31;
/// Slot and CID value mask.
pub(crate) const VALUE: u32 = (1 << 29) - 1;

// The flag bits never overlap a CID value, and UNSET compares above any CID.
const _: () = assert!(
    UNSET > VALUE
        && UNSET & VALUE == 0
        && BUSY & VALUE == 0
        && ONCPU & VALUE == 0
        && CLAIM & (VALUE | ONCPU | BUSY) == 0
);

/// Slot word predicates.
pub(crate) mod slot {
    use super::*;

    /// The core owns a CID that nobody is using or claiming: `ONCPU | c`.
    pub(crate) fn idle_cid(word: u32) -> Option<u32> {
        (word & (ONCPU | BUSY | CLAIM) == ONCPU).then_some(word & VALUE)
    }

    /// `ONCPU | c`
    pub(crate) fn owned(cid: u32) -> u32 {
        ONCPU | cid
    }

    /// `ONCPU | BUSY | c`
    pub(crate) fn busy(cid: u32) -> u32 {
        ONCPU | BUSY | cid
    }
}

/// Who owns CIDs, and whether a switch is running. Read with [`Group::mode`](crate::Group::mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Each registration owns its CID; entering touches only the registration's own cache line.
    PerTask,
    /// Each core owns a CID; the thread entering on a core borrows it.
    PerCpu,
    /// A switch from per-task to per-CPU ownership is running.
    ToPerCpu,
    /// A switch from per-CPU to per-task ownership is running.
    ToPerTask,
}

impl Mode {
    pub(crate) fn from_word(word: u32) -> Mode {
        match word {
            PER_TASK => Mode::PerTask,
            PER_CPU => Mode::PerCpu,
            TO_PER_CPU => Mode::ToPerCpu,
            _ => Mode::ToPerTask,
        }
    }
}

/// Loom-only knobs that remove one step or weaken one ordering of the real code, so each loom model has a mutant
/// twin that loom must reject (docs/loom.md). Not part of the API; absent from normal builds.
#[cfg(loom)]
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mutant {
    /// The real code.
    #[default]
    None,
    /// No light barrier between `running = 1` and the mode load in enter (D-enter).
    NoEnterBarrier,
    /// No light barrier between the release store and the mode load in exit (D-exit, D-core).
    NoExitBarrier,
    /// No heavy barrier after the mode flip (the kernel's `smp_mb()` after flipping the mode, 47ee94efccf6).
    NoFixupBarrier,
    /// Relaxed bitmap set/clear (I8).
    RelaxedBitmap,
    /// Relaxed store of the final mode (the kernel's `smp_mb()` before clearing TRANSIT, 47ee94efccf6).
    RelaxedCompletion,
    /// The task → CPU fixup takes running registrations' CIDs too ("no TRANSIT on running owners").
    FixupIgnoresRunning,
    /// The CPU → task fixup takes busy slots' CIDs too (kernel 1e83ccd5921a undone: assumes the state).
    FixupIgnoresBusy,
    /// The task → CPU fixup treats an UNSET word as a CID (kernel de3ab9bd3133 undone).
    FixupTakesUnset,
    /// Adoption at exit without re-checking the mode afterwards.
    NoAdoptRecheck,
    /// The per-CPU fast path borrows the core's CID without checking that the registration owns none (a word
    /// the task → CPU walk skipped because `running` was already set stays owned in per-CPU mode).
    CpuPathKeepsWord,
    /// rseq groups: an `idle → EMPTY` claim without the RSEQ membarrier between its two CASes (design.md §4.1.1).
    NoClaimBarrier,
    /// rseq groups: F2 is a full barrier that does not abort restartable sequences in flight.
    PlainFixupBarrier,
    /// rseq groups: a whole-update sequence (`ShardedCounter`) also runs on a BUSY slot's CID (both its checks
    /// ignore BUSY).
    SequenceIgnoresBusy,
    /// rseq groups: the claim lock's holder never drains the slots exits deferred to it while it held the lock.
    NoDeferredDrain,
    /// `PerCid`: a new shard's slot store Relaxed instead of Release (a reader outside the CID's hand-over chain,
    /// `SharedPerCid::installed`, may see the shard before its initialisation).
    RelaxedShardSlot,
    /// `PerCid`: a new shard's visited bit Relaxed instead of Release (a scan, e.g. `ShardedCounter::sum`, may see
    /// the bit before the slot).
    RelaxedVisitedBit,
    /// `PerCid`: a segment installed, and a lost race's winner read, with Relaxed instead of Release / Acquire.
    RelaxedSegmentInstall,
    /// rseq groups: an exit that finds the claim lock held flags its slot but does not try the lock again.
    NoDeferRetry,
    /// rseq groups: the claim lock's holder drains once after its unlock, not until no deferral is left.
    NoDrainLoop,
    /// rseq groups: the drain takes the idle slots it claimed without the RSEQ membarrier in between.
    NoDrainBarrier,
    /// Per-task convergence takes the in-range CID before it gives the out-of-range one up (the reverse of the
    /// real order), so a converger between its two steps holds two (design.md §2.4).
    ConvergeTakesFirst,
    /// rseq groups: the per-task whole-update sequence (`ShardedCounter`, design.md §9.3) does not check the mode, so
    /// one that starts after a task → CPU switch's F2 still adds while the walk takes the CID.
    OwnedSequenceIgnoresMode,
    /// rseq groups: the per-task whole-update sequence does not compare the registration's word, so one that read the
    /// word before a switch took it (and the mode came back to per-task) adds to a CID another registration owns.
    OwnedSequenceIgnoresWord,
    /// CID sets (design.md §2.6): a per-CPU exit releases its CID into its core's first slot instead of the slot it
    /// borrowed.
    ExitToFirstSlot,
    /// A switch's F2 that failed is taken as issued: the task → CPU walk, or an rseq group's CPU → task sweep,
    /// takes anyway (design.md §12; loom model 13, with `GroupBuilder::failing_barriers`).
    IgnoreFailedBarrier,
    /// A claim's or a drain's RSEQ membarrier that failed is taken as issued: the claimer takes anyway instead of
    /// giving its claims back (design.md §12; loom model 13).
    IgnoreFailedClaimBarrier,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn words_are_distinct_and_consistent() {
        let modes = [PER_TASK, PER_CPU, TO_PER_CPU, TO_PER_TASK];
        let decoded: Vec<Mode> = modes.iter().map(|&m| Mode::from_word(m)).collect();
        assert_eq!(decoded, vec![Mode::PerTask, Mode::PerCpu, Mode::ToPerCpu, Mode::ToPerTask]);
        assert_eq!(slot::idle_cid(slot::owned(5)), Some(5));
        assert_eq!(slot::idle_cid(slot::busy(5)), None);
        assert_eq!(slot::idle_cid(EMPTY), None);
        assert_eq!(slot::idle_cid(slot::owned(5) | CLAIM), None);
        assert_eq!(slot::busy(VALUE) & VALUE, VALUE);
    }
}
