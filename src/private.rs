//! Not part of the API: what the workspace's unpublished `mmcid-policies` crate (the kernel's historical CID
//! policies, which the examples compare with mmcid) needs from inside the library, so that every policy reads the
//! current core exactly as mmcid does and sizes itself by the same limits. Hidden from the docs; it may change in
//! any release.

/// The calling thread's core as the library reads it (the kernel's rseq `cpu_id` from the area glibc registered,
/// else `sched_getcpu`; 0 if unknown). Reads the rseq area only after [`probe_rseq`] ran in this process.
#[inline(always)]
pub fn current_cpu() -> usize {
    crate::sys::current_cpu()
}

/// Looks up glibc's rseq area once per process (idempotent); building a [`Group`](crate::Group) does it too. Never
/// on a hot path: it takes the loader's lock.
pub fn probe_rseq() {
    crate::rseq::probe();
}

/// `__rseq_offset`, where every thread's `struct rseq` lies from its thread pointer, if glibc registered an area
/// the library reads its CPU from (the library's one probe, [`probe_rseq`], which this runs); `None` otherwise
/// (another libc, glibc < 2.35, a failed registration, an architecture without the rseq read).
pub fn rseq_offset() -> Option<isize> {
    probe_rseq();
    crate::rseq::offset()
}

/// The size of the library's CID space: the most CIDs a group can hand out.
pub const MAX_CIDS: usize = crate::bitmap::MAX_BITS;

/// The most cores (real or virtual) a group can have.
pub const MAX_CPUS: usize = crate::sys::MAX_CPUS;

/// The group's process-unique id (what matches guards with data of the same group), for the `MmCid` policy's debug
/// check that a registration belongs to its group.
pub fn group_id(group: &crate::Group) -> u64 {
    group.id()
}
