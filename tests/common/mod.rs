//! Independent checkers shared by the integration tests.
#![allow(dead_code)]

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// How long a deadlock detector waits: `secs` seconds, times the whole number in the environment variable
/// `MMCID_TEST_TIME_SCALE` (default 1) on a machine far slower than real hardware (`scripts/vm-test.sh` sets it
/// in its emulated guests, where 64 vCPUs share 2 host cores).
pub fn patience(secs: u64) -> std::time::Duration {
    let scale = std::env::var("MMCID_TEST_TIME_SCALE").ok().and_then(|s| s.parse::<u64>().ok()).filter(|&s| s >= 1);
    std::time::Duration::from_secs(secs.saturating_mul(scale.unwrap_or(1)))
}

/// Operations for each of `threads` threads of a test written for `n` per thread on 2 CPUs with 4 threads per
/// CPU (8 threads): the same total, so that the test costs about the same CPU time on any machine (a 64-CPU
/// guest under emulation included), but at least `n / 32` each.
pub fn per_thread(n: u64, threads: usize) -> u64 {
    (n * 8 / threads.max(1) as u64).max(n / 32).max(1)
}

/// A per-CID occupancy counter that must never exceed 1 (I1), independent of the library.
pub struct Occupancy {
    slots: Vec<AtomicUsize>,
    pub max_seen: AtomicUsize,
}

impl Occupancy {
    pub fn new(n: usize) -> Occupancy {
        Occupancy { slots: (0..n).map(|_| AtomicUsize::new(0)).collect(), max_seen: AtomicUsize::new(0) }
    }

    pub fn enter(&self, cid: usize) {
        assert!(cid < self.slots.len(), "CID {cid} beyond the checker's range");
        let before = self.slots[cid].fetch_add(1, SeqCst);
        assert_eq!(before, 0, "I1 violated: CID {cid} held by two live guards");
        self.max_seen.fetch_max(cid, SeqCst);
    }

    pub fn exit(&self, cid: usize) {
        let before = self.slots[cid].fetch_sub(1, SeqCst);
        assert_eq!(before, 1, "CID {cid} left twice");
    }

    pub fn held(&self) -> usize {
        self.slots.iter().map(|s| s.load(SeqCst)).sum()
    }
}

/// Plain (non-atomic) per-CID payload: a holder increments its CID's cell with a plain read and write. If two
/// holders overlapped (I1) or a holder missed its predecessor's write (I8), increments get lost and the final sum
/// falls short of the number of guards. (On x86, TSO hides a missing Release/Acquire from this check, so there it
/// catches overlaps, I1; I8's orderings are checked by the loom models.)
pub struct Payload {
    cells: Vec<UnsafeCell<u64>>,
}

// SAFETY: cells are only touched by the holder of the CID's guard; that exclusivity is exactly what the tests check
// (the occupancy checker panics before a second holder could touch a cell concurrently).
unsafe impl Sync for Payload {}

impl Payload {
    pub fn new(n: usize) -> Payload {
        Payload { cells: (0..n).map(|_| UnsafeCell::new(0)).collect() }
    }

    /// Must be called only while holding a guard with this CID (and after `Occupancy::enter` succeeded). Every
    /// 16th bump of a thread yields between its read and its write, which gives an overlapping holder its
    /// chance to run in between; yielding on every bump made the busiest test 100 times slower on a loaded
    /// machine (a test audit measured 25 s and more with both cores taken).
    pub fn bump(&self, cid: usize) {
        thread_local! {
            static BUMPS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        let yield_now = BUMPS.with(|b| {
            b.set(b.get().wrapping_add(1));
            b.get() % 16 == 0
        });
        // SAFETY: the caller holds the CID exclusively (checked by Occupancy); the library orders hand-over (I8).
        unsafe {
            let p = self.cells[cid].get();
            let v = std::ptr::read_volatile(p);
            if yield_now {
                std::thread::yield_now();
            }
            std::ptr::write_volatile(p, v + 1);
        }
    }

    pub fn sum(&self) -> u64 {
        // SAFETY: called after all threads joined.
        self.cells.iter().map(|c| unsafe { *c.get() }).sum()
    }
}

/// Sets its flag when dropped, however the scope ends: a thread that loops until the flag is set stops even when
/// an assertion elsewhere fails, so the test fails instead of hanging.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

/// A reusable barrier for `parties` threads whose `wait` panics after 30 s (`patience`) instead of hanging the
/// test run when a party is gone (e.g. it failed an assertion).
pub struct Gate {
    parties: usize,
    state: std::sync::Mutex<(usize, u64)>,
    cv: std::sync::Condvar,
}

impl Gate {
    pub fn new(parties: usize) -> Gate {
        Gate { parties, state: std::sync::Mutex::new((0, 0)), cv: std::sync::Condvar::new() }
    }

    pub fn wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = s.1;
        s.0 += 1;
        if s.0 == self.parties {
            *s = (0, generation + 1);
            self.cv.notify_all();
            return;
        }
        let deadline = std::time::Instant::now() + patience(30);
        while s.1 == generation {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "a party of the gate never came (generation {generation})");
            s = self.cv.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// How a child ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Child {
    /// `_exit(code)`; 0 is success, 101 a panic.
    Exited(i32),
    /// Killed by this signal (6: `abort`).
    Signalled(i32),
    /// Still running after the limit, then killed.
    Hung,
}

/// Forks; the child runs `child` and `_exit`s with its result (101 if it panicked); the parent waits up to `limit`.
pub fn in_child(limit: std::time::Duration, child: impl FnOnce() -> i32) -> Child {
    // SAFETY: fork has no preconditions; the child runs `child` and then `_exit`s, never returning into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: _exit has no preconditions; it skips the parent's atexit handlers and buffered output.
        unsafe { libc::_exit(code) }
    }
    let deadline = std::time::Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(rc >= 0, "waitpid failed: {}", std::io::Error::last_os_error());
        if rc == pid {
            return if libc::WIFEXITED(status) {
                Child::Exited(libc::WEXITSTATUS(status))
            } else {
                Child::Signalled(libc::WTERMSIG(status))
            };
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: kill and a blocking waitpid on our own unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Child::Hung;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
