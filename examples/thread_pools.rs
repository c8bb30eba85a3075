//! Thread pool create/teardown churn (the benchmark Thomas Gleixner posted with "[patch 00/19] sched: Rewrite MM CID
//! management", LKML, 2025-10-15) with every CID policy of the workspace crate `mmcid-policies`: threads per second,
//! and how many ownership-mode switches mmcid made.
//!
//! `P` pool threads each loop: start `T` short-lived threads back to back (timing each spawn); each new thread
//! registers with the policy (≈ fork), enters (≈ first schedule-in), checks in with its pool (mutex + condvar
//! rendezvous), waits for the pool's "die", enters again (≈ wake-up), unregisters (≈ exit) and checks out; the
//! pool waits for all of them, then starts the next round.
//!
//! Statistics (`--compare`, the default): after one uncounted warm-up run, each repeat runs every policy once, back
//! to back, so the runs of one repeat saw nearly the same machine load; the order changes from one repeat to the
//! next as the rows of a balanced Latin square, so every policy follows every other equally often
//! (`common::run_order`). Besides the median
//! threads/s of every policy, the example reports the *paired* cost d_r = 1 - thr(P, r) / thr(none, r) of each
//! repeat r (positive = slower), which cancels the machine's slow drift, and a distribution-free confidence
//! interval for the median of the d_r from order statistics: the k-th smallest to the k-th largest d_r, with k
//! the largest whose coverage 1 - 2 P(Bin(n, 1/2) <= k - 1) is at least 90 % (n = 11 repeats: k = 3, 93.5 %).
//! The goal, mmcid costing at most 3 % versus `none`, is judged per configuration: met when the upper bound is <= 3 %,
//! NOT met when the lower bound is > 3 %, otherwise inconclusive (more `--repeats` narrow the interval); overall, the
//! worst configuration decides. That overall verdict takes the worst of several cells, each with its own ~90 % interval
//! and no correction for multiple cells, so its error rate is higher than one cell's. The default is 11 repeats of 0.2
//! s rather than 3 of 0.75 s: at equal time that gives the narrower interval; it took 40 s on the project's 2-core VM
//! (three configurations).
//!
//! ```text
//! cargo run --release --example thread_pools                       # default comparison (three configurations)
//! cargo run --release --example thread_pools -- -p 32 -t 32 --seconds 5 --policy mmcid
//! cargo run --release --example thread_pools -- -p 8 -t 8 --virtual-cpus 16 --compare
//! ```

use mmcid_harness as common;

use common::chart::{self, Chart, Panel, Series, Style};
use common::cli::{self, Args, Flag};
use common::{
    errln, json_list, json_median_vs, json_num, json_paired, json_str, median, medians, outln, paired_ci,
    print_median_table, print_paired_table, print_verdicts, spread_pct, throughput_cost_pct, MedianCi, OutFile,
    Progress, Verdict, CI_LEVEL, MAX_THREADS, POLICIES,
};
use mmcid::{Group, Mode};
use mmcid_policies::{BitmapCids, LazyCids, LazyConfig, MmCid, MutexCids, NoCid, Policy, PolicyGuard, Scan};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

const USAGE: &str = "\
thread pool create/teardown churn with CID policies

