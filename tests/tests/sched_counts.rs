//! The eBPF per-thread counts against the kernel's own counters, over a window in which every
//! switch of the target happens between two /proc snapshots.
//!
//! Tolerance: exact for voluntary / involuntary switches and migrations. Both sides count the
//! same kernel events (`nvcsw` / `nivcsw` in `__schedule`, `nr_migrations` in `set_task_cpu`),
//! and the workload is parked (blocked, not switching) whenever /proc is read, so nothing falls
//! between the snapshots and the recording window.

use std::time::Duration;

use tracer_tests::{
    KernelCounts, Testload, Tracer, require_root, serial, snapshot, thread_json, u,
};

/// Records one round of the `mixed` scenario and returns (tracer JSON, /proc deltas per TID).
fn record_mixed(extra: &[&str]) -> (serde_json::Value, Vec<(u32, KernelCounts)>, Testload) {
    let (mut docs, deltas, load) = record_mixed_by(&[extra], false);
    (docs.remove(0), deltas, load)
}

fn record_mixed_by(
    extras: &[&[&str]],
    stop_readers: bool,
) -> (Vec<serde_json::Value>, Vec<(u32, KernelCounts)>, Testload) {
    record_by(&["mixed", "3"], extras, stop_readers)
}

/// One round of the test workload's `scenario`, with one tracer per entry of `extras`
/// attached at once; `stop_readers`: the tracers are stopped (SIGSTOP) while the workload
/// runs, so nothing reads their ring buffers.
fn record_by(
    scenario: &[&str],
    extras: &[&[&str]],
    stop_readers: bool,
) -> (Vec<serde_json::Value>, Vec<(u32, KernelCounts)>, Testload) {
    let mut load = Testload::spawn(scenario);
    load.settle();
    let pid = load.pid.to_string();
    let tracers: Vec<Tracer> = extras
        .iter()
        .map(|extra| {
            let mut args = vec!["attach", "--pid", &pid, "--duration", "60s", "--json"];
            args.extend_from_slice(extra);
            Tracer::start(&args)
        })
        .collect();
    load.settle();
    let before = snapshot(load.pid);
    if stop_readers {
        tracers.iter().for_each(|t| t.signal(libc::SIGSTOP));
    }
    load.send("go");
    load.expect("done");
    load.settle();
    let after = snapshot(load.pid);
    if stop_readers {
        tracers.iter().for_each(|t| t.signal(libc::SIGCONT));
    }
    // Ctrl-C ends the recording early; the summary must still be complete.
    for t in &tracers {
        t.signal(libc::SIGINT);
    }
    let docs = tracers
        .into_iter()
        .map(|t| {
            let out = t.finish(Duration::from_secs(20));
            assert!(out.status.success(), "tracer failed: {}", out.stderr);
            let doc = out.json();
            assert_eq!(doc["end_reason"], "interrupted");
            doc
        })
        .collect();
    let deltas = after
        .iter()
        .map(|(tid, a)| (*tid, *a - before[tid]))
        .collect();
    (docs, deltas, load)
}

fn assert_exact(doc: &serde_json::Value, deltas: &[(u32, KernelCounts)]) {
    let mut activity = 0;
    // The tp_btf programs repair a move no tracepoint reported from the task's own
    // se.nr_migrations; the classic ones have no task to read it from. A missed move shows up
    // there in about 1 of 15 runs of this workload, always one (an open defect, said in the
    // stop's closing note): allowed as at most one fewer in classic mode, exact otherwise.
    let classic = doc["probe_mode"] == "classic";
    for (tid, d) in deltas {
        let t = thread_json(doc, *tid);
        let got = (
            u(&t["voluntary_switches"]),
            u(&t["involuntary_switches"]),
            u(&t["migrations"]),
        );
        let migrations = if classic && got.2 + 1 == d.migrations {
            got.2
        } else {
            d.migrations
        };
        assert_eq!(
            got,
            (d.voluntary, d.involuntary, migrations),
            "tid {tid}: tracer (vol, invol, migr) vs /proc delta"
        );
        activity += d.voluntary + d.involuntary;
        if u(&doc["dropped_events"]) == 0 {
            // Every complete run-queue wait the kernel counted reached userspace in a
            // switch-in record and was classified there.
            let c = &t["wait_classes"];
            let classified = u(&c["contention_waits"])
                + u(&c["migration_waits"])
                + u(&c["idle_cpu_waits"])
                + u(&c["handoff_waits"]);
            assert_eq!(
                classified,
                u(&t["runq_waits"]),
                "tid {tid}: classified waits vs the kernel's count: {c}"
            );
        }
    }
    // The scenario really switched a lot: 3 workers x 150 sleeps, plus yields.
    assert!(activity > 450, "too little activity to compare: {activity}");
    let migrations: u64 = deltas.iter().map(|(_, d)| d.migrations).sum();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        assert!(
            migrations > 0,
            "the scenario changes affinity: expected migrations"
        );
    }
}

