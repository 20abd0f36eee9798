//! A service is a process tree: attached by the parent's PID, the tracer traces the workers it
//! had and the one it forks during the window, every thread counted exactly against the
//! kernel's own counters; with --no-children the workers are only listed as untraced.
//!
//! Tolerance: exact, as in sched_counts.rs: every process is parked (blocked in a read, not
//! switching) whenever /proc is read, so nothing falls between the snapshots and the window. A
//! worker born inside the window is compared with its whole life (its counters start at 0).

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Duration,
};

use tracer_tests::{
    KernelCounts, Tracer, require_root, run_tracer, serial, snapshot, thread_json, u,
    wait_all_sleeping,
};

/// A parent that forks two workers at once and, at "go", has them work and forks a third
/// that works too; each then parks in a read until stdin closes.
const TREE: &str = r#"
import os, sys, time

def work(rounds):
    for i in range(rounds):
        end = time.monotonic() + 0.003
        while time.monotonic() < end:
            pass
        time.sleep(0.001)

def worker(r, done, name):
    if name:
        # A process title as vLLM's engine sets it (the kernel keeps 15 bytes).
        with open("/proc/self/comm", "w") as f:
            f.write(name)
    # Parked in a read; "g" means one round of work, EOF means exit.
    while True:
        c = os.read(r, 1)
        if not c:
            os._exit(0)
        work(40)
        os.write(done, b"d")

def spawn(name=None):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        worker(r, done_w, name)
    os.close(r)
    return pid, w

done_r, done_w = os.pipe()
kids = [spawn(), spawn()]
print("ready " + ",".join(str(p) for p, _ in kids), flush=True)
for line in sys.stdin:
    if line.strip() == "go":
        for _, w in kids:
            os.write(w, b"g")
        late = spawn("VLLM::EngineCore")
        os.write(late[1], b"g")
        kids.append(late)
        for _ in range(3):
            os.read(done_r, 1)
        print("done " + str(late[0]), flush=True)
for _, w in kids:
    os.close(w)
for p, _ in kids:
    os.waitpid(p, 0)
"#;

struct Tree {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pid: u32,
    workers: Vec<u32>,
}

