//! The guard (design.md §4.2, §4.6): `CidGuard`, the proof that its holder owns a CID, and what it records of its enter
//! (`Entered`, one packed `u64` with its bit table, and the `Held` it unpacks to) so that its drop runs the matching
//! exit of the registration's state machine (`registration/exit.rs`). A guard of `Group::enter` owns its registration,
//! lent by the thread-local layer (`local.rs`), and its drop gives it back there after the exit. Also the public names
//! of what a guard holds: `Cid` and `CidKind`.

use crate::registration::Registration;
use crate::state::core_of;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// A concurrency ID: a small integer that no other live guard of the same group holds (I1).
///
/// A CID is observed again by another thread only after the guard holding it was dropped; whatever the previous
/// holder wrote to memory indexed by the CID is visible to the next holder (I8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cid(u32);

impl Cid {
    pub(crate) fn from_raw(cid: u32) -> Cid {
        Cid(cid)
    }

    /// The CID as an index.
    #[inline]
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for Cid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What a guard holds, and how it must give it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// The registration's own CID (per-task ownership).
    Task(u32),
    /// The CID of slot `at` (`slot_at(cpu, j)`: slot `j` of core `cpu`), borrowed (per-CPU ownership); the slot
    /// is BUSY until exit.
    Core { at: u32, cid: u32 },
    /// A temporary CID, dropped at exit (the core's CID was in use).
    Temp(u32),
}

/// Result of `enter_raw`: what is held, packed in one `u64` so the hot path keeps it in a register (a struct with
/// padding was built on the stack with narrow stores and read back wide, which stalls store-to-load forwarding).
///
/// | bits | field | values |
/// |---|---|---|
/// | 0..32 | the CID | a CID (at most `VALUE`) |
/// | 32..34 | the kind (`KIND_SHIFT`) | `KIND_TASK` (0, [`Held::Task`]), `KIND_CORE` (1, [`Held::Core`]), `KIND_TEMP` (2, [`Held::Temp`]) |
/// | 34 | `POOLED_BIT` | 1: the guard owns its registration, lent by the thread-local layer (`Group::enter`), and gives it back on drop |
/// | 35..64 | the slot index (`AT_SHIFT`) | `Held::Core`'s `at` (`slot_at(cpu, j)`: 16-bit cores, 4-bit slot numbers); 0 otherwise |
///
/// [`Entered::NOTHING`] (all zero, the bits of `Task(0)`) stands for "no guard" in `Registration::outstanding`,
/// where a per-task guard is never recorded.
#[derive(Clone, Copy)]
pub(crate) struct Entered(u64);

const KIND_TASK: u64 = 0;
const KIND_CORE: u64 = 1;
const KIND_TEMP: u64 = 2;
const KIND_SHIFT: u32 = 32;
const POOLED_BIT: u64 = 1 << 34;
const AT_SHIFT: u32 = 35;

impl Entered {
    /// No guard, as `Registration::outstanding`: the bits of `Task(0)`, a kind that is never outstanding (zero
    /// makes the test and the clear one instruction each on the per-CPU path).
    pub(crate) const NOTHING: Entered = Entered(0);

    #[inline(always)]
    pub(crate) fn is_nothing(self) -> bool {
        self.0 == Entered::NOTHING.0
    }

    #[inline(always)]
    pub(crate) fn new(held: Held) -> Entered {
        let (cid, kind, cpu) = match held {
            Held::Task(cid) => (cid, KIND_TASK, 0),
            Held::Core { at, cid } => (cid, KIND_CORE, at),
            Held::Temp(cid) => (cid, KIND_TEMP, 0),
        };
        Entered(cid as u64 | kind << KIND_SHIFT | (cpu as u64) << AT_SHIFT)
    }

    /// The same, marked as owning its (pooled) registration.
    #[cfg_attr(loom, allow(dead_code))] // the thread-local pool is not compiled under loom
    #[inline(always)]
    pub(crate) fn into_pooled(self) -> Entered {
        Entered(self.0 | POOLED_BIT)
    }

    #[inline(always)]
    pub(crate) fn cid(self) -> u32 {
        self.0 as u32
    }

