//! Reading what the sources kept once the window has ended, and assembling the recording.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use tracer_common::{Preemptor, ThreadStats};

use crate::{
    recording::{
        Capabilities, Capability, CgroupRecording, CudaTotals, EndReason, GpuCapability, HostMeta,
        MigrationRoute, PreemptorRecord, Recording, ThreadInfo,
        children::{ChildSnapshot, Forked, child_records},
        close::{ThreadInputs, assemble_threads},
        collect::Collector,
        comm_string,
        counters::CounterTotals,
        gpu::GpuRecording,
        wakers::WakerRecord,
    },
    sources::{
        cgroup::{cgroup2_of, cgroup2_paths},
        ebpf::{Reaped, SchedProbes},
        host,
        process::{Target, comm_of, process_stat},
        targets::Targets,
    },
};

/// How the window went, and what was gathered outside the kernel maps.
#[derive(Clone)]
pub struct Ended {
    /// Where the accounts are closed from: the run's start.
    pub start: u64,
    pub end: u64,
    pub end_reason: EndReason,
    pub target_exited_ns: Option<u64>,
    pub initial: BTreeMap<u32, ThreadInfo>,
    pub gpu: Option<GpuRecording>,
    pub gpu_capability: Capability,
    /// One per distinct cgroup of the members, the first member's first.
    pub cgroups: Vec<CgroupRecording>,
    pub host: HostMeta,
    pub proc_counts: crate::recording::ProcWindow,
    /// The target's descendants as /proc showed them at the start and at the end.
    pub children: (Vec<ChildSnapshot>, Vec<ChildSnapshot>),
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

/// The tasks that ran while the target's threads waited, each with its process's name, looked
/// up once per process: every thread of a process can be a preemptor (the target's, of their
/// siblings), and a lookup per thread, each making the kernel walk all the process's threads
/// (/proc/TGID/stat), took 26 s after a 3 s window at 20,000 threads (issue 13).
/// `cgroups`: the v2 cgroups' paths by id; `parent`: a process's parent from /proc, for the
/// preemptors whose parent the kernel side could not read (classic tracepoints).
fn preemptor_records(
    kernel: Vec<Preemptor>,
    threads: &[ThreadStats],
    mut process_name: impl FnMut(u32) -> Option<String>,
    cgroups: &BTreeMap<u64, String>,
    mut parent: impl FnMut(u32) -> Option<u32>,
) -> Vec<PreemptorRecord> {
    let mut names: HashMap<u32, Option<String>> = HashMap::new();
    let mut name_of = |tgid: u32| {
        names
            .entry(tgid)
            .or_insert_with(|| process_name(tgid))
            .clone()
    };
    let mut parents: HashMap<u32, Option<u32>> = HashMap::new();
    let mut out: Vec<PreemptorRecord> = kernel
        .into_iter()
        .map(|p| PreemptorRecord {
            pid: p.pid,
            tgid: p.tgid,
            comm: comm_string(&p.comm),
            process_comm: name_of(p.tgid),
            wait_ns: p.wait_ns,
            slices: p.slices,
            ppid: match p.ppid {
                0 if p.tgid != 0 => *parents.entry(p.tgid).or_insert_with(|| parent(p.tgid)),
                0 => None,
                ppid => Some(ppid),
            },
            cgroup: cgroups.get(&p.cgroup_id).cloned(),
            handoff_ns: 0,
        })
        .collect();
    // The target's own threads are charged in their thread entries (tracer-ebpf `on_switch`).
    out.extend(
        threads
            .iter()
            .filter(|t| t.caused_slices != 0)
            .map(|t| PreemptorRecord {
                pid: t.tid,
                tgid: t.tgid,
                comm: comm_string(&t.comm),
                process_comm: name_of(t.tgid),
                wait_ns: t.caused_wait_ns,
                slices: t.caused_slices,
                ..Default::default()
            }),
    );
    out
}

/// The processes the kernel side saw the target (or its descendants) fork.
fn forked(probes: &SchedProbes) -> Result<Vec<Forked>> {
    Ok(probes.children()?.iter().map(forked_of).collect())
}

fn forked_of((pid, c): &(u32, tracer_common::ChildProcess)) -> Forked {
    Forked {
        pid: *pid,
        parent: c.parent,
        comm: comm_string(&c.comm),
        created_ns: c.created_ns,
    }
}

/// The kernel's accounts as read at one instant: running totals since the run's start.
#[derive(Clone)]
pub struct Kernel {
    threads: Vec<ThreadStats>,
    counters: BTreeMap<u32, CounterTotals>,
    cuda: BTreeMap<u32, CudaTotals>,
    preemptors: Vec<Preemptor>,
    migrations: Vec<(tracer_common::MigrationKey, u64)>,
    wakers: Vec<WakerRecord>,
    losses: crate::recording::Losses,
    forked: Vec<Forked>,
}

impl Kernel {
    /// Reads the maps, with the threads reaped from them (`finished`). `cuda_at_end`: the CUDA
    /// accounts read before the uprobes came off, when they are detached by now.
    pub fn read(
        probes: &mut SchedProbes,
        finished: &Reaped,
        cuda_at_end: Option<Vec<(u32, tracer_common::CudaThread)>>,
    ) -> Result<Self> {
        let mut threads = probes.threads()?;
        threads.extend_from_slice(&finished.stats);
        let counters = probes
            .thread_counters()?
            .iter()
            .chain(finished.counters.iter())
            .map(|(tid, c)| (*tid, CounterTotals::from(c)))
            .collect();
        let cuda_now = match cuda_at_end {
            Some(c) => c,
            None => probes.cuda_threads()?,
        };
        let cuda = cuda_now
            .iter()
            .chain(finished.cuda.iter())
            .map(|(tid, c)| (*tid, CudaTotals::from(c)))
            .collect();
        let wakers = crate::recording::wakers::with_runs(probes.wakers()?, &threads);
        Ok(Self {
            counters,
            cuda,
            preemptors: probes.preemptors()?,
            migrations: probes.migrations()?,
            wakers,
            losses: probes.losses()?,
            forked: forked(probes)?,
            threads,
        })
    }
}

impl Kernel {
    /// The blocked time by waker and the migration routes of threads `tids`, as read (their
    /// last runs of waits joined).
    pub fn accounts_of(&self, tids: &std::collections::BTreeSet<u32>) -> Reaped {
        Reaped {
            wakers: (self.wakers.iter())
                .filter(|w| tids.contains(&w.tid))
                .cloned()
                .collect(),
            migrations: (self.migrations.iter())
                .filter(|(k, _)| tids.contains(&k.tid))
                .copied()
                .collect(),
            ..Default::default()
        }
    }

