//! The protocol's packed words, each with its state table (docs/design.md §2 has the arguments and points here):
//!
//! * [`mode`]: the group's mode word, `Hot::mode` (design.md §2.1);
//! * [`word`]: a registration's word and its `running` flag, `RegRec::cid` and `RegRec::running` (§2.2);
//! * [`slot`]: a core's slot words, `Inner::slots` (§2.3, §2.6).
//!
//! The other packed values have their tables on their own types: the guard's record (`guard::Entered`) and
//! the thread-local layer's slot (`local::Parked`).

/// CID value mask: the low 29 bits of a registration word or a slot word (the CID space is `2^29` CIDs at most).
pub(crate) const VALUE: u32 = (1 << 29) - 1;

pub(crate) mod mode {
    //! The mode word (`Hot::mode`, `AtomicU32`, design.md §2.1): who owns CIDs and whether a switch is running, in
    //! one word as in the kernel since 47ee94efccf6 (before it, ownership and TRANSIT were two words, and a reader
    //! on a weakly ordered CPU could see the new ownership without TRANSIT while the fixup still ran).
    //!
    //! | value | `ONCPU` (bit 30) | `TRANSIT` (bit 29) | [`Mode`](crate::Mode) | meaning |
    //! |---|---|---|---|---|
    //! | [`PER_TASK`] | 0 | 0 | `PerTask` | every registration owns its CID (the word in its record) |
    //! | [`TO_PER_CPU`] | 1 | 1 | `ToPerCpu` | task → CPU switch running: its fixup walks the registrations |
    //! | [`PER_CPU`] | 1 | 0 | `PerCpu` | every core owns its CIDs; a thread entering on a core borrows one |
    //! | [`TO_PER_TASK`] | 0 | 1 | `ToPerTask` | CPU → task switch running: its fixup walks the core slots |
    //!
    //! Transitions, only by the lifecycle lock's holder (design.md §5): `PER_TASK → TO_PER_CPU` (F1, Release)
    //! `→ PER_CPU` (F4, Release), and `PER_CPU → TO_PER_TASK` (F1) `→ PER_TASK` (F4). No other value is ever
    //! stored; `NOT_A_MODE` (`Hot::fast_task` and `fast_cpu` of a group without membarrier) is a comparand that no
    //! mode word equals. Readers outside the lock load it
    //! with Acquire (E3, X3, `Group::mode`), or inside a restartable sequence (an x86 load).

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
    /// `Hot::fast_task` and `Hot::fast_cpu` of a group without membarrier: not a mode word value.
    pub(crate) const NOT_A_MODE: u32 = u32::MAX;
}
pub(crate) use mode::*;

pub(crate) mod word {
    //! A registration's word (`RegRec::cid`, `AtomicU32`, design.md §2.2): the CID the registration owns, if any.
    //!
    //! | value | meaning | written by |
    //! |---|---|---|
    //! | [`UNSET`] (bit 31) | the registration owns no CID | the owner (CAS), a task → CPU walk (CAS `c → UNSET`), the drop (swap, lock held) |
    //! | `c` ≤ [`VALUE`](super::VALUE) | the registration owns CID `c` (bit `c` set in the bitmap) | the owner (CAS `UNSET → c`), `register` (store, lock held, before anyone else can see the record) |
    //!
    //! Only the owner ever stores a CID into its word; everyone else only takes one out (to UNSET), so the owner
    //! reading UNSET knows it exactly. `UNSET` compares above any `max_cids`, so the per-task fast path's one
    //! compare `w < max_cids` tests both "owns a CID" and "in range".
    //!
    //! `RegRec::running` (`AtomicU32`) is the word's companion, written only by the owner:
    //!
    //! | value | meaning |
    //! |---|---|
    //! | 0 | no guard of this registration is inside (between its E1 and its exit's store) |
    //! | 1 | from E1 of an enter (every enter but the per-CPU fast path's, which owns nothing) until the guard's exit: first thing on task exits (X1 of D-exit, Release) and core exits, last on temporary exits (Relaxed: the word is UNSET then, which walks skip whatever `running` says) |
    //!
    //! It is the `rq->curr` of the Dekker pairs (design.md §5.1): only task → CPU walks read it (F3, Acquire), and
    //! skip the word of a registration that is inside.

    /// Registration word: the registration owns no CID. Larger than any `max_cids`, so one compare tests both.
    pub(crate) const UNSET: u32 = 1 << 31;
}
pub(crate) use word::*;

// The flag bits never overlap a CID value, and UNSET compares above any CID.
const _: () = assert!(
    UNSET > VALUE
        && UNSET & VALUE == 0
        && BUSY & VALUE == 0
        && ONCPU & VALUE == 0
        && CLAIM & (VALUE | ONCPU | BUSY) == 0
);

