//! The Perfetto trace of a real recording (the cpu-contention demo: requests, a hog preempting
//! the server), decoded with Perfetto's own published protos (the `perfetto` package from PyPI,
//! installed into a virtual environment under target/ on first use) by tests/perfetto/check.py:
//! one request slice per decomposed request, run-queue waits that name the task before them,
//! per-CPU tracks, a MONOTONIC clock snapshot, and timestamps in order.

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

#[test]
fn perfettos_own_protos_read_requests_preemptors_and_cpus() {
    let _guard = serial();
    require_root();
    let py = python();
    let dir = std::env::temp_dir().join(format!("tracer-perfetto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("demo.pftrace");
    let out = run_tracer(&[
        "demo",
        "--scenario",
        "cpu-contention",
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
    assert_eq!(got["out_of_order"], 0, "timestamps go back: {got}");
    assert_eq!(
        got["slices"]["requests"], doc["requests"]["requests"],
        "a request slice per decomposed request: {got}"
    );
    assert!(u(&got["slices"]["cpu"]) > 100, "per-CPU tracks: {got}");
    // Every wait a switch-in ended names what ran before it: all but each thread's last,
    // which the window's end may cut.
    let threads = doc["threads"].as_array().unwrap().len() as u64;
    assert!(u(&got["waits"]) > 100, "{got}");
    assert!(
        u(&got["annotated_waits"]) + threads >= u(&got["waits"]),
        "{got}"
    );
    // MONOTONIC (3) is the timestamps' clock, with REALTIME (1) beside it.
    assert_eq!(got["default_clock"], 3, "{got}");
    assert_eq!(got["clock_snapshot"]["primary"], 3, "{got}");
    assert_eq!(got["clock_snapshot"]["clocks"], serde_json::json!([1, 3]));
    let _ = std::fs::remove_dir_all(&dir);
}
