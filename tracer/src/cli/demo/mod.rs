//! `tracer demo`: the built-in synthetic inference server under one injected cause (a
//! scenario), the tracer attached with uprobes on the server's request markers, and the
//! verdict set against the cause that was injected.

mod gpu;
mod scenario;

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Args;
use serde::Serialize;

pub use scenario::Scenario;

use super::{RecordArgs, runtime};
use crate::{
    analysis::{Report, analyze},
    recording::{Recording, requests::RequestSpan},
    render,
    session::record,
    sources::{
        clock::monotonic_ns,
        ebpf::requests::{Marker, RequestMarkers},
        privileges,
        process::Target,
    },
    units::dur,
    workload::{limit::CpuLimit, server::set_affinity},
};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The cause to inject.
    #[arg(long, value_enum, default_value = "cpu-contention")]
    pub scenario: Scenario,
    /// How long to record once the disturbance is on.
    #[arg(long, short, default_value = "5s", value_parser = crate::units::parse_duration)]
    pub duration: Duration,
    #[command(flatten)]
    pub record: RecordArgs,
}

/// How long the server runs undisturbed first, to measure its normal latency.
pub(super) const BASELINE: Duration = Duration::from_secs(2);
/// The cfs-throttle scenario's quota. The server needs about 0.33 CPU (300 requests/s x 1 ms,
/// plus its dispatcher); a batch job in the same cgroup, on another CPU, takes whatever the
/// server leaves, so the cgroup runs out of quota about 60 ms into every 100 ms period and
/// its threads, the server's included, wait out the rest. The server keeps up on average (it
/// gets more than it needs), so the latency tail is the throttling, not a growing backlog.
const THROTTLE_CPUS: f64 = 0.8;

/// Kills and reaps a child when dropped, so no demo process outlives the demo.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Makes a demo child die with the demo, even one that ends without unwinding (a signal after
/// the window exits at once, signals.rs): the disturbances are CPU hogs.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

fn spawn_self(args: &[String]) -> Result<Reaped> {
    let exe = std::env::current_exe().context("locating the tracer binary")?;
    let child = die_with_parent(Command::new(exe).args(args).stdin(Stdio::null()))
        .spawn()
        .with_context(|| format!("starting `tracer {}`", args.join(" ")))?;
    Ok(Reaped(child))
}

#[derive(Debug, Clone, Copy, Serialize, schemars::JsonSchema)]
pub struct LatencyStats {
    pub requests: usize,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// Latency quantiles of the requests that arrived in `[from, to)`.
pub fn latency_stats(spans: &[RequestSpan], from: u64, to: u64) -> Option<LatencyStats> {
    let mut lat: Vec<u64> = spans
        .iter()
        .filter(|s| s.start_ns >= from && s.start_ns < to)
        .map(|s| s.wall_ns())
        .collect();
    if lat.is_empty() {
        return None;
    }
    lat.sort_unstable();
    let at = |q: f64| lat[((q * lat.len() as f64).ceil() as usize).clamp(1, lat.len()) - 1];
    Some(LatencyStats {
        requests: lat.len(),
        p50_ns: at(0.50),
        p99_ns: at(0.99),
        max_ns: *lat.last().expect("non-empty"),
    })
}

/// The `demo --json` document: the summary, and beside it how the scenario went.
#[derive(Debug, Serialize, schemars::JsonSchema)]
struct DemoReport<'a> {
    #[serde(flatten)]
    report: &'a Report,
    demo: &'a DemoPart,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DemoPart {
    pub scenario: Scenario,
    /// What the injected cause must produce.
    pub expected_primary: crate::analysis::verdict::Primary,
    pub expected_mechanism: Option<&'static str>,
    /// The verdict matched it.
    pub correct: bool,
    /// The server's own latency log, before the disturbance and during the recording.
    pub latency_baseline: Option<LatencyStats>,
    pub latency_recorded: Option<LatencyStats>,
    /// A process the scenario did not start that the verdict named as the server's main
    /// preemptor (a kernel thread doing reclaim, another tenant): the run measured a real
    /// disturbance, but not the injected one, so it says nothing about the scenario's
    /// accuracy. Scenario runners repeat such a run rather than score it.
    pub interference: Option<Interference>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Interference {
    pub pid: u32,
    pub comm: String,
    /// Its share of the server's run-queue waiting.
    pub wait_share: f64,
}

/// The JSON Schema of the `demo --json` document (docs/demo.schema.json is this, committed).
pub fn json_schema() -> String {
    render::schema_of::<DemoReport<'static>>(
        "tracer demo --json: the summary and the scenario's outcome",
    )
}

