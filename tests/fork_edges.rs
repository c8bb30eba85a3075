//! `fork` at the edges of a process's life (design.md §12.2, "Process-wide state the fork handlers meet"): a fork
//! from a thread-local destructor, a fork while the thread-local layer makes its thread-exit key, and a fork while
//! the process's first group build installs the fork handlers. Each scenario needs a process of its own (the
//! process-wide state it races is made once per process), so each test runs this test binary again for itself
//! alone, with `MMCID_FORK_SCENARIO` naming it, and waits for that process with a time limit; the scenario waits
//! for the children it forks with a time limit too, so a hang fails the test instead of stalling the harness.
//!
//! The windows are a system call wide, so two C library functions are interposed here, in this test binary only:
//! `pthread_key_create` and `pthread_atfork` are defined below, forward to the C library's, and when a scenario
//! arms them, sleep first (or after) in the calling thread, so that the fork lands in the window every time.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

mod common;

use common::{in_child, Child};
use mmcid::Group;
use std::cell::{Cell, RefCell};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering::SeqCst};
use std::thread;
use std::time::{Duration, Instant};

/// The environment variable that names the scenario a re-run of this binary runs.
const SCENARIO: &str = "MMCID_FORK_SCENARIO";

/// How long the scenario's process, and each child it forks, may take.
const LIMIT: Duration = Duration::from_secs(20);
const CHILD_LIMIT: Duration = Duration::from_secs(5);

/// How long an armed interposed call sleeps: far longer than the fork that races it needs to start.
const SLOW: Duration = Duration::from_millis(300);

/// Runs `scenario` in a process of its own: in the re-run of this binary that `SCENARIO` names `name`, runs it
/// (a panic fails that process); otherwise starts that re-run and asserts that it succeeded within `LIMIT`.
fn in_own_process(name: &str, scenario: fn()) {
    if std::env::var(SCENARIO).as_deref() == Ok(name) {
        return scenario();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(SCENARIO, name)
        .spawn()
        .expect("re-run this test binary");
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}: the scenario's process hung (killed after {LIMIT:?})");
        }
        thread::sleep(Duration::from_millis(5));
    };
    assert!(status.success(), "{name}: the scenario's process failed: {status}");
}

/// What a child checks: the group's lifecycle operations, enters through both layers, and a fork of its own
/// (whose prepare handler waits for every group's locks) all finish.
fn group_works(g: &Group) -> i32 {
    let mut r = g.register();
    drop(r.enter());
    {
        let _outer = g.enter();
        let _nested = g.enter();
    }
    let _ = g.stats();
    drop(r);
    match in_child(CHILD_LIMIT, || 0) {
        Child::Exited(0) => 0,
        _ => 3,
    }
}

// ---- The interposed C library functions -------------------------------------------------------------------------

/// Armed interposers: 0 not armed; `BEFORE`: sleep, then forward; `AFTER`: forward, then sleep.
const BEFORE: u8 = 1;
const AFTER: u8 = 2;
static KEY_CREATE_ARMED: AtomicU8 = AtomicU8::new(0);
static ATFORK_ARMED: AtomicU8 = AtomicU8::new(0);
/// Set by an armed call when it starts sleeping: the moment to fork.
static IN_WINDOW: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Only calls from a thread that set this are slowed (the standard library makes keys of its own).
    static SLOW_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Sleeps if `armed` was armed for this thread (once: the arm is consumed).
fn slow_if(armed: &AtomicU8, when: u8) {
    if SLOW_HERE.with(Cell::get) && armed.load(SeqCst) == when && armed.swap(0, SeqCst) == when {
        IN_WINDOW.store(true, SeqCst);
        thread::sleep(SLOW);
    }
}

/// Interposes the C library's `pthread_key_create` (the thread-local layer's thread-exit key) in this binary.
///
/// # Safety
///
/// As `pthread_key_create`.
#[no_mangle]
pub unsafe extern "C" fn pthread_key_create(
    key: *mut libc::pthread_key_t,
    dtor: Option<unsafe extern "C" fn(*mut libc::c_void)>,
) -> libc::c_int {
    type Real =
        unsafe extern "C" fn(*mut libc::pthread_key_t, Option<unsafe extern "C" fn(*mut libc::c_void)>) -> libc::c_int;
    slow_if(&KEY_CREATE_ARMED, BEFORE);
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; the symbol found is the C library's
    // `pthread_key_create`, whose type is `Real`.
    let rc = unsafe {
        let real = libc::dlsym(libc::RTLD_NEXT, c"pthread_key_create".as_ptr());
        assert!(!real.is_null(), "no pthread_key_create after this binary's");
        std::mem::transmute::<*mut libc::c_void, Real>(real)(key, dtor)
    };
    slow_if(&KEY_CREATE_ARMED, AFTER);
    rc
}

extern "C" {
    /// glibc's registration behind `pthread_atfork` (which glibc links statically into each binary).
    fn __register_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
        dso: *mut libc::c_void,
    ) -> libc::c_int;
}

/// Interposes `pthread_atfork` (the fork handlers' installation) in this binary.
///
/// # Safety
///
/// As `pthread_atfork`.
#[no_mangle]
pub unsafe extern "C" fn pthread_atfork(
    prepare: Option<unsafe extern "C" fn()>,
    parent: Option<unsafe extern "C" fn()>,
    child: Option<unsafe extern "C" fn()>,
) -> libc::c_int {
    slow_if(&ATFORK_ARMED, BEFORE);
    // SAFETY: the handlers are valid for the process's life (the caller's contract); no DSO handle: they are never
    // unregistered.
    let rc = unsafe { __register_atfork(prepare, parent, child, std::ptr::null_mut()) };
    slow_if(&ATFORK_ARMED, AFTER);
    rc
}

