//! `Runtime`: OS threads pinned to cores, each registered in a [`Group`] for its whole life, with an rseq-style
//! view of its core and CID ([`current`]).
//!
//! Every runtime thread runs the same prologue before the user's closure (its "schedule-in" into the runtime):
//! pin to the chosen core with `sched_setaffinity`, check with `sched_getcpu` that it runs there, register in the
//! group, declare the core to the registration (so entering never asks the OS where it runs) and publish the core
//! in the thread's view. Its epilogue, run on return and on unwinding alike, drops the registration (I7) and
//! clears the view. On the portable path (design.md §12.6: every Unix but Linux) there is no affinity API: the core
//! is declared, not pinned, and the check is skipped.
//!
//! Joining: each unscoped thread stores its closure's result (or panic payload) in a slot it shares with the
//! user's [`JoinHandle`] before it exits, so a `join` never waits on anyone but that thread. The thread's `std`
//! handle stays with the runtime; whoever takes it first (the user's [`JoinHandle::join`], a later spawn reaping
//! finished threads, or the runtime's `Drop`) joins the OS thread, so no thread outlives the runtime.

use crate::{sys, view, Cid, CidGuard, CpuSet, Error, Group, Registration};
use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::thread::{self, Thread};

/// A set of OS threads pinned to cores and registered in one [`Group`]: the thread-per-core shape of servers.
///
/// Threads started with [`Runtime::spawn`] (or [`Runtime::scope`]) are pinned to a core of [`Runtime::cpus`]
/// before their closure runs, are registered in [`Runtime::group`] for their whole life, and see their core and
/// CID through a [`Context`] and through [`current`] without a syscall.
///
/// **Placement.** Each spawn goes to the CPU with the fewest live runtime threads, ties broken round-robin starting
/// after the CPU chosen last. While no runtime thread has exited this is plain round-robin: the `i`-th spawn goes
/// to the `i % n`-th CPU of [`Runtime::cpus`]. [`Runtime::threads_per_cpu`] is the shape the runtime is built for
/// ([`Runtime::capacity`] threads, started at once by [`Runtime::spawn_per_cpu`]); spawning more is allowed and
/// doubles threads up on cores (oversubscription), still balanced. CIDs stay exclusive and compact whatever the
/// count: with more threads than cores the group switches to per-CPU ownership.
///
/// **Dropping** the runtime joins every thread it started that is not joined yet (results of threads whose
/// [`JoinHandle`] is still held stay available through it). Dropped from one of its own threads, it joins all the
/// others and leaves that one to finish on its own.
///
/// ```
/// use mmcid::Runtime;
///
/// let rt = Runtime::builder().build()?;            // one thread per core of the affinity mask
/// let handles: Vec<_> = (0..rt.cpus().len())
///     .map(|_| {
///         rt.spawn(|ctx| {
///             let cpu = ctx.cpu();                   // the core this thread is pinned to
///             let guard = ctx.enter();               // exclusive CID while the guard lives
///             (cpu, guard.cid().get())
///         })
///     })
///     .collect();
/// let mut cpus = Vec::new();
/// for h in handles {
///     let (cpu, cid) = h.join().unwrap();
///     assert!(cid < rt.group().cores() * 2);         // users + cores: one worker per core, no extra CIDs
///     cpus.push(cpu);
/// }
/// cpus.sort();
/// assert_eq!(cpus, rt.cpus().iter().collect::<Vec<_>>()); // round-robin: one per core
/// # Ok::<(), mmcid::Error>(())
/// ```
pub struct Runtime {
    group: Group,
    cpus: CpuSet,
    /// `cpus` in increasing order: placement positions.
    cpu_list: Vec<usize>,
    threads_per_cpu: usize,
    stack_size: Option<usize>,
    shared: Arc<Shared>,
}

/// Builds a [`Runtime`]; every input is validated at [`RuntimeBuilder::build`] (I9).
///
/// ```
/// use mmcid::{CpuSet, Error, Group, Runtime};
///
/// let rt = Runtime::builder().threads_per_cpu(2).build()?;
/// assert_eq!(rt.capacity(), 2 * rt.cpus().len());
///
/// assert_eq!(Runtime::builder().threads_per_cpu(0).build().unwrap_err(), Error::ZeroThreads);
///
/// // A group that may use only the first core cannot host a runtime on all of them.
/// let all = CpuSet::current()?;
/// let first = all.iter().next().unwrap();
/// let small = Group::builder().cpus(CpuSet::from_cpus([first])?).build()?;
/// match all.iter().nth(1) {
///     Some(second) => assert_eq!(
///         Runtime::builder().cpus(all.clone()).group(small).build().unwrap_err(),
///         Error::CpuNotInGroup { cpu: second }
///     ),
///     None => assert!(Runtime::builder().cpus(all.clone()).group(small).build().is_ok()),
/// }
/// # Ok::<(), mmcid::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RuntimeBuilder {
    cpus: Option<CpuSet>,
    threads_per_cpu: usize,
    group: Option<Group>,
    stack_size: Option<usize>,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        RuntimeBuilder { cpus: None, threads_per_cpu: 1, group: None, stack_size: None }
    }
}

