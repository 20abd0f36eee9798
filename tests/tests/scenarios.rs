//! The demo's scenarios: each injects one cause with known ground truth into the built-in
//! server, and the verdict must name it (docs/ATTRIBUTION.md).

use tracer_tests::{require_root, run_tracer, serial, steal_ns, u};

/// One scenario run: its document, and the outside disturbance that spoiled it, when every
/// attempt had one.
struct Run {
    doc: serde_json::Value,
    disturbed: Option<String>,
    /// Every attempt's injected cause had no effect on this host (`demo.no_effect`).
    no_effect: bool,
}

fn scenario(name: &str) -> Run {
    // A run whose verdict names a process the scenario did not start (kdamond paging out
    // memory after a build, in our CI), during which the hypervisor stole 5 ms or more of a
    // CPU, or (nothing injected) whose server had a tail before the tracer attached or one of
    // longer on-CPU time for the same work, measured
    // a real disturbance, but not the injected one: it is repeated, at most
    // twice, after a pause (the host's steal comes in bursts). The steal the demo read is
    // checked against /proc/stat read here around the run: a disturbance the tracer claims
    // and the kernel's own count does not show is no excuse.
    let mut last = String::new();
    for attempt in 1..=3 {
        let steal_before = steal_ns();
        let out = run_tracer(&[
            "demo",
            "--scenario",
            name,
            "--duration",
            "3s",
            "--json",
            "--quiet",
        ]);
        let stolen = steal_ns() - steal_before;
        assert!(out.status.success(), "{name}: {}", out.stderr);
        let doc = out.json();
        let demo = &doc["demo"];
        let i = &demo["interference"];
        let no_effect = demo["no_effect"] == true;
        if demo["correct"] == true || (i.is_null() && !no_effect) {
            return Run {
                doc,
                disturbed: None,
                no_effect: false,
            };
        }
        if no_effect {
            // The injected cause did not slow the server here (its own log, before and
            // during): there was no tail of its making, and nothing to score.
            let (b, r) = (&demo["latency_baseline"], &demo["latency_recorded"]);
            last = format!(
                "no effect: p99 {} ns during, {} ns before",
                r["p99_ns"], b["p99_ns"]
            );
            eprintln!("{name}: run {attempt}: the injected cause had {last}, repeating it");
            if attempt == 3 {
                return Run {
                    doc,
                    disturbed: Some(last),
                    no_effect: true,
                };
            }
            continue;
        }
        if u(&i["pid"]) == 0 && i["wait_share"] == 0.0 {
            // The host, in a quiet server: by its own tail before attaching (its log says
            // so), or by a tail the verdict found mostly in longer on-CPU time, no cause
            // named (the same work in every request: only the host's CPU makes that).
            let b = &demo["latency_baseline"];
            let v = &doc["verdict"];
            let top = &v["causes"][0];
            let oncpu = v["primary"] == "unexplained"
                && top["mechanism_id"] == "longer_oncpu"
                && top["share"].as_f64().unwrap() >= 0.5;
            assert!(
                demo["expected_primary"] == "none"
                    && (u(&b["p99_ns"]) * 2 >= u(&b["p50_ns"]) * 3 || oncpu),
                "{name}: the demo claims {i} against a baseline of {b} and a verdict of {v}"
            );
        } else if u(&i["pid"]) == 0 {
            // The demo's worst CPU over its window (a share of the 3 s) within all CPUs'
            // steal over this longer one: never more, but for rounding. Both are read in
            // /proc/stat's 10 ms ticks, each within a tick of the truth: two ticks apart at
            // most, and 2 % for the share's rounding.
            let claimed = (i["wait_share"].as_f64().unwrap() * 3e9) as u64;
            assert!(
                stolen + stolen / 50 + 20_000_000 >= claimed,
                "{name}: the demo claims {i} but /proc/stat shows {stolen} ns stolen"
            );
        }
        last = format!("{i} ({stolen} ns stolen by /proc/stat)");
        eprintln!("{name}: run {attempt} disturbed from outside ({last}), repeating it");
        if attempt == 3 {
            return Run {
                doc,
                disturbed: Some(last),
                no_effect: false,
            };
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    unreachable!("{last}")
}

#[test]
fn every_cpu_scenario_gives_the_expected_verdict() {
    let _guard = serial();
    require_root();
    let mut wrong = Vec::new();
    for name in [
        "quiet",
        "cpu-contention",
        "cfs-throttle",
        "migration-storm",
        "cache-thrash",
        // A front end and its engine child, attached by the front end's PID: the verdict the
        // engine would give, found in the engine (`correct` checks `acts_in`).
        "multiprocess-quiet",
        "multiprocess-cpu-contention",
        // Who held up whom: a native mutex a sibling holds, the GIL, a garbage collection.
        "lock-contention",
        "gil-contention",
        "gc-pause",
        // Following the queue: the long requests named (their ids against the server's own).
        "head-of-line",
    ] {
        // A verdict is a rate over runs, and this VM's host sometimes slows one (quiet gave
        // "unexplained: longer on-CPU time" in 2 of 26 runs of a 20-run loop): a wrong verdict
        // is run twice more, and both must be right: 2 runs of 3. A broken rule is wrong in
        // all of them.
        let run = scenario(name);
        let mut doc = run.doc;
        let mut misses = Vec::new();
        let mut disturbed = Vec::new();
        let mut no_effect = run.no_effect;
        let mut correct = doc["demo"]["correct"] == true;
        let mut score = |doc: &serde_json::Value, d: Option<String>| {
            if doc["demo"]["correct"] == true {
                return true;
            }
            match d {
                Some(d) => disturbed.push(d),
                None => misses.push(doc["verdict"]["headline"].to_string()),
            }
            false
        };
        if !correct {
            score(&doc, run.disturbed);
            for _ in 0..2 {
                let again = scenario(name);
                correct |= score(&again.doc, again.disturbed);
                no_effect &= again.no_effect;
                doc = again.doc;
            }
        }
        let v = &doc["verdict"];
        let demo = &doc["demo"];
        if misses.len() > 1 {
            wrong.push(format!(
                "{name}: expected {} ({}), got {}: {} (earlier: {misses:?})",
                demo["expected_primary"], demo["expected_mechanism"], v["primary"], v["headline"]
            ));
        }
        // Every run disturbed from outside (9 runs, each 3 s, over about a minute): the
        // scenario could not be judged here. An injected cause is larger than the host's noise
        // and must still be named; a quiet server's verdict is the noise, and is then said
        // not judged, with what disturbed it.
        // Likewise a cause whose effect depends on the host that had none in any run.
        // But a quiet server whose every run ended in a tail of longer on-CPU time, its log
        // calm before each, is not excused by that alone: the rule rests on the verdict, and
        // the tracer's own cost in the server's context would look the same.
        let oncpu_only = !disturbed.is_empty()
            && disturbed
                .iter()
                .all(|d| d.contains("longer on-CPU time") && !d.contains("log before"));
        if !correct && misses.is_empty() {
            if oncpu_only {
                wrong.push(format!(
                    "{name}: every run's tail was longer on-CPU time after a calm log: \
                     {disturbed:?}"
                ));
            } else if demo["expected_primary"] == "none" || no_effect {
                eprintln!("{name}: not judged, every run was disturbed: {disturbed:?}");
            } else {
                wrong.push(format!("{name}: every run disturbed: {disturbed:?}"));
            }
        }
        // Marker mode (the CPython server: its latency log): every request decomposes into the
        // parts of its wall time (within 5 %). (About 1,000 requests in 3 s; the cache-thrash
        // neighbours slowed the server to 292 once; the CPython one serves 100 a second.)
        let r = &doc["requests"];
        let python = matches!(name, "gil-contention" | "gc-pause" | "head-of-line");
        assert_eq!(
            r["source"],
            if python { "file" } else { "markers" },
            "{name}"
        );
        assert!(
            u(&r["requests"]) >= if python { 150 } else { 200 },
            "{name}: {} requests",
            r["requests"]
        );
        let closed = r["closure_within_5pct"].as_f64().unwrap();
        assert!(
            closed >= 0.99,
            "{name}: only {closed} of the requests close within 5 %"
        );
        if name.starts_with("multiprocess-") {
            let procs = doc["processes"].as_array().expect("processes");
            let engine = u(&demo["engine_pid"]);
            assert_eq!(procs.len(), 2, "{name}: {procs:?}");
            assert_eq!(procs[0]["given"], true, "{name}: the front end first");
            assert_eq!(u(&procs[1]["pid"]), engine, "{name}: {procs:?}");
            assert_eq!(procs[1]["role"], "demo_engine", "{name}");
        }
        if name.ends_with("cpu-contention") {
            // The hogs are who the server waited behind (77-88 % of the waiting in 40 runs),
            // and the server's own log shows its tail going up.
            let top = &doc["preemptor_processes"][0];
            assert_eq!(top["comm"], "cpu-hog", "{top}");
            assert!(top["wait_share"].as_f64().unwrap() > 0.7, "{top}");
            // The baseline's p99, capped at twice its median: a baseline the host disturbed
            // (a CI run's was 3.0 ms for 1 ms requests, after a build) says nothing about
            // what the hogs did.
            let b = &demo["latency_baseline"];
            let base = u(&b["p99_ns"]).min(2 * u(&b["p50_ns"]));
            let hit = u(&demo["latency_recorded"]["p99_ns"]);
            assert!(hit > 2 * base, "p99 under hogs {hit} vs baseline {base}");
        }
        if name == "head-of-line" && correct {
            // The queue was part of the tail and was followed to the long requests: those
            // named are ones the server itself wrote down as long (`correct` checked it; this
            // says which part failed when one does).
            let q = &demo["queue"];
            assert_eq!(q["judged"], true, "{q}");
            assert!(q["to_cause"].as_f64().unwrap() >= 0.8, "{q}");
            assert!(u(&q["named"]) > 0 && q["named"] == q["named_long"], "{q}");
        }
        if name == "cache-thrash" {
            // No PMU on our machines: the cache is not assessed, and not called absent.
            let na = v["not_assessed"].as_array().unwrap();
            assert!(na.iter().any(|n| n["signal"] == "cache_misses"), "{v}");
        }
    }
    // The cfs-throttle scenario removed the cgroup it made.
    let left: Vec<_> = ["/sys/fs/cgroup", "/sys/fs/cgroup/cpu"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|d| d.flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with("tracer-demo-"))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    assert!(wrong.is_empty(), "wrong verdicts:\n{}", wrong.join("\n"));
}

#[test]
fn a_gpu_scenario_without_a_gpu_says_what_it_needs() {
    let _guard = serial();
    require_root();
    if std::path::Path::new("/dev/nvidiactl").exists() {
        return; // a GPU machine runs it for real (docs/GPU.md)
    }
    let out = run_tracer(&["demo", "--scenario", "gpu-saturation", "--quiet"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("PyTorch") || out.stderr.contains("GPU"),
        "{}",
        out.stderr
    );
}
