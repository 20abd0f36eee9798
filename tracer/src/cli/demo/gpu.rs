//! The GPU scenarios: a PyTorch inference server (the script embedded below) under another
//! process saturating the GPU, or stalled by its own background GPU work. Its latency log
//! supplies the requests (Python functions have no native symbol for a marker uprobe).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Result, bail};

use super::{
    common::{BASELINE, DemoArgs, Outcome, Reaped, outcome, read_log},
    scenario::Scenario,
};
use crate::{
    session::{record, runtime},
    sources::{clock::monotonic_ns, process::Target, targets::Targets},
};

/// Tiny steps per request in the host-bound scenario: on the GPU machine each launch costs the
/// serving thread about 10 µs of Python and driver time, so 100 requests/s of these keep it
/// on its CPU most of the time (docs/GPU.md).
const HOST_BOUND_OPS: u32 = 350;

static SCRIPT: &str = include_str!("../../workload/gpu_server.py");

fn start(script: &std::path::Path, args: &[String]) -> Result<Reaped> {
    super::common::start_script("python3", script, args)
}

fn check_torch() -> Result<()> {
    let ok = Command::new("python3")
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match ok {
        Ok(s) if s.success() => Ok(()),
        Ok(s) if s.code() == Some(3) => {
            bail!("PyTorch sees no CUDA GPU here: the GPU scenarios run on a machine with one")
        }
        _ => bail!(
            "the GPU scenarios need python3 with PyTorch built for CUDA (pip install torch), \
             and an NVIDIA GPU"
        ),
    }
}

pub fn run(args: &DemoArgs) -> Result<Outcome> {
    check_torch()?;
    let say = |msg: String| {
        if !args.record.quiet {
            eprintln!("demo: {msg}");
        }
    };
    let dir = std::env::temp_dir().join(format!("tracer-demo-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("gpu_server.py");
    std::fs::write(&script, SCRIPT)?;
    let log = dir.join("requests.jsonl");
    let serve = serve_args(args, &log);
    let server = start(&script, &serve)?;
    let pid = server.0.id();
    let engine = if args.scenario.multiprocess() {
        let e = super::common::engine_of(pid)?;
        say(format!(
            "the server is two processes: front end PID {pid}, engine PID {e} (it owns the \
             GPU); attached by the front end's"
        ));
        Some(e)
    } else {
        None
    };
    let ready = monotonic_ns();
    say(format!(
        "scenario {}: a PyTorch inference server (PID {pid}): 100 requests/s, an 8-layer MLP \
         forward pass and a device-wide synchronize each",
        args.scenario.name()
    ));
    std::thread::sleep(BASELINE);
    let baseline_end = monotonic_ns();
    let _hog = inject(args, &script, &say)?;
    let target = Target::resolve(pid)?;
    let mut opts = args.record.session_options(Some(args.duration));
    opts.keep_timeline = true;
    let mut rec = runtime()?.block_on(record(
        &Targets::of(target.clone(), !args.record.no_children),
        &opts,
        || Ok(()),
    ))?;
    let own = [pid, _hog.as_ref().map_or(0, |h| h.0.id())];
    drop(_hog);
    // The recording is done: the server stops now, writing its latency log, rather than at
    // the end of a duration that has to cover the hog's start-up too.
    let stopped = server.stop();
    let loaded = crate::sources::latency_log::load(&mut rec, &log);
    let spans = read_log(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    stopped?;
    loaded?;
    Ok(outcome(
        args.scenario,
        rec,
        &own,
        engine,
        &spans,
        (ready, baseline_end),
        &[],
    ))
}

/// The server's arguments for the scenario: its run long enough for the baseline, the hog's
/// start-up and the recording, its latency log, and what it injects itself.
fn serve_args(args: &DemoArgs, log: &std::path::Path) -> Vec<String> {
    // Long enough for the baseline, the hog's start-up (CUDA initialization, seconds) and the
    // recording; the server is stopped as soon as the recording ends.
    let total = BASELINE + args.duration + Duration::from_secs(60);
    let mut serve = vec![
        "serve".to_string(),
        format!("--duration={}", total.as_secs_f64()),
        format!("--log={}", log.display()),
    ];
    if args.scenario == Scenario::GpuSyncStall {
        serve.push(format!("--stall-after={}", BASELINE.as_secs_f64()));
    }
    if args.scenario == Scenario::HostBound {
        serve.push(format!("--tiny-ops={HOST_BOUND_OPS}"));
    }
    if args.scenario.multiprocess() {
        serve.push("--engine-process".into());
    }
    serve
}

/// Starts the scenario's disturbance, said in words: another process saturating the GPU (kept
/// until dropped), or none where the server injects it itself.
fn inject(
    args: &DemoArgs,
    script: &std::path::Path,
    say: &dyn Fn(String),
) -> Result<Option<Reaped>> {
    Ok(match args.scenario.base() {
        Scenario::HostBound => {
            say(format!(
                "injected: each request is {HOST_BOUND_OPS} tiny elementwise steps ({} kernel \
                 launches of microseconds each) instead of the MLP",
                2 * HOST_BOUND_OPS
            ));
            None
        }
        Scenario::GpuSaturation => {
            let d = format!(
                "--duration={}",
                (args.duration + Duration::from_secs(1)).as_secs_f64()
            );
            let h = start(script, &["hog".into(), d])?;
            say(format!(
                "injected: another process (PID {}) saturating the GPU with matmuls",
                h.0.id()
            ));
            Some(h)
        }
        _ => {
            say(
                "injected: the server's own background thread queues bursts of large matmuls \
                 every 200 ms, which its device-wide synchronize waits for"
                    .into(),
            );
            None
        }
    })
}
