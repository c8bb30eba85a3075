//! Tests of `sys/`: possible CPUs, the kernel's CPU bound, CPU lists (Linux), the per-thread core (the portable
//! path), the current CPU (both).

use crate::sys::*;

/// `possible_cpus` covers every CPU number the kernel can report wherever sysfs is missing or not the
/// kernel's (design.md §12.3). The sysfs list with `sysconf`'s count as the fallback would give 8 for the third
/// row, a machine whose CPUs 8-11 exist (sysfs not mounted, glibc counting the online CPUs), and 2 for the
/// fourth and fifth, folding CPUs onto slots where restartable sequences never commit (checked by hand).
#[cfg(all(target_os = "linux", not(mmcid_portable)))]
#[test]
fn possible_cpus_cover_every_cpu_the_kernel_can_report() {
    let max = crate::sys::MAX_CPUS;
    for (sysfs, kernel, allowed, conf, want) in [
        (Some("0-1\n"), Some(64), Some(2), 2, 2),      // the kernel's file: exact
        (Some("0-3,8-11"), Some(64), Some(12), 8, 12), // gaps: the highest CPU counts, not how many
        (None, Some(64), Some(12), 8, 64),             // no sysfs: the kernel's bound, not the count
        (Some("0-1"), Some(128), Some(2), 2, 128),     // a container's file from another machine
        (Some("0-1"), Some(64), Some(6), 2, 64),       // a file that misses our own CPUs
        (Some("0-255"), Some(256), Some(4), 8, 256),   // exact, a multiple of 64
        (Some("0-7"), None, Some(3), 4, 8),            // no kernel bound (filtered): sysfs
        (None, None, Some(6), 4, 6),                   // nothing: the count, but never below our CPUs
        (None, None, None, 0, 1),                      // nothing at all
        (Some("x"), Some(64), Some(2), 2, 64),         // an unreadable list
        (None, Some(1 << 20), Some(2), 2, max),        // capped at MAX_CPUS
    ] {
        assert_eq!(possible_from(sysfs, kernel, allowed, conf), want, "{sysfs:?} {kernel:?} {allowed:?} {conf}");
    }
}

/// The kernel's bound as this machine reports it: a multiple of 64 that the sysfs list (where there is one)
/// rounds up to, covering every CPU this thread may run on, and exactly the shortest mask the kernel accepts.
#[cfg(all(target_os = "linux", not(mmcid_portable)))]
#[test]
fn the_kernel_cpu_bound_is_nr_cpu_ids_rounded_up() {
    let (bound, allowed) = kernel_cpu_bound().expect("sched_getaffinity answers");
    assert_eq!(bound % 64, 0);
    assert!(allowed >= 1 && allowed <= bound, "{allowed} {bound}");
    assert_eq!(allowed, affinity().unwrap().last().unwrap() + 1);
    if bound > 64 {
        assert_eq!(affinity_words(0, bound / 64 - 1), Err(libc::EINVAL), "a shorter mask is refused");
    }
    if let Some(n) = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list(s.trim()))
        .and_then(|c| c.into_iter().max())
    {
        assert!(n < bound && n + 1 + 64 > bound, "sysfs says {} CPUs, the kernel {bound}", n + 1);
        assert_eq!(possible_cpus(), n + 1, "this machine's sysfs list is the kernel's: exact");
    }
}

#[cfg(all(target_os = "linux", not(mmcid_portable)))]
#[test]
fn cpu_list_parsing() {
    assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
    assert_eq!(parse_cpu_list("0"), Some(vec![0]));
    assert_eq!(parse_cpu_list("3-1"), None);
    assert_eq!(parse_cpu_list("x"), None);
}

#[test]
fn current_cpu_is_possible() {
    assert!(current_cpu() < possible_cpus());
    assert!(affinity().unwrap().iter().all(|&c| c < possible_cpus()));
}

/// The portable path's per-thread core: each thread keeps the core it got at its first call (its slot and shard
/// stay its own), every core is one `CpuSet::current` lists, and where the OS has no current-CPU call the current
/// CPU is that core. Threads that ask one after another take consecutive cores, so of threads started in turn
/// (other tests may start threads in between) not all get the same core where there are two or more.
#[cfg(any(not(target_os = "linux"), mmcid_portable))]
#[test]
fn the_per_thread_core_is_stable_and_allowed() {
    let cores = possible_cpus();
    let allowed = crate::CpuSet::current().unwrap();
    let seen: Vec<(usize, usize)> = (0..2 * cores + 2)
        .map(|_| {
            std::thread::spawn(|| {
                let first = thread_core();
                for _ in 0..100 {
                    assert_eq!(thread_core(), first, "the per-thread core changed");
                    std::thread::yield_now();
                }
                (first, current_cpu())
            })
            .join()
            .unwrap()
        })
        .collect();
    for &(core, now) in &seen {
        assert!(core < cores && allowed.contains(core), "core {core} of {cores}, allowed {allowed:?}");
        if cfg!(not(any(target_os = "freebsd", target_os = "dragonfly", target_os = "android"))) || cfg!(mmcid_portable)
        {
            assert_eq!(now, core, "without an OS call the current CPU is the thread's core");
        }
    }
    if cores >= 2 {
        assert!(seen.windows(2).any(|w| w[0].0 != w[1].0), "every thread got the same core: {seen:?}");
    }
}

/// The portable path's groups use fences and CAS borrows whatever the builder asks (design.md §12.6), and its
/// cores are every core `available_parallelism` counts.
#[cfg(any(not(target_os = "linux"), mmcid_portable))]
#[test]
fn portable_groups_have_no_membarrier_and_no_sequences() {
    let g = crate::Group::builder().asymmetric_fences(true).restartable_sequences(true).build().unwrap();
    assert!(!g.uses_membarrier() && !g.uses_rseq());
    let n = std::thread::available_parallelism().unwrap().get();
    assert_eq!((possible_cpus(), crate::CpuSet::current().unwrap().len()), (n, n));
}