    /// The threads whose accounts are final: exited, and switched out for the last time.
    pub fn dead(&self) -> std::collections::BTreeSet<u32> {
        self.threads
            .iter()
            .filter(|t| t.state == tracer_common::ThreadState::Dead as u32)
            .map(|t| t.tid)
            .collect()
    }

    /// The processes the kernel side saw forked (or join).
    pub fn forked(&self) -> &[Forked] {
        &self.forked
    }

    /// The processes with a thread the reading shows alive.
    pub fn live_processes(&self) -> std::collections::BTreeSet<u32> {
        self.alive().map(|t| t.tgid).collect()
    }

    /// The threads the reading shows alive.
    pub fn live_threads(&self) -> std::collections::BTreeSet<u32> {
        self.alive().map(|t| t.tid).collect()
    }

    fn alive(&self) -> impl Iterator<Item = &ThreadStats> {
        (self.threads.iter()).filter(|t| t.state != tracer_common::ThreadState::Dead as u32)
    }

    /// With the accounts of threads and processes the windows' cuts took out (`Windows`): the
    /// whole run's.
    pub fn with_reaped(mut self, r: Reaped) -> Self {
        self.forked.extend(r.children.iter().map(forked_of));
        self.threads.extend(r.stats);
        self.counters.extend(
            r.counters
                .iter()
                .map(|(tid, c)| (*tid, CounterTotals::from(c))),
        );
        self.cuda
            .extend(r.cuda.iter().map(|(tid, c)| (*tid, CudaTotals::from(c))));
        // Accounts taken out of the maps: a key made again since adds to what it had.
        merge_by(
            &mut self.preemptors,
            r.preemptors,
            |p| p.pid,
            |a, b| {
                a.wait_ns += b.wait_ns;
                a.slices += b.slices;
            },
        );
        merge_by(
            &mut self.migrations,
            r.migrations,
            |m| m.0,
            |a, b| a.1 += b.1,
        );
        merge_by(
            &mut self.wakers,
            r.wakers,
            WakerRecord::key,
            WakerRecord::merge,
        );
        self
    }
}

/// Adds each of `more` to the entry of `into` with the same key, else appends it.
fn merge_by<T, K: std::hash::Hash + Eq>(
    into: &mut Vec<T>,
    more: Vec<T>,
    key: impl Fn(&T) -> K,
    add: impl Fn(&mut T, &T),
) {
    let mut at: HashMap<K, usize> = into.iter().enumerate().map(|(i, t)| (key(t), i)).collect();
    for t in more {
        match at.get(&key(&t)) {
            Some(&i) => add(&mut into[i], &t),
            None => {
                at.insert(key(&t), into.len());
                into.push(t);
            }
        }
    }
}

/// The tasks that ran while the target waited, each named by its process (from /proc, read
/// now), its cgroup and its parent.
fn named_preemptors(
    target: &Target,
    kernel: Vec<Preemptor>,
    threads: &[ThreadStats],
) -> Vec<PreemptorRecord> {
    let ids = kernel
        .iter()
        .map(|p| p.cgroup_id)
        .filter(|&i| i != 0)
        .collect();
    preemptor_records(
        kernel,
        threads,
        |tgid| target.proc_pid_of(tgid).and_then(comm_of),
        &cgroup2_paths(&ids),
        |tgid| {
            let ppid = process_stat(target.proc_pid_of(tgid)?)?.0;
            target.host_tid(ppid)
        },
    )
}

/// What the recording could measure: the probes' (PMU, BTF, CUDA), tracefs, the GPU's.
fn capabilities(
    probes: &SchedProbes,
    gpu: Capability,
    polled: Option<&GpuRecording>,
) -> Capabilities {
    Capabilities {
        pmu: probes.pmu.clone(),
        btf: probes.btf_capability.clone(),
        tracefs: host::tracefs(),
        gpu: GpuCapability::from_parts(gpu, gpm_capability(polled), probes.cuda.clone()),
    }
}

/// Joins the kernel's accounts and everything else into the recording.
pub fn recording(
    targets: &Targets,
    probes: &SchedProbes,
    k: Kernel,
    mut col: Collector,
    w: Ended,
) -> Result<Recording> {
    let target = targets.primary();
    let Kernel {
        threads: kernel,
        counters,
        cuda,
        preemptors: kernel_preemptors,
        migrations,
        wakers,
        losses,
        forked,
    } = k;
    let preemptors = named_preemptors(target, kernel_preemptors, &kernel);
    let migration_routes = migrations
        .into_iter()
        .map(|(k, count)| MigrationRoute {
            tid: k.tid,
            from_cpu: k.from_cpu,
            to_cpu: k.to_cpu,
            count,
        })
        .collect();
    let final_names = final_names(targets, &kernel);
    let inputs = ThreadInputs {
        kernel,
        initial: w.initial,
        final_names,
        samples: col.take_samples(),
        counters,
        cuda,
        waits: col.take_waits(),
        // A window cut while the programs run (`tracer watch`): the counts read just after its
        // end have moved on with switches the next window has, which `close_thread` would take
        // for switches no tracepoint reported. The last window, closed after detaching, uses
        // them, so the run's total is repaired there.
        end_counts: match w.end_reason {
            EndReason::Window => BTreeMap::new(),
            _ => w.proc_counts.end.clone(),
        },
    };
    let threads = assemble_threads(inputs, w.start, w.end);
    let mut cgroups = w.cgroups.into_iter();
    let mut rec = Recording {
        tracer_version: crate::VERSION.into(),
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
        capabilities: capabilities(probes, w.gpu_capability, w.gpu.as_ref()),
        counter_mask: probes.counter_mask,
        counter_bins: Default::default(),
        gpu: w.gpu,
        cuda_syncs: vec![],
        cuda_launch_bins: Default::default(),
        requests: None,
        cgroup: cgroups.next(),
        other_cgroups: cgroups.collect(),
        host: w.host,
        incomplete: None,
        timeline_missing_before_ns: None,
        tracer_cost: None,
        output_error: None,
        timeline: Default::default(),
        pid_namespace: None,
        proc_counts: Some(w.proc_counts),
        processes: targets.records(if targets.follow { &forked } else { &[] }),
        // Followed, the processes the members forked are members themselves.
        children: child_records(
            &w.children.0,
            &w.children.1,
            if targets.follow { &[] } else { &forked },
        ),
        target_cgroup: cgroup2_of(target.proc_pid),
        wakers,
        runtime_pauses: vec![],
        pause_probes: probes.pause_probes.clone(),
    };
    rec.pid_namespace = target
        .namespace_ids()
        .map(|(inode, ids)| crate::recording::PidNamespaceIds { inode, ids });
    col.finish_into(&mut rec);
    Ok(rec)
}

/// The names the threads have now: the members' as /proc lists them, and those of threads of
/// processes that joined during the window, read one by one (a process names itself after
/// its fork: a process title, prctl).
fn final_names(
    targets: &Targets,
    kernel: &[ThreadStats],
) -> BTreeMap<u32, crate::recording::ThreadInfo> {
    let mut names = targets.threads();
    let primary = targets.primary();
    let unnamed: Vec<&ThreadStats> = kernel
        .iter()
        .filter(|s| !names.contains_key(&s.tid))
        .collect();
    for s in unnamed {
        let (Some(pid), Some(tid)) = (primary.proc_pid_of(s.tgid), primary.proc_pid_of(s.tid))
        else {
            continue;
        };
        if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) {
            names.insert(
                s.tid,
                crate::recording::ThreadInfo {
                    tid: s.tid,
                    pid: s.tgid,
                    comm: comm.trim_end_matches('\n').to_string(),
                    state: '?',
                },
            );
        }
    }
    names
}

