//! Loom's mutation knobs, all in one place (docs/loom.md): each [`Mutant`] removes one step or weakens one ordering
//! of the real code, so that the loom model of that ordering has a twin loom must reject. The code asks with one
//! helper, [`Knob::is`], on the [`Knob`] its group was built with (the group's `Inner`, its bitmap and its
//! `PerCid`s carry a copy). Outside loom a `Knob` is empty and `is` is constant false, so normal builds compile
//! every mutant branch away and contain no knob.
//!
//! A knob only ever removes or weakens a step of the algorithm the code runs. An old algorithm (a former order of
//! steps, the kernel's earlier designs) is not a knob: it lives as a litmus copy in `loom-tests/tests/litmus_*.rs`,
//! next to its twin, and never in a production path.

/// One knob each: a mutant removes one step or weakens one ordering of the real code, so that a loom model has a
/// twin that loom must reject (docs/loom.md). Public only under loom (`GroupBuilder::mutant`), and not part of the
/// API there either; normal builds never construct one but `None`.
#[doc(hidden)]
#[cfg_attr(not(loom), allow(dead_code))] // normal builds only name the variants, in `Knob::is` calls
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
    /// `Pool`: a reclaim empties the magazines of a CID whose bitmap bit it finds clear without claiming the CID
    /// (a check-then-act: a guard may take the CID meanwhile, or its last holder's writes may not be visible).
    PoolReclaimUnclaimed,
    /// `Pool`: a reclaim claims the idle CID with a Relaxed `fetch_or` (its previous holder's magazine writes
    /// need not be visible).
    RelaxedPoolClaim,
}

/// The mutant a group runs: the builder's choice under loom (`GroupBuilder::mutant`), nothing elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Knob {
    #[cfg(loom)]
    active: Mutant,
}

impl Knob {
    /// A group's knob under loom.
    #[cfg(loom)]
    pub(crate) fn new(active: Mutant) -> Knob {
        Knob { active }
    }

    /// Whether mutant `m` is active: always false outside loom, where the test folds away.
    #[inline(always)]
    #[allow(unused_variables)]
    pub(crate) fn is(self, m: Mutant) -> bool {
        #[cfg(loom)]
        {
            self.active == m
        }
        #[cfg(not(loom))]
        {
            false
        }
    }
}
