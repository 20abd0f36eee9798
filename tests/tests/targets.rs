//! Targets as they come (RELIABILITY.md): names with escape sequences or bytes that are not
//! UTF-8, a process whose main thread has exited, a PID reused by another process, a process
//! seen from inside a PID namespace.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use tracer_tests::{
    Testload, require_root, run_tracer, serial, snapshot, thread_json, tracer_bin, u,
};

/// A child killed and reaped when dropped.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A shell that renames itself to `name` (raw bytes, through /proc/self/comm) and then wakes
/// every 10 ms: a traced thread with that name.
fn named(name: &[u8]) -> Kill {
    let dir = std::env::temp_dir().join(format!("tracer-name-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("name");
    std::fs::write(&file, name).unwrap();
    // The shell writes its own comm (a process may only rename its own threads), so the
    // redirection must be the shell's, not a child's.
    let script = format!(
        "n=$(cat {}); printf '%s' \"$n\" > /proc/$$/comm; while :; do sleep 0.01; done",
        file.display()
    );
    let child = Kill(
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(200));
    let _ = std::fs::remove_dir_all(&dir);
    let comm = std::fs::read(format!("/proc/{}/comm", child.0.id())).unwrap();
    assert!(comm.starts_with(&name[..name.len().min(15)]), "{comm:?}");
    child
}

#[test]
fn escape_sequences_in_names_never_reach_the_terminal() {
    let _guard = serial();
    require_root();
    // Retitles the terminal, clears it, starts a fake line.
    let evil = b"\x1b]0;pwn\x07\x1b[2J\nFAKE";
    let target = named(evil);
    let pid = target.0.id().to_string();
    let out = run_tracer(&["attach", "-p", &pid, "-d", "1s"]);
    assert!(out.status.success(), "{}", out.stderr);
    for (name, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            !text.bytes().any(|b| b == 0x1b || b == 0x07),
            "{name} carries raw escape bytes:\n{text:?}"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("FAKE")),
            "{name}: {text}"
        );
    }
    assert!(out.stdout.contains("\\x1b]0;pwn"), "{}", out.stdout);
    // The JSON keeps the name exactly (JSON escapes are not terminal escapes).
    let out = run_tracer(&["attach", "-p", &pid, "-d", "500ms", "--json", "-q"]);
    assert!(!out.stdout.bytes().any(|b| b == 0x1b || b == 0x07));
    let doc = out.json();
    let comm = doc["comm"].as_str().unwrap();
    assert_eq!(comm.as_bytes(), &evil[..15], "{comm:?}");
}

#[test]
fn a_name_that_is_not_utf8_is_traced_and_shown_lossily() {
    let _guard = serial();
    require_root();
    // "serveur-é" in Latin-1: 0xe9 alone is not UTF-8. And a UTF-8 name the kernel cuts at
    // 15 bytes, inside the "ë".
    for name in [&b"serveur-\xe9"[..], "aünïcödé-sërvér".as_bytes()] {
        let target = named(name);
        let pid = target.0.id();
        let out = run_tracer(&[
            "attach",
            "-p",
            &pid.to_string(),
            "-d",
            "500ms",
            "--json",
            "-q",
        ]);
        assert!(out.status.success(), "{name:?}: {}", out.stderr);
        let doc = out.json();
        assert_eq!(doc["pid"], pid);
        let comm = doc["comm"].as_str().unwrap();
        assert!(comm.contains('\u{fffd}'), "{comm:?}");
        let threads = doc["threads"].as_array().unwrap();
        assert!(
            threads.iter().any(|t| t["tid"] == pid),
            "the main thread is listed"
        );
    }
}

#[test]
fn a_target_seen_from_inside_a_pid_namespace_is_the_one_recorded() {
    let _guard = serial();
    require_root();
    let (mut load, ns_pid, ns_tids) = Testload::spawn_in_pid_namespace(&["mixed", "2"]);
    assert_eq!(ns_pid, 1, "the workload is the namespace's init");
    load.settle();
    let before = snapshot(load.pid);
    // The tracer runs in the workload's PID and mount namespaces, so its /proc is the
    // container's: PID 1 there is the workload, PID 1 of the host is another process.
    let mut tracer = Command::new("nsenter")
        .args(["-t", &load.pid.to_string(), "-p", "-m", "--"])
        .arg(tracer_bin())
        .args(["attach", "-p", "1", "-d", "60s", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(tracer.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("recording PID") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "tracer ended early"
        );
    }
    assert!(
        line.contains(&format!("PID {} on the host", load.pid)),
        "{line}"
    );
    load.settle();
    load.send("go");
    load.expect("done");
    load.settle();
    let after = snapshot(load.pid);
    // nsenter forks the tracer into the namespace: the signal goes to the tracer itself.
    let n = tracer.id();
    let inner: i32 = std::fs::read_to_string(format!("/proc/{n}/task/{n}/children"))
        .unwrap()
        .trim()
        .parse()
        .expect("nsenter's one child, the tracer");
    // SAFETY: signalling our own descendant.
    unsafe { libc::kill(inner, libc::SIGINT) };
    let out = tracer.wait_with_output().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    assert!(out.status.success(), "{rest}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    // IDs are the kernel's; the namespace's are beside them.
    assert_eq!(doc["pid"], load.pid, "the host's PID 1 was traced instead");
    let ns = &doc["pid_namespace"];
    assert_eq!(ns["pid"], ns_pid, "{ns}");
    let ids = ns["ids"].as_array().unwrap();
    for (host, ns_tid) in load.tids.iter().zip(&ns_tids) {
        assert!(
            ids.iter().any(|i| i["host"] == *host && i["ns"] == *ns_tid),
            "{host} -> {ns_tid} missing from {ns}"
        );
    }
    // Every thread of the workload, exactly counted against the kernel, and nothing else.
    let threads = doc["threads"].as_array().unwrap();
    assert_eq!(threads.len(), load.tids.len(), "{threads:?}");
    for tid in &load.tids {
        let d = after[tid] - before[tid];
        let t = thread_json(&doc, *tid);
        assert_eq!(u(&t["voluntary_switches"]), d.voluntary, "tid {tid}");
        assert_eq!(u(&t["involuntary_switches"]), d.involuntary, "tid {tid}");
        assert_eq!(u(&t["migrations"]), d.migrations, "tid {tid}");
    }
    // A neighbour outside the namespace has no PID there, so it is not given one.
    for p in doc["preemptor_processes"].as_array().unwrap() {
        let host = u(&p["tgid"]);
        if host != load.pid as u64 && host != 0 {
            assert!(
                !ids.iter().any(|i| i["host"] == host),
                "a process outside the namespace got a namespace PID: {p}"
            );
        }
    }
}
