//! Unit tests that need the crate's internals and real threads, CPUs or system calls, each in a module of its own,
//! and what they share.

mod platform;
// glibc's rseq area, `sched_getcpu` and real pinning: Linux's platform calls.
#[cfg(all(target_os = "linux", target_env = "gnu", not(mmcid_portable)))]
mod rseq;
mod slots;
mod sys;

/// Taken for writing by the tests that fork (from before they take a group's lock by hand, where they do) and
/// for reading by those that check a group's claim lock: the fork handlers take every live group's locks for
/// the fork's duration (design.md §12.2), which such a test would see as another claimer's (more often the
/// more CPUs run the tests at once).
pub(crate) static FORKS: std::sync::RwLock<()> = std::sync::RwLock::new(());
