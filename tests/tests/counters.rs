//! Perf counters: the software set read through the per-switch path, checked against /proc,
//! `perf stat` and the scheduler data; hardware counters said to be unavailable, plainly, where
//! there is no PMU; `tracer doctor`.

use std::{path::Path, process::Command, time::Duration};

use tracer_tests::{
    Testload, Tracer, require_root, run_tracer, serial, snapshot, steal_ns, thread_json, u,
};

/// True when this machine exposes a CPU PMU (our CI VMs do not).
fn pmu_present() -> bool {
    std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("cpu"))
        })
        .unwrap_or(false)
}

/// `perf stat -x, --per-thread` output: for the event `name`, each thread's value by TID
/// (lines are "comm-TID,value,unit,event,running ns,...").
fn perf_per_thread(csv: &str, name: &str) -> std::collections::BTreeMap<u32, u64> {
    let mut out = std::collections::BTreeMap::new();
    for l in csv.lines() {
        let f: Vec<&str> = l.split(',').collect();
        if f.len() < 5 || f[3] != name {
            continue;
        }
        let Some(tid) = f[0].rsplit('-').next().and_then(|t| t.parse().ok()) else {
            continue;
        };
        // task-clock's value is printed in ms with two decimals; its running time, in ns, is
        // the same time at full resolution.
        let v = if name == "task-clock" { f[4] } else { f[1] };
        out.insert(tid, v.parse().unwrap_or(0));
    }
    assert!(!out.is_empty(), "perf stat printed no {name}:\n{csv}");
    out
}

