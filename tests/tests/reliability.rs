//! Bad input and faults (RELIABILITY.md): every failure is a one-line error that says what to
//! do, with a non-zero exit; every fault leaves a complete summary and nothing attached.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracer_tests::{Kill, Tracer, attach_json, require_root, run_tracer, serial, tracer_bin, u};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tracer-rel-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spawn(cmd: &mut Command) -> Kill {
    Kill(cmd.spawn().expect("spawning a test process"))
}

/// A process that switches a lot: two threads passing a token (hundreds of thousands of
/// switches a second).
fn busy() -> Kill {
    spawn(
        Command::new("perf")
            .args(["bench", "sched", "pipe", "-T", "-l", "100000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

fn one_line_error(out: &tracer_tests::Finished, code: i32, needle: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", out.stdout);
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert!(
        lines.iter().any(|l| l.contains(needle)),
        "{needle:?} not in {}",
        out.stderr
    );
}

#[test]
fn a_zombie_is_refused_and_pid_1_is_traced() {
    let _guard = serial();
    require_root();
    // `sleep 0` exits at once; the shell's exec'd `sleep 30` never reaps it: a zombie.
    let mut parent = Command::new("sh")
        .args(["-c", "sleep 0 & exec sleep 30"])
        .spawn()
        .unwrap();
    let pid = parent.id();
    let zombie = (0..200)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            let kids = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
            let z: u32 = kids.split_whitespace().next()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{z}/stat")).ok()?;
            stat.contains(") Z ").then_some(z)
        })
        .expect("a zombie child");
    let out = run_tracer(&["attach", "--pid", &zombie.to_string(), "--duration", "1s"]);
    one_line_error(&out, 1, "zombie");
    let _ = parent.kill();
    let _ = parent.wait();

    // PID 1 is a process like any other (in a container it is the server itself).
    let out = run_tracer(&["attach", "--pid", "1", "--duration", "500ms", "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.json()["pid"], 1);
}

#[test]
fn a_target_that_exits_ends_the_recording_with_what_was_recorded() {
    let _guard = serial();
    require_root();
    let mut child = Command::new("sh")
        .args([
            "-c",
            "i=0; while [ $i -lt 300 ]; do i=$((i+1)); sleep 0.002; done",
        ])
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let doc = attach_json(child.id(), "30s");
    let _ = child.wait();
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "it waited for the duration"
    );
    assert_eq!(doc["end_reason"], "target_exited");
    assert!(u(&doc["target_exited_ns"]) >= u(&doc["start_ns"]));
    // What it did before exiting is there: its sleeps.
    let vol: u64 = doc["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u(&t["voluntary_switches"]))
        .sum();
    assert!(vol > 50, "{vol} voluntary switches");
}

#[test]
fn invalid_options_are_usage_errors() {
    let _guard = serial();
    for (args, needle) in [
        (
            &["attach", "--pid", "1", "--duration", "ten"][..],
            "duration",
        ),
        (&["attach", "--pid", "1", "--duration=-1s"][..], "duration"),
        (
            &["attach", "--pid", "1", "--ring-kib", "3"][..],
            "power of two",
        ),
        (
            &["attach", "--pid", "1", "--counters", "some"][..],
            "counters",
        ),
        (&["attach", "--pid", "x"][..], "pid"),
        (&["attach", "-p", "-5"][..], "-5 is not in 1.."),
        // An unset shell variable would otherwise name the root cgroup: the whole host.
        (&["attach", "--cgroup", ""][..], "the path is empty"),
        (&["attach", "--pid", "1", "--bogus"][..], "--bogus"),
        (&["report"][..], "FILE"),
    ] {
        let out = run_tracer(args);
        one_line_error(&out, 2, needle);
    }
}

#[test]
fn tracefs_unmounted_is_mounted_by_the_tracer() {
    let _guard = serial();
    require_root();
    let target = spawn(Command::new("sleep").arg("30"));
    // In a private mount namespace: unmount tracefs (both places), check it is gone, and run
    // the classic tracepoints, which need it. The host's mounts are untouched.
    let script = format!(
        "umount -l /sys/kernel/tracing 2>/dev/null; umount -l /sys/kernel/debug/tracing \
         2>/dev/null; grep -q ' tracefs ' /proc/self/mounts && exit 99; exec {} attach --pid {} \
         --probes classic --duration 500ms --json",
        tracer_bin().display(),
        target.id()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    drop(target);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(99), "tracefs still mounted");
    assert!(out.status.success(), "{stderr}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["probe_mode"], "classic");
}

#[test]
fn a_full_disk_keeps_the_summary_and_says_where_the_partial_trace_is() {
    let _guard = serial();
    require_root();
    let dir = scratch("fulldisk");
    let load = busy();
    let script = format!(
        "mount -t tmpfs -o size=64k tracer-test {d} && exec {t} attach --pid {p} --duration 2s \
         --json --output {d}/t.trace",
        d = dir.display(),
        t = tracer_bin().display(),
        p = load.id()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    drop(load);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("t.trace.tmp"), "{stderr}");
    // The recording itself is not lost: the summary is printed, in full.
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the summary");
    assert!(u(&doc["events_received"]) > 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

fn interrupted_with(sig: i32, name: &str) {
    let dir = scratch(name);
    let file = dir.join("t.trace");
    let load = busy();
    let tracer = Tracer::start(&[
        "attach",
        "--pid",
        &load.id().to_string(),
        "--duration",
        "60s",
        "--json",
        "--output",
        file.to_str().unwrap(),
    ]);
    std::thread::sleep(Duration::from_millis(700));
    tracer.signal(sig);
    let out = tracer.finish(Duration::from_secs(20));
    drop(load);
    assert!(out.status.success(), "{name}: {}", out.stderr);
    let doc = out.json();
    assert_eq!(doc["end_reason"], "interrupted", "{name}");
    // The file is complete (no `incomplete`), and reads back to the same document.
    assert!(!dir.join("t.trace.tmp").exists(), "{name}: temp file left");
    let back = run_tracer(&["report", file.to_str().unwrap(), "--json"]);
    assert!(back.status.success(), "{name}: {}", back.stderr);
    let back = back.json();
    assert!(
        back["incomplete"].is_null(),
        "{name}: {}",
        back["incomplete"]
    );
    assert_eq!(back["events_received"], doc["events_received"], "{name}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigint_and_sigterm_give_a_summary_and_a_complete_file() {
    let _guard = serial();
    require_root();
    interrupted_with(libc::SIGINT, "sigint");
    interrupted_with(libc::SIGTERM, "sigterm");
}

#[test]
fn the_output_path_is_never_followed_through_a_link() {
    let _guard = serial();
    require_root();
    let dir = scratch("symlink");
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let link = dir.join("t.trace");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for flag in ["--output", "--html", "--perfetto"] {
        let out = run_tracer(&[
            "attach",
            "--pid",
            "1",
            "--duration",
            "200ms",
            flag,
            link.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{flag}: {}", out.stderr);
        assert!(
            out.stderr.contains("symbolic link"),
            "{flag}: {}",
            out.stderr
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Programs loaded now whose name is one of the tracer's.
fn tracer_programs() -> usize {
    tracer_tests::tracer_programs().len()
}

#[test]
fn a_target_churning_a_thousand_threads_a_second_is_followed() {
    let _guard = serial();
    require_root();
    // 1,000 short-lived threads a second for 3 s, each doing a little work and sleeping once.
    let (made, doc) = churn(
        "sum(range(2000)); time.sleep(0.0005)",
        "time.time() < end",
        0.001,
        &[],
    );
    let threads = doc["threads"].as_array().unwrap().len() as u64;
    assert!(made >= 1000, "the target made only {made} threads");
    // Every thread: the ones it made, and its main thread (and any the interpreter keeps).
    assert!(
        threads > made && threads <= made + 2,
        "{threads} threads in the summary, {made} made"
    );
    assert_eq!(doc["losses"]["thread_map_full"], 0);
    assert_eq!(tracer_programs(), 0, "programs left attached");
}

#[test]
fn ended_threads_give_their_room_back_while_the_recording_runs() {
    let _guard = serial();
    require_root();
    // The slots (4,096) and a thread map cut to 2,048 hold 6,144 threads: 12,000 made at most
    // 2,000 a second fit only if the entries of those that ended are taken out as it runs.
    // The maps are scanned for them only after the records said threads ended (a scan costs
    // an idle watch a fifth of its CPU time): a scan skipped when it was due fills the map.
    let (made, doc) = churn(
        "pass",
        "n < 12000",
        0.0005,
        &[("TRACER_TEST_MAX_THREADS", "2048")],
    );
    assert_eq!(made, 12_000);
    assert_eq!(doc["losses"]["thread_map_full"], 0, "{}", doc["losses"]);
    let threads = doc["threads"].as_array().unwrap().len() as u64;
    assert!(
        threads > made && threads <= made + 2,
        "{threads} threads in the summary, {made} made"
    );
}

/// A Python target that starts and joins threads running `work` while `more` holds (`end`
/// is 3 s after the start, `n` the threads made), one every `slot` seconds at most, begun
/// once the tracer records (a line on stdin: the threads made while it loaded, a third of a
/// second in a debug build, were outside any count it could give). Returns how many it made
/// and the tracer's summary.
fn churn(work: &str, more: &str, slot: f64, env: &[(&str, &str)]) -> (u64, serde_json::Value) {
    let script = format!(
        "import sys, threading, time\n\
         sys.stdin.readline()\n\
         def w():\n    {work}\n\
         end = time.time() + 3\n\
         n = 0\n\
         while {more}:\n\
         \x20   t0 = time.time(); t = threading.Thread(target=w); t.start(); t.join(); n += 1\n\
         \x20   time.sleep(max(0, {slot} - (time.time() - t0)))\n\
         print(n)\n"
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let tracer = Tracer::start_with_env(
        &["attach", "--pid", &pid, "--duration", "60s", "--json"],
        env,
    );
    {
        use std::io::Write as _;
        let mut go = child.stdin.take().unwrap();
        go.write_all(b"go\n").unwrap();
    }
    let made: u64 = String::from_utf8_lossy(&child.wait_with_output().unwrap().stdout)
        .trim()
        .parse()
        .unwrap();
    let out = tracer.finish(Duration::from_secs(70));
    assert!(out.status.success(), "{}", out.stderr);
    (made, out.json())
}

#[test]
fn two_tracers_on_different_pids_see_only_their_own() {
    let _guard = serial();
    require_root();
    let a = busy();
    // A sleeper that never forks: a shell loop's `sleep` children could outlive a kill.
    let b =
        spawn(Command::new("python3").args(["-c", "import time\nwhile True: time.sleep(0.01)"]));
    let ta = Tracer::start(&[
        "attach",
        "--pid",
        &a.id().to_string(),
        "--duration",
        "2s",
        "--json",
    ]);
    let tb = Tracer::start(&[
        "attach",
        "--pid",
        &b.id().to_string(),
        "--duration",
        "2s",
        "--json",
    ]);
    let (oa, ob) = (
        ta.finish(Duration::from_secs(20)),
        tb.finish(Duration::from_secs(20)),
    );
    let (da, db) = (oa.json(), ob.json());
    let tids = |d: &serde_json::Value| -> Vec<u64> {
        d["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| u(&t["tid"]))
            .collect()
    };
    let (ta, tb) = (tids(&da), tids(&db));
    assert!(ta.iter().all(|t| !tb.contains(t)), "{ta:?} / {tb:?}");
    assert!(ta.iter().all(|&t| t != u64::from(b.id())));
    assert!(tb.iter().all(|&t| t != u64::from(a.id())));
    let vol = |d: &serde_json::Value| -> u64 {
        d["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| u(&t["voluntary_switches"]))
            .sum()
    };
    // perf bench sched pipe makes about 60,000 switches a second here (99,326 in 2 s once,
    // on a slow round): the point is that each tracer saw its own target busy.
    assert!(vol(&da) > 10_000, "the busy target switched: {}", vol(&da));
    assert!(vol(&db) > 50, "the sleeper switched: {}", vol(&db));
}

/// A memory cgroup of its own with `limit` bytes, v1's memory controller or v2's.
struct MemoryLimit(PathBuf);

impl MemoryLimit {
    fn new(name: &str) -> Self {
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let dir = if v1.join("memory.limit_in_bytes").exists() {
            v1.join(name)
        } else {
            Path::new("/sys/fs/cgroup").join(name)
        };
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn set(&self, bytes: u64) {
        let file = ["memory.limit_in_bytes", "memory.max"]
            .into_iter()
            .map(|f| self.0.join(f))
            .find(|f| f.exists())
            .expect("a memory limit file");
        std::fs::write(file, bytes.to_string()).unwrap();
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        // Its processes have all exited (each run is waited for) by now.
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_memory_limit_too_small_for_the_maps_says_so() {
    let _guard = serial();
    require_root();
    let target = spawn(Command::new("sleep").arg("120"));
    let cg = MemoryLimit::new(&format!("tracer-test-memory-{}", std::process::id()));
    // Raise the limit until the tracer runs: below some point the kernel kills it (out of
    // memory), then, for a few MiB, its maps cannot be created: those runs must say why.
    let mut failed_loads = 0;
    for mib in (32..=256).step_by(4) {
        cg.set(mib << 20);
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec {} attach -p {} -d 200ms -q",
            cg.0.display(),
            tracer_bin().display(),
            target.id()
        );
        let out = Command::new("sh").args(["-c", &script]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => break,
            Some(1) => {
                assert!(
                    stderr.contains("loading the BPF programs failed"),
                    "{stderr}"
                );
                assert!(
                    stderr.contains("Cannot allocate memory"),
                    "{mib} MiB: {stderr}"
                );
                assert!(stderr.contains("memory cgroup"), "{stderr}");
                failed_loads += 1;
            }
            // Killed by the OOM killer before it could load anything.
            None => {}
            other => panic!("{mib} MiB: exit {other:?}: {stderr}"),
        }
        assert_eq!(tracer_programs(), 0, "programs left attached at {mib} MiB");
    }
    assert!(failed_loads > 0, "no limit made the maps fail");
}
