//! The counter's whole-update sequences (design.md §9.2, §9.3): where a `ShardedCounter` update may run as one
//! restartable sequence without a guard (`sequence_target`), and the update itself (`add_in_sequence`, and its loom
//! twin `update_in_sequence`). The sequences themselves are `rseq/` (`add_if`, `add_if_owned`, and under loom
//! `OnCpu::run_if*`); the slot words they compare are the core-slot protocol's (`inner/slots.rs`).

use super::Registration;
use crate::inner::Inner;
use crate::mutants::Mutant;
use crate::rseq;
use crate::state::*;
#[cfg(not(loom))]
use crate::stats::Ev;
use crate::sync::Ordering::*;

impl Registration {
    /// Where a whole update may run as one restartable sequence, in an rseq group `g` (this registration's):
    /// per-task on the CID this registration owns, below `max_cids` (design.md §9.3; out of range, the guard
    /// path converges it, I4); per-CPU, with the group in per-CPU mode and this registration owning no CID, on
    /// its core's first CID if idle and in range (§9.2), else on an extra CID if the first is busy (§2.6, looked
    /// up out of line by the caller). The mode is not read for the per-task target: the sequence compares it and
    /// the word inside, and in per-CPU mode the word is UNSET, which no `max_cids` exceeds. The per-CPU target
    /// checks `sequences_apply` here so that no caller can skip it: it is what keeps CAS borrowers away from the
    /// slot. Shared by `add_in_sequence` and its loom twin `update_in_sequence`.
    #[inline(always)]
    fn sequence_target(&self, g: &Inner) -> SequenceTarget {
        // Relaxed: a hint the sequence compares again (the word is our own: only fixups change it, to UNSET).
        let w = self.rec.cid.load(Relaxed);
        if (w as usize) < g.max_cids() {
            return SequenceTarget::Owned(w);
        }
        if w != UNSET || !g.sequences_apply() {
            return SequenceTarget::Guard;
        }
        let Some(cpu) = self.sequence_cpu(g) else { return SequenceTarget::Guard };
        // Relaxed: a hint; the sequence compares the slot again and acquires through it (I8).
        let s = g.slot(slot_at(cpu, 0)).load(Relaxed);
        let c = if g.knob.is(Mutant::SequenceIgnoresBusy) {
            Some(s & VALUE).filter(|_| s & ONCPU != 0)
        } else {
            slot::idle_cid(s)
        };
        match c {
            Some(c) if (c as usize) < g.max_cids() => SequenceTarget::Core { cpu, s, c },
            None if s & BUSY != 0 => SequenceTarget::Extra(cpu),
            _ => SequenceTarget::Guard, // out of range (the guard path converges it, I4), or no CID on the core
        }
    }

    /// The core a per-CPU sequence runs on: the CPU the kernel says we run on (a sequence on another core's slot
    /// never commits), read at the area offset the group keeps next to its mode word; `None` for an unregistered
    /// area (negative) or a CPU beyond the group's slots, which take the guard path. Loom: the declared core.
    #[inline(always)]
    fn sequence_cpu(&self, g: &Inner) -> Option<usize> {
        if cfg!(loom) {
            Some(self.cpu_index())
        } else {
            rseq::cpu_id_in(g.hot.rseq_area).filter(|&c| c < g.cores)
        }
    }

    /// Core `cpu`'s first idle extra CID, if any: `(slot index, idle slot word, its CID)`.
    #[inline(never)]
    fn extra_sequence_target(&self, cpu: usize) -> Option<(usize, u32, u32)> {
        let g = &*self.group.inner;
        // Relaxed: as in `sequence_target`, hints the sequence validates.
        g.core_slots(cpu).skip(1).find_map(|(at, slot)| {
            let s = slot.load(Relaxed);
            slot::idle_cid(s).map(|c| (at, s, c))
        })
    }

