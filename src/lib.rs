//! # mmcid — per-CPU data for user space, indexed by compact concurrency IDs
//!
//! mmcid gives every thread of a [`Group`] that holds a guard a small integer, its concurrency ID ([`Cid`]), that
//! no other live guard of the group holds and that stays below about the number of cores in use. Index data by
//! it and each thread updates its own shard with plain loads and stores: no lock, no atomic read-modify-write, no
//! cache line shared between threads, and memory for as many shards as cores, not as threads. It is the
//! user-space counterpart of the Linux kernel's rseq `mm_cid`.
//!
//! ## What to use when
//!
//! * [`ShardedCounter`]: a counter many threads add to (`add` needs no guard); `sum` reads it at any time.
//! * [`SharedPerCid`]: per-CID statistics read while threads record (a histogram, a set of counters): holders
//!   get `&T` (atomics, updated with a load and a store), readers iterate every shard at any time.
//! * [`PerCid`]: per-CID data of any type (a `Vec`, a record, a buffer) through `&mut T`; read it all with
//!   `&mut` (`iter_mut`, `into_iter`) once the threads are done.
//! * [`Pool`]: a per-CID cache of reusable objects (take one, give it back), for allocation-heavy code.
//! * [`Registration`] or [`Group::enter`]: a thread that enters often keeps a `Registration` and calls
//!   [`Registration::enter`] (the fastest path); code that does not manage its threads calls `Group::enter`,
//!   which registers the thread on first use and unregisters it when the thread exits.
//! * [`Runtime`]: pinned worker threads, registered for their whole life, that read their core and CID without
//!   a system call ([`current`]).
//!
//! ## Examples
//!
//! A counter:
//!
//! ```
//! let group = mmcid::Group::new();
//! let hits = mmcid::ShardedCounter::new(&group);
//! std::thread::scope(|s| {
//!     for _ in 0..4 {
//!         s.spawn(|| (0..1000).for_each(|_| hits.add(1)));
//!     }
//! });
//! assert_eq!(hits.sum(), 4000);
//! ```
//!
//! A histogram read while threads record into it (`examples/histogram.rs` is the full program):
//!
//! ```
//! use mmcid::{Group, SharedPerCid};
//! use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
//!
//! let group = Group::new();
//! let latency: SharedPerCid<[AtomicU64; 32]> = SharedPerCid::new(&group); // log2 buckets, per CID
//! let record = |ns: u64| {
//!     let guard = group.enter();
//!     let bucket = &latency.get(&guard)[63 - (ns | 1).leading_zeros() as usize];
//!     bucket.store(bucket.load(Relaxed) + 1, Relaxed); // this CID's holder is the only writer
//! };
//! let read = || -> Vec<u64> {
//!     let mut total = vec![0; 32];
//!     for (_cid, buckets) in &latency {
//!         total.iter_mut().zip(buckets).for_each(|(t, b)| *t += b.load(Relaxed));
//!     }
//!     total
//! };
//! std::thread::scope(|s| {
//!     s.spawn(|| (0..1000).for_each(|i| record(100 + i)));
//!     s.spawn(|| (0..1000).for_each(|i| record(5000 + i)));
//!     let live = read(); // any time, while they record
//!     assert!(live.iter().sum::<u64>() <= 2000);
//! });
//! assert_eq!(read().iter().sum::<u64>(), 2000); // exact once they are done
//! ```
//!
//! Records: several per-thread tables are one struct in one [`PerCid`], reached through one guard.
//!
//! ```
//! use mmcid::{Group, PerCid};
//!
//! #[derive(Default)]
//! struct Shard {
//!     requests: u64,
//!     bytes: u64,
//!     errors: Vec<String>,
//! }
//!
//! let group = Group::new();
//! let mut shards: PerCid<Shard> = PerCid::new(&group);
//! let mut reg = group.register();       // once per thread
//! for n in [100, 200, 0] {
//!     let mut guard = reg.enter();      // an exclusive CID, for a short while
//!     let shard = shards.get_mut(&mut guard);
//!     shard.requests += 1;              // plain fields: nobody else has this shard now
//!     shard.bytes += n;
//!     if n == 0 {
//!         shard.errors.push("empty request".into());
//!     }
//! }                                     // each guard gives its CID back
//! drop(reg);
//! let requests: u64 = shards.iter_mut().map(|(_cid, s)| s.requests).sum();
//! assert_eq!(requests, 3);
//! ```
//!
//! Async code: a guard is not `Send` and a task may move to another thread at every `.await`, so hold data
//! across an `.await`, never a guard. Enter, update, drop the guard, then await:
//!
//! ```
//! use mmcid::{Group, SharedPerCid};
//! use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
//!
//! async fn receive() -> u64 { 512 } // stands for real I/O
//!
//! async fn serve(group: &Group, bytes: &SharedPerCid<AtomicU64>) {
//!     let n = receive().await;         // no guard held across the .await
//!     {
//!         let guard = group.enter();
//!         let b = bytes.get(&guard);
//!         b.store(b.load(Relaxed) + n, Relaxed);
//!     }                                // the guard ends before the next .await
//!     receive().await;
//! }
//!
//! // What a multi-threaded executor (`tokio::spawn`) requires of a task:
//! fn spawn<F: std::future::Future + Send>(task: F) -> F { task }
//! let group = Group::new();
//! let bytes = SharedPerCid::new(&group);
//! let _task = spawn(serve(&group, &bytes));
//! ```
//!
//! A guard held across an `.await` makes the task `!Send`, so a multi-threaded executor refuses it at compile time:
//!
//! ```compile_fail,E0277
//! # use mmcid::Group;
//! async fn receive() -> u64 { 512 }
//! async fn serve(group: &Group) {
//!     let guard = group.enter();
//!     receive().await;                 // the guard lives across the .await…
//!     drop(guard);
//! }
//! fn spawn<F: std::future::Future + Send>(task: F) -> F { task }
//! let group = Group::new();
//! let _task = spawn(serve(&group));    // …so the task is not Send: does not compile
//! ```
//!
//! ## How it works
//!
//! A CID comes from an atomic bitmap and is owned in one of two ways, as in the Linux kernel. While a group has
//! about as many threads as cores or fewer ([`Group::max_cids`]), each [`Registration`] owns a CID, and entering is a store to the registration's
//! own cache line. With more threads, each core owns a CID, and the thread entering on a core borrows it from the
//! core's own slot: with a restartable sequence where the platform allows it ([`Group::uses_rseq`]), else one
//! CAS. A thread that finds its core's CID held by a thread descheduled inside its guard borrows one of the core's
//! extra CIDs ([`GroupBuilder::cids_per_core`]) or takes a temporary one: nobody ever waits. The group switches
//! between the two only when threads register or leave, and CIDs move back below the bound at the next enter
//! after threads leave. Whatever a CID's previous holder wrote to its shard is visible to the next holder, which
//! is why a shard needs no atomics inside a guard.
//!
//! The [design](docs::design) has the invariants with what checks each one, the kernel terms the code borrows,
//! the state machines and the argument for every atomic access; every memory ordering is model-checked with loom
//! (`loom-tests/`, the [loom page](docs::loom)), each protected ordering with a mutant that loom rejects.
//!
//! ## Costs, and how long to hold a guard
//!
//! `docs/benchmarks.md` (in the repository and the package) has every number with its run and its same-run
//! peers. In a loop shaped like user code (`examples/use_case.rs`), an enter, an update of a 56-byte record in a
//! [`PerCid`] shard and the exit cost about 1.2 times what `thread_local` costs for the same update with a
//! [`Registration`], a little more through [`Group::enter`], and about twice that with more threads than cores.
//! A guard reserves its CID like a thread running on a CPU, so keep it around the work on per-CID data: a thread
//! that blocks or is preempted inside its guard keeps its CID, and the next thread on that core takes another
//! (and a group where half the threads hold guards at once gives every thread a CID of its own).
//! [`Stats::enter_cpu_extra`] and [`Stats::enter_temporary`] against the other `enter_*` counts of
//! [`Group::stats`] show how often that happens.
//!
//! ## Platforms
//!
//! mmcid builds on every Unix; the fastest path needs Linux
//! ([design §12.6](docs::design#126-platforms-without-the-linux-calls-the-portable-path) has the arguments).
//! Costs are from `docs/benchmarks.md` (a 2-core x86_64 VM: an enter and its guard's drop).
//!
//! | platform | what it gets | cost of an enter+exit pair |
//! |---|---|---|
//! | Linux x86_64 with glibc ≥ 2.35 | restartable-sequence borrows, `membarrier` (compiler fences on the hot paths), the current CPU from rseq | per-task 1.4 ns, per-CPU 4.3 ns |
//! | Linux on other architectures, or with musl | one CAS per per-CPU borrow, `membarrier`, the current CPU from rseq (glibc) or `sched_getcpu` | per-CPU about 6.9 ns (1.6 ×) |
//! | macOS, FreeBSD, NetBSD, OpenBSD, DragonFly, illumos, Android, other Unix | the CAS, a full fence on both sides instead of `membarrier`, the OS's current-CPU call where it has one (FreeBSD, DragonFly, Android) else a stable core per thread, no pinning | per-task about 12 ns (a full fence each way); per-CPU the CAS and one fence |
//! | Windows and other non-Unix targets | not supported: the build stops with an error naming these platforms | – |
//!
//! Every path gives the same guarantees (exclusive CIDs, the same bounds); only the cost differs. Where the OS
//! cannot say which CPU a thread runs on (macOS, NetBSD, OpenBSD, illumos), each thread gets a core once (the
//! `n`th thread core `n % cores`) and keeps it: threads share a core's slot by that number rather than by the CPU
//! they run on (less locality, the same exclusivity). Outside Linux, [`CpuSet::current`] is every core and
//! [`Runtime`] declares each thread's core to its group without pinning the thread (no affinity API is used).
//! [`Group::uses_rseq`] and [`Group::uses_membarrier`] say what a group got;
//! [`GroupBuilder::restartable_sequences`] and [`GroupBuilder::asymmetric_fences`] switch either off. Building
//! with `RUSTFLAGS="--cfg mmcid_portable"` selects the portable path on Linux too (CI runs the test suite so).
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
//!   `sched_getcpu` (see "Platforms" for other systems). A thread of an rseq group whose own rseq area is not registered takes temporary CIDs.
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
//!   inherits one held by a thread it does not have (a fork waits for group builds, registers, drops, switches and
//!   claims in progress; a fork from a thread-local destructor too), and the process-wide state mmcid makes once
//!   is complete before a fork or finished by the child. In the child a group is the parent's as it was at the fork: the forking thread's registrations
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
//! * **CPU numbers.** [`Group::cores`] covers every CPU number the kernel can report (the highest possible CPU
//!   plus one, gaps and offline CPUs included), read from
//!   `/sys/devices/system/cpu/possible` where that agrees with the kernel and from `sched_getaffinity`'s bound
//!   otherwise, so every CPU a thread may run on has its own slot.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, missing_debug_implementations, clippy::undocumented_unsafe_blocks)]

