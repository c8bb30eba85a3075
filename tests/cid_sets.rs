//! CID sets (design.md §2.6) and the occupancy switch (§3.1), deterministically on one thread with virtual cores:
//! which CID each enter gets, what stays parked on a core, and when the group gives per-CPU ownership up.

use mmcid::{CidKind, Group, Mode, Registration};

/// `cores` virtual cores owning up to `k` CIDs each.
fn group(cores: usize, k: usize) -> Group {
    Group::builder().virtual_cpus(cores).cids_per_core(k).build().unwrap()
}

/// `n` registrations declared on core `cpu`.
fn regs_on(group: &Group, n: usize, cpu: usize) -> Vec<Registration> {
    (0..n)
        .map(|_| {
            let mut r = group.register();
            r.set_cpu(Some(cpu)).unwrap();
            r
        })
        .collect()
}

fn assert_consistent(group: &Group) {
    let audit = group.audit();
    assert!(audit.is_consistent(), "I5: {audit:?}");
}

/// While a core's first CID is held, the next guards on that core borrow its extra CIDs (distinct, kind `Core`,
/// no temporary) up to `k`, then take temporaries; a released extra CID stays parked on the core and the next
/// guard there borrows it again without a new bit.
#[test]
fn extra_cids_serve_the_guards_of_a_busy_core() {
    let g = group(1, 4);
    // 12 users on 1 core: per-CPU mode, and the occupancy switch needs 6 holders (more than this test holds).
    let mut regs = regs_on(&g, 12, 0);
    assert_eq!(g.mode(), Mode::PerCpu);
    let mut it = regs.iter_mut();
    let guards: Vec<_> = (0..5).map(|_| it.next().unwrap().enter()).collect();
    let kinds: Vec<_> = guards.iter().map(|x| x.kind()).collect();
    assert_eq!(kinds, [CidKind::Core(0), CidKind::Core(0), CidKind::Core(0), CidKind::Core(0), CidKind::Temporary]);
    let mut cids: Vec<_> = guards.iter().map(|x| x.cid().get()).collect();
    cids.sort_unstable();
    cids.dedup();
    assert_eq!(cids.len(), 5, "I1: distinct CIDs {cids:?}");
    let s = g.stats();
    assert_eq!((s.enter_cpu_slow, s.enter_cpu_extra, s.enter_temporary), (1, 3, 1), "{s:?}");
    assert_eq!(g.mode(), Mode::PerCpu, "5 holders of 12 users: per-CPU ownership still saves CIDs");

    // The second guard's extra CID goes back to its slot and stays there: the next guard on the core gets it.
    let mut guards = guards;
    let freed = guards.remove(1).cid();
    let in_use = g.stats().cids_in_use;
    let next = it.next().unwrap().enter();
    assert_eq!((next.kind(), next.cid()), (CidKind::Core(0), freed), "the parked extra CID, borrowed again");
    assert_eq!(g.stats().cids_in_use, in_use, "no new bit");
    drop(next);
    drop(guards);
    // Every guard gone: the temporary's bit went back, the core keeps its 4 CIDs.
    assert_eq!(g.stats().cids_in_use, 4);
    assert_consistent(&g);
    drop(regs);
    let audit = g.audit();
    assert_eq!((audit.bits, g.mode()), (0, Mode::PerTask), "the last drop sweeps every slot (I5): {audit:?}");
}

/// With one CID per core (the kernel's design) the same guards take temporaries, and nothing stays parked.
#[test]
fn one_cid_per_core_takes_temporaries() {
    let g = group(1, 1);
    let mut regs = regs_on(&g, 12, 0);
    let mut it = regs.iter_mut();
    let guards: Vec<_> = (0..3).map(|_| it.next().unwrap().enter()).collect();
    let kinds: Vec<_> = guards.iter().map(|x| x.kind()).collect();
    assert_eq!(kinds, [CidKind::Core(0), CidKind::Temporary, CidKind::Temporary]);
    drop(guards);
    assert_eq!(g.stats().cids_in_use, 1, "only the core's CID");
    assert_consistent(&g);
}

/// I4 with CID sets: a registration that last used an extra CID gets the core's first CID once that is idle, and
/// the first CID converges to 0 when one user is left.
#[test]
fn the_first_cid_is_preferred_once_idle() {
    let g = group(1, 4);
    let mut regs = regs_on(&g, 12, 0);
    let (first, rest) = regs.split_at_mut(1);
    let holder = first[0].enter();
    let extra = rest[0].enter();
    assert_eq!(extra.kind(), CidKind::Core(0));
    let extra_cid = extra.cid();
    drop(extra);
    drop(holder);
    let again = rest[0].enter();
    assert_ne!(again.cid(), extra_cid, "the idle first CID, not the extra one this registration used last");
    assert_eq!(again.cid().get(), 0);
    drop(again);
    let survivor = regs.pop().unwrap();
    drop(regs);
    let mut survivor = survivor;
    assert_eq!(survivor.enter().cid().get(), 0, "I4: one user left");
    assert_consistent(&g);
}

