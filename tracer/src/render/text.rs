//! The terminal summary.

use std::fmt::Write as _;

use comfy_table::{CellAlignment, ContentArrangement, Table, presets};

use crate::{
    analysis::{Report, quantiles::QuantileSource, summary::Summary},
    recording::{EndReason, ProbeMode},
};
use crate::{
    recording::printable,
    units::{dur, opt_dur, pct, size},
};

/// Threads shown in the table; the JSON has them all.
const MAX_THREAD_ROWS: usize = 20;
const MAX_PREEMPTOR_ROWS: usize = 10;
/// Processes shown (the ones given, then the busiest).
const MAX_PROCESS_ROWS: usize = 12;

pub(super) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for i in 0..header.len() {
        if let Some(col) = t.column_mut(i) {
            // Numbers right-aligned; the name column (1) left.
            col.set_cell_alignment(if i == 1 {
                CellAlignment::Left
            } else {
                CellAlignment::Right
            });
        }
    }
    t
}

pub fn render(r: &Report) -> String {
    let s = &r.summary;
    let mut out = String::new();
    super::verdict::render(r, &mut out);
    header(&mut out, s);
    cgroups(&mut out, s);
    notes(&mut out, s);
    threads(&mut out, s);
    counters(&mut out, s);
    super::gpu_text::gpu(&mut out, s);
    super::ranks::ranks(&mut out, s);

    preemptors(&mut out, s);
    super::held_up::held_up(&mut out, s);
    out
}

/// What was recorded, how, and the target's totals.
fn header(out: &mut String, s: &Summary) {
    let t = &s.totals;
    let probes = match s.probe_mode {
        ProbeMode::TpBtf => "tp_btf probes",
        ProbeMode::Classic => "classic tracepoints",
    };
    let ended = match s.end_reason {
        EndReason::Duration => String::new(),
        EndReason::Interrupted => " (stopped early by a signal)".into(),
        EndReason::TargetExited => format!(
            " ({} exited after {})",
            // With `-p A,B` the recording ends when the last of them exits.
            if s.processes.iter().filter(|p| p.given).count() > 1 {
                "the last of the processes given"
            } else {
                "the process"
            },
            dur(s
                .target_exited_ns
                .unwrap_or(s.end_ns)
                .saturating_sub(s.start_ns))
        ),
        EndReason::Unfinished => " (from an unfinished trace file)".into(),
        EndReason::Window => " (one window of `tracer watch`)".into(),
    };
    let _ = writeln!(
        out,
        "PID {} ({}{}): {} recorded{ended} with {probes}",
        s.shown_id(s.pid),
        printable(&s.comm),
        match &s.pid_namespace {
            Some(ns) => format!(
                ", host PID {}; TIDs below are in PID namespace {}",
                s.pid, ns.inode
            ),
            None => String::new(),
        },
        dur(s.duration_ns)
    );
    let _ = writeln!(
        out,
        "  threads: {} ({} created, {} exited during the recording)",
        t.threads, t.threads_created, t.threads_exited
    );
    processes(out, s);
    let _ = writeln!(
        out,
        "  on-CPU {}  run-queue wait {} ({} of the time the threads wanted a CPU)  blocked {}",
        dur(t.time.oncpu_ns),
        dur(t.time.runq_wait_ns),
        pct(t.runq_wait_share),
        dur(t.time.blocked_ns)
    );
    let h = &t.wait_classes;
    if h.handoff_waits > 0 {
        let _ = writeln!(
            out,
            "    of which {} in {} handoffs: behind the task it exchanges work with (one it woke, or its waker) until that one blocked; the exchange, not a CPU denied",
            dur(h.handoff_ns),
            h.handoff_waits
        );
    }
    let _ = writeln!(
        out,
        // Counted as they end: one still open at the window's end is in the time above only.
        "  run-queue waits ended in the window: {}  p50 {}  p99 {}  max {}{}",
        t.runq_waits,
        opt_dur(t.runq_wait_p50_ns),
        opt_dur(t.runq_wait_p99_ns),
        dur(t.runq_wait_max_ns),
        match t.runq_wait_quantiles_from {
            Some(QuantileSource::KernelLog2) => " (quantiles from the kernel's log2 histogram)",
            _ => "",
        }
    );
    let _ = writeln!(
        out,
        "  context switches: {} voluntary, {} involuntary; {} migrations ({} within a core, {} \
         within an LLC, {} across LLCs, {} across NUMA nodes)",
        t.switches.voluntary_switches,
        t.switches.involuntary_switches,
        t.switches.migrations,
        t.migrations_same_core,
        t.migrations_same_llc,
        t.migrations_cross_llc,
        t.migrations_cross_numa
    );
}

