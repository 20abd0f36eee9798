//! The Perfetto trace of a real recording (the cpu-contention demo: requests, a hog preempting
//! the server), decoded with Perfetto's own published protos (the `perfetto` package from PyPI,
//! installed into a virtual environment under target/ on first use) by tests/perfetto/check.py:
//! one request slice per decomposed request, run-queue waits that name the task before them,
//! per-CPU tracks, a MONOTONIC clock snapshot, timestamps in order, and (the gc-pause demo)
//! one slice per garbage collection.

use std::{path::PathBuf, process::Command};

use serde_json::Value;
use tracer_tests::{require_root, run_tracer, serial, u};

/// Pinned: the versions this check was written against.
const PACKAGES: [&str; 2] = ["perfetto==0.59.1", "protobuf==7.36.2"];

fn python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/perfetto-venv");
    let py = venv.join("bin/python3");
    let ready = Command::new(&py)
        .args([
            "-c",
            "import perfetto.protos.perfetto.trace.perfetto_trace_pb2",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 -m venv (Debian's python3-venv)");
        assert!(made.success(), "could not make {}", venv.display());
        let pip = Command::new(venv.join("bin/pip"))
            .args(["install", "-q"])
            .args(PACKAGES)
            .status()
            .expect("pip");
        assert!(pip.success(), "pip install {PACKAGES:?} failed");
    }
    py
}

/// Runs a demo scenario for 2 s with a Perfetto trace beside its JSON summary, and decodes the
/// trace with check.py: (summary, what the trace holds).
fn demo_trace(scenario: &str) -> (Value, Value) {
    let py = python();
    let dir = std::env::temp_dir().join(format!("tracer-perfetto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join(format!("{scenario}.pftrace"));
    let out = run_tracer(&[
        "demo",
        "--scenario",
        scenario,
        "--duration",
        "2s",
        "--json",
        "--quiet",
        "--perfetto",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let check = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("perfetto/check.py");
    let res = Command::new(&py).arg(check).arg(&trace).output().unwrap();
    assert!(
        res.status.success(),
        "{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let got: Value = serde_json::from_slice(&res.stdout).unwrap();
    eprintln!("{got}");
    let _ = std::fs::remove_dir_all(&dir);
    (doc, got)
}

#[test]
fn perfettos_own_protos_read_requests_preemptors_and_cpus() {
    let _guard = serial();
    require_root();
    let (doc, got) = demo_trace("cpu-contention");
    assert_eq!(got["out_of_order"], 0, "timestamps go back: {got}");
    assert_eq!(
        got["slices"]["requests"], doc["requests"]["requests"],
        "a request slice per decomposed request: {got}"
    );
    assert!(u(&got["slices"]["cpu"]) > 100, "per-CPU tracks: {got}");
    // Every wait a switch-in ended names what ran before it: all but each thread's last,
    // which the window's end may cut, and those whose switch-in no program saw (PID 1's on
    // our VMs, `losses.unseen_switch_ins`): what ran then is not known.
    let threads = doc["threads"].as_array().unwrap().len() as u64;
    let unseen = u(&doc["losses"]["unseen_switch_ins"]);
    assert!(u(&got["waits"]) > 100, "{got}");
    assert!(
        u(&got["annotated_waits"]) + threads + unseen >= u(&got["waits"]),
        "{got} (unseen switch-ins: {unseen})"
    );
    // MONOTONIC (3) is the timestamps' clock, with REALTIME (1) beside it.
    assert_eq!(got["default_clock"], 3, "{got}");
    assert_eq!(got["clock_snapshot"]["primary"], 3, "{got}");
    assert_eq!(got["clock_snapshot"]["clocks"], serde_json::json!([1, 3]));
}

/// The embedded CPython server's garbage collections (the gc-pause scenario: gen-2 collections
/// of a large cyclic heap) are slices of their own, one per collection the summary counts, each
/// with its generation.
#[test]
fn garbage_collections_are_slices_with_their_generation() {
    let _guard = serial();
    require_root();
    let (doc, got) = demo_trace("gc-pause");
    let gc = doc["gc"].as_array().expect("gc in the summary");
    let collections: u64 = gc.iter().map(|t| u(&t["collections"])).sum();
    let gen2: u64 = gc.iter().map(|t| u(&t["by_generation"][2])).sum();
    assert!(gen2 > 0, "the scenario's gen-2 collections: {doc}");
    assert_eq!(u(&got["slices"]["gc"]), collections, "{got}");
    let gens = got["gc_generations"].as_array().unwrap();
    assert_eq!(
        gens.len() as u64,
        collections,
        "each slice says its generation"
    );
    let traced_gen2 = gens.iter().filter(|g| u(g) == 2).count() as u64;
    assert_eq!(traced_gen2, gen2, "{got}");
    assert!(gens.iter().all(|g| u(g) <= 2), "{got}");
}
