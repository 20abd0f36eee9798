//! `tracer demo`: the built-in synthetic inference server, a real CPU disturbance, the tracer
//! attached, and the result explained next to the latencies the server measured itself.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::Args;
use serde::Serialize;

use super::{RecordArgs, parse_duration, runtime};
use crate::{
    analysis::summary::{Summary, summarize},
    render::{self, text::dur},
    session::record,
    sources::{
        privileges,
        process::{Target, monotonic_ns},
    },
    workload::server::{RequestSpan, read_log},
};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long to record once the disturbance is on.
    #[arg(long, short, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Run without the CPU hogs (a quiet baseline).
    #[arg(long)]
    pub no_disturbance: bool,
    #[command(flatten)]
    pub record: RecordArgs,
}

/// How long the server runs undisturbed first, to measure its normal latency.
const BASELINE: Duration = Duration::from_secs(2);

/// Kills and reaps a child when dropped, so no demo process outlives the demo.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_self(args: &[String]) -> Result<Reaped> {
    let exe = std::env::current_exe().context("locating the tracer binary")?;
    let child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting `tracer {}`", args.join(" ")))?;
    Ok(Reaped(child))
}

#[derive(Debug, Clone, Copy, Serialize)]
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
        .map(|s| s.end_ns.saturating_sub(s.start_ns))
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

#[derive(Debug, Serialize)]
struct DemoReport {
    #[serde(flatten)]
    summary: Summary,
    demo: DemoPart,
}

#[derive(Debug, Serialize)]
struct DemoPart {
    disturbance: Option<&'static str>,
    latency_baseline: Option<LatencyStats>,
    latency_recorded: Option<LatencyStats>,
}

pub fn run(args: DemoArgs) -> Result<()> {
    privileges::check()?;
    let say = |msg: String| {
        if !args.record.quiet {
            eprintln!("demo: {msg}");
        }
    };
    let log: PathBuf =
        std::env::temp_dir().join(format!("tracer-demo-{}.jsonl", std::process::id()));
    let total = BASELINE + args.duration + Duration::from_secs(1);
    let started = monotonic_ns();
    let server = spawn_self(&[
        "workload".into(),
        "--workers=2".into(),
        "--rate=400".into(),
        "--work-us=1000".into(),
        format!("--duration={}ms", total.as_millis()),
        format!("--latency-log={}", log.display()),
    ])?;
    let pid = server.0.id();
    say(format!(
        "started a synthetic inference server (PID {pid}): 2 workers, 400 requests/s, 1 ms of CPU each"
    ));
    std::thread::sleep(BASELINE);
    let baseline_end = monotonic_ns();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let _hog = if args.no_disturbance {
        None
    } else {
        let hog = spawn_self(&[
            "hog".into(),
            format!("--threads={}", 2 * cpus),
            format!(
                "--duration={}ms",
                (args.duration + Duration::from_secs(1)).as_millis()
            ),
        ])?;
        say(format!(
            "disturbance: CPU hogs (PID {}), two spinning threads per CPU",
            hog.0.id()
        ));
        Some(hog)
    };
    let target = Target::resolve(pid)?;
    let opts = args.record.session_options(Some(args.duration));
    let rec = runtime()?.block_on(record(&target, &opts, || Ok(())))?;
    drop(_hog);
    let mut server = server;
    let _ = server.0.wait();
    let spans = read_log(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);

    // Skip the first half second: thread start-up is not the server's steady state.
    let baseline = latency_stats(&spans, started + 500_000_000, baseline_end);
    let recorded = latency_stats(&spans, rec.start_ns, rec.end_ns);
    let summary = summarize(&rec);
    if args.record.json {
        let report = DemoReport {
            summary,
            demo: DemoPart {
                disturbance: (!args.no_disturbance).then_some("cpu_hogs"),
                latency_baseline: baseline,
                latency_recorded: recorded,
            },
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return super::write_outputs(&rec, &report.summary, &args.record.outputs);
    }
    print!("{}", render::text::render(&summary));
    println!("\nRequest latency, as the server measured it:");
    let line = |name: &str, s: Option<LatencyStats>| match s {
        Some(s) => println!(
            "  {name:<26} p50 {:>9}  p99 {:>9}  max {:>9}  ({} requests)",
            dur(s.p50_ns),
            dur(s.p99_ns),
            dur(s.max_ns),
            s.requests
        ),
        None => println!("  {name:<26} no requests completed"),
    };
    line("before the disturbance", baseline);
    line("during the recording", recorded);
    super::write_outputs(&rec, &summary, &args.record.outputs)
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
