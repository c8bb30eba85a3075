//! # mmcid — compact, exclusive concurrency IDs for thread groups
//!
//! A user-space counterpart of the Linux kernel's rseq `mm_cid`: every thread of a [`Group`] that holds a
//! [`CidGuard`] carries a concurrency ID ([`Cid`]) that no other live guard of the group holds, kept below
//! about `min(cores the group may use, threads in the group)` in steady state ([`Group::max_cids`]: up to 25 %
//! more before the group switches to per-core ownership, and temporary CIDs aside), so per-CPU style sharded data
//! ([`PerCid`], [`ShardedCounter`], the object cache [`Pool`]) can be indexed by it, sized by real concurrency, and
//! touched without atomic read-modify-writes.
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
//! phases as in the kernel's ownership design of Linux 6.19 with its fixes of 2026 (one mode word and a fence on
//! each side of the walk, commit 47ee94efccf6; a fixup walk over an explicit registration list, as the kernel's
//! `user_list` of commit 192d852129b1; release of the final mode). The Dekker pairs between enter/exit and the
//! fixup use `membarrier` on the rare side and compiler fences on the hot side where the kernel allows it. The
//! [design](docs::design) defines the kernel's terms ([Terms](docs::design#terms)) and has the state machines
//! and the table of every atomic access; the packed words' state tables are on their definitions in the source
//! (`src/state.rs`).
//!
//! Every ordering is model-checked with loom (`loom-tests/`; the restartable sequences are modelled, not run),
//! each protected ordering with a mutant that loom rejects (one, F4's Release, only in a litmus copy: no model of
//! the real code needs it); the [loom page](docs::loom) lists the models and how to run them.
//!
//! ## Costs, and how long to hold a guard
//!
//! `docs/benchmarks.md` (in the repository and the package) has every number with its run and its same-run
//! peers. In a loop shaped like user code (`examples/use_case.rs`), an enter, an update of a 56-byte record in the
//! guard's [`PerCid`] shard and the exit cost about 1.2 times what `thread_local` costs for the same update in
//! per-task mode, a little more through [`Group::enter`], and about twice that in per-CPU mode (a restartable
//! sequence, or one CAS, to borrow the core's CID). A guard is a CID reservation like the kernel's "running on a
//! CPU", so keep it around the work on per-CID data: a thread that blocks or is preempted inside its guard keeps
//! its CID, so the next thread entering on that core borrows one of the core's extra CIDs (CID sets,
//! [`GroupBuilder::cids_per_core`]), and a group where half the threads hold guards at once switches to per-task
//! ownership ([design §3.1](docs::design#31-occupancy-per-task-ownership-when-guards-are-held-across-deschedules)).
//! [`Stats::enter_cpu_extra`] and [`Stats::enter_temporary`] against the other `enter_*` counts of
//! [`Group::stats`] show how often that happens.
//!
//! ## Invariants
//!
//! [I1 exclusivity](docs::design#i1), [I2 range](docs::design#i2), [I3 stability](docs::design#i3),
//! [I4 convergence](docs::design#i4), [I5 accounting](docs::design#i5), [I6 progress](docs::design#i6),
//! [I7 unwind safety](docs::design#i7), [I8 hand-over visibility](docs::design#i8),
//! [I9 typed errors](docs::design#i9): the design's [invariants table](docs::design#invariants) gives each one's
//! statement, the code that enforces it, and the tests and loom models (named after them) that check it.
//!
//! **The range bound, exactly ([I2](docs::design#i2)).** At every instant at most `users + K · cores` CIDs are in
//! use ([`Group::users`], [`Group::cores`], `K` = [`Group::cids_per_core`]): each registration holds at most one,
//! and each core at most `K` (one with `cids_per_core(1)`, the kernel's design; the extra ones only while guards
//! held by descheduled threads need them, [design §2.6](docs::design#26-several-cids-per-core-a-cores-cid-set)).
//! Each CID is below that bound *when it is handed out*, with `users` as it was then; it is not checked again. A
//! guard keeps its CID for its whole life, and a registration its per-task CID between guards, while other
//! registrations drop, so a live CID is below the largest bound since it was taken (at most the group's peak), not
//! necessarily below today's ([design §12.4](docs::design#124-the-range-bound-exactly-i2)). Once membership stops
//! shrinking, its holder converges to a CID below [`Group::max_cids`] at a later enter ([I4](docs::design#i4)),
//! when a lower one is free:
//!
//! ```
//! use mmcid::{CidKind, Group};
//! let group = Group::builder().virtual_cpus(1).cids_per_core(1).build()?;
//! let mut regs: Vec<_> = (0..10).map(|_| group.register()).collect(); // 10 users, 1 core: per-CPU mode
//! let mut last = regs.pop().unwrap();
//! let held: Vec<_> = regs.iter_mut().map(|r| r.enter()).collect();  // core 0's CID 0, temporaries 1..=8
//! let live = last.enter();
//! assert_eq!((live.kind(), live.cid().get()), (CidKind::Temporary, 9)); // below users + cores = 11
//! drop(held);
//! drop(regs);                                                         // membership shrinks to one user
//! assert_eq!(group.users() + group.cores(), 2);
//! assert!(live.cid().get() >= group.users() + group.cores());         // live, yet beyond today's bound
//! assert!(group.stats().cids_in_use as usize <= group.users() + group.cores()); // how many: still bounded
//! drop(live);
//! assert_eq!(last.enter().cid().get(), 0);                            // the next enter converges
//! # Ok::<(), mmcid::Error>(())
//! ```
//!
//! ## Platform and process events
//!
//! What a group does when the platform or the process does something the protocol cannot see coming
//! ([design §12](docs::design#12-platform-and-process-events) has the arguments).
//!
//! * **No `membarrier` or no rseq.** Where the process cannot register for `membarrier` (old kernels, a
//!   seccomp filter at start-up) or [`GroupBuilder::asymmetric_fences`] is off, enter and exit pay a full fence
//!   instead of a compiler fence ([`Group::uses_membarrier`]). Where restartable sequences are not available
//!   (another target than x86_64 Linux with glibc ≥ 2.35, `glibc.pthread.rseq=0`, valgrind, no RSEQ membarrier,
//!   virtual cores) per-CPU borrows are a CAS ([`Group::uses_rseq`]) and the current CPU comes from
//!   `sched_getcpu`. A thread of an rseq group whose own rseq area is not registered takes temporary CIDs.
//!   All of these are correct, only slower.
//! * **`membarrier` failing later.** A call can fail after registration: ENOMEM (the kernel could not allocate
//!   its CPU mask), or any errno from a seccomp filter installed after the group was built. ENOMEM is retried
//!   (four tries in all); a failure is counted in [`Stats::membarrier_failures`] and never aborts. The switch,
//!   claim or drain that needed the barrier then takes nothing that only the barrier made safe to take:
//!   registrations keep their CIDs into per-CPU mode (each gives its own up at its next enter), cores keep theirs
//!   into per-task mode (until a later switch or the last drop), a claimed slot goes back to its core. CIDs stay
//!   exclusive and within the bound above; they are less compact until the barrier works again. A filter that
//!   kills the thread or raises SIGSYS for `membarrier` is beyond what a library can handle.
//! * **`fork`.** Fork handlers hold every group's lifecycle and claim locks across `fork`, so the child never
//!   inherits one held by a thread it does not have (a fork waits for registers, drops, switches and claims in
//!   progress). In the child a group is the parent's as it was at the fork: the forking thread's registrations
//!   and guards (explicit or [`Group::enter`]'s) work as before, new registrations work, and every other thread's
//!   registrations are frozen, keeping their CIDs and counting as users until the child exits. Not covered:
//!   `vfork`, `_Fork` and `clone` without fork handlers; a fork from a signal handler that interrupted its own
//!   thread inside a lifecycle operation (it would wait for itself); a [`Runtime`] (its threads are not in the
//!   child). Registering allocates, so the child relies on the C library making `malloc` usable there (glibc
//!   does).
//! * **Signals.** A handler may use a [`Registration`] of its own, made outside the handler and used by nothing
//!   else while the handler runs (one per thread; keep the signal blocked during its own handler, the default
//!   without `SA_NODEFER`): [`Registration::enter`] and the guard's drop take no lock, allocate nothing, and make
//!   no system call but `sched_getcpu`, `membarrier` and the sleeps between its retries; whatever the handler
//!   interrupted (even a claim in progress, whose lock it only tries), it finds a free CID (a
//!   temporary if the interrupted guard holds the core's CID), and a restartable sequence it interrupted is
//!   aborted by the kernel and retried. [`PerCid::get_mut`] and [`ShardedCounter::add_with`] allocate the first
//!   time a CID's shard is used, so only shards that already exist are safe there. A handler must not register,
//!   drop a registration, build a group, call [`Group::stats`], [`Group::cpus`], [`Group::set_cpus_allowed`]
//!   (the lifecycle lock: it would wait for itself if it interrupted its own thread inside one), or use the
//!   thread-local layer ([`Group::enter`], [`Group::leave_thread`], [`ShardedCounter::add`] and `sub`).
//! * **CPU numbers.** [`Group::cores`] covers every CPU number the kernel can report (its `nr_cpu_ids`: the
//!   highest possible CPU plus one, gaps and offline CPUs included), read from
//!   `/sys/devices/system/cpu/possible` where that agrees with the kernel and from `sched_getaffinity`'s bound
//!   otherwise, so every CPU a thread may run on has its own slot.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, clippy::undocumented_unsafe_blocks)]

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
mod barriers;
mod bitmap;
mod counter;
mod cpuset;
mod enter;
mod error;
mod exit;
#[cfg(not(loom))]
mod fork;
mod group;
mod guard;
#[cfg(not(loom))]
mod local;
mod mutants;
mod percid;
mod pool;
mod registration;
#[cfg(not(loom))]
mod runtime;
mod slots;
mod state;
mod stats;
mod switches;
mod sync;
mod sys;
mod view;

pub use counter::ShardedCounter;
pub use cpuset::CpuSet;
pub use error::Error;
#[doc(hidden)]
pub use group::Audit;
pub use group::{Group, GroupBuilder};
pub use guard::{Cid, CidGuard, CidKind};
#[cfg(loom)]
pub use mutants::Mutant;
pub use percid::{IterVisited, PerCid};
pub use pool::{Pool, PoolBuilder, PoolStats, Pooled};
pub use registration::Registration;
#[cfg(not(loom))]
pub use runtime::{current, Context, JoinHandle, Runtime, RuntimeBuilder, Scope, ScopedJoinHandle, ThreadView};
pub use slots::MAX_CIDS_PER_CORE;
pub use state::Mode;
pub use stats::Stats;

/// The crate's design documents, published with the API docs (their sources are `docs/*.md` in the package).
pub mod docs {
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}

    #[doc = include_str!("../docs/loom.md")]
    pub mod loom {}
}

/// The README's code blocks, compiled and run as doctests so the front page never rots.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
