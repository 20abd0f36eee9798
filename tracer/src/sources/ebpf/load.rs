//! Loading the probes, nothing attached: the kernel floor, the object with its configuration,
//! the family of programs (tp_btf, or classic tracepoints where the kernel has no BTF or
//! rejects a tp_btf program), the target set and the perf counters. Its own file: what can go
//! wrong at load (a kernel too old, a verifier, a memory limit) is said here, with what to do.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Map, RingBuf},
    programs::{BtfTracePoint, TracePoint},
};
use tokio::io::unix::AsyncFd;
use tracer_common::Config;

use super::{
    BTF_PROGRAMS, CGROUP_PROGRAM, CLASSIC_PROGRAMS, NOT_A_WATCH, OBJECT, ProbeChoice, ProbeOptions,
    SWITCH_PROGRAMS, SchedProbes, debug_log, layout, possible_cpus, send, slots,
    targets::mark_targets, tracefs,
};
use crate::{error::TracerError, recording::ProbeMode, sources::perf::PerfSet};

pub(super) fn load_error(e: impl std::fmt::Display) -> TracerError {
    TracerError::Load {
        detail: e.to_string(),
    }
}

/// A load error with the causes aya keeps beneath it: "failed to create map `THREADS`" holds
/// the kernel's errno only in its source, and ENOMEM there is a memory limit, not a bug.
pub(super) fn load_error_of(what: &str, e: &(dyn std::error::Error + 'static)) -> TracerError {
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

/// A test's stand-in for a verifier that gives up on the program with the counter reads
/// (`TRACER_TEST_REFUSE_COUNTER_READS`): none of our kernels does any more, and the way on
/// without the counters must still be tested.
fn refused_by_test(perf: &PerfSet) -> Option<anyhow::Error> {
    (perf.mask != 0 && std::env::var_os("TRACER_TEST_REFUSE_COUNTER_READS").is_some())
        .then(|| anyhow!("BPF program is too large (TRACER_TEST_REFUSE_COUNTER_READS is set)"))
}

/// Whether loading failed because the verifier gave up on a program's size or complexity: its
/// log's words, or E2BIG from the program load itself (a map's E2BIG is something else).
fn verifier_gave_up(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    text.contains("BPF program is too large")
        || text.contains("too complex")
        || text.contains("BPF_PROG_LOAD syscall returned Argument list too long")
}

impl SchedProbes {
    /// Loads and configures the probes for the processes `tgids` (and, with `follow`, those
    /// they fork), reading the counters in `perf` at each of their context switches: every
    /// program through the verifier, nothing attached yet (what `tracer doctor` checks).
    /// `timeline`: carry every state change through the ring buffer (`Config::transitions`);
    /// without it, only the records the summary reads.
    pub fn load(
        tgids: &[u32],
        follow: bool,
        opts: &ProbeOptions,
        perf: &mut PerfSet,
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
        let config = base_config(follow, opts, timeline);
        let first = match refused_by_test(perf) {
            Some(e) => Err(e),
            None => load_family(&btf_path, config, tgids, opts, perf),
        };
        let (loaded, btf) = match first {
            // The counter reads make the context-switch program larger for the verifier, and a
            // verifier may give up on it (the classic tracepoints' program did on Linux 6.18, a
            // million instructions walked, while an entry's creation called a byte-by-byte
            // memset): the recording goes on without the counters, and says why, rather than
            // not at all.
            Err(e) if perf.mask != 0 && verifier_gave_up(&e) => {
                perf.give_up(
                    "the kernel's verifier found the context-switch program too large with the \
                     counter reads, so it was loaded without them",
                );
                load_family(&btf_path, config, tgids, opts, perf)
                    .with_context(|| format!("loading again without the counters, after: {e:#}"))?
            }
            loaded => loaded?,
        };
        let (mode, config, switch_program) = (loaded.mode, loaded.config, loaded.switch_program);
        let btf_capability = btf_capability(
            btf.is_some(),
            &btf_path,
            (mode, switch_program),
            &config,
            loaded.throttled,
        );
        let (mut ebpf, slots, fallback_reason) =
            (loaded.ebpf, loaded.slots, loaded.fallback_reason);
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
            ended_unreaped: 0,
            dropped_at_reap: 0,
            follow_cgroups: false,
            cgroup_offsets: mode == ProbeMode::TpBtf && config.cgroup_kn_off != 0,
            switch_program,
            idle_sender: Err(NOT_A_WATCH.into()),
        })
    }
}