impl RuntimeBuilder {
    /// The smallest stack [`RuntimeBuilder::stack_size`] accepts: 64 KiB.
    pub const MIN_STACK_SIZE: usize = 64 * 1024;

    /// The cores threads are pinned to (default: the calling thread's affinity mask, [`CpuSet::current`]).
    pub fn cpus(mut self, cpus: CpuSet) -> Self {
        self.cpus = Some(cpus);
        self
    }

    /// How many threads per core the runtime is built for (default 1): the number [`Runtime::spawn_per_cpu`]
    /// starts on each core. [`Runtime::spawn`] may go beyond it (see [`Runtime`], "Placement").
    pub fn threads_per_cpu(mut self, n: usize) -> Self {
        self.threads_per_cpu = n;
        self
    }

    /// The group threads register in (default: a new group over the runtime's cores,
    /// `Group::builder().cpus(cpus).build()`). Its allowed cores must include every runtime core.
    pub fn group(mut self, group: Group) -> Self {
        self.group = Some(group);
        self
    }

    /// Stack size of the runtime's threads, in bytes (default: the `std::thread` default, 2 MiB unless the
    /// `RUST_MIN_STACK` environment variable says otherwise); at least [`RuntimeBuilder::MIN_STACK_SIZE`], which
    /// leaves room for the thread's own start (pinning, registering) in a debug build. (A `RUST_MIN_STACK` below
    /// that is the environment's choice and is not checked.)
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = Some(bytes);
        self
    }

    /// Validates everything and builds the runtime. Starts no long-lived thread; it pins one short-lived probe
    /// thread to each core so that a core the OS will not run a thread on fails here.
    ///
    /// # Errors
    ///
    /// - [`Error::ZeroThreads`] for `threads_per_cpu(0)`; [`Error::ValueOutOfRange`] when `threads_per_cpu` times
    ///   the cores exceeds the registrations the group can hold, or for a stack below
    ///   [`RuntimeBuilder::MIN_STACK_SIZE`];
    /// - [`Error::EmptyCpuSet`] or [`Error::CpuOutOfRange`] (beyond the machine's possible CPUs) for the CPU set,
    ///   whatever constructor made it, and [`Error::CpuNotAllowed`] (outside the affinity masks of the calling
    ///   thread and of the process's main thread) unless [`CpuSet::current`] or [`CpuSet::from_cpus`] made it
    ///   and checked that then (a [`CpuSet::virtual_set`] is accepted only if it names real cores the process
    ///   may use); the probe below is the last word;
    /// - [`Error::CpuNotInGroup`] when the given group may not use one of the runtime's cores;
    /// - [`Error::PinFailed`] when the OS refuses to pin a thread to a core, or the thread does not land there;
    /// - [`Error::Os`] or [`Error::Spawn`] when an OS call fails.
    pub fn build(self) -> Result<Runtime, Error> {
        if self.threads_per_cpu == 0 {
            return Err(Error::ZeroThreads);
        }
        if let Some(bytes) = self.stack_size {
            Error::check_range("stack_size", bytes, Self::MIN_STACK_SIZE, usize::MAX)?;
        }
        let cpus = match self.cpus {
            Some(cpus) => cpus,
            None => CpuSet::current()?,
        };
        cpus.validate_real()?;
        let group = match self.group {
            Some(group) => {
                let allowed = group.cpus();
                if let Some(cpu) = cpus.iter().find(|&c| !allowed.contains(c) || c >= group.cores()) {
                    return Err(Error::CpuNotInGroup { cpu });
                }
                group
            }
            None => Group::builder().cpus(cpus.clone()).build()?,
        };
        Error::check_range("threads_per_cpu", self.threads_per_cpu, 1, group.registration_limit() / cpus.len())?;
        probe(&cpus)?;
        Ok(Runtime::unchecked(cpus, self.threads_per_cpu, group, self.stack_size))
    }
}