    #[inline(always)]
    pub(crate) fn pooled(self) -> bool {
        self.0 & POOLED_BIT != 0
    }

    pub(crate) fn held(self) -> Held {
        let cid = self.cid();
        match (self.0 >> KIND_SHIFT) & 3 {
            KIND_TASK => Held::Task(cid),
            KIND_CORE => Held::Core { at: (self.0 >> AT_SHIFT) as u32, cid },
            _ => Held::Temp(cid),
        }
    }
}

impl std::fmt::Debug for Entered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entered").field("held", &self.held()).field("pooled", &self.pooled()).finish()
    }
}

/// Proof that the holder owns a CID exclusively, until it is dropped.
///
/// Dropping it gives the CID back: to the registration (per-task), to the core (per-CPU), or to the pool
/// (temporary).
///
/// A guard passed to [`std::mem::forget`] holds its CID until its registration's next enter or drop, which give
/// back what it held as its drop would have; a registration never holds more than one CID. (A forgotten guard of
/// [`Group::enter`](crate::Group::enter) owns its registration, which then stays registered, holding what the guard
/// held, until its thread exits: docs/design.md §9.1.1.)
///
/// ```
/// let group = mmcid::Group::builder().virtual_cpus(1).build()?;
/// let (mut reg, _other) = (group.register(), group.register()); // 2 threads, 1 core: per-CPU mode
/// let forgotten = reg.enter();
/// let cid = forgotten.cid();
/// std::mem::forget(forgotten); // the core's CID stays borrowed...
/// let again = reg.enter(); // ...until this enter gives it back and borrows it again
/// assert_eq!((again.cid(), again.kind()), (cid, mmcid::CidKind::Core(0)));
/// # Ok::<(), mmcid::Error>(())
/// ```
///
/// `!Send`: the CID belongs to the thread that entered, so a guard cannot move to another thread:
///
/// ```compile_fail,E0277
/// let group = mmcid::Group::new();
/// let mut reg = group.register();
/// let guard = reg.enter();
/// std::thread::scope(|s| {
///     s.spawn(move || drop(guard));
/// });
/// ```
///
/// while the registration itself may move between guards:
///
/// ```
/// let group = mmcid::Group::new();
/// let mut reg = group.register();
/// drop(reg.enter());
/// std::thread::spawn(move || drop(reg.enter())).join().unwrap();
/// ```
#[must_use = "dropping the guard releases the CID"]
#[clippy::has_significant_drop]
pub struct CidGuard<'a> {
    /// The registration entered: borrowed mutably for `'a` (`Registration::enter`), or owned by this guard
    /// (`pooled`: taken from the thread's pool by `Group::enter` and given back on drop). A pointer rather than an
    /// enum keeps the drop small enough to inline on the hot path.
    reg: NonNull<Registration>,
    entered: Entered,
    /// The group's id (`Group::id`), carried so that `PerCid` checks a guard without following `reg` to its group.
    group: u64,
    /// What the thread view showed before this guard (`view::enter`), for `view::exit`.
    view_before: crate::view::Before,
    _marker: PhantomData<(&'a mut Registration, *mut ())>,
}

impl std::fmt::Debug for CidGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CidGuard").field("cid", &self.cid()).field("held", &self.entered.held()).finish()
    }
}

impl<'a> CidGuard<'a> {
    #[inline(always)]
    pub(crate) fn borrowed(reg: &'a mut Registration, entered: Entered) -> CidGuard<'a> {
        let view_before = crate::view::enter(entered.cid());
        let group = reg.group.inner.hot.id;
        CidGuard { reg: NonNull::from(reg), entered, group, view_before, _marker: PhantomData }
    }

    /// A guard that owns `reg` (a `Box::into_raw` pointer from the thread-local layer) and gives it back on drop.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn pooled(reg: NonNull<Registration>, entered: Entered) -> CidGuard<'static> {
        let view_before = crate::view::enter(entered.cid());
        // SAFETY: the caller hands us ownership of a live registration (`Box::into_raw`); reading its group's id
        // aliases nothing mutable.
        let group = unsafe { reg.as_ref() }.group.inner.hot.id;
        CidGuard { reg, entered: entered.into_pooled(), group, view_before, _marker: PhantomData }
    }