/// The threads both recordings (`docs[0]` tp_btf, `docs[1]` classic) have a comparable wait
/// total for: each with its kernel counts, its two JSON entries and its waits, which must be
/// as many in both but for the wakeups a side says it did not see (`losses.unseen_wakeups`:
/// the kernel skips a classic tracepoint program now and then, and then the wait that wakeup
/// began is missing; measured 1 in about 40 runs of this workload, always one wakeup, seen
/// as one more `wakeups` in tp_btf's entry). Each side may be short by no more than it says.
fn compared_threads<'a>(
    docs: &'a [serde_json::Value],
    deltas: &'a [(u32, KernelCounts)],
) -> Vec<(
    u32,
    KernelCounts,
    &'a serde_json::Value,
    &'a serde_json::Value,
    u64,
)> {
    assert_eq!(docs[0]["probe_mode"], "tp_btf");
    assert_eq!(docs[1]["probe_mode"], "classic");
    // A skipped classic `sched_switch` loses a switch-in, and the wait it ended, too: the
    // repair counts it as an unseen switch-in.
    let unseen = |d: &serde_json::Value| {
        u(&d["losses"]["unseen_wakeups"]) + u(&d["losses"]["unseen_switch_ins"])
    };
    let mut short = [0, 0];
    let (mut threads, mut busy) = (Vec::new(), 0);
    for (tid, kernel) in deltas {
        let (a, b) = (thread_json(&docs[0], *tid), thread_json(&docs[1], *tid));
        let (wa, wb) = (u(&a["runq_waits"]), u(&b["runq_waits"]));
        short[0] += wb.saturating_sub(wa);
        short[1] += wa.saturating_sub(wb);
        // `runq_wait_ns` also holds the part of a wait open at a window's edge, and the two
        // windows end apart: the workload's main thread, with a handful of waits, is not
        // always parked then (two classic tracers once differed by 37 us over its 3 waits).
        // The workers are parked at both edges. Times are compared on threads that saw the
        // same waits.
        busy += (wa >= 100) as usize;
        if wa >= 100 && wa == wb {
            threads.push((*tid, *kernel, a, b, wa));
        }
    }
    for (side, doc) in docs.iter().enumerate() {
        assert!(
            short[side] <= unseen(doc),
            "{} saw {} fewer run-queue waits than the other, and says it missed {} wakeups \
             and switch-ins; threads {} and {}",
            doc["probe_mode"],
            short[side],
            unseen(doc),
            docs[0]["threads"],
            docs[1]["threads"]
        );
    }
    assert!(
        !threads.is_empty() && threads.len() + 1 >= busy,
        "at most one busy thread set aside for a missed wakeup: {} of {busy} compared",
        threads.len()
    );
    threads
}

