//! The bench's untimed runs (BPF run statistics), its report against the targets of
//! BENCHMARKS.md, and the table it prints.

use std::{collections::BTreeMap, process::Command, time::Duration};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::{Config, Ctx, Run, median, start_observer, stop};

/// Turns kernel.bpf_stats_enabled on for its lifetime and restores it after.
pub(super) struct StatsOn(String);

impl StatsOn {
    const PATH: &str = "/proc/sys/kernel/bpf_stats_enabled";

    pub fn new() -> Result<Self> {
        let old = std::fs::read_to_string(Self::PATH)
            .with_context(|| format!("reading {}", Self::PATH))?;
        std::fs::write(Self::PATH, "1").with_context(|| format!("writing {}", Self::PATH))?;
        Ok(Self(old.trim().to_string()))
    }
}

impl Drop for StatsOn {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

pub(super) type Snapshot = BTreeMap<String, (u64, u64)>;

/// The ids of the BPF programs loaded now.
pub(super) fn loaded() -> Result<std::collections::BTreeSet<u64>> {
    Ok(progs()?.iter().filter_map(|p| p["id"].as_u64()).collect())
}

fn progs() -> Result<Vec<Value>> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .context("running bpftool")?;
    let progs: Value = serde_json::from_slice(&out.stdout).context("bpftool's JSON")?;
    Ok(progs.as_array().cloned().unwrap_or_default())
}

/// Run count and run time per program loaded since `before` (the tracer's: nothing else
/// loads programs during the bench), from bpftool.
pub(super) fn snapshot(before: &std::collections::BTreeSet<u64>) -> Result<Snapshot> {
    let mut map = BTreeMap::new();
    for p in progs()? {
        if p["id"].as_u64().is_none_or(|id| before.contains(&id)) {
            continue;
        }
        let e = map
            .entry(p["name"].as_str().unwrap_or("?").to_string())
            .or_insert((0, 0));
        e.0 += p["run_cnt"].as_u64().unwrap_or(0);
        e.1 += p["run_time_ns"].as_u64().unwrap_or(0);
    }
    Ok(map)
}

fn delta(a: &Snapshot, b: &Snapshot) -> Value {
    let mut progs = Vec::new();
    for (name, (cnt, ns)) in b {
        let (c0, n0) = a.get(name).copied().unwrap_or((0, 0));
        let runs = cnt.saturating_sub(c0);
        if runs == 0 {
            continue;
        }
        let ns = ns.saturating_sub(n0);
        progs.push(json!({"program": name, "runs": runs, "ns_per_run": ns as f64 / runs as f64}));
    }
    Value::Array(progs)
}

/// Rounds of the early-exit statistics, each with one process and with a tree.
const STATS_ROUNDS: usize = 5;
/// The target set's size in the tree case (issue 15: at most 10 ns more than one process).
const TREE_PROCESSES: usize = 20;

/// Per program, the median of the rounds' ns/run (and their runs added up).
fn median_runs(rounds: &[Value]) -> Value {
    let mut per: BTreeMap<String, (u64, Vec<f64>)> = BTreeMap::new();
    for r in rounds {
        for p in r.as_array().into_iter().flatten() {
            let e = per
                .entry(p["program"].as_str().unwrap_or("?").into())
                .or_default();
            e.0 += p["runs"].as_u64().unwrap_or(0);
            e.1.push(f(&p["ns_per_run"]));
        }
    }
    Value::Array(
        per.into_iter()
            .map(|(name, (runs, ns))| {
                json!({"program": name, "runs": runs, "ns_per_run": median(ns), "rounds": rounds.len()})
            })
            .collect(),
    )
}