/// Pins one short-lived thread to each CPU, all at once; the first failure (in CPU order) is the answer.
fn probe(cpus: &CpuSet) -> Result<(), Error> {
    thread::scope(|s| {
        let probes: Vec<_> = cpus
            .iter()
            .map(|cpu| {
                thread::Builder::new()
                    .name(format!("mmcid-probe{cpu}"))
                    .spawn_scoped(s, move || pin_and_verify(cpu))
                    .map_err(|e| Error::Spawn { reason: e.to_string() })
            })
            .collect();
        let mut first = Ok(());
        for p in probes {
            let result = p.and_then(|h| {
                h.join().unwrap_or_else(|_| Err(Error::Spawn { reason: "the probe thread panicked".into() }))
            });
            if first.is_ok() {
                first = result;
            }
        }
        first
    })
}

/// Pins the calling thread to `cpu` and checks that it runs there.
fn pin_and_verify(cpu: usize) -> Result<(), Error> {
    let os = |what: &str, errno: i32| format!("{what} failed: {}", std::io::Error::from_raw_os_error(errno));
    sys::pin_current(cpu).map_err(|errno| Error::PinFailed { cpu, reason: os("sched_setaffinity", errno) })?;
    if !sys::PINS {
        // No affinity API (the portable path): the core is declared to the group, not enforced by the OS.
        return Ok(());
    }
    match sys::try_current_cpu() {
        Ok(now) if now == cpu => Ok(()),
        Ok(now) => Err(Error::PinFailed { cpu, reason: format!("the thread runs on CPU {now} after pinning") }),
        Err(errno) => Err(Error::PinFailed { cpu, reason: os("sched_getcpu", errno) }),
    }
}

impl Runtime {
    /// A builder with the defaults: every core of the calling thread's affinity mask, one thread per core, a new
    /// group over those cores.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// `Runtime::builder().build()`.
    pub fn new() -> Result<Runtime, Error> {
        Runtime::builder().build()
    }