/// `docs[0]` (tp_btf) and `docs[1]` (classic) saw the same run-queue waits. The tp_btf wakeup
/// program takes a wait's start from the run queue's clock (converted, tracer-ebpf clock.rs),
/// the classic one from the clock helper, which it reads after the enqueue (and maybe after
/// the other program): the two differ by the enqueue's duration and the programs' own, under
/// a microsecond or two per wait when the workload wakes a thread a few times a tick, tens of
/// ns when it wakes threads thousands of times a tick (measured): `pct` and `per_wait_ns`
/// allow for it. Where a switch-in went untraced (PID 1's, on our VMs), the time from the
/// thread's wait to its switch-out is first counted as running by both, and only tp_btf, which
/// reads the thread's own run time, moves back to the wait what it was (1.4 ms once): there
/// the two are compared on the time the thread wanted a CPU, waiting or running.
/// Classic waits also end later, after `__schedule` has picked the next task (see
/// `waits_match_the_kernel`). (The kernel's schedstat is no reference on this workload: it
/// skips its clock update at a switch the wakeup asked for, so it counts a preempted wait
/// short by whole microseconds; the mixed workload's waits end in preemptions often.)
fn same_waits(
    docs: &[serde_json::Value],
    deltas: &[(u32, KernelCounts)],
    pct: u64,
    per_wait_ns: u64,
) -> u64 {
    let repaired = docs
        .iter()
        .any(|d| u(&d["losses"]["unseen_switch_ins"]) > 0);
    let wanted = |t: &serde_json::Value| {
        u(&t["runq_wait_ns"]) + if repaired { u(&t["oncpu_ns"]) } else { 0 }
    };
    let mut total = 0;
    for (tid, _, a, b, waits) in compared_threads(docs, deltas) {
        let (wa, wb) = (wanted(a), wanted(b));
        assert!(
            wa.abs_diff(wb) <= wa.max(wb) * pct / 100 + per_wait_ns * waits,
            "tid {tid}: runq wait {wa} ns (tp_btf) vs {wb} ns (classic) in {waits} waits"
        );
        total += waits;
    }
    total
}

/// `docs[0]` (tp_btf) and `docs[1]` (classic) saw the same run-queue waits, and their times
/// agree with the kernel's own account of them, schedstat's run delay (`deltas`; the workers
/// are parked at both ends of the window, so a window's waits are the workload's), on a
/// workload whose waits mostly end in a blocking switch (a ping-pong).
///
/// tp_btf takes both ends of a wait from the run queue's clock where the kernel lets it be
/// read (a wait's start at the wakeup, its end at a switch in which `prev` blocks; tracer-ebpf
/// clock.rs), which is the clock schedstat reads at the same two points: measured 0.1-0.4 %
/// apart over 22,900 waits, the rest a preemption's end, which tp_btf reads from the clock
/// helper where schedstat keeps the wakeup's stale clock. `pct` and `per_wait_ns` bound that.
/// What fails it: a wait end or start read at the tracepoint rather than from the run queue's
/// clock (classic's way, 11 % over here), a wait lost or split. What it cannot see: a constant
/// error in the run queue clock's conversion to monotonic time, which both ends of a wait
/// share and which cancels within it (checked by injecting 100 ns and 1 us: the test still
/// passed); the conversion's own check is the clock self-check counted in `losses`
/// (`clock_checks`, `clock_error_ns`), asserted below.
///
/// Classic tracepoints read the clock helper at each tracepoint instead: a wait ends there,
/// after `__schedule` has picked the next task, which the run queue's clock does not count
/// (measured 230 ns a wait on the CPU VM on 2026-12-04, 6-15 ns on 2026-12-03: the VM's
/// speed moves it), so classic waits are longer by up to `CLASSIC_PER_WAIT_NS` each.
/// Where a switch-in went untraced (PID 1's, on our VMs), classic counts the time from the
/// thread's wait to its switch-out as running (tp_btf reads the thread's own run time and
/// moves it back): classic is then compared on the time the thread wanted a CPU, waiting or
/// running.
fn waits_match_the_kernel(
    docs: &[serde_json::Value],
    deltas: &[(u32, KernelCounts)],
    pct: u64,
    per_wait_ns: u64,
) -> u64 {
    /// Classic waits end after `__schedule`'s pick: up to this much longer each.
    const CLASSIC_PER_WAIT_NS: u64 = 1_000;
    let within = |a: u64, b: u64, waits: u64, per_wait: u64| {
        a.abs_diff(b) <= a.max(b) * pct / 100 + per_wait * waits
    };
    let repaired = u(&docs[1]["losses"]["unseen_switch_ins"]) > 0;
    let mut total = 0;
    for (tid, kernel, a, b, waits) in compared_threads(docs, deltas) {
        let (tp_btf, run_delay) = (u(&a["runq_wait_ns"]), kernel.run_delay_ns);
        assert!(
            within(tp_btf, run_delay, waits, per_wait_ns),
            "tid {tid}: runq wait {tp_btf} ns (tp_btf) vs the kernel's run delay {run_delay} \
             ns in {waits} waits"
        );
        let classic = u(&b["runq_wait_ns"]) + if repaired { u(&b["oncpu_ns"]) } else { 0 };
        let reference = run_delay + if repaired { kernel.oncpu_ns } else { 0 };
        assert!(
            classic >= reference.saturating_sub(reference * pct / 100 + per_wait_ns * waits)
                && within(classic, reference, waits, CLASSIC_PER_WAIT_NS + per_wait_ns),
            "tid {tid}: runq wait {classic} ns (classic) vs the kernel's run delay {reference} \
             ns in {waits} waits"
        );
        total += waits;
    }
    total
}