usage: thread_pools [options]

  -p, --pools N          pool threads (default 8)
  -t, --threads N        short-lived threads each pool starts per round (default 8)
      --seconds S        length of each run in seconds, fractions allowed (default 5; compare default 0.2)
      --policy P         none | mutex | bitmap | lazy-all | lazy-visited | mmcid  (single run)
      --compare          run every policy of --policies, interleaved (default when no --policy)
      --policies L       the policies --compare runs, comma-separated (default: all; must name none and
                         mmcid)
      --virtual-cpus N   mmcid group (and lazy core slots) with N simulated cores instead of the machine's
                         (at most 65536, mmcid's limit); an error with a --policy that has no cores
      --repeats N        runs per policy in --compare, interleaved (default 11; 5 or more for a 90% CI); an
                         error with --policy
      --json FILE        write the results as JSON (checked before the run; written at the end into a
                         temporary beside FILE, then renamed: a failed run leaves an earlier FILE as it was)
      --svg FILE         with --compare: draw each policy's paired cost versus none with its CI, and its
                         median threads/s, per configuration (an SVG chart; written like --json)
  -h, --help             this text

pools x (threads + 1) is at most 8192 threads at once (each pool thread and its short-lived threads).

With no options: --compare on three configurations: 8 pools x 8 threads on this machine's cores; 1 pool x
(max_cids + 1) threads on this machine's cores, the fewest registered threads that take a group into per-CPU
mode (max_cids = min(A + A/4, possible CPUs) for A allowed CPUs; asked of the library by registering threads
until the mode flips), so each round crosses into per-CPU mode and its exits cross back (rseq borrows where the
kernel allows them); and 2 pools x 16 threads with 8 virtual cores (per-CPU mode when more than 8 threads are
registered, back to per-task below 4), so mmcid's ownership mode crosses the per-task/per-CPU boundary both ways
many times per second. The report has a line with how many mmcid runs of the last two crossed both ways (and
a WARNING when not all did). The 8 x 8
configuration may cross too (per-CPU above max_cids, back only when the users drop below the threshold), but
rarely: see the switch counts.

--compare makes one uncounted warm-up run, then runs every policy once per repeat, back to back, in an order
that changes every repeat so that over n repeats (2n for an odd number n of policies) each policy runs right
after each other one equally often, and prints:
  - the median threads/s per policy with the difference versus `none` (negative = slower), mmcid's mode
    switches per run, the lazy policies' compaction scans per run, and the median of each run's mean spawn
    latency;
  - a WARNING naming every configuration and policy whose runs had spawn failures or timed-out 1 s waits for
    the threads' check-ins (both also in --json for every run: runs_failures, runs_timeouts);
  - the paired cost: per repeat r, d = 1 - thr(P, r) / thr(none, r) (positive = slower; runs of a repeat are
    adjacent in time, so the machine's slow drift cancels), as the median of the d with a distribution-free
    confidence interval for it: [k-th smallest d, k-th largest d], k the largest whose coverage
    1 - 2 P(Bin(n, 1/2) <= k-1) is >= 90% (the coverage achieved is printed: 93.5% for 11 repeats);
  - the run-to-run spread of `none` (noise);
  - the goal, mmcid costs <= 3% versus none, per configuration: met if mmcid's CI upper bound is <= 3%, NOT
    met if its lower bound is > 3%, inconclusive if the CI straddles 3% (more --repeats narrow it) or fewer
    than 5 repeats; overall, the worst configuration decides. The overall verdict takes the worst of several
    cells, each with its own ~90% interval and no correction for multiple cells, so the overall error rate is
    higher than one cell's.
Many short runs beat a few long ones at equal time: the interval of 11 runs (3rd to 9th smallest) is much
narrower than that of 5 (minimum to maximum), and runs closer in time pair better. The default run (3
configurations x 6 policies x 11 repeats x 0.2 s) took 40 s on the project's 2-core VM.
";

/// The most virtual CPUs: mmcid's own limit (a larger `Group::builder().virtual_cpus` is an error there).
const MAX_VIRTUAL_CPUS: usize = 1 << 16;

#[derive(Clone, Copy, Debug)]
struct Setup {
    pools: usize,
    threads: usize,
    virtual_cpus: Option<usize>,
    /// Whether each round should take mmcid into per-CPU mode and back (checked in the report).
    crossing: bool,
}

impl Setup {
    fn label(&self) -> String {
        match self.virtual_cpus {
            Some(v) => format!("{}x{} vcpu{v}", self.pools, self.threads),
            None => format!("{}x{}", self.pools, self.threads),
        }
    }
}

#[derive(Clone, Debug)]
struct Config {
    setups: Vec<Setup>,
    seconds: f64,
    policy: Option<usize>,
    /// The policies a --compare runs (indexes into POLICIES, table order: `none` first, `mmcid` last).
    policies: Vec<usize>,
    repeats: usize,
    json: Option<String>,
    svg: Option<String>,
}

/// Every flag of the command line (`USAGE` explains them).
const FLAGS: &[Flag] = &[
    Flag::value("--pools", Some("-p")),
    Flag::value("--threads", Some("-t")),
    Flag::value("--seconds", None),
    Flag::value("--policy", None),
    Flag::switch("--compare", None),
    Flag::value("--policies", None),
    Flag::value("--virtual-cpus", None),
    Flag::value("--repeats", None),
    Flag::value("--json", None),
    Flag::value("--svg", None),
];

/// The configuration the command line asks for.
fn config(args: &Args) -> Result<Config, String> {
    let (pools, threads, vcpus) =
        (args.positive("--pools")?, args.positive("--threads")?, args.positive("--virtual-cpus")?);
    let seconds = args.seconds("--seconds")?;
    let policy = args.value("--policy").map(common::policy_index).transpose().map_err(|e| format!("--policy: {e}"))?;
    let policies = args.value("--policies").map(common::parse_policies).transpose()?;
    let compare = args.has("--compare");
    let (json, svg) = (args.value("--json").map(str::to_string), args.value("--svg").map(str::to_string));
    let (compare, policies) = common::compare_mode(compare, policy, policies)?;
    args.only("--svg", compare, "to --compare (a single --policy run has nothing to compare)")?;
    args.only("--repeats", compare, "to --compare (a single --policy run is one run)")?;
    let repeats = args.positive("--repeats")?.unwrap_or(11);
    // Only mmcid and the lazy policies have cores; the others would ignore them.
    let with_cores = policy.map_or(true, |p| matches!(POLICIES[p], "mmcid" | "lazy-all" | "lazy-visited"));
    args.only("--virtual-cpus", with_cores, "to mmcid and the lazy policies (the others have no cores)")?;
    let defaults = pools.is_none() && threads.is_none() && vcpus.is_none();
    let (pools, threads) = (pools.unwrap_or(8), threads.unwrap_or(8));
    if pools.saturating_mul(threads.saturating_add(1)) > MAX_THREADS {
        return Err(format!(
            "{pools} pools x ({threads} threads + the pool's own): at most {MAX_THREADS} threads at once"
        ));
    }
    if let Some(v) = vcpus.filter(|&v| v > MAX_VIRTUAL_CPUS) {
        return Err(format!("--virtual-cpus {v}: at most {MAX_VIRTUAL_CPUS} (mmcid's limit)"));
    }
    let setups = if compare && defaults {
        // 8 × 8; one pool of just enough threads to cross into per-CPU mode and back every round on the machine's
        // own cores (rseq borrows where available); and 2 × 16 on 8 virtual cores, which crosses at thresholds
        // the machine's core count would not reach.
        let crossing = per_cpu_threshold(Group::new())?;
        vec![
            Setup { pools, threads, virtual_cpus: None, crossing: false },
            Setup { pools: 1, threads: crossing, virtual_cpus: None, crossing: true },
            Setup { pools: 2, threads: 16, virtual_cpus: Some(8), crossing: true },
        ]
    } else {
        vec![Setup { pools, threads, virtual_cpus: vcpus, crossing: false }]
    };
    if compare && compare_runs(setups.len(), repeats, policies.len()).is_none() {
        return Err(format!("--repeats {repeats}: too many runs"));
    }
    let seconds = seconds.unwrap_or(if compare { 0.2 } else { 5.0 });
    Ok(Config { setups, seconds, policy, policies, repeats, json, svg })
}

/// The fewest registered threads that take a fresh `group` into per-CPU mode, asked of the library: threads are
/// registered until its mode flips (users > max_cids = min(A + A/4, possible CPUs) for A allowed CPUs,
/// `inner/switches.rs` `update_limits`), then all dropped. An error if it does not flip within [`MAX_THREADS`].
fn per_cpu_threshold(group: Group) -> Result<usize, String> {
    let mut registered = Vec::new();
    while registered.len() < MAX_THREADS {
        registered.push(group.register());
        if group.mode() != Mode::PerTask {
            return Ok(registered.len());
        }
    }
    Err(format!("a group on this machine's cores stayed per-task with {MAX_THREADS} threads registered"))
}

/// Runs of a --compare: every policy of the list once per repeat and setup; None on overflow.
fn compare_runs(setups: usize, repeats: usize, policies: usize) -> Option<usize> {
    setups.checked_mul(repeats)?.checked_mul(policies)
}

/// One pool's rendezvous record (the C benchmark's `{mutex, cond, counters}`).
#[derive(Default)]
struct Pool {
    state: Mutex<Counts>,
    cond: Condvar,
}

#[derive(Default)]
struct Counts {
    /// Threads of this round checked in and not yet out.
    cnt: usize,
    /// Threads of this round the pool has let go and that have not left yet.
    die: usize,
    /// Threads of this round that panicked (each counted here instead of in `cnt`).
    gone: usize,
    /// Threads of this pool that panicked, over all rounds.
    panicked: u64,
}

/// A short-lived thread's place in its pool's round. Dropping it checks the thread out: normally after its exit,
/// and also when the thread unwinds from a panic anywhere before (a policy's `thread` or `enter`), so that the
/// pool's waits still end and the run reports the panic instead of waiting for ever.
struct Member<'a> {
    pool: &'a Pool,
    checked_in: bool,
}

impl Member<'_> {
    /// Checks in with the pool (the C benchmark's `cnt++`).
    fn check_in(&mut self) {
        let mut s = lock(self.pool);
        s.cnt += 1;
        self.checked_in = true;
        self.pool.cond.notify_all();
    }

    /// Waits until the pool lets one thread go, and takes that place.
    fn wait_for_die(&self) {
        let mut s = lock(self.pool);
        while s.die == 0 {
            s = self.pool.cond.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.die -= 1;
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        let mut s = lock(self.pool);
        if self.checked_in {
            s.cnt -= 1;
        }
        if std::thread::panicking() {
            s.gone += 1;
            s.panicked += 1;
        }
        self.pool.cond.notify_all();
    }
}

/// Lets a pool's threads go for good if the pool thread itself unwinds (a panic): none of them waits for ever.
struct ReleaseOnPanic<'a>(&'a Pool);

