//! N enter+exit pairs on one thread, for instruction counting (`scripts/callgrind.sh`).
//!
//! ```text
//! cargo run --release --example enter_exit_loop -- <mode> <iterations>
//! mode: per-task | per-task-fallback | per-cpu | per-cpu-unpinned | temporary | group-enter | counter-add |
//!       counter-add-with
//! ```
//!
//! `per-task` uses the default group (membarrier on the rare side, compiler fences on the hot side, where the
//! kernel allows it), `per-task-fallback` forces full fences (`asymmetric_fences(false)`), `per-cpu` registers
//! idle registrations so that `users > max_cids`, pins the thread and declares its core with `set_cpu`,
//! `per-cpu-unpinned` is the same without `set_cpu` (every enter asks which core it runs on, as unpinned threads do),
//! `temporary` is the same while another registration holds a guard on that core (so every enter takes a temporary
//! CID: what threads see when the core's holder is descheduled inside its guard), and
//! `group-enter` uses the thread-local convenience `Group::enter`; `counter-add` is N `ShardedCounter::add(1)` (which
//! enters through `Group::enter`) and `counter-add-with` is N `reg.enter()` + `ShardedCounter::add_with(&guard, 1)`. Running the loop at two `iterations` and
//! dividing the difference in instructions by the difference in `iterations` gives instructions per pair, free of
//! set-up costs.

use mmcid::{CpuSet, Group, Mode, Registration, ShardedCounter};
use std::hint::black_box;

const USAGE: &str =
    "usage: enter_exit_loop <per-task|per-task-fallback|per-cpu|per-cpu-unpinned|temporary|group-enter|\
counter-add|counter-add-with> <iterations>

Runs <iterations> enter+exit pairs (or counter adds) of one mode; scripts/callgrind.sh counts their instructions.";

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2);
}

/// The measured loop: kept out of line so it is easy to find in a profile.
#[inline(never)]
fn pairs(reg: &mut Registration, n: u64) -> u64 {
    let mut acc = 0u64;
    for _ in 0..n {
        let guard = reg.enter();
        acc = acc.wrapping_add(guard.cid().get() as u64);
    }
    acc
}

#[inline(never)]
fn pairs_local(group: &Group, n: u64) -> u64 {
    let mut acc = 0u64;
    for _ in 0..n {
        let guard = group.enter();
        acc = acc.wrapping_add(guard.cid().get() as u64);
    }
    acc
}

#[inline(never)]
fn adds(counter: &ShardedCounter, n: u64) -> u64 {
    for _ in 0..n {
        counter.add(1);
    }
    counter.sum()
}

#[inline(never)]
fn adds_with(counter: &ShardedCounter, reg: &mut Registration, n: u64) -> u64 {
    for _ in 0..n {
        let guard = reg.enter();
        counter.add_with(&guard, 1);
    }
    counter.sum()
}

fn main() -> Result<(), mmcid::Error> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| usage());
    if mode == "-h" || mode == "--help" {
        println!("{USAGE}");
        return Ok(());
    }
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage());

    let (group, acc, idle) = match mode.as_str() {
        "per-task" | "per-task-fallback" => {
            let group = Group::builder().asymmetric_fences(mode == "per-task").build()?;
            let mut reg = group.register();
            let acc = pairs(&mut reg, black_box(n));
            (group, acc, vec![reg])
        }
        "per-cpu" | "per-cpu-unpinned" | "temporary" => {
            let cpus = CpuSet::current()?;
            let cpu = cpus.iter().next().ok_or(mmcid::Error::EmptyCpuSet)?;
            if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                eprintln!("note: could not pin to CPU {cpu}");
            }
            let group = Group::builder().cpus(cpus).build()?;
            let mut idle: Vec<Registration> = (0..group.cores() + 1).map(|_| group.register()).collect();
            assert_eq!(group.mode(), Mode::PerCpu, "idle registrations must force per-CPU mode");
            let mut reg = group.register();
            if mode != "per-cpu-unpinned" {
                reg.set_cpu(Some(cpu))?;
            }
            // `temporary`: the core's CID stays borrowed by this other registration's guard during the loop.
            let mut holder = group.register();
            holder.set_cpu(Some(cpu))?;
            let held = (mode == "temporary").then(|| holder.enter());
            let acc = pairs(&mut reg, black_box(n));
            drop(held);
            idle.extend([reg, holder]);
            (group, acc, idle)
        }
        "group-enter" => {
            let group = Group::new();
            let acc = pairs_local(&group, black_box(n));
            (group, acc, Vec::new())
        }
        "counter-add" => {
            let group = Group::new();
            let counter = ShardedCounter::new(&group);
            let acc = adds(&counter, black_box(n));
            (group, acc, Vec::new())
        }
        "counter-add-with" => {
            let group = Group::new();
            let counter = ShardedCounter::new(&group);
            let mut reg = group.register();
            let acc = adds_with(&counter, &mut reg, black_box(n));
            (group, acc, vec![reg])
        }
        _ => usage(),
    };
    let s = group.stats();
    println!(
        "mode={mode} iterations={n} group_mode={:?} membarrier={} rseq={} task_fast={} cpu_fast={} temporary={} \
         alloc={} acc={acc}",
        group.mode(),
        group.uses_membarrier(),
        group.uses_rseq(),
        s.enter_task_fast,
        s.enter_cpu_fast,
        s.enter_temporary,
        s.enter_alloc,
    );
    drop(idle);
    group.leave_thread();
    Ok(())
}