/// What a scenario run produced, for printing.
pub struct Outcome {
    pub rec: Recording,
    /// The recording analyzed once, for the verdict's check and the output.
    pub report: Report,
    pub part: DemoPart,
}

pub fn run(args: DemoArgs) -> Result<()> {
    privileges::check()?;
    args.record.check_inputs_and_outputs(false)?;
    let out = if args.scenario.gpu() {
        gpu::run(&args)?
    } else {
        run_cpu(&args)?
    };
    let mut failures = super::emit::Failures::default();
    failures.keep(if args.record.json {
        super::emit::stdout_json(&DemoReport {
            report: &out.report,
            demo: &out.part,
        })
    } else {
        let text = render::text::render(&out.report) + &part_text(&out.part, &out.report);
        super::emit::stdout(&crate::recording::terminal_safe(&text))
    });
    failures.keep(super::write_outputs(
        &out.rec,
        &out.report,
        &args.record.outputs,
    ));
    failures.into_result()
}

fn part_text(p: &DemoPart, r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("\nRequest latency, as the server measured it:\n");
    let mut line = |name: &str, s: Option<LatencyStats>| match s {
        Some(s) => writeln!(
            out,
            "  {name:<26} p50 {:>9}  p99 {:>9}  max {:>9}  ({} requests)",
            dur(s.p50_ns),
            dur(s.p99_ns),
            dur(s.max_ns),
            s.requests
        ),
        None => writeln!(out, "  {name:<26} no requests completed"),
    };
    let _ = line("before the disturbance", p.latency_baseline);
    let _ = line("during the recording", p.latency_recorded);
    let _ = writeln!(
        out,
        "\nScenario {}: expected {}{}, got {} -> {}",
        p.scenario.name(),
        p.expected_primary.name(),
        p.expected_mechanism
            .map_or(String::new(), |m| format!(" ({m})")),
        r.verdict.primary.name(),
        if p.correct { "correct" } else { "WRONG" }
    );
    if let Some(i) = &p.interference {
        let _ = writeln!(
            out,
            "  (the server waited mostly behind {} (PID {}), which the scenario did not start: \
             this run measured another disturbance than the injected one)",
            i.comm, i.pid
        );
    }
    out
}

/// Twice the L2 of `cpu`, within [256 KiB, half its LLC].
fn cache_thrash_working_set(cpu: u32) -> usize {
    use crate::sources::topology::cache_size;
    let l2 = cache_size(cpu, 2).unwrap_or(512 << 10);
    let llc = cache_size(cpu, 3).unwrap_or(8 << 20);
    (2 * l2).clamp(256 << 10, (llc / 2).max(256 << 10))
}

/// The CPUs the server runs on, and the others (for the tracer itself and the migrations).
fn cpu_plan() -> (usize, Vec<usize>) {
    let online = aya::util::online_cpus().unwrap_or_default();
    let mut cpus: Vec<usize> = online.iter().map(|&c| c as usize).collect();
    if cpus.is_empty() {
        cpus.push(0);
    }
    let server = cpus[0];
    (server, cpus[1..].to_vec())
}