    /// `ShardedCounter`'s whole update as one restartable sequence, in an rseq group `g` (this registration's,
    /// passed by the caller, which has it at hand: one dependent load fewer): in per-task mode on the CID this
    /// registration owns (design.md §9.3), in per-CPU mode on its core's idle CID (§9.2), adding `n` to that
    /// CID's shard (`shard` finds it, if installed) only while the CID is ours or nobody borrows it: no guard, no
    /// `running` flag, nothing held that a preemption could strand. False (nothing done) wherever a guard is
    /// needed.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn add_in_sequence<'s>(
        &self,
        g: &Inner,
        shard: impl FnOnce(usize) -> Option<&'s std::sync::atomic::AtomicU64>,
        n: u64,
    ) -> bool {
        debug_assert!(std::ptr::eq(g, &*self.group.inner) && g.hot.rseq);
        let done = match self.sequence_target(g) {
            SequenceTarget::Owned(w) => shard(w as usize)
                .is_some_and(|cell| rseq::add_if_owned(g.hot.rseq_area, &g.hot.mode, &self.rec.cid, w, cell, n)),
            SequenceTarget::Core { cpu, s, c } => shard(c as usize).is_some_and(|cell| {
                rseq::add_if(g.hot.rseq_area, cpu as u32, &g.hot.mode, g.slot(slot_at(cpu, 0)), s, cell, n)
            }),
            SequenceTarget::Extra(cpu) => self.add_on_extra(g, cpu, shard, n),
            SequenceTarget::Guard => false,
        };
        if done {
            self.rec.counters.bump(Ev::Sequence);
        }
        done
    }

    /// `add_in_sequence` when core `cpu`'s first CID is busy: on its first idle extra CID, if any (design.md
    /// §2.6). Out of line, so that the common path keeps its values in registers.
    #[cfg(not(loom))]
    #[inline(never)]
    fn add_on_extra<'s>(
        &self,
        g: &Inner,
        cpu: usize,
        shard: impl FnOnce(usize) -> Option<&'s std::sync::atomic::AtomicU64>,
        n: u64,
    ) -> bool {
        self.extra_sequence_target(cpu).is_some_and(|(at, s, c)| {
            shard(c as usize)
                .is_some_and(|cell| rseq::add_if(g.hot.rseq_area, cpu as u32, &g.hot.mode, g.slot(at), s, cell, n))
        })
    }

    /// Loom only: `add_in_sequence` with the update `f(cid)` run inside the modelled sequence (loom models 11, 14).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn update_in_sequence(&self, f: impl FnOnce(usize)) -> bool {
        let g = &*self.group.inner;
        if !g.hot.rseq {
            return false;
        }
        let (at, s, c) = match self.sequence_target(g) {
            SequenceTarget::Owned(w) => {
                return g
                    .on_cpu
                    .run_if_owned(self.cpu.unwrap_or(0), &g.hot.mode, &self.rec.cid, w, &g.knob, || f(w as usize));
            }
            SequenceTarget::Core { cpu, s, c } => (slot_at(cpu, 0), s, c),
            SequenceTarget::Extra(cpu) => match self.extra_sequence_target(cpu) {
                Some(t) => t,
                None => return false,
            },
            SequenceTarget::Guard => return false,
        };
        g.on_cpu.run_if(core_of(at), &g.hot.mode, g.slot(at), s, &g.knob, || f(c as usize))
    }
}

/// What `Registration::sequence_target` found: where a whole update may run as one restartable sequence.
#[derive(Clone, Copy)]
enum SequenceTarget {
    /// Per-task: on the CID the registration owns (design.md §9.3).
    Owned(u32),
    /// Per-CPU: on core `cpu`'s first CID `c`, whose slot word read `s` (idle) (§9.2).
    Core { cpu: usize, s: u32, c: u32 },
    /// Per-CPU, core `cpu`'s first CID busy: maybe on one of its extra CIDs (§2.6).
    Extra(usize),
    /// Nowhere: a guard is needed.
    Guard,
}