// Thread-local destructors (`pthread_key_create`), fork handlers (`pthread_atfork`) and the platform calls are Unix's;
// the crate docs' "Platforms" table says what each one gets.
#[cfg(not(unix))]
compile_error!(
    "mmcid supports Unix only: Linux (any architecture; restartable sequences on x86_64 with glibc), macOS, \
     FreeBSD, NetBSD, OpenBSD, DragonFly, illumos and other Unix systems through its portable path; \
     Windows is not supported"
);

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
mod bitmap;
mod counter;
mod cpuset;
mod error;
#[cfg(not(loom))]
mod fork;
mod group;
mod guard;
mod inner;
#[cfg(not(loom))]
mod local;
mod mutants;
mod percid;
mod pool;
mod registration;
mod rseq;
#[cfg(not(loom))]
mod runtime;
mod state;
mod stats;
mod sync;
mod sys;
#[cfg(all(test, not(loom)))]
mod tests;
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
#[allow(deprecated)]
pub use percid::IterVisited;
pub use percid::{PerCid, PerCidIntoIter, PerCidIter, PerCidIterMut, SharedPerCid};
pub use pool::{Pool, PoolBuilder, PoolStats, Pooled};
pub use registration::Registration;
#[cfg(not(loom))]
pub use runtime::{current, Context, JoinHandle, Runtime, RuntimeBuilder, Scope, ScopedJoinHandle, ThreadView};
pub use state::{Mode, MAX_CIDS_PER_CORE};
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
