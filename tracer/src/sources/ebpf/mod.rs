//! The scheduler probes: loads the eBPF object embedded in this binary, configures it for one
//! target process, attaches it (tp_btf, or classic tracepoints where the kernel has no BTF),
//! and reads back what it recorded.

pub mod btf;
pub mod layout;
mod ring;

pub use ring::{Record, decode};

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{HashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, TracePoint, tp_btf::BtfTracePointLink, trace_point::TracePointLink},
};
use serde::Serialize;
use tokio::io::unix::AsyncFd;
use tracer_common::{
    COUNTER_SLOTS, Config, MigrationKey, Preemptor, ThreadCounters, ThreadState, ThreadStats,
};

use crate::{error::TracerError, sources::perf::PerfSet};

/// The eBPF object built by build.rs from `tracer-ebpf`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-probes"));

/// Which family of tracepoints to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeChoice {
    /// tp_btf where the kernel has BTF, classic tracepoints otherwise.
    Auto,
    Btf,
    Classic,
}

/// The family actually attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeMode {
    TpBtf,
    Classic,
}

/// Probes in attach order, detached in reverse. sched_switch goes first: a thread's first
/// traced event then tells the state it was in (a switch-in: it was waiting; a switch-out: it
/// was running), whereas a wakeup seen before switches are traced would leave the switch that
/// follows unseen.
const BTF_PROGRAMS: [(&str, &str); 6] = [
    ("sched_switch_btf", "sched_switch"),
    ("sched_migrate_task_btf", "sched_migrate_task"),
    ("sched_wakeup_btf", "sched_wakeup"),
    ("sched_wakeup_new_btf", "sched_wakeup_new"),
    ("sched_process_fork_btf", "sched_process_fork"),
    ("sched_process_exit_btf", "sched_process_exit"),
];
/// Classic order: thread creation first, so that the TID filter seeded next misses no thread,
/// then as for tp_btf.
const CLASSIC_PROGRAMS: [(&str, &str, &str); 6] = [
    ("task_newtask_tp", "task", "task_newtask"),
    ("sched_process_exit_tp", "sched", "sched_process_exit"),
    ("sched_switch_tp", "sched", "sched_switch"),
    ("sched_migrate_task_tp", "sched", "sched_migrate_task"),
    ("sched_wakeup_tp", "sched", "sched_wakeup"),
    ("sched_wakeup_new_tp", "sched", "sched_wakeup_new"),
];

