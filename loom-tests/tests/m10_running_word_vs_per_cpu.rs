//! Model 10: an enter whose E1 the task → CPU walk sees, and whose E3 reads the completed per-CPU mode
//! (design.md §4.1; I5). Found by review after every enter began to set `running` first.
//!
//! Two cores. T1 enters and leaves once with r1 (core 0, per-task CID 0). The main thread registers r3 on core 0:
//! users 3 > max_cids 2, so a task → CPU switch runs, and its walk skips r1's word whenever it sees r1 running.
//! If T1's E3 then reads the final `PerCpu` and borrows core 0's idle CID on the per-CPU fast path, r1's word
//! must not stay owned: only the slow path gives a word up, so the fast path is taken only when the word is UNSET.
//! Otherwise r1 keeps a task CID in per-CPU mode and, at quiescence, the bits in use exceed the owners (I5).
#![cfg(loom)]

use loom::thread;
use mmcid::{Group, Mutant};
use mmcid_loom_tests::{finish, model, Cids, Reg};

fn scenario(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = Group::builder().virtual_cpus(2).mutant(mutant).build().unwrap();
        let cids = Cids::new(3 + 2);
        let mut r1 = Reg::new(&group, 0);
        let r2 = Reg::new(&group, 1);
        let t1 = {
            let cids = cids.clone();
            thread::spawn(move || {
                cids.visit(&mut r1);
                r1
            })
        };
        let mut r3 = Reg::new(&group, 0); // users 3 > max_cids 2: task → CPU switch
        cids.visit(&mut r3); // core 0 gets a CID, idle after the visit
        let r1 = t1.join().unwrap();
        finish(&group, &cids, vec![r1, r2, r3]);
    });
}

#[test]
fn running_word_vs_per_cpu() {
    scenario("running_word_vs_per_cpu", Mutant::None);
}

/// The per-CPU fast path ignores the registration's word: a word the walk skipped stays owned in per-CPU mode.
#[test]
#[should_panic(expected = "owns a CID in per-CPU mode")]
fn running_word_vs_per_cpu_mutant_keeps_word() {
    scenario("running_word_vs_per_cpu_mutant_keeps_word", Mutant::CpuPathKeepsWord);
}
