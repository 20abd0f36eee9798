//! `cargo xtask bench`: what attaching the tracer costs, against the tools people would use
//! instead, on the same machine in the same run (BENCHMARKS.md).
//!
//! The workload is `perf bench sched pipe -T` pinned to one CPU: two threads of one process
//! passing a token, hundreds of thousands of context switches per second, the worst case for
//! anything on the scheduler tracepoints. Every observer is pinned to another CPU, so what the
//! benchmark loses is the in-kernel cost on its own CPU. The configurations run interleaved,
//! round after round, so a slow stretch of this noisy VM hits all of them alike; the medians
//! and the per-round ratios to the unobserved run are reported and every raw run is kept.
//!
//! BPF run statistics (kernel.bpf_stats_enabled) cost two clock reads per program run, so
//! they are taken in separate runs after the timed rounds, never in a timed one.
//!
//! A second case (`threads.rs`) measures the tracer's own work per thread: its time after the
//! window, peak RSS and CPU on processes of 12,000 and 20,000 threads.

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use crate::{as_root, cargo, run, setup, workspace_root};

mod stats;
mod threads;
mod watch;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Interleaved rounds of every configuration.
    #[arg(long, default_value_t = 7)]
    pub rounds: u32,
    /// Round trips of `perf bench sched pipe` per run (two context switches each).
    #[arg(long, default_value_t = 400_000)]
    pub loops: u64,
    /// One short round: checks that the bench runs (CI), measures nothing worth quoting.
    #[arg(long)]
    pub quick: bool,
    /// Only the many-threads case (the tracer on processes of 12,000 and 20,000 threads).
    #[arg(long)]
    pub many_threads_only: bool,
    /// Only the watch case (`tracer watch`'s cost and a soak with a flight recorder).
    #[arg(long)]
    pub watch_only: bool,
    /// Length of the watch case's soak, in seconds.
    #[arg(long, default_value_t = 600)]
    pub soak_s: u64,
    /// Measure this tracer binary instead of target/release/tracer (to compare two builds).
    #[arg(long)]
    pub tracer: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    /// Nothing attached.
    Baseline,
    /// `tracer attach` on a sleeping process: every event takes the early exit.
    TracerUnrelated,
    /// `tracer attach` on the benchmark itself: every switch on its CPU is a target event.
    TracerOnBench,
    /// `perf sched record -a`: every scheduler event of the machine to a file.
    PerfSched,
    /// bpftrace's runqlat.bt: a run-queue latency histogram, system-wide.
    Runqlat,
    /// Empty tp_btf programs on the tracer's seven tracepoints (`tracer floor`): what any
    /// program there costs on this kernel before doing anything.
    EmptyProbes,
}

const CONFIGS: [Config; 6] = [
    Config::Baseline,
    Config::EmptyProbes,
    Config::TracerUnrelated,
    Config::TracerOnBench,
    Config::PerfSched,
    Config::Runqlat,
];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Self::Baseline => "nothing attached",
            Self::TracerUnrelated => "tracer, unrelated PID",
            Self::TracerOnBench => "tracer, on the benchmark",
            Self::PerfSched => "perf sched record -a",
            Self::Runqlat => "bpftrace runqlat.bt",
            Self::EmptyProbes => "empty BPF programs (floor)",
        }
    }
}

/// Where things run: the benchmark on the last CPU, every observer on the first.
struct Cpus {
    bench: String,
    observer: String,
}

fn cpus() -> Cpus {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    Cpus {
        bench: (n - 1).to_string(),
        observer: "0".into(),
    }
}

struct Ctx {
    tracer: PathBuf,
    runqlat: Option<PathBuf>,
    cpus: Cpus,
    loops: u64,
    dir: PathBuf,
}