enum Link {
    // Held only to keep the attachment alive; dropping it detaches.
    Btf(#[allow(dead_code)] BtfTracePointLink),
    Classic(#[allow(dead_code)] TracePointLink),
}

/// What the kernel side could not record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Losses {
    /// Timeline events lost to a full ring buffer (in-kernel totals stay exact).
    pub ringbuf_dropped: u64,
    pub thread_map_full: u64,
    pub preemptor_map_full: u64,
    pub migration_map_full: u64,
    /// Switches onto a CPU the kernel did not trace, repaired (see tracer-ebpf `sched.rs`).
    pub unseen_switch_ins: u64,
    /// Switches off a CPU the kernel did not trace, repaired.
    pub unseen_switch_outs: u64,
}

/// Dead threads moved out of the kernel maps: their totals and their counters.
pub type Reaped = (Vec<ThreadStats>, Vec<(u32, ThreadCounters)>);

/// Options for loading the probes.
pub struct ProbeOptions {
    pub choice: ProbeChoice,
    /// Ring buffer size in bytes (a power of two, at least a page).
    pub ring_bytes: u32,
    /// Override of the BTF file (tests simulate a kernel without BTF with a missing path).
    pub btf_path: Option<std::path::PathBuf>,
}

pub struct SchedProbes {
    ebpf: Ebpf,
    mode: ProbeMode,
    links: Vec<Link>,
    events: AsyncFd<RingBuf<MapData>>,
    btf: Option<Btf>,
    /// Why tp_btf was not used, when it was not.
    pub fallback_reason: Option<String>,
    /// The PMU capability and the counter slots the programs read.
    pub pmu: crate::sources::perf::PmuCapability,
    pub counter_mask: u32,
}

fn load_error(e: impl std::fmt::Display) -> TracerError {
    TracerError::Load {
        detail: e.to_string(),
    }
}

impl SchedProbes {
    /// Loads and configures the probes for `target_tgid`, reading the counters in `perf` at
    /// each of its context switches; nothing is attached yet.
    pub fn load(target_tgid: u32, opts: &ProbeOptions, perf: &PerfSet) -> Result<Self> {
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
        config.target_tgid = target_tgid;
        // An eighth of the ring: at 16 MB/s of events (200k switches/s) an 8 MiB ring wakes the
        // reader about 16 times a second, and still has 7/8 of its room for the reader's delay.
        config.ring_wakeup_bytes = opts.ring_bytes / 8;

        let (mode, btf, fallback_reason) = match opts.choice {
            ProbeChoice::Classic => (ProbeMode::Classic, None, Some("--probes classic".into())),
            ProbeChoice::Btf | ProbeChoice::Auto => match btf_setup(&btf_path, &mut config) {
                Ok(btf) => (ProbeMode::TpBtf, Some(btf), None),
                Err(e) if opts.choice == ProbeChoice::Auto => {
                    (ProbeMode::Classic, None, Some(format!("{e:#}")))
                }
                Err(e) => return Err(e.context("tp_btf probes need the kernel's BTF")),
            },
        };
        if mode == ProbeMode::Classic {
            let tracefs = match layout::tracefs_root() {
                Some(root) => root,
                None => layout::mount_tracefs().map_err(|e| TracerError::NoTracefs {
                    detail: format!("{e:#}"),
                })?,
            };
            layout::apply_classic_formats(&tracefs, &mut config)?;
        }

        let cpus = possible_cpus()?;
        config.counter_mask = perf.mask;
        let mut ebpf = EbpfLoader::new()
            .btf(btf.as_ref())
            .override_global("CONFIG", &config, true)
            .map_max_entries("CPU_WAIT", cpus)
            .map_max_entries("EVENTS", opts.ring_bytes)
            .load(OBJECT)
            .map_err(|e| load_error(format!("{e:#}")))?;
        install_counters(&ebpf, perf)?;
        let events = RingBuf::try_from(ebpf.take_map("EVENTS").context("EVENTS map")?)?;
        // SAFETY: the ring buffer owns its map fd, which stays open as long as the AsyncFd holds
        // the ring buffer.
        let events = unsafe { AsyncFd::register(events) }
            .map_err(|e| anyhow!("registering the ring buffer with tokio: {e}"))?;
        Ok(Self {
            ebpf,
            mode,
            links: Vec::new(),
            events,
            btf,
            fallback_reason,
            pmu: perf.pmu.clone(),
            counter_mask: perf.mask,
        })
    }

    pub fn mode(&self) -> ProbeMode {
        self.mode
    }