impl Tree {
    fn spawn() -> Self {
        let mut child = Command::new("python3")
            .args(["-c", TREE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let line = read_line(&mut stdout);
        let workers = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("{line:?}"))
            .split(',')
            .map(|p| p.trim().parse().expect("pid"))
            .collect();
        let pid = child.id();
        Self {
            child,
            stdin,
            stdout,
            pid,
            workers,
        }
    }

    fn pids(&self) -> Vec<u32> {
        std::iter::once(self.pid)
            .chain(self.workers.iter().copied())
            .collect()
    }

    fn settle(&self) {
        for p in self.pids() {
            wait_all_sleeping(p);
        }
    }

    fn snapshot(&self) -> BTreeMap<u32, KernelCounts> {
        self.pids().into_iter().flat_map(snapshot).collect()
    }

    /// Runs the round; the late worker joins `workers`.
    fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "go").expect("write go");
        let line = read_line(&mut self.stdout);
        let late = line
            .strip_prefix("done ")
            .unwrap_or_else(|| panic!("{line:?}"))
            .trim()
            .parse()
            .expect("pid");
        self.workers.push(late);
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

fn read_line(r: &mut impl BufRead) -> String {
    let mut line = String::new();
    r.read_line(&mut line).expect("read");
    line
}

/// Records one round with `extra` arguments; returns the document, the /proc deltas of every
/// thread of every process, and the tree.
fn record(extra: &[&str]) -> (serde_json::Value, BTreeMap<u32, KernelCounts>, Tree) {
    let mut tree = Tree::spawn();
    tree.settle();
    let pid = tree.pid.to_string();
    let mut args = vec!["attach", "--pid", &pid, "--duration", "60s", "--json"];
    args.extend_from_slice(extra);
    let tracer = Tracer::start(&args);
    tree.settle();
    let before = tree.snapshot();
    tree.go();
    tree.settle();
    let after = tree.snapshot();
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    let deltas = after
        .iter()
        .map(|(tid, a)| {
            let b = before.get(tid).copied().unwrap_or_default();
            (*tid, *a - b)
        })
        .collect();
    (out.json(), deltas, tree)
}

#[test]
fn attached_by_the_parent_every_process_of_the_tree_is_counted_exactly() {
    let _guard = serial();
    require_root();
    let (doc, deltas, tree) = record(&[]);
    let late = *tree.workers.last().unwrap();
    assert_eq!(deltas.len(), 4, "one thread per process: {deltas:?}");
    for (tid, d) in &deltas {
        let t = thread_json(&doc, *tid);
        assert_eq!(u(&t["pid"]), u64::from(*tid), "{t}");
        assert_eq!(
            (
                u(&t["voluntary_switches"]),
                u(&t["involuntary_switches"]),
                u(&t["migrations"])
            ),
            (d.voluntary, d.involuntary, d.migrations),
            "tid {tid}: tracer (vol, invol, migr) vs /proc delta"
        );
    }
    // Each worker did its 40 rounds inside the window: switches the tracer saw.
    for w in &tree.workers {
        assert!(deltas[w].voluntary >= 40, "worker {w}: {:?}", deltas[w]);
    }
    let procs = doc["processes"].as_array().expect("processes[]");
    let of = |pid: u32| {
        procs
            .iter()
            .find(|p| p["pid"] == pid)
            .unwrap_or_else(|| panic!("PID {pid} not in processes: {procs:?}"))
    };
    assert_eq!(of(tree.pid)["given"], true);
    for w in &tree.workers[..2] {
        assert_eq!(of(*w)["given"], false);
        assert!(of(*w)["joined_ns"].is_null(), "there at the start");
        assert_eq!(u(&of(*w)["ppid"]), u64::from(tree.pid));
    }
    let joined = u(&of(late)["joined_ns"]);
    assert!(
        joined > u(&doc["start_ns"]) && joined < u(&doc["end_ns"]),
        "forked inside the window: {}",
        of(late)
    );
    // Named by its process title: where a cause acts, the verdict can say which part of the
    // service it is.
    assert_eq!(of(late)["role"], "engine_core", "{}", of(late));
    assert_eq!(of(tree.pid)["role"], "python3");
    // Traced from its fork: its thread's birth is the same fork, stamped a moment later.
    let created = u(&thread_json(&doc, late)["created_ns"]);
    assert!(
        created >= joined && created - joined < 1_000_000,
        "{created} vs {joined}"
    );
    assert!(
        doc["untraced_children"].as_array().unwrap().is_empty(),
        "{}",
        doc["untraced_children"]
    );
    // Their preemption of each other is the service's own.
    for p in doc["preemptor_processes"].as_array().unwrap() {
        if tree.pids().iter().any(|x| p["tgid"] == *x) {
            assert_eq!(p["same_process"], true, "{p}");
        }
    }
}

#[test]
fn no_children_traces_the_parent_alone_and_lists_the_workers() {
    let _guard = serial();
    require_root();
    let (doc, deltas, tree) = record(&["--no-children"]);
    let t = thread_json(&doc, tree.pid);
    let d = deltas[&tree.pid];
    assert_eq!(
        (
            u(&t["voluntary_switches"]),
            u(&t["involuntary_switches"]),
            u(&t["migrations"])
        ),
        (d.voluntary, d.involuntary, d.migrations)
    );
    let threads: Vec<u64> = doc["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u(&t["tid"]))
        .collect();
    assert_eq!(
        threads,
        vec![u64::from(tree.pid)],
        "the workers are not traced"
    );
    assert_eq!(doc["processes"].as_array().unwrap().len(), 1);
    let untraced: Vec<u64> = doc["untraced_children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| u(&c["pid"]))
        .collect();
    for w in &tree.workers {
        assert!(untraced.contains(&u64::from(*w)), "{w} in {untraced:?}");
    }
}

#[test]
fn a_pid_list_names_the_pid_that_does_not_exist() {
    let _guard = serial();
    require_root();
    let tree = Tree::spawn();
    // PID 4194303 is the highest the kernel can give; no process has it here.
    let list = format!("{},4194303", tree.pid);
    let out = run_tracer(&["attach", "-p", &list, "-d", "1s", "--json"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("4194303"), "{}", out.stderr);
    // Both forms of a list: repeated and comma-separated.
    let a = tree.pid.to_string();
    let w = tree.workers[0].to_string();
    let out = run_tracer(&[
        "attach",
        "-p",
        &a,
        "-p",
        &w,
        "--no-children",
        "-d",
        "300ms",
        "--json",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let procs: Vec<u64> = out.json()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| u(&p["pid"]))
        .collect();
    assert_eq!(procs, vec![u64::from(tree.pid), u64::from(tree.workers[0])]);
}

/// A parent that only waits while its child (pinned to one CPU) serves: 2 ms of work, 1 ms
/// asleep, over and over.
const SERVED_BY_A_CHILD: &str = r#"
import os, sys, time
cpu = int(sys.argv[1])
pid = os.fork()
if pid == 0:
    os.sched_setaffinity(0, {cpu})
    while True:
        end = time.monotonic() + 0.002
        while time.monotonic() < end:
            pass
        time.sleep(0.001)
print(pid, flush=True)
os.waitpid(pid, 0)
"#;

#[test]
fn a_cause_on_a_child_is_found_in_the_child_when_the_parent_is_given() {
    let _guard = serial();
    require_root();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = (cpus - 1).to_string();
    let mut parent = std::process::Command::new("python3");
    parent
        .args(["-c", SERVED_BY_A_CHILD, &cpu])
        .stdout(Stdio::piped());
    let mut parent = tracer_tests::Kill::group(&mut parent);
    let child = read_line(&mut BufReader::new(parent.0.stdout.take().expect("stdout")));
    let child: u32 = child.trim().parse().expect("child pid");
    // Two hogs on the child's CPU: the child waits behind them; the parent sleeps throughout.
    let _hogs = tracer_tests::Kill::group(Command::new(tracer_tests::tracer_bin()).args([
        "disturb",
        "spin",
        "--threads=2",
        &format!("--cpus={cpu}"),
        "--duration=20s",
    ]));
    std::thread::sleep(Duration::from_millis(300));
    let out = run_tracer(&[
        "attach",
        "-p",
        &parent.id().to_string(),
        "-d",
        "2s",
        "--json",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let v = &doc["verdict"];
    assert_eq!(v["primary"], "scheduling", "{v}");
    let first = &v["causes"][0];
    assert_eq!(first["mechanism_id"], "run_queue_contention", "{first}");
    assert_eq!(u(&first["acts_in"]["pid"]), child as u64, "{first}");
    // The hogs bore none of it: all of it is the child's (the parent never wanted a CPU).
    assert!(first["acts_in"]["share"].as_f64().unwrap() > 0.9, "{first}");
    let by = &first["mechanism_data"]["by"][0];
    assert_eq!(by["name"], "cpu-hog", "{first}");
    let headline = v["headline"].as_str().unwrap();
    assert!(
        headline.contains(&format!("(PID {child})")),
        "the headline names the child: {headline}"
    );
}
