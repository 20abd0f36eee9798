//! The bench's many-threads case: `tracer attach` for a few seconds on a process of 12,000 and
//! 20,000 threads (`tracer-testload many`), each waking once a second in groups that preempt
//! one another. What it measures is the tracer's own work per thread: the time from the
//! window's end to the summary printed, the peak RSS and the CPU time (issue 13: 26 s and
//! 1.5 GB at 20,000 threads, from per-thread /proc reads and histograms).

use std::{
    fs::File,
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{Ctx, median};
use crate::{cargo, run, workspace_root};

/// The thread counts of the full bench, and of the quick one (CI).
const COUNTS: [usize; 2] = [12_000, 20_000];
const QUICK_COUNTS: [usize; 1] = [20_000];

/// A workload process: `tracer-testload many N` (or `paced RATE N`) on the benchmark CPU,
/// ended by closing its stdin (when dropped).
pub(super) struct Workload {
    child: std::process::Child,
    pub pid: u32,
}

impl Workload {
    pub fn start(ctx: &Ctx, args: &[String]) -> Result<Self> {
        let bin = workspace_root().join("target/debug/tracer-testload");
        let mut c = Command::new("taskset");
        c.args(["-c", &ctx.cpus.bench])
            .arg(&bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        // A session of its own, so an autogroup of its own (kernel.sched_autogroup_enabled): in
        // the bench's, its threads' load on their CPU left the tracer a sliver of the group's
        // weight on the other, and any other busy process there stopped it for tens of seconds.
        // SAFETY: setsid is async-signal-safe and touches nothing of the parent's.
        unsafe {
            c.pre_exec(|| {
                libc::setsid();
                Ok(())
            })
        };
        let mut child = c
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let pid = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("pid="))
            .and_then(|p| p.parse().ok());
        let Some(pid) = pid else {
            let _ = child.wait();
            bail!("tracer-testload {args:?} did not start: {line:?}");
        };
        // Let every thread reach its once-a-second rhythm before the window.
        std::thread::sleep(Duration::from_millis(1200));
        Ok(Self { child, pid })
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// What the bench reads of the tracer's document. The threads are only counted and the document
/// is read from a file after the tracer has exited: a child's ru_maxrss starts from the peak of
/// the process it was forked from (fs/exec.c `exec_mmap`), so xtask's own memory must stay
/// below the tracer's (parsed whole, a 20,000 threads' document took it to 186 MB).
#[derive(serde::Deserialize)]
struct Doc {
    threads: Vec<serde::de::IgnoredAny>,
    losses: DocLosses,
    tracer_cost: DocCost,
}

#[derive(serde::Deserialize)]
struct DocLosses {
    thread_map_full: u64,
}

#[derive(serde::Deserialize)]
struct DocCost {
    cpu_share: f64,
}

/// The child's exit status, CPU time (user + system, s) and peak RSS (bytes), from wait4: the
/// tracer's own figure is taken before the summary is built and printed.
fn wait_rusage(pid: u32) -> Result<(i32, f64, u64)> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it and the status we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; pid is our own child, not yet waited for.
    let r = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut ru) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("wait4 on the tracer");
    }
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok((
        status,
        s(ru.ru_utime) + s(ru.ru_stime),
        ru.ru_maxrss as u64 * 1024,
    ))
}