impl Drop for ReleaseOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            lock(self.0).die = usize::MAX;
            self.0.cond.notify_all();
        }
    }
}

/// Result of one run.
#[derive(Clone, Debug, Default)]
struct Outcome {
    threads_per_s: f64,
    created: u64,
    /// Spawns that failed (the C benchmark's `failures`).
    failures: u64,
    /// The pools' 1 s waits for their threads to check in that timed out (the C benchmark's `timeouts`).
    timeouts: u64,
    mean_spawn_ns: f64,
    switches: Option<(u64, u64)>,
    /// The lazy policies' compaction scans in the run.
    scans: Option<u64>,
}

/// What one pool thread counted over its rounds.
#[derive(Clone, Copy, Debug, Default)]
struct PoolTotals {
    created: u64,
    failures: u64,
    timeouts: u64,
    spawn_ns: u128,
    /// Its short-lived threads that panicked.
    panicked: u64,
}

impl std::ops::AddAssign for PoolTotals {
    fn add_assign(&mut self, o: PoolTotals) {
        self.created += o.created;
        self.failures += o.failures;
        self.timeouts += o.timeouts;
        self.spawn_ns += o.spawn_ns;
        self.panicked += o.panicked;
    }
}

fn lock(pool: &Pool) -> std::sync::MutexGuard<'_, Counts> {
    pool.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// One run; an error if a pool thread cannot be started (the pools already started are stopped and joined).
///
/// The pools wait at a gate until all of them are started and the clock starts: pools churning while the others
/// are still being started would starve the starting thread (with thousands of pools, for minutes).
fn run_policy<P: Policy + 'static>(policy: Arc<P>, setup: Setup, seconds: f64) -> Result<Outcome, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(RwLock::new(()));
    let closed = gate.write().unwrap_or_else(|e| e.into_inner());
    let mut pools = Vec::with_capacity(setup.pools);
    for i in 0..setup.pools {
        let spawned = {
            let (policy, stop, gate) = (Arc::clone(&policy), Arc::clone(&stop), Arc::clone(&gate));
            std::thread::Builder::new().spawn(move || {
                drop(gate.read().unwrap_or_else(|e| e.into_inner())); // wait for go
                let pool = Arc::new(Pool::default());
                let _release = ReleaseOnPanic(&pool);
                let mut totals = PoolTotals::default();
                // At least one round, however late the pool thread first runs (a loaded machine), so every run
                // measures something.
                loop {
                    let mut started = 0;
                    for _ in 0..setup.threads {
                        let (policy, pool) = (Arc::clone(&policy), Arc::clone(&pool));
                        let t0 = Instant::now();
                        let spawned = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
                            let mut member = Member { pool: &pool, checked_in: false };
                            let mut me = policy.thread(None); // ≈ fork
                            {
                                let g = policy.enter(&mut me); // ≈ first schedule-in
                                black_box(g.cid());
                                member.check_in();
                            }
                            member.wait_for_die();
                            {
                                let g = policy.enter(&mut me); // ≈ wake-up
                                black_box(g.cid());
                            }
                            drop(me); // ≈ exit
                            drop(member); // checks out
                        });
                        totals.spawn_ns += t0.elapsed().as_nanos();
                        match spawned {
                            Ok(_detached) => started += 1,
                            Err(_) => totals.failures += 1,
                        }
                    }
                    let mut s = lock(&pool);
                    // Every thread of the round checked in, or panicked (then it counts as gone instead).
                    while s.cnt + s.gone < started {
                        let (guard, waited) =
                            pool.cond.wait_timeout(s, Duration::from_secs(1)).unwrap_or_else(|e| e.into_inner());
                        s = guard;
                        totals.timeouts += u64::from(waited.timed_out());
                    }
                    s.die = started;
                    pool.cond.notify_all();
                    while s.cnt > 0 {
                        s = pool.cond.wait(s).unwrap_or_else(|e| e.into_inner());
                    }
                    // Every thread of the round has left: what a panicked one did not take is nobody's.
                    (s.die, s.gone) = (0, 0);
                    totals.panicked = s.panicked;
                    drop(s);
                    totals.created += started as u64;
                    if started == 0 {
                        std::thread::sleep(Duration::from_millis(10)); // spawning fails: don't spin
                    }
                    if stop.load(Ordering::Relaxed) || totals.panicked > 0 {
                        break totals;
                    }
                }
            })
        };
        match spawned {
            Ok(h) => pools.push(h),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                drop(closed);
                for p in pools {
                    let _ = p.join();
                }
                return Err(format!("cannot start pool thread {} of {}: {e}", i + 1, setup.pools));
            }
        }
    }
    let start = Instant::now();
    drop(closed); // go
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let (mut t, mut pools_panicked) = (PoolTotals::default(), 0);
    for p in pools {
        match p.join() {
            Ok(totals) => t += totals,
            Err(_) => pools_panicked += 1,
        }
    }
    if t.panicked + pools_panicked > 0 {
        return Err(format!(
            "{} short-lived thread(s) and {pools_panicked} pool thread(s) panicked (the panic message is above)",
            t.panicked
        ));
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(Outcome {
        threads_per_s: t.created as f64 / elapsed,
        created: t.created,
        failures: t.failures,
        timeouts: t.timeouts,
        mean_spawn_ns: t.spawn_ns as f64 / (t.created + t.failures).max(1) as f64,
        switches: None,
        scans: None,
    })
}