    fn unchecked(cpus: CpuSet, threads_per_cpu: usize, group: Group, stack_size: Option<usize>) -> Runtime {
        let cpu_list: Vec<usize> = cpus.iter().collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(State { live: vec![0; cpu_list.len()], cursor: 0, next: 0, threads: BTreeMap::new() }),
        });
        Runtime { group, cpus, cpu_list, threads_per_cpu, stack_size, shared }
    }

    /// The group every runtime thread is registered in.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// The cores threads are pinned to.
    pub fn cpus(&self) -> &CpuSet {
        &self.cpus
    }

    /// Threads per core the runtime is built for.
    pub fn threads_per_cpu(&self) -> usize {
        self.threads_per_cpu
    }

    /// `cpus().len() * threads_per_cpu()`: the thread count the runtime is built for.
    pub fn capacity(&self) -> usize {
        self.cpu_list.len() * self.threads_per_cpu
    }

    /// Runtime threads (scoped or not) that have started and not yet finished their closure and epilogue.
    pub fn live_threads(&self) -> usize {
        self.shared.state.lock().live.iter().sum()
    }

    /// Starts a thread pinned to a core chosen as described in [`Runtime`] ("Placement"), registered in the group
    /// for its whole life, running `f` with the thread's [`Context`].
    ///
    /// Never panics. If the thread cannot be spawned, or pinned (a core taken offline or removed from the
    /// process's cpuset since [`RuntimeBuilder::build`]), or registered, `f` does not run and
    /// [`JoinHandle::join`] returns `Err` with the [`Error`] as the payload (`payload.downcast_ref::<Error>()`).
    ///
    /// ```
    /// let rt = mmcid::Runtime::new()?;
    /// let h = rt.spawn(|ctx| {
    ///     let cpu = ctx.cpu();
    ///     let view = mmcid::current().unwrap();
    ///     assert!(view.is_pinned() && view.cpu() == cpu && view.cid().is_none());
    ///     let guard = ctx.enter();
    ///     assert_eq!(mmcid::current().unwrap().cid(), Some(guard.cid()));
    ///     cpu
    /// });
    /// assert_eq!(h.join().unwrap(), rt.cpus().iter().next().unwrap()); // first spawn: first core
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce(&mut Context) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.spawn_at(None, f)
    }

    /// Starts [`Runtime::threads_per_cpu`] threads on every core, each running a clone of `f` (in rounds:
    /// handle `i` runs on the `i % n`-th core). Returns their handles.
    ///
    /// ```
    /// let rt = mmcid::Runtime::builder().threads_per_cpu(2).build()?;
    /// let handles = rt.spawn_per_cpu(|ctx| ctx.cpu());
    /// assert_eq!(handles.len(), rt.capacity());
    /// for h in handles {
    ///     let cpu = h.cpu();
    ///     assert_eq!(h.join().unwrap(), cpu);
    /// }
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    pub fn spawn_per_cpu<F, T>(&self, f: F) -> Vec<JoinHandle<T>>
    where
        F: Fn(&mut Context) -> T + Send + Sync + 'static,
        T: Send + 'static,
    {
        let f = Arc::new(f);
        (0..self.capacity())
            .map(|i| {
                let f = Arc::clone(&f);
                self.spawn_at(Some(i % self.cpu_list.len()), move |ctx| f(ctx))
            })
            .collect()
    }

    /// Runs `f` with a [`Scope`] whose threads may borrow from the caller's stack; every thread spawned in it is
    /// joined before `scope` returns. Built on [`std::thread::scope`]: if a scoped thread panicked (or could not be
    /// pinned) and was not joined, `scope` panics after joining all of them. A thread the OS could not create at
    /// all is reported by its handle's [`ScopedJoinHandle::join`] only: dropping that handle unjoined drops the
    /// error with it.
    ///
    /// Unlike `std`, the scope is passed by value (it is `Copy`; move a copy into a thread to spawn from there).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// let rt = mmcid::Runtime::new()?;
    /// let hits = AtomicUsize::new(0);
    /// rt.scope(|s| {
    ///     for _ in 0..rt.cpus().len() {
    ///         s.spawn(|ctx| {
    ///             let _guard = ctx.enter();
    ///             hits.fetch_add(1, Ordering::Relaxed);
    ///         });
    ///     }
    /// });
    /// assert_eq!(hits.into_inner(), rt.cpus().len());
    /// assert_eq!(rt.group().users(), 0); // every scoped thread has left the group
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    pub fn scope<'env, F, R>(&'env self, f: F) -> R
    where
        F: for<'scope> FnOnce(Scope<'scope, 'env>) -> R,
    {
        thread::scope(|s| f(Scope { inner: s, rt: self }))
    }

    /// What the OS said when a thread could not be spawned, with the stack size if it was set (the usual cause).
    fn spawn_error(&self, e: std::io::Error) -> Error {
        match self.stack_size {
            Some(bytes) => Error::Spawn { reason: format!("{e} (with a stack of {bytes} bytes)") },
            None => Error::Spawn { reason: e.to_string() },
        }
    }

    /// Chooses a core, takes a seat on it and prepares the thread builder.
    fn prepare(&self, pos: Option<usize>) -> Launch {
        let (pos, index) = self.shared.place(pos);
        let cpu = self.cpu_list[pos];
        let mut builder = thread::Builder::new().name(format!("mmcid-{index}@cpu{cpu}"));
        if let Some(bytes) = self.stack_size {
            builder = builder.stack_size(bytes);
        }
        Launch {
            builder,
            start: Start {
                seat: Seat { shared: Arc::clone(&self.shared), pos },
                cpu,
                index,
                group: self.group.clone(),
            },
        }
    }

    fn spawn_at<F, T>(&self, pos: Option<usize>, f: F) -> JoinHandle<T>
    where
        F: FnOnce(&mut Context) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.reap_finished();
        let Launch { builder, start } = self.prepare(pos);
        let (cpu, index) = (start.cpu, start.index);
        let packet = Arc::new(Packet::new());
        // The thread fills its own result slot, so a `join` never waits on whoever joins the OS thread (the
        // runtime's drop joins them one after another: a thread joining another could otherwise deadlock it).
        let slot = Arc::clone(&packet);
        let body = move || slot.put(std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || start.run(f))));
        let thread = match builder.spawn(body) {
            Ok(handle) => {
                let thread = handle.thread().clone();
                self.shared.state.lock().threads.insert(index, handle);
                Some(thread)
            }
            Err(e) => {
                // The closure, seat included, was dropped by the failed spawn.
                packet.put(Err(Box::new(self.spawn_error(e))));
                None
            }
        };
        JoinHandle { index, cpu, thread, shared: Arc::clone(&self.shared), packet }
    }

    /// Joins the threads that have finished (their results go to their handles' slots), so a long-lived runtime
    /// whose handles are dropped unjoined keeps no finished thread around.
    fn reap_finished(&self) {
        self.reap_where(|h| h.is_finished());
    }

    /// Takes the not-yet-joined threads that `pick` selects out of the registry (under the lock) and joins them
    /// (outside it).
    fn reap_where(&self, pick: impl Fn(&thread::JoinHandle<()>) -> bool) {
        let picked: Vec<thread::JoinHandle<()>> = {
            let mut state = self.shared.state.lock();
            let ids: Vec<usize> = state.threads.iter().filter(|(_, h)| pick(h)).map(|(&i, _)| i).collect();
            ids.iter().filter_map(|i| state.threads.remove(i)).collect()
        };
        for handle in picked {
            reap(handle);
        }
    }
}