// ---- 1. A fork from a thread-local destructor ---------------------------------------------------------------------

/// What the fork from the thread-local destructor saw: its child's end, as `Child` coded by `code`.
static DESTRUCTOR_CHILD: AtomicI32 = AtomicI32::new(-1);

/// A thread-local whose destructor forks; the child checks that the groups work (a fork of its own included).
struct ForkAtExit(Group);

impl Drop for ForkAtExit {
    fn drop(&mut self) {
        let g = self.0.clone();
        let code = match in_child(CHILD_LIMIT, move || group_works(&g)) {
            Child::Exited(code) => code,
            Child::Signalled(_) => 1000,
            Child::Hung => 2000,
        };
        DESTRUCTOR_CHILD.store(code, SeqCst);
    }
}

thread_local! {
    static FORK_AT_EXIT: RefCell<Option<ForkAtExit>> = const { RefCell::new(None) };
}

fn fork_from_a_destructor() {
    let g = Group::builder().virtual_cpus(2).build().unwrap();
    let _idle = g.register();
    let g2 = g.clone();
    thread::spawn(move || {
        // Made first, so destroyed last (the standard library runs thread-local destructors last-made first):
        // by then every other thread-local of this thread, the fork handlers' included, is gone.
        FORK_AT_EXIT.with(|f| *f.borrow_mut() = Some(ForkAtExit(g2.clone())));
        // A fork from this thread while its thread-locals are alive: any thread-local state the handlers keep is
        // made now, after `FORK_AT_EXIT`, and so destroyed before its destructor forks.
        assert_eq!(in_child(CHILD_LIMIT, || 0), Child::Exited(0));
        let mut r = g2.register();
        drop(r.enter());
    })
    .join()
    .unwrap();
    assert_eq!(DESTRUCTOR_CHILD.load(SeqCst), 0, "the child of the destructor's fork (2000: hung)");
    // In the parent: every lock the destructor's fork took is free again.
    assert_eq!(group_works(&g), 0);
}

/// A fork from a thread-local destructor (where the thread's other thread-locals are gone) releases every lock its
/// prepare handler took, in the parent and in the child: later forks, registrations and enters do not wait.
#[test]
fn a_fork_from_a_thread_local_destructor_releases_every_lock() {
    in_own_process("a_fork_from_a_thread_local_destructor_releases_every_lock", fork_from_a_destructor);
}

// ---- 2. A fork while the thread-local layer makes its thread-exit key ---------------------------------------------

fn fork_during_first_lend(when: u8) {
    let g = Group::builder().virtual_cpus(2).build().unwrap();
    let g2 = g.clone();
    KEY_CREATE_ARMED.store(when, SeqCst);
    let lender = thread::spawn(move || {
        SLOW_HERE.with(|s| s.set(true));
        // A nested enter: the outer guard's registration is lent, the first lend of the process makes the key.
        let _outer = g2.enter();
        let _nested = g2.enter();
        SLOW_HERE.with(|s| s.set(false));
    });
    while !IN_WINDOW.load(SeqCst) {
        thread::yield_now();
    }
    // The lender is inside `pthread_key_create` now (before or after the C library made the key).
    let child = in_child(CHILD_LIMIT, || {
        let _outer = g.enter();
        let _nested = g.enter(); // the child's first lend reaches the key
        group_works(&g)
    });
    lender.join().unwrap();
    assert_eq!(child, Child::Exited(0));
}

/// A fork while another thread makes the thread-local layer's thread-exit key (its first lend: a nested
/// `Group::enter`): the child's own first lend finishes. The fork lands in the key's creation every time
/// (`pthread_key_create` slowed, before the C library's call and after it).
#[test]
fn a_fork_during_the_first_lend_leaves_the_child_a_usable_key() {
    in_own_process("a_fork_during_the_first_lend_leaves_the_child_a_usable_key", || fork_during_first_lend(BEFORE));
}

#[test]
fn a_fork_just_after_the_key_is_made_leaves_the_child_a_usable_key() {
    in_own_process("a_fork_just_after_the_key_is_made_leaves_the_child_a_usable_key", || fork_during_first_lend(AFTER));
}

// ---- 3. A fork while the first group build installs the fork handlers ---------------------------------------------

fn fork_during_first_build(when: u8) {
    ATFORK_ARMED.store(when, SeqCst);
    let builder = thread::spawn(|| {
        SLOW_HERE.with(|s| s.set(true));
        let g = Group::builder().virtual_cpus(2).build().unwrap();
        SLOW_HERE.with(|s| s.set(false));
        g
    });
    while !IN_WINDOW.load(SeqCst) {
        thread::yield_now();
    }
    // The builder is inside `pthread_atfork` now: before the handlers exist, or just after.
    let child = in_child(CHILD_LIMIT, || {
        let g = Group::builder().virtual_cpus(2).build().unwrap();
        group_works(&g)
    });
    let g = builder.join().unwrap();
    assert_eq!(child, Child::Exited(0));
    assert_eq!(group_works(&g), 0, "the parent's group and forks after the installation");
}

/// A fork while the process's first group build installs the fork handlers: the child builds groups, and forks
/// with its handlers installed (they were not when the parent forked).
#[test]
fn a_fork_before_the_handlers_are_installed_leaves_the_child_able_to_build() {
    in_own_process("a_fork_before_the_handlers_are_installed_leaves_the_child_able_to_build", || {
        fork_during_first_build(BEFORE)
    });
}

/// The same, the fork landing after the C library registered the handlers but before the build saw that done.
#[test]
fn a_fork_just_after_the_handlers_are_installed_leaves_the_child_able_to_build() {
    in_own_process("a_fork_just_after_the_handlers_are_installed_leaves_the_child_able_to_build", || {
        fork_during_first_build(AFTER)
    });
}