/// The programs' configuration before the kernel is looked at: following forks, the ring's
/// wakeup and batch sizes, the thread slots, the debug log, the request id's argument.
fn base_config(follow: bool, opts: &ProbeOptions, timeline: bool) -> Config {
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
    config
}

/// Loads the family `opts.choice` asks for: tp_btf with the kernel's BTF at `btf_path`, or
/// classic tracepoints, which auto mode falls back to when the BTF is missing or the verifier
/// rejects a tp_btf program. (What loaded, and the parsed BTF if used.)
fn load_family(
    btf_path: &Path,
    mut config: Config,
    tgids: &[u32],
    opts: &ProbeOptions,
    perf: &PerfSet,
) -> Result<(Loaded, Option<Btf>)> {
    let mut throttled = None;
    let (mode, btf, mut fallback_reason) = match opts.choice {
        ProbeChoice::Classic => (ProbeMode::Classic, None, Some("--probes classic".into())),
        ProbeChoice::Btf | ProbeChoice::Auto => match btf_setup(btf_path, &mut config) {
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
        // lacks) still has the classic tracepoints: auto mode takes them, and says why. Unless
        // the verifier gave up on the counter reads: then tp_btf without the counters
        // (`SchedProbes::load`) keeps more than the classic family with them.
        Err(e)
            if mode == ProbeMode::TpBtf
                && opts.choice == ProbeChoice::Auto
                && !(perf.mask != 0 && verifier_gave_up(&e)) =>
        {
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
    Ok((
        Loaded {
            fallback_reason,
            throttled,
            ..loaded
        },
        btf,
    ))
}

/// What `capabilities.btf` says: the BTF at `btf_path` parsed (`parsed`) and what the programs
/// read with it, or why there is none; and the `sched_switch` program's limits on older kernels.
fn btf_capability(
    parsed: bool,
    btf_path: &Path,
    (mode, switch_program): (ProbeMode, &str),
    config: &Config,
    throttled: Option<layout::ThrottledField>,
) -> crate::recording::Capability {
    let mut c = match parsed {
        true => crate::recording::Capability {
            available: true,
            reason: format!(
                "{} parsed; task_struct offsets found; {}; {}",
                btf_path.display(),
                layout::wakeup_clock_note(config.wakeup_rq_clock != 0),
                layout::throttle_note(throttled.filter(|_| config.cfs_rq_throttled_off != 0))
            ),
        },
        false => {
            let mut c = layout::btf_capability(btf_path);
            if mode == ProbeMode::Classic {
                c.reason.push_str(
                    "; the classic tracepoints in use pass no task, so throttled waits are \
                     not told apart",
                );
            }
            c
        }
    };
    if switch_program == SWITCH_PROGRAMS[1] {
        c.reason.push_str(
            "; sched_switch without prev_state (Linux < 5.18): whether a switch blocked is \
             read from the task's own nvcsw",
        );
    }
    c
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
    /// Why classic tracepoints, when they are (`load_family`).
    fallback_reason: Option<String>,
    /// The throttled-time field the BTF gave (`load_family`).
    throttled: Option<layout::ThrottledField>,
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
        fallback_reason: None,
        throttled: None,
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
    let tracefs = match tracefs::find_tracefs() {
        tracefs::Tracefs::At(root) => root,
        tracefs::Tracefs::NotMounted => {
            tracefs::mount_tracefs().map_err(|e| TracerError::NoTracefs {
                why,
                detail: format!("not mounted, and mounting it failed: {e:#}"),
            })?
        }
        unreadable => Err(TracerError::NoTracefs {
            why,
            detail: unreadable.problem().unwrap_or_default(),
        })?,
    };
    tracefs::apply_classic_formats(&tracefs, config)
}

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
    super::irq::load(ebpf)?;
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

    #[test]
    fn the_verifier_giving_up_is_told_from_other_load_errors() {
        let gave_up = anyhow!(
            "loading the BPF programs failed: sched_switch_tp: the BPF_PROG_LOAD syscall \
             returned Argument list too long (os error 7). Verifier output: 0: R1=ctx() \
             R10=fp0 ... BPF program is too large. Processed 1000001 insn"
        );
        assert!(verifier_gave_up(&gave_up));
        let terse = anyhow!("x: the BPF_PROG_LOAD syscall returned Argument list too long");
        assert!(verifier_gave_up(&terse));
        let map = anyhow!("map EVENTS: the BPF_MAP_CREATE syscall returned Argument list too long");
        assert!(!verifier_gave_up(&map));
        let other = anyhow!("sched_switch_tp: invalid argument: R1 type=ctx expected=fp");
        assert!(!verifier_gave_up(&other));
    }

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
