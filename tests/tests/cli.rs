//! The command line end to end: errors a user can act on, and `run`.

use tracer_tests::{Testload, ensure_tracefs, require_root, run_tracer, serial, u};

#[test]
fn a_missing_pid_is_a_clear_error() {
    let _guard = serial();
    // PIDs are below pid_max (at most 2^22); this one cannot exist.
    let out = run_tracer(&["attach", "--pid", "99999999", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.contains("no process with PID 99999999"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty());
    // `doctor` too: a process that is not there has no libcuda and no cgroup to report. The
    // largest PID would be kill(-1, 0), every process, if it were taken for a pid_t.
    for pid in ["99999999", "4294967295"] {
        let out = run_tracer(&["doctor", "--pid", pid]);
        assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
        assert!(
            out.stderr.contains(&format!("no process with PID {pid}")),
            "{}",
            out.stderr
        );
    }
}

#[test]
fn pid_zero_and_bad_durations_are_usage_errors() {
    let _guard = serial();
    let out = run_tracer(&["attach", "--pid", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    let out = run_tracer(&["attach", "--pid", "1", "--duration", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stderr.contains("invalid duration"), "{}", out.stderr);
    // watch's flight-recorder settings that could never act are refused, not taken.
    for (args, needle) in [
        (
            &["--keep", "10s", "--trigger-p99", "1s"][..],
            "needs requests",
        ),
        (&["--keep", "10s", "--max-files", "0"][..], "--max-files"),
        (&["--trigger-every", "1m"][..], "--keep"),
        (&["--html", "/tmp/w.html"][..], "tracer report FILE --html"),
    ] {
        let mut all = vec!["watch", "--pid", "1"];
        all.extend_from_slice(args);
        let out = run_tracer(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
    }
    // Nor does watch's help offer what it refuses; attach's does.
    let help = |cmd| run_tracer(&[cmd, "--help"]).stdout;
    assert!(!help("watch").contains("--html"), "{}", help("watch"));
    assert!(!help("watch").contains("--perfetto"));
    assert!(help("attach").contains("--html"));
}

/// A watch that could not start (here its trace file: /proc takes no new files) leaves no
/// `--log` behind, though the log is opened first to be refused early.
#[test]
fn a_watch_that_cannot_start_leaves_no_log() {
    let _guard = serial();
    require_root();
    let log = std::env::temp_dir().join(format!("tracer-nolog-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let out = run_tracer(&[
        "watch",
        "-p",
        "1",
        "--log",
        log.to_str().unwrap(),
        "-o",
        "/proc/tracer-cannot.trace",
        "--count",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("/proc/tracer-cannot.trace"),
        "{}",
        out.stderr
    );
    assert!(!log.exists(), "{} was left", log.display());
    // The trace renamed over the log at the end would lose every window line: refused, as
    // is the log at the trace's temporary path.
    std::fs::write(&log, "kept\n").unwrap();
    let tmp = format!("{}.tmp", log.display());
    for trace in [log.to_str().unwrap(), &tmp] {
        let out = run_tracer(&[
            "watch",
            "-p",
            "1",
            "--log",
            trace,
            "-o",
            log.to_str().unwrap(),
            "--count",
            "1",
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains("would write over the --log"),
            "{}",
            out.stderr
        );
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "kept\n");
    let _ = std::fs::remove_file(&log);
}

#[test]
fn a_kernel_thread_is_refused() {
    let _guard = serial();
    // PID 2 is kthreadd on every Linux since 2.6.
    let out = run_tracer(&["attach", "--pid", "2", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("kernel thread"), "{}", out.stderr);
    // doctor says the same (it used to check it as a process that had not mapped libcuda).
    let out = run_tracer(&["doctor", "--pid", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.contains("kernel thread"), "{}", out.stderr);
}

#[test]
fn a_thread_id_records_its_whole_process() {
    let _guard = serial();
    require_root();
    let load = Testload::spawn(&["mixed", "2"]);
    let worker = load.tids[1].to_string();
    let out = run_tracer(&["attach", "--pid", &worker, "--duration", "300ms", "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("is a thread of process"),
        "{}",
        out.stderr
    );
    assert_eq!(u(&out.json()["pid"]), load.pid as u64);
}

#[test]
fn run_traces_a_command_from_its_first_instruction() {
    let _guard = serial();
    require_root();
    let load = tracer_tests::testload_bin();
    let load = load.to_str().unwrap();
    // The lifecycle scenario with its input closed: it prints ready and exits at once.
    let mut out = run_tracer(&["run", "--json", "--", load, "lifecycle"]);
    assert!(out.status.success(), "{}", out.stderr);
    // The command shares stdout: its own line comes first, the document after.
    let start = out.stdout.find("\n{").map_or(0, |i| i + 1);
    out.stdout = out.stdout[start..].to_string();
    let doc = out.json();
    assert_eq!(doc["end_reason"], "target_exited");
    assert!(doc["target_exited_ns"].as_u64().is_some());
    let threads = doc["threads"].as_array().unwrap();
    // The main thread and both workers were born after the tracer attached, so all of them,
    // and their whole lives, are in the recording: the main thread exec'd under the probes.
    assert_eq!(threads.len(), 3, "{threads:?}");
    let created = threads.iter().filter(|t| t["created_ns"].is_u64()).count();
    assert_eq!(created, 2, "both workers were created during the recording");
    for t in threads {
        assert!(t["exited_ns"].is_u64(), "every thread exited: {t}");
        assert!(u(&t["voluntary_switches"]) + u(&t["involuntary_switches"]) > 0);
    }
}

/// Runs the tracer with capabilities dropped by setpriv (util-linux).
fn run_tracer_with(setpriv: &[&str], args: &[&str]) -> tracer_tests::Finished {
    let out = std::process::Command::new("setpriv")
        .args(setpriv)
        .arg(tracer_tests::tracer_bin())
        .args(args)
        .output()
        .expect("setpriv (util-linux)");
    tracer_tests::Finished {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn missing_capabilities_are_named() {
    let _guard = serial();
    require_root();
    let load = Testload::spawn(&["mixed", "1"]);
    let pid = load.pid.to_string();
    let args = ["attach", "--pid", &pid, "--duration", "300ms", "--json"];
    // Root without CAP_PERFMON (and without CAP_SYS_ADMIN, which implies it).
    let drop_perfmon = [
        "--bounding-set=-perfmon,-sys_admin",
        "--inh-caps=-perfmon,-sys_admin",
    ];
    let out = run_tracer_with(&drop_perfmon, &args);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("missing CAP_PERFMON."),
        "{}",
        out.stderr
    );
    assert!(out.stdout.is_empty());
    // An unprivileged user: both are missing.
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let out = run_tracer_with(&nobody, &args);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("missing CAP_BPF and CAP_PERFMON"),
        "{}",
        out.stderr
    );
    // CAP_BPF + CAP_PERFMON without CAP_SYS_ADMIN is enough.
    let out = run_tracer_with(
        &["--bounding-set=-sys_admin", "--inh-caps=-sys_admin"],
        &args,
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(u(&out.json()["pid"]), load.pid as u64);
}

#[test]
fn tracefs_this_user_cannot_read_is_called_so_not_unmounted() {
    let _guard = serial();
    require_root();
    // Recent kernels mount tracefs root's, mode 0700: CAP_BPF and CAP_PERFMON do not open it.
    // (A test of its own cannot make it so: tracefs is one superblock for the whole machine.)
    // Unmounted, the path is sysfs's empty directory, mode 0755: mount it first.
    ensure_tracefs();
    let mode = std::fs::metadata("/sys/kernel/tracing")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
        .expect("tracefs at /sys/kernel/tracing");
    assert_eq!(
        mode & 0o077,
        0,
        "this test needs tracefs mode 0700, as the kernel makes it"
    );
    let load = Testload::spawn(&["mixed", "1"]);
    let pid = load.pid.to_string();
    let caps = |add: &str| {
        [
            "--reuid=65534".to_string(),
            "--regid=65534".into(),
            "--clear-groups".into(),
            format!("--inh-caps=+bpf,+perfmon{add}"),
            format!("--ambient-caps=+bpf,+perfmon{add}"),
        ]
    };
    let user = caps("");
    let user: Vec<&str> = user.iter().map(String::as_str).collect();
    let doctor = run_tracer_with(&user, &["doctor"]);
    let line = doctor
        .stdout
        .lines()
        .find(|l| l.contains("tracefs"))
        .unwrap_or_else(|| panic!("doctor lists tracefs: {}", doctor.stdout));
    assert!(
        line.contains("mounted at /sys/kernel/tracing but not readable by this user"),
        "{line}"
    );
    assert!(
        line.contains("Permission denied") && !line.contains("not mounted"),
        "{line}"
    );
    // The root-owned target's maps are closed to a user without capabilities (CAP_PERFMON
    // opens them): said so, not "has not mapped libcuda" (a finding about a target it could
    // not look at).
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let doctor = run_tracer_with(&nobody, &["doctor", "--pid", &pid]);
    assert_eq!(doctor.status.code(), Some(1), "{}", doctor.stderr);
    assert!(
        doctor.stderr.contains(&format!(
            "PID {pid} exists, but /proc/{pid}/maps cannot be read"
        )),
        "{}",
        doctor.stderr
    );
    let args = [
        "attach", "--pid", &pid, "-d", "300ms", "--probes", "classic", "--json",
    ];
    let out = run_tracer_with(&user, &args);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("(--probes classic) need tracefs, which is mounted at"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("no BTF"), "{}", out.stderr);
    // The advice given is enough.
    let more = caps(",+dac_read_search");
    let more: Vec<&str> = more.iter().map(String::as_str).collect();
    let out = run_tracer_with(&more, &args);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.json()["probe_mode"], "classic");
}
