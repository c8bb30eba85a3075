//! Loom models of mmcid live in `tests/`; this crate only exists so they build in isolation (docs/loom.md).
//!
//! Under `--cfg loom` it also holds the harness every model shares: `model` (bounded exploration with the
//! environment in charge), `Cids` (the independent exclusivity / hand-over checker) and `quiescent` /
//! `all_free` (the accounting checks at the end of each model), bundled as `finish`.

// The models need both the `loom` feature and `--cfg loom`: with the feature alone they would build as empty
// binaries and pass without checking anything.
#[cfg(all(feature = "loom", not(loom)))]
compile_error!("the loom models also need RUSTFLAGS=\"--cfg loom\": run them with `bash scripts/loom.sh`");

#[cfg(loom)]
pub use harness::*;

#[cfg(loom)]
mod harness {
    use mmcid::{CidKind, Group, Mode, Registration};
    use std::mem::ManuallyDrop;
    use std::ops::{Deref, DerefMut};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::time::Instant;

    /// A registration that is leaked instead of dropped while its thread unwinds.
    ///
    /// Dropping a registration takes the group's lifecycle lock. When a mutant panics while that (loom) lock is
    /// held, the lock is poisoned and loom's `Mutex::lock` unwraps the poison, so a registration dropped during
    /// the unwind would panic in a destructor during cleanup and abort the whole test binary.
    /// Models therefore hold their registrations in `Reg`; normal drops are unchanged.
    pub struct Reg(ManuallyDrop<Registration>);

    impl Reg {
        /// Registers with `group`, declaring core `cpu` (models never ask the OS).
        pub fn new(group: &Group, cpu: usize) -> Reg {
            let mut r = group.register();
            r.set_cpu(Some(cpu)).unwrap();
            Reg(ManuallyDrop::new(r))
        }
    }

    impl Deref for Reg {
        type Target = Registration;
        fn deref(&self) -> &Registration {
            &self.0
        }
    }

    impl DerefMut for Reg {
        fn deref_mut(&mut self) -> &mut Registration {
            &mut self.0
        }
    }