fn run_one(policy: usize, setup: Setup, seconds: f64) -> Result<Outcome, String> {
    let capacity = setup.pools * setup.threads;
    let lazy = |scan| {
        let mut config = LazyConfig::new(scan, capacity);
        if let Some(v) = setup.virtual_cpus {
            config.cores = v;
        }
        let policy = Arc::new(LazyCids::with_config(config).map_err(|e| e.to_string())?);
        let out = run_policy(Arc::clone(&policy), setup, seconds)?;
        Ok::<_, String>(Outcome { scans: Some(policy.scans()), ..out })
    };
    Ok(match POLICIES[policy] {
        "none" => run_policy(Arc::new(NoCid::new()), setup, seconds)?,
        "mutex" => run_policy(Arc::new(MutexCids::new()), setup, seconds)?,
        "bitmap" => run_policy(Arc::new(BitmapCids::new(capacity).map_err(|e| e.to_string())?), setup, seconds)?,
        "lazy-all" => lazy(Scan::All)?,
        "lazy-visited" => lazy(Scan::Visited)?,
        _ => {
            let group = match setup.virtual_cpus {
                Some(v) => Group::builder().virtual_cpus(v).build().map_err(|e| format!("--virtual-cpus {v}: {e}"))?,
                None => Group::new(),
            };
            let mut out = run_policy(Arc::new(MmCid::new(group.clone())), setup, seconds)?;
            let stats = group.stats();
            if group.users() != 0 || stats.cids_in_use != 0 {
                return Err(format!("mmcid: {} users, {} CIDs in use after the run", group.users(), stats.cids_in_use));
            }
            out.switches = Some((stats.switches_to_per_cpu, stats.switches_to_per_task));
            out
        }
    })
}

fn fail(e: String) -> ! {
    errln!("thread_pools: {e}");
    std::process::exit(1);
}

/// One run of one policy (no --compare).
fn single(cfg: &Config, p: usize, cores: usize, json: Option<OutFile>) {
    let setup = cfg.setups[0];
    outln!("thread pools {}, policy {}, {:.2} s, {cores} cores", setup.label(), POLICIES[p], cfg.seconds);
    let run = || run_one(p, setup, cfg.seconds);
    let detail = || format!("a run of {:.1} s", cfg.seconds);
    let out = common::with_progress("thread_pools", detail, run).unwrap_or_else(|e| fail(e));
    outln!(
        "created {} threads ({} failed to start), {:.0} thr/s, mean spawn {:.0} ns, {} timed-out waits (1 s)",
        out.created,
        out.failures,
        out.threads_per_s,
        out.mean_spawn_ns,
        out.timeouts
    );
    if let Some((to_cpu, to_task)) = out.switches {
        outln!("mmcid mode switches: {to_cpu} to per-CPU, {to_task} to per-task");
    }
    if let Some(scans) = out.scans {
        outln!("lazy compaction scans: {scans}");
    }
    if let Some(file) = json {
        let body = format!(
            "{{\"benchmark\":\"thread_pools\",\"config\":{},\"policy\":{},\"seconds\":{},\"threads_per_s\":{},\
             \"created\":{},\"failures\":{},\"timeouts\":{},\"mean_spawn_ns\":{},\"switches_to_per_cpu\":{},\
             \"switches_to_per_task\":{},\"scans\":{}}}\n",
            json_str(&setup.label()),
            json_str(POLICIES[p]),
            json_seconds(cfg.seconds),
            json_num(out.threads_per_s, 1),
            out.created,
            out.failures,
            out.timeouts,
            json_num(out.mean_spawn_ns, 0),
            out.switches.map_or("null".into(), |s| s.0.to_string()),
            out.switches.map_or("null".into(), |s| s.1.to_string()),
            out.scans.map_or("null".into(), |s| s.to_string()),
        );
        file.write(&body).unwrap_or_else(|e| fail(e));
    }
}

/// One count of every run, as the inside of a JSON array.
fn counts(runs: &[Outcome], f: impl Fn(&Outcome) -> u64) -> String {
    runs.iter().map(|o| f(o).to_string()).collect::<Vec<_>>().join(",")
}

/// `--seconds` as a JSON number: as many decimals as its shortest exact form needs (it is finite and positive),
/// `null` otherwise.
fn json_seconds(seconds: f64) -> String {
    let decimals = format!("{seconds}").split_once('.').map_or(0, |(_, frac)| frac.len());
    json_num(seconds, decimals)
}

fn main() {
    let cfg = cli::parse_or_exit("thread_pools", USAGE, FLAGS, config);
    // Checked before the run, so that an unwritable path is reported at once; written at the end.
    let json = cfg.json.as_deref().map(|path| OutFile::create("--json", path).unwrap_or_else(|e| fail(e)));
    let svg = cfg.svg.as_deref().map(|path| OutFile::create("--svg", path).unwrap_or_else(|e| fail(e)));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

    if let Some(p) = cfg.policy {
        single(&cfg, p, cores, json);
        return;
    }

    let results = compare(&cfg, cores);
    let thr = throughputs(&results);
    let paired: Vec<Vec<Option<MedianCi>>> =
        thr.iter().map(|row| row.iter().map(|v| paired_ci(v, &row[0], throughput_cost_pct)).collect()).collect();
    let verdict = report(&cfg, &results, &thr, &paired);
    if let Some(file) = json {
        file.write(&json_body(&cfg, &results, &thr, &paired, verdict, cores)).unwrap_or_else(|e| fail(e));
    }
    if let Some(file) = svg {
        chart_of(&cfg, &thr, &paired, cores, chart::footer()).write(file).unwrap_or_else(|e| fail(e));
    }
}

/// The --compare results as a chart, per configuration: each policy's paired cost versus `none` (the median, a
/// bar) with its confidence interval (an error bar), and every policy's median threads/s.
fn chart_of(
    cfg: &Config,
    thr: &[Vec<Vec<f64>>],
    paired: &[Vec<Option<MedianCi>>],
    cores: usize,
    footer: String,
) -> Chart {
    let names = common::policy_names(&cfg.policies);
    let categories: Vec<String> = cfg.setups.iter().map(Setup::label).collect();
    let cost = (1..names.len())
        .map(|p| Series {
            name: names[p].to_string(),
            values: paired
                .iter()
                .map(|row| row[p].map(|ci| chart::Value { value: ci.median, interval: Some((ci.lo, ci.hi)) }))
                .collect(),
        })
        .collect();
    let rate = (0..names.len())
        .map(|p| Series {
            name: names[p].to_string(),
            values: thr.iter().map(|row| Some(chart::Value::plain(median(&row[p])))).collect(),
        })
        .collect();
    let panel = |title: String, y_label: &str, series| Panel {
        title,
        x_label: "configuration (pools x threads, virtual cores)".into(),
        y_label: y_label.into(),
        categories: categories.clone(),
        series,
        style: Style::Bars,
        log_y: false,
    };
    Chart {
        title: format!(
            "thread_pools, create/teardown churn: {cores} cores, {} s per run, {} repeats",
            json_seconds(cfg.seconds),
            cfg.repeats
        ),
        panels: vec![
            panel(
                format!("cost versus none, median of the paired runs with its {:.0}% CI", CI_LEVEL * 100.0),
                "% of none's threads/s (positive = slower)",
                cost,
            ),
            panel("threads created per second, median of the runs".into(), "threads/s (higher is better)", rate),
        ],
        footer,
    }
}

