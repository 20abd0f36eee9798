//! The CPython scenarios: the embedded script below as the server, its second thread holding
//! the GIL in long C calls (gil-contention), or its requests triggering full collections of a
//! large heap (gc-pause). Its latency log supplies the requests; in gc-pause its own
//! gc.callbacks log each collection, the ground truth the traced pauses are checked against.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{
    common::{BASELINE, DemoArgs, Outcome, outcome, read_log, start_script},
    scenario::Scenario,
};
use crate::{
    session::{record, runtime},
    sources::{clock::monotonic_ns, process::Target, targets::Targets},
};

static SCRIPT: &str = include_str!("../../workload/py_server.py");

/// The interpreter: the distribution's, which carries the USDT probes the GC pauses are
/// traced with (../shared/PLATFORM.md), else the first python3 on the PATH.
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

pub fn run(args: &DemoArgs) -> Result<Outcome> {
    let say = |msg: String| {
        if !args.record.quiet {
            eprintln!("demo: {msg}");
        }
    };
    let dir = std::env::temp_dir().join(format!("tracer-demo-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("py_server.py");
    std::fs::write(&script, SCRIPT)?;
    let log = dir.join("requests.jsonl");
    let gc_log: PathBuf = dir.join("gc.jsonl");
    let long_log: PathBuf = dir.join("long.txt");
    let inject = match args.scenario {
        Scenario::GilContention => "gil",
        Scenario::HeadOfLine => "long",
        _ => "gc",
    };
    let total = BASELINE + args.duration + std::time::Duration::from_secs(30);
    let server = start_script(
        python(),
        &script,
        &[
            format!("--inject={inject}"),
            format!("--inject-after={}", BASELINE.as_secs_f64()),
            format!("--duration={}", total.as_secs_f64()),
            format!("--log={}", log.display()),
            format!("--gc-log={}", gc_log.display()),
            format!("--long-log={}", long_log.display()),
        ],
    )?;
    let pid = server.0.id();
    let ready = monotonic_ns();
    say(format!(
        "scenario {}: a CPython server (PID {pid}, {}): 100 requests/s, ~1 ms of Python each",
        args.scenario.name(),
        python()
    ));
    std::thread::sleep(BASELINE);
    let baseline_end = monotonic_ns();
    say(match args.scenario {
        Scenario::GilContention => "injected: a second thread of the server sorts a 600,000-element list every 250 ms, holding the GIL throughout".into(),
        Scenario::HeadOfLine => "injected: two consecutive requests in every 100 carry 60 ms of Python work each, on the serving thread".into(),
        _ => "injected: a full garbage collection of a 1.5-million-object heap every ~700 ms, in the serving thread".into(),
    });
    let target = Target::resolve(pid)?;
    let mut opts = args.record.session_options(Some(args.duration));
    opts.keep_timeline = true;
    let mut rec = runtime()?.block_on(record(
        &Targets::of(target, !args.record.no_children),
        &opts,
        || Ok(()),
    ))?;
    let stopped = server.stop();
    let loaded = crate::sources::latency_log::load(&mut rec, &log);
    let spans = read_log(&log).unwrap_or_default();
    let long_ids = long_requests(&long_log);
    let _ = std::fs::remove_dir_all(&dir);
    stopped?;
    loaded?;
    Ok(outcome(
        args.scenario,
        rec,
        &[pid],
        None,
        &spans,
        (ready, baseline_end),
        &long_ids,
    ))
}

/// The ids of the requests the server logged as long (head-of-line's ground truth).
fn long_requests(log: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}
