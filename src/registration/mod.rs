//! The registration (design.md §1, §2.2): `Registration`, a thread's membership in a group (≈ a task of the mm).
//! Its shared record `RegRec` is in `inner/`. Its enter and exit state machines are `enter.rs` and `exit.rs`, the
//! counter's whole-update sequences `sequence.rs`; its drop gives back what a forgotten guard still holds
//! (`exit.rs`, §4.6) and leaves the group (`Inner::unregister`, which may switch the mode).

mod enter;
mod exit;
mod sequence;

use crate::guard::{Cid, Entered};
use crate::inner::RegRec;
use crate::state::*;
use crate::sync::{Arc, Ordering::*};
use crate::{sys, Error, Group};

/// A thread's membership in a [`Group`], from which it enters guards.
///
/// Dropping it releases everything it owns, and may switch the group back to per-task mode before the drop
/// returns.
///
/// `Send`: a registration may move to another thread between guards.
///
/// ```
/// let group = mmcid::Group::new();
/// let mut reg = group.register();
/// let first = reg.enter().cid();
/// let again = reg.enter().cid();
/// assert_eq!(first, again); // I3: stable while membership is unchanged (per-task mode)
/// ```
pub struct Registration {
    pub(crate) group: Group,
    pub(crate) rec: Arc<RegRec>,
    pub(crate) index: usize,
    pub(crate) cpu: Option<usize>,
    /// The per-CPU or temporary guard entered last, until its exit: still set at the next enter or at the drop
    /// only if that guard was passed to `mem::forget`, and then given back there (design.md §4.6).
    pub(crate) outstanding: Entered,
    /// The slot the last per-CPU guard released (`slot_at`), and the idle word it stored there: the per-CPU fast
    /// path borrows that word without loading the slot first when it enters on the same core (§4.1). Only a
    /// prediction: the borrow compares the slot with it, so a stale one just fails the borrow.
    pub(crate) hint_at: u32,
    pub(crate) hint_word: u32,
    /// The slot into which this registration's last steal moved a CID (`slot_at`), or `u32::MAX`: a steal that
    /// takes from it again takes back the CID it carried there, the sign of a steal storm (design.md §4.5.1).
    /// Written only on the steal path.
    pub(crate) stole_into: u32,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("cid", &self.cid()).field("cpu", &self.cpu).finish()
    }
}

impl Registration {
    pub(crate) fn new(group: Group, rec: Arc<RegRec>, index: usize) -> Registration {
        Registration {
            group,
            rec,
            index,
            cpu: None,
            outstanding: Entered::NOTHING,
            hint_at: u32::MAX,
            hint_word: EMPTY,
            stole_into: u32::MAX,
        }
    }

    /// The group this registration belongs to.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The CID this registration owns between guards (per-task ownership), if any.
    pub fn cid(&self) -> Option<Cid> {
        // Relaxed: a snapshot; fixups only ever store UNSET into it, which publishes nothing.
        let w = self.rec.cid.load(Relaxed);
        (w != UNSET).then_some(Cid::from_raw(w))
    }

    /// Declares the core this registration's thread runs on (the runtime does this after pinning), so entering
    /// needs no `sched_getcpu`; `None` asks the OS at each per-CPU enter. Any core below [`Group::cores`] is
    /// accepted: a wrong declaration costs locality, never exclusivity. Groups that borrow with restartable
    /// sequences ([`Group::uses_rseq`]) ignore it and use the CPU the kernel reports, which the sequence needs.
    pub fn set_cpu(&mut self, cpu: Option<usize>) -> Result<(), Error> {
        let cores = self.group.inner.cores;
        match cpu {
            Some(c) if c >= cores => Err(Error::CpuOutOfRange { cpu: c, possible: cores }),
            _ => {
                self.cpu = cpu;
                Ok(())
            }
        }
    }

    /// The core declared with [`Registration::set_cpu`].
    pub fn cpu(&self) -> Option<usize> {
        self.cpu
    }

    #[inline(always)]
    pub(crate) fn cpu_index(&self) -> usize {
        // rseq groups borrow on the CPU the kernel says we run on: a sequence on another core's slot never commits.
        // (Loom keeps the declared core: it is the modelled CPU.)
        let g = &*self.group.inner;
        let declared = if cfg!(loom) || !g.hot.rseq { self.cpu } else { None };
        match declared {
            Some(c) => c,
            None => {
                // rseq groups read the area's `cpu_id` at the offset they keep next to the mode word (one load).
                let cpu = if cfg!(not(loom)) && g.hot.rseq {
                    crate::rseq::cpu_id_in(g.hot.rseq_area).unwrap_or_else(sys::current_cpu)
                } else {
                    sys::current_cpu()
                };
                let cores = g.cores;
                // No division on the common path: only virtual groups can see a CPU beyond their cores.
                if cpu < cores {
                    cpu
                } else {
                    cpu % cores
                }
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.outstanding.is_nothing() {
            self.give_back_forgotten();
        }
        self.group.inner.unregister(&self.rec, self.index);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::CidKind;

    /// The hot paths touch the record's first 64 bytes only: the word, `running`, and the counters the fast paths,
    /// the extra-CID borrow, the sequence adds and a temporary's enter bump (`Ev`'s first seven). A field reordering (a lost `repr(C)`) or an event inserted
    /// early fails this.
    #[test]
    fn hot_fields_share_the_records_first_line() {
        use crate::stats::Ev;
        use std::mem::offset_of;
        assert_eq!(std::mem::align_of::<RegRec>(), 128);
        assert!(offset_of!(RegRec, cid) + 4 <= 64 && offset_of!(RegRec, running) + 4 <= 64);
        for ev in [Ev::TaskFast, Ev::CpuFast, Ev::CpuExtra, Ev::Sequence, Ev::Temporary, Ev::Alloc, Ev::BitmapSet] {
            let end = offset_of!(RegRec, counters) + 8 * (ev as usize + 1);
            assert!(end <= 64, "counter {ev:?} ends at byte {end} of the record");
        }
    }

    #[test]
    fn set_cpu_refuses_cores_beyond_the_group() {
        let g = Group::builder().virtual_cpus(4).build().unwrap();
        let mut r = g.register();
        assert_eq!(r.set_cpu(Some(4)), Err(Error::CpuOutOfRange { cpu: 4, possible: 4 }));
        assert_eq!(r.cpu(), None, "a refused declaration changes nothing");
        assert_eq!(r.set_cpu(Some(3)), Ok(()));
        assert_eq!(r.cpu(), Some(3));
        assert_eq!(r.set_cpu(None), Ok(()));
        assert_eq!(r.cpu(), None);
    }

    /// `Registration::cid` shows per-task ownership only: a CID from birth in per-task mode, none in per-CPU mode
    /// (the walk took it), and what a guard holds is the core's, not the registration's.
    #[test]
    fn cid_is_the_registration_s_own() {
        let g = Group::builder().virtual_cpus(2).build().unwrap();
        let mut a = g.register();
        assert_eq!(a.cid().map(Cid::get), Some(0));
        let more: Vec<_> = (0..2).map(|_| g.register()).collect();
        assert_eq!(g.mode(), crate::Mode::PerCpu);
        assert_eq!(a.cid(), None, "the task → CPU walk took it");
        a.set_cpu(Some(1)).unwrap();
        let guard = a.enter();
        assert_eq!(guard.kind(), CidKind::Core(1));
        drop(guard);
        assert_eq!(a.cid(), None, "a borrowed CID stays the core's");
        drop(more);
    }
}
