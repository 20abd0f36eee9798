//! The scheduler probes: loads the eBPF object embedded in this binary, configures it for one
//! target process, attaches it (tp_btf, or classic tracepoints where the kernel has no BTF),
//! and reads back what it recorded.

pub mod btf;
pub mod cuda;
mod debug_log;
mod elf;
pub mod floor;
mod irq;
pub mod layout;
mod load;
mod read;
pub mod requests;
mod send;
mod slots;
mod targets;
pub mod tracefs;
pub mod usdt;

use std::collections::HashMap as StdHashMap;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, RingBuf},
    programs::{BtfTracePoint, TracePoint, tp_btf::BtfTracePointLink, trace_point::TracePointLink},
};
use tokio::io::unix::AsyncFd;
use tracer_common::{CudaThread, ThreadCounters, ThreadStats};

use crate::recording::{
    ProbeMode,
    records::{Record, split},
};
use load::load_error_of;

/// The eBPF object built by build.rs from `tracer-ebpf`.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-probes"));

/// Which family of tracepoints to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeChoice {
    /// tp_btf where the kernel has BTF, classic tracepoints otherwise.
    Auto,
    Btf,
    Classic,
}

/// Probes in attach order, detached in reverse. sched_switch goes first: a thread's first
/// traced event then tells the state it was in (a switch-in: it was waiting; a switch-out: it
/// was running), whereas a wakeup seen before switches are traced would leave the switch that
/// follows unseen.
const BTF_PROGRAMS: [(&str, &str); 8] = [
    ("sched_switch_btf", "sched_switch"),
    ("sched_migrate_task_btf", "sched_migrate_task"),
    ("sched_wakeup_btf", "sched_wakeup"),
    ("sched_wakeup_new_btf", "sched_wakeup_new"),
    ("sched_waking_btf", "sched_waking"),
    ("sched_process_fork_btf", "sched_process_fork"),
    ("sched_process_exec_btf", "sched_process_exec"),
    ("sched_process_exit_btf", "sched_process_exit"),
];
/// A process moved into a followed cgroup joins the set (`--cgroup`; attached only then).
const CGROUP_PROGRAM: (&str, &str) = ("cgroup_attach_btf", "cgroup_attach_task");
/// Classic order: thread creation first, so that the TID filter seeded next misses no thread,
/// then as for tp_btf.
const CLASSIC_PROGRAMS: [(&str, &str, &str); 8] = [
    ("task_newtask_tp", "task", "task_newtask"),
    ("sched_process_exit_tp", "sched", "sched_process_exit"),
    ("sched_process_exec_tp", "sched", "sched_process_exec"),
    ("sched_switch_tp", "sched", "sched_switch"),
    ("sched_migrate_task_tp", "sched", "sched_migrate_task"),
    ("sched_wakeup_tp", "sched", "sched_wakeup"),
    ("sched_wakeup_new_tp", "sched", "sched_wakeup_new"),
    ("sched_waking_tp", "sched", "sched_waking"),
];

/// The tp_btf `sched_switch` programs, the first where the tracepoint passes `prev_state`
/// (Linux 5.18+), the second for older kernels, whose verifier rejects a fourth argument.
const SWITCH_PROGRAMS: [&str; 2] = ["sched_switch_btf", "sched_switch_btf_3args"];

