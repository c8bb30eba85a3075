//! # mmcid — compact, exclusive concurrency IDs for thread groups
//!
//! A user-space counterpart of the Linux kernel's rseq `mm_cid`: every thread of a [`Group`] that holds a
//! [`CidGuard`] carries a concurrency ID ([`Cid`]) that no other live guard of the group holds, kept below
//! about `min(cores the group may use, threads in the group)` in steady state ([`Group::max_cids`]: up to 25 %
//! more before the group switches to per-core ownership, and temporary CIDs aside), so per-CPU style sharded data
//! ([`PerCid`], [`ShardedCounter`]) can be indexed by it, sized by real concurrency, and touched without atomic
//! read-modify-writes.
//!
//! ```
//! use mmcid::Group;
//!
//! let group = Group::new();
//! let mut reg = group.register();          // ≈ fork
//! {
//!     let guard = reg.enter();             // ≈ schedule-in
//!     assert!(guard.cid().get() < group.max_cids());
//! }                                        // ≈ schedule-out
//! drop(reg);                               // ≈ exit
//! ```
//!
//! ## How it works
//!
//! CIDs come from an atomic bitmap. Ownership follows the kernel's latest design: while there are no more
//! threads than the group's bound, each [`Registration`] owns a CID (per-task mode) and entering touches only the
//! registration's own cache line with no read-modify-write; with more threads, each core owns a CID (per-CPU
//! mode) and the thread entering on a core borrows it from the core's own slot, with a restartable sequence where
//! the platform allows it (x86_64 Linux with glibc's rseq area and the RSEQ membarrier, real CPUs: no
//! read-modify-write; see [`Group::uses_rseq`]) and one CAS elsewhere. A thread that finds
//! its core's CID in use by a thread descheduled inside its guard takes a temporary CID: nobody ever waits.
//!
//! Mode switches happen only at [`Group::register`], registration drop and [`Group::set_cpus_allowed`], in two
//! phases as in the kernel since 2026 (single mode word, a fence after the flip, a fixup walk over an explicit
//! registration list, release of the final mode). The Dekker pairs between enter/exit and the fixup use
//! `membarrier` on the rare side and compiler fences on the hot side where the kernel allows it.
//!
//! Every ordering is model-checked with loom (`loom-tests/`; the restartable sequences are modelled, not run),
//! each protected ordering with a mutant that loom rejects (one, F4's Release, only in a litmus copy: no model of
//! the real code needs it, `docs/loom.md`). The
//! state machines, state tables and the table of every atomic access are in `docs/design.md`.
//!
//! ## Costs, and how long to hold a guard
//!
//! On the project's 2-core x86 VM (`docs/benchmarks.md` has every number with its run): an enter+exit pair is
//! about 1.4 ns in per-task mode, 4.3 ns in per-CPU mode with a restartable sequence (the kernel's rseq `mm_cid`
//! plus one atomic add is 5.1 ns there), 2.6 ns through [`Group::enter`], and 14 ns when it takes a temporary CID.
//! A guard is a CID reservation like the kernel's "running on a CPU", so keep it around the work on per-CID data:
//! a thread that blocks or is preempted inside its guard keeps its core's CID, and every other thread entering on
//! that core meanwhile takes a temporary. [`Stats::enter_temporary`] against the other `enter_*` counts of
//! [`Group::stats`] shows how often that happens.
//!
//! ## Invariants
//!
//! I1 exclusivity, I2 range, I3 stability, I4 convergence, I5 accounting, I6 progress, I7 unwind safety, I8
//! hand-over visibility, I9 typed errors: see `docs/design.md` and the tests named after them.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, clippy::undocumented_unsafe_blocks)]

mod bitmap;
mod counter;
mod cpuset;
mod error;
#[cfg(not(loom))]
mod fork;
mod group;
#[cfg(not(loom))]
mod local;
mod percid;
pub mod policy;
mod registration;
#[cfg(not(loom))]
mod runtime;
mod state;
mod stats;
mod sync;
mod sys;
mod view;

pub use counter::ShardedCounter;
pub use cpuset::CpuSet;
pub use error::Error;
#[doc(hidden)]
pub use group::Audit;
pub use group::{Group, GroupBuilder};
pub use percid::{IterVisited, PerCid};
pub use registration::{Cid, CidGuard, CidKind, Registration};
#[cfg(not(loom))]
pub use runtime::{current, Context, JoinHandle, Runtime, RuntimeBuilder, Scope, ScopedJoinHandle, ThreadView};
pub use state::Mode;
#[cfg(loom)]
pub use state::Mutant;
pub use stats::Stats;

/// The README's code blocks, compiled and run as doctests so the front page never rots.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