/// Each cgroup of the members, with its quota and throttling.
fn cgroups(out: &mut String, s: &Summary) {
    // Each cgroup of the members (files from before process trees list only the target's).
    let cgroups: Vec<_> = if s.cgroups.is_empty() {
        s.cgroup.iter().collect()
    } else {
        s.cgroups.iter().collect()
    };
    for c in cgroups {
        let quota = if c.limits_cpus.is_empty() {
            "no CPU quota".to_string()
        } else {
            let cpus: Vec<String> = c.limits_cpus.iter().map(|q| format!("{q:.2}")).collect();
            format!("CPU quota {} CPUs", cpus.join(" / "))
        };
        let by = match c.throttled_by.as_deref() {
            Some(b) if !c.path.ends_with(b) => format!(" (by the quota of {b})"),
            _ => String::new(),
        };
        let holding = if s.cgroups.len() > 1 {
            let pids: Vec<String> = c.pids.iter().map(|p| s.shown_id(*p)).collect();
            format!(" (PID {})", pids.join(", "))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            // The kernel adds up each CPU's throttled time: with several CPUs it can exceed
            // the window.
            "  cgroup {}{holding}: {quota}; throttled{by} in {} of {} periods ({}), {} summed \
             over its CPUs",
            c.path,
            c.throttled_periods,
            c.periods,
            pct(c.throttled_share),
            dur(c.throttled_ns)
        );
    }
}

/// The tracer's own cost, and every warning about what the recording may lack.
fn notes(out: &mut String, s: &Summary) {
    if let Some(c) = &s.tracer_cost {
        let _ = writeln!(
            out,
            "  tracer's own cost: {} CPU ({} of one CPU), peak RSS {}",
            dur(c.cpu_ns),
            pct(c.cpu_share),
            size(c.peak_rss_bytes)
        );
    }
    if s.dropped_events > 0 {
        let _ = writeln!(
            out,
            "  warning: {} timeline events were dropped (ring buffer full); totals are exact, \
             wait quantiles come from the kernel's histogram",
            s.dropped_events
        );
    }
    let l = &s.losses;
    if l.thread_map_full + l.preemptor_map_full + l.migration_map_full > 0 {
        let _ = writeln!(
            out,
            "  warning: kernel maps overflowed (threads {}, preemptors {}, migration routes {}): \
             some activity is not counted",
            l.thread_map_full, l.preemptor_map_full, l.migration_map_full
        );
    }
    if l.child_map_full > 0 {
        let _ = writeln!(
            out,
            "  warning: {} processes joined the set beyond the {} the kernel notes: they are \
             traced and listed from their threads, but when they joined is not known",
            l.child_map_full,
            tracer_common::MAX_CHILDREN
        );
    }
    if l.unseen_wakeups > 0 {
        let _ = writeln!(
            out,
            "  warning: {} times a target thread ran again with no wakeup traced since it \
             blocked{}: the run-queue waits in between are counted as blocked time",
            l.unseen_wakeups,
            if s.probe_mode == ProbeMode::Classic {
                " (the kernel skips classic tracepoint programs now and then; the tp_btf ones, \
                 which need the kernel's BTF, it does not)"
            } else {
                " (a wakeup before the probes were attached, or a sleep a signal cut short, \
                 which kernels 5.18 to 6.12 report as a block)"
            }
        );
    }
    if let Some(what) = &s.incomplete {
        let _ = writeln!(out, "  warning: {what}");
    }
    if let Some(t) = s.timeline_missing_before_ns {
        let _ = writeln!(
            out,
            "  warning: the timeline's first {} are missing (the flight recorder's \
             --keep-max-mib let them go): requests in that stretch are decomposed without it \
             (uncovered); totals are exact",
            crate::units::dur(t.saturating_sub(s.start_ns))
        );
    }
    if let Some(reason) = &s.probe_fallback_reason {
        let _ = writeln!(out, "  note: classic tracepoints were used: {reason}");
    }
}