#[test]
fn software_counters_agree_with_proc_perf_stat_and_the_scheduler() {
    let _guard = serial();
    require_root();
    let mut load = Testload::spawn(&["mixed", "3"]);
    load.settle();
    let pid = load.pid.to_string();
    let tracer = Tracer::start(&[
        "attach",
        "--pid",
        &pid,
        "--duration",
        "60s",
        "--json",
        "--counters",
        "software",
        "--bin",
        "5ms",
    ]);
    load.settle();
    let before = snapshot(load.pid);
    let steal_before = steal_ns();
    // perf stat's own per-thread counters: an independent count of the same switches, and
    // an independent clock of the same slices (task-clock is timed at the context switch
    // itself, perf_event_task_sched_in/out). Started disabled and enabled through its control
    // FIFO, whose acknowledgement says the counters run: perf enables them a moment after it
    // opens them, and a worker set going in between (its open files were all this test used
    // to wait for) ran 140 us that perf did not count, once in a CI run.
    let dir = std::env::temp_dir().join(format!("tracer-counters-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("fifo dir");
    let (ctl, ack) = (dir.join("ctl"), dir.join("ack"));
    for f in [&ctl, &ack] {
        let c = std::ffi::CString::new(f.to_string_lossy().as_bytes()).expect("path");
        // SAFETY: a valid C string; mkfifo reads it only.
        assert_eq!(
            unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
            0,
            "mkfifo {f:?}"
        );
    }
    let control = format!("fifo:{},{}", ctl.display(), ack.display());
    let perf = Command::new("perf")
        .args([
            "stat",
            "-x,",
            "--per-thread",
            "-e",
            "context-switches,cpu-migrations,task-clock",
            "--delay",
            "-1",
            "--control",
            &control,
            "-p",
            &pid,
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("perf (linux-perf; cargo xtask setup installs it)");
    // perf opens both FIFOs read-write, so these opens return once perf has them; the command
    // waits in the FIFO until perf has opened its counters, and the acknowledgement follows
    // their enabling. On a thread, so that a perf that never answers fails the test instead
    // of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut answer = [0u8; 4];
        let got = std::fs::File::open(&ack).and_then(|mut f| {
            std::fs::write(&ctl, "enable\n")?;
            f.read_exact(&mut answer)
        });
        let _ = tx.send(got.map(|()| answer));
    });
    let answer = rx.recv_timeout(Duration::from_secs(20));
    if !matches!(answer, Ok(Ok(ref a)) if a == b"ack\n") {
        let mut perf = perf;
        let _ = perf.kill();
        let _ = std::fs::remove_dir_all(&dir);
        panic!("perf stat never enabled its counters: {answer:?}");
    }
    load.send("go");
    load.expect("done");
    load.settle();
    let after = snapshot(load.pid);
    let stolen = steal_ns() - steal_before;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let perf_out = perf.wait_with_output().expect("perf stat");
    let perf_csv = String::from_utf8_lossy(&perf_out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    assert_eq!(
        doc["counters"]["measured"],
        serde_json::json!(["cpu_clock_ns", "context_switches", "cpu_migrations"])
    );
    // The switch program with the counter reads passes the verifier as it is on this kernel,
    // not only its older kernels' variant (which it fell back to, for 8 s of verification,
    // when a handoff flag carried through the reads made it too large).
    let btf = doc["capabilities"]["btf"]["reason"]
        .as_str()
        .unwrap_or_default();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let has_prev_state = (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (5, 18);
    assert!(
        doc["probe_mode"] != "tp_btf" || !has_prev_state || !btf.contains("without prev_state"),
        "{btf}"
    );

    // A slice has no starting reading, and cannot be counted, when its switch-in was not traced
    // (losses.unseen_switch_ins) or came before sched_switch was attached (a thread running at
    // that moment): at most one per thread, seen about once in 20 runs.
    let unseen = u(&doc["losses"]["unseen_switch_ins"]) + 1;
    let task_clock = perf_per_thread(&perf_csv, "task-clock");
    let perf_switches = perf_per_thread(&perf_csv, "context-switches");
    let mut switches = 0;
    for (tid, a) in &after {
        let d = *a - before[tid];
        let t = thread_json(&doc, *tid);
        let c = &t["counters"];
        // Each on-CPU slice of a thread counts exactly one context switch (the one that
        // brought it in). The workload is parked at both ends of the window, so every
        // switch-out has its slice: exact, but for the unseen switch-ins.
        let counted = u(&c["context_switches"]);
        let kernel = d.voluntary + d.involuntary;
        assert!(
            counted <= kernel && counted + unseen >= kernel,
            "tid {tid}: context switches via perf {counted} vs /proc {kernel} (perf stat's own \
             count {:?}; the tracer's {}+{}; losses {})",
            perf_switches.get(tid),
            t["voluntary_switches"],
            t["involuntary_switches"],
            doc["losses"]
        );
        switches += d.voluntary + d.involuntary;
        // perf counts a migration when the task is next switched in: several moves while it
        // sleeps count once, and a move made just before the window is counted inside it. So
        // at most the kernel's nr_migrations, plus one.
        assert!(
            u(&c["cpu_migrations"]) <= d.migrations + 1,
            "tid {tid}: {c} vs nr_migrations {}",
            d.migrations
        );
        // The tracer's on-CPU time against perf's task-clock, which times the same slices from
        // a little later in the switch (perf's sched_in and sched_out, inside the context
        // switch, where the tracepoint is before it): 1.4-1.7 us a slice apart here, so
        // within 1 % + 100 us + 3 us a slice. (Before the thread's own run time put right a
        // repaired untraced switch-in, a worker preempted by PID 1 showed 33.7 ms against
        // 31.4 ms, in 3 runs of 40.) And the time the host stole from this VM: a vCPU
        // descheduled between the tracepoint and perf's read puts the stolen time in one slice
        // and not the other (a CI run: 1.5 ms apart on 48 ms while the host stole up to half
        // a CPU), counted by /proc/stat in 10 ms ticks, so one more tick when any was seen.
        //
        // That stretch of the switch (from the tracepoint, through the BPF programs, to perf's
        // sched_out of the one and sched_in of the other) is the previous thread's for perf and
        // the next one's for the scheduler, and now and then it lasts a few hundred us on this
        // VM, too little steal for /proc/stat to show: on the main thread (3 switches, 0.1-0.5
        // ms) perf's task-clock and schedstat were more than 50 us apart in 1 run of 40 without
        // the tracer, 2 with it, 5 with it reading these counters, either way, up to 250 us
        // (a CI run failed on 301 us against perf's 144). The tracer, timed at the tracepoint
        // like the scheduler, agreed with schedstat then (451 vs 452, 302 vs 304, 126 vs 143
        // us). So each figure the tracer times at the tracepoint must lie between the two
        // independent references, give or take the allowance: schedstat alone is no
        // reference, as below, but where it and perf part, the truth is between them.
        let oncpu = u(&t["oncpu_ns"]);
        let perf_clock = task_clock[tid];
        let sched = d.oncpu_ns;
        // schedstat widens the range by at most 5 % + 300 us of perf's figure: more than the
        // 250 us seen, and schedstat's own bias on the workers (0.8-3.3 %).
        let sched_near = sched.clamp(
            perf_clock.saturating_sub(perf_clock / 20 + 300_000),
            perf_clock + perf_clock / 20 + 300_000,
        );
        let (lo, hi) = (perf_clock.min(sched_near), perf_clock.max(sched_near));
        let between = |x: u64, slack: u64| x + slack >= lo && x <= hi + slack;
        let path = 3_000 * kernel + stolen + if stolen > 0 { 10_000_000 } else { 0 };
        assert!(
            between(oncpu, perf_clock / 100 + 100_000 + path),
            "tid {tid}: on-CPU {oncpu} vs perf task-clock {perf_clock} and schedstat {sched} \
             ({kernel} switches, {stolen} ns stolen; the tracer's thread {t}; losses {}; perf \
             stat:\n{perf_csv})",
            doc["losses"]
        );
        // cpu-clock over the slices against both: within 2 % + 1 ms of the on-CPU time (two
        // clocks, read at slightly different points of the switch), 0.5 % + 50 us + the
        // switch path of task-clock (measured: 0.02-0.19 % apart on every worker, 8 rounds,
        // up to 0.8 % when the host steals time; and between task-clock and schedstat, as
        // above: it is read at the tracepoint). A slice whose switch-in went untraced has no
        // counters (counted < kernel above): then only never more than they.
        let clock = u(&c["cpu_clock_ns"]);
        let complete = counted == kernel;
        assert!(
            clock <= oncpu + oncpu / 50 + 1_000_000
                && (!complete || clock + oncpu / 50 + 1_000_000 >= oncpu),
            "tid {tid}: cpu-clock {clock} vs on-CPU {oncpu} (every slice counted: {complete})"
        );
        let slack = perf_clock / 200 + 50_000 + path;
        assert!(
            clock <= hi + slack && (!complete || between(clock, slack)),
            "tid {tid}: cpu-clock {clock} vs perf task-clock {perf_clock} and schedstat {sched} \
             (every slice counted: {complete})"
        );
        // schedstat is not that reference: its on-CPU time runs from the run-queue clock at
        // the pick to the clock at the next put, and that clock is not updated at a switch a
        // wakeup asked for (it keeps the wakeup's time), so a thread switched in after a
        // wakeup preemption is credited from the wakeup. Measured on this workload: schedstat
        // 0.8-3.3 % above both the tracer and perf on every worker (up to +37 us on the main
        // thread's 0.14 ms), and 5.5 % once (issue 13) where perf was not run. One-sided and
        // wide: at most 1 % + 1 ms below, 10 % + 1 ms above; and the time the host stole from
        // this VM either way (the run-queue clock leaves it out, the counter's clock does not:
        // 5 % below, with 10 ms stolen, once), plus one 10 ms tick of /proc/stat's steal
        // count (6 % below with "0 ns" stolen, once).
        assert!(
            sched + clock / 100 + 1_000_000 + stolen + 10_000_000 >= clock
                && sched <= clock + clock / 10 + 1_000_000 + stolen,
            "tid {tid}: cpu-clock {clock} vs schedstat {sched} ({stolen} ns stolen)"
        );
    }
    assert_eq!(
        perf_per_thread(&perf_csv, "context-switches")
            .values()
            .sum::<u64>(),
        switches,
        "perf stat over the same window"
    );
    let migrations: u64 = after
        .keys()
        .map(|t| u(&thread_json(&doc, *t)["counters"]["cpu_migrations"]))
        .sum();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        assert!(migrations > 0, "the workload changes affinity");
    }

    // The series: 5 ms bins whose sums are the totals, and no bin holding more CPU time
    // than the CPUs had.
    assert_eq!(u(&doc["counters"]["bin_ns"]), 5_000_000);
    let series = doc["counters"]["series"].as_array().unwrap();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mut clock_sum = 0;
    for b in series {
        let clock = u(&b["cpu_clock_ns"]);
        assert!(clock <= 5_000_000 * cpus + 1, "bin {b}");
        clock_sum += clock;
    }
    let total = u(&doc["counters"]["cpu_clock_ns"]);
    assert!(
        clock_sum.abs_diff(total) <= series.len() as u64,
        "{clock_sum} vs {total}"
    );
    assert!(
        series.len() >= 4,
        "the round lasts several bins: {}",
        series.len()
    );
    // Hardware counters were not requested: no IPC, and said so.
    assert!(doc["counters"]["ipc"].is_null());
}

/// `--probes classic --counters software`: the classic tracepoints' switch program with the
/// counter reads passes the verifier (it walked a million instructions, E2BIG, while an entry's
/// creation called a byte-by-byte memset, and the tracer did not start), and counts each slice's
/// switch as the kernel does.
#[test]
fn classic_tracepoints_read_the_counters_too() {
    let _guard = serial();
    require_root();
    let (doc, _, load, d) = classic_round(&[]);
    assert_eq!(
        doc["counters"]["measured"],
        serde_json::json!(["cpu_clock_ns", "context_switches", "cpu_migrations"])
    );
    let unseen = u(&doc["losses"]["unseen_switch_ins"]) + 1;
    for &tid in &load.tids {
        let c = &thread_json(&doc, tid)["counters"];
        let (counted, kernel) = (u(&c["context_switches"]), d[&tid]);
        assert!(
            counted <= kernel && counted + unseen >= kernel,
            "tid {tid}: context switches via perf {counted} vs /proc {kernel}: {c}"
        );
    }
}

/// A verifier that gives up on the program with the counter reads (none of ours does now; the
/// refusal stood in for by `TRACER_TEST_REFUSE_COUNTER_READS`): the recording goes on without
/// the counters and says why, where it used not to start.
#[test]
fn counters_the_verifier_refuses_are_given_up_and_said_so() {
    let _guard = serial();
    require_root();
    let (doc, stderr, load, _) = classic_round(&[("TRACER_TEST_REFUSE_COUNTER_READS", "1")]);
    assert_eq!(doc["counters"]["measured"], serde_json::json!([]));
    assert!(
        stderr.contains(
            "software counters unavailable (cpu_clock_ns, context_switches, cpu_migrations): \
             the kernel's verifier found the context-switch program too large with the counter \
             reads, so it was loaded without them"
        ),
        "{stderr}"
    );
    let t = thread_json(&doc, load.tids[1]);
    assert!(t["counters"].is_null(), "{t}");
    // The scheduler's figures are there: the worker's round of 150 sleeps after 200 us of
    // spinning each (timed by the clock: preempted, it runs less), give or take a switch-out
    // the classic tracepoints missed (they have no task to repair one from).
    assert!(
        u(&t["voluntary_switches"]) >= 140 && u(&t["oncpu_ns"]) >= 15_000_000,
        "{t}"
    );
}

/// One round of `mixed 1` recorded with `--probes classic --counters software` (and `env`):
/// the summary, the tracer's stderr, the load, and each thread's switches by /proc over it.
fn classic_round(
    env: &[(&str, &str)],
) -> (
    serde_json::Value,
    String,
    Testload,
    std::collections::BTreeMap<u32, u64>,
) {
    let mut load = Testload::spawn(&["mixed", "1"]);
    load.settle();
    let pid = load.pid.to_string();
    let args = [
        "attach",
        "--pid",
        &pid,
        "--duration",
        "60s",
        "--json",
        "--probes",
        "classic",
        "--counters",
        "software",
    ];
    let tracer = Tracer::start_with_env(&args, env);
    load.settle();
    let before = snapshot(load.pid);
    load.send("go");
    load.expect("done");
    load.settle();
    let after = snapshot(load.pid);
    tracer.signal(libc::SIGINT);
    let out = tracer.finish(Duration::from_secs(20));
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    assert_eq!(doc["probe_mode"], "classic");
    let switches = after
        .iter()
        .map(|(tid, a)| {
            let d = *a - before[tid];
            (*tid, d.voluntary + d.involuntary)
        })
        .collect();
    (doc, out.stderr, load, switches)
}

#[test]
fn hardware_counters_say_plainly_when_unavailable() {
    let _guard = serial();
    require_root();
    let load = Testload::spawn(&["mixed", "1"]);
    let pid = load.pid.to_string();
    let out = run_tracer(&["attach", "--pid", &pid, "--duration", "300ms", "--json"]);
    assert!(out.status.success(), "{}", out.stderr);
    let doc = out.json();
    let pmu = &doc["capabilities"]["pmu"];
    if pmu_present() {
        assert_eq!(pmu["available"], true, "{pmu}");
        return;
    }
    // No PMU: the path a user without one takes. Unavailable, with the reason, and no
    // counter values pretending to be zero.
    assert_eq!(pmu["available"], false);
    assert_eq!(pmu["llc_available"], false);
    let reason = pmu["reason"].as_str().unwrap();
    assert!(reason.contains("no hardware PMU"), "{reason}");
    assert_eq!(doc["counters"]["measured"], serde_json::json!([]));
    for t in doc["threads"].as_array().unwrap() {
        assert!(t["counters"].is_null(), "{t}");
    }
    for key in ["btf", "tracefs", "gpu"] {
        assert!(doc["capabilities"][key]["available"].is_boolean(), "{key}");
        assert!(doc["capabilities"][key]["reason"].is_string(), "{key}");
    }
    assert!(
        out.stderr.contains("cache thrash will not be assessed"),
        "{}",
        out.stderr
    );
    // The text summary says what it means for the diagnosis.
    let text = run_tracer(&["attach", "--pid", &pid, "--duration", "300ms"]);
    assert!(
        text.stdout.contains("Cache thrash cannot be assessed"),
        "{}",
        text.stdout
    );
}

#[test]
fn doctor_reports_this_host() {
    let _guard = serial();
    require_root();
    let out = run_tracer(&["doctor", "--json", "--pid", &std::process::id().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let doc = out.json();
    let caps = &doc["capabilities"];
    for key in ["pmu", "btf", "tracefs", "gpu"] {
        assert!(caps[key]["available"].is_boolean(), "{key}: {caps}");
        assert!(caps[key]["reason"].as_str().is_some_and(|r| !r.is_empty()));
    }
    assert_eq!(
        caps["btf"]["available"],
        Path::new("/sys/kernel/btf/vmlinux").exists()
    );
    assert_eq!(caps["pmu"]["available"], pmu_present());
    assert_eq!(doc["scheduler_tracing"]["available"], true);
    assert_eq!(doc["privileges"]["available"], true);
    assert!(
        doc["cgroup"]["target"]["path"].is_string(),
        "{}",
        doc["cgroup"]
    );
    // Unprivileged, it still reports, and fails: scheduler tracing is impossible.
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(tracer_tests::tracer_bin())
        .arg("doctor")
        .output()
        .unwrap();
    assert_eq!(nobody.status.code(), Some(1));
    let text = String::from_utf8_lossy(&nobody.stdout);
    assert!(text.contains("missing CAP_BPF and CAP_PERFMON"), "{text}");
}
