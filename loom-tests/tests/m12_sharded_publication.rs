//! Model 12: publication of sharded data (`PerCid`, design.md §9; the orderings are in `src/percid.rs`). A
//! guard's own shard needs no ordering of its own (I8 hands it over with the CID); what needs one is a reader
//! that is not in the CID's hand-over chain, `ShardedCounter::sum` while another thread installs a shard (12a),
//! and two first uses of one segment racing to install it (12b). The shards are loom atomics, so a load of one
//! whose creation does not happen-before the load is a reported causality violation.
#![cfg(loom)]

use loom::thread;
use mmcid::{Group, Mutant, ShardedCounter};
use mmcid_loom_tests::{model, Reg};

/// Two virtual cores, per-task mode: each registration owns its CID from birth (0 and 1, same segment).
fn group(mutant: Mutant) -> Group {
    Group::builder().virtual_cpus(2).mutant(mutant).build().unwrap()
}

/// 12a: CID 0's shard (and with it segment 0 of the slots and of the visited bits) exists before T1 starts;
/// T1 then installs CID 1's shard in that segment (one slot store and one visited bit, no segment CAS) while
/// the main thread sums (a scan: visited bits, then slots) and then looks CID 1's shard up directly, as a
/// sequence adder does (the slot alone).
fn install_vs_sum(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = group(mutant);
        let counter = std::sync::Arc::new(ShardedCounter::new(&group));
        let mut r0 = Reg::new(&group, 0);
        let mut r1 = Reg::new(&group, 1);
        counter.add_with(&r0.enter(), 1);

        let t1 = {
            let counter = counter.clone();
            thread::spawn(move || {
                counter.add_with(&r1.enter(), 1);
                r1
            })
        };
        let seen = counter.sum();
        assert!((1..=2).contains(&seen), "sum {seen} outside what the adds allow");
        let one = counter.loom_installed(1); // as a sequence adder looks CID 1's shard up
        assert!(matches!(one, None | Some(0) | Some(1)), "{one:?}");

        let r1 = t1.join().unwrap();
        assert_eq!(counter.sum(), 2);
        drop((r0, r1));
    });
}

#[test]
fn shard_install_vs_sum() {
    install_vs_sum("shard_install_vs_sum", Mutant::None);
}

/// The new shard's visited bit Relaxed: the scan sees the bit before the slot (a debug assertion in the scan).
#[test]
#[should_panic(expected = "seen before its slot")]
fn shard_install_vs_sum_mutant_relaxed_visited_bit() {
    install_vs_sum("shard_install_vs_sum_mutant_relaxed_visited_bit", Mutant::RelaxedVisitedBit);
}

/// The new shard's slot store Relaxed: the direct lookup finds the pointer but not the shard's initialisation.
#[test]
#[should_panic(expected = "Causality violation")]
fn shard_install_vs_sum_mutant_relaxed_slot() {
    install_vs_sum("shard_install_vs_sum_mutant_relaxed_slot", Mutant::RelaxedShardSlot);
}

/// 12b: the first uses of CIDs 0 and 1 race: both find segment 0 missing, both build one, one CAS wins and the
/// loser must use the winner's segment, whose slots the winner created.
fn first_uses_race(name: &'static str, mutant: Mutant) {
    model(name, move || {
        let group = group(mutant);
        let counter = std::sync::Arc::new(ShardedCounter::new(&group));
        let mut r0 = Reg::new(&group, 0);
        let mut r1 = Reg::new(&group, 1);

        let t1 = {
            let counter = counter.clone();
            thread::spawn(move || {
                counter.add_with(&r1.enter(), 1);
                r1
            })
        };
        counter.add_with(&r0.enter(), 1);

        let r1 = t1.join().unwrap();
        assert_eq!((counter.sum(), counter.shards_allocated()), (2, 2));
        drop((r0, r1));
    });
}

#[test]
fn first_uses_race_the_segment_install() {
    first_uses_race("first_uses_race_the_segment_install", Mutant::None);
}

/// The segment CAS Relaxed: the loser reads the winner's slots without their creation happening before.
#[test]
#[should_panic(expected = "Causality violation")]
fn first_uses_race_the_segment_install_mutant_relaxed() {
    first_uses_race("first_uses_race_the_segment_install_mutant_relaxed", Mutant::RelaxedSegmentInstall);
}
