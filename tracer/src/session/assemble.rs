//! Reading what the sources kept once the window has ended, and assembling the recording.

use std::collections::BTreeMap;

use anyhow::Result;

use super::target_meta;
use crate::{
    recording::{
        CgroupRecording, CudaTotals, EndReason, HostMeta, MigrationRoute, PreemptorRecord,
        Recording, ThreadInputs, assemble_threads, collect::Collector, comm_string,
        counters::CounterTotals, gpu::GpuRecording,
    },
    sources::{
        ebpf::{Reaped, SchedProbes},
        host::{self, Capabilities, GpuCapability},
        perf::Capability,
        process::{Target, ThreadInfo, comm_of},
    },
};

/// How the window went, and what was gathered outside the kernel maps.
pub struct Ended {
    pub start: u64,
    pub end: u64,
    pub end_reason: EndReason,
    pub target_exited_ns: Option<u64>,
    pub initial: BTreeMap<u32, ThreadInfo>,
    pub cuda_at_end: Vec<(u32, tracer_common::CudaThread)>,
    pub finished: Reaped,
    pub gpu: Option<GpuRecording>,
    pub gpu_capability: Capability,
    pub cgroup: Option<CgroupRecording>,
    pub host: HostMeta,
    pub proc_counts: crate::recording::ProcWindow,
}

fn gpm_capability(gpu: Option<&GpuRecording>) -> Capability {
    match gpu {
        None => Capability {
            available: false,
            reason: "no GPU sampled".into(),
        },
        Some(g) if g.gpm => Capability {
            available: true,
            reason: "GPM metrics sampled".into(),
        },
        Some(_) => Capability {
            available: false,
            reason: "GPM unsupported on the sampled GPUs (it needs Hopper or later): SM \
                     activity, occupancy, tensor and DRAM metrics are not assessed"
                .into(),
        },
    }
}

/// Reads the kernel maps and joins everything into the recording.
pub fn recording(
    target: &Target,
    probes: &mut SchedProbes,
    mut col: Collector,
    w: Ended,
) -> Result<Recording> {
    let losses = probes.losses()?;
    let mut finished = w.finished;
    let mut kernel = probes.threads()?;
    kernel.append(&mut finished.stats);
    let counters: BTreeMap<u32, CounterTotals> = probes
        .thread_counters()?
        .iter()
        .chain(finished.counters.iter())
        .map(|(tid, c)| (*tid, CounterTotals::from(c)))
        .collect();
    let cuda: BTreeMap<u32, CudaTotals> = w
        .cuda_at_end
        .iter()
        .chain(finished.cuda.iter())
        .map(|(tid, c)| (*tid, CudaTotals::from(c)))
        .collect();
    let mut preemptors: Vec<PreemptorRecord> = probes
        .preemptors()?
        .into_iter()
        .map(|p| PreemptorRecord {
            pid: p.pid,
            tgid: p.tgid,
            comm: comm_string(&p.comm),
            process_comm: target.proc_pid_of(p.tgid).and_then(comm_of),
            wait_ns: p.wait_ns,
            slices: p.slices,
        })
        .collect();
    // The target's own threads are charged in their thread entries (tracer-ebpf `on_switch`).
    preemptors.extend(
        kernel
            .iter()
            .filter(|t| t.caused_slices != 0)
            .map(|t| PreemptorRecord {
                pid: t.tid,
                tgid: t.tgid,
                comm: comm_string(&t.comm),
                process_comm: target.proc_pid_of(t.tgid).and_then(comm_of),
                wait_ns: t.caused_wait_ns,
                slices: t.caused_slices,
            }),
    );
    let migration_routes = probes
        .migrations()?
        .into_iter()
        .map(|(k, count)| MigrationRoute {
            tid: k.tid,
            from_cpu: k.from_cpu,
            to_cpu: k.to_cpu,
            count,
        })
        .collect();
    let inputs = ThreadInputs {
        kernel,
        initial: w.initial,
        final_names: target.threads(),
        samples: col.take_samples(),
        counters,
        cuda,
        waits: col.take_waits(),
        end_counts: w.proc_counts.end.clone(),
    };
    let threads = assemble_threads(inputs, w.start, w.end);
    let mut rec = Recording {
        tracer_version: env!("CARGO_PKG_VERSION").into(),
        target: target_meta(target),
        probe_mode: probes.mode(),
        probe_fallback_reason: probes.fallback_reason.clone(),
        start_ns: w.start,
        end_ns: w.end,
        end_reason: w.end_reason,
        target_exited_ns: w.target_exited_ns,
        threads,
        preemptors,
        migration_routes,
        losses,
        events_received: col.records,
        capabilities: Capabilities {
            pmu: probes.pmu.clone(),
            btf: probes.btf_capability.clone(),
            tracefs: host::tracefs(),
            gpu: GpuCapability::from_parts(
                w.gpu_capability,
                gpm_capability(w.gpu.as_ref()),
                probes.cuda.clone(),
            ),
        },
        counter_mask: probes.counter_mask,
        counter_bins: Default::default(),
        gpu: w.gpu,
        cuda_syncs: vec![],
        cuda_launch_bins: Default::default(),
        requests: None,
        cgroup: w.cgroup,
        host: w.host,
        incomplete: None,
        tracer_cost: None,
        output_error: None,
        timeline: Default::default(),
        pid_namespace: None,
        proc_counts: Some(w.proc_counts),
    };
    rec.pid_namespace = target
        .namespace_ids()
        .map(|(inode, ids)| crate::recording::PidNamespaceIds { inode, ids });
    col.finish_into(&mut rec);
    Ok(rec)
}
