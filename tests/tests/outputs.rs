//! What the tool writes and how it ends (RELIABILITY.md): output paths that are not regular
//! files, the same file twice, stdout that fails, exit statuses, a file being written by another
//! tracer, ownership through sudo, bounded counter series, the latency log checked first, and
//! signals after the window.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::{ffi::OsStrExt as _, fs::FileTypeExt as _, fs::MetadataExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tracer_tests::{Kill, Tracer, require_root, run_tracer, serial, tracer_bin};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-out-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sleeper() -> Kill {
    Kill(Command::new("sleep").arg("600").spawn().unwrap())
}

/// A shell loop that never blocks: one thread on a CPU the whole time.
fn spinner() -> Kill {
    Kill(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap(),
    )
}

/// A trace file of a short recording of `pid`.
fn record_briefly(pid: &str, trace: &Path) {
    let out = run_tracer(&[
        "attach",
        "-p",
        pid,
        "-d",
        "300ms",
        "-q",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
}

fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: mknod reads the path we own.
    assert_eq!(unsafe { libc::mknod(c.as_ptr(), mode, dev) }, 0, "mknod");
}

fn refused_before_recording(out: &tracer_tests::Finished, code: i32, needle: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", out.stderr);
    assert!(
        out.stderr.contains(needle),
        "{needle:?} not in {}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("recording PID"),
        "refused only after recording: {}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

#[test]
fn devices_and_fifos_are_never_replaced() {
    let _guard = serial();
    require_root();
    let dir = scratch("nodes");
    let target = sleeper();
    let pid = target.0.id().to_string();
    // A character device like /dev/null (1:3), and a FIFO.
    let dev = dir.join("null");
    mknod(&dev, libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    let fifo = dir.join("fifo");
    mknod(&fifo, libc::S_IFIFO | 0o600, 0);
    for (flag, path) in [
        ("-o", &dev),
        ("--html", &dev),
        ("--perfetto", &dev),
        ("-o", &fifo),
        ("--html", &fifo),
    ] {
        let out = run_tracer(&[
            "attach",
            "-p",
            &pid,
            "-d",
            "1s",
            flag,
            path.to_str().unwrap(),
        ]);
        let what = if path == &dev {
            "character device"
        } else {
            "a FIFO"
        };
        refused_before_recording(&out, 1, what);
    }
    assert!(
        std::fs::symlink_metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(!dir.join("null.tmp").exists() && !dir.join("fifo.tmp").exists());

    // `report` checks its outputs before reading the trace.
    let trace = dir.join("r.trace");
    record_briefly(&pid, &trace);
    let out = run_tracer(&[
        "report",
        trace.to_str().unwrap(),
        "--html",
        dev.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(
        std::fs::symlink_metadata(&dev)
            .unwrap()
            .file_type()
            .is_char_device()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_the_tool_did_not_write_are_left_alone() {
    let _guard = serial();
    require_root();
    let dir = scratch("foreign");
    let target = sleeper();
    let pid = target.0.id().to_string();
    // A typo that names the server's source, for each output.
    let source = dir.join("serve.py");
    std::fs::write(&source, "import time\n").unwrap();
    for flag in ["-o", "--html", "--perfetto"] {
        let out = run_tracer(&[
            "attach",
            "-p",
            &pid,
            "-d",
            "1s",
            flag,
            source.to_str().unwrap(),
        ]);
        refused_before_recording(&out, 1, "is not");
        assert!(out.stderr.contains("remove it first"), "{}", out.stderr);
    }
    assert_eq!(std::fs::read_to_string(&source).unwrap(), "import time\n");
    // The tool's own outputs are replaced by the next run.
    let (trace, page) = (dir.join("r.trace"), dir.join("r.html"));
    for _ in 0..2 {
        let out = run_tracer(&[
            "attach",
            "-p",
            &pid,
            "-d",
            "300ms",
            "-q",
            "-o",
            trace.to_str().unwrap(),
            "--html",
            page.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", out.stderr);
    }
    // Something other than a file at PATH.tmp: opening a FIFO would block for ever (the
    // tool is killed after 20 s if it does).
    let fifo_at = dir.join("q.trace");
    mknod(&dir.join("q.trace.tmp"), libc::S_IFIFO | 0o600, 0);
    let out = Command::new("timeout")
        .args(["-s", "KILL", "20"])
        .arg(tracer_bin())
        .args(["attach", "-p", &pid, "-d", "1s", "-o"])
        .arg(&fifo_at)
        .output()
        .unwrap();
    let out = tracer_tests::Finished {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    refused_before_recording(&out, 1, "is a FIFO, not a recording's temporary file");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_output_is_checked_before_attaching_and_never_given_twice() {
    let _guard = serial();
    require_root();
    let dir = scratch("twice");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let x = dir.join("x");
    let out = run_tracer(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "1s",
        "-o",
        x.to_str().unwrap(),
        "--html",
        dir.join(".").join("x").to_str().unwrap(),
    ]);
    refused_before_recording(&out, 2, "name the same file");
    assert!(!x.exists());
    // The HTML path is checked before the recording, not after it.
    let out = run_tracer(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "1s",
        "--html",
        dir.join("no/such/dir/x.html").to_str().unwrap(),
    ]);
    refused_before_recording(&out, 1, "not a directory");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_exits_like_a_shell() {
    let _guard = serial();
    require_root();
    let out = run_tracer(&["run", "-q", "--", "/nonexistent/command"]);
    assert_eq!(out.status.code(), Some(127), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "no summary: {}", out.stdout);
    assert!(
        out.stderr.contains("cannot run /nonexistent/command"),
        "{}",
        out.stderr
    );
    let dir = scratch("run");
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "echo hi\n").unwrap();
    let out = run_tracer(&["run", "-q", "--", plain.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(126),
        "not executable: {}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
    let out = run_tracer(&["run", "-q", "--json", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", out.stderr);
    assert!(out.json()["threads"].is_array(), "a summary is printed");
    let out = run_tracer(&["run", "-q", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", out.stderr);
}

#[test]
fn huge_durations_are_usage_errors_not_panics() {
    let _guard = serial();
    let target = sleeper();
    let pid = target.0.id().to_string();
    for args in [
        ["-d", "1e300"],
        ["--bin", "1e300"],
        ["--gpu-interval", "1e300"],
        ["-d", "1e19"],
    ] {
        let out = run_tracer(&["attach", "-p", &pid, args[0], args[1]]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
}

#[test]
fn a_failing_stdout_keeps_the_files_and_fails_the_command() {
    let _guard = serial();
    require_root();
    let dir = scratch("stdout");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let html = dir.join("a.html");
    let perfetto = dir.join("a.pftrace");
    // A full device.
    let out = Command::new(tracer_bin())
        .args(["attach", "-p", &pid, "-d", "300ms", "-q"])
        .args(["--html", html.to_str().unwrap()])
        .args(["--perfetto", perfetto.to_str().unwrap()])
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(html.metadata().unwrap().len() > 0 && perfetto.metadata().unwrap().len() > 0);
    std::fs::remove_file(&html).unwrap();
    // A pipe whose reader has gone (`| head -0`).
    let mut child = Command::new(tracer_bin())
        .args(["attach", "-p", &pid, "-d", "300ms", "-q", "--json"])
        .args(["--html", html.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Broken pipe"), "{stderr}");
    assert!(html.exists(), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn outputs_through_sudo_belong_to_the_user() {
    let _guard = serial();
    require_root();
    let dir = scratch("sudo");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let trace = dir.join("r.trace");
    let html = dir.join("r.html");
    let perfetto = dir.join("r.pftrace");
    let out = Command::new(tracer_bin())
        .args(["attach", "-p", &pid, "-d", "300ms", "-q"])
        .args([
            "-o",
            trace.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
            "--perfetto",
            perfetto.to_str().unwrap(),
        ])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65533")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [&trace, &html, &perfetto] {
        let m = f.metadata().unwrap();
        assert_eq!((m.uid(), m.gid()), (65534, 65533), "{}", f.display());
        assert_eq!(m.mode() & 0o777, 0o600, "{}", f.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_file_being_written_is_not_called_a_leftover() {
    let _guard = serial();
    require_root();
    let dir = scratch("lock");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let trace = dir.join("r.trace");
    let tmp = dir.join("r.trace.tmp");
    let first = Tracer::start(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "30s",
        "-o",
        trace.to_str().unwrap(),
    ]);
    let out = run_tracer(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "1s",
        "-o",
        trace.to_str().unwrap(),
    ]);
    refused_before_recording(&out, 1, "another tracer is writing");
    assert!(
        !out.stderr.contains("interrupted recording"),
        "{}",
        out.stderr
    );
    first.signal(libc::SIGINT);
    assert!(first.finish(Duration::from_secs(20)).status.success());
    assert!(trace.exists() && !tmp.exists());

    // What a tracer killed in its first moments leaves: an empty PATH.tmp. The next run
    // removes it (it holds nothing) and says so.
    std::fs::write(&tmp, b"").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(10);
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let out = run_tracer(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "300ms",
        "-q",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("removed"), "{}", out.stderr);
    // A leftover that holds frames is kept, and the user is told how to read it.
    let mut partial = std::fs::read(&trace).unwrap();
    partial.truncate(partial.len() / 2);
    std::fs::write(&tmp, &partial).unwrap();
    let out = run_tracer(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "300ms",
        "-o",
        trace.to_str().unwrap(),
    ]);
    refused_before_recording(&out, 1, "tracer report");
    assert_eq!(std::fs::read(&tmp).unwrap(), partial);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Peak resident set of a finished child, from wait4.
fn run_measured(args: &[&str]) -> (std::process::ExitStatus, String, u64) {
    // Reaped by wait4 below, which also gives its peak RSS (`Child::wait` would not).
    #[allow(clippy::zombie_processes)]
    let child = Command::new(tracer_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut out = child.stdout.unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let mut status = 0;
    // SAFETY: wait4 on our own child, filling locals we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut ru) }, pid);
    use std::os::unix::process::ExitStatusExt as _;
    (
        std::process::ExitStatus::from_raw(status),
        reader.join().unwrap(),
        ru.ru_maxrss as u64 * 1024,
    )
}

#[test]
fn a_tiny_counter_bin_is_widened_not_allowed_to_exhaust_memory() {
    let _guard = serial();
    require_root();
    let target = spinner();
    let pid = target.0.id().to_string();
    let (status, stdout, rss) = run_measured(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "2s",
        "-q",
        "--json",
        "--counters",
        "software",
        "--bin",
        "1ns",
    ]);
    assert!(status.success());
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let c = &doc["counters"];
    assert_eq!(c["bins_widened_from_ns"], 1, "{c}");
    // Bins are widened as slices arrive, so they cover the last slice seen, which a spinner
    // that holds its CPU to the end can leave well short of the window's end (131 us bins,
    // 1.3 s, seen once in 8 runs): what is bounded is their number.
    let bin = c["bin_ns"].as_u64().unwrap();
    assert!(bin > 1, "bin {bin}");
    assert!(c["series"].as_array().unwrap().len() <= 10_000);
    // Measured 40-50 MB; before, `--bin 1us` alone reached 680 MB.
    assert!(rss < 200 << 20, "peak RSS {rss}");
}

#[test]
fn the_latency_log_is_checked_first_and_a_bad_one_keeps_the_summary() {
    let _guard = serial();
    require_root();
    let dir = scratch("latencies");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let fifo = dir.join("fifo");
    mknod(&fifo, libc::S_IFIFO | 0o600, 0);
    for (path, needle) in [
        (fifo.as_path(), "not a regular file"),
        (Path::new("/dev/zero"), "not a regular file"),
        (&dir.join("missing.jsonl"), "missing.jsonl"),
    ] {
        let started = Instant::now();
        let out = run_tracer(&[
            "attach",
            "-p",
            &pid,
            "-d",
            "5s",
            "--latencies",
            path.to_str().unwrap(),
        ]);
        refused_before_recording(&out, 1, needle);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "it recorded first"
        );
    }
    // A log that is malformed by the time the window ends (no line of it a request; a single
    // malformed line among requests costs only itself): the summary is still printed, and
    // the error names the line.
    let log = dir.join("lat.jsonl");
    std::fs::write(&log, "").unwrap();
    let tracer = Tracer::start(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "1s",
        "--json",
        "--latencies",
        log.to_str().unwrap(),
    ]);
    std::fs::write(&log, "{\"start_ns\": 1, \"end_ns\": 2}\nnot json\n").unwrap();
    let out = tracer.finish(Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("no line of the log is a request: line 1"),
        "{}",
        out.stderr
    );
    assert!(out.json()["threads"].is_array(), "the summary is printed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_signal_after_the_window_ends_the_tool_at_once() {
    let _guard = serial();
    require_root();
    let dir = scratch("late-signal");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let trace = dir.join("r.trace");
    // A latency log of a million lines takes the tool a while to read and decompose after
    // the window: the signal lands in that time.
    let log = dir.join("lat.jsonl");
    let line = "{\"start_ns\": 1, \"end_ns\": 2, \"tid\": 1}\n";
    std::fs::write(&log, line.repeat(3_000_000)).unwrap();
    let tracer = Tracer::start(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "500ms",
        "-o",
        trace.to_str().unwrap(),
        "--latencies",
        log.to_str().unwrap(),
    ]);
    // Once the trace is complete, the tool is in its post-processing.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !trace.exists() {
        assert!(Instant::now() < deadline, "the trace was never finished");
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = Instant::now();
    tracer.signal(libc::SIGTERM);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(out.status.code(), Some(143), "{}", out.stderr);
    assert!(out.stderr.contains("is complete"), "{}", out.stderr);
    let report = run_tracer(&["report", trace.to_str().unwrap(), "--json"]);
    assert!(report.status.success(), "{}", report.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_output_never_replaces_an_input() {
    let _guard = serial();
    require_root();
    let dir = scratch("inputs");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let trace = dir.join("rec.trace");
    record_briefly(&pid, &trace);
    let bytes = std::fs::read(&trace).unwrap();
    // `report` asked to write its page over the trace it reads, by another spelling too.
    for (flag, path) in [
        ("--html", trace.clone()),
        ("--perfetto", dir.join(".").join("rec.trace")),
    ] {
        let out = run_tracer(&[
            "report",
            trace.to_str().unwrap(),
            flag,
            path.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains("would write over the trace file"),
            "{}",
            out.stderr
        );
        assert_eq!(
            std::fs::read(&trace).unwrap(),
            bytes,
            "{flag} replaced the trace"
        );
    }
    // A recording whose trace file would replace the latency log it reads at the end.
    let log = dir.join("lat.jsonl");
    std::fs::write(&log, "{\"start_ns\": 1, \"end_ns\": 2}\n").unwrap();
    let out = run_tracer(&[
        "attach",
        "-p",
        &pid,
        "-d",
        "500ms",
        "-o",
        log.to_str().unwrap(),
        "--latencies",
        log.to_str().unwrap(),
    ]);
    refused_before_recording(&out, 2, "would write over the latency log");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "{\"start_ns\": 1, \"end_ns\": 2}\n"
    );
    // An input that is not a regular file is refused, not read (a FIFO would block forever).
    let fifo = dir.join("fifo");
    mknod(&fifo, libc::S_IFIFO | 0o600, 0);
    let started = Instant::now();
    let out = run_tracer(&["report", fifo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("is a FIFO, not a regular file"),
        "{}",
        out.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits until the child catches signal `sig` (SigCgt in /proc/PID/status: bit sig-1), and
/// says whether `recording` was still false when it first did: read before each look, so a
/// slow test thread cannot make a late catch look early.
fn caught(child: &mut std::process::Child, sig: i32, recording: &AtomicBool) -> bool {
    let started = Instant::now();
    loop {
        let before = recording.load(Ordering::SeqCst);
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        if mask & (1 << (sig - 1)) != 0 {
            return !before;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the tool ended ({st}) before catching signal {sig}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "signal {sig} never caught: {status}"
        );
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// A signal while the probes load (the first ~0.2 s, before the tool says it is recording)
/// ends the window as soon as it opens: it was lost (SIGINT: the recording ran its whole
/// duration) or killed the tool with its trace file just begun (SIGTERM: exit 143, a `.tmp`).
#[test]
fn a_signal_while_the_probes_load_ends_the_recording_cleanly() {
    let _guard = serial();
    require_root();
    let dir = scratch("early-signal");
    let target = sleeper();
    let pid = target.0.id().to_string();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let trace = dir.join(format!("r{sig}.trace"));
        let mut child = Command::new(tracer_bin())
            .args([
                "attach",
                "-p",
                &pid,
                "-d",
                "30s",
                "-o",
                trace.to_str().unwrap(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Whether the tool had said it records (the probes loaded) when the signal went.
        let recording = Arc::new(AtomicBool::new(false));
        let stderr = {
            let (pipe, recording) = (child.stderr.take().unwrap(), recording.clone());
            std::thread::spawn(move || {
                let mut all = String::new();
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if line.contains("recording PID") {
                        recording.store(true, Ordering::SeqCst);
                    }
                    all += &line;
                    all.push('\n');
                }
                all
            })
        };
        // As soon as the tool catches the signal (before that, any process dies of it): its
        // handlers are taken first, so this is inside the probes' loading.
        let early = caught(&mut child, sig, &recording);
        // SigCgt shows the handler a few microseconds before it takes signals: tokio's
        // registry (signal-hook-registry) installs the handler, then publishes the action it
        // runs, and a signal in between goes to the old disposition, which it does not run (a
        // SIGTERM there was lost once in CI: the window ran its 30 s). The probes take ~0.2 s
        // to load, so 5 ms later is still inside the loading.
        std::thread::sleep(Duration::from_millis(5));
        let sent = Instant::now();
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = stderr.join().unwrap();
        // Before the handlers came first, they were taken only once the probes had loaded.
        assert!(early, "signal {sig} caught only once recording: {stderr}");
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "signal {sig}: {:?}",
            sent.elapsed()
        );
        assert_eq!(out.status.code(), Some(0), "signal {sig}: {stderr}");
        assert!(stdout.contains("stopped early by a signal"), "{stdout}");
        assert!(
            !dir.join(format!("r{sig}.trace.tmp")).exists(),
            "signal {sig} left the temporary file"
        );
        let report = run_tracer(&["report", trace.to_str().unwrap(), "--json"]);
        assert!(report.status.success(), "{}", report.stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A watch's exporter address in use is refused before the probes are attached, and leaves no
/// trace file begun (which the next recording would take for a leftover).
#[test]
fn a_watch_refused_its_address_attaches_nothing_and_leaves_no_file() {
    let _guard = serial();
    require_root();
    let dir = scratch("busy-port");
    let target = sleeper();
    let pid = target.0.id().to_string();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let trace = dir.join("w.trace");
    let out = run_tracer(&[
        "watch",
        "-p",
        &pid,
        "-i",
        "1s",
        "-c",
        "1",
        "--prometheus",
        &addr,
        "-o",
        trace.to_str().unwrap(),
    ]);
    refused_before_recording(&out, 1, "cannot listen there");
    assert!(!trace.exists() && !dir.join("w.trace.tmp").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Unmounts on drop, so a failed assertion leaves no mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The flight recorder writes only when a tail comes, maybe days into a watch: a directory it
/// cannot write to (here a read-only mount, which root's access(2) would pass) is refused at
/// the start, before anything is attached, and the probe file it tried is not left behind.
#[test]
fn a_flight_dir_that_cannot_be_written_is_refused_at_the_start() {
    let _guard = serial();
    require_root();
    let dir = scratch("flight-ro");
    let ro = dir.join("ro");
    std::fs::create_dir(&ro).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
        .arg(&ro)
        .status()
        .unwrap();
    assert!(st.success(), "mount a read-only tmpfs");
    let mounted = Mounted(ro.clone());
    let target = sleeper();
    let pid = target.0.id().to_string();
    let watch = |flight: &Path| {
        run_tracer(&[
            "watch",
            "-p",
            &pid,
            "-i",
            "1s",
            "-c",
            "1",
            "--keep",
            "10s",
            "--flight-dir",
            flight.to_str().unwrap(),
        ])
    };
    let out = watch(&ro);
    refused_before_recording(&out, 1, "cannot create a file there (Read-only file system");
    drop(mounted);
    // The same directory, writable now: the watch runs, and the probe file is gone.
    let out = watch(&ro);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        std::fs::read_dir(&ro).unwrap().count(),
        0,
        "files left in --flight-dir"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A full disk under `watch --log` costs the windows it has no room for, not the watch: the
/// log keeps whole lines (a window written in part is taken back out), the later windows are
/// written once there is room again, and the run ends failing with how many the log lacks.
/// Before, the first failed write ended the watch, leaving a cut line behind.
#[test]
fn a_full_disk_under_the_watch_log_costs_windows_not_the_watch() {
    let _guard = serial();
    require_root();
    let dir = scratch("log-full");
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(st.success(), "mount a small tmpfs");
    let _mounted = Mounted(mnt.clone());
    let log = mnt.join("w.jsonl");
    let target = spinner();
    let pid = target.0.id().to_string();
    let t = Tracer::start(&[
        "watch",
        "-p",
        &pid,
        "-i",
        "1s",
        "-c",
        "6",
        "--json",
        "--no-gpu",
        "--log",
        log.to_str().unwrap(),
    ]);
    let lines = || {
        std::fs::read_to_string(&log)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines() < 1 {
        assert!(Instant::now() < deadline, "no window was written");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Fill the file system, for two windows.
    let filler = mnt.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let block = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &block).is_ok() {}
    drop(f);
    std::thread::sleep(Duration::from_millis(2200));
    std::fs::remove_file(&filler).unwrap();
    let out = t.finish(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let text = std::fs::read_to_string(&log).unwrap();
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).expect("whole lines only");
    }
    let written = text.lines().count();
    let lost = 6 - written;
    assert!((1..=3).contains(&lost), "{written} written\n{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("{lost} windows could not be written to the log"))
            && out.stderr.contains("is written again"),
        "{}",
        out.stderr
    );
    assert!(text.ends_with('\n'));
    let _ = std::fs::remove_dir_all(&dir);
}
