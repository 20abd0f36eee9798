//! The trace file and the outputs made from a recording: record then report gives the same
//! document; damaged, foreign and newer files are named and what can be is recovered; Perfetto
//! output parsed back by protoc with Perfetto's field numbers; HTML rendered by Chromium; the
//! JSON validated against the committed schema; damaged frame headers, appended traces and a
//! decompression bomb refused at their offset.

#[path = "trace_file/bytes.rs"]
mod bytes;
#[path = "trace_file/frames.rs"]
mod frames;

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use tracer_tests::{
    Testload, Tracer, require_root, run_tracer, schema::assert_matches_schema, serial,
    tracer_programs, u,
};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fake_libcuda(dir: &Path) -> PathBuf {
    let lib = dir.join("libcuda.so.1");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fakecuda/fakecuda.c");
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(ok.success());
    lib
}

/// Records the CUDA stand-in workload with software counters into `trace`, with every
/// output, and returns the JSON the recording printed.
fn record_everything(dir: &Path) -> (serde_json::Value, PathBuf) {
    let lib = fake_libcuda(dir);
    let mut load = Testload::spawn(&["cuda", lib.to_str().unwrap()]);
    load.settle();
    let pid = load.pid.to_string();
    let trace = dir.join("rec.trace");
    let tracer = Tracer::start(&[
        "attach",
        "--pid",
        &pid,
        "--duration",
        "60s",
        "--json",
        "--counters",
        "software",
        "-o",
        trace.to_str().unwrap(),
        "--perfetto",
        dir.join("rec.pftrace").to_str().unwrap(),
        "--html",
        dir.join("rec.html").to_str().unwrap(),
    ]);
    load.send("go");
    load.expect("done");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.stderr);
    (out.json(), trace)
}