impl Drop for Runtime {
    /// Joins every thread the runtime started that nobody has joined yet, except the calling thread if it is one
    /// of them.
    fn drop(&mut self) {
        let me = thread::current().id();
        self.reap_where(|h| h.thread().id() != me);
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("cpus", &self.cpus)
            .field("threads_per_cpu", &self.threads_per_cpu)
            .field("live_threads", &self.live_threads())
            .field("group", &self.group)
            .finish()
    }
}

/// Placement and the not-yet-joined threads, shared by the runtime, its handles and its threads' seats.
struct Shared {
    state: Mutex<State>,
}

struct State {
    /// Live threads per position of `Runtime::cpu_list`.
    live: Vec<usize>,
    /// Where the next tie-break starts.
    cursor: usize,
    /// The next thread's index.
    next: usize,
    /// Unscoped threads nobody has joined yet, by index.
    threads: BTreeMap<usize, thread::JoinHandle<()>>,
}

impl Shared {
    /// Takes a seat at `pos`, or at the least-loaded position (ties round-robin); returns it and a new index.
    fn place(&self, pos: Option<usize>) -> (usize, usize) {
        let mut state = self.state.lock();
        let n = state.live.len();
        let pos = pos.unwrap_or_else(|| {
            let start = state.cursor;
            // min_by_key returns the first minimum: the first least-loaded position at or after the cursor.
            (0..n).map(|k| (start + k) % n).min_by_key(|&p| state.live[p]).unwrap_or(0)
        });
        state.cursor = (pos + 1) % n;
        state.live[pos] += 1;
        let index = state.next;
        state.next += 1;
        (pos, index)
    }
}

/// A live thread's place on its core; given back when dropped (at the very end of the thread's run, or with the
/// closure if the thread could not be spawned).
struct Seat {
    shared: Arc<Shared>,
    pos: usize,
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.shared.state.lock().live[self.pos] -= 1;
    }
}

struct Launch {
    builder: thread::Builder,
    start: Start,
}

/// What a runtime thread needs to run its prologue.
struct Start {
    seat: Seat,
    cpu: usize,
    index: usize,
    group: Group,
}

impl Start {
    /// The thread's body: prologue, `f`, epilogue (the drops, on return and on unwinding alike). A failed
    /// prologue unwinds with the [`Error`] as the payload, without calling the panic hook.
    fn run<F, T>(self, f: F) -> T
    where
        F: FnOnce(&mut Context) -> T,
    {
        let Start { seat, cpu, index, group } = self;
        let _seat = seat; // dropped last: after the registration is gone
        let mut ctx = match Context::start(&group, cpu, index) {
            Ok(ctx) => ctx,
            Err(e) => std::panic::resume_unwind(Box::new(e)),
        };
        drop(group);
        f(&mut ctx)
    }
}

/// The calling runtime thread's handle on its core and registration, passed to [`Runtime::spawn`]'s closure.
///
/// Not `Send`: it describes the thread it was made for. A guard from [`Context::enter`] borrows the context
/// mutably, so read [`Context::cpu`] before entering (or use [`current`] inside the guard).
///
/// ```compile_fail,E0277
/// fn send<X: Send>() {}
/// send::<mmcid::Context>(); // a context stays on its thread
/// ```
///
/// The runtime and its handles, on the other hand, go anywhere:
///
/// ```
/// fn send_sync<X: Send + Sync>() {}
/// send_sync::<mmcid::Runtime>();
/// send_sync::<mmcid::JoinHandle<Vec<u8>>>();
/// send_sync::<mmcid::ThreadView>();
/// ```
///
/// ```
/// let rt = mmcid::Runtime::new()?;
/// let bound = rt.group().cores() + rt.capacity(); // hard bound (I2): cores + users
/// rt.spawn(move |ctx| {
///     let cpu = ctx.cpu();
///     assert_eq!(ctx.registration().cpu(), Some(cpu)); // declared: entering asks the OS nothing
///     let guard = ctx.enter();
///     assert!(guard.cid().get() < bound);
/// })
/// .join()
/// .unwrap();
/// # Ok::<(), mmcid::Error>(())
/// ```
pub struct Context {
    reg: Registration,
    cpu: usize,
    index: usize,
    _not_send: PhantomData<*mut ()>,
}

