//! Model 14: `ShardedCounter`'s per-task update as one restartable sequence (design.md §9.3) against the switches
//! that take the registration's CID. In an rseq group in per-task mode, an add on the thread's parked registration
//! runs one sequence that compares the mode with `PER_TASK` and the registration's word with the CID it read just
//! before, then updates that CID's shard: no `running` flag and no guard, so a task → CPU walk may take the word
//! at any time. The walk's F2 (the RSEQ membarrier: under loom a fence and every core's sequence lock taken and
//! released) orders a committed sequence before the walk, aborts one in flight, and one that starts later reads the
//! new mode and fails; the word compare catches a sequence that read the word before a switch took it and runs
//! after a second switch brought the mode back to per-task.
//!
//! Four virtual cores of which two are allowed: max_cids = 2, so the third registration switches to per-CPU mode
//! and dropping back to one user switches back (thrs 2). T1's registration is on core 0.
#![cfg(loom)]

use loom::thread;
use mmcid::{Group, Mode, Mutant};
use mmcid_loom_tests::{finish, model, Cids, Reg};

fn group(mutant: Mutant) -> Group {
    Group::builder().virtual_cpus(4).cpus_virtual([0, 1]).restartable_sequences(true).mutant(mutant).build().unwrap()
}

/// T1 adds through the sequence (or, if it fails, through a guard) while the main thread registers a third user
/// (task → CPU: the walk takes T1's CID, which T1 does not mark as running) and enters with it (core 1 gets the
/// lowest free CID), drops two users again (CPU → task) and registers a fourth, born with the lowest free CID,
/// with which it enters too: both may get the CID T1's add used.
fn add_vs_switches(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = group(mutant);
        let cids = Cids::new(4 + 4);
        let mut r1 = Reg::new(&group, 0);
        let r2 = Reg::new(&group, 1);
        assert_eq!((group.mode(), r1.cid().map(|c| c.get())), (Mode::PerTask, Some(0)));

        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                if !r1.update_in_sequence(|cid| cids.touch(cid)) {
                    cids.visit(&mut r1);
                }
                r1
            })
        };

        let mut r3 = Reg::new(&group, 1); // users 3 > 2: task → CPU, the walk takes r1's and r2's CIDs
        cids.visit(&mut r3); // core 1 gets the lowest free CID: one T1's add may have used
        drop(r3);
        drop(r2); // users 1 < thrs 2: CPU → task
        let mut r4 = Reg::new(&group, 1); // born with the lowest free CID
        cids.visit(&mut r4);

        let r1 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r4]);
    });
}

#[test]
fn owned_sequence_vs_switches() {
    add_vs_switches("owned_sequence_vs_switches", Mutant::None);
}

/// The sequence does not check the mode: one that starts after the walk's F2 but before the walk takes the word
/// still adds, and the CID's next owner (core 1, for r3) uses it without a hand-over.
#[test]
#[should_panic(expected = "Causality violation")]
fn owned_sequence_vs_switches_mutant_ignores_mode() {
    add_vs_switches("owned_sequence_vs_switches_mutant_ignores_mode", Mutant::OwnedSequenceIgnoresMode);
}

/// The sequence does not compare the word: T1 read CID 0 in its word, the walk took it, the mode came back to
/// per-task and r4 was born with CID 0; T1's sequence then adds to r4's CID.
#[test]
#[should_panic(expected = "Causality violation")]
fn owned_sequence_vs_switches_mutant_ignores_word() {
    add_vs_switches("owned_sequence_vs_switches_mutant_ignores_word", Mutant::OwnedSequenceIgnoresWord);
}
