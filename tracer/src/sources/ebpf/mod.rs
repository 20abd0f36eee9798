//! The scheduler probes: loads the eBPF object embedded in this binary, configures it for one
//! target process, attaches it (tp_btf, or classic tracepoints where the kernel has no BTF),
//! and reads back what it recorded.

pub mod btf;
pub mod cuda;
mod debug_log;
mod elf;
pub mod floor;
pub mod layout;
mod read;
pub mod requests;
mod send;
mod slots;
pub mod usdt;

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap, Map, MapData, RingBuf},
    programs::{BtfTracePoint, TracePoint, tp_btf::BtfTracePointLink, trace_point::TracePointLink},
};
use tokio::io::unix::AsyncFd;
use tracer_common::{Config, CudaThread, ThreadCounters, ThreadStats};

use crate::{
    error::TracerError,
    recording::{
        ProbeMode,
        records::{Record, split},
    },
    sources::perf::PerfSet,
};

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

enum Link {
    // Held only to keep the attachment alive; dropping it detaches.
    Btf(#[allow(dead_code)] BtfTracePointLink),
    Classic(#[allow(dead_code)] TracePointLink),
}

/// Dead threads moved out of the kernel maps: their totals, counters and CUDA accounting.
#[derive(Default)]
pub struct Reaped {
    pub stats: Vec<ThreadStats>,
    pub counters: Vec<(u32, ThreadCounters)>,
    pub cuda: Vec<(u32, CudaThread)>,
    /// Processes forked (or joined) that have exited, taken out of `CHILDREN`.
    pub children: Vec<(u32, tracer_common::ChildProcess)>,
}

impl Reaped {
    pub fn extend(&mut self, other: Reaped) {
        self.stats.extend(other.stats);
        self.counters.extend(other.counters);
        self.cuda.extend(other.cuda);
        self.children.extend(other.children);
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

fn load_error(e: impl std::fmt::Display) -> TracerError {
    TracerError::Load {
        detail: e.to_string(),
    }
}

/// A load error with the causes aya keeps beneath it: "failed to create map `THREADS`" holds
/// the kernel's errno only in its source, and ENOMEM there is a memory limit, not a bug.
fn load_error_of(what: &str, e: &(dyn std::error::Error + 'static)) -> TracerError {
    let mut detail = format!("{what}{e}");
    let mut enomem = false;
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !detail.contains(&text) {
            detail = format!("{detail}: {text}");
        }
        enomem |= c
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::ENOMEM));
        cause = c.source();
    }
    if enomem {
        detail.push_str(
            ". The kernel could not allocate the maps' memory: BPF maps are charged to the \
             tracer's memory cgroup (since Linux 5.11), so a memory.max (or v1 \
             memory.limit_in_bytes) on it or its parents, or the machine's own memory, is too \
             small: run it outside that cgroup or with a higher limit",
        );
    }
    load_error(detail)
}

/// Sets (`on`) or clears the bits of `tgids` in the kernel side's target set (`TARGETS`, a bit
/// per TGID), before anything is attached: from then on every program treats their threads as
/// the target's (or not).
fn mark_targets(ebpf: &mut aya::Ebpf, tgids: &[u32], on: bool) -> Result<()> {
    let mut set: aya::maps::Array<_, u64> =
        aya::maps::Array::try_from(ebpf.map_mut("TARGETS").context("TARGETS map")?)?;
    for &tgid in tgids {
        anyhow::ensure!(
            tgid < tracer_common::PID_LIMIT,
            "PID {tgid} is beyond the kernel's PID limit"
        );
        let word = set.get(&(tgid >> 6), 0).context("reading the target set")?;
        let bit = 1u64 << (tgid & 63);
        let word = if on { word | bit } else { word & !bit };
        set.set(tgid >> 6, word, 0)
            .context("writing the target set")?;
    }
    Ok(())
}

impl SchedProbes {
    /// Follows the cgroups `ids` (id, hierarchy id): a process moved into one during the window
    /// joins the set, from the kernel side where it can (tp_btf with the cgroup offsets; says
    /// whether it can), else only as `join` adds it.
    pub fn follow_cgroups(&mut self, ids: &[(u64, u32)]) -> Result<bool> {
        self.add_cgroups(ids)?;
        self.follow_cgroups = true;
        Ok(self.mode == ProbeMode::TpBtf && self.cgroup_offsets)
    }

    /// Adds cgroups to those followed (a descendant created during the window).
    pub fn add_cgroups(&mut self, ids: &[(u64, u32)]) -> Result<()> {
        let mut map: HashMap<_, u64, u32> = HashMap::try_from(
            self.ebpf
                .map_mut("TARGET_CGROUPS")
                .context("TARGET_CGROUPS map")?,
        )?;
        for &(id, hierarchy) in ids {
            map.insert(id, hierarchy, 0).with_context(|| {
                format!(
                    "following cgroup {id}: more than {} cgroups",
                    tracer_common::MAX_TARGET_CGROUPS
                )
            })?;
        }
        Ok(())
    }

    /// Stops following cgroups that were removed (their ids are never used again; the map
    /// keeps room for those made since).
    pub fn remove_cgroups(&mut self, ids: &[u64]) -> Result<()> {
        let mut map: HashMap<_, u64, u32> = HashMap::try_from(
            self.ebpf
                .map_mut("TARGET_CGROUPS")
                .context("TARGET_CGROUPS map")?,
        )?;
        for id in ids {
            // Absent already is as good.
            let _ = map.remove(id);
        }
        Ok(())
    }

    /// Adds a process found in a followed cgroup to the set, noted as joined now (the kernel
    /// side notes those it sees move in the same way); `tids`: its threads, which the classic
    /// programs know it by. False: it was a member already.
    pub fn join(&mut self, pid: u32, comm: &str, threads: &[u32]) -> Result<bool> {
        let set: aya::maps::Array<_, u64> =
            aya::maps::Array::try_from(self.ebpf.map("TARGETS").context("TARGETS map")?)?;
        if pid >= tracer_common::PID_LIMIT
            || set.get(&(pid >> 6), 0).context("reading the target set")? & (1 << (pid & 63)) != 0
        {
            return Ok(false);
        }
        mark_targets(&mut self.ebpf, &[pid], true)?;
        if self.mode == ProbeMode::Classic {
            // The classic programs know a switching task by its TID.
            let mut tids: HashMap<_, u32, u32> = HashMap::try_from(
                self.ebpf
                    .map_mut("TARGET_TIDS")
                    .context("TARGET_TIDS map")?,
            )?;
            for &tid in threads {
                let _ = tids.insert(tid, pid, 0);
            }
        }
        let mut c = tracer_common::ChildProcess {
            parent: 0,
            _pad: 0,
            created_ns: crate::sources::clock::monotonic_ns(),
            comm: [0; tracer_common::COMM_LEN],
        };
        for (d, b) in c
            .comm
            .iter_mut()
            .zip(comm.bytes().take(tracer_common::COMM_LEN - 1))
        {
            *d = b;
        }
        let mut children: HashMap<_, u32, tracer_common::ChildProcess> =
            HashMap::try_from(self.ebpf.map_mut("CHILDREN").context("CHILDREN map")?)?;
        children.insert(pid, c, 0)?;
        Ok(true)
    }

    /// Takes processes out of the target set before anything is attached (nothing writes the
    /// set but the programs, which are not attached yet).
    pub fn remove_targets(&mut self, tgids: &[u32]) -> Result<()> {
        mark_targets(&mut self.ebpf, tgids, false)
    }

    /// Loads and configures the probes for the processes `tgids` (and, with `follow`, those
    /// they fork), reading the counters in `perf` at each of their context switches: every
    /// program through the verifier, nothing attached yet (what `tracer doctor` checks).
    /// `timeline`: carry every state change through the ring buffer (`Config::transitions`);
    /// without it, only the records the summary reads.
    pub fn load(
        tgids: &[u32],
        follow: bool,
        opts: &ProbeOptions,
        perf: &PerfSet,
        timeline: bool,
    ) -> Result<Self> {
        kernel_floor(&std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default())?;
        if OBJECT.is_empty() {
            return Err(load_error(
                "this binary was built without its eBPF programs (AYA_BUILD_SKIP); rebuild it \
                 with `cargo build`",
            )
            .into());
        }
        // Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; raising it is harmless after.
        let unlimited = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: setrlimit reads the struct we pass; failure only matters on old kernels.
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };

        let btf_path = opts
            .btf_path
            .clone()
            .unwrap_or_else(|| layout::VMLINUX_BTF.into());
        let mut config = Config::zeroed();
        config.follow_children = follow as u32;
        // An eighth of the ring: at 16 MB/s of events (200k switches/s) an 8 MiB ring wakes the
        // reader about 16 times a second, and still has 7/8 of its room for the reader's delay.
        config.ring_wakeup_bytes = opts.ring_bytes / 8;
        config.transitions = timeline as u32;
        // A batch must fit the ring buffer many times over, or one batch could fill it.
        config.batch_bytes = (opts.ring_bytes / 16).min(tracer_common::BATCH_BYTES as u32);
        let thread_slots = opts.thread_slots.max(1).next_power_of_two();
        config.thread_slot_mask = thread_slots - 1;
        config.debug_bpf = opts.debug_bpf as u32;
        if let Some(arg) = opts.markers.as_ref().and_then(|m| m.id_arg) {
            config.request_id_arg = u32::from(arg);
        }

        let mut throttled = None;
        let (mode, btf, mut fallback_reason) = match opts.choice {
            ProbeChoice::Classic => (ProbeMode::Classic, None, Some("--probes classic".into())),
            ProbeChoice::Btf | ProbeChoice::Auto => match btf_setup(&btf_path, &mut config) {
                Ok((btf, offsets)) => {
                    throttled = offsets.throttled;
                    (ProbeMode::TpBtf, Some(btf), None)
                }
                Err(e) if opts.choice == ProbeChoice::Auto => {
                    (ProbeMode::Classic, None, Some(format!("{e:#}")))
                }
                Err(e) => return Err(e.context("tp_btf probes need the kernel's BTF")),
            },
        };
        let why = fallback_reason.clone().unwrap_or_default();
        let loaded = match load_object((mode, &why), btf.as_ref(), config, tgids, opts, perf) {
            // A kernel whose verifier rejects a tp_btf program (an argument or helper it
            // lacks) still has the classic tracepoints: auto mode takes them, and says why.
            Err(e) if mode == ProbeMode::TpBtf && opts.choice == ProbeChoice::Auto => {
                let why = format!("the kernel rejected a tp_btf program: {e:#}");
                let mut classic = config;
                classic.task_counts = 0;
                let classic_mode = (ProbeMode::Classic, why.as_str());
                let done = load_object(classic_mode, None, classic, tgids, opts, perf)
                    .with_context(|| why.clone())?;
                fallback_reason = Some(why);
                done
            }
            other => other?,
        };
        let mode = loaded.mode;
        let (mut ebpf, slots, switch_program) = (loaded.ebpf, loaded.slots, loaded.switch_program);
        let config = loaded.config;
        let btf_capability = match &btf {
            Some(_) => crate::recording::Capability {
                available: true,
                reason: format!(
                    "{} parsed; task_struct offsets found; {}; {}",
                    btf_path.display(),
                    layout::wakeup_clock_note(config.wakeup_rq_clock != 0),
                    layout::throttle_note(throttled.filter(|_| config.cfs_rq_throttled_off != 0))
                ),
            },
            None => {
                let mut c = layout::btf_capability(&btf_path);
                if mode == ProbeMode::Classic {
                    c.reason.push_str(
                        "; the classic tracepoints in use pass no task, so throttled waits are \
                         not told apart",
                    );
                }
                c
            }
        };
        let mut btf_capability = btf_capability;
        if switch_program == SWITCH_PROGRAMS[1] {
            btf_capability.reason.push_str(
                "; sched_switch without prev_state (Linux < 5.18): whether a switch blocked is \
                 read from the task's own nvcsw",
            );
        }
        // The parsed BTF (27 MB here) is done with once the programs are in; handing it back
        // before the ring buffer is mapped (twice its size, all resident) keeps the two out
        // of the same peak (BENCHMARKS.md).
        drop(btf);
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe { libc::malloc_trim(0) };
        let events = RingBuf::try_from(ebpf.take_map("EVENTS").context("EVENTS map")?)?;
        // Until a watch starts its sender, every CPU leaves its batch when it goes idle: the
        // end takes what is left from the map (`unsent_batches`).
        let cpus = possible_cpus()?;
        send::set_left(&mut ebpf, &(0..cpus).collect::<Vec<_>>(), 1)?;
        let debug_log = opts
            .debug_bpf
            .then(|| debug_log::start(&mut ebpf))
            .transpose()?;
        // SAFETY: the ring buffer owns its map fd, which stays open as long as the AsyncFd holds
        // the ring buffer.
        let events = unsafe { AsyncFd::register(events) }
            .map_err(|e| anyhow!("registering the ring buffer with tokio: {e}"))?;
        Ok(Self {
            ebpf,
            mode,
            links: Vec::new(),
            events,
            btf_capability,
            fallback_reason,
            pmu: perf.pmu.clone(),
            counter_mask: perf.mask,
            cuda_probes: Default::default(),
            cuda: crate::recording::Capability {
                available: false,
                reason: "CUDA probes not attached".into(),
            },
            marker_links: Vec::new(),
            gc_probes: Vec::new(),
            gc_files: Vec::new(),
            pause_probes: Vec::new(),
            slots,
            debug_log,
            reaps: 0,
            follow_cgroups: false,
            cgroup_offsets: mode == ProbeMode::TpBtf && config.cgroup_kn_off != 0,
            switch_program,
            idle_sender: Err(NOT_A_WATCH.into()),
        })
    }

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

impl Drop for SchedProbes {
    fn drop(&mut self) {
        self.detach();
    }
}

/// The oldest kernel the programs are written for: the BPF ring buffer (5.8) carries every
/// record, and CAP_BPF / CAP_PERFMON (5.8) are what an unprivileged deployment grants.
const KERNEL_FLOOR: (u32, u32) = (5, 8);

/// Refuses a kernel older than `KERNEL_FLOOR`, by its release string (`5.4.0-150-generic`);
/// one that cannot be parsed is let through (the loader then says what fails).
fn kernel_floor(release: &str) -> Result<()> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let (Some(Ok(major)), Some(Ok(minor))) = (
        parts.next().map(str::parse::<u32>),
        parts.next().map(str::parse::<u32>),
    ) else {
        return Ok(());
    };
    if (major, minor) < KERNEL_FLOOR {
        return Err(load_error(format!(
            "Linux {} is older than {}.{}, the oldest kernel tracer supports (it needs the BPF \
             ring buffer and CAP_BPF); run it on Linux 5.8 or newer (Ubuntu 20.04 with its HWE \
             kernel, Debian 11, RHEL 9)",
            release.trim(),
            KERNEL_FLOOR.0,
            KERNEL_FLOOR.1
        ))
        .into());
    }
    Ok(())
}

/// What `load_object` made: the object in the kernel, with the family it loaded.
struct Loaded {
    ebpf: Ebpf,
    slots: slots::ThreadSlots,
    mode: ProbeMode,
    switch_program: &'static str,
    config: Config,
}

/// Loads the object with `config` (completed for classic tracepoints from tracefs), marks the
/// targets, installs the counters, and loads every program of `mode`'s family (`why`: why
/// classic, when it is).
fn load_object(
    (mode, why): (ProbeMode, &str),
    btf: Option<&Btf>,
    mut config: Config,
    tgids: &[u32],
    opts: &ProbeOptions,
    perf: &PerfSet,
) -> Result<Loaded> {
    if mode == ProbeMode::Classic {
        classic_formats(&mut config, why)?;
    }
    let cpus = possible_cpus()?;
    config.counter_mask = perf.mask;
    let thread_slots = config.thread_slot_mask + 1;
    let mut ebpf = EbpfLoader::new()
        .btf(btf)
        .override_global("CONFIG", &config, true)
        .map_max_entries("CPU_WAIT", cpus)
        .map_max_entries("IDLE_SENDER", cpus)
        .map_max_entries("EVENTS", opts.ring_bytes)
        .map_max_entries("THREAD_SLOTS", thread_slots)
        // Tests fill the thread map on purpose (`--debug-bpf`'s log of it).
        .map_max_entries("THREADS", test_max_threads())
        .load(OBJECT)
        .map_err(|e| load_error_of("", &e))?;
    let slots = slots::ThreadSlots::map(&ebpf, thread_slots)?;
    mark_targets(&mut ebpf, tgids, true)?;
    install_counters(&ebpf, perf)?;
    let switch_program = load_programs(&mut ebpf, mode, btf)?;
    Ok(Loaded {
        ebpf,
        slots,
        mode,
        switch_program,
        config,
    })
}

/// `MAX_THREADS`, or what a test sets in `TRACER_TEST_MAX_THREADS`.
fn test_max_threads() -> u32 {
    std::env::var("TRACER_TEST_MAX_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(tracer_common::MAX_THREADS)
}

/// Fills in the classic tracepoints' field offsets from tracefs (mounting it if need be).
/// `why` says why classic tracepoints are used, for the error when tracefs cannot be had.
fn classic_formats(config: &mut Config, why: &str) -> Result<()> {
    let why = why.to_string();
    let tracefs = match layout::find_tracefs() {
        layout::Tracefs::At(root) => root,
        layout::Tracefs::NotMounted => {
            layout::mount_tracefs().map_err(|e| TracerError::NoTracefs {
                why,
                detail: format!("not mounted, and mounting it failed: {e:#}"),
            })?
        }
        unreadable => Err(TracerError::NoTracefs {
            why,
            detail: unreadable.problem().unwrap_or_default(),
        })?,
    };
    layout::apply_classic_formats(&tracefs, config)
}

/// The tp_btf `sched_switch` programs, the first where the tracepoint passes `prev_state`
/// (Linux 5.18+), the second for older kernels, whose verifier rejects a fourth argument.
const SWITCH_PROGRAMS: [&str; 2] = ["sched_switch_btf", "sched_switch_btf_3args"];

/// Loads every program of the chosen family into the kernel (through the verifier), attaching
/// nothing. Returns the `sched_switch` program that loaded.
fn load_programs(ebpf: &mut Ebpf, mode: ProbeMode, btf: Option<&Btf>) -> Result<&'static str> {
    let mut switch = SWITCH_PROGRAMS[0];
    match mode {
        ProbeMode::TpBtf => {
            let btf = btf.context("BTF")?;
            let load = |ebpf: &mut Ebpf, name: &str, tracepoint: &str| -> Result<()> {
                let prog: &mut BtfTracePoint = ebpf
                    .program_mut(name)
                    .with_context(|| format!("program {name}"))?
                    .try_into()?;
                prog.load(tracepoint, btf)
                    .map_err(|e| load_error_of(&format!("{name}: "), &e).into())
            };
            // Tests take the older kernels' program on this one (where it loads too).
            let old = std::env::var_os("TRACER_TEST_SWITCH_WITHOUT_STATE").is_some();
            for (name, tracepoint) in BTF_PROGRAMS.into_iter().chain([CGROUP_PROGRAM]) {
                if name == SWITCH_PROGRAMS[0] && (old || load(ebpf, name, tracepoint).is_err()) {
                    switch = SWITCH_PROGRAMS[1];
                    load(ebpf, switch, tracepoint)?;
                    continue;
                }
                if name != SWITCH_PROGRAMS[0] {
                    load(ebpf, name, tracepoint)?;
                }
            }
        }
        ProbeMode::Classic => {
            for (name, _, _) in CLASSIC_PROGRAMS {
                let prog: &mut TracePoint = ebpf
                    .program_mut(name)
                    .with_context(|| format!("program {name}"))?
                    .try_into()?;
                prog.load()
                    .map_err(|e| load_error_of(&format!("{name}: "), &e))?;
            }
        }
    }
    Ok(switch)
}

fn btf_setup(path: &Path, config: &mut Config) -> Result<(Btf, layout::TaskOffsets)> {
    if !path.exists() {
        anyhow::bail!(
            "{} does not exist (kernel built without CONFIG_DEBUG_INFO_BTF)",
            path.display()
        );
    }
    let offsets = layout::TaskOffsets::from_btf_file(path)?;
    offsets.apply(config);
    let btf = Btf::parse_file(path, aya::Endianness::default())
        .with_context(|| format!("parsing {}", path.display()))?;
    Ok((btf, offsets))
}

/// Number of possible CPUs: CPU numbers index per-CPU maps.
pub(crate) fn possible_cpus() -> Result<u32> {
    Ok(aya::util::nr_cpus()
        .map_err(|(what, e)| anyhow!("{what}: {e}"))?
        .max(1) as u32)
}

/// Puts each counter's fd at its CPU's index of its slot's perf event array. aya 0.14 has no
/// setter for perf event arrays, so this is a plain BPF_MAP_UPDATE_ELEM.
fn install_counters(ebpf: &Ebpf, perf: &PerfSet) -> Result<()> {
    for (slot, cpu, fd) in perf.fds() {
        let Some(Map::PerfEventArray(map)) = ebpf.map(slot.map_name()) else {
            anyhow::bail!("{} is not a perf event array", slot.map_name());
        };
        let map_fd = map.fd().as_fd().as_raw_fd();
        let key: u32 = cpu;
        let value: u32 = fd as u32;
        // union bpf_attr for BPF_MAP_*_ELEM: map_fd, (pad), key ptr, value ptr, flags.
        #[repr(C)]
        struct Attr {
            map_fd: u32,
            _pad: u32,
            key: u64,
            value: u64,
            flags: u64,
        }
        let attr = Attr {
            map_fd: map_fd as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            flags: 0,
        };
        const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
        // SAFETY: attr points at live locals for the duration of the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_ELEM,
                &attr as *const Attr,
                size_of::<Attr>(),
            )
        };
        if rc != 0 {
            anyhow::bail!(
                "installing perf counter (slot {slot:?}, cpu {cpu}): {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_below_5_8_are_refused_with_what_to_do() {
        for old in ["5.4.0-150-generic", "4.18.0-553.el8_10.x86_64", "5.7.19"] {
            let e = kernel_floor(old).unwrap_err().to_string();
            assert!(e.contains("older than 5.8") && e.contains(old), "{e}");
        }
        for new in [
            "5.8.0",
            "5.10.0-32-amd64",
            "6.18.44-fc-v1045",
            "10.0",
            "weird",
        ] {
            assert!(kernel_floor(new).is_ok(), "{new}");
        }
    }
}