    impl Drop for Reg {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                // SAFETY: dropped exactly once, here; `self.0` is never used again.
                unsafe { ManuallyDrop::drop(&mut self.0) }
            }
        }
    }

    /// Default preemption bound when `LOOM_MAX_PREEMPTIONS` is unset (docs/loom.md, "How to run").
    pub const DEFAULT_PREEMPTIONS: usize = 2;

    /// Runs `f` under loom. `LOOM_MAX_PREEMPTIONS` (and every other `LOOM_*` variable) stays in charge; only an
    /// unset bound defaults to [`DEFAULT_PREEMPTIONS`]. Prints the iterations and the time on stderr (shown with
    /// `--nocapture`), also when the model fails, so docs/loom.md can quote how fast a mutant is rejected.
    pub fn model<F>(name: &'static str, f: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        model_at_least(name, 0, f)
    }

    /// [`model`] with a preemption bound of at least `bound`, for the mutant twins whose failing execution needs
    /// more preemptions than CI's default bound allows (docs/loom.md: 6a's `NoAdoptRecheck`, 11f's `NoDeferRetry`).
    pub fn model_at_least<F>(name: &'static str, bound: usize, f: F)
    where
        F: Fn() + Sync + Send + 'static,
    {
        let mut b = loom::model::Builder::new();
        let env = b.preemption_bound.unwrap_or(DEFAULT_PREEMPTIONS);
        b.preemption_bound = Some(env.max(bound));
        if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
            b.max_branches = 10_000;
        }
        let report = Report {
            name,
            bound: b.preemption_bound,
            iterations: std::sync::Arc::new(AtomicUsize::new(0)),
            start: Instant::now(),
        };
        let iterations = report.iterations.clone();
        b.check(move || {
            iterations.fetch_add(1, Relaxed);
            f()
        });
        drop(report);
    }

    struct Report {
        name: &'static str,
        bound: Option<usize>,
        iterations: std::sync::Arc<AtomicUsize>,
        start: Instant,
    }

    impl Drop for Report {
        fn drop(&mut self) {
            let verdict = if std::thread::panicking() { "FAILED (as a mutant must)" } else { "passed" };
            eprintln!(
                "loom model {}: {} after {} iterations in {:.2?} (preemption bound {:?})",
                self.name,
                verdict,
                self.iterations.load(Relaxed),
                self.start.elapsed(),
                self.bound
            );
        }
    }

    /// One cell of per-CID data, checked by loom: every access goes through `with_mut`, so two holders of a CID
    /// whose guards are not ordered by happens-before make loom panic with "Causality violation".
    struct Cell(loom::cell::UnsafeCell<usize>);

    // SAFETY: deliberately shared without synchronisation of its own: the library's hand-over (I8) is what must
    // order the accesses, and loom checks that it does (a racy access is a reported causality violation, never
    // undefined behaviour, because loom's cell records every access instead of performing it unsynchronised).
    unsafe impl Sync for Cell {}

    /// The independent checker of each model: per-CID data written inside every guard (a `PerCid` in miniature).
    ///
    /// * Exclusivity (I1) and hand-over visibility (I8) in one check: each guard increments its CID's loom
    ///   `UnsafeCell`; loom reports any two increments of one cell that are not ordered by happens-before, i.e.
    ///   any two holders of a CID that are not separated by a release → acquire hand-over. This is stronger than
    ///   a temporal "owned twice" counter and adds no interleavings (cell accesses are not scheduling points).
    ///   A std-atomic occupancy counter would be vacuous under loom: loom switches threads only at loom
    ///   operations, and a guard holder performs none between its increment and its decrement (docs/loom.md).
    /// * Range (I2, hard bound): every CID is below `users + cores` (the number of cells).
    /// * No lost update: at the end the cells sum to the number of guards.
    pub struct Cids {
        cells: std::sync::Arc<[Cell]>,
        guards: std::sync::Arc<AtomicUsize>,
    }

    impl Clone for Cids {
        fn clone(&self) -> Self {
            Cids { cells: self.cells.clone(), guards: self.guards.clone() }
        }
    }

    impl Cids {
        /// Cells for CIDs `0..bound`; `bound` is the hard range bound `users + cores` of the model.
        pub fn new(bound: usize) -> Cids {
            Cids {
                cells: (0..bound).map(|_| Cell(loom::cell::UnsafeCell::new(0))).collect(),
                guards: std::sync::Arc::new(AtomicUsize::new(0)),
            }
        }

        /// Enters `reg`, touches the CID's data inside the guard, leaves. Returns the CID and where it came from.
        pub fn visit(&self, reg: &mut Registration) -> (usize, CidKind) {
            let guard = reg.enter();
            let cid = guard.cid().get();
            let kind = guard.kind();
            self.touch(cid);
            drop(guard);
            (cid, kind)
        }

        /// The body of a guard holding `cid`: read-modify-write of the CID's data.
        pub fn touch(&self, cid: usize) {
            assert!(
                cid < self.cells.len(),
                "CID {cid} beyond the hard bound users + cores = {} (I2)",
                self.cells.len()
            );
            // SAFETY: loom's cell checks this access against every other access to the same cell.
            self.cells[cid].0.with_mut(|p| unsafe { *p += 1 });
            self.guards.fetch_add(1, Relaxed);
        }

        /// At the end of the model (all threads joined): no increment was lost.
        pub fn check_total(&self) {
            // SAFETY: every thread that touched a cell has been joined (happens-before this read).
            let sum: usize = self.cells.iter().map(|c| c.0.with(|p| unsafe { *p })).sum();
            assert_eq!(sum, self.guards.load(Relaxed), "per-CID data lost an update");
        }
    }

    /// Accounting at quiescence (no guard alive, no lifecycle operation running), `regs` = every live
    /// registration of `group`: nothing owned twice, every owned CID marked, bitmap population = owners (I5), and
    /// owners of the right kind for the mode (registrations in per-task mode, cores in per-CPU mode).
    pub fn quiescent(group: &Group, regs: &[&Reg]) {
        let audit = group.audit();
        assert!(audit.duplicates.is_empty(), "CID owned twice at quiescence (I1): {audit:?}");
        assert!(audit.unmarked.is_empty(), "owned CID not marked in the bitmap: {audit:?}");
        assert_eq!(audit.bits, audit.owners, "bitmap population != owners (leak, I5): {audit:?}");
        let task_owned = regs.iter().filter(|r| r.cid().is_some()).count();
        match group.mode() {
            Mode::PerCpu => {
                assert_eq!(task_owned, 0, "a registration owns a CID in per-CPU mode (leak, I5): {audit:?}")
            }
            Mode::PerTask => {
                assert_eq!(audit.owners, task_owned, "a core owns a CID in per-task mode (leak, I5): {audit:?}")
            }
            m => panic!("switch left unfinished at quiescence: {m:?}"),
        }
    }

    /// After the last registration is gone: every CID is free (I5).
    pub fn all_free(group: &Group) {
        let audit = group.audit();
        assert_eq!((audit.bits, audit.owners), (0, 0), "CIDs left after the last registration (I5): {audit:?}");
        assert_eq!(group.users(), 0);
        assert_eq!(group.mode(), Mode::PerTask, "the group must return to per-task mode at zero users");
    }

    /// T1's part in `borrower_vs_sweep`: a plain visit (enter, touch, exit).
    pub fn visit(cids: &Cids, reg: &mut Reg) {
        cids.visit(reg);
    }

    /// Models 4a, 11a and 11e (run inside `model`): in a group over four virtual cores of which two are allowed,
    /// T1 uses core 0's CID through `t1` (a visit borrows it: its slot is BUSY and its registration word is UNSET,
    /// the kernel's "running task with an UNSET CID") while the main thread drops the second-to-last
    /// registration, which switches the group back to per-task mode and sweeps the core slots. The main thread
    /// then registers again (the new registration takes the lowest free CID at birth) and enters with it.
    pub fn borrower_vs_sweep(group: Group, t1: fn(&Cids, &mut Reg)) {
        borrower_vs_sweep_and(group, t1, None);
    }

    /// `borrower_vs_sweep` with a third thread running `also` on the group meanwhile (joined before the final
    /// checks).
    pub fn borrower_vs_sweep_and(group: Group, t1: fn(&Cids, &mut Reg), also: Option<fn(&Group)>) {
        borrower_vs_sweep_ending(group, t1, also, finish);
    }

    /// `borrower_vs_sweep_and` with its own end checks (`finish` or `finish_degraded`).
    pub fn borrower_vs_sweep_ending(
        group: Group,
        t1: fn(&Cids, &mut Reg),
        also: Option<fn(&Group)>,
        end: fn(&Group, &Cids, Vec<Reg>),
    ) {
        let also = also.map(|f| {
            let group = group.clone();
            loom::thread::spawn(move || f(&group))
        });
        let cids = Cids::new(3 + 4);
        let mut r1 = Reg::new(&group, 0);
        let r2 = Reg::new(&group, 0);
        let r3 = Reg::new(&group, 0); // users 3 > max_cids 2: per-CPU
        assert_eq!(group.mode(), Mode::PerCpu);
        assert_eq!(cids.visit(&mut r1).1, CidKind::Core(0)); // core 0 now owns a CID, idle
        drop(r3); // users 2: still per-CPU (2 is not < thrs 2)
        assert_eq!(group.mode(), Mode::PerCpu);
        assert_eq!(r1.cid(), None);

        let t1 = {
            let cids = cids.clone();
            loom::thread::spawn(move || {
                t1(&cids, &mut r1);
                r1
            })
        };

        drop(r2); // users 1 < thrs 2: CPU → task switch, sweep of the core slots
        let mut r4 = Reg::new(&group, 0);
        cids.visit(&mut r4);

        let r1 = t1.join().unwrap();
        if let Some(t) = also {
            t.join().unwrap();
        }
        assert_eq!(group.mode(), Mode::PerTask);
        end(&group, &cids, vec![r1, r4]);
    }

    /// The end of a model whose group's membarrier failed (model 13, design.md §12): no lost update, and at
    /// quiescence nothing owned twice and every set bit owned, but owners need not match the mode (a failed switch
    /// leaves registrations or cores their CIDs); then drop them all and check every CID is free.
    pub fn finish_degraded(group: &Group, cids: &Cids, regs: Vec<Reg>) {
        cids.check_total();
        let audit = group.audit();
        assert!(audit.is_consistent(), "inconsistent at quiescence (I1, I5): {audit:?}");
        assert!(matches!(group.mode(), Mode::PerTask | Mode::PerCpu), "switch left unfinished: {audit:?}");
        drop(regs);
        all_free(group);
    }

    /// The end of every model: no lost update (`cids`), accounting at quiescence with `regs` the group's every
    /// live registration, then drop them all and check every CID is free.
    pub fn finish(group: &Group, cids: &Cids, regs: Vec<Reg>) {
        cids.check_total();
        quiescent(group, &regs.iter().collect::<Vec<_>>());
        drop(regs);
        all_free(group);
    }
}