enum Link {
    // Held only to keep the attachment alive; dropping it detaches.
    Btf(#[allow(dead_code)] BtfTracePointLink),
    Classic(#[allow(dead_code)] TracePointLink),
    Raw(#[allow(dead_code)] aya::programs::raw_trace_point::RawTracePointLink),
}

/// Dead threads moved out of the kernel maps: their totals, counters and CUDA accounting.
#[derive(Default)]
pub struct Reaped {
    pub stats: Vec<ThreadStats>,
    pub counters: Vec<(u32, ThreadCounters)>,
    pub cuda: Vec<(u32, CudaThread)>,
    /// Processes forked (or joined) that have exited, taken out of `CHILDREN`.
    pub children: Vec<(u32, tracer_common::ChildProcess)>,
    /// Accounts a watch took out of `PREEMPTORS`, `MIGRATIONS` and `WAKERS` (each whole, as
    /// last reported), for its whole run's trace file.
    pub preemptors: Vec<tracer_common::Preemptor>,
    pub migrations: Vec<(tracer_common::MigrationKey, u64)>,
    pub wakers: Vec<crate::recording::wakers::WakerRecord>,
}

impl Reaped {
    pub fn extend(&mut self, other: Reaped) {
        self.stats.extend(other.stats);
        self.counters.extend(other.counters);
        self.cuda.extend(other.cuda);
        self.children.extend(other.children);
        self.preemptors.extend(other.preemptors);
        self.migrations.extend(other.migrations);
        self.wakers.extend(other.wakers);
    }
}

/// Options for loading the probes.
pub struct ProbeOptions {
    pub choice: ProbeChoice,
    /// Ring buffer size in bytes (a power of two, at least a page).
    pub ring_bytes: u32,
    /// Override of the BTF file (tests simulate a kernel without BTF with a missing path).
    pub btf_path: Option<std::path::PathBuf>,
    /// Request marker functions to probe, if any.
    pub markers: Option<requests::RequestMarkers>,
    /// Direct-mapped thread slots in the kernel (a power of two; tests make it 1 to send
    /// every thread but one to the hash map).
    pub thread_slots: u32,
    /// `--debug-bpf`: the programs log what should not happen (`debug_log`).
    pub debug_bpf: bool,
}

pub struct SchedProbes {
    ebpf: Ebpf,
    mode: ProbeMode,
    links: Vec<Link>,
    events: AsyncFd<RingBuf<MapData>>,
    /// What `capabilities.btf` says: from the load, so the BTF is not parsed again.
    pub btf_capability: crate::recording::Capability,
    /// Why tp_btf was not used, when it was not.
    pub fallback_reason: Option<String>,
    /// The PMU capability and the counter slots the programs read.
    pub pmu: crate::recording::PmuCapability,
    pub counter_mask: u32,
    /// CUDA uprobes, and whether they could be attached.
    cuda_probes: cuda::CudaProbes,
    pub cuda: crate::recording::Capability,
    /// Request marker uprobes.
    marker_links: Vec<aya::programs::uprobe::UProbeLink>,
    /// CPython's GC probes, per interpreter file, with the semaphores raised for them.
    gc_probes: Vec<usdt::GcProbes>,
    gc_files: Vec<std::path::PathBuf>,
    /// For each CPython member, whether its collections are traced.
    pub pause_probes: Vec<crate::recording::pauses::PauseProbe>,
    slots: slots::ThreadSlots,
    /// `--debug-bpf`: the programs' log, printed as it is drained.
    debug_log: Option<debug_log::Logger>,
    /// Calls of `reap_dead` so far.
    reaps: u64,
    /// Threads the drained records said ended that no scan has found dead yet: the slots are
    /// scanned only while there are some.
    ended_unreaped: u64,
    /// `Counter::RingbufDropped` at the last scan.
    dropped_at_reap: u64,
    /// `--cgroup`: the cgroup-attach program is attached with the others (tp_btf, where the
    /// kernel's BTF gave the cgroup offsets).
    follow_cgroups: bool,
    cgroup_offsets: bool,
    /// The tp_btf `sched_switch` program the kernel took (`SWITCH_PROGRAMS`).
    switch_program: &'static str,
    /// A watch's sender of idle CPUs' batches (send.rs), or why there is none: then every CPU
    /// keeps its batch when idle for the end to take (not a watch), or sends it (a watch
    /// whose sender could not start or stopped working).
    idle_sender: Result<send::IdleSender, String>,
}

/// Why there is no idle sender where no watch asked for one.
const NOT_A_WATCH: &str = "not a watch: idle CPUs' records are taken at the end";

impl SchedProbes {
    pub fn mode(&self) -> ProbeMode {
        self.mode
    }

    /// Puts each family of uprobe programs (CUDA calls, request markers, GC probes) through
    /// the verifier, attaching nothing: what `doctor` checks, since a kernel can take the
    /// scheduler programs and still refuse these.
    pub fn load_uprobe_families(&mut self) -> Vec<(&'static str, Result<()>)> {
        let cuda: Vec<String> = cuda::program_names();
        let families: [(&'static str, Vec<&str>); 3] = [
            ("CUDA calls", cuda.iter().map(String::as_str).collect()),
            ("request markers", vec!["request_start", "request_end"]),
            ("GC probes", vec!["gc_start", "gc_done"]),
        ];
        let ebpf = &mut self.ebpf;
        families
            .into_iter()
            .map(|(family, names)| {
                let loaded = names.into_iter().try_for_each(|name| {
                    let prog: &mut aya::programs::UProbe = ebpf
                        .program_mut(name)
                        .with_context(|| format!("program {name}"))?
                        .try_into()?;
                    prog.load()
                        .map_err(|e| load_error_of(&format!("{name}: "), &e).into())
                });
                (family, loaded)
            })
            .collect()
    }

    /// Attaches every probe. `threads` lists the target's threads now (the classic programs
    /// need them; tp_btf filters on the TGID alone).
    pub fn attach(&mut self, threads: impl Fn() -> Vec<(u32, u32)>) -> Result<()> {
        // The interrupt marks first: the wakeups the scheduler programs see from then on are
        // told apart from the start.
        let marks = irq::attach(&mut self.ebpf)?;
        self.links.extend(marks.into_iter().map(Link::Raw));
        match self.mode {
            ProbeMode::TpBtf => {
                for (name, _) in BTF_PROGRAMS {
                    let name = if name == SWITCH_PROGRAMS[0] {
                        self.switch_program
                    } else {
                        name
                    };
                    let prog: &mut BtfTracePoint = self
                        .ebpf
                        .program_mut(name)
                        .with_context(|| format!("program {name}"))?
                        .try_into()?;
                    let id = prog.attach().with_context(|| format!("attaching {name}"))?;
                    self.links.push(Link::Btf(prog.take_link(id)?));
                }
                if self.follow_cgroups && self.cgroup_offsets {
                    let prog: &mut BtfTracePoint = self
                        .ebpf
                        .program_mut(CGROUP_PROGRAM.0)
                        .context("program cgroup_attach_btf")?
                        .try_into()?;
                    let id = prog.attach().context("attaching cgroup_attach_task")?;
                    self.links.push(Link::Btf(prog.take_link(id)?));
                }
            }
            ProbeMode::Classic => {
                for (i, (name, category, tracepoint)) in CLASSIC_PROGRAMS.into_iter().enumerate() {
                    if i == 3 {
                        // Thread creation is now watched: the TIDs listed from here on are
                        // complete, so seed the TID filter before anything else attaches.
                        let mut tids: HashMap<_, u32, u32> = HashMap::try_from(
                            self.ebpf
                                .map_mut("TARGET_TIDS")
                                .context("TARGET_TIDS map")?,
                        )?;
                        // Each thread with its process: the classic records name only threads.
                        for (tid, tgid) in threads() {
                            tids.insert(tid, tgid, 0)?;
                        }
                    }
                    let prog: &mut TracePoint = self
                        .ebpf
                        .program_mut(name)
                        .with_context(|| format!("program {name}"))?
                        .try_into()?;
                    let id = prog
                        .attach(category, tracepoint)
                        .with_context(|| format!("attaching {category}/{tracepoint}"))?;
                    self.links.push(Link::Classic(prog.take_link(id)?));
                }
            }
        }
        Ok(())
    }

    /// Attaches the CUDA uprobes to the libcuda files the members (`pids`) have mapped, or the
    /// host's. Having none is not an error: `cuda` says why GPU waits are not measured.
    pub fn attach_cuda(&mut self, pids: &[u32]) -> Result<()> {
        self.cuda_probes = cuda::attach(&mut self.ebpf, pids)?;
        self.cuda = self.cuda_probes.capability();
        Ok(())
    }

    /// Probes the CUDA libraries members (`pids`, this tool's numbering) have mapped since:
    /// a member that initialized CUDA in the window. Returns what was added, in words.
    pub fn poll_cuda(&mut self, pids: &[u32]) -> Result<Vec<String>> {
        let added = self.cuda_probes.add_mapped(&mut self.ebpf, pids)?;
        if !added.is_empty() {
            self.cuda = self.cuda_probes.capability();
        }
        Ok(added)
    }

    /// Attaches the request-marker uprobe to the two functions of `markers`.
    pub fn attach_markers(
        &mut self,
        pids: &[u32],
        markers: &requests::RequestMarkers,
    ) -> Result<()> {
        self.marker_links = requests::attach(&mut self.ebpf, pids, markers)?;
        Ok(())
    }

    /// Attaches the GC probes of each CPython member (`(its /proc PID, its PID)`): the uprobes
    /// once per interpreter file, the semaphores in every process. A member whose interpreter
    /// has no USDT notes, or whose probes cannot be attached, is noted with why.
    pub fn attach_gc(&mut self, members: &[(u32, u32)]) {
        for &(proc_pid, pid) in members {
            let Some(py) = crate::sources::python::detect(proc_pid) else {
                continue;
            };
            let path = crate::sources::python::host_path(proc_pid, &py);
            let canon = std::fs::canonicalize(&path).unwrap_or(path.clone());
            let attached = if let Some(i) = self.gc_files.iter().position(|f| *f == canon) {
                self.gc_probes[i].raise_in(proc_pid, &py.path, &path)
            } else {
                usdt::attach_gc(&mut self.ebpf, proc_pid, &py.path, &path).map(|g| {
                    self.gc_files.push(canon.clone());
                    self.gc_probes.push(g);
                })
            };
            let attached = attached.and_then(|()| {
                let file = self.gc_files.iter().position(|f| *f == canon);
                let args = file.map_or([0; 2], |i| self.gc_probes[i].args);
                usdt::set_gc_args(&mut self.ebpf, pid, args, self.gc_files.len() == 1)
            });
            self.pause_probes
                .push(crate::recording::pauses::PauseProbe {
                    pid,
                    attached: attached.is_ok(),
                    reason: attached.err().map(|e| format!("{e:#}")),
                });
        }
    }

    /// A watch's: starts the thread that sends idle CPUs' records each window (send.rs). Where
    /// it cannot, every CPU sends its own as it goes idle, as before, and `idle_sending` says
    /// why.
    pub fn start_idle_sender(&mut self) {
        let started = send::load(&mut self.ebpf).and_then(|fd| {
            let cpus = possible_cpus()?;
            send::IdleSender::start(&mut self.ebpf, fd, cpus)
        });
        self.idle_sender = started.map_err(|e| format!("{e:#}"));
        if let Err(why) = &self.idle_sender {
            let all: Vec<u32> = (0..possible_cpus().unwrap_or(0)).collect();
            if let Err(e) = send::set_left(&mut self.ebpf, &all, 0) {
                eprintln!("tracer: {e:#}: idle CPUs' records may come late ({why})");
            }
        }
    }

    /// Has the CPUs that hold records and went idle send them (when a window's records are
    /// taken: they may be its records). Without the idle sender they sent them as they went
    /// idle. If it can no longer (its thread was moved off its CPU, or the kernel refused a
    /// run), every CPU sends its own again from here, and it says so.
    pub fn send_idle_batches(&mut self) {
        let Ok(s) = &self.idle_sender else { return };
        let holding = match self.cpus_holding_records() {
            Ok(cpus) => cpus,
            // Unreadable (it never has been): every CPU left to the thread.
            Err(_) => s.left.clone(),
        };
        let Err(why) = s.send(holding) else { return };
        let left = s.left.clone();
        eprintln!(
            "tracer: idle CPUs' records can no longer be sent for them ({why}); each CPU sends \
             its own from now on"
        );
        if let Err(e) = send::set_left(&mut self.ebpf, &left, 0) {
            eprintln!("tracer: {e:#}: idle CPUs' records may come late (`late_records`)");
        }
        self.idle_sender = Err(why);
    }

    /// Stops the idle sender (at the end: nothing may be sent once the last records are
    /// taken).
    pub fn stop_idle_sender(&mut self) {
        if let Ok(s) = &self.idle_sender {
            s.stop();
        }
        self.idle_sender = Err("stopped".into());
    }

    /// How the records of CPUs gone idle reach a watch's windows, in words (`tracer doctor`,
    /// which checks whether the kernel can run `send_batch` on a given CPU).
    pub fn idle_sending(&mut self) -> String {
        if let Ok(s) = &self.idle_sender {
            return format!(
                "a watch's idle CPUs' records sent when each window's are taken, by a thread on \
                 CPU {} (only CPUs holding records are interrupted)",
                s.cpu
            );
        }
        match send::load(&mut self.ebpf) {
            Ok(_) => "a watch's idle CPUs' records sent when each window's are taken, by a \
                      thread pinned to one CPU (only CPUs holding records are interrupted)"
                .into(),
            Err(e) => format!("in a watch each CPU sends its records as it goes idle ({e:#})"),
        }
    }

    /// Detaches the scheduler probes, context switch first. The maps stay readable.
    pub fn detach_sched(&mut self) {
        while let Some(link) = self.links.pop() {
            drop(link);
        }
    }

    /// Detaches the CUDA and request-marker uprobes. Each uprobe removal waits for an SRCU
    /// grace period (about 100 ms measured on the GPU machine, seconds for two dozen one after
    /// the other), so they are removed in parallel.
    pub fn detach_uprobes(&mut self) {
        let mut links = std::mem::take(&mut self.cuda_probes.links);
        links.append(&mut self.marker_links);
        let mut semaphores = Vec::new();
        for g in &mut self.gc_probes {
            links.append(&mut g.links);
            semaphores.append(&mut g.semaphores);
        }
        std::thread::scope(|s| {
            for link in links {
                s.spawn(move || drop(link));
            }
        });
        // Lowered once nothing probes them.
        drop(semaphores);
    }

    /// Detaches everything.
    pub fn detach(&mut self) {
        self.detach_sched();
        self.detach_uprobes();
        if let Some(log) = self.debug_log.as_mut() {
            log.flush();
        }
    }

    /// The ring buffer, for waiting on readiness.
    pub fn events(&mut self) -> &mut AsyncFd<RingBuf<MapData>> {
        &mut self.events
    }

    /// Takes every record now in the ring buffer.
    /// Hands at most `DRAIN_MAX` records to `f`; returns how many it took. Bounded: when the
    /// target produces events as fast as they are read, an unbounded drain never returns, and
    /// the recording would never see its deadline or a signal.
    pub fn drain(&mut self, mut f: impl FnMut(Record)) -> usize {
        const DRAIN_MAX: usize = 1 << 16;
        if let Some(log) = self.debug_log.as_mut() {
            log.flush();
        }
        let ring = self.events.get_mut();
        let mut n = 0;
        while n < DRAIN_MAX
            && let Some(item) = ring.next()
        {
            // One ring record carries all the records of one program run (tracer-ebpf `Batch`).
            for rec in split(&item) {
                if let Record::Event(e) = &rec {
                    self.ended_unreaped += u64::from(ends_a_thread(e));
                }
                f(rec);
                n += 1;
            }
        }
        n
    }

    /// BPF program IDs by name, for run statistics.
    pub fn program_ids(&self) -> StdHashMap<String, u32> {
        self.ebpf
            .programs()
            .filter_map(|(name, p)| Some((name.to_string(), p.info().ok()?.id())))
            .collect()
    }
}

/// Whether the record says a traced thread ended, its entry to be marked dead at its last
/// switch-out. An exec by another thread than the main one ends the exec'ing thread's entry,
/// not the main thread's, which it takes over (`on_exec`), but the main thread's exit was
/// recorded first: that exit stands for it, and the `Exec` record counts nothing.
fn ends_a_thread(e: &tracer_common::Event) -> bool {
    matches!(e.event_kind(), Ok(tracer_common::EventKind::ThreadExit))
}

impl Drop for SchedProbes {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Number of possible CPUs: CPU numbers index per-CPU maps.
pub(crate) fn possible_cpus() -> Result<u32> {
    Ok(aya::util::nr_cpus()
        .map_err(|(what, e)| anyhow!("{what}: {e}"))?
        .max(1) as u32)
}
