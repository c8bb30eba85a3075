//! Loom's restartable sequences (docs/loom.md): loom has no kernel to abort a sequence, so each core has a lock,
//! held across every modelled sequence on that core (`OnCpu`): nothing else of core `cpu` runs between the compares
//! and the commit, which is what the kernel's abort guarantees; writers on other cores still interleave freely. The
//! RSEQ membarrier's model takes and releases every core's lock (`wait_for_sequences`).

use crate::mutants::{Knob, Mutant};
use crate::state::*;
use crate::sync::{AtomicU32, Ordering};

/// One lock per core, held across each modelled sequence on that core (a group's `Inner::on_cpu`).
pub(crate) struct OnCpu(Box<[loom::sync::Mutex<()>]>);

impl OnCpu {
    pub(crate) fn new(cores: usize) -> OnCpu {
        OnCpu((0..cores).map(|_| loom::sync::Mutex::new(())).collect())
    }

    /// Runs on core `cpu` with no other sequence of that core in flight.
    fn enter(&self, cpu: usize) -> loom::sync::MutexGuard<'_, ()> {
        self.0[cpu].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The RSEQ membarrier's effect on sequences: every sequence in flight has committed or aborted once this
    /// returns (each core's lock taken and released).
    pub(crate) fn wait_for_sequences(&self) {
        for cs in self.0.iter() {
            drop(cs.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// Loom's `store_if`: `*slot = new` if, on core `cpu`, `*mode & ONCPU != 0` and `*slot == expect`.
    ///
    /// The commit is a `swap` whose result is ignored, i.e. the same unconditional store. Loom 0.7 orders a plain
    /// store only partially against RMWs it has not seen, and then lets a later CAS read a value that a store
    /// happening-before that CAS already overwrote: a coherence violation C11 forbids, which made model 11 report
    /// false duplicates (reproduced with seven lines of loom, no mmcid: plain store → false report, swap → none;
    /// `loom-tests/tests/litmus_m11_loom_gap.rs`, docs/loom.md). As an RMW the store is placed after everything it
    /// raced in modification order.
    pub(crate) fn store_if(&self, cpu: usize, mode: &AtomicU32, slot: &AtomicU32, expect: u32, new: u32) -> bool {
        let _on_cpu = self.enter(cpu);
        // Acquire, both: what the real sequence's x86 loads are (acquire by TSO); the slot load pairs with the
        // previous borrower's X1 (I8), the mode load with F1/F4.
        if mode.load(Ordering::Acquire) & ONCPU == 0 || slot.load(Ordering::Acquire) != expect {
            return false;
        }
        // Relaxed: the commit publishes nothing (the borrower's X1 does at exit), and the RMW only fixes its place
        // in modification order (above).
        slot.swap(new, Ordering::Relaxed);
        true
    }

    /// Loom's whole-update sequence (`add_if`, design.md §9.2): `f` runs where the commit store would, under the
    /// same checks as `store_if`, and the slot is not written.
    pub(crate) fn run_if(
        &self,
        cpu: usize,
        mode: &AtomicU32,
        slot: &AtomicU32,
        expect: u32,
        knob: &Knob,
        f: impl FnOnce(),
    ) -> bool {
        let _on_cpu = self.enter(cpu);
        // Acquire, both: as in `store_if` (x86 loads; I8 through the previous borrower's X1).
        let s = slot.load(Ordering::Acquire);
        let same = if knob.is(Mutant::SequenceIgnoresBusy) { s & !BUSY == expect & !BUSY } else { s == expect };
        if mode.load(Ordering::Acquire) & ONCPU == 0 || !same {
            return false;
        }
        f();
        true
    }

    /// Loom's per-task whole-update sequence (`add_if_owned`, design.md §9.3) on core `cpu` (the registration's
    /// modelled CPU): `f` runs where the commit store would, only if the mode is `PER_TASK` and `word` still holds
    /// `w`.
    pub(crate) fn run_if_owned(
        &self,
        cpu: usize,
        mode: &AtomicU32,
        word: &AtomicU32,
        w: u32,
        knob: &Knob,
        f: impl FnOnce(),
    ) -> bool {
        let _on_cpu = self.enter(cpu);
        // Acquire, both: what the real sequence's x86 loads are (acquire by TSO).
        let mode_ok = knob.is(Mutant::OwnedSequenceIgnoresMode) || mode.load(Ordering::Acquire) == PER_TASK;
        let word_ok = knob.is(Mutant::OwnedSequenceIgnoresWord) || word.load(Ordering::Acquire) == w;
        if !(mode_ok && word_ok) {
            return false;
        }
        f();
        true
    }
}
