//! `CpuSet`: a validated set of cores.

use crate::{sys, Error};

/// A non-empty set of CPUs (cores) that a group or runtime may use.
///
/// [`CpuSet::current`] and [`CpuSet::from_cpus`] validate their input (I9): no empty sets, no CPU at or beyond the
/// machine's possible CPUs, no CPU outside the CPUs the process may run on (the affinity mask of the calling thread
/// or of the process's main thread). [`CpuSet::virtual_set`] checks only emptiness and its own range, for virtual
/// groups: a group or runtime over real cores given such a set checks it against the masks itself. A set made by
/// `current` or `from_cpus` stays valid after the thread narrows its own mask (pins itself, say).
///
/// ```
/// use mmcid::CpuSet;
/// let all = CpuSet::current().unwrap();
/// let first = all.iter().next().unwrap();
/// let one = CpuSet::from_cpus([first]).unwrap();
/// assert_eq!(one.len(), 1);
/// assert!(one.contains(first));
/// ```
#[derive(Clone)]
pub struct CpuSet {
    words: Vec<u64>,
    /// Made by [`CpuSet::current`] or [`CpuSet::from_cpus`], so checked against the affinity masks when it was
    /// made (not part of equality: two sets of the same CPUs are equal however they were made).
    checked: bool,
}

impl PartialEq for CpuSet {
    fn eq(&self, other: &CpuSet) -> bool {
        // Trailing zero words are never stored (`insert` grows only as far as the highest CPU).
        self.words == other.words
    }
}

impl Eq for CpuSet {}

impl std::hash::Hash for CpuSet {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.words.hash(state);
    }
}

impl CpuSet {
    /// The calling thread's affinity mask; every core (`0..available_parallelism`) outside Linux, where this crate
    /// reads no affinity mask.
    pub fn current() -> Result<CpuSet, Error> {
        let cpus = sys::affinity().map_err(|errno| Error::Os { what: "sched_getaffinity", errno })?;
        let set = CpuSet::raw(cpus);
        if set.is_empty() {
            return Err(Error::EmptyCpuSet);
        }
        Ok(CpuSet { checked: true, ..set })
    }

    /// A set of the given CPUs, each checked against the possible CPUs and the CPUs the process may run on (the
    /// affinity mask of the calling thread or of the process's main thread, so that a thread pinned to one core
    /// can still name the others).
    pub fn from_cpus<I: IntoIterator<Item = usize>>(cpus: I) -> Result<CpuSet, Error> {
        let set = CpuSet::below(cpus, sys::possible_cpus())?;
        set.check_real()?;
        Ok(CpuSet { checked: true, ..set })
    }

    /// The number of possible CPUs: one more than the highest CPU number the kernel can report (its
    /// `nr_cpu_ids`, gaps and offline CPUs included), so an array of this many per-CPU entries has one for every
    /// CPU a thread may run on (the number `sched_getcpu` returns). [`CpuSet::from_cpus`] refuses CPUs at or
    /// beyond it (the `possible` of [`Error::CpuOutOfRange`]), and a group over real cores has this many
    /// ([`Group::cores`](crate::Group::cores)). Read from `/sys/devices/system/cpu/possible` where that agrees
    /// with the kernel, else from `sched_getaffinity`'s bound, once per process
    /// ([design §12.3](crate::docs::design#123-cpu-numbers)).
    ///
    /// ```
    /// use mmcid::{CpuSet, Group};
    /// let possible = CpuSet::possible_cpus();
    /// assert!(CpuSet::current()?.iter().all(|cpu| cpu < possible));
    /// assert_eq!(Group::new().cores(), possible);
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    pub fn possible_cpus() -> usize {
        sys::possible_cpus()
    }

    /// The check a group or runtime over real cores makes: a set made by [`CpuSet::current`] or
    /// [`CpuSet::from_cpus`] was checked against the affinity masks then, and only the possible CPUs count now
    /// (the thread may have narrowed its own mask since, e.g. pinned itself to one of the cores); any other set
    /// (e.g. [`CpuSet::virtual_set`]) gets the whole [`check_real`](CpuSet::check_real).
    pub(crate) fn validate_real(&self) -> Result<(), Error> {
        if self.checked {
            self.check_possible()
        } else {
            self.check_real()
        }
    }

    /// Checks the set as real cores (I9), whatever constructor made it: not empty, below the machine's possible
    /// CPUs, and each in the affinity mask of the calling thread or of the process's main thread.
    pub(crate) fn check_real(&self) -> Result<(), Error> {
        self.check_possible()?;
        let mut allowed = CpuSet::current()?;
        // A main thread that has exited is a zombie until the process ends: its mask is the one it had then (and
        // a cpuset change since does not reach it). Should it be unreadable, the calling thread's mask decides.
        if let Ok(main) = sys::main_thread_affinity() {
            allowed.union_with(&CpuSet::raw(main));
        }
        match self.iter().find(|&c| !allowed.contains(c)) {
            Some(cpu) => Err(Error::CpuNotAllowed { cpu }),
            None => Ok(()),
        }
    }

