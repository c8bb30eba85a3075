//! The core-slot protocol (design.md §2.3, §2.6, §4.1.1, §9.2, §9.3): a core's slot words, how a thread borrows one
//! (`borrow_slot`: a CAS, or in rseq groups a restartable sequence), how an idle one is taken outside a switch's walk
//! (`take_idle`: a CAS, or in rseq groups a claim around the RSEQ membarrier under the try-only claim lock, with the
//! deferral of exits that find it held and its holder's drain). The whole-update sequences a `ShardedCounter` runs on a
//! slot's or a registration's CID without a guard are `registration/sequence.rs`.
//!
//! The slot word's state table is `state::slot`. The enter and exit state machines (`registration/enter.rs`, `exit.rs`)
//! and the switches' sweeps (`switches.rs`) read and write slots through what is here; the barriers the claims wait for
//! are in `barriers.rs`.

use super::Inner;
use crate::mutants::Mutant;
#[cfg(not(loom))]
use crate::rseq;
use crate::state::*;
use crate::stats::{Counters, Ev};
use crate::sync::{fence, AtomicU32, Ordering};

/// Who takes an idle CID with `Inner::take_idle`: what it does when it finds the claim lock held.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Taker {
    /// A converging stealer (`registration/enter.rs`): gives up, and converges at a later enter (I6).
    Stealer,
    /// An exit giving up its core's CID, or a test standing for one: leaves the slot to the lock's holder
    /// (`defer_claim`).
    Exit,
}

impl Inner {
    /// Slot word `at` (`slot_at(cpu, j)`, design.md §2.6).
    #[inline(always)]
    pub(crate) fn slot(&self, at: usize) -> &AtomicU32 {
        &self.slots[core_of(at)][at & (MAX_CIDS_PER_CORE - 1)]
    }

    /// The slot words in use of core `cpu`, with their indexes: `0..k`.
    pub(crate) fn core_slots(&self, cpu: usize) -> impl Iterator<Item = (usize, &AtomicU32)> {
        self.slots[cpu][..self.hot.cids_per_core as usize].iter().enumerate().map(move |(j, s)| (slot_at(cpu, j), s))
    }

    /// Every slot word in use, with its index: what sweeps, drains and audits visit.
    pub(crate) fn all_slots(&self) -> impl Iterator<Item = (usize, &AtomicU32)> {
        (0..self.cores).flat_map(move |cpu| self.core_slots(cpu))
    }

    /// The most CIDs the cores may own at once: `K · cores` (I2's hard bound is `users` more, design.md §2.6).
    pub(crate) fn core_share(&self) -> usize {
        self.hot.cids_per_core as usize * self.cores
    }