    /// Attaches every probe. `threads` lists the target's threads now (the classic programs
    /// need them; tp_btf filters on the TGID alone).
    pub fn attach(&mut self, threads: impl Fn() -> Vec<u32>) -> Result<()> {
        self.verify()?;
        match self.mode {
            ProbeMode::TpBtf => {
                for (name, _) in BTF_PROGRAMS {
                    let prog: &mut BtfTracePoint = self
                        .ebpf
                        .program_mut(name)
                        .with_context(|| format!("program {name}"))?
                        .try_into()?;
                    let id = prog.attach().with_context(|| format!("attaching {name}"))?;
                    self.links.push(Link::Btf(prog.take_link(id)?));
                }
            }
            ProbeMode::Classic => {
                for (i, (name, category, tracepoint)) in CLASSIC_PROGRAMS.into_iter().enumerate() {
                    if i == 2 {
                        // Thread creation is now watched: the TIDs listed from here on are
                        // complete, so seed the TID filter before anything else attaches.
                        let mut tids: HashMap<_, u32, u32> = HashMap::try_from(
                            self.ebpf
                                .map_mut("TARGET_TIDS")
                                .context("TARGET_TIDS map")?,
                        )?;
                        for tid in threads() {
                            tids.insert(tid, 1, 0)?;
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

    /// Loads every program of the chosen family into the kernel (through the verifier) without
    /// attaching anything: what `tracer doctor` checks.
    pub fn verify(&mut self) -> Result<()> {
        match self.mode {
            ProbeMode::TpBtf => {
                let btf = self.btf.as_ref().context("BTF")?;
                for (name, tracepoint) in BTF_PROGRAMS {
                    let prog: &mut BtfTracePoint = self
                        .ebpf
                        .program_mut(name)
                        .with_context(|| format!("program {name}"))?
                        .try_into()?;
                    prog.load(tracepoint, btf)
                        .map_err(|e| load_error(format!("{name}: {e:#}")))?;
                }
            }
            ProbeMode::Classic => {
                for (name, _, _) in CLASSIC_PROGRAMS {
                    let prog: &mut TracePoint = self
                        .ebpf
                        .program_mut(name)
                        .with_context(|| format!("program {name}"))?
                        .try_into()?;
                    prog.load()
                        .map_err(|e| load_error(format!("{name}: {e:#}")))?;
                }
            }
        }
        Ok(())
    }

    /// Detaches every probe, context switch first. The maps stay readable.
    pub fn detach(&mut self) {
        while let Some(link) = self.links.pop() {
            drop(link);
        }
    }

    /// The ring buffer, for waiting on readiness.
    pub fn events(&mut self) -> &mut AsyncFd<RingBuf<MapData>> {
        &mut self.events
    }

    /// Takes every record now in the ring buffer.
    pub fn drain(&mut self, mut f: impl FnMut(Record)) -> usize {
        let ring = self.events.get_mut();
        let mut n = 0;
        while let Some(item) = ring.next() {
            if let Some(rec) = decode(&item) {
                f(rec);
                n += 1;
            }
        }
        n
    }

    fn threads_map(&mut self) -> Result<HashMap<&mut MapData, u32, ThreadStats>> {
        Ok(HashMap::try_from(
            self.ebpf.map_mut("THREADS").context("THREADS map")?,
        )?)
    }

    /// Removes the entries of threads that have exited and switched out for the last time, and
    /// returns them with their counters: the maps then have room for new threads however many
    /// come and go.
    pub fn reap_dead(&mut self) -> Result<Reaped> {
        let mut map = self.threads_map()?;
        let dead: Vec<ThreadStats> = map
            .iter()
            .filter_map(|r| r.ok())
            .map(|(_, v)| v)
            .filter(|v| v.state == ThreadState::Dead as u32)
            .collect();
        for t in &dead {
            let _ = map.remove(&t.tid);
        }
        let mut counters = self.counters_map()?;
        let dead_counters: Vec<(u32, ThreadCounters)> = dead
            .iter()
            .filter_map(|t| Some((t.tid, counters.get(&t.tid, 0).ok()?)))
            .collect();
        for (tid, _) in &dead_counters {
            let _ = counters.remove(tid);
        }
        Ok((dead, dead_counters))
    }

    fn counters_map(&mut self) -> Result<HashMap<&mut MapData, u32, ThreadCounters>> {
        Ok(HashMap::try_from(
            self.ebpf
                .map_mut("THREAD_COUNTERS")
                .context("THREAD_COUNTERS map")?,
        )?)
    }

    /// Perf counter totals per thread.
    pub fn thread_counters(&mut self) -> Result<Vec<(u32, ThreadCounters)>> {
        let map = self.counters_map()?;
        Ok(map.iter().filter_map(|r| r.ok()).collect())
    }

    pub fn threads(&mut self) -> Result<Vec<ThreadStats>> {
        let map = self.threads_map()?;
        Ok(map.iter().filter_map(|r| r.ok()).map(|(_, v)| v).collect())
    }

    pub fn preemptors(&self) -> Result<Vec<Preemptor>> {
        let map: HashMap<_, u32, Preemptor> =
            HashMap::try_from(self.ebpf.map("PREEMPTORS").context("PREEMPTORS map")?)?;
        Ok(map.iter().filter_map(|r| r.ok()).map(|(_, v)| v).collect())
    }

    pub fn migrations(&self) -> Result<Vec<(MigrationKey, u64)>> {
        let map: HashMap<_, MigrationKey, u64> =
            HashMap::try_from(self.ebpf.map("MIGRATIONS").context("MIGRATIONS map")?)?;
        Ok(map.iter().filter_map(|r| r.ok()).collect())
    }

    pub fn losses(&self) -> Result<Losses> {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("COUNTERS").context("COUNTERS map")?)?;
        let mut sums = [0u64; COUNTER_SLOTS as usize];
        for (i, sum) in sums.iter_mut().enumerate() {
            *sum = map.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(Losses {
            ringbuf_dropped: sums[0],
            thread_map_full: sums[1],
            preemptor_map_full: sums[2],
            migration_map_full: sums[3],
            unseen_switch_ins: sums[4],
            unseen_switch_outs: sums[5],
        })
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

fn btf_setup(path: &Path, config: &mut Config) -> Result<Btf> {
    if !path.exists() {
        anyhow::bail!(
            "{} does not exist (kernel built without CONFIG_DEBUG_INFO_BTF)",
            path.display()
        );
    }
    let offsets = layout::TaskOffsets::from_btf_file(path)?;
    offsets.apply(config);
    Btf::parse_file(path, aya::Endianness::default())
        .with_context(|| format!("parsing {}", path.display()))
}

/// Number of possible CPUs: CPU numbers index per-CPU maps.
fn possible_cpus() -> Result<u32> {
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