/// A guard releases the slot it borrowed, whichever core its registration runs on afterwards: a second core's
/// guards never see core 0's extra CIDs, and core 0's next guard borrows the released one.
#[test]
fn exits_release_the_slot_they_borrowed() {
    let g = group(2, 4);
    let mut regs = regs_on(&g, 12, 0);
    let [a, b, c, d, ..] = &mut regs[..] else { unreachable!() };
    let held = a.enter(); // core 0's first CID
    let x = b.enter(); // core 0's first extra CID
    assert_eq!(x.kind(), CidKind::Core(0));
    let x_cid = x.cid();
    c.set_cpu(Some(1)).unwrap();
    let other = c.enter();
    assert_eq!(other.kind(), CidKind::Core(1));
    assert_ne!(other.cid(), x_cid);
    drop(x);
    b.set_cpu(Some(1)).unwrap(); // b moves to core 1; its released CID stays core 0's
    let on1 = b.enter();
    assert_eq!(on1.kind(), CidKind::Core(1));
    assert_ne!(on1.cid(), x_cid, "core 1 owns its own CIDs");
    let on0 = d.enter();
    assert_eq!((on0.kind(), on0.cid()), (CidKind::Core(0), x_cid), "core 0's parked extra CID");
    drop((held, other, on1, on0));
    assert_consistent(&g);
}

/// The occupancy switch (design.md §3.1): when half the users, and more than twice the cores, hold a guard at once
/// in per-CPU mode, the enter that needs one more CID switches the group to per-task mode, with `max_cids` raised to
/// `users`; the live guards keep their CIDs and resolve them at exit (adopted as the registration's own);
/// registrations then own CIDs below `users`, and new ones do not switch the group back to per-CPU mode.
#[test]
fn half_the_users_holding_guards_switch_to_per_task() {
    let g = group(1, 4);
    let mut regs = regs_on(&g, 4, 0);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerCpu, 1));
    let [a, b, c, _] = &mut regs[..] else { unreachable!() };
    let ga = a.enter();
    let gb = b.enter();
    assert_eq!(g.mode(), Mode::PerCpu, "two holders of four users on one core: not more than twice the cores");
    let gc = c.enter(); // a third holder: 3 of 4, more than 2 × 1 core, and the core needs one more CID
    assert_eq!(gc.kind(), CidKind::Core(0));
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerTask, 4), "switched while the guards live");
    let mut live = [ga.cid(), gb.cid(), gc.cid()];
    live.sort_unstable();
    assert!(live[0] != live[1] && live[1] != live[2], "I1 across the switch: {live:?}");
    drop((ga, gb, gc));
    assert_consistent(&g);
    let s = g.stats();
    assert_eq!((s.switches_to_per_cpu, s.switches_to_per_task, s.exit_adopt), (1, 1, 3), "{s:?}");
    let mut cids: Vec<_> = regs
        .iter_mut()
        .map(|r| {
            let x = r.enter();
            assert_eq!(x.kind(), CidKind::Task);
            x.cid().get()
        })
        .collect();
    cids.sort_unstable();
    assert_eq!(cids, [0, 1, 2, 3], "one CID per registration, below users (I2)");
    regs.push(g.register());
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerTask, 5), "occupied: a new user does not switch back");
    assert_consistent(&g);
    drop(regs);
    let audit = g.audit();
    assert_eq!(audit.bits, 0, "{audit:?}");
    // Empty again: the kernel's rules apply from the first registration on.
    let regs: Vec<_> = (0..3).map(|_| g.register()).collect();
    assert_eq!(g.mode(), Mode::PerCpu, "not occupied any more");
    drop(regs);
}

/// Few holders among many users stay per-CPU: threads starting one after another, the first ones already inside
/// guards, must not switch a group that needs only its cores.
#[test]
fn holders_within_twice_the_cores_keep_per_cpu_ownership() {
    let g = group(1, 4);
    let mut regs = regs_on(&g, 3, 0);
    let [a, b, _] = &mut regs[..] else { unreachable!() };
    let (ga, gb) = (a.enter(), b.enter()); // 2 of 3 users hold guards: more than half, but not more than 2 cores
    assert_eq!(g.mode(), Mode::PerCpu);
    drop((ga, gb));
    assert_consistent(&g);
}

/// With one CID per core the occupancy switch never runs: the kernel's rules exactly.
#[test]
fn one_cid_per_core_never_switches_for_occupancy() {
    let g = group(1, 1);
    let mut regs = regs_on(&g, 4, 0);
    let mut it = regs.iter_mut();
    let guards: Vec<_> = (0..4).map(|_| it.next().unwrap().enter()).collect();
    assert_eq!(g.mode(), Mode::PerCpu, "every user holds a guard, and the group stays per-CPU");
    drop(guards);
    assert_consistent(&g);
}

/// `cids_per_core` is validated (I9).
#[test]
fn cids_per_core_is_validated() {
    for bad in [0, mmcid::MAX_CIDS_PER_CORE + 1] {
        let err = Group::builder().virtual_cpus(2).cids_per_core(bad).build().unwrap_err();
        assert!(matches!(err, mmcid::Error::ValueOutOfRange { what: "cids_per_core", .. }), "{err:?}");
    }
    assert_eq!(group(2, 3).cids_per_core(), 3);
    assert_eq!(Group::builder().virtual_cpus(2).build().unwrap().cids_per_core(), mmcid::MAX_CIDS_PER_CORE);
}
