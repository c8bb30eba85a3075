//! The occupancy mark's rule (design.md §3.1), deterministically on one thread with 16 and 64 virtual cores: set
//! by the occupancy switch, held while `users` stays at or above the switch-back threshold of the allowed cores,
//! cleared below it, and from then on the kernel's rules exactly (per-CPU mode past `max_cids` again). Populations
//! shrink and regrow across the threshold, and membership churn on either side of it switches nothing.

use mmcid::{Group, Mode, Registration};

/// `cores` virtual cores owning up to 4 CIDs each.
fn group(cores: usize) -> Group {
    Group::builder().virtual_cpus(cores).cids_per_core(4).build().unwrap()
}

fn register_on_0(g: &Group) -> Registration {
    let mut r = g.register();
    r.set_cpu(Some(0)).unwrap();
    r
}

/// Grows or shrinks `regs` to `n` registrations (dropping the newest first).
fn resize(g: &Group, regs: &mut Vec<Registration>, n: usize) {
    regs.truncate(n);
    while regs.len() < n {
        regs.push(register_on_0(g));
    }
    assert_eq!(g.users(), n);
}

/// The kernel's switch-back threshold for `allowed` cores of `cores` (design.md §3).
fn threshold(allowed: usize, cores: usize) -> usize {
    (allowed - allowed / 4).min(cores / 2).max(1)
}

/// `(per-CPU, per-task)` switches so far.
fn switches(g: &Group) -> (u64, u64) {
    let s = g.stats();
    (s.switches_to_per_cpu, s.switches_to_per_task)
}

/// Makes the group occupied: `users = 5·cores/2` registrations on core 0, more than twice the cores of them
/// holding guards at once (design.md §3.1).
fn occupy(g: &Group, regs: &mut Vec<Registration>, cores: usize) {
    resize(g, regs, 5 * cores / 2);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerCpu, cores));
    let before = switches(g);
    let mut it = regs.iter_mut();
    let guards: Vec<_> = (0..2 * cores + 1).map(|_| it.next().unwrap().enter()).collect();
    assert_eq!(g.mode(), Mode::PerTask, "{} holders of {} users on {cores} cores: occupied", guards.len(), g.users());
    drop(guards);
    assert_eq!(switches(g), (before.0, before.1 + 1));
    let audit = g.audit();
    assert!(audit.is_consistent(), "{audit:?}");
}

fn shrink_and_regrow(cores: usize) {
    let g = group(cores);
    let thrs = threshold(cores, cores);
    let mut regs = Vec::new();
    occupy(&g, &mut regs, cores);

    // Occupied, and never below the threshold: membership churn between it and twice the cores switches nothing,
    // and the group keeps one CID per user.
    let start = switches(&g);
    for _ in 0..3 {
        resize(&g, &mut regs, thrs);
        assert_eq!((g.mode(), g.max_cids()), (Mode::PerTask, cores.min(thrs + thrs / 4).max(thrs)));
        resize(&g, &mut regs, 2 * cores);
        assert_eq!((g.mode(), g.max_cids()), (Mode::PerTask, 2 * cores), "occupied: max_cids = users");
    }
    assert_eq!(switches(&g), start, "no switch while the mark holds");

    // Below the threshold the mark clears: the kernel's rules again, and past `max_cids` the group goes per-CPU
    // with `max_cids` back at the cores.
    resize(&g, &mut regs, thrs - 1);
    resize(&g, &mut regs, cores);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerTask, cores), "up to the cores: per-task, as the kernel");
    assert_eq!(switches(&g), start);
    resize(&g, &mut regs, cores + 1);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerCpu, cores), "past max_cids: per-CPU (the mark is gone)");
    assert_eq!(switches(&g), (start.0 + 1, start.1));

    // Not occupied: churn within the kernel's band (from the threshold to past the cores) switches nothing.
    for _ in 0..3 {
        resize(&g, &mut regs, thrs);
        resize(&g, &mut regs, 2 * cores);
    }
    assert_eq!((g.mode(), switches(&g)), (Mode::PerCpu, (start.0 + 1, start.1)));
    resize(&g, &mut regs, thrs - 1);
    assert_eq!((g.mode(), switches(&g)), (Mode::PerTask, (start.0 + 1, start.1 + 1)), "the kernel's switch-back");

    // Occupied again, then shrunk below the threshold and regrown: per-CPU again.
    occupy(&g, &mut regs, cores);
    resize(&g, &mut regs, thrs - 1);
    resize(&g, &mut regs, 2 * cores);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerCpu, cores));
    drop(regs);
    assert_eq!(g.audit().bits, 0);
}

/// 16 cores: threshold 8. Before the mark cleared below it, a group once occupied stayed per-task with
/// `max_cids = users` for ever (until it emptied).
#[test]
fn the_mark_clears_below_the_threshold_on_16_cores() {
    shrink_and_regrow(16);
}

/// 64 cores: threshold 32.
#[test]
fn the_mark_clears_below_the_threshold_on_64_cores() {
    shrink_and_regrow(64);
}

/// Fewer allowed cores than cores: the threshold is that of the allowed cores (12 of 64: 9).
#[test]
fn the_mark_follows_the_allowed_cores() {
    let cores = 64;
    let allowed = 12;
    let g = Group::builder()
        .virtual_cpus(cores)
        .cids_per_core(4)
        .cpus(mmcid::CpuSet::virtual_set(0..allowed).unwrap())
        .build()
        .unwrap();
    let thrs = threshold(allowed, cores);
    let mut regs = Vec::new();
    resize(&g, &mut regs, 40);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerCpu, 15)); // min(12 + 12/4, 64)
    let mut it = regs.iter_mut();
    let guards: Vec<_> = (0..2 * 15 + 1).map(|_| it.next().unwrap().enter()).collect();
    drop(guards);
    assert_eq!(g.mode(), Mode::PerTask, "occupied");
    resize(&g, &mut regs, thrs);
    resize(&g, &mut regs, 30);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerTask, 30), "held at the threshold");
    resize(&g, &mut regs, thrs - 1);
    resize(&g, &mut regs, 16);
    assert_eq!((g.mode(), g.max_cids()), (Mode::PerCpu, 15), "cleared below it");
}