fn run_cpu(args: &DemoArgs) -> Result<Outcome> {
    let say = |msg: String| {
        if !args.record.quiet {
            eprintln!("demo: {msg}");
        }
    };
    let (cpu, others) = cpu_plan();
    if matches!(
        args.scenario,
        Scenario::MigrationStorm | Scenario::CfsThrottle
    ) && others.is_empty()
    {
        anyhow::bail!(
            "the {} scenario needs at least two online CPUs",
            args.scenario.name()
        );
    }
    // Keep the tracer off the server's CPU: only the injected cause should be there.
    if !others.is_empty() {
        set_affinity(0, &others)?;
    }
    let log: PathBuf =
        std::env::temp_dir().join(format!("tracer-demo-{}.jsonl", std::process::id()));
    let total = BASELINE + args.duration + Duration::from_secs(1);
    // Cache thrash hurts only work that keeps data in the shared cache: in that scenario each
    // request walks a working set of its own, twice the private L2 (so it lives in the LLC)
    // and at most half the LLC, at a rate that leaves room for slower, cold-cache requests.
    // Under contention the worker gets a third of its CPU (two hogs beside it), so the rate
    // there leaves it keeping up on average: the tail is then the waiting, not a backlog.
    let (working_set, rate) = match args.scenario {
        Scenario::CacheThrash => (cache_thrash_working_set(cpu as u32) >> 10, 200),
        Scenario::CpuContention => (0, 200),
        _ => (0, 300),
    };
    let started = monotonic_ns();
    let server = spawn_self(&[
        "workload".into(),
        // One worker per CPU, as thread-per-core servers run: two on one CPU would make the
        // server its own contention.
        "--workers=1".into(),
        format!("--rate={rate}"),
        "--work-us=1000".into(),
        format!("--working-set-kib={working_set}"),
        format!("--cpus={cpu}"),
        format!("--duration={}ms", total.as_millis()),
        format!("--latency-log={}", log.display()),
    ])?;
    let pid = server.0.id();
    say(format!(
        "scenario {}: a synthetic inference server (PID {pid}) on CPU {cpu}: a dispatcher and \
         a worker, {rate} requests/s, 1 ms of work each{}",
        args.scenario.name(),
        if working_set > 0 {
            format!(" over a {working_set} KiB working set")
        } else {
            String::new()
        }
    ));
    let limit = if args.scenario == Scenario::CfsThrottle {
        Some(CpuLimit::create(pid)?)
    } else {
        None
    };
    std::thread::sleep(BASELINE);
    let baseline_end = monotonic_ns();
    let disturb_for = format!(
        "--duration={}ms",
        (args.duration + Duration::from_secs(1)).as_millis()
    );
    let _disturbance = match args.scenario {
        Scenario::Quiet => {
            say("nothing injected".into());
            None
        }
        Scenario::CpuContention => {
            say(format!("injected: two CPU hogs on CPU {cpu}"));
            Some(spawn_self(&[
                "disturb".into(),
                "spin".into(),
                "--threads=2".into(),
                format!("--cpus={cpu}"),
                disturb_for,
            ])?)
        }
        Scenario::CfsThrottle => {
            let l = limit.as_ref().expect("created above");
            let batch = spawn_self(&[
                "disturb".into(),
                "spin".into(),
                "--threads=1".into(),
                format!("--cpus={}", others[0]),
                disturb_for,
            ])?;
            l.add(batch.0.id())?;
            l.set(THROTTLE_CPUS)?;
            say(format!(
                "injected: a CPU quota of {THROTTLE_CPUS} CPUs on the server's cgroup {}, shared \
                 with a batch job on CPU {}",
                l.path().display(),
                others[0]
            ));
            Some(batch)
        }
        Scenario::MigrationStorm => {
            let to = others[0];
            say(format!(
                "injected: the server's threads moved between CPUs {cpu} and {to} every ~2 ms"
            ));
            Some(spawn_self(&[
                "disturb".into(),
                "migrate".into(),
                format!("--pid={pid}"),
                format!("--cpus={cpu},{to}"),
                "--every=2ms".into(),
                disturb_for,
            ])?)
        }
        Scenario::CacheThrash => {
            // On other CPUs that share the server's LLC but not its CPU: cache thrash without
            // contention (at idle priority the scheduler still gives it slices on a shared
            // CPU). Up to four, so that a large LLC is refilled between two requests.
            use crate::sources::topology::{cache_size, read};
            let llc = read(&[cpu as u32]).first().map(|p| p.llc);
            let mut at: Vec<usize> = others
                .iter()
                .copied()
                .filter(|&o| read(&[o as u32]).first().map(|p| p.llc) == llc)
                .take(4)
                .collect();
            if at.is_empty() {
                at.push(others.first().copied().unwrap_or(cpu));
            }
            // Larger than the LLC, or it is not thrash: 256 MiB fits in some servers' L3.
            let mib = ((2 * cache_size(cpu as u32, 3).unwrap_or(0)) >> 20).max(256);
            let list = at
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            say(format!(
                "injected: neighbours streaming {mib} MiB on CPUs {list}"
            ));
            Some(spawn_self(&[
                "disturb".into(),
                "stream".into(),
                format!("--mib={mib}"),
                format!("--cpus={list}"),
                disturb_for,
            ])?)
        }
        Scenario::GpuSaturation | Scenario::GpuSyncStall => {
            unreachable!("GPU scenarios run in gpu.rs")
        }
    };
    let target = Target::resolve(pid)?;
    let mut opts = args.record.session_options(Some(args.duration));
    let exe = std::env::current_exe()?.display().to_string();
    let marker = |symbol: &str| Marker {
        binary: exe.clone(),
        symbol: symbol.into(),
    };
    opts.probes.markers = Some(RequestMarkers {
        start: marker("tracer_request_start"),
        end: marker("tracer_request_end"),
        id_arg: Some(0),
    });
    opts.keep_timeline = true;
    let rec = runtime()?.block_on(record(&target, &opts, || Ok(())))?;
    let own = [pid, _disturbance.as_ref().map_or(0, |d| d.0.id())];
    drop(_disturbance);
    let mut server = server;
    let _ = server.0.wait();
    drop(limit);
    let spans = read_log(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    // Skip the first half second: thread start-up is not the server's steady state.
    let baseline = latency_stats(&spans, started + 500_000_000, baseline_end);
    let recorded = latency_stats(&spans, rec.start_ns, rec.end_ns);
    Ok(outcome(args.scenario, rec, &own, baseline, recorded))
}

/// The verdict set against the scenario; `own`: the processes the scenario started.
pub fn outcome(
    scenario: Scenario,
    rec: Recording,
    own: &[u32],
    latency_baseline: Option<LatencyStats>,
    latency_recorded: Option<LatencyStats>,
) -> Outcome {
    let pmu = rec.capabilities.pmu.llc_available;
    let report = analyze(&rec);
    let verdict = &report.verdict;
    let interference = (verdict.primary == crate::analysis::verdict::Primary::Scheduling)
        .then(|| crate::analysis::verdict::top_neighbour(&report.summary))
        .flatten()
        .filter(|n| {
            n.kind != crate::analysis::neighbours::NeighbourKind::Target
                && !n.processes.iter().any(|p| own.contains(p))
        })
        .map(|n| Interference {
            pid: n.processes.first().copied().unwrap_or(0),
            comm: n.name.clone(),
            wait_share: n.wait_share,
        });
    let (expected_primary, expected_mechanism) = scenario.expected(pmu);
    Outcome {
        part: DemoPart {
            scenario,
            expected_primary,
            expected_mechanism,
            correct: scenario::check(scenario, verdict, pmu),
            latency_baseline,
            latency_recorded,
            interference,
        },
        rec,
        report,
    }
}

/// Reads the server's latency log (the format `--latencies` reads).
pub fn read_log(path: &std::path::Path) -> Result<Vec<RequestSpan>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let set = crate::recording::requests::parse_latency_log(&text, 0, (0, u64::MAX))?;
    Ok(set.spans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_quantiles_use_only_the_window() {
        let spans: Vec<RequestSpan> = (0..100u64)
            .map(|i| RequestSpan {
                start_ns: i * 10,
                end_ns: i * 10 + i + 1,
                tid: 1,
                id: None,
            })
            .collect();
        let s = latency_stats(&spans, 0, 1000).unwrap();
        assert_eq!(s.requests, 100);
        assert_eq!(s.p50_ns, 50);
        assert_eq!(s.p99_ns, 99);
        assert_eq!(s.max_ns, 100);
        let s = latency_stats(&spans, 500, 600).unwrap();
        assert_eq!(s.requests, 10);
        assert_eq!(s.max_ns, 60);
        assert!(latency_stats(&spans, 5000, 6000).is_none());
    }
}