    /// The CID this guard holds.
    #[inline]
    pub fn cid(&self) -> Cid {
        Cid(self.entered.cid())
    }

    /// Whether the CID is borrowed from a core (per-CPU ownership), owned by the registration (per-task), or
    /// temporary.
    pub fn kind(&self) -> CidKind {
        match self.entered.held() {
            Held::Task(_) => CidKind::Task,
            Held::Core { at, .. } => CidKind::Core(core_of(at as usize)),
            Held::Temp(_) => CidKind::Temporary,
        }
    }

    /// The id of the guard's group.
    #[inline]
    pub(crate) fn group_id(&self) -> u64 {
        self.group
    }
}

/// Where a guard's CID comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CidKind {
    /// Owned by the registration (per-task ownership).
    Task,
    /// Borrowed from this core (per-CPU ownership).
    Core(usize),
    /// Temporary: the core's CID was in use, or a switch was running.
    Temporary,
}

impl Drop for CidGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        crate::view::exit(self.entered.cid(), self.view_before);
        // Copies: the rest of the drop works from registers, not from the guard.
        let (reg, entered, group) = (self.reg, self.entered, self.group);
        // SAFETY: `reg` came from `&'a mut Registration` (and `_marker` keeps that borrow alive for the guard's
        // life), or is owned by this pooled guard until it is given back below; nothing else accesses it now.
        let r = unsafe { &mut *reg.as_ptr() };
        match entered.held() {
            Held::Task(w) => r.exit_task(w),
            Held::Core { at, cid } => r.exit_core(at as usize, cid),
            Held::Temp(_) => return drop_temp(reg, entered, group),
        }
        if entered.pooled() {
            #[cfg(not(loom))]
            crate::local::give_back(reg, group);
        }
        #[cfg(loom)]
        let _ = group;
    }
}

/// Drop of a temporary guard: its exit, then, for a guard of `Group::enter` (pooled) of group `id`, the
/// registration back to the thread-local layer.
#[inline(never)]
fn drop_temp(reg: NonNull<Registration>, entered: Entered, id: u64) {
    // SAFETY: `reg` is borrowed for the guard's life or owned by the pooled guard (`CidGuard::pooled`), a live
    // `Box::into_raw` pointer; nothing else accesses it during the guard's drop.
    unsafe { &mut *reg.as_ptr() }.exit_outstanding(entered);
    if entered.pooled() {
        #[cfg(not(loom))]
        crate::local::give_back(reg, id);
        #[cfg(loom)]
        // SAFETY: as above; under loom pooled guards are never made, so this only keeps the type honest.
        drop(unsafe { Box::from_raw(reg.as_ptr()) });
    }
    #[cfg(loom)]
    let _ = id;
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::state::VALUE;
    use crate::state::{slot_at, MAX_CIDS_PER_CORE};
    use crate::sys::MAX_CPUS;

    /// The guard's packed record round-trips every kind at the extremes it must hold (29-bit CIDs, 16-bit cores and
    /// 4-bit slot numbers), pooled or not: `held()`, which the inline drop matches on, gives back exactly the kind
    /// and values packed, and the pooled bit changes nothing else.
    #[test]
    fn entered_packs_every_kind() {
        let max_cid = VALUE;
        let max_at = slot_at(MAX_CPUS - 1, MAX_CIDS_PER_CORE - 1) as u32;
        for held in [
            Held::Task(0),
            Held::Task(max_cid),
            Held::Core { at: 0, cid: 0 },
            Held::Core { at: max_at, cid: max_cid },
            Held::Temp(max_cid),
        ] {
            let e = Entered::new(held);
            assert_eq!(e.held(), held);
            assert_eq!(e.into_pooled().held(), held, "the pooled bit leaves the rest alone");
            let cid = match held {
                Held::Task(c) | Held::Temp(c) | Held::Core { cid: c, .. } => c,
            };
            assert_eq!((e.cid(), e.into_pooled().cid()), (cid, cid));
            assert!(!e.pooled() && e.into_pooled().pooled());
        }
    }
}