/// The threads table: the busiest by run-queue wait, grouped by process in a service.
fn threads(out: &mut String, s: &Summary) {
    // Threads that neither ran nor switched are a worker pool's idle members: counted, not
    // listed.
    let active: Vec<_> = s
        .threads
        .iter()
        .filter(|t| {
            t.totals.time.oncpu_ns > 0
                || t.totals.switches.voluntary_switches + t.totals.switches.involuntary_switches > 0
        })
        .collect();
    let idle = s.threads.len() - active.len();
    // In a service of several processes, the table is grouped by process, in the order of
    // the processes block, each group by run-queue wait.
    let grouped = s.processes.len() > 1;
    let mut active = active;
    if grouped {
        active.sort_by_key(|t| s.process_rank(t.pid));
    }
    let _ = writeln!(
        out,
        "\nThreads ({}by run-queue wait):",
        if grouped { "by process, then " } else { "" }
    );
    let mut tt = table(&[
        "TID",
        "COMM",
        "ON-CPU",
        "RUNQ-WAIT",
        "P50",
        "P99",
        "MAX",
        "VOL",
        "INVOL",
        "MIGR",
    ]);
    let mut group = None;
    for th in active.iter().take(MAX_THREAD_ROWS) {
        if grouped && group != Some(th.pid) {
            group = Some(th.pid);
            let role = s.process(th.pid).map_or("?", |p| &p.role);
            tt.add_row(vec![
                String::new(),
                format!("PID {} ({})", s.shown_id(th.pid), printable(role)),
            ]);
        }
        let mut name = printable(&th.comm).into_owned();
        if th.created_ns.is_some() {
            name.push_str(" +new");
        }
        if th.exited_ns.is_some() {
            name.push_str(" +exited");
        }
        tt.add_row(vec![
            s.shown_id(th.tid),
            name,
            dur(th.totals.time.oncpu_ns),
            dur(th.totals.time.runq_wait_ns),
            opt_dur(th.runq_wait_p50_ns),
            opt_dur(th.runq_wait_p99_ns),
            dur(th.runq_wait_max_ns),
            th.totals.switches.voluntary_switches.to_string(),
            th.totals.switches.involuntary_switches.to_string(),
            th.totals.switches.migrations.to_string(),
        ]);
    }
    let _ = writeln!(out, "{tt}");
    if active.len() > MAX_THREAD_ROWS {
        let _ = writeln!(
            out,
            "  ... {} more threads (--json lists them all)",
            active.len() - MAX_THREAD_ROWS
        );
    }
    if idle > 0 {
        let _ = writeln!(
            out,
            "  ({idle} threads blocked the whole time, not listed; --json lists them)"
        );
    }
}

fn preemptors(out: &mut String, s: &Summary) {
    if s.preemptors.is_empty() && s.incomplete.is_some() {
        // They are counted in the kernel and arrive in the final frame, which this file lacks.
        let _ = writeln!(
            out,
            "\nWhat ran while the target's threads waited for a CPU is not known: it was in \
             the trace file's missing final frame."
        );
    } else if s.preemptors.is_empty() {
        let _ = writeln!(
            out,
            "\nNo task ran while the target's threads waited for a CPU."
        );
    } else {
        let _ = writeln!(
            out,
            "\nTop preemptors (what ran while the target's threads waited for a CPU), grouped \
             into neighbours:"
        );
        let mut pt = table(&["PIDS", "NEIGHBOUR", "THREADS", "WAIT CAUSED", "SHARE"]);
        for n in s.neighbours.iter().take(MAX_PREEMPTOR_ROWS) {
            use crate::analysis::neighbours::NeighbourKind as K;
            let name = printable(&n.name);
            let name = match n.kind {
                K::Target if s.processes.len() > 1 => format!("{name} (its members)"),
                K::Target => format!("{name} (the target itself)"),
                K::Children => "its own child processes (not traced)".to_string(),
                K::Cgroup => format!("cgroup {name}"),
                K::Idle => format!("{name} (no task ran: cgroup throttled, or a slow wakeup)"),
                K::Command if n.process_count > 1 => format!("{name} (one parent's)"),
                K::Command | K::Process => name.into_owned(),
            };
            let mut pids: Vec<String> =
                n.processes.iter().take(3).map(|p| s.shown_id(*p)).collect();
            if n.process_count > 3 {
                pids.push(format!("+{}", n.process_count - 3));
            }
            pt.add_row(vec![
                pids.join(","),
                name,
                n.threads.to_string(),
                dur(n.wait_ns),
                pct(n.wait_share),
            ]);
        }
        let _ = writeln!(out, "{pt}");
    }
}

pub(super) fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "-".into())
}