pub(crate) mod slot {
    //! A core's slot word (`Inner::slots[cpu][j]`, `AtomicU32`, zero-initialised; design.md §2.3, and §2.6 for a
    //! core's several slots): the CID a core owns, and whether a thread is using it. `CLAIM` is bit 31, `ONCPU`
    //! bit 30 (as in the mode word), `BUSY` bit 29 (the mode word's `TRANSIT` position, in another word), the CID
    //! the low 29 bits ([`VALUE`]).
    //!
    //! | value | meaning | predicate |
    //! |---|---|---|
    //! | [`EMPTY`] (0) | the core owns no CID here | |
    //! | `ONCPU \| c` ([`owned`]) | the core owns CID `c`; nobody is using it (idle) | [`idle_cid`] is `Some(c)` |
    //! | `ONCPU \| BUSY \| c` ([`busy`]) | the core owns `c` and a thread entered on this core is using it (borrowed) | |
    //! | `CLAIM \| ONCPU \| c` | rseq groups only: an `idle → EMPTY` take is waiting for its RSEQ membarrier (design.md §4.1.1); not idle, so nobody borrows it and walks skip it | |
    //!
    //! Transitions:
    //!
    //! | from → to | how, by whom |
    //! |---|---|
    //! | `EMPTY → ONCPU\|BUSY\|c` | CAS, a borrower donating its own CID or a fresh one (Relaxed: nobody reads a BUSY slot for data) |
    //! | `EMPTY → ONCPU\|c` | CAS (Release), an exit adopting its task CID for the core (design.md §4.4) |
    //! | `ONCPU\|c → ONCPU\|BUSY\|c` | the borrow (`Inner::borrow_slot`): CAS (Acquire), or in rseq groups a restartable sequence ending in a plain store |
    //! | `ONCPU\|BUSY\|c → ONCPU\|BUSY\|n` | plain store by the borrower converging (design.md §4.5) |
    //! | `ONCPU\|BUSY\|c → ONCPU\|c` | X1, plain Release store by the borrower only: nobody else ever writes a BUSY slot |
    //! | `ONCPU\|c → EMPTY` | CAS (AcqRel), by a CPU → task fixup or the last user's sweep, a borrower leaving in per-task mode, an exit taking back an adoption that lost a switch, a converging stealer, or the claim lock holder's drain of deferred exits (design.md §4.1.1) |
    //! | `ONCPU\|c → ONCPU\|CLAIM\|c → EMPTY` | rseq groups, every `idle → EMPTY` outside a walk: CAS, RSEQ membarrier, CAS (`Inner::take_idle`) |
    //! | `ONCPU\|CLAIM\|c → ONCPU\|c` | rseq groups: a claim whose membarrier failed goes back (`Inner::unclaim`, design.md §12.1) |
    //! | `ONCPU\|CLAIM\|c → ONCPU\|BUSY\|c` | rseq groups: a sequence in flight that read `ONCPU\|c` before the claim commits over it; the claim then fails and the borrower keeps `c` |
    //!
    //! A BUSY slot is the user-space "rq lock": at most one thread per core uses the core's CID, whatever the OS
    //! does.
    use super::*;

    /// Slot word: the core owns no CID.
    pub(crate) const EMPTY: u32 = 0;
    /// Slot word bit: the core's CID is borrowed by a thread inside a guard.
    pub(crate) const BUSY: u32 = 1 << 29;
    /// Slot word bit: an `idle → EMPTY` take is claiming the core's CID (rseq groups only, design.md §4.1.1).
    pub(crate) const CLAIM: u32 = 1 << 31;

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
pub(crate) use slot::{BUSY, CLAIM, EMPTY};

/// The most CIDs a core may own at once (design.md §2.6): its slot words fill one 64-byte line.
pub const MAX_CIDS_PER_CORE: usize = 16;
/// log2 of [`MAX_CIDS_PER_CORE`]: slot `j` of core `cpu` is slot index `cpu << SLOT_SHIFT | j`.
pub(crate) const SLOT_SHIFT: u32 = 4;
const _: () = assert!(1 << SLOT_SHIFT == MAX_CIDS_PER_CORE);

/// The core of slot index `at`.
#[inline(always)]
pub(crate) fn core_of(at: usize) -> usize {
    at >> SLOT_SHIFT
}

/// Slot index of slot `j` of core `cpu`.
#[inline(always)]
pub(crate) fn slot_at(cpu: usize, j: usize) -> usize {
    cpu << SLOT_SHIFT | j
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
