//! `--cgroup`: a cgroup's processes are the target set, and a process moved into it during
//! the window joins it at the move, counted exactly from there against the kernel's own
//! counters (it is parked in a read when moved and when /proc is read, as in processes.rs).
//! The cgroup is made here, in each hierarchy there is: the unified one (v2) and the v1 cpu
//! controller's (this machine has both: cgroup v2 beside the v1 controllers).

use std::{
    io::{BufRead, BufReader, Write},
    path::PathBuf,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use tracer_tests::{
    Tracer, require_root, run_tracer, serial, snapshot, thread_json, u, wait_all_sleeping,
};

/// Parked in a read; each "go" line is 40 rounds of 3 ms work and 1 ms asleep, then "done".
const WORKER: &str = r#"
import sys, time
print("ready", flush=True)
for line in sys.stdin:
    for i in range(40):
        end = time.monotonic() + 0.003
        while time.monotonic() < end:
            pass
        time.sleep(0.001)
    print("done", flush=True)
"#;

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn spawn() -> Self {
        let mut child = Command::new("python3")
            .args(["-c", WORKER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("ready");
        assert_eq!(line.trim(), "ready");
        wait_all_sleeping(child.id());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn round(&mut self) {
        writeln!(self.stdin, "go").expect("go");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("done");
        assert_eq!(line.trim(), "done");
        wait_all_sleeping(self.pid());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cgroup made for the test, removed (its processes moved back to the root) when dropped.
struct Cgroup {
    root: PathBuf,
    dir: PathBuf,
}

impl Cgroup {
    /// The hierarchies to test in: the unified one (v2) where it is mounted, and the v1 cpu
    /// controller's where that is (this machine has both).
    fn roots() -> Vec<PathBuf> {
        let unified = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.join("cgroup.subtree_control").exists());
        let v1 =
            Some(PathBuf::from("/sys/fs/cgroup/cpu")).filter(|p| p.join("cgroup.procs").exists());
        unified.into_iter().chain(v1).collect()
    }

    fn create(root: &std::path::Path, name: &str) -> Self {
        let root = root.to_path_buf();
        let dir = root.join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self { root, dir }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("move");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for p in procs.lines() {
            let _ = std::fs::write(self.root.join("cgroup.procs"), p);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The CPU cgroup of `pid` in /proc/PID/cgroup: the v1 cpu controller's line, else v2's.
fn cpu_cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let path = |l: &str| l.splitn(3, ':').nth(2).unwrap_or("").to_string();
    let v1 = text.lines().find(|l| {
        l.split(':')
            .nth(1)
            .is_some_and(|c| c.split(',').any(|c| c == "cpu"))
    });
    v1.or_else(|| text.lines().find(|l| l.starts_with("0::")))
        .map(path)
        .expect("a cpu cgroup")
}

#[test]
fn a_cgroup_is_traced_with_the_process_moved_into_it_counted_from_the_move() {
    let _guard = serial();
    require_root();
    let roots = Cgroup::roots();
    assert!(!roots.is_empty(), "no cgroup hierarchy to test in");
    for root in roots {
        eprintln!("in {}", root.display());
        moved_in(&root);
    }
}

fn moved_in(root: &std::path::Path) {
    let cg = Cgroup::create(root, &format!("tracer-test-{}", std::process::id()));
    // Empty, it has nothing to start a recording with: said so.
    let empty = run_tracer(&[
        "attach",
        "--cgroup",
        &cg.dir.display().to_string(),
        "-d",
        "1s",
    ]);
    assert_eq!(empty.status.code(), Some(2), "{}", empty.stderr);
    assert!(
        empty.stderr.contains("has no process now"),
        "{}",
        empty.stderr
    );
    let mut first = Worker::spawn();
    let mut late = Worker::spawn();
    let outside = Worker::spawn();
    cg.add(first.pid());
    // Given relative to the mount, as `systemctl status` shows a unit's.
    let name = format!("/{}", cg.dir.file_name().unwrap().to_string_lossy());
    let tracer = Tracer::start(&["attach", "--cgroup", &name, "-d", "60s", "--json"]);
    let before = [snapshot(first.pid()), snapshot(late.pid())];
    let moved_at = tracer_tests::monotonic_ns();
    cg.add(late.pid());
    first.round();
    late.round();
    let after = [snapshot(first.pid()), snapshot(late.pid())];
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let procs = doc["processes"].as_array().expect("processes[]");
    // Neither was given: they are listed busiest first, and both worked alike.
    let mut pids: Vec<u64> = procs.iter().map(|p| u(&p["pid"])).collect();
    pids.sort_unstable();
    let mut want = vec![u64::from(first.pid()), u64::from(late.pid())];
    want.sort_unstable();
    assert_eq!(
        pids,
        want,
        "the cgroup's processes and no other (PID {} stayed outside)",
        outside.pid()
    );
    let of = |pid: u32| procs.iter().find(|p| p["pid"] == pid).expect("listed");
    assert!(
        of(first.pid())["joined_ns"].is_null(),
        "in it from the start"
    );
    let joined = u(&of(late.pid())["joined_ns"]);
    // Each names its CPU cgroup, as /proc says: the one made here, or on a hybrid host (this
    // one: the cgroup is made in the unified hierarchy) the v1 cpu controller's.
    for p in [first.pid(), late.pid()] {
        assert_eq!(of(p)["cgroup"], cpu_cgroup_of(p).as_str(), "{}", of(p));
    }
    assert!(
        joined >= moved_at && joined < moved_at + 50_000_000,
        "joined at the move: {joined} vs {moved_at}"
    );
    // Exactly: the switches, and the moves (those no tracepoint reported too, from the task's
    // own se.nr_migrations: tracer-ebpf `unseen`).
    for (b, a) in before.iter().zip(&after) {
        for (tid, a) in a {
            let d = *a - b[tid];
            let t = thread_json(&doc, *tid);
            assert_eq!(
                (
                    u(&t["voluntary_switches"]),
                    u(&t["involuntary_switches"]),
                    u(&t["migrations"])
                ),
                (d.voluntary, d.involuntary, d.migrations),
                "tid {tid}: tracer (vol, invol, migr) vs /proc delta"
            );
            assert!(d.voluntary >= 40, "tid {tid} worked in the window: {d:?}");
        }
    }
}

#[test]
fn a_bad_cgroup_is_a_usage_error_that_says_what_to_give() {
    let out = run_tracer(&["attach", "--cgroup", "/no-such-cgroup-here", "-d", "1s"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("does not exist"), "{}", out.stderr);
    let out = run_tracer(&["attach", "--cgroup", "/tmp", "-d", "1s"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("is not a cgroup"), "{}", out.stderr);
    let out = run_tracer(&["attach", "--cgroup", "/", "--no-children", "-d", "1s"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("--no-children"), "{}", out.stderr);
}