    /// Not empty, and every CPU below the machine's possible CPUs.
    pub(crate) fn check_possible(&self) -> Result<(), Error> {
        if self.is_empty() {
            return Err(Error::EmptyCpuSet);
        }
        let possible = sys::possible_cpus();
        match self.iter().find(|&c| c >= possible) {
            Some(cpu) => Err(Error::CpuOutOfRange { cpu, possible }),
            None => Ok(()),
        }
    }

    /// A set of virtual CPUs, for groups built with
    /// [`GroupBuilder::virtual_cpus`](crate::GroupBuilder::virtual_cpus): checked against emptiness and the most
    /// virtual cores a group can have (65 536); the group checks its own range.
    ///
    /// ```
    /// use mmcid::{CpuSet, Error};
    /// assert_eq!(CpuSet::virtual_set([3, 5]).unwrap().len(), 2);
    /// assert!(matches!(CpuSet::virtual_set([usize::MAX]), Err(Error::CpuOutOfRange { .. })));
    /// ```
    pub fn virtual_set<I: IntoIterator<Item = usize>>(cpus: I) -> Result<CpuSet, Error> {
        CpuSet::below(cpus, crate::sys::MAX_CPUS)
    }

    /// A non-empty set of CPUs each below `limit`; checks every CPU before it sizes the set, so a huge number is
    /// an error, not an allocation failure (I9).
    pub(crate) fn below<I: IntoIterator<Item = usize>>(cpus: I, limit: usize) -> Result<CpuSet, Error> {
        let mut set = CpuSet { words: Vec::new(), checked: false };
        for cpu in cpus {
            if cpu >= limit {
                return Err(Error::CpuOutOfRange { cpu, possible: limit });
            }
            set.insert(cpu);
        }
        if set.is_empty() {
            return Err(Error::EmptyCpuSet);
        }
        Ok(set)
    }

    /// Unvalidated set (for virtual CPUs and internal unions).
    pub(crate) fn raw<I: IntoIterator<Item = usize>>(cpus: I) -> CpuSet {
        let mut set = CpuSet { words: Vec::new(), checked: false };
        for cpu in cpus {
            set.insert(cpu);
        }
        set
    }

    fn insert(&mut self, cpu: usize) {
        let w = cpu / 64;
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (cpu % 64);
    }

    /// Number of CPUs in the set.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty (never true for a set built by a public constructor).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.words.get(cpu / 64).is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    /// The CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| (0..64).filter(move |b| w & (1 << b) != 0).map(move |b| i * 64 + b))
    }

    /// Adds every CPU of `other`; returns whether the set grew.
    pub(crate) fn union_with(&mut self, other: &CpuSet) -> bool {
        let before = self.len();
        for cpu in other.iter() {
            self.insert(cpu);
        }
        self.len() > before
    }

    /// Whether every CPU of `other` is in `self`.
    pub fn is_superset(&self, other: &CpuSet) -> bool {
        other.iter().all(|c| self.contains(c))
    }
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_a_typed_error() {
        assert_eq!(CpuSet::from_cpus([]), Err(Error::EmptyCpuSet));
        let possible = sys::possible_cpus();
        assert_eq!(CpuSet::from_cpus([possible + 3]), Err(Error::CpuOutOfRange { cpu: possible + 3, possible }));
        // Huge numbers are rejected before the set is sized (sizing a set for them would abort the process on a
        // failed multi-terabyte allocation).
        for cpu in [1 << 40, usize::MAX] {
            assert_eq!(CpuSet::from_cpus([0, cpu]), Err(Error::CpuOutOfRange { cpu, possible }));
            let max = crate::sys::MAX_CPUS;
            assert_eq!(CpuSet::virtual_set([cpu]), Err(Error::CpuOutOfRange { cpu, possible: max }));
        }
        assert_eq!(CpuSet::virtual_set([]), Err(Error::EmptyCpuSet));
    }

    #[test]
    fn set_operations() {
        let mut a = CpuSet::raw([1, 3, 70]);
        assert_eq!(a.len(), 3);
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![1, 3, 70]);
        assert!(a.contains(70) && !a.contains(2) && !a.contains(1000));
        assert!(!a.union_with(&CpuSet::raw([3])));
        assert!(a.union_with(&CpuSet::raw([2])));
        assert!(a.is_superset(&CpuSet::raw([1, 2])));
        assert_eq!(format!("{a:?}"), "{1, 2, 3, 70}");
    }

    #[test]
    fn current_is_valid() {
        let cur = CpuSet::current().unwrap();
        assert!(!cur.is_empty());
        assert_eq!(CpuSet::from_cpus(cur.iter()).unwrap(), cur);
    }
}
