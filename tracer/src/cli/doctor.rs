//! `tracer doctor`: what this host lets the tracer measure, and what to do about the rest.

use std::{fmt::Write as _, path::Path};

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use crate::{
    recording::{
        Capabilities, Capability, GpuCapability, ProbeMode,
        cgroup::{CgroupVersion, CpuCgroup},
    },
    sources::{
        cgroup,
        ebpf::{ProbeChoice, ProbeOptions, SchedProbes, layout},
        host::{self, GpuInfo},
        perf::{CounterChoice, PerfSet, perf_event_paranoid},
        privileges,
    },
};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Also report this process's cgroup CPU limits and throttling.
    #[arg(long, short, value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Option<u32>,
    /// Print one JSON document instead of the text report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Privileges {
    cap_bpf: bool,
    cap_perfmon: bool,
    cap_sys_admin: bool,
    #[serde(flatten)]
    capability: Capability,
}

#[derive(Debug, Serialize)]
struct CgroupReport {
    version: CgroupVersion,
    /// The target's CPU cgroup (with --pid).
    target: Option<CpuCgroup>,
}

#[derive(Debug, Serialize)]
struct Report {
    kernel: String,
    clocksource: String,
    /// Scheduler tracing works: the one thing the tracer cannot do without.
    scheduler_tracing: Capability,
    capabilities: Capabilities,
    tp_btf: Capability,
    privileges: Privileges,
    perf_event_paranoid: Option<i32>,
    uprobes: Capability,
    /// The uprobe programs (CUDA calls, request markers, GC probes) pass the verifier.
    uprobe_programs: Capability,
    cgroup: CgroupReport,
    nvidia_driver: Option<String>,
    gpus: Vec<GpuInfo>,
}