/// The counters section: what was measured, or plainly why not and what that means.
/// One line per process of the set, when there is more than one: which, since when, and what
/// its threads did.
fn processes(out: &mut String, s: &Summary) {
    if s.processes.len() < 2 {
        return;
    }
    let _ = writeln!(out, "  processes: {}", s.processes.len());
    for p in s.processes.iter().take(MAX_PROCESS_ROWS) {
        let since = |t: Option<u64>, what: &str| {
            t.map_or(String::new(), |t| {
                format!(", {what} at +{}", dur(t.saturating_sub(s.start_ns)))
            })
        };
        let _ = writeln!(
            out,
            "    PID {} ({}, {}){}{}{}: {} thread{}, on-CPU {}, run-queue wait {}, blocked {}",
            s.shown_id(p.pid),
            printable(&p.comm),
            printable(&p.role),
            if p.given {
                String::new()
            } else {
                format!(", child of {}", s.shown_id(p.ppid))
            },
            since(p.joined_ns, "forked"),
            since(p.left_ns, "exited"),
            p.threads,
            if p.threads == 1 { "" } else { "s" },
            dur(p.totals.time.oncpu_ns),
            dur(p.totals.time.runq_wait_ns),
            dur(p.totals.time.blocked_ns)
        );
    }
    let rest = &s.processes[s.processes.len().min(MAX_PROCESS_ROWS)..];
    if !rest.is_empty() {
        let on: u64 = rest.iter().map(|p| p.totals.time.oncpu_ns).sum();
        let _ = writeln!(
            out,
            "    ... and {} more (on-CPU {} in all; the JSON lists every one)",
            rest.len(),
            dur(on)
        );
    }
}

fn counters(out: &mut String, s: &Summary) {
    let pmu = &s.capabilities.pmu;
    let c = &s.counters;
    if !pmu.llc_available {
        let _ = writeln!(
            out,
            "\nCPU counters: LLC/IPC unavailable: {}.\n  Cache thrash cannot be assessed from this \
             recording (not assessed, which is not the same as absent).",
            pmu.reason
        );
    }
    if c.measured.is_empty() {
        return;
    }
    if let Some(asked) = c.bins_widened_from_ns {
        let _ = writeln!(
            out,
            "\nCounter series: bins of {} instead of the {} asked for, to keep the series \
             within 10,000 bins over the window.",
            dur(c.bin_ns),
            dur(asked)
        );
    }
    let hw = c.totals.cycles.is_some() || c.totals.llc_misses.is_some();
    if hw {
        let _ = writeln!(
            out,
            "\nCPU counters by thread (IPC: instructions/cycle, MPKI: LLC misses per 1000              instructions):"
        );
        let mut t = table(&["TID", "COMM", "IPC", "MPKI", "LLC MISS%", "COUNTED%"]);
        let mut rows: Vec<_> = s.threads.iter().filter(|t| t.counters.is_some()).collect();
        rows.sort_by_key(|t| {
            std::cmp::Reverse(
                t.counters
                    .as_ref()
                    .and_then(|c| c.values.llc_misses)
                    .unwrap_or(0),
            )
        });
        for th in rows.iter().take(MAX_THREAD_ROWS) {
            let k = th.counters.as_ref().expect("filtered");
            t.add_row(vec![
                s.shown_id(th.tid),
                printable(&th.comm).into_owned(),
                opt(k.values.ipc.map(|v| format!("{v:.2}"))),
                opt(k.values.mpki.map(|v| format!("{v:.2}"))),
                opt(k.values.llc_miss_ratio.map(pct)),
                opt(k.multiplexing_ratio.map(pct)),
            ]);
        }
        let _ = writeln!(out, "{t}");
    }
    let sw = &c.totals;
    if let (Some(clock), Some(switches)) = (sw.cpu_clock_ns, sw.context_switches) {
        let _ = writeln!(
            out,
            "\nSoftware counters, read at the same context switches: cpu-clock {} (scheduler: \
             on-CPU {}), {switches} context switches, {} migrations",
            dur(clock),
            dur(s.totals.time.oncpu_ns),
            opt(sw.cpu_migrations)
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::recording::{EndReason, ProcessRecord, testutil};

    /// The heading says which exit ended the recording: with `-p A,B`, the last one's.
    #[test]
    fn the_heading_says_whose_exit_ended_the_recording() {
        let process = |pid| ProcessRecord {
            pid,
            ppid: 1,
            comm: "server".into(),
            cmdline: vec![],
            given: true,
            joined_ns: None,
            cgroup: None,
            python: None,
        };
        let text = |processes: Vec<ProcessRecord>| {
            let mut rec = testutil::recording(vec![], vec![]);
            rec.end_reason = EndReason::TargetExited;
            rec.target_exited_ns = Some(6_000);
            rec.processes = processes;
            super::render(&crate::analysis::analyze(&rec))
        };
        let one = text(vec![process(100)]);
        assert!(one.contains("(the process exited after 5.00µs)"), "{one}");
        let two = text(vec![process(100), process(200)]);
        assert!(
            two.contains("(the last of the processes given exited after 5.00µs)"),
            "{two}"
        );
    }
}
