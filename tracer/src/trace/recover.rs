//! A trace file back into a recording: exactly the one that was written when the file is
//! complete, and as much as the timeline tells when the tracer died before finishing it.

use super::{TraceMeta, reader::TraceContents, upgrade::Upgrade};
use crate::recording::{
    Capabilities, Capability, EndReason, GpuCapability, Losses, PmuCapability, Recording,
    ThreadRecord, WaitSamples,
    collect::Collector,
    gpu::{GpuDevice, GpuRecording},
    records::split,
};

/// The recording a trace file holds. `keep`: keep the timeline records (for drawing).
pub fn into_recording(c: TraceContents, keep: bool) -> Recording {
    let mut col = Collector::new(c.meta.start_ns, c.meta.bin_ns, true);
    let mut upgrade = (c.version < 2).then(Upgrade::default);
    for r in split(&c.records) {
        col.on_record(match upgrade.as_mut() {
            Some(u) => u.record(r),
            None => r,
        });
    }
    let mut rec = match c.final_recording {
        Some(mut rec) => {
            let mut samples = col.take_samples();
            let mut waits = col.take_waits();
            for t in rec.threads.iter_mut() {
                t.runq_wait_samples = samples.remove(&t.tid).unwrap_or_default();
                t.wait_classes = waits.remove(&t.tid).unwrap_or_default();
            }
            col.finish_into(&mut rec);
            rec
        }
        None => {
            let why = match &c.damage {
                Some(d) => d.to_string(),
                None => "it has no final frame".to_string(),
            };
            let heartbeat = c
                .gpu
                .iter()
                .map(|p| p.t_ns)
                .chain(c.cgroup.iter().map(|s| s.t_ns))
                .max()
                .unwrap_or(0);
            let mut rec = partial(&c.meta, c.gpu, c.cgroup, why);
            // Close the timeline at the heartbeat before rebuilding it.
            rec.end_ns = heartbeat.max(c.meta.start_ns);
            let mut waits = col.take_waits();
            col.finish_into(&mut rec);
            rebuild_threads(&mut rec, &c.meta, heartbeat);
            for t in rec.threads.iter_mut() {
                t.wait_classes = waits.remove(&t.tid).unwrap_or_default();
            }
            rec
        }
    };
    // Requests from markers are decomposed on the timeline.
    if !keep && rec.requests.is_none() {
        rec.timeline = Default::default();
    }
    rec
}

fn unknown(what: &str) -> Capability {
    Capability {
        available: false,
        reason: format!("unknown: {what} is in the final frame, which the file lacks"),
    }
}

/// What can be said without the final frame.
fn partial(
    meta: &TraceMeta,
    polls: Vec<crate::recording::gpu::GpuPoll>,
    cgroup: Vec<crate::recording::cgroup::CgroupSample>,
    why: String,
) -> Recording {
    let mut devices: Vec<u32> = polls.iter().map(|p| p.device).collect();
    devices.sort_unstable();
    devices.dedup();
    let gpu = (!polls.is_empty()).then(|| GpuRecording {
        devices: devices
            .into_iter()
            .map(|index| GpuDevice {
                index,
                name: String::new(),
                uuid: String::new(),
                gpm_supported: false,
                used_by_target: false,
                contexts: vec![],
            })
            .collect(),
        selection: "recovered from the streamed polls".into(),
        polls,
        ..Default::default()
    });
    Recording {
        tracer_cost: None,
        output_error: None,
        tracer_version: meta.tracer_version.clone(),
        target: meta.target.clone(),
        probe_mode: meta.probe_mode,
        probe_fallback_reason: None,
        start_ns: meta.start_ns,
        end_ns: meta.start_ns,
        end_reason: EndReason::Unfinished,
        target_exited_ns: None,
        threads: vec![],
        preemptors: vec![],
        migration_routes: vec![],
        losses: Losses::default(),
        events_received: 0,
        capabilities: Capabilities {
            pmu: PmuCapability {
                available: false,
                reason: "unknown: the final frame is missing".into(),
                events: Default::default(),
                llc_available: false,
            },
            btf: unknown("BTF"),
            tracefs: unknown("tracefs"),
            gpu: GpuCapability::from_parts(unknown("GPU"), unknown("GPM"), unknown("CUDA")),
        },
        counter_mask: meta.counter_mask,
        counter_bins: Default::default(),
        gpu,
        cuda_syncs: vec![],
        cuda_launch_bins: Default::default(),
        requests: None,
        cgroup: None,
        other_cgroups: vec![],
        host: meta.host.clone(),
        timeline_missing_before_ns: None,
        incomplete: Some(format!(
            "the trace file was not finished ({why}): per-thread totals are rebuilt from the \
             timeline as far as it goes; preemptors, migration routes, losses and exact kernel \
             totals were in the missing final frame{}",
            if cgroup.is_empty() {
                ""
            } else {
                "; cgroup samples were recovered"
            }
        )),
        timeline: Default::default(),
        pid_namespace: meta.pid_namespace.clone(),
        proc_counts: None,
        children: vec![],
        processes: vec![],
        target_cgroup: None,
        wakers: vec![],
        runtime_pauses: vec![],
        pause_probes: vec![],
    }
}

/// Per-thread records from the timeline, closed at the last thing the file recorded (an
/// event, a GPU poll or a cgroup sample, which come every 100 ms even when the target is idle).
fn rebuild_threads(rec: &mut Recording, meta: &TraceMeta, heartbeat: u64) {
    let events = &rec.timeline.events;
    let end = events
        .iter()
        .map(|e| e.ts_ns)
        .max()
        .unwrap_or(meta.start_ns)
        .max(heartbeat);
    rec.end_ns = end;
    rec.events_received = (events.len() + rec.timeline.slices.len()) as u64;
    let timelines = rec.threads_over_time();
    let mut threads: Vec<ThreadRecord> = timelines
        .values()
        .map(|t| {
            let mut samples = WaitSamples::default();
            let mut hist = vec![0u32; tracer_common::RUNQ_HIST_SLOTS];
            for &(w, _) in &t.waits {
                samples.record(w);
                hist[tracer_common::hist_slot(w)] += 1;
            }
            ThreadRecord {
                tid: t.tid,
                pid: meta.threads.get(&t.tid).map_or(0, |i| i.pid),
                comm: meta
                    .threads
                    .get(&t.tid)
                    .map_or_else(String::new, |i| i.comm.clone()),
                created_ns: t.created_ns,
                exited_ns: t.exited_ns,
                parent_tid: t.parent_tid,
                totals: t.totals(),
                runq_waits: t.waits.len() as u64,
                runq_wait_max_ns: t.waits.iter().map(|w| w.0).max().unwrap_or(0),
                runq_wait_log2_hist: hist,
                runq_wait_samples: samples,
                counters: None,
                cuda: None,
                wait_classes: Default::default(),
                tail_switch: None,
            }
        })
        .collect();
    // Threads that did nothing in the recovered part: as /proc listed them at the start.
    for (tid, info) in &meta.threads {
        if !timelines.contains_key(tid) {
            threads.push(crate::recording::close::quiet_thread(
                info,
                meta.start_ns,
                end,
            ));
        }
    }
    threads.sort_by_key(|t| t.tid);
    rec.threads = threads;
}