fn cap(available: bool, reason: impl Into<String>) -> Capability {
    Capability {
        available,
        reason: reason.into(),
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn clocksource() -> String {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Loads the scheduler programs (tp_btf, else classic) through the verifier, attaching
/// nothing, with the counter-reading path (software counters on CPU 0, so that the verifier
/// sees it), then the uprobe families: (scheduler tracing, tp_btf, uprobe programs).
fn scheduler_programs(privileged: bool) -> (Capability, Capability, Capability) {
    if !privileged {
        let why = "not checked: loading BPF programs needs CAP_BPF and CAP_PERFMON";
        return (cap(false, why), cap(false, why), cap(false, why));
    }
    let mut none = PerfSet::open(CounterChoice::Software, &[0]);
    let opts = ProbeOptions {
        choice: ProbeChoice::Auto,
        ring_bytes: 4096 * 16,
        btf_path: None,
        markers: None,
        thread_slots: tracer_common::THREAD_SLOTS,
        debug_bpf: false,
    };
    // Loading puts every program through the verifier; nothing is attached.
    // With every record sent (timeline), the verifier sees every path.
    let loaded = SchedProbes::load(&[std::process::id()], false, &opts, &mut none, true);
    let mut p = match loaded {
        Ok(p) => p,
        Err(e) => {
            let e = format!("{e:#}");
            let why = "not checked: the scheduler programs did not load";
            return (cap(false, e.clone()), cap(false, e), cap(false, why));
        }
    };
    let counters = if none.mask != 0 {
        ", with the counter reads".to_string()
    } else {
        let mut why: Vec<&str> = Vec::new();
        for (_, w) in &none.software_errors {
            if !why.contains(&w.as_str()) {
                why.push(w);
            }
        }
        format!(", without the counter reads: {}", why.join("; "))
    };
    let idle = p.idle_sending();
    let (sched, btf) = if p.mode() == ProbeMode::TpBtf {
        let ok = format!(
            "the tp_btf scheduler programs load and pass the verifier{counters} ({}); {idle}",
            p.btf_capability.reason,
        );
        (cap(true, ok.clone()), cap(true, ok))
    } else {
        let why = p.fallback_reason.clone().unwrap_or_default();
        (
            cap(
                true,
                format!(
                    "classic tracepoints load and pass the verifier{counters} (tp_btf \
                     unavailable: {why}); {idle}"
                ),
            ),
            cap(false, why),
        )
    };
    let families = p.load_uprobe_families();
    let failed: Vec<String> = families
        .iter()
        .filter_map(|(f, r)| r.as_ref().err().map(|e| format!("{f}: {e:#}")))
        .collect();
    let names: Vec<&str> = families.iter().map(|(f, _)| *f).collect();
    let uprobe_programs = if failed.is_empty() {
        cap(
            true,
            format!("{} load and pass the verifier", names.join(", ")),
        )
    } else {
        cap(false, failed.join("; "))
    };
    (sched, btf, uprobe_programs)
}

fn uprobes() -> Capability {
    if Path::new("/sys/bus/event_source/devices/uprobe").is_dir() {
        cap(
            true,
            "uprobe PMU present (CUDA call timing can attach to libcuda)",
        )
    } else {
        cap(
            false,
            "no uprobe PMU (kernel without CONFIG_UPROBES): CUDA waits cannot be timed",
        )
    }
}

fn report(pid: Option<u32>) -> Report {
    let caps = privileges::effective_caps();
    let privileged = privileges::missing_for_tracing(caps).is_none();
    let has = |bit: u32| caps & (1 << bit) != 0;
    let (scheduler_tracing, tp_btf, uprobe_programs) = scheduler_programs(privileged);
    let cpus = aya::util::online_cpus().unwrap_or_else(|_| vec![0]);
    // Opening on one CPU is enough to tell whether the events exist.
    let pmu = PerfSet::open(CounterChoice::Auto, &cpus[..1]).pmu;
    let gpu = host::gpu();
    Report {
        kernel: kernel_release(),
        clocksource: clocksource(),
        scheduler_tracing,
        capabilities: Capabilities {
            pmu,
            btf: layout::btf_capability(Path::new(layout::VMLINUX_BTF)),
            tracefs: host::tracefs(),
            gpu: GpuCapability::from_parts(
                gpu.capability.clone(),
                gpu.gpm(),
                match pid {
                    Some(pid) => match crate::sources::ebpf::cuda::find_libcuda(pid) {
                        Some((_, path)) => cap(true, format!("PID {pid} maps {path}")),
                        None => cap(false, format!("PID {pid} has not mapped libcuda.so")),
                    },
                    None => cap(false, "not checked: give --pid to check a process"),
                },
            ),
        },
        tp_btf,
        privileges: Privileges {
            cap_bpf: has(39),
            cap_perfmon: has(38),
            cap_sys_admin: has(21),
            capability: match privileges::missing_for_tracing(caps) {
                None => cap(true, "enough to load and attach the probes"),
                Some(missing) => cap(
                    false,
                    format!("missing {missing}: run as root or grant them with setcap"),
                ),
            },
        },
        perf_event_paranoid: perf_event_paranoid(),
        uprobes: uprobes(),
        uprobe_programs,
        cgroup: CgroupReport {
            version: cgroup::version(),
            target: pid.and_then(cgroup::cpu_cgroup),
        },
        nvidia_driver: gpu.driver_version,
        gpus: gpu.gpus,
    }
}

fn line(out: &mut String, c: &Capability, what: &str) {
    let mark = if c.available { "ok" } else { "--" };
    let _ = writeln!(out, "  {mark}  {what:<18} {}", c.reason);
}

fn render(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "tracer doctor: kernel {}, clocksource {}",
        r.kernel, r.clocksource
    );
    line(&mut out, &r.scheduler_tracing, "scheduler tracing");
    line(&mut out, &r.privileges.capability, "privileges");
    line(&mut out, &r.capabilities.btf, "BTF");
    line(&mut out, &r.tp_btf, "tp_btf");
    line(&mut out, &r.capabilities.tracefs, "tracefs");
    let pmu = &r.capabilities.pmu;
    let pmu_line = if pmu.llc_available {
        pmu.reason.clone()
    } else {
        format!(
            "{}; LLC misses and IPC cannot be measured, cache thrash will be reported as not \
             assessed",
            pmu.reason
        )
    };
    line(&mut out, &cap(pmu.llc_available, pmu_line), "PMU counters");
    let _ = writeln!(
        out,
        "      perf_event_paranoid {}",
        r.perf_event_paranoid
            .map_or("unknown".into(), |p| p.to_string())
    );
    line(&mut out, &r.uprobes, "uprobes");
    line(&mut out, &r.uprobe_programs, "uprobe programs");
    let g = &r.capabilities.gpu;
    line(&mut out, &cap(g.available, g.reason.clone()), "NVIDIA GPUs");
    line(&mut out, &g.gpm, "GPM");
    line(&mut out, &g.cuda, "libcuda in target");
    for g in &r.gpus {
        let _ = writeln!(
            out,
            "      GPU {}: {} ({}), GPM {}",
            g.index,
            g.name,
            g.uuid,
            if g.gpm_supported {
                "supported"
            } else {
                "not supported"
            }
        );
    }
    let version = match r.cgroup.version {
        CgroupVersion::V2 => "v2 (unified)",
        CgroupVersion::Hybrid => "hybrid (v1 controllers + unified)",
        CgroupVersion::V1 => "v1",
    };
    let _ = writeln!(out, "  ok  {:<18} {version}", "cgroups");
    if let Some(t) = &r.cgroup.target {
        let limits = if t.limits.is_empty() {
            "no CPU quota".to_string()
        } else {
            t.limits
                .iter()
                .map(|l| {
                    format!(
                        "{} CPUs ({} / {}) at {}",
                        l.cpus,
                        crate::units::dur(l.quota_us * 1000),
                        crate::units::dur(l.period_us * 1000),
                        l.cgroup
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(out, "      target cgroup {}: {limits}", t.path.display());
        if let Some(th) = t.throttling {
            let _ = writeln!(
                out,
                "      throttled {} of {} periods, {} in all",
                th.nr_throttled,
                th.nr_periods,
                crate::units::dur(th.throttled_ns)
            );
        }
    }
    out
}

/// A process that is not there has no libcuda and no cgroup, and one whose /proc entries
/// cannot be read shows none: saying only that would read as a finding about it.
fn check_pid(pid: u32) -> Result<()> {
    // kill(pid, 0), not /proc: under hidepid=2 another user's process is missing from /proc,
    // but kill says EPERM, not ESRCH. A PID past i32 would be a process group (-1: all).
    let gone = libc::pid_t::try_from(pid).map_or(true, |p| {
        // SAFETY: signal 0 checks that the process exists and sends nothing.
        let failed = unsafe { libc::kill(p, 0) } != 0;
        failed && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    });
    if gone {
        return Err(crate::error::TracerError::NoSuchProcess { pid }.into());
    }
    // A kernel thread (PID 2, kworkers) is no process to attach to, as `attach` says.
    if let Ok(stat) = procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) {
        crate::sources::process::refuse_kernel_thread(pid, &stat)?;
    }
    if let Err(e) = std::fs::File::open(format!("/proc/{pid}/maps")) {
        anyhow::bail!(
            "PID {pid} exists, but /proc/{pid}/maps cannot be read ({e}): /proc mounted with \
             hidepid, too few privileges, or a /proc of another PID namespace; run doctor as \
             root where /proc shows the process"
        );
    }
    Ok(())
}

pub fn run(args: DoctorArgs) -> Result<()> {
    if let Some(pid) = args.pid {
        check_pid(pid)?;
    }
    // The probes register their ring buffer with tokio even when only loaded.
    let rt = crate::session::runtime()?;
    let r = {
        let _guard = rt.enter();
        report(args.pid)
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", render(&r));
    }
    if !r.scheduler_tracing.available {
        anyhow::bail!(
            "scheduler tracing is not possible here: {}",
            r.scheduler_tracing.reason
        );
    }
    Ok(())
}