impl Context {
    /// Prologue: pin, verify, register, declare the core, publish the view.
    fn start(group: &Group, cpu: usize, index: usize) -> Result<Context, Error> {
        pin_and_verify(cpu)?;
        let mut reg = group.try_register()?;
        reg.set_cpu(Some(cpu))?;
        view::set_cpu(Some(cpu));
        Ok(Context { reg, cpu, index, _not_send: PhantomData })
    }

    /// The core this thread is pinned to.
    #[inline]
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// This thread's spawn index in its runtime: 0 for the first thread spawned, 1 for the next, and so on.
    #[inline]
    pub fn index(&self) -> usize {
        self.index
    }

    /// Takes a CID for the life of the guard (≈ schedule-in); see [`Registration::enter`].
    #[inline]
    pub fn enter(&mut self) -> CidGuard<'_> {
        self.reg.enter()
    }

    /// This thread's registration in the runtime's group; it lives until the thread's closure returns or unwinds.
    pub fn registration(&self) -> &Registration {
        &self.reg
    }

    /// The runtime's group.
    pub fn group(&self) -> &Group {
        self.reg.group()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        view::set_cpu(None);
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("cpu", &self.cpu).field("index", &self.index).field("reg", &self.reg).finish()
    }
}

/// A scope for spawning runtime threads that borrow from the caller; see [`Runtime::scope`].
#[derive(Clone, Copy)]
pub struct Scope<'scope, 'env: 'scope> {
    inner: &'scope thread::Scope<'scope, 'env>,
    rt: &'env Runtime,
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Like [`Runtime::spawn`], for a closure that may borrow anything that outlives the scope.
    pub fn spawn<F, T>(&self, f: F) -> ScopedJoinHandle<'scope, T>
    where
        F: FnOnce(&mut Context) -> T + Send + 'scope,
        T: Send + 'scope,
    {
        self.spawn_at(None, f)
    }

    /// Like [`Runtime::spawn_per_cpu`]: [`Runtime::threads_per_cpu`] scoped threads on every core.
    pub fn spawn_per_cpu<F, T>(&self, f: F) -> Vec<ScopedJoinHandle<'scope, T>>
    where
        F: Fn(&mut Context) -> T + Send + Sync + 'scope,
        T: Send + 'scope,
    {
        let f = Arc::new(f);
        let n = self.rt.cpu_list.len();
        (0..self.rt.capacity())
            .map(|i| {
                let f = Arc::clone(&f);
                self.spawn_at(Some(i % n), move |ctx| f(ctx))
            })
            .collect()
    }

    /// The runtime this scope spawns on.
    pub fn runtime(&self) -> &'env Runtime {
        self.rt
    }

    fn spawn_at<F, T>(&self, pos: Option<usize>, f: F) -> ScopedJoinHandle<'scope, T>
    where
        F: FnOnce(&mut Context) -> T + Send + 'scope,
        T: Send + 'scope,
    {
        let Launch { builder, start } = self.rt.prepare(pos);
        let (cpu, index) = (start.cpu, start.index);
        let inner = builder.spawn_scoped(self.inner, move || start.run(f)).map_err(|e| self.rt.spawn_error(e));
        ScopedJoinHandle { inner, cpu, index }
    }
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope").field("runtime", self.rt).finish()
    }
}

/// An owned permission to join a runtime thread; see [`Runtime::spawn`].
///
/// Dropping it detaches nothing: the runtime still joins the thread (at a later spawn once it has finished, or
/// when the runtime is dropped).
pub struct JoinHandle<T> {
    index: usize,
    cpu: usize,
    thread: Option<Thread>,
    shared: Arc<Shared>,
    packet: Arc<Packet<T>>,
}

