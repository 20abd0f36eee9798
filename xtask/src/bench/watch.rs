//! The bench's `tracer watch` case (issue 18): what watching costs once attached, on an idle
//! target and on one switching 100k times a second (`tracer-testload paced`), each without
//! and with `--otlp` to a local sink, and the tracer's memory over a soak with a flight
//! recorder on a 50-thread target.
//!
//! The cost is the tracer process's CPU time (user + system, /proc/PID/stat: exited threads
//! included) plus the run time of its BPF programs (BPF run statistics: charged to whichever
//! task they ran on, so no process's CPU time shows it), between the first window line and
//! the last, over the wall time between them: start-up and the final assembly are left out,
//! as they are once in hours of watching.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{
    Ctx, median, stats,
    threads::{Workload, build_testload},
};

/// Round trips a second of the busy target: two switches each, and each 1 ms slot's sleep one
/// more: about 101k switches a second (counted, not assumed).
const BUSY_ROUND_TRIPS: &str = "50000";

/// The tracer's CPU time so far, in seconds (clock ticks: 10 ms, against windows of 5 s).
fn cpu_s(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .context("/proc/PID/stat without a command")?
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    Ok(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .context("no VmRSS")?;
    Ok(kb * 1024)
}

/// Context switches of every thread of `pid`, from /proc: the independent count of the rate.
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// `tracer watch` on `target`, and the instants its window lines came.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<Instant>,
}

impl Watch {
    fn start(ctx: &Ctx, target: u32, options: &[&str]) -> Result<Self> {
        let mut c = ctx.observer(&ctx.tracer);
        c.args(["watch", "-p", &target.to_string(), "--no-gpu"])
            .args(options)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().context("starting tracer watch")?;
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for _ in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(Instant::now());
            }
        });
        Ok(Self { child, lines })
    }

    fn next(&mut self, within: Duration) -> Result<Instant> {
        match self.lines.recv_timeout(within) {
            Ok(at) => Ok(at),
            Err(_) => {
                super::stop(&mut self.child);
                bail!("tracer watch printed no window within {within:?}")
            }
        }
    }
}

/// The BPF programs' run time so far, in ns, summed (None without bpftool).
fn bpf_ns(before: Option<&std::collections::BTreeSet<u64>>) -> Option<u64> {
    let snap = stats::snapshot(before?).ok()?;
    Some(snap.values().map(|(_, ns)| ns).sum())
}

/// An OTLP/HTTP collector that takes every request (200, an empty response) and counts them:
/// what `--otlp` costs the tracer, with a collector as quick as a local one.
struct Sink {
    url: String,
    taken: Arc<AtomicU64>,
}

impl Sink {
    fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}", listener.local_addr()?);
        let taken = Arc::new(AtomicU64::new(0));
        let t = Arc::clone(&taken);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let t = Arc::clone(&t);
                std::thread::spawn(move || take_all(conn, &t));
            }
        });
        Ok(Self { url, taken })
    }
}

/// Requests on one keep-alive connection, each answered 200, until it closes.
fn take_all(conn: TcpStream, taken: &AtomicU64) -> Option<()> {
    let mut out = conn.try_clone().ok()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut length = 0;
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        loop {
            line.clear();
            r.read_line(&mut line).ok()?;
            if line.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().ok()?;
            }
        }
        std::io::copy(&mut (&mut r).take(length), &mut std::io::sink()).ok()?;
        taken.fetch_add(1, Ordering::Relaxed);
        out.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .ok()?;
    }
}