#[test]
fn record_then_report_gives_the_same_document_and_every_output() {
    let _guard = serial();
    require_root();
    let dir = scratch("roundtrip");
    let (recorded, trace) = record_everything(&dir);

    // The trace is complete, private, and the temporary file is gone.
    let mode = std::fs::metadata(&trace).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!dir.join("rec.trace.tmp").exists());

    let report = run_tracer(&["report", trace.to_str().unwrap(), "--json"]);
    assert!(report.status.success(), "{}", report.stderr);
    assert_eq!(
        report.json(),
        recorded,
        "report --json differs from attach --json"
    );
    // The document carried something of every kind.
    assert!(u(&recorded["cuda"]["sync_calls"]) > 0);
    assert!(
        !recorded["counters"]["series"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Text report works too.
    let text = run_tracer(&["report", trace.to_str().unwrap()]);
    assert!(text.status.success());
    assert!(text.stdout.contains("recorded"), "{}", text.stdout);

    check_perfetto(&dir.join("rec.pftrace"));
    check_html(&dir.join("rec.html"));
    assert_matches_schema(&recorded, "summary", "attach with every output");
    // Outputs from report are the same kind of files.
    let again = dir.join("again.pftrace");
    let r = run_tracer(&[
        "report",
        trace.to_str().unwrap(),
        "--perfetto",
        again.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", r.stderr);
    check_perfetto(&again);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decodes with protoc and Perfetto's field numbers (tests/perfetto/trace_minimal.proto).
fn check_perfetto(path: &Path) {
    let proto_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("perfetto");
    let out = Command::new("protoc")
        .arg("--decode=perfetto.protos.Trace")
        .arg(format!("-I{}", proto_dir.display()))
        .arg(proto_dir.join("trace_minimal.proto"))
        .stdin(std::fs::File::open(path).unwrap())
        .output()
        .expect("protoc (protobuf-compiler; cargo xtask setup installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "protoc could not decode {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let begins = text.matches("type: TYPE_SLICE_BEGIN").count();
    assert!(begins > 100, "too few slices: {begins}");
    assert_eq!(begins, text.matches("type: TYPE_SLICE_END").count());
    assert!(
        text.contains("thread_name: \"load-0\""),
        "no thread track for the worker"
    );
    assert!(text.contains("process_name: \"tracer-testload\""));
    for track in [
        "run-queue wait per bin",
        "threads waiting on the GPU (CUDA sync)",
        ": CUDA sync",
    ] {
        assert!(text.contains(track), "no {track:?} track");
    }
    assert!(text.contains("name: \"cuStreamSynchronize\""));
    assert!(text.matches("type: TYPE_COUNTER").count() > 10);
}

/// Renders the page in headless Chromium: it must load with no console message (no script
/// error, no failed fetch) and make a real picture. (tests/html.rs drives it further.)
fn check_html(path: &Path) {
    let html = std::fs::read_to_string(path).unwrap();
    // Nothing fetched: no linked resource, no script from a file or address.
    for forbidden in ["<link", " src=", "@import", "url(", "<script src"] {
        assert!(
            !html.contains(forbidden),
            "the page is not self-contained: {forbidden}"
        );
    }
    assert!(
        html.contains("<script id=\"data\" type=\"application/json\">"),
        "no data"
    );
    let png = path.with_extension("png");
    let profile = path.with_extension("chromium-profile");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1300,1400",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", path.display()))
        .output()
        .expect("chromium (cargo xtask setup installs it)");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium failed: {log}");
    let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 20_000,
        "the screenshot is too small to hold the charts: {size} bytes"
    );
}

#[test]
fn damaged_foreign_and_newer_files_are_named_and_recovered_from() {
    let _guard = serial();
    require_root();
    let dir = scratch("damaged");
    let load = Testload::spawn(&["mixed", "2"]);
    let trace = dir.join("ok.trace");
    let pid = load.pid.to_string();
    let rec = run_tracer(&[
        "attach",
        "--pid",
        &pid,
        "--duration",
        "1500ms",
        "-q",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(rec.status.success(), "{}", rec.stderr);
    let bytes = std::fs::read(&trace).unwrap();

    // Cut short: the complete frames are read, the summary is rebuilt, and the exit says why.
    let cut = dir.join("cut.trace");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let out = run_tracer(&["report", cut.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("cut short"), "{}", out.stderr);
    let doc = out.json();
    assert_eq!(doc["end_reason"], "unfinished");
    assert!(doc["incomplete"].as_str().is_some());
    assert!(!doc["threads"].as_array().unwrap().is_empty());

    // A flipped byte: the frame is refused by its checksum, the rest is recovered.
    let mut bad = bytes.clone();
    let mid = bytes.len() / 2;
    bad[mid] ^= 0x5a;
    let corrupt = dir.join("corrupt.trace");
    std::fs::write(&corrupt, &bad).unwrap();
    let out = run_tracer(&["report", corrupt.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("corrupt frame"), "{}", out.stderr);
    assert!(
        out.stdout.contains("from an unfinished trace file"),
        "{}",
        out.stdout
    );

    // Not a trace file at all.
    let foreign = dir.join("foreign.json");
    std::fs::write(&foreign, b"{\"traceEvents\": []}").unwrap();
    let out = run_tracer(&["report", foreign.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("not a tracer trace file"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty());
    // An empty file says so, not that it is some other program's.
    let empty = dir.join("empty.trace");
    std::fs::write(&empty, b"").unwrap();
    let out = run_tracer(&["report", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("the file is empty"), "{}", out.stderr);

    // From a newer tracer: says so, does not guess.
    let mut newer = bytes.clone();
    newer[8] = newer[8].wrapping_add(1);
    let newer_path = dir.join("newer.trace");
    std::fs::write(&newer_path, &newer).unwrap();
    let out = run_tracer(&["report", newer_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("newer tracer"), "{}", out.stderr);

    // A missing file.
    let out = run_tracer(&["report", dir.join("missing.trace").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("No such file"), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_leaves_a_recoverable_partial_trace_and_no_probes() {
    let _guard = serial();
    require_root();
    let dir = scratch("sigkill");
    let load = Testload::spawn(&["mixed", "2"]);
    let pid = load.pid.to_string();
    let trace = dir.join("killed.trace");
    let before = tracer_programs();
    let tracer = Tracer::start(&[
        "attach",
        "--pid",
        &pid,
        "--duration",
        "60s",
        "-o",
        trace.to_str().unwrap(),
    ]);
    // More than one flush interval, so the timeline reached the file.
    std::thread::sleep(Duration::from_millis(2500));
    tracer.signal(libc::SIGKILL);
    let _ = tracer.finish(Duration::from_secs(10));
    assert!(
        !trace.exists(),
        "the final name only appears once the file is complete"
    );
    let tmp = dir.join("killed.trace.tmp");
    let mode = std::fs::metadata(&tmp).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = run_tracer(&["report", tmp.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("not finished"), "{}", out.stderr);
    let doc = out.json();
    assert!(
        u(&doc["duration_ns"]) > 1_000_000_000,
        "at most the last second is lost"
    );
    // The kernel dropped the probes with the process's file descriptors. It frees them from a
    // deferred work item, so they may take a moment to vanish from the list.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while tracer_programs() != before && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        tracer_programs(),
        before,
        "BPF programs left attached after SIGKILL"
    );
    // A new recording to the same path is refused until the partial file is dealt with.
    let out = run_tracer(&[
        "attach",
        "--pid",
        &pid,
        "-d",
        "200ms",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("left by an interrupted recording"),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn output_paths_that_cannot_be_written_fail_before_recording() {
    let _guard = serial();
    require_root();
    let dir = scratch("paths");
    let load = Testload::spawn(&["mixed", "1"]);
    let pid = load.pid.to_string();
    let target = dir.join("real.trace");
    let link = dir.join("link.trace");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let record_to = |path: &Path| {
        run_tracer(&[
            "attach",
            "--pid",
            &pid,
            "-d",
            "200ms",
            "-o",
            path.to_str().unwrap(),
        ])
    };
    let out = record_to(&link);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
    assert!(!target.exists(), "wrote through the link");
    let nodir = dir.join("no/such/dir/x.trace");
    let out = record_to(&nodir);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("directory exists"), "{}", out.stderr);
    assert!(
        !out.stderr.contains("recording PID"),
        "it should fail before recording: {}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}