impl<T> JoinHandle<T> {
    /// Waits for the thread to finish and returns its result: `Ok` with the closure's value, or `Err` with the
    /// panic payload if it panicked (its guards and registration were released while unwinding, I7), or with an
    /// [`Error`] payload if it could not be spawned, pinned or registered (the closure did not run).
    ///
    /// ```
    /// let rt = mmcid::Runtime::new()?;
    /// let h = rt.spawn(|ctx| {
    ///     let first = ctx.index() == 0; // read before entering: the guard borrows the context
    ///     let _guard = ctx.enter();
    ///     if first {
    ///         std::panic::resume_unwind(Box::new("boom")); // like panic!, without the message on stderr
    ///     }
    /// });
    /// let payload = h.join().unwrap_err();
    /// assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    /// assert_eq!(rt.group().users(), 0);            // the registration was dropped while unwinding
    /// assert_eq!(rt.group().stats().cids_in_use, 0); // and its CID given back
    /// # Ok::<(), mmcid::Error>(())
    /// ```
    ///
    /// When this call joins the OS thread itself (the usual case), it returns after the thread has exited,
    /// thread-local destructors included. If the runtime's drop or a later spawn is joining it at the same time,
    /// it returns as soon as the closure's result is in, possibly while those destructors still run.
    pub fn join(self) -> thread::Result<T> {
        if self.thread.as_ref().is_some_and(|t| t.id() == thread::current().id()) {
            // Joining oneself would wait forever (or make std panic): refuse, and leave the thread to the runtime.
            return Err(Box::new(Error::JoinSelf));
        }
        let handle = self.shared.state.lock().threads.remove(&self.index);
        if let Some(handle) = handle {
            reap(handle);
        }
        // The thread put its result in the slot before exiting (it never waits on the reaper).
        self.packet.take()
    }

    /// Whether the thread has finished (a following `join` does not block for long).
    pub fn is_finished(&self) -> bool {
        match self.shared.state.lock().threads.get(&self.index) {
            Some(handle) => handle.is_finished(),
            None => self.packet.is_full(),
        }
    }

    /// The core the thread is (or was to be) pinned to.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// The thread's spawn index ([`Context::index`]).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The underlying thread; `None` if it could not be spawned.
    pub fn thread(&self) -> Option<&Thread> {
        self.thread.as_ref()
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle").field("index", &self.index).field("cpu", &self.cpu).finish_non_exhaustive()
    }
}

/// A permission to join a scoped runtime thread; see [`Scope::spawn`].
pub struct ScopedJoinHandle<'scope, T> {
    inner: Result<thread::ScopedJoinHandle<'scope, T>, Error>,
    cpu: usize,
    index: usize,
}

impl<T> ScopedJoinHandle<'_, T> {
    /// Like [`JoinHandle::join`].
    pub fn join(self) -> thread::Result<T> {
        match self.inner {
            Ok(h) => h.join(),
            Err(e) => Err(Box::new(e)),
        }
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.inner.as_ref().map_or(true, |h| h.is_finished())
    }

    /// The core the thread is (or was to be) pinned to.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// The thread's spawn index ([`Context::index`]).
    pub fn index(&self) -> usize {
        self.index
    }
}

impl<T> fmt::Debug for ScopedJoinHandle<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedJoinHandle").field("index", &self.index).field("cpu", &self.cpu).finish_non_exhaustive()
    }
}

/// A thread's result slot, shared by its [`JoinHandle`] and its registry entry.
struct Packet<T> {
    result: Mutex<Option<thread::Result<T>>>,
    filled: Condvar,
}

impl<T> Packet<T> {
    fn new() -> Packet<T> {
        Packet { result: Mutex::new(None), filled: Condvar::new() }
    }

    fn put(&self, result: thread::Result<T>) {
        *self.result.lock() = Some(result);
        self.filled.notify_all();
    }

    fn is_full(&self) -> bool {
        self.result.lock().is_some()
    }

    /// Waits until the slot is filled and empties it.
    fn take(&self) -> thread::Result<T> {
        let mut result = self.result.lock();
        loop {
            if let Some(r) = result.take() {
                return r;
            }
            self.filled.wait(&mut result);
        }
    }
}

/// Joins a finished (or finishing) runtime thread. Its result is already in its slot: the thread body catches
/// the closure's panic and stores the outcome itself, so the OS-level result carries nothing (a panic in a
/// thread-local destructor after that is not reported).
fn reap(handle: thread::JoinHandle<()>) {
    let _ = handle.join();
}

/// The calling thread's view of itself (the rseq area idea): its core and, while it holds a guard, its CID.
///
/// Read from thread-local cells that the runtime and guards keep up to date, so [`current`] makes no syscall on
/// runtime threads (elsewhere the core comes from `sched_getcpu`, which glibc reads from the kernel's rseq area).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ThreadView {
    cpu: usize,
    cid: Option<Cid>,
    pinned: bool,
}