/// BPF run statistics of the tracer's programs while the benchmark runs: on a sleeping
/// target (every event takes the early exit) and on the benchmark itself (the switches on its
/// CPU are target events).
pub fn bpf_run_stats(ctx: &Ctx, expected: Duration) -> Result<Value> {
    if Command::new("bpftool").arg("version").output().is_err() {
        eprintln!("xtask: bpftool not found: no BPF run statistics");
        return Ok(Value::Null);
    }
    let _on = StatsOn::new()?;
    let bench = ctx.bench_cmd();
    let before = loaded()?;

    // While an observer is attached, the benchmark runs once between two snapshots.
    let around_bench = |c: Command, ready: &str| -> Result<Value> {
        let mut obs = start_observer(c, ready, false)?;
        let a = snapshot(&before)?;
        let status = Command::new(&bench[0])
            .args(&bench[1..])
            .stdout(std::process::Stdio::null())
            .status();
        let b = snapshot(&before)?;
        stop(&mut obs);
        status?;
        Ok(delta(&a, &b))
    };
    // On sleeping targets, one process and a tree of 20, in interleaved rounds: the early
    // exit's cost must not grow with the set (the kernel side tests one bit of a bitmap).
    let (mut one, mut twenty) = (Vec::new(), Vec::new());
    for _ in 0..STATS_ROUNDS {
        for (n, out) in [(1, &mut one), (TREE_PROCESSES, &mut twenty)] {
            let (sleeper, c) = ctx.attach_sleeping_tree(n)?;
            let d = around_bench(c, "tracer: recording");
            super::kill_group(sleeper);
            out.push(d?);
        }
    }
    let unrelated = median_runs(&one);
    let unrelated_tree = median_runs(&twenty);

    // The empty programs: the run statistics' own cost (two clock reads per run) and the
    // entry into any program, to subtract from the figures above.
    let mut c = ctx.observer(&ctx.tracer);
    c.arg("floor");
    let floor = around_bench(c, "floor programs attached");

    // On the benchmark: snapshots a tenth and seven tenths into its expected run.
    let mut c = ctx.observer(&ctx.tracer);
    c.args(["run", "--json", "--"]).args(&bench);
    let mut obs = start_observer(c, "tracer: recording", false)?;
    std::thread::sleep(expected / 10);
    let a = snapshot(&before)?;
    std::thread::sleep(expected * 6 / 10);
    let b = snapshot(&before)?;
    // Its JSON document, read to the end so that it never blocks on a full pipe.
    let mut doc = String::new();
    if let Some(mut out) = obs.stdout.take() {
        std::io::Read::read_to_string(&mut out, &mut doc)?;
    }
    let _ = obs.wait();
    Ok(json!({
        "empty_programs": floor?,
        "unrelated_pid": unrelated,
        "unrelated_pid_20_processes": unrelated_tree,
        "on_the_benchmark": delta(&a, &b),
    }))
}