    /// The borrow `expect → expect | BUSY` of core `cpu`'s slot (design.md §4.1, §4.1.1), `expect` an idle word:
    /// a CAS, or in rseq groups a restartable sequence that commits only while we run on `cpu` and the mode has
    /// ONCPU. Either way the slot's load pairs with the previous borrower's X1 Release store (I8): the CAS's
    /// Acquire, or an x86 load (acquire by TSO) inside the sequence.
    #[inline(always)]
    pub(crate) fn borrow_slot(&self, at: usize, expect: u32) -> bool {
        if self.hot.rseq {
            self.rseq_store_if(at, expect, expect | BUSY)
        } else {
            self.slot(at).compare_exchange(expect, expect | BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok()
        }
    }

    #[cfg(not(loom))]
    #[inline(always)]
    fn rseq_store_if(&self, at: usize, expect: u32, new: u32) -> bool {
        rseq::store_if(self.hot.rseq_area, core_of(at) as u32, &self.hot.mode, self.slot(at), expect, new)
    }

    /// Loom's restartable sequence (`rseq::OnCpu`).
    #[cfg(loom)]
    fn rseq_store_if(&self, at: usize, expect: u32, new: u32) -> bool {
        self.on_cpu.store_if(core_of(at), &self.hot.mode, self.slot(at), expect, new)
    }

    /// Takes idle word `s` (`ONCPU | c`) of slot `at`, leaving it EMPTY: on success `c` is the caller's.
    /// For every `idle → EMPTY` write outside a fixup walk. A CAS; in rseq groups a claim (design.md §4.1.1):
    /// `s → s | CLAIM`, the RSEQ membarrier, `s | CLAIM → EMPTY`, under the claim lock. Nobody waits for that
    /// lock: a stealer (`Taker::Stealer`) that finds it held gives up (it converges at a later enter, I6), and an
    /// exit (`Taker::Exit`) leaves its slot to the holder (`defer_claim`) and returns false, as if someone else had
    /// taken `c`.
    /// `c`: the calling registration's counters, for what a drain takes.
    pub(crate) fn take_idle(&self, at: usize, s: u32, taker: Taker, c: &Counters) -> bool {
        let slot = self.slot(at);
        // AcqRel: takes the CID with its last borrower's writes (pairs with X1's Release store).
        if !self.hot.rseq {
            return slot.compare_exchange(s, EMPTY, Ordering::AcqRel, Ordering::Acquire).is_ok();
        }
        if slot.load(Ordering::Relaxed) != s {
            return false; // moved on already: no lock, no barrier (Relaxed: the CAS below is what decides)
        }
        let locked = self.try_claim_lock() || (taker == Taker::Exit && self.defer_claim(c));
        if !locked {
            return false; // a stealer gives up; an exit deferred its slot to the holder
        }
        // AcqRel, both CASes: they take the CID with its last borrower's writes (pairs with X1's Release store);
        // the claim lock (Acquire/Release) orders them against other claimers.
        let taken = slot.compare_exchange(s, s | CLAIM, Ordering::AcqRel, Ordering::Acquire).is_ok() && {
            if self.knob.is(Mutant::NoClaimBarrier) || self.claim_barrier(c) {
                // Fails only if a sequence that read `s` before the claim committed over it: its borrower keeps
                // `c`.
                slot.compare_exchange(s | CLAIM, EMPTY, Ordering::AcqRel, Ordering::Acquire).is_ok()
            } else {
                Self::unclaim(slot, s); // no barrier, no take: as if someone else had the slot (design.md §12)
                false
            }
        };
        self.claim_unlock(c);
        taken
    }

    /// The claim lock, tried once. Acquire: pairs with `claim_unlock`'s Release, so claimers are serialised and a
    /// claim word that survives the barrier is ours (no ABA through another claimer, design.md §4.1.1).
    pub(crate) fn try_claim_lock(&self) -> bool {
        self.claim.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// An exit found the claim lock held: flag its idle slot for the holder, which drains after unlocking
    /// (`claim_unlock`). Returns true if the lock turned out free after all (the caller then claims itself; it
    /// also drains the flag at its own unlock).
    #[cold]
    pub(crate) fn defer_claim(&self, c: &Counters) -> bool {
        // Release, as an RMW so that every deferring exit's flag continues the release sequence: the drainer's
        // Acquire swap then sees each deferring exit's X1, the idle word it must take.
        self.claims_deferred.swap(1, Ordering::Release);
        // Store-buffering pair with `claim_unlock`'s fence: either we see the lock free, or the holder that we saw
        // holding it sees our flag after its unlock.
        fence(Ordering::SeqCst);
        let locked = !self.knob.is(Mutant::NoDeferRetry) && self.try_claim_lock();
        if !locked {
            c.bump(Ev::Deferred);
        }
        locked
    }

    /// Releases the claim lock, then drains what exits deferred while it was held: as long as the flag is set
    /// and the lock can be had, take every idle slot the mode says no core may own (`take_deferred`).
    pub(crate) fn claim_unlock(&self, c: &Counters) {
        let mut drained = false;
        loop {
            self.claim.store(0, Ordering::Release);
            if self.knob.is(Mutant::NoDeferredDrain) || (drained && self.knob.is(Mutant::NoDrainLoop)) {
                return;
            }
            // Pairs with `defer_claim`'s fence.
            fence(Ordering::SeqCst);
            // Relaxed: the fence above orders it (a stale 0 is excluded by the store-buffering argument). Nothing
            // deferred, or the new holder drains at its own unlock: done.
            if self.claims_deferred.load(Ordering::Relaxed) == 0 || !self.try_claim_lock() {
                return;
            }
            // Acquire: pairs with `defer_claim`'s Release swap (the deferring exits' X1 stores). Exits may defer
            // again while we drain: hence the loop.
            if self.claims_deferred.swap(0, Ordering::Acquire) != 0 {
                self.take_deferred(c);
            }
            drained = true;
        }
    }

    /// With the claim lock held, on behalf of exits that deferred: while the mode lacks ONCPU no core may own a
    /// CID (I5), so claim every idle slot, issue one RSEQ membarrier, and take them. With ONCPU back (a switch to
    /// per-CPU mode ran since), idle core CIDs are legitimate and stay.
    #[cold]
    fn take_deferred(&self, c: &Counters) {
        // Acquire, as every mode load outside the lock (pairs with F1/F4); it also sees at least the mode each
        // deferring exit saw, through the flag's release → acquire.
        if self.hot.mode.load(Ordering::Acquire) & ONCPU != 0 {
            return;
        }
        let mut claimed = false;
        for (_, slot) in self.all_slots() {
            // Relaxed, and still sees each deferring exit's X1 (or later): X1 → the exit's Release swap of the
            // flag → our Acquire swap (`claim_unlock`) → this load. So a deferred slot is never skipped as stale;
            // other values are hints the CAS validates. AcqRel CAS: as `take_idle`'s claim (pairs with X1);
            // failure Relaxed: nothing is read from a slot we did not claim.
            let s = slot.load(Ordering::Relaxed);
            if slot::idle_cid(s).is_some()
                && slot.compare_exchange(s, s | CLAIM, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            {
                claimed = true;
            }
        }
        if !claimed {
            return;
        }
        // As in every claim: a sequence that read an idle word before our claim has committed or was aborted. If
        // the barrier failed, every claim goes back and the deferred CIDs stay on their cores (design.md §12).
        let fenced = self.knob.is(Mutant::NoDrainBarrier) || self.claim_barrier(c);
        for (_, slot) in self.all_slots() {
            // Every CLAIM word is ours (we hold the lock); our own claim is the latest we can read, or a sequence's
            // BUSY that committed over it (then its borrower keeps the CID, and the CAS fails). Relaxed load and
            // failure: hints; the AcqRel CAS takes the CID with the writes its claim acquired.
            let s = slot.load(Ordering::Relaxed);
            if s & CLAIM != 0 && !fenced {
                Self::unclaim(slot, s & !CLAIM);
            } else if s & CLAIM != 0 && slot.compare_exchange(s, EMPTY, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                self.bitmap.clear(s & VALUE);
                c.bump(Ev::BitmapClear);
                c.bump(Ev::FixupTake);
            }
        }
    }

    /// Gives back a claim `s | CLAIM` whose barrier failed: the core owns `c` idle again, as before the claim.
    /// Release: the idle word hands `c` to its next borrower with its last borrower's writes, which the claim CAS
    /// acquired (an RMW, this CAS also continues X1's release sequence). It fails only if a sequence that read `s`
    /// before the claim committed BUSY over it: that borrower keeps `c`, exactly as after a successful barrier.
    fn unclaim(slot: &AtomicU32, s: u32) {
        let _ = slot.compare_exchange(s | CLAIM, s, Ordering::Release, Ordering::Relaxed);
    }

    /// Whether whole per-CPU updates may be restartable sequences now (design.md §9.2): an rseq group in per-CPU
    /// mode. Relaxed: a hint; the sequence checks the mode again inside.
    #[inline(always)]
    pub(crate) fn sequences_apply(&self) -> bool {
        self.hot.rseq && self.hot.mode.load(Ordering::Relaxed) == PER_CPU
    }
}