impl ThreadView {
    /// The core: the one a runtime thread is pinned to, or where any other thread runs right now (it may move
    /// at any time).
    #[inline]
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// The CID of the innermost guard the thread holds (of any group, entered any way); `None` outside guards.
    ///
    /// Guards are normally dropped in the reverse order of entering. If the thread drops a guard while one it
    /// entered later is still live, this is `None` from then on, except for guards entered later while each is the
    /// innermost, until the thread's last guard drops. So it never shows a CID the thread no longer holds, except
    /// after a `mem::forget`: a guard passed to `mem::forget` is never dropped, so for the rest of the thread the
    /// view counts it as live: it shows the forgotten guard's CID whenever no later guard is live (also after its
    /// registration's next enter or drop gave the CID back, [`CidGuard`]), and after an
    /// out-of-order drop it stays `None` outside later guards.
    #[inline]
    pub fn cid(&self) -> Option<Cid> {
        self.cid
    }

    /// Whether the thread is a runtime thread, pinned to [`ThreadView::cpu`] for its whole life.
    #[inline]
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }
}

/// The calling thread's [`ThreadView`]: its core and, while it holds a guard, its CID.
///
/// Every thread has a view: a runtime thread's is read from thread-local cells alone (`is_pinned() == true`);
/// any other thread's core comes from `sched_getcpu` (`is_pinned() == false`), and its CID from the same cells,
/// which every guard updates on enter and drop, however it was entered. `None` only when the core cannot be
/// known: not a runtime thread, and `sched_getcpu` fails.
///
/// ```
/// let view = mmcid::current().expect("Linux has sched_getcpu");
/// assert!(!view.is_pinned());
/// assert_eq!(view.cid(), None);
/// let group = mmcid::Group::new();
/// let guard = group.enter();
/// assert_eq!(mmcid::current().unwrap().cid(), Some(guard.cid()));
/// drop(guard);
/// assert_eq!(mmcid::current().unwrap().cid(), None);
/// ```
pub fn current() -> Option<ThreadView> {
    let cid = view::cid().map(Cid::from_raw);
    match view::cpu() {
        Some(cpu) => Some(ThreadView { cpu, cid, pinned: true }),
        None => sys::try_current_cpu().ok().map(|cpu| ThreadView { cpu, cid, pinned: false }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_rejects_a_cpu_the_os_refuses() {
        let cpu = 1000; // below cpu_set_t's 1024 bits, far beyond this machine's CPUs: EINVAL
        match probe(&CpuSet::raw([cpu])) {
            Err(Error::PinFailed { cpu: c, reason }) => {
                assert_eq!(c, cpu);
                assert!(reason.contains("sched_setaffinity"), "{reason}");
            }
            other => panic!("expected PinFailed, got {other:?}"),
        }
        assert!(matches!(pin_and_verify(5000), Err(Error::PinFailed { cpu: 5000, .. })));
    }

    #[test]
    fn a_pin_failure_at_spawn_reaches_join_and_skips_the_closure() {
        let group = Group::new();
        // Bypass validation: a runtime whose only core the OS refuses, as if it went offline after build.
        let rt = Runtime::unchecked(CpuSet::raw([1000]), 1, group.clone(), None);
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let h = rt.spawn(move |_| flag.store(true, std::sync::atomic::Ordering::SeqCst));
        assert_eq!(h.cpu(), 1000);
        let payload = h.join().unwrap_err();
        assert!(matches!(payload.downcast_ref::<Error>(), Some(Error::PinFailed { cpu: 1000, .. })));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(rt.live_threads(), 0);
        assert_eq!(group.users(), 0);
        assert_eq!(group.stats().cids_in_use, 0);

        // The scoped path reports the same way.
        let payload = rt.scope(|s| s.spawn(|_| ()).join()).unwrap_err();
        assert!(matches!(payload.downcast_ref::<Error>(), Some(Error::PinFailed { cpu: 1000, .. })));
        assert_eq!(rt.live_threads(), 0);
    }

    #[test]
    fn placement_is_least_loaded_then_round_robin() {
        let shared =
            Shared { state: Mutex::new(State { live: vec![0; 3], cursor: 0, next: 0, threads: BTreeMap::new() }) };
        let order: Vec<usize> = (0..6).map(|_| shared.place(None).0).collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
        shared.state.lock().live[1] -= 1; // a thread on position 1 exits
        assert_eq!(shared.place(None).0, 1); // the least-loaded position wins over the cursor
        assert_eq!(shared.place(None).0, 2); // then round-robin resumes after it
        assert_eq!(shared.place(Some(0)), (0, 8)); // explicit placement; indices keep counting
    }
}