/// One `tracer attach --json` on a fresh workload of `threads` threads.
fn once(ctx: &Ctx, threads: usize, window: Duration) -> Result<Value> {
    let load = Workload::start(ctx, &["many".into(), threads.to_string()])?;
    let path = ctx.dir.join("many-threads.json");
    let mut c = ctx.observer(&ctx.tracer);
    c.args([
        "attach",
        "--pid",
        &load.pid.to_string(),
        "--json",
        "--no-gpu",
    ])
    .arg("--duration")
    .arg(format!("{}ms", window.as_millis()))
    .stdin(Stdio::null())
    .stdout(File::create(&path).context("the tracer's document file")?)
    .stderr(Stdio::piped());
    let mut child = c.spawn().context("starting the tracer")?;
    let stderr = child.stderr.take().expect("piped");
    // The window starts when the tracer says it is recording.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("tracer: recording") {
                let _ = tx.send(Instant::now());
            }
        }
    });
    // Printing the summary is the last thing the tracer does.
    let (status, cpu_s, peak_rss) = wait_rusage(child.id())?;
    let printed = Instant::now();
    if status != 0 {
        bail!("tracer attach on {threads} threads failed (wait status {status})");
    }
    let started = rx
        .try_recv()
        .context("the tracer never said it was recording")?;
    let doc: Doc = serde_json::from_reader(BufReader::new(File::open(&path)?))
        .context("the tracer's JSON document")?;
    let _ = std::fs::remove_file(&path);
    let post = printed.duration_since(started).saturating_sub(window);
    Ok(json!({
        "threads": threads,
        "threads_reported": doc.threads.len(),
        "thread_map_full": doc.losses.thread_map_full,
        "post_processing_s": post.as_secs_f64(),
        "peak_rss_bytes": peak_rss,
        "cpu_s": cpu_s,
        "window_cpu_share": doc.tracer_cost.cpu_share,
    }))
}

pub(super) fn build_testload() -> Result<()> {
    run(cargo().args(["build", "-p", "tracer-tests", "--bin", "tracer-testload"]))
}

/// Interleaved rounds over the thread counts (the order rotating each round), and each
/// count's medians.
pub fn many_threads(ctx: &Ctx, rounds: u32, quick: bool) -> Result<Value> {
    build_testload()?;
    let counts: &[usize] = if quick { &QUICK_COUNTS } else { &COUNTS };
    let window = Duration::from_secs(if quick { 1 } else { 3 });
    let mut runs = Vec::new();
    for round in 0..rounds as usize {
        let k = round % counts.len();
        for &n in counts[k..].iter().chain(&counts[..k]) {
            let r = once(ctx, n, window)?;
            eprintln!(
                "xtask: round {} many threads {n:>6}: post-processing {:.2} s, peak RSS {:.0} MB",
                round + 1,
                r["post_processing_s"].as_f64().unwrap_or(f64::NAN),
                r["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN) / 1e6
            );
            runs.push(r);
        }
    }
    let medians: Vec<Value> = counts
        .iter()
        .map(|&n| {
            let of = |k: &str| {
                median(
                    runs.iter()
                        .filter(|r| r["threads"] == n)
                        .filter_map(|r| r[k].as_f64())
                        .collect(),
                )
            };
            json!({
                "threads": n,
                "threads_reported": of("threads_reported"),
                "post_processing_s": of("post_processing_s"),
                "peak_rss_bytes": of("peak_rss_bytes"),
                "cpu_s": of("cpu_s"),
                "window_cpu_share": of("window_cpu_share"),
            })
        })
        .collect();
    Ok(
        json!({"window_s": window.as_secs_f64(), "rounds": rounds, "runs": runs, "medians": medians}),
    )
}

/// The lines the bench prints (and BENCHMARKS.md quotes).
pub fn render(m: &Value) -> String {
    let mut s = format!(
        "\nmany threads (tracer attach --duration {}s on tracer-testload many N, medians of {} \
         rounds):\n{:>8} {:>9} {:>17} {:>12} {:>13} {:>14}\n",
        m["window_s"],
        m["rounds"],
        "threads",
        "reported",
        "post-processing",
        "peak RSS MB",
        "tracer CPU s",
        "window share"
    );
    for r in m["medians"].as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        s += &format!(
            "{:>8} {:>9.0} {:>15.2} s {:>12.1} {:>13.2} {:>13.1}%\n",
            r["threads"],
            f("threads_reported"),
            f("post_processing_s"),
            f("peak_rss_bytes") / 1e6,
            f("cpu_s"),
            100.0 * f("window_cpu_share")
        );
    }
    // Linear or not: how the post-processing grows from the fewest threads to the most.
    let m = m["medians"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if let (Some(a), Some(b)) = (m.first(), m.last())
        && m.len() > 1
    {
        let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let n = f(b, "threads") / f(a, "threads");
        s += &format!(
            "post-processing grew x{:.2} from {} to {} threads (linear: x{n:.2}, quadratic: x{:.2})\n",
            f(b, "post_processing_s") / f(a, "post_processing_s"),
            a["threads"],
            b["threads"],
            n * n
        );
    }
    s
}