#[test]
fn wait_times_from_the_run_queue_clock_agree_with_the_kernels_run_delay() {
    let _guard = serial();
    require_root();
    // Two threads handing a turn back and forth on one CPU: far more wakeups a tick than the
    // ones each tick's calibration reads the helper for, so most wakeup times are converted.
    let (docs, deltas, _load) = record_by(
        &["pingpong"],
        &[&[], &["--btf", "/nonexistent/vmlinux"]],
        false,
    );
    // tp_btf measured 0.1-0.4 % from the kernel's run delay here (see
    // `waits_match_the_kernel`).
    let waits = waits_match_the_kernel(&docs, &deltas, 2, 50);
    assert!(waits > 10_000, "too few waits to compare: {waits}");
    let l = &docs[0]["losses"];
    let checks = u(&l["clock_checks"]);
    assert!(checks > 0, "no clock checks: {l}");
    assert!(
        u(&l["clock_error_ns"]) / checks < 20_000,
        "mean wakeup clock error: {l}"
    );
}

#[test]
fn tp_btf_counts_equal_the_kernels() {
    let _guard = serial();
    require_root();
    let (doc, deltas, _load) = record_mixed(&[]);
    assert_eq!(doc["probe_mode"], "tp_btf");
    assert_exact(&doc, &deltas);
}

/// The program for kernels before 5.18, whose tp_btf sched_switch passes no `prev_state`
/// (it loads here too; the tracer is told to take it): whether a switch blocked comes from
/// the task's own nvcsw, and the split must still equal the kernel's.
#[test]
fn tp_btf_without_prev_state_counts_equal_the_kernels() {
    let _guard = serial();
    require_root();
    // SAFETY: the serial guard keeps the other tests that start tracers from running now.
    unsafe { std::env::set_var("TRACER_TEST_SWITCH_WITHOUT_STATE", "1") };
    let (doc, deltas, _load) = record_mixed(&[]);
    unsafe { std::env::remove_var("TRACER_TEST_SWITCH_WITHOUT_STATE") };
    assert_eq!(doc["probe_mode"], "tp_btf");
    let btf = doc["capabilities"]["btf"]["reason"].as_str().unwrap_or("");
    assert!(btf.contains("without prev_state"), "says which: {btf}");
    assert_exact(&doc, &deltas);
}

#[test]
fn classic_fallback_counts_equal_the_kernels() {
    let _guard = serial();
    require_root();
    // A kernel without BTF, simulated: the tracer must fall back to classic tracepoints.
    let (doc, deltas, _load) = record_mixed(&["--btf", "/nonexistent/vmlinux"]);
    assert_eq!(doc["probe_mode"], "classic");
    assert!(
        doc["probe_fallback_reason"]
            .as_str()
            .is_some_and(|r| r.contains("/nonexistent/vmlinux")),
        "{}",
        doc["probe_fallback_reason"]
    );
    assert_exact(&doc, &deltas);
}