/// One watch on `target` with windows of `interval`, measured over `windows` of them; with
/// `--otlp` to `sink` when there is one.
fn cost_once(
    ctx: &Ctx,
    target: u32,
    (interval, windows): (Duration, u32),
    sink: Option<&Sink>,
) -> Result<Value> {
    let before = stats::loaded().ok();
    let _on = before.as_ref().map(|_| stats::StatsOn::new()).transpose()?;
    let secs = format!("{}ms", interval.as_millis());
    let mut options = vec!["-i", &secs];
    if let Some(s) = sink {
        options.extend(["--otlp", &s.url]);
    }
    let taken0 = sink.map(|s| s.taken.load(Ordering::Relaxed));
    let mut w = Watch::start(ctx, target, &options)?;
    let pid = w.child.id();
    let t0 = w.next(interval * 3 + Duration::from_secs(20))?;
    let (c0, b0, s0) = (cpu_s(pid)?, bpf_ns(before.as_ref()), switches(target));
    let mut t1 = t0;
    for _ in 0..windows {
        t1 = w.next(interval * 3)?;
    }
    let (c1, b1, s1) = (cpu_s(pid)?, bpf_ns(before.as_ref()), switches(target));
    let rss = rss_bytes(pid)?;
    super::stop(&mut w.child);
    // Every window posted (one metrics request each, and a span for a window with a cause):
    // an export that failed would cost nothing and prove nothing.
    let posted = sink
        .zip(taken0)
        .map(|(s, t)| s.taken.load(Ordering::Relaxed) - t);
    if posted.is_some_and(|n| n < u64::from(windows)) {
        bail!("the OTLP sink took {posted:?} requests over {windows} windows");
    }
    let wall = (t1 - t0).as_secs_f64();
    let bpf = b0
        .zip(b1)
        .map(|(a, b)| b.saturating_sub(a) as f64 / 1e9 / wall);
    let user = (c1 - c0) / wall;
    Ok(json!({
        "wall_s": wall,
        "process_share": user,
        "bpf_share": bpf,
        "total_share": user + bpf.unwrap_or(0.0),
        "target_switches_per_s": (s1 - s0) as f64 / wall,
        "rss_bytes": rss,
        "otlp_requests": posted,
    }))
}

/// Interleaved rounds of the idle and the busy target, and each one's medians.
fn cost(ctx: &Ctx, rounds: u32, quick: bool) -> Result<Value> {
    let (interval, windows) = if quick {
        (Duration::from_secs(1), 2)
    } else {
        (Duration::from_secs(5), 6)
    };
    // Each target runs only for its own runs: the busy one's switches would cost the idle
    // case's early exits. The `--otlp` cases post to a sink on this machine.
    let targets = [
        "idle",
        "100k switches/s",
        "idle, --otlp",
        "100k switches/s, --otlp",
    ];
    let sink = Sink::start()?;
    let mut runs = Vec::new();
    for round in 0..rounds as usize {
        for k in 0..targets.len() {
            let name = targets[(k + round) % targets.len()];
            let otlp = name.ends_with("--otlp").then_some(&sink);
            let mut r = if name.starts_with("idle") {
                let mut idle = std::process::Command::new("sleep").arg("100000").spawn()?;
                let r = cost_once(ctx, idle.id(), (interval, windows), otlp);
                let _ = idle.kill();
                let _ = idle.wait();
                r?
            } else {
                let busy = ["paced".into(), BUSY_ROUND_TRIPS.into(), "2".into()];
                let busy = Workload::start(ctx, &busy)?;
                cost_once(ctx, busy.pid, (interval, windows), otlp)?
            };
            eprintln!(
                "xtask: round {} watch, {name}: {:.3} % of a CPU",
                round + 1,
                100.0 * r["total_share"].as_f64().unwrap_or(f64::NAN)
            );
            r["target"] = name.into();
            runs.push(r);
        }
    }
    let medians: Vec<Value> = targets
        .iter()
        .map(|name| {
            let of = |k: &str| {
                median(
                    runs.iter()
                        .filter(|r| r["target"] == *name)
                        .filter_map(|r| r[k].as_f64())
                        .collect(),
                )
            };
            json!({
                "target": name,
                "process_share": of("process_share"),
                "bpf_share": of("bpf_share"),
                "total_share": of("total_share"),
                "target_switches_per_s": of("target_switches_per_s"),
                "rss_bytes": of("rss_bytes"),
            })
        })
        .collect();
    Ok(
        json!({"interval_s": interval.as_secs_f64(), "windows": windows, "rounds": rounds,
              "runs": runs, "medians": medians}),
    )
}

/// One metric's value from the exporter's /metrics.
fn scrape(addr: &str, metric: &str) -> Result<f64> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    body.lines()
        .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("no {metric} in the exposition"))
}

/// Threads and round trips a second of the soak's target: each of its 25 pairs 200 a second,
/// about 15k switches a second in all (counted).
const SOAK_THREADS: &str = "50";
const SOAK_ROUND_TRIPS: &str = "5000";