/// Every policy on every setup, interleaved repeats: `results[setup][policy][repeat]`. Every policy runs once per
/// repeat (in `run_order`), so index `repeat` pairs the policies' runs made back to back. One uncounted warm-up run
/// comes first (thread stacks, the allocator, page faults), as in hackbench.
fn compare(cfg: &Config, cores: usize) -> Vec<Vec<Vec<Outcome>>> {
    let n = cfg.policies.len();
    let total = compare_runs(cfg.setups.len(), cfg.repeats, n).unwrap_or(usize::MAX); // checked in parse_args
    outln!(
        "thread pools (create/teardown churn), {cores} cores, {:.2} s per run, {} repeats per cell (interleaved)",
        cfg.seconds,
        cfg.repeats
    );
    // Warm-up, not counted: the first setup's first policy, at most 0.2 s.
    run_one(cfg.policies[0], cfg.setups[0], cfg.seconds.min(0.2)).unwrap_or_else(|e| fail(e));
    let mut progress = Progress::new(total);
    let mut results: Vec<Vec<Vec<Outcome>>> = vec![vec![Vec::new(); n]; cfg.setups.len()];
    for (si, setup) in cfg.setups.iter().enumerate() {
        for rep in 0..cfg.repeats {
            for p in common::run_order(n, rep) {
                let policy = cfg.policies[p];
                let (label, name) = (setup.label(), POLICIES[policy]);
                progress.step(format_args!("{label:<14} repeat {}/{} {name:<12}", rep + 1, cfg.repeats));
                results[si][p].push(run_one(policy, *setup, cfg.seconds).unwrap_or_else(|e| {
                    progress.interrupt();
                    fail(e)
                }));
            }
        }
    }
    progress.finish();
    results
}

/// Threads per second of every run, `[setup][policy][repeat]`.
fn throughputs(results: &[Vec<Vec<Outcome>>]) -> Vec<Vec<Vec<f64>>> {
    per_run(results, |o| o.threads_per_s)
}

/// One number of every run, `[setup][policy][repeat]`.
fn per_run(results: &[Vec<Vec<Outcome>>], f: impl Fn(&Outcome) -> f64) -> Vec<Vec<Vec<f64>>> {
    results.iter().map(|row| row.iter().map(|runs| runs.iter().map(&f).collect()).collect()).collect()
}

/// mmcid's mode switches (to per-CPU, to per-task) over all its runs.
fn switch_totals(runs: &[Outcome]) -> (u64, u64) {
    runs.iter().filter_map(|o| o.switches).fold((0, 0), |a, s| (a.0 + s.0, a.1 + s.1))
}

/// A warning naming every cell whose runs had spawn failures or timed-out waits for check-ins (the C benchmark's
/// `failures` and `timeouts`), summed over its runs; None when there were none.
fn troubles(labels: &[String], names: &[&str], results: &[Vec<Vec<Outcome>>]) -> Option<String> {
    let cells: Vec<String> = labels
        .iter()
        .zip(results)
        .flat_map(|(label, row)| names.iter().zip(row).map(move |(name, runs)| (label, name, runs)))
        .filter_map(|(label, name, runs)| {
            let (failures, timeouts) = runs.iter().fold((0, 0), |(f, t), o| (f + o.failures, t + o.timeouts));
            (failures + timeouts > 0).then(|| format!("{label} {name} {failures}/{timeouts}"))
        })
        .collect();
    (!cells.is_empty()).then(|| {
        format!("WARNING: spawn failures / timed-out 1 s waits for check-ins, summed over runs: {}", cells.join(", "))
    })
}

/// The mean compaction scans per run of a lazy policy's runs; None for the other policies.
fn mean_scans(runs: &[Outcome]) -> Option<f64> {
    let scans: Vec<u64> = runs.iter().filter_map(|o| o.scans).collect();
    (!scans.is_empty()).then(|| scans.iter().sum::<u64>() as f64 / scans.len() as f64)
}

/// Whether every one of mmcid's runs switched at least once to per-CPU mode and once back.
fn crossed_both_ways(runs: &[Outcome]) -> bool {
    !runs.is_empty() && runs.iter().all(|o| o.switches.is_some_and(|(to_cpu, to_task)| to_cpu > 0 && to_task > 0))
}

/// The report's line on the crossing configurations, whatever the outcome (the usage promises it): how many of
/// each one's mmcid runs switched to per-CPU mode and back; None without a crossing configuration.
fn crossings(setups: &[Setup], results: &[Vec<Vec<Outcome>>]) -> Option<String> {
    let cells: Vec<String> = setups
        .iter()
        .zip(results)
        .filter(|(setup, _)| setup.crossing)
        .map(|(setup, row)| {
            let runs = &row[row.len() - 1];
            let both = runs.iter().filter(|o| crossed_both_ways(std::slice::from_ref(*o))).count();
            format!("{} {both} of {}", setup.label(), runs.len())
        })
        .collect();
    (!cells.is_empty()).then(|| format!("mmcid runs that crossed into per-CPU mode and back: {}", cells.join(", ")))
}

/// mmcid's mode switches (to per-CPU, to per-task) per run, averaged over its runs.
fn switches_per_run(runs: &[Outcome]) -> (f64, f64) {
    let (to_cpu, to_task) = switch_totals(runs);
    let n = runs.len().max(1) as f64;
    (to_cpu as f64 / n, to_task as f64 / n)
}

/// Mean spawn latency of every run in ns, `[setup][policy][repeat]`.
fn spawn_latencies(results: &[Vec<Vec<Outcome>>]) -> Vec<Vec<Vec<f64>>> {
    per_run(results, |o| o.mean_spawn_ns)
}

/// The goal: mmcid's paired cost at most this many percent of `none`'s threads/s, in every configuration.
const BUDGET_PCT: f64 = 3.0;