#[test]
fn json_carries_the_documented_fields_and_only_the_target() {
    let _guard = serial();
    require_root();
    let (doc, deltas, load) = record_mixed(&[]);
    for key in [
        "pid",
        "duration_ns",
        "threads",
        "preemptors",
        "dropped_events",
    ] {
        assert!(doc.get(key).is_some(), "missing {key}");
    }
    assert_eq!(u(&doc["pid"]), load.pid as u64);
    assert!(u(&doc["duration_ns"]) > 0);
    let threads = doc["threads"].as_array().unwrap();
    // Exactly the workload's threads: no idle task (TID 0), no other process.
    let mut tids: Vec<u64> = threads.iter().map(|t| u(&t["tid"])).collect();
    tids.sort();
    let mut expected: Vec<u64> = deltas.iter().map(|(t, _)| *t as u64).collect();
    expected.sort();
    assert_eq!(tids, expected);
    for t in threads {
        for key in [
            "tid",
            "comm",
            "voluntary_switches",
            "involuntary_switches",
            "migrations",
            "oncpu_ns",
            "runq_wait_ns",
            "offcpu_ns",
        ] {
            assert!(t.get(key).is_some(), "thread missing {key}: {t}");
        }
        assert_eq!(
            u(&t["offcpu_ns"]),
            u(&t["runq_wait_ns"]) + u(&t["blocked_ns"])
        );
        // Every thread lived through the whole window: its states cover it.
        let covered = u(&t["oncpu_ns"]) + u(&t["offcpu_ns"]);
        let window = u(&doc["duration_ns"]);
        assert!(
            covered.abs_diff(window) <= window / 100,
            "tid {}: states cover {covered} ns of a {window} ns window",
            t["tid"]
        );
    }
    for p in doc["preemptors"].as_array().unwrap() {
        // The idle task appears only as itself: the CPU idled while a thread waited.
        if u(&p["pid"]) == 0 {
            assert_eq!(u(&p["tgid"]), 0, "{p}");
        }
        for key in ["pid", "comm", "wait_ns"] {
            assert!(p.get(key).is_some(), "preemptor missing {key}: {p}");
        }
    }
    for p in doc["preemptor_processes"].as_array().unwrap() {
        if u(&p["tgid"]) == 0 {
            assert_eq!(p["comm"], "idle", "{p}");
        }
    }
    assert_eq!(u(&doc["dropped_events"]), 0);
}

/// `losses.unseen_wakeups` against the threads' own books: the workload's threads are parked
/// (blocked) at both ends of the window, so each block in it (a voluntary switch, exact
/// against /proc by `assert_exact`) is ended by a wakeup in it, but for the one each thread
/// blocked in at the start (a wakeup with no block before it) and the one at the end (a block
/// with no wakeup after), which cancel. Voluntary switches beyond wakeups are wakeups the
/// probes did not see, as many as the recording says; the main thread, not always parked at
/// an end (`compared_threads`), may move that by one. Only where no switch went untraced,
/// whose repair can count a block or a wakeup of its own.
fn missed_wakeups_are_counted(doc: &serde_json::Value) {
    let l = &doc["losses"];
    if u(&l["unseen_switch_ins"]) + u(&l["unseen_switch_outs"]) > 0 {
        return;
    }
    let gap = blocks_beyond_wakeups(doc);
    let unseen = u(&l["unseen_wakeups"]) as i64;
    assert!(
        gap.abs_diff(unseen) <= 1,
        "{}: voluntary switches exceed wakeups by {gap}, but {unseen} wakeups said unseen",
        doc["probe_mode"]
    );
}