impl Ctx {
    fn bench_cmd(&self) -> Vec<String> {
        [
            "taskset",
            "-c",
            &self.cpus.bench,
            "perf",
            "bench",
            "sched",
            "pipe",
            "-T",
            "-l",
            &self.loops.to_string(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// A sleeping process, and `tracer attach` on it from the observer CPU: every event the
    /// tracer sees takes its early exit. The caller kills the sleeper.
    fn attach_unrelated(&self) -> Result<(Child, Command)> {
        self.attach_sleeping_tree(1)
    }

    /// The same with a target set of `n` processes: a shell and the `n - 1` sleepers it forked,
    /// attached by the shell's PID (the tree follows). The caller kills the shell's group.
    fn attach_sleeping_tree(&self, n: usize) -> Result<(Child, Command)> {
        use std::os::unix::process::CommandExt as _;
        let script = format!("for i in $(seq {}); do sleep 3600 & done; wait", n - 1);
        let sleeper = if n == 1 {
            Command::new("sleep").arg("3600").spawn()?
        } else {
            let c = Command::new("sh")
                .args(["-c", &script])
                .process_group(0)
                .spawn()?;
            // The tree is whole before the tracer lists it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while count_children(c.id()) < n - 1 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            c
        };
        let mut c = self.observer(&self.tracer);
        c.args(["attach", "--pid", &sleeper.id().to_string()])
            .args(["--duration", "1h", "--json"]);
        Ok((sleeper, c))
    }

    /// A command pinned to the observer CPU, as root.
    fn observer(&self, program: &Path) -> Command {
        let mut c = as_root("taskset");
        c.args(["-c", &self.cpus.observer]).arg(program);
        c
    }
}

/// The children of `pid` now.
fn count_children(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map_or(0, |c| c.split_whitespace().count())
}

/// Kills a process and its group (a sleeping tree's shell and its sleepers).
fn kill_group(mut c: Child) {
    // SAFETY: kill(2) on the group the child leads; ESRCH when it leads none.
    unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
    let _ = c.kill();
    let _ = c.wait();
}

/// One timed run.
#[derive(Debug, Clone)]
struct Run {
    config: Config,
    round: u32,
    usecs_per_op: f64,
    /// The tracer's summary (its --json), for the tracer configurations.
    tracer: Option<Value>,
    /// Bytes perf sched record wrote.
    perf_data_bytes: Option<u64>,
}

fn usecs_per_op(stdout: &str) -> Result<f64> {
    stdout
        .lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_suffix("usecs/op")
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .with_context(|| format!("no usecs/op in the benchmark's output:\n{stdout}"))
}

fn output_of(mut c: Command, what: &str) -> Result<String> {
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts an observer and waits until its stderr or stdout says it is attached; when it ends
/// before that, fails with what it printed.
fn start_observer(mut c: Command, ready: &str, from_stdout: bool) -> Result<Child> {
    c.stdin(Stdio::null());
    if from_stdout {
        c.stdout(Stdio::piped()).stderr(Stdio::inherit());
    } else {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = c.spawn().context("starting an observer")?;
    let stream: Box<dyn std::io::Read + Send> = if from_stdout {
        Box::new(child.stdout.take().expect("piped"))
    } else {
        Box::new(child.stderr.take().expect("piped"))
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let ready = ready.to_string();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stream).lines();
        let mut sent = false;
        let mut said = String::new();
        // Keep reading after the mark, so the observer never blocks on a full pipe.
        while let Some(Ok(line)) = lines.next() {
            if !sent && line.contains(&ready) {
                let _ = tx.send(Ok(()));
                sent = true;
            } else if !sent {
                said += &line;
                said.push('\n');
            }
        }
        if !sent {
            let _ = tx.send(Err(said));
        }
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => Ok(child),
        Ok(Err(said)) => {
            let _ = child.wait();
            bail!("the observer ended before it attached:\n{said}")
        }
        Err(_) => {
            let _ = child.kill();
            bail!("the observer did not attach within 60 s")
        }
    }
}

fn interrupt(child: &Child) {
    let _ = as_root("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
}

/// Interrupts an observer and waits for it to end: again every 5 s (bpftrace 0.17 once sat
/// in epoll_wait after the first SIGINT and ended at the second), killed after 30 s.
fn stop(child: &mut Child) {
    for _ in 0..6 {
        interrupt(child);
        for _ in 0..50 {
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn once(ctx: &Ctx, config: Config, round: u32) -> Result<Run> {
    let bench = ctx.bench_cmd();
    let mut tracer = None;
    let mut perf_data_bytes = None;
    let stdout = match config {
        Config::Baseline => {
            let mut c = Command::new(&bench[0]);
            c.args(&bench[1..]);
            output_of(c, "perf bench")?
        }
        Config::TracerUnrelated => {
            let (mut sleeper, c) = ctx.attach_unrelated()?;
            let obs = start_observer(c, "tracer: recording", false);
            let result = obs.and_then(|mut obs| {
                let mut b = Command::new(&bench[0]);
                b.args(&bench[1..]);
                let out = output_of(b, "perf bench");
                interrupt(&obs);
                let doc = read_json(obs.stdout.take().expect("piped"));
                let _ = obs.wait();
                tracer = Some(doc?);
                out
            });
            let _ = sleeper.kill();
            let _ = sleeper.wait();
            result?
        }
        Config::TracerOnBench => {
            let (doc, out) = tracer_run(ctx, &[], &bench)?;
            tracer = Some(doc);
            out
        }
        Config::PerfSched => {
            let data = ctx.dir.join("perf-sched.data");
            let mut c = ctx.observer(Path::new("perf"));
            c.args(["sched", "record", "-a", "-o"])
                .arg(&data)
                .arg("--")
                .args(&bench);
            let out = output_of(c, "perf sched record")?;
            perf_data_bytes = std::fs::metadata(&data).ok().map(|m| m.len());
            let _ = std::fs::remove_file(&data);
            out
        }
        Config::Runqlat | Config::EmptyProbes => {
            let mut obs = if config == Config::Runqlat {
                let mut c = ctx.observer(Path::new("bpftrace"));
                c.arg(ctx.runqlat.as_ref().context("runqlat.bt not found")?);
                start_observer(c, "Tracing", true)?
            } else {
                let mut c = ctx.observer(&ctx.tracer);
                c.arg("floor");
                start_observer(c, "floor programs attached", false)?
            };
            let mut b = Command::new(&bench[0]);
            b.args(&bench[1..]);
            let out = output_of(b, "perf bench");
            stop(&mut obs);
            out?
        }
    };
    Ok(Run {
        config,
        round,
        usecs_per_op: usecs_per_op(&stdout)?,
        tracer,
        perf_data_bytes,
    })
}

/// bpftrace's runqlat.bt as installed, made to build here: Debian 12's bpftrace 0.17 fails
/// on the script's `#include <linux/sched.h>` (the uapi header needs types it does not
/// define), and the script only takes TASK_RUNNING (0) from it. The probes and maps are
/// untouched.
fn runqlat_script(dir: &Path) -> Result<Option<PathBuf>> {
    let Some(orig) = [
        "/usr/sbin/runqlat.bt",
        "/usr/share/bpftrace/tools/runqlat.bt",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists()) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&orig)?;
    let fixed: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("#include"))
        .map(|l| l.replace("TASK_RUNNING", "0") + "\n")
        .collect();
    let path = dir.join("runqlat.bt");
    std::fs::write(&path, fixed)?;
    Ok(Some(path))
}

/// `tracer run --json [OPTIONS] -- COMMAND` from the observer CPU: its document, and what the
/// command printed before it.
fn tracer_run(ctx: &Ctx, options: &[&str], command: &[String]) -> Result<(Value, String)> {
    let mut c = ctx.observer(&ctx.tracer);
    c.args(["run", "--json", "--quiet"])
        .args(options)
        .arg("--")
        .args(command);
    let out = output_of(c, "tracer run")?;
    // perf bench prints first, then the tracer its JSON document.
    let at = out
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| out.starts_with('{').then_some(0))
        .context("tracer run printed no JSON")?;
    let doc = serde_json::from_str(&out[at..]).context("tracer run's JSON")?;
    Ok((doc, out[..at].to_string()))
}

fn read_json(out: impl std::io::Read) -> Result<Value> {
    serde_json::from_reader(out).context("the tracer's JSON document")
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    if !crate::is_root() {
        bail!(
            "the bench loads BPF programs and turns on BPF run statistics: run it as root \
             (sudo -E cargo xtask bench)"
        );
    }
    setup::ensure()?;
    run(cargo().args(["build", "--release", "-p", "tracer"]))?;
    let (rounds, loops) = if args.quick {
        (1, 20_000)
    } else {
        (args.rounds.max(1), args.loops)
    };
    let dir = workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let runqlat = runqlat_script(&dir)?;
    let ctx = Ctx {
        tracer: args
            .tracer
            .clone()
            .unwrap_or_else(|| workspace_root().join("target/release/tracer")),
        runqlat,
        cpus: cpus(),
        loops,
        dir: dir.clone(),
    };
    if args.many_threads_only {
        let many = threads::many_threads(&ctx, rounds, args.quick)?;
        println!("{}", threads::render(&many));
        return write_doc(
            &dir,
            json!({"machine": stats::machine(), "many_threads": many}),
        );
    }
    let soak = Duration::from_secs(args.soak_s);
    if args.watch_only {
        let w = watch::watch(&ctx, rounds, args.quick, soak)?;
        println!("{}", watch::render(&w));
        return write_doc(&dir, json!({"machine": stats::machine(), "watch": w}));
    }
    let configs: Vec<Config> = CONFIGS
        .into_iter()
        .filter(|c| *c != Config::Runqlat || ctx.runqlat.is_some())
        .collect();
    if ctx.runqlat.is_none() {
        eprintln!("xtask: bpftrace's runqlat.bt not found: that peer is skipped");
    }
    eprintln!(
        "xtask: perf bench sched pipe -T -l {loops} on CPU {}, observers on CPU {}, {rounds} \
         rounds of {} configurations",
        ctx.cpus.bench,
        ctx.cpus.observer,
        configs.len()
    );
    let started = Instant::now();
    let mut runs = Vec::new();
    for round in 1..=rounds {
        // Rotate the order each round: no configuration always follows the same one.
        let k = (round as usize - 1) % configs.len();
        for &config in configs[k..].iter().chain(&configs[..k]) {
            let r = once(&ctx, config, round)?;
            eprintln!(
                "xtask: round {round} {:<26} {:>7.3} usecs/op",
                config.name(),
                r.usecs_per_op
            );
            runs.push(r);
        }
    }
    let base = median(
        runs.iter()
            .filter(|r| r.config == Config::Baseline)
            .map(|r| r.usecs_per_op)
            .collect(),
    );
    let expected = Duration::from_secs_f64(base * 1e-6 * loops as f64);
    let stats = stats::bpf_run_stats(&ctx, expected)?;
    // The highest switch rate this machine gives: the benchmark on every CPU (one CPU tops out
    // below 200k switches/s here), the tracer on it; untimed, for drops and own cost.
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut all = ctx.bench_cmd();
    all[2] = format!("0-{}", n - 1);
    let high_rate = stats::tracer_part(&tracer_run(&ctx, &[], &all)?.0);
    // With a trace file every state change goes through the ring buffer, not only the
    // switch-ins the summary reads: what that costs the reader (untimed).
    let trace = dir.join("bench.trace");
    let with_trace = stats::tracer_part(
        &tracer_run(
            &ctx,
            &["--output", &trace.display().to_string()],
            &ctx.bench_cmd(),
        )?
        .0,
    );
    let _ = std::fs::remove_file(&trace);
    let many = threads::many_threads(&ctx, rounds, args.quick)?;
    let watch = watch::watch(&ctx, rounds, args.quick, soak)?;
    let report = stats::report(
        &stats::runs_json(&runs),
        &configs,
        &stats,
        &high_rate,
        &with_trace,
    );
    let doc = json!({
        "machine": stats::machine(),
        "loops": loops,
        "rounds": rounds,
        "bench_cpu": ctx.cpus.bench,
        "observer_cpu": ctx.cpus.observer,
        "elapsed_s": started.elapsed().as_secs_f64(),
        "runs": stats::runs_json(&runs),
        "bpf_run_stats": stats,
        "high_rate": high_rate,
        "with_trace_file": with_trace,
        "many_threads": many,
        "watch": watch,
        "report": report,
    });
    println!(
        "{}{}",
        stats::render(&doc),
        threads::render(&doc["many_threads"])
    );
    println!("{}", watch::render(&doc["watch"]));
    write_doc(&dir, doc)
}

/// Keeps the raw runs in `dir/bench-SECONDS.json`.
fn write_doc(dir: &Path, doc: Value) -> Result<()> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let file = dir.join(format!("bench-{secs}.json"));
    std::fs::write(&file, serde_json::to_string_pretty(&doc)?)?;
    println!("raw runs: {}", file.display());
    Ok(())
}