pub fn machine() -> Value {
    let text = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = text("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string());
    let version = |prog: &str| {
        Command::new(prog)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    json!({
        "kernel": text("/proc/sys/kernel/osrelease").trim(),
        "cpu_model": model,
        "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "perf": version("perf"),
        "bpftrace": version("bpftrace"),
    })
}

/// Per configuration: the median time per round trip, and the median of the per-round
/// ratios to the unobserved run of the same round (robust to the machine's drift); and, as a
/// second estimate, the best runs' ratio (noise on this VM only ever adds time, so each
/// configuration's fastest run is its least disturbed).
pub fn report(
    runs: &[Value],
    configs: &[Config],
    stats: &Value,
    high_rate: &Value,
    with_trace: &Value,
) -> Value {
    let of = |c: Config| -> Vec<&Value> {
        runs.iter()
            .filter(|r| r["config"] == c.name())
            .collect::<Vec<_>>()
    };
    let base: BTreeMap<u64, f64> = of(Config::Baseline)
        .iter()
        .map(|r| (r["round"].as_u64().unwrap_or(0), f(&r["usecs_per_op"])))
        .collect();
    let best = |c: Config| {
        of(c)
            .iter()
            .map(|r| f(&r["usecs_per_op"]))
            .fold(f64::INFINITY, f64::min)
    };
    let best_base = best(Config::Baseline);
    let mut rows = Vec::new();
    let mut overhead = BTreeMap::new();
    let mut best_overhead = BTreeMap::new();
    for &c in configs {
        let rs = of(c);
        let best_usecs = best(c);
        let best_o = best_usecs / best_base - 1.0;
        best_overhead.insert(c.name(), best_o);
        let ratios: Vec<f64> = rs
            .iter()
            .filter_map(|r| {
                let b = base.get(&r["round"].as_u64().unwrap_or(0))?;
                Some(f(&r["usecs_per_op"]) / b - 1.0)
            })
            .collect();
        let o = median(ratios.clone());
        overhead.insert(c.name(), o);
        let tracer =
            |k: &str| -> Vec<f64> { rs.iter().filter_map(|r| r["tracer"][k].as_f64()).collect() };
        rows.push(json!({
            "config": c.name(),
            "median_usecs_per_op": median(rs.iter().map(|r| f(&r["usecs_per_op"])).collect()),
            "median_overhead": o,
            "best_usecs_per_op": best_usecs,
            "best_overhead": best_o,
            "overheads": ratios,
            "tracer_cpu_share_median": nan_null(median(tracer("own_cpu_share"))),
            "tracer_peak_rss_bytes_max": tracer("own_peak_rss_bytes").into_iter().reduce(f64::max),
            "dropped_events_total": tracer("dropped_events").iter().sum::<f64>(),
            "target_switches_per_s_median": nan_null(median(tracer("target_switches_per_s"))),
            "perf_data_bytes_median": nan_null(median(
                rs.iter().filter_map(|r| r["perf_data_bytes"].as_f64()).collect()
            )),
        }));
    }
    let get = |c: Config| overhead.get(c.name()).copied().unwrap_or(f64::NAN);
    let floor = get(Config::EmptyProbes);
    let (unrelated, on, perf, rq) = (
        get(Config::TracerUnrelated),
        get(Config::TracerOnBench),
        get(Config::PerfSched),
        get(Config::Runqlat),
    );
    let row = |c: Config| rows.iter().find(|r| r["config"] == c.name()).cloned();
    let cpu = [Config::TracerUnrelated, Config::TracerOnBench]
        .iter()
        .filter_map(|&c| row(c)?["tracer_cpu_share_median"].as_f64())
        .fold(0.0, f64::max);
    let rss = [Config::TracerUnrelated, Config::TracerOnBench]
        .iter()
        .filter_map(|&c| row(c)?["tracer_peak_rss_bytes_max"].as_f64())
        .fold(0.0, f64::max);
    let best_of = |c: Config| best_overhead.get(c.name()).copied().unwrap_or(f64::NAN);
    let (best_on, best_perf) = (best_of(Config::TracerOnBench), best_of(Config::PerfSched));
    // Drops: over every run with the tracer on the benchmark, timed or not; the rate: the
    // highest any of them reached.
    let tracer_runs: Vec<&Value> = of(Config::TracerOnBench)
        .into_iter()
        .map(|r| &r["tracer"])
        .chain([high_rate, with_trace])
        .collect();
    let dropped: f64 = tracer_runs.iter().map(|t| f(&t["dropped_events"])).sum();
    let rate = tracer_runs
        .iter()
        .map(|t| f(&t["target_switches_per_s"]))
        .fold(0.0, f64::max);
    // The early exit with a 20-process set against one process: the context switch program,
    // the one every switch of the machine runs.
    let switch_ns = |case: &str| {
        stats[case]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| {
                p["program"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("sched_switch"))
            })
            .map_or(f64::NAN, |p| f(&p["ns_per_run"]))
    };
    let tree_extra = switch_ns("unrelated_pid_20_processes") - switch_ns("unrelated_pid");
    let targets = json!([
        {"target": "early exit (sched_switch), 20-process set: <= 10 ns/run above a 1-process set (medians of 5 rounds)",
         "value": nan_null(tree_extra), "limit": 10.0, "met": tree_extra <= 10.0},
        {"target": "unrelated PID: median slowdown < 1 %", "value": unrelated, "met": unrelated < 0.01},
        {"target": "unrelated PID, above the floor (empty programs on the same tracepoints): < 1 %",
         "value": unrelated - floor, "met": unrelated - floor < 0.01},
        {"target": "on the benchmark: <= 1/5 of perf sched record's slowdown (medians)",
         "value": on, "limit": perf / 5.0, "met": on <= perf / 5.0},
        {"target": "on the benchmark: <= 1/5 of perf sched record's slowdown (best runs)",
         "value": best_on, "limit": best_perf / 5.0, "met": best_on <= best_perf / 5.0},
        {"target": "on the benchmark: no worse than runqlat.bt", "value": on, "limit": rq,
         "met": rq.is_nan() || on <= rq},
        {"target": "no dropped events at >= 200k target switches/s (every run on the benchmark)",
         "value": dropped, "switches_per_s": rate,
         "met": dropped == 0.0 && rate >= 200_000.0},
        {"target": "userspace < 2 % of one core", "value": cpu, "met": cpu < 0.02},
        {"target": "userspace < 2 % of one core, writing a trace file (every state change)",
         "value": with_trace["own_cpu_share"], "met": f(&with_trace["own_cpu_share"]) < 0.02},
        {"target": "peak RSS < 50 MB", "value": rss, "met": rss > 0.0 && rss < 50e6},
    ]);
    json!({"configs": rows, "targets": targets, "bpf": stats})
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn nan_null(x: f64) -> Value {
    if x.is_nan() { Value::Null } else { json!(x) }
}

/// The table BENCHMARKS.md quotes.
pub fn render(doc: &Value) -> String {
    let mut s = String::new();
    let m = &doc["machine"];
    s += &format!(
        "machine: {} ({} CPUs), kernel {}; perf bench sched pipe -T -l {} on CPU {}, \
         observers on CPU {}, {} interleaved rounds\n\n",
        m["cpu_model"].as_str().unwrap_or("?"),
        m["cpus"],
        m["kernel"].as_str().unwrap_or("?"),
        doc["loops"],
        doc["bench_cpu"].as_str().unwrap_or("?"),
        doc["observer_cpu"].as_str().unwrap_or("?"),
        doc["rounds"]
    );
    s += &format!(
        "{:<26} {:>9} {:>9} {:>9} {:>9} {:>11} {:>7} {:>8} {:>11}\n",
        "configuration",
        "usecs/op",
        "slowdown",
        "best run",
        "its slow",
        "tracer CPU",
        "RSS MB",
        "dropped",
        "switches/s"
    );
    let opt = |v: &Value, scale: f64, fmt: &dyn Fn(f64) -> String| {
        v.as_f64().map_or("-".to_string(), |x| fmt(x * scale))
    };
    for r in doc["report"]["configs"].as_array().into_iter().flatten() {
        let tracer = r["tracer_cpu_share_median"].is_number();
        s += &format!(
            "{:<26} {:>9.3} {:>8.1}% {:>9.3} {:>8.1}% {:>11} {:>7} {:>8} {:>11}\n",
            r["config"].as_str().unwrap_or("?"),
            f(&r["median_usecs_per_op"]),
            100.0 * f(&r["median_overhead"]),
            f(&r["best_usecs_per_op"]),
            100.0 * f(&r["best_overhead"]),
            opt(&r["tracer_cpu_share_median"], 100.0, &|x| format!(
                "{x:.2}%"
            )),
            opt(&r["tracer_peak_rss_bytes_max"], 1e-6, &|x| format!(
                "{x:.1}"
            )),
            if tracer {
                format!("{}", r["dropped_events_total"])
            } else {
                "-".into()
            },
            opt(&r["target_switches_per_s_median"], 1.0, &|x| format!(
                "{x:.0}"
            )),
        );
    }
    if let Some(b) = doc["bpf_run_stats"].as_object() {
        for (case, progs) in b {
            s += &format!("\nBPF run statistics, {case}:\n");
            for p in progs.as_array().into_iter().flatten() {
                s += &format!(
                    "  {:<18} {:>10} runs {:>8.0} ns/run\n",
                    p["program"].as_str().unwrap_or("?"),
                    p["runs"],
                    f(&p["ns_per_run"])
                );
            }
        }
    }
    let h = &doc["high_rate"];
    s += &format!(
        "\nhigh rate (the benchmark on every CPU, the tracer on it): {:.0} target switches/s, \
         {:.0} events/s, {} dropped, tracer CPU {:.2}% of one CPU\n",
        f(&h["target_switches_per_s"]),
        f(&h["events_per_s"]),
        h["dropped_events"],
        100.0 * f(&h["own_cpu_share"])
    );
    let t = &doc["with_trace_file"];
    s += &format!(
        "with a trace file (every state change through the ring buffer): {:.0} target \
         switches/s, {:.0} events/s, {} dropped, tracer CPU {:.2}% of one CPU\n",
        f(&t["target_switches_per_s"]),
        f(&t["events_per_s"]),
        t["dropped_events"],
        100.0 * f(&t["own_cpu_share"])
    );
    s += "\ntargets:\n";
    for t in doc["report"]["targets"].as_array().into_iter().flatten() {
        s += &format!(
            "  [{}] {} (measured {}{})\n",
            if t["met"] == true { "met" } else { "MISSED" },
            t["target"].as_str().unwrap_or("?"),
            t["value"],
            t.get("limit")
                .map_or(String::new(), |l| format!(", limit {l}"))
        );
    }
    s
}

pub fn runs_json(runs: &[Run]) -> Vec<Value> {
    runs.iter()
        .map(|r| {
            json!({
                "config": r.config.name(),
                "round": r.round,
                "usecs_per_op": r.usecs_per_op,
                "tracer": r.tracer.as_ref().map(tracer_part),
                "perf_data_bytes": r.perf_data_bytes,
            })
        })
        .collect()
}

/// What the bench keeps of the tracer's document: its own cost and the event accounting.
pub fn tracer_part(doc: &Value) -> Value {
    let dur = doc["duration_ns"].as_f64().unwrap_or(0.0).max(1.0);
    let switches: f64 = doc["threads"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| {
                    t["voluntary_switches"].as_f64().unwrap_or(0.0)
                        + t["involuntary_switches"].as_f64().unwrap_or(0.0)
                })
                .sum()
        })
        .unwrap_or(0.0);
    json!({
        "duration_ns": doc["duration_ns"],
        "own_cpu_ns": doc["tracer_cost"]["cpu_ns"],
        "own_cpu_share": doc["tracer_cost"]["cpu_share"],
        "own_peak_rss_bytes": doc["tracer_cost"]["peak_rss_bytes"],
        "events_received": doc["events_received"],
        "dropped_events": doc["dropped_events"],
        "target_switches_per_s": switches * 1e9 / dur,
        "events_per_s": doc["events_received"].as_f64().unwrap_or(0.0) * 1e9 / dur,
    })
}
