//! The JSON contract: the real output of every mode that prints `--json` (attach in each
//! counter mode, with request markers and without, run with and without a latency log,
//! report of a trace file, demo) matches its committed schema, checked strictly
//! (`tracer_tests::schema`). Issue 13: the default `attach --json` failed the schema it
//! shipped with, and demo's document had none.

use std::{path::PathBuf, process::Command, time::Duration};

use serde_json::Value;
use tracer_tests::{
    Testload, Tracer, require_root, run_tracer,
    schema::{assert_matches_schema, schema_errors},
    serial, tracer_bin,
};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-schema-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether any thread entry carries `counter_bins` (serde leaves the field out when empty).
fn threads_with_bins(doc: &Value) -> usize {
    doc["threads"]
        .as_array()
        .expect("threads[]")
        .iter()
        .filter(|t| t.get("counter_bins").is_some())
        .count()
}

/// `attach --json --counters MODE` over one round of the test workload's work.
fn attach_round(load: &mut Testload, counters: &str) -> Value {
    let pid = load.pid.to_string();
    let tracer = Tracer::start(&[
        "attach",
        "--pid",
        &pid,
        "--duration",
        "60s",
        "--json",
        "--counters",
        counters,
    ]);
    load.send("go");
    load.expect("done");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(30));
    assert!(
        out.status.success(),
        "--counters {counters}: {}",
        out.stderr
    );
    out.json()
}

#[test]
fn attach_matches_the_schema_in_every_counter_mode() {
    let _guard = serial();
    require_root();
    let mut load = Testload::spawn(&["mixed", "2"]);
    load.settle();
    for counters in ["auto", "none", "software"] {
        let doc = attach_round(&mut load, counters);
        assert_matches_schema(&doc, "summary", &format!("attach --counters {counters}"));
        assert!(doc["requests"].is_null(), "no requests were asked for");
        // Both shapes of a thread entry are exercised: without counters (no PMU, or none
        // asked for) every thread leaves `counter_bins` out; software counters always count.
        match counters {
            "none" => assert_eq!(threads_with_bins(&doc), 0),
            "software" => assert!(threads_with_bins(&doc) > 0, "no thread has counter bins"),
            _ => {}
        }
    }
}

/// `tracer workload`, the built-in server with request markers, for `duration`.
fn server(duration: &str, log: &std::path::Path) -> Command {
    let mut cmd = Command::new(tracer_bin());
    cmd.args([
        "workload",
        "--workers=1",
        "--rate=300",
        "--cpus=0",
        &format!("--duration={duration}"),
    ])
    .arg(format!("--latency-log={}", log.display()));
    cmd
}

#[test]
fn attach_with_request_markers_and_report_of_its_trace_match_the_schema() {
    let _guard = serial();
    require_root();
    let dir = scratch("markers");
    let (log, trace) = (dir.join("requests.jsonl"), dir.join("rec.trace"));
    // Past the window with room to spare: attaching takes up to a second on a loaded VM, and
    // the server must still be running when the window ends.
    let mut server = server("4s", &log).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let exe = tracer_bin().display().to_string();
    let (start, end) = (
        format!("{exe}:tracer_request_start"),
        format!("{exe}:tracer_request_end"),
    );
    let pid = server.id().to_string();
    let out = run_tracer(&[
        "attach",
        "--pid",
        &pid,
        "-d",
        "1s",
        "--json",
        "--quiet",
        "--request-start",
        &start,
        "--request-end",
        &end,
        "--request-id-arg",
        "0",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(server.wait().unwrap().success());
    let doc = out.json();
    assert_eq!(doc["requests"]["source"], "markers");
    assert_matches_schema(&doc, "summary", "attach with request markers");

    let trace = trace.to_str().unwrap();
    let rep = run_tracer(&["report", trace, "--json"]);
    assert!(rep.status.success(), "{}", rep.stderr);
    assert_matches_schema(&rep.json(), "summary", "report");
    let rep = run_tracer(&[
        "report",
        trace,
        "--json",
        "--latencies",
        log.to_str().unwrap(),
    ]);
    assert!(rep.status.success(), "{}", rep.stderr);
    let doc = rep.json();
    assert_eq!(doc["requests"]["source"], "file");
    assert_matches_schema(&doc, "summary", "report --latencies");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_with_and_without_a_latency_log_matches_the_schema() {
    let _guard = serial();
    require_root();
    let dir = scratch("run");
    let log = dir.join("requests.jsonl");
    let exe = tracer_bin().display().to_string();
    let mut args = vec!["run", "--json", "--quiet", "--"];
    let command = [exe.as_str(), "workload", "--workers=1", "--rate=200"];
    args.extend(command);
    args.push("--duration=1s");
    let out = run_tracer(&args);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    assert!(doc["requests"].is_null());
    assert_matches_schema(&doc, "summary", "run");

    // The command writes the log as it exits; run reads it after.
    let log_arg = format!("--latency-log={}", log.display());
    let mut args = vec!["run", "--json", "--quiet", "--latencies"];
    args.extend([log.to_str().unwrap(), "--"]);
    args.extend(command);
    args.extend(["--duration=1s", log_arg.as_str()]);
    let out = run_tracer(&args);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    assert_eq!(doc["requests"]["source"], "file");
    assert_matches_schema(&doc, "summary", "run --latencies");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_matches_its_own_schema() {
    let _guard = serial();
    require_root();
    let out = run_tracer(&[
        "demo",
        "--scenario",
        "quiet",
        "--duration",
        "2s",
        "--json",
        "--quiet",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    assert_eq!(doc["demo"]["scenario"], "quiet");
    assert_matches_schema(&doc, "demo", "demo");
    // The validation is strict: the summary's schema does not describe the demo object.
    let errors = schema_errors(&doc, "summary");
    assert!(
        errors.iter().any(|e| e.contains("demo")),
        "the summary's schema accepted the demo document: {errors:?}"
    );
}