/// The recording's voluntary switches (blocks) less its wakeups, over all threads.
fn blocks_beyond_wakeups(doc: &serde_json::Value) -> i64 {
    doc["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u(&t["voluntary_switches"]) as i64 - u(&t["wakeups"]) as i64)
        .sum()
}

#[test]
fn two_tracers_on_one_pid_both_count_exactly() {
    let _guard = serial();
    require_root();
    // One with the tp_btf programs, one with the classic ones: the same counts either way.
    let (docs, deltas, _load) = record_mixed_by(&[&[], &["--btf", "/nonexistent/vmlinux"]], false);
    assert_eq!(docs[0]["probe_mode"], "tp_btf");
    assert_eq!(docs[1]["probe_mode"], "classic");
    for doc in &docs {
        assert_exact(doc, &deltas);
        missed_wakeups_are_counted(doc);
    }
    // Measured 0.2-1.1 us per wait apart (0.4-3.5 %).
    same_waits(&docs, &deltas, 5, 2_000);
}

#[test]
fn an_overflowing_ring_buffer_reports_its_drops_and_keeps_exact_totals() {
    let _guard = serial();
    require_root();
    // A 4 KiB ring holds about a hundred records, and the tracer is stopped (as a reader
    // starved of CPU would be) while the workload makes thousands.
    let (mut docs, deltas, _load) = record_mixed_by(&[&["--ring-kib", "4"]], true);
    let doc = docs.remove(0);
    assert!(u(&doc["dropped_events"]) > 0, "nothing dropped");
    // The per-thread totals are kept in kernel maps, not carried by the ring: still exact.
    assert_exact(&doc, &deltas);
}

#[test]
fn threads_beyond_the_direct_mapped_slots_count_exactly() {
    let _guard = serial();
    require_root();
    // One slot: the first thread seen takes it and every other one goes to the hash map, the
    // path of threads whose TIDs share a slot.
    let (doc, deltas, _load) = record_mixed(&["--thread-slots", "1"]);
    assert_eq!(doc["probe_mode"], "tp_btf");
    assert_exact(&doc, &deltas);
}

/// The wakeups a recording says it did not see (`losses.unseen_wakeups`) against the threads'
/// own books, on the cpu-contention demo, whose server and worker block and wake each other
/// hundreds of times a second: every block (voluntary switch) in the window is ended by a
/// wakeup in it but for one per thread at each edge, so voluntary switches beyond wakeups are
/// the missed wakeups, within one per thread, and one per switch-in that went untraced (its
/// repair closes a block of its own). With classic tracepoints the kernel skips the
/// `sched_wakeup` program now and then (30-55 wakeups in 2 s here); with tp_btf it does not.
#[test]
fn the_wakeups_the_kernel_did_not_report_are_counted() {
    let _guard = serial();
    require_root();
    let dir = std::env::temp_dir().join(format!("tracer-wakeups-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("demo.trace");
    let trace = trace.to_str().unwrap();
    for extra in [&[][..], &["--btf", "/nonexistent/vmlinux"]] {
        let mut args = vec![
            "demo",
            "--scenario",
            "cpu-contention",
            "--duration",
            "2s",
            "--json",
            "--quiet",
            "-o",
            trace,
        ];
        args.extend_from_slice(extra);
        let out = tracer_tests::run_tracer(&args);
        assert!(out.status.success(), "{}", out.stderr);
        let doc = out.json();
        // The text says so, on the same recording read back.
        let text = tracer_tests::run_tracer(&["report", trace]);
        assert!(text.status.success(), "{}", text.stderr);
        let said = text.stdout.contains("ran again with no wakeup traced");
        assert_eq!(
            said,
            u(&doc["losses"]["unseen_wakeups"]) > 0,
            "{}",
            text.stdout
        );
        let threads = doc["threads"].as_array().unwrap();
        let gap = blocks_beyond_wakeups(&doc);
        let l = &doc["losses"];
        let unseen = u(&l["unseen_wakeups"]) as i64;
        let slack = threads.len() as u64 + u(&l["unseen_switch_ins"]);
        assert!(
            gap.abs_diff(unseen) <= slack,
            "{}: voluntary switches exceed wakeups by {gap}, {unseen} wakeups said unseen \
             (within {slack})",
            doc["probe_mode"]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