/// The tables, the noise line and the goal verdicts; returns the overall verdict.
fn report(
    cfg: &Config,
    results: &[Vec<Vec<Outcome>>],
    thr: &[Vec<Vec<f64>>],
    paired: &[Vec<Option<MedianCi>>],
) -> Verdict {
    let labels: Vec<String> = cfg.setups.iter().map(Setup::label).collect();
    let names = common::policy_names(&cfg.policies);
    let title = "threads/s, median, % versus none (negative = slower); higher is better";
    print_median_table(title, "config", &labels, &names, &medians(thr), 0);
    let switches: Vec<String> = labels
        .iter()
        .zip(results)
        .map(|(label, row)| {
            let (to_cpu, to_task) = switches_per_run(&row[row.len() - 1]);
            format!("{label} {to_cpu:.1}/{to_task:.1}")
        })
        .collect();
    outln!("mmcid mode switches per run (to per-CPU/to per-task): {}", switches.join(", "));
    let scans: Vec<String> = labels
        .iter()
        .zip(results)
        .map(|(label, row)| {
            let lazy: Vec<String> = names
                .iter()
                .zip(row)
                .filter_map(|(name, runs)| mean_scans(runs).map(|m| format!("{name} {m:.1}")))
                .collect();
            format!("{label} {}", lazy.join(" "))
        })
        .collect();
    if names.iter().any(|n| n.starts_with("lazy")) {
        outln!("lazy compaction scans per run (mean): {}", scans.join(", "));
    }
    if let Some(line) = crossings(&cfg.setups, results) {
        outln!("{line}");
    }
    for (setup, row) in cfg.setups.iter().zip(results) {
        if setup.crossing && !crossed_both_ways(&row[row.len() - 1]) {
            outln!(
                "WARNING: {} should take mmcid into per-CPU mode and back in every run, but some runs did not \
                 switch both ways: it did not measure the mode switch",
                setup.label()
            );
        }
    }
    if let Some(line) = troubles(&labels, &names, results) {
        outln!("{line}");
    }
    let spawn: Vec<Vec<f64>> =
        spawn_latencies(results).iter().map(|row| row.iter().map(|v| median(v) / 1e3).collect()).collect();
    let title = "mean spawn latency, us, median over runs, % versus none (positive = slower)";
    print_median_table(title, "config", &labels, &names, &spawn, 1);
    let title =
        "paired cost, % (positive = slower): median over repeats of 1 - thr(P)/thr(none) in the same repeat [CI]";
    print_paired_table(title, "config", &labels, &names, paired);
    let spread = thr.iter().map(|row| spread_pct(&row[0])).fold(0.0, f64::max);
    outln!("noise: run-to-run spread (max - min) of `none` up to {spread:.1}% of its median (pairing cancels drift)");
    outln!(
        "goal: mmcid costs <= {BUDGET_PCT}% versus none in every config (kernel v6.17 -> CID rework: +30-35% thr/s); \
         per config:"
    );
    let mmcid: Vec<Option<MedianCi>> = paired.iter().map(|row| row[row.len() - 1]).collect();
    let verdict = print_verdicts("  ", &labels, &mmcid, BUDGET_PCT);
    outln!("goal (mmcid costs <= {BUDGET_PCT}% versus none): {}", verdict.word());
    verdict
}

