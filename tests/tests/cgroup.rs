//! cgroup CPU quotas (RELIABILITY.md): a quota on an ancestor of the target's cgroup throttles
//! the target, and only the ancestor's cpu.stat counts it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tracer_tests::{Kill, require_root, run_tracer, serial, u};

/// The hierarchy with the cpu controller: cgroup v2's root, or v1's cpu mount.
fn cpu_root() -> (PathBuf, bool) {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        (v1.to_path_buf(), false)
    } else {
        (PathBuf::from("/sys/fs/cgroup"), true)
    }
}

/// A parent cgroup with a quota of 0.2 CPU and a child without one, removed when dropped.
struct Nested {
    root: PathBuf,
    parent: PathBuf,
    child: PathBuf,
}

impl Nested {
    fn new(name: &str) -> Self {
        let (root, v2) = cpu_root();
        let parent = root.join(name);
        let child = parent.join("child");
        std::fs::create_dir(&parent).unwrap();
        if v2 {
            std::fs::write(parent.join("cgroup.subtree_control"), "+cpu").unwrap();
            std::fs::write(parent.join("cpu.max"), "20000 100000").unwrap();
        } else {
            std::fs::write(parent.join("cpu.cfs_period_us"), "100000").unwrap();
            std::fs::write(parent.join("cpu.cfs_quota_us"), "20000").unwrap();
        }
        std::fs::create_dir(&child).unwrap();
        Self {
            root,
            parent,
            child,
        }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.child.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        for dir in [&self.child, &self.parent] {
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[test]
fn a_quota_on_an_ancestor_cgroup_is_the_cause_named() {
    let _guard = serial();
    require_root();
    let name = format!("tracer-test-quota-{}", std::process::id());
    let cg = Nested::new(&name);
    // Two busy processes under 0.2 CPU: throttled in every period. (Each a process of its
    // own, killed when dropped: a shell's `&` child would outlive the test.)
    let spinner = || {
        Kill(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        )
    };
    let (spin, other) = (spinner(), spinner());
    cg.add(spin.0.id());
    cg.add(other.0.id());
    std::thread::sleep(std::time::Duration::from_millis(100));
    let out = run_tracer(&[
        "attach",
        "-p",
        &spin.0.id().to_string(),
        "-d",
        "2s",
        "--json",
        "-q",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let c = &doc["cgroup"];
    let parent = format!("/{name}");
    assert_eq!(c["throttled_by"], parent.as_str(), "{c}");
    // 20 periods in 2 s, nearly all throttled.
    assert!(u(&c["throttled_periods"]) >= 10, "{c}");
    assert!(u(&c["periods"]) >= u(&c["throttled_periods"]), "{c}");
    let limit = &c["limits"][0];
    assert_eq!(limit["cgroup"], parent.as_str(), "{c}");
    assert!((limit["cpus"].as_f64().unwrap() - 0.2).abs() < 1e-9, "{c}");
    let v = &doc["verdict"];
    assert_eq!(v["primary"], "scheduling", "{v}");
    assert_eq!(v["causes"][0]["mechanism"], "cgroup CPU throttling", "{v}");
    assert_eq!(v["causes"][0]["mechanism_id"], "cgroup_throttling", "{v}");
    let evidence = v["causes"][0]["evidence"].as_str().unwrap();
    assert!(evidence.contains(&parent), "{evidence}");
    drop((spin, other));
    drop(cg);
    assert!(!cpu_root().0.join(&name).exists());
}

/// A spinner under a 0.2-CPU quota, pinned to one CPU beside a nice-19 spinner of another
/// cgroup: the quota holds it 80 ms in every 100, and the other spinner runs meanwhile. The
/// kernel's throttled-time count of the spinner's group queue says which part of each wait
/// was the quota's; the cgroup's own cpu.stat is the independent count of the same time.
#[test]
fn waits_the_quota_held_behind_other_tasks_match_the_cgroups_own_count() {
    let _guard = serial();
    require_root();
    let name = format!("tracer-test-held-{}", std::process::id());
    let cg = Nested::new(&name);
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let spin = |nice: &str| {
        Kill(
            Command::new("taskset")
                .args([
                    "-c",
                    &cpu,
                    "nice",
                    "-n",
                    nice,
                    "sh",
                    "-c",
                    "while :; do :; done",
                ])
                .spawn()
                .unwrap(),
        )
    };
    let (server, neighbour) = (spin("0"), spin("19"));
    cg.add(server.0.id());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = run_tracer(&[
        "attach",
        "-p",
        &server.0.id().to_string(),
        "-d",
        "2s",
        "--json",
        "-q",
        "--no-gpu",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let w = &doc["totals"]["wait_classes"];
    let ours = u(&w["throttled_ns"]) as f64;
    let theirs = u(&doc["cgroup"]["throttled_ns"]) as f64;
    // The window cuts at most one throttle (80 ms) at each end, which the two counts can
    // take differently: 15 % of the ~1.6 s throttled.
    assert!(
        (ours - theirs).abs() <= 0.15 * theirs,
        "throttled waits {ours} ns vs cpu.stat {theirs} ns: {w}"
    );
    // The neighbour's weight (15 against 1024) lets it hold the CPU for a sliver of the rest.
    assert!(u(&w["contention_ns"]) as f64 <= 0.5 * ours, "{w}");
    let v = &doc["verdict"];
    assert_eq!(v["causes"][0]["mechanism_id"], "cgroup_throttling", "{v}");
    drop((server, neighbour));
    drop(cg);
    assert!(!cpu_root().0.join(&name).exists());
}