/// `tracer watch --keep` for `length` on 50 threads: the RSS at each window, its spread once
/// the flight recorder is full (after `keep` and two windows more), and the recorder's bytes.
fn soak(ctx: &Ctx, length: Duration, keep: Duration, interval: Duration) -> Result<Value> {
    let load = Workload::start(
        ctx,
        &["paced".into(), SOAK_ROUND_TRIPS.into(), SOAK_THREADS.into()],
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let dir = ctx.dir.join("soak-flight");
    let (k, i) = (
        format!("{}s", keep.as_secs()),
        format!("{}s", interval.as_secs()),
    );
    std::fs::create_dir_all(&dir)?;
    let flight = dir.display().to_string();
    let options = [
        "-i",
        &i,
        "--keep",
        &k,
        "--prometheus",
        &addr,
        "--flight-dir",
        &flight,
    ];
    let mut w = Watch::start(ctx, load.pid, &options)?;
    let pid = w.child.id();
    let mut samples = Vec::new();
    let t0 = w.next(interval * 3 + Duration::from_secs(20))?;
    let s0 = switches(load.pid);
    while t0.elapsed() < length {
        let at = w.next(interval * 3)?;
        samples.push(((at - t0).as_secs_f64(), rss_bytes(pid)?));
    }
    let switch_rate = (switches(load.pid) - s0) as f64 / t0.elapsed().as_secs_f64();
    let flight_bytes = scrape(&addr, "tracer_flight_recorder_bytes");
    super::stop(&mut w.child);
    drop(load);
    let _ = std::fs::remove_dir_all(&dir);
    let full = (keep + interval * 2).as_secs_f64();
    let steady: Vec<u64> = samples
        .iter()
        .filter(|(t, _)| *t >= full)
        .map(|s| s.1)
        .collect();
    let (lo, hi) = (steady.iter().min(), steady.iter().max());
    Ok(json!({
        "length_s": length.as_secs_f64(),
        "keep_s": keep.as_secs_f64(),
        "threads": SOAK_THREADS.parse::<u32>().unwrap_or(0),
        "target_switches_per_s": switch_rate,
        "rss": samples.iter().map(|(t, b)| json!([t, b])).collect::<Vec<_>>(),
        "steady_min_bytes": lo,
        "steady_max_bytes": hi,
        "steady_spread_bytes": lo.zip(hi).map(|(a, b)| b - a),
        // What a leak would show: the spread also counts a dip, such as the memory handed
        // back right after a flight-recorder file (malloc_trim), which the next window refills.
        "steady_growth_bytes": steady.first().zip(steady.last()).map(|(a, b)| *b as i64 - *a as i64),
        "flight_recorder_bytes": flight_bytes.ok(),
    }))
}

/// The watch case: cost rounds and a soak (`soak` long; a few seconds in the quick bench).
pub fn watch(ctx: &Ctx, rounds: u32, quick: bool, soak_for: Duration) -> Result<Value> {
    build_testload()?;
    let cost = cost(ctx, rounds, quick)?;
    let soak = if quick {
        soak(
            ctx,
            Duration::from_secs(6),
            Duration::from_secs(2),
            Duration::from_secs(1),
        )?
    } else {
        soak(
            ctx,
            soak_for,
            Duration::from_secs(60),
            Duration::from_secs(10),
        )?
    };
    Ok(json!({"cost": cost, "soak": soak}))
}

/// The lines the bench prints (and BENCHMARKS.md quotes).
pub fn render(m: &Value) -> String {
    let c = &m["cost"];
    let mut s = format!(
        "\ntracer watch -i {}s, {} windows measured, medians of {} rounds (% of one CPU):\n\
         {:>24} {:>10} {:>8} {:>8} {:>12} {:>8}\n",
        c["interval_s"],
        c["windows"],
        c["rounds"],
        "target",
        "process",
        "BPF",
        "total",
        "switches/s",
        "RSS MB"
    );
    for r in c["medians"].as_array().into_iter().flatten() {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        s += &format!(
            "{:>24} {:>9.3}% {:>7.3}% {:>7.3}% {:>12.0} {:>8.1}\n",
            r["target"].as_str().unwrap_or("?"),
            100.0 * f("process_share"),
            100.0 * f("bpf_share"),
            100.0 * f("total_share"),
            f("target_switches_per_s"),
            f("rss_bytes") / 1e6
        );
    }
    let k = &m["soak"];
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    s += &format!(
        "soak: {:.0} s of --keep {:.0}s on {} threads ({:.0} switches/s): RSS {:.1}..{:.1} MB once \
         full (spread {:.2} MB, first to last {:+.2} MB), flight recorder {:.2} MB\n",
        f(&k["length_s"]),
        f(&k["keep_s"]),
        k["threads"],
        f(&k["target_switches_per_s"]),
        f(&k["steady_min_bytes"]) / 1e6,
        f(&k["steady_max_bytes"]) / 1e6,
        f(&k["steady_spread_bytes"]) / 1e6,
        f(&k["steady_growth_bytes"]) / 1e6,
        f(&k["flight_recorder_bytes"]) / 1e6
    );
    s
}