/// The --compare results as JSON: every run, the medians, and the paired costs with their intervals. Every float
/// goes through `json_num` (`null` when not finite, e.g. a percentage versus a median of 0 threads/s).
fn json_body(
    cfg: &Config,
    results: &[Vec<Vec<Outcome>>],
    thr: &[Vec<Vec<f64>>],
    paired: &[Vec<Option<MedianCi>>],
    verdict: Verdict,
    cores: usize,
) -> String {
    let mut rows = Vec::new();
    let spawn = spawn_latencies(results);
    for (si, setup) in cfg.setups.iter().enumerate() {
        let base = median(&thr[si][0]);
        for (p, name) in common::policy_names(&cfg.policies).into_iter().enumerate() {
            let m = median(&thr[si][p]);
            let scans: Vec<String> = results[si][p].iter().filter_map(|o| o.scans.map(|n| n.to_string())).collect();
            let scans = if scans.is_empty() { String::new() } else { format!(",\"runs_scans\":[{}]", scans.join(",")) };
            let switches = if name == "mmcid" {
                let (to_cpu, to_task) = switch_totals(&results[si][p]);
                let crossed = if setup.crossing {
                    format!(",\"crossed_both_ways\":{}", crossed_both_ways(&results[si][p]))
                } else {
                    String::new()
                };
                // Per run, as in a single run's JSON, plus the totals over the runs under their own names.
                format!(
                    ",\"runs_switches_to_per_cpu\":[{}],\"runs_switches_to_per_task\":[{}],\
                     \"switches_to_per_cpu_total\":{to_cpu},\"switches_to_per_task_total\":{to_task}{crossed}",
                    counts(&results[si][p], |o| o.switches.map_or(0, |s| s.0)),
                    counts(&results[si][p], |o| o.switches.map_or(0, |s| s.1)),
                )
            } else {
                String::new()
            };
            rows.push(format!(
                "    {{\"config\":{},\"pools\":{},\"threads\":{},\"virtual_cpus\":{},\"policy\":{},\
                 \"runs_thr_per_s\":[{}],{},{},\"median_mean_spawn_ns\":{},\"runs_failures\":[{}],\
                 \"runs_timeouts\":[{}]{switches}{scans}}}",
                json_str(&setup.label()),
                setup.pools,
                setup.threads,
                setup.virtual_cpus.map_or("null".into(), |v| v.to_string()),
                json_str(name),
                json_list(&thr[si][p], 1),
                json_median_vs("", "median_thr_per_s", m, base, 1),
                json_paired("paired_cost_", paired[si][p].as_ref()),
                json_num(median(&spawn[si][p]), 0),
                counts(&results[si][p], |o| o.failures),
                counts(&results[si][p], |o| o.timeouts),
            ));
        }
    }
    format!(
        "{{\n  \"benchmark\":\"thread_pools\",\"cpus\":{cores},\"seconds\":{},\"repeats\":{},\n  \
         \"ci_level\":{},\"goal_budget_pct\":{},\"goal\":{},\n  \"results\":[\n{}\n  ]\n}}\n",
        json_seconds(cfg.seconds),
        cfg.repeats,
        json_num(CI_LEVEL, 2),
        json_num(BUDGET_PCT, 1),
        json_str(verdict.word()),
        rows.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::testing::{within, PanicAt};

    /// The configuration of `words` (None for `--help`).
    fn parse(words: &[&str]) -> Result<Option<Config>, String> {
        cli::parse_words(FLAGS, words, config)
    }

    /// Flags the run would ignore are errors naming them: --repeats with a single --policy run, --virtual-cpus
    /// with a policy that has no cores; --help is not an error; the usage lists every flag.
    #[test]
    fn the_command_line_rejects_what_it_would_ignore() {
        let e = parse(&["--policy", "mmcid", "--repeats", "3"]).unwrap_err();
        assert!(e.starts_with("--repeats applies only to --compare"), "{e}");
        for p in ["none", "mutex", "bitmap"] {
            let e = parse(&["--policy", p, "--virtual-cpus", "8"]).unwrap_err();
            assert!(e.starts_with("--virtual-cpus applies only to mmcid and the lazy policies"), "{p}: {e}");
        }
        for p in ["mmcid", "lazy-all", "lazy-visited"] {
            assert_eq!(
                parse(&["--policy", p, "--virtual-cpus", "8"]).unwrap().unwrap().setups[0].virtual_cpus,
                Some(8)
            );
        }
        assert_eq!(parse(&["--virtual-cpus=8", "--repeats=3"]).unwrap().unwrap().repeats, 3);
        assert!(parse(&["-p", "2", "--help"]).unwrap().is_none());
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }

    #[test]
    fn default_is_the_paired_comparison_of_11_short_runs() {
        let cfg = parse(&[]).unwrap().unwrap();
        assert_eq!((cfg.policy, cfg.setups.len(), cfg.repeats, cfg.seconds), (None, 3, 11, 0.2));
        let single = parse(&["--policy", "mmcid"]).unwrap().unwrap();
        assert_eq!((single.policy, single.seconds), (Some(5), 5.0));
    }

    /// The help states the thread limit that `parse_args` enforces.
    #[test]
    fn usage_names_the_thread_limit() {
        assert!(USAGE.contains(&format!("at most {MAX_THREADS} threads")), "{USAGE}");
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        for words in [
            &["--seconds", "-1"][..],
            &["--seconds", "NaN"],
            &["--seconds", "inf"],
            &["--repeats", "0"],
            &["--policy", "nope"],
            &["-p", "1000", "-t", "1000"],
            &["--json"],
            &["--bogus"],
            &["--virtual-cpus", "18446744073709551615"],
            &["--virtual-cpus", "65537"],
            &["-p", "30000", "-t", "1"],
            &["-p", "8193", "-t", "1"],
            &["-p", "1", "-t", "8193"],
            &["--repeats", "18446744073709551615"],
            &["--compare", "--policy", "mmcid"],
            &["-p", "1", "-t", "18446744073709551615"],
        ] {
            assert!(parse(words).is_err(), "{words:?} was accepted");
        }
    }

    /// A short run of every policy, on this machine's cores and on 8 virtual ones: threads were created and none
    /// failed to start; and where at most 2 cores are allowed (as on CI), mmcid crossed into per-CPU mode and
    /// back, since one pool's 3 registered threads already outnumber them.
    #[test]
    fn every_policy_runs() {
        for virtual_cpus in [None, Some(8)] {
            let setup = Setup { pools: 2, threads: 3, virtual_cpus, crossing: false };
            for (p, name) in POLICIES.iter().enumerate() {
                let out = run_one(p, setup, 0.05).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(out.created > 0 && out.failures == 0, "{name}: {out:?}");
                if *name == "mmcid" && virtual_cpus.is_none() && mmcid::Group::new().cpus().len() <= 2 {
                    let (to_cpu, to_task) = out.switches.expect("mmcid reports its switches");
                    assert!(to_cpu >= 1 && to_task >= 1, "{out:?}");
                }
            }
        }
    }

    /// A short-lived thread that panics before it checks in (in `thread`, or its first enter: enter 1 of one
    /// pool of 3) or after (its second enter: enter 4, after the pool let the round go) still counts itself out:
    /// the pool ends its round, the run returns an error naming the panic, and no thread is left waiting. Without
    /// that, the pool waits for ever (for a check-in in 1 s timeouts, or for the check-out), and the test fails
    /// after 20 s instead of hanging.
    #[test]
    fn a_panicking_thread_fails_the_run_instead_of_hanging_it() {
        for (thread_at, enter_at) in [(1, usize::MAX), (usize::MAX, 1), (usize::MAX, 4)] {
            let setup = Setup { pools: 1, threads: 3, virtual_cpus: None, crossing: false };
            let result = within(move || run_policy(Arc::new(PanicAt::new(thread_at, enter_at)), setup, 0.05));
            let e = result.unwrap_or_else(|e| panic!("thread {thread_at} enter {enter_at}: {e}"));
            let e = e.unwrap_err();
            assert!(e.starts_with("1 short-lived thread(s) and 0 pool thread(s) panicked"), "{e}");
        }
    }

    /// The crossing configuration's thread count comes from the library: registering until the mode flips gives
    /// max_cids + 1 = min(A + A/4, possible) + 1, also where A < possible (A = 8 of 16: 11, where the old
    /// "cores + 1" = 9 would stay per-task); and a run of it on this machine crosses both ways.
    #[test]
    fn the_crossing_configuration_crosses_both_ways() {
        let group = |possible, allowed| {
            Group::builder().virtual_cpus(possible).cpus_virtual(0..allowed).build().expect("virtual group")
        };
        assert_eq!(per_cpu_threshold(group(8, 8)), Ok(9));
        assert_eq!(per_cpu_threshold(group(16, 8)), Ok(11));
        assert_eq!(per_cpu_threshold(group(4, 2)), Ok(3));
        assert_eq!(per_cpu_threshold(group(1, 1)), Ok(2));
        let cfg = parse(&[]).unwrap().unwrap();
        let setup = cfg.setups[1];
        assert!(setup.crossing && setup.pools == 1, "{setup:?}");
        assert_eq!(setup.threads, per_cpu_threshold(Group::new()).unwrap());
        let out = run_one(POLICIES.len() - 1, setup, 0.1).unwrap();
        assert!(crossed_both_ways(std::slice::from_ref(&out)), "{out:?}");
        assert!(!crossed_both_ways(&[]) && !crossed_both_ways(&[Outcome { switches: Some((1, 0)), ..out }]));
        // The report's line counts the runs that crossed, whether all did or not; no crossing setup, no line.
        let one_way = Outcome { switches: Some((1, 0)), ..out.clone() };
        let plain = Setup { crossing: false, ..setup };
        let results = vec![vec![vec![out.clone(), out.clone()]], vec![vec![out, one_way]]];
        assert_eq!(
            crossings(&[plain, setup], &results).unwrap(),
            format!("mmcid runs that crossed into per-CPU mode and back: {} 1 of 2", setup.label())
        );
        assert_eq!(crossings(&[plain], &results[..1]), None);
    }

    /// The lazy policies' periodic compaction runs under thread churn, where each thread enters only twice: a
    /// run longer than the 100 ms period scans (with the clock checked only every 256th enter of a thread, it
    /// never did, and lazy-all and lazy-visited measured the same thing). A scan needs some thread's first enter
    /// to fall after the period, so a loaded machine that stalls the churn for 200 ms gets up to 5 tries; the old
    /// trigger scanned in none.
    #[test]
    fn lazy_policies_scan_under_churn() {
        let setup = Setup { pools: 2, threads: 3, virtual_cpus: None, crossing: false };
        for name in ["lazy-all", "lazy-visited"] {
            let mut outs = Vec::new();
            while outs.len() < 5 {
                let out = run_one(common::policy_index(name).unwrap(), setup, 0.3).unwrap();
                let scanned = out.scans.is_some_and(|n| n >= 1);
                outs.push(out);
                if scanned {
                    break;
                }
            }
            assert!(outs.last().is_some_and(|o| o.scans.is_some_and(|n| n >= 1)), "{name}: {outs:?}");
        }
    }

    #[test]
    fn policies_picks_a_subset_in_table_order() {
        let cfg = parse(&["--policies", "none,lazy-all,mmcid"]).unwrap().unwrap();
        assert_eq!(cfg.policies, [0, 3, 5]);
        assert_eq!(compare_runs(cfg.setups.len(), cfg.repeats, cfg.policies.len()), Some(3 * 11 * 3));
        assert!(parse(&["--policies", "none,mmcid", "--policy", "none"]).is_err());
        assert!(parse(&["--policies", "lazy-all,mmcid"]).unwrap_err().contains("none"));
    }

    #[test]
    fn limits_are_inclusive() {
        let cfg = parse(&["-p", "4096", "-t", "1", "--virtual-cpus", "65536"]).unwrap().unwrap();
        assert_eq!((cfg.setups[0].pools, cfg.setups[0].virtual_cpus), (4096, Some(MAX_VIRTUAL_CPUS)));
        assert!(parse(&["-p", "4097", "-t", "1"]).is_err(), "4097 pool threads + 4097 short-lived ones");
        assert!(parse(&["-p", "64", "-t", "127"]).is_ok());
        assert!(parse(&["-p", "64", "-t", "128"]).is_err());
        let e = parse(&["--virtual-cpus", "18446744073709551615"]).unwrap_err();
        assert!(e.contains("65536"), "{e}");
    }

    /// Spawn failures and timed-out waits of a comparison reach the report (a warning naming the cell) and the
    /// JSON (every run's count).
    #[test]
    fn failures_and_timeouts_are_reported_in_comparisons() {
        let cfg = parse(&["--policies", "none,mmcid", "-p", "1", "-t", "1", "--repeats", "2"]).unwrap().unwrap();
        let names = common::policy_names(&cfg.policies);
        let labels: Vec<String> = cfg.setups.iter().map(Setup::label).collect();
        let mut results = vec![vec![vec![Outcome::default(); 2]; 2]];
        assert_eq!(troubles(&labels, &names, &results), None);
        results[0][1][1] = Outcome { failures: 3, timeouts: 1, ..Outcome::default() };
        let line = troubles(&labels, &names, &results).unwrap();
        assert!(line.starts_with("WARNING") && line.ends_with(": 1x1 mmcid 3/1"), "{line}");
        let thr = throughputs(&results);
        let paired = vec![vec![None; 2]];
        let body = json_body(&cfg, &results, &thr, &paired, Verdict::TooFewRepeats, 2);
        assert!(body.contains("\"runs_failures\":[0,3],\"runs_timeouts\":[0,1]"), "{body}");
        assert!(body.contains("\"runs_failures\":[0,0],\"runs_timeouts\":[0,0]"), "{body}");
    }

    /// The chart: a cost bar per policy but none (the baseline) and a rate bar per policy, per configuration,
    /// written through --svg's file; --svg is an error with a single --policy run.
    #[test]
    fn the_chart_draws_every_policy() {
        let e = parse(&["--policy", "mmcid", "--svg", "x.svg"]).unwrap_err();
        assert!(e.starts_with("--svg applies only to --compare"), "{e}");
        let cfg = parse(&["--policies", "none,bitmap,mmcid", "-p", "3", "-t", "2", "--svg", "x.svg"]).unwrap().unwrap();
        assert_eq!(cfg.svg.as_deref(), Some("x.svg"));
        let thr = vec![vec![vec![100.0, 110.0], vec![90.0, 95.0], vec![99.0, 108.0]]];
        let paired: Vec<Vec<Option<MedianCi>>> =
            thr.iter().map(|row| row.iter().map(|v| paired_ci(v, &row[0], throughput_cost_pct)).collect()).collect();
        let path = std::env::temp_dir().join(format!("mmcid-thread-pools-chart-{}.svg", std::process::id()));
        let path = path.to_str().unwrap();
        chart_of(&cfg, &thr, &paired, 2, "footer line".into()).write(OutFile::create("--svg", path).unwrap()).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        std::fs::remove_file(path).unwrap();
        for text in ["none", "bitmap", "mmcid", "3x2", "footer line", "threads created per second"] {
            assert!(svg.contains(text), "no {text:?} in the chart");
        }
    }

    /// `switches_to_per_cpu` / `_task` mean one run's switches wherever they appear (a single run's JSON); a
    /// comparison writes every run's under `runs_` and their sums under `_total`.
    #[test]
    fn switch_counts_in_json_are_per_run_or_named_totals() {
        let cfg = parse(&["--policies", "none,mmcid", "-p", "1", "-t", "1", "--repeats", "2"]).unwrap().unwrap();
        let mut results = vec![vec![vec![Outcome::default(); 2]; 2]];
        results[0][1][0].switches = Some((3, 2));
        results[0][1][1].switches = Some((5, 4));
        let thr = throughputs(&results);
        let body = json_body(&cfg, &results, &thr, &[vec![None; 2]], Verdict::TooFewRepeats, 2);
        assert!(
            body.contains(
                "\"runs_switches_to_per_cpu\":[3,5],\"runs_switches_to_per_task\":[2,4],\
                 \"switches_to_per_cpu_total\":8,\"switches_to_per_task_total\":6"
            ),
            "{body}"
        );
        assert!(!body.contains("\"switches_to_per_cpu\":"), "{body}");
    }

    #[test]
    fn json_has_no_nan_or_inf_for_a_zero_baseline() {
        let cfg = parse(&["--seconds", "1e-300", "--repeats", "5"]).unwrap().unwrap();
        let n = POLICIES.len();
        // No thread created in any run (0 threads/s): every percentage versus `none` divides by zero.
        let results = vec![vec![vec![Outcome::default(); 5]; n]; cfg.setups.len()];
        let thr = throughputs(&results);
        let paired: Vec<Vec<Option<MedianCi>>> =
            thr.iter().map(|row| row.iter().map(|v| paired_ci(v, &row[0], throughput_cost_pct)).collect()).collect();
        let body = json_body(&cfg, &results, &thr, &paired, Verdict::TooFewRepeats, 2);
        for bad in ["NaN", "inf"] {
            assert!(!body.contains(bad), "{bad} in {body}");
        }
        assert!(body.contains("\"median_thr_per_s\":0.0,\"vs_none_pct\":null"), "{body}");
        assert!(body.contains("\"seconds\":0.000"), "{body}");
        assert_eq!(json_seconds(0.2), "0.2");
        assert_eq!(json_seconds(5.0), "5");
        assert_eq!(json_seconds(0.125), "0.125");
    }
}
