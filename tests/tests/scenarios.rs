//! The demo's scenarios: each injects one cause with known ground truth into the built-in
//! server, and the verdict must name it (docs/ATTRIBUTION.md).

use tracer_tests::{require_root, run_tracer, serial, u};

fn scenario(name: &str) -> serde_json::Value {
    // A run whose verdict names a process the scenario did not start (kdamond paging out
    // memory after a build, in our CI) measured a real disturbance, but not the injected
    // one: it is repeated, at most twice.
    for attempt in 1..=3 {
        let out = run_tracer(&[
            "demo",
            "--scenario",
            name,
            "--duration",
            "3s",
            "--json",
            "--quiet",
        ]);
        assert!(out.status.success(), "{name}: {}", out.stderr);
        let doc = out.json();
        let demo = &doc["demo"];
        if demo["correct"] == true || demo["interference"].is_null() || attempt == 3 {
            return doc;
        }
        eprintln!(
            "{name}: run {attempt} disturbed from outside ({}), repeating it",
            demo["interference"]
        );
    }
    unreachable!()
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
    ] {
        // A verdict is a rate over runs, and this VM's host sometimes slows one (quiet gave
        // "unexplained: longer on-CPU time" in 2 of 26 runs of a 20-run loop): a wrong verdict
        // is run twice more, and both must be right: 2 runs of 3. A broken rule is wrong in
        // all of them.
        let mut doc = scenario(name);
        let mut misses = Vec::new();
        if doc["demo"]["correct"] != true {
            misses.push(doc["verdict"]["headline"].to_string());
            for _ in 0..2 {
                doc = scenario(name);
                if doc["demo"]["correct"] != true {
                    misses.push(doc["verdict"]["headline"].to_string());
                }
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
        // Marker mode (the CPython server: its latency log): every request decomposes into the
        // parts of its wall time (within 5 %). (About 1,000 requests in 3 s; the cache-thrash
        // neighbours slowed the server to 292 once; the CPython one serves 100 a second.)
        let r = &doc["requests"];
        let python = matches!(name, "gil-contention" | "gc-pause");
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
            // The hogs are who the server waited behind (85-95 % of the waiting in our runs),
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