/// What the recording says of its target.
pub fn target_meta(target: &Target) -> crate::recording::TargetMeta {
    crate::recording::TargetMeta {
        pid: target.pid,
        comm: target.comm.clone(),
        cmdline: target.cmdline.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preemptor(pid: u32, tgid: u32) -> Preemptor {
        Preemptor {
            pid,
            tgid,
            comm: *b"other\0\0\0\0\0\0\0\0\0\0\0",
            wait_ns: 10,
            slices: 1,
            // Classic tracepoints: the parent unknown to the kernel side; cgroup 9.
            ppid: 0,
            _pad: 0,
            cgroup_id: 9,
        }
    }

    #[test]
    fn each_process_name_is_looked_up_once() {
        // Two threads of process 50 and one of process 60 ran while the target waited, and
        // 1,000 of the target's (process 7) threads each preempted a sibling.
        let kernel = vec![preemptor(50, 50), preemptor(51, 50), preemptor(60, 60)];
        let threads: Vec<ThreadStats> = (1000..2000)
            .map(|tid| {
                let mut t = ThreadStats::new(tid, 7);
                t.caused_slices = 1;
                t.caused_wait_ns = 5;
                t
            })
            .chain([ThreadStats::new(2000, 7)])
            .collect();
        let mut lookups: Vec<u32> = Vec::new();
        let cgroups = BTreeMap::from([(9, "/other.slice".to_string())]);
        let mut parents = 0;
        let records = preemptor_records(
            kernel,
            &threads,
            |tgid| {
                lookups.push(tgid);
                (tgid != 60).then(|| format!("proc{tgid}"))
            },
            &cgroups,
            |_| {
                parents += 1;
                Some(1)
            },
        );
        assert_eq!(
            parents, 2,
            "a parent looked up once per process, where the kernel had none"
        );
        assert_eq!(lookups.len(), 3, "one lookup per process, not per thread");
        lookups.sort();
        assert_eq!(lookups, [7, 50, 60]);
        assert_eq!(records.len(), 3 + 1000);
        let named = |pid: u32| {
            let r = records.iter().find(|r| r.pid == pid).unwrap();
            r.process_comm.clone()
        };
        assert_eq!(named(51), Some("proc50".into()));
        assert_eq!(named(60), None, "a process gone by the end has no name");
        assert_eq!(named(1999), Some("proc7".into()));
        assert!(
            records.iter().all(|r| r.pid != 2000),
            "it preempted no sibling"
        );
    }

    /// The whole run gets back what the windows' cuts took out of the maps, added to what a
    /// key made again since holds.
    #[test]
    fn accounts_taken_out_add_to_the_whole_run() {
        let waker = crate::recording::testutil::waker;
        let route = |tid, to_cpu| tracer_common::MigrationKey {
            tid,
            from_cpu: 0,
            to_cpu,
            _pad: 0,
        };
        let kernel = Kernel {
            threads: vec![],
            counters: BTreeMap::new(),
            cuda: BTreeMap::new(),
            preemptors: vec![preemptor(40, 40)],
            migrations: vec![(route(7, 1), 2)],
            wakers: vec![waker(7, 100)],
            losses: Default::default(),
            forked: vec![],
        };
        let taken = Reaped {
            preemptors: vec![preemptor(40, 40), preemptor(41, 41)],
            migrations: vec![(route(7, 1), 3), (route(8, 1), 1)],
            wakers: vec![waker(7, 50), waker(8, 5)],
            ..Default::default()
        };
        let whole = kernel.with_reaped(taken);
        let waits: Vec<(u32, u64, u64)> = (whole.preemptors.iter())
            .map(|p| (p.pid, p.wait_ns, p.slices))
            .collect();
        assert_eq!(waits, [(40, 20, 2), (41, 10, 1)]);
        let moves: Vec<(u32, u64)> = whole.migrations.iter().map(|(k, n)| (k.tid, *n)).collect();
        assert_eq!(moves, [(7, 5), (8, 1)]);
        let blocked: Vec<(u32, u64, u64)> = (whole.wakers.iter())
            .map(|w| (w.tid, w.blocked_ns, w.count))
            .collect();
        assert_eq!(blocked, [(7, 150, 2), (8, 5, 1)]);
        // The record's key is the map's it came from.
        let k = whole.wakers[0].kernel_key();
        assert_eq!((k.tid, k.waker_tid, k.syscall, k.timer), (7, 9, 203, 0));
    }
}
