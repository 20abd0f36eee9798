//! The CPU scenarios: the built-in server (this binary, `tracer workload`) and the disturbance
//! each scenario injects (`tracer disturb`, a cgroup quota, affinity changes), recorded and
//! set against the cause.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Result;

use super::common::{BASELINE, DemoArgs, Outcome, Reaped, outcome, read_log, spawn_self};
use super::scenario::Scenario;
use crate::{
    session::{SessionOptions, record, runtime},
    sources::topology::set_affinity,
    sources::{
        clock::monotonic_ns,
        ebpf::requests::{Marker, RequestMarkers},
        process::Target,
        targets::Targets,
    },
    workload::limit::CpuLimit,
};

/// The cfs-throttle scenario's quota. The server needs about 0.33 CPU (300 requests/s x 1 ms,
/// plus its dispatcher); a batch job in the same cgroup, on another CPU, takes whatever the
/// server leaves, so the cgroup runs out of quota about 60 ms into every 100 ms period and
/// its threads, the server's included, wait out the rest. The server keeps up on average (it
/// gets more than it needs), so the latency tail is the throttling, not a growing backlog.
const THROTTLE_CPUS: f64 = 0.8;

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

pub fn run(args: &DemoArgs) -> Result<Outcome> {
    let say = |msg: String| {
        if !args.record.quiet {
            eprintln!("demo: {msg}");
        }
    };
    let (cpu, others) = cpu_plan();
    let scenario = args.scenario.base();
    if matches!(scenario, Scenario::MigrationStorm | Scenario::CfsThrottle) && others.is_empty() {
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
    let (working_set, rate) = request_load(scenario, cpu);
    let started = monotonic_ns();
    let argv = server_argv(args, cpu, &others, working_set, rate, &log);
    let server = spawn_self(&argv)?;
    let pid = server.0.id();
    let engine = introduce_server(args, pid, cpu, working_set, rate, &say)?;
    let limit = if scenario == Scenario::CfsThrottle {
        Some(CpuLimit::create(pid)?)
    } else {
        None
    };
    std::thread::sleep(BASELINE);
    let baseline_end = monotonic_ns();
    let target = Target::resolve(pid)?;
    let opts = session_options(args)?;
    let mut disturbance = None;
    let mut server = server;
    let rec = runtime()?
        .block_on(record(
            &Targets::of(target.clone(), !args.record.no_children),
            &opts,
            || {
                disturbance = inject(
                    scenario,
                    (pid, cpu, &others),
                    limit.as_ref(),
                    args.duration,
                    &say,
                )?;
                Ok(())
            },
        ))
        .map_err(|e| match server.0.try_wait() {
            Ok(Some(status)) => e.context(format!("the demo server (PID {pid}) ended: {status}")),
            _ => e,
        })?;
    let own = [pid, disturbance.as_ref().map_or(0, |d| d.0.id())];
    drop(disturbance);
    // Stopped now: it serves what is queued, writes its log and exits; a worker that needs
    // longer than `stop` allows has fallen far behind what its calibration measured.
    let finished = server.stop();
    drop(limit);
    finished?;
    let spans = read_log(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    Ok(outcome(
        args.scenario,
        rec,
        &own,
        engine,
        &spans,
        (started, baseline_end),
        &[],
    ))
}

/// The server's load in `scenario`: each request's working set (KiB), and requests per second.
fn request_load(scenario: Scenario, cpu: usize) -> (usize, u32) {
    // Cache thrash hurts only work that keeps data in the shared cache: in that scenario each
    // request walks a working set of its own, twice the private L2 (so it lives in the LLC)
    // and at most half the LLC, at a rate that leaves room for slower, cold-cache requests.
    // Under contention the worker gets a third of its CPU (two hogs beside it), so the rate
    // there leaves it keeping up on average: the tail is then the waiting, not a backlog.
    match scenario {
        Scenario::CacheThrash => (cache_thrash_working_set(cpu as u32) >> 10, 200),
        Scenario::CpuContention => (0, 200),
        _ => (0, 300),
    }
}

/// The `tracer workload` command line of the demo server, on `cpu`, logging to `log`.
fn server_argv(
    args: &DemoArgs,
    cpu: usize,
    others: &[usize],
    working_set: usize,
    rate: u32,
    log: &Path,
) -> Vec<String> {
    // At most: the demo stops it (SIGINT) once the recording is over; the allowance covers
    // attaching, which under emulation has taken longer than the window itself.
    let total = BASELINE + args.duration + Duration::from_secs(120);
    // A two-process service: the front end admits on another CPU (the engine's CPU is where
    // the cause is injected), the engine on the server's.
    let shape: Vec<String> = match (args.scenario.multiprocess(), others.first()) {
        (false, _) => vec![],
        (true, Some(o)) => vec!["--engine-process".into(), format!("--front-end-cpus={o}")],
        (true, None) => vec!["--engine-process".into()],
    };
    let mut argv: Vec<String> = vec![
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
    ];
    argv.extend(shape);
    if args.scenario.base() == Scenario::LockContention {
        // The holder works on another CPU: the worker then waits for the lock alone, not for
        // its CPU too.
        argv.push(format!("--lock-after={}ms", BASELINE.as_millis()));
        if let Some(o) = others.first() {
            argv.push(format!("--lock-cpus={o}"));
        }
    }
    argv
}

/// Says what the server `pid` is; of a two-process service, finds and names its engine.
fn introduce_server(
    args: &DemoArgs,
    pid: u32,
    cpu: usize,
    working_set: usize,
    rate: u32,
    say: &dyn Fn(String),
) -> Result<Option<u32>> {
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
    Ok(if args.scenario.multiprocess() {
        let e = super::common::engine_of(pid)?;
        say(format!(
            "the server is two processes: a front end (PID {pid}) admitting the requests, \
             and an engine (PID {e}) serving them on CPU {cpu}; attached by the front end's PID"
        ));
        Some(e)
    } else {
        None
    })
}

/// The demo's recording options, with the server's request markers and the timeline kept.
fn session_options(args: &DemoArgs) -> Result<SessionOptions> {
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
    Ok(opts)
}

/// Starts the scenario's injected cause, for the window's duration and a second (called when
/// the window opens, so that it overlaps the recording however long attaching took).
fn inject(
    scenario: Scenario,
    at: (u32, usize, &[usize]),
    limit: Option<&CpuLimit>,
    duration: Duration,
    say: &dyn Fn(String),
) -> Result<Option<Reaped>> {
    let (pid, cpu, others) = at;
    let disturb_for = format!(
        "--duration={}ms",
        (duration + Duration::from_secs(1)).as_millis()
    );
    Ok(match scenario {
        Scenario::LockContention => {
            say(format!(
                "injected: a thread of the server ({}) holds the mutex the worker takes once per \
                 request for 40 ms every 250 ms",
                super::common::LOCK_HOLDER
            ));
            None
        }
        Scenario::Quiet => {
            say("nothing injected".into());
            None
        }
        Scenario::CpuContention => Some(spin_hogs(cpu, disturb_for, say)?),
        Scenario::CfsThrottle => Some(throttle_with_batch(limit, others, disturb_for, say)?),
        Scenario::MigrationStorm => Some(migrate_threads(pid, cpu, others, disturb_for, say)?),
        Scenario::CacheThrash => Some(stream_neighbours(cpu, others, disturb_for, say)?),
        _ => unreachable!("GPU scenarios run in gpu.rs; base() is single-process"),
    })
}

/// cpu-contention: two real-time CPU hogs on the server's CPU.
fn spin_hogs(cpu: usize, disturb_for: String, say: &dyn Fn(String)) -> Result<Reaped> {
    // Bursts of at least the scheduler's slice (EEVDF's: 0.75 ms x (1 + log2 CPUs), at
    // most 3 ms), so a request that arrives behind a hog waits out a slice. With 1-ms
    // bursts the tail only about doubled on a 2-CPU host, too close to the baseline's
    // own noise to tell the cause from it; 3-ms bursts raised it 3.3-4.1x there. Each
    // hog still takes a third of the CPU, so the server keeps up. Real-time hogs, so
    // that the waits are the same under CFS (before 6.6), where a waking server thread
    // often preempted hogs of its own class (`disturb spin --fifo`).
    say(format!(
        "injected: two real-time CPU hogs on CPU {cpu}, each spinning 3 ms and sleeping \
         6 ms"
    ));
    spawn_self(&[
        "disturb".into(),
        "spin".into(),
        "--threads=2".into(),
        "--burst=3ms".into(),
        "--pause=6ms".into(),
        "--fifo".into(),
        format!("--cpus={cpu}"),
        disturb_for,
    ])
}

/// cfs-throttle: a batch job on another CPU joins the server's cgroup, which gets its quota.
fn throttle_with_batch(
    limit: Option<&CpuLimit>,
    others: &[usize],
    disturb_for: String,
    say: &dyn Fn(String),
) -> Result<Reaped> {
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
    Ok(batch)
}

/// migration-storm: the server's threads moved between its CPU and another every ~2 ms.
fn migrate_threads(
    pid: u32,
    cpu: usize,
    others: &[usize],
    disturb_for: String,
    say: &dyn Fn(String),
) -> Result<Reaped> {
    let to = others[0];
    say(format!(
        "injected: the server's threads moved between CPUs {cpu} and {to} every ~2 ms"
    ));
    spawn_self(&[
        "disturb".into(),
        "migrate".into(),
        format!("--pid={pid}"),
        format!("--cpus={cpu},{to}"),
        "--every=2ms".into(),
        disturb_for,
    ])
}

/// cache-thrash: neighbours streaming more than the LLC on CPUs that share the server's.
fn stream_neighbours(
    cpu: usize,
    others: &[usize],
    disturb_for: String,
    say: &dyn Fn(String),
) -> Result<Reaped> {
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
    spawn_self(&[
        "disturb".into(),
        "stream".into(),
        format!("--mib={mib}"),
        format!("--cpus={list}"),
        disturb_for,
    ])
}
