//! The arguments the recording commands share (attach, run, demo): how the recording is taken,
//! what requests mean, which files it writes; checked before anything is attached.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Result;
use clap::Args;

use crate::{
    session::{GpuSettings, SessionOptions},
    sources::{
        cgroup_target,
        ebpf::{
            ProbeChoice, ProbeOptions,
            requests::{Marker, RequestMarkers},
        },
        perf::CounterChoice,
        targets::Targets,
    },
};

/// Which processes to record, shared by attach and watch.
#[derive(Debug, Args, Clone)]
pub struct TargetArgs {
    /// The processes to record: `-p 12,34` or `-p 12 -p 34` (a thread ID is resolved to its
    /// process). Each brings its child processes unless --no-children.
    #[arg(
        long,
        short,
        required_unless_present = "cgroup",
        value_delimiter = ',',
        // `-p -5` then says the value is out of range, not "unexpected argument".
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub pid: Vec<u32>,
    /// Record every process in this cgroup and its descendant cgroups, and those that join
    /// them during the recording: a container, a systemd unit, a Kubernetes pod. A cgroup v2
    /// directory or a v1 one (/sys/fs/cgroup/cpu/...), or a path relative to the cgroup mount
    /// (/system.slice/NAME.service). With -p, both.
    #[arg(long, value_name = "PATH", conflicts_with = "no_children")]
    pub cgroup: Option<String>,
}

impl TargetArgs {
    /// The target set, with a notice for each thread ID given for its process.
    pub fn resolve(&self, record: &RecordArgs) -> Result<Targets> {
        let targets = match &self.cgroup {
            Some(path) => Targets::with_cgroup(&self.pid, cgroup_target::resolve(path)?)?,
            None => Targets::resolve(&self.pid, !record.no_children)?,
        };
        for target in &targets.members {
            if let Some(tid) = target.resolved_from_tid
                && !record.quiet
            {
                eprintln!(
                    "tracer: {tid} is a thread of process {} ({}); recording the whole process",
                    target.pid,
                    crate::recording::printable(&target.comm)
                );
            }
        }
        Ok(targets)
    }
}

/// How the recording is taken and shown, shared by attach, run and demo.
#[derive(Debug, Args, Clone)]
pub struct RecordArgs {
    /// Trace only the processes named, not their child processes. By default a process
    /// brings its whole tree: the descendants it has, and those forked during the recording.
    #[arg(long)]
    pub no_children: bool,
    /// Print one JSON document on stdout instead of the text summary.
    #[arg(long)]
    pub json: bool,
    /// No progress line or notices on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Which tracepoints to attach: tp_btf where the kernel has BTF (auto), or force one.
    #[arg(long, value_enum, default_value = "auto", hide = true)]
    pub probes: ProbeChoice,
    /// Size of the event ring buffer in KiB (a power of two).
    #[arg(long, default_value_t = 8192, value_parser = parse_ring_kib, hide = true)]
    pub ring_kib: u32,
    /// Read the kernel's BTF from this file instead of /sys/kernel/btf/vmlinux (tests point it
    /// at a missing file to exercise the classic fallback).
    #[arg(long, hide = true)]
    pub btf: Option<PathBuf>,
    /// Direct-mapped thread slots in the kernel, a power of two (tests make it 1 to send every
    /// thread but one to the overflow hash map).
    #[arg(long, default_value_t = tracer_common::THREAD_SLOTS, value_parser = parse_thread_slots, hide = true)]
    pub thread_slots: u32,
    /// Print, from the eBPF programs (through aya-log), each state they repair or only count
    /// because it should not happen (a switch or wakeup no tracepoint reported, a full map, a
    /// clock that ran backwards), with the thread, CPU and times, as `bpf: ...` lines on
    /// stderr: what to send with a report of a wrong number. Off, it costs nothing.
    #[arg(long)]
    pub debug_bpf: bool,
    /// Perf counters read at each context switch of the target: hardware (cycles,
    /// instructions, LLC references/misses) where a PMU allows, software (cpu-clock,
    /// context-switches, cpu-migrations, to check the plumbing), all, or none.
    #[arg(long, value_enum, default_value = "auto")]
    pub counters: CounterChoice,
    /// Width of the time bins of the counter series (IPC, MPKI over time).
    #[arg(long, default_value = "10ms", value_parser = crate::units::parse_duration)]
    pub bin: Duration,
    /// The GPU to sample, by index or UUID (default: the GPUs the target uses, else all).
    #[arg(long)]
    pub gpu: Option<String>,
    /// How often NVML is polled (10ms..10s). The driver averages utilization over 1/6 s to
    /// 1 s, so polling faster mostly adds cost.
    #[arg(long, default_value = "100ms", value_parser = parse_gpu_interval)]
    pub gpu_interval: Duration,
    /// Do not sample GPUs.
    #[arg(long, conflicts_with = "gpu")]
    pub no_gpu: bool,
    #[command(flatten)]
    pub outputs: OutputArgs,
    /// Write the recording to this trace file as it goes (`tracer report FILE` reads it).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub requests: RequestArgs,
}

/// Where the target's requests come from, for the request-level verdict.
#[derive(Debug, Args, Clone, Default)]
pub struct RequestArgs {
    /// The target's function that begins a request, as BINARY:SYMBOL (BINARY: an absolute
    /// path, or the name of a file the target has mapped). A uprobe marks each call.
    #[arg(long, value_name = "BINARY:SYMBOL", requires = "request_end")]
    pub request_start: Option<Marker>,
    /// The function that ends a request (may be on another thread when requests carry ids).
    #[arg(long, value_name = "BINARY:SYMBOL", requires = "request_start")]
    pub request_end: Option<Marker>,
    /// Which argument (0-5) of both functions is the request id. Without it, a request is a
    /// start and the next end on the same thread.
    #[arg(long, value_name = "N", requires = "request_start",
          value_parser = clap::value_parser!(u8).range(0..6))]
    pub request_id_arg: Option<u8>,
    /// A log of request latencies the target writes, read when the recording ends (the trace
    /// file of `attach` or `run` then holds its requests; `watch` reads it window by window):
    /// JSON lines
    /// {"start_ns": N, "end_ns": N, "tid": N}, on CLOCK_MONOTONIC unless a {"clock":
    /// "realtime"} line says otherwise.
    #[arg(long, value_name = "FILE", conflicts_with = "request_start")]
    pub latencies: Option<PathBuf>,
}

impl RequestArgs {
    pub fn markers(&self) -> Option<RequestMarkers> {
        Some(RequestMarkers {
            start: self.request_start.clone()?,
            end: self.request_end.clone()?,
            id_arg: self.request_id_arg,
        })
    }

    pub fn wanted(&self) -> bool {
        self.request_start.is_some() || self.latencies.is_some()
    }
}

/// Files made from a recording, by `attach`, `run` and `report` alike.
#[derive(Debug, Args, Clone)]
pub struct OutputArgs {
    /// Write a Perfetto trace (open it at ui.perfetto.dev): a track per thread with its
    /// states, counter tracks for run-queue wait, MPKI, GPU utilization and CUDA waits.
    #[arg(long)]
    pub perfetto: Option<PathBuf>,
    /// Write one self-contained HTML page: the summary, a per-thread state timeline, a CPU x
    /// time map of run-queue waits, and the GPU series.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

impl OutputArgs {
    pub fn need_timeline(&self) -> bool {
        self.perfetto.is_some() || self.html.is_some()
    }

    fn paths(&self) -> Vec<(&'static str, &std::path::Path)> {
        let mut v = Vec::new();
        if let Some(p) = &self.perfetto {
            v.push(("--perfetto", p.as_path()));
        }
        if let Some(p) = &self.html {
            v.push(("--html", p.as_path()));
        }
        v
    }

    /// Checks the files before any work is done (`report` reads the trace first); none may
    /// replace one of the command's `inputs`.
    pub fn check(&self, inputs: &[(&str, &Path)]) -> anyhow::Result<()> {
        // An output over an input is the more precise error (and a usage error): said first.
        crate::trace::output::check_not_inputs(&self.paths(), inputs)?;
        crate::trace::output::check_all(&self.paths())
    }
}

fn parse_gpu_interval(s: &str) -> Result<Duration, String> {
    let d = crate::units::parse_duration(s)?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(10) {
        return Err("must be between 10ms and 10s".into());
    }
    Ok(d)
}

impl RecordArgs {
    /// Checks every output path and the latency log before anything is attached: a path that
    /// cannot be written, or the same file given twice, must not cost a recording.
    /// `log_may_not_exist`: `run`'s command may create its latency log.
    pub fn check_inputs_and_outputs(&self, log_may_not_exist: bool) -> anyhow::Result<()> {
        let mut paths = self.outputs.paths();
        if let Some(p) = &self.output {
            paths.insert(0, ("--output", p.as_path()));
        }
        if let Some(p) = &self.requests.latencies {
            // Before the outputs' own checks: the more precise error, and a usage error.
            crate::trace::output::check_not_inputs(&paths, &[("the latency log", p)])?;
        }
        crate::trace::output::check_all(&paths)?;
        if let Some(p) = &self.requests.latencies {
            crate::sources::latency_log::check(p, log_may_not_exist)?;
        }
        Ok(())
    }

    pub fn session_options(&self, duration: Option<Duration>) -> SessionOptions {
        SessionOptions {
            duration,
            probes: ProbeOptions {
                choice: self.probes,
                ring_bytes: self.ring_kib * 1024,
                btf_path: self.btf.clone(),
                markers: self.requests.markers(),
                thread_slots: self.thread_slots,
                debug_bpf: self.debug_bpf,
            },
            counters: self.counters,
            bin: self.bin,
            gpu: (!self.no_gpu).then(|| GpuSettings {
                select: self.gpu.clone(),
                interval: self.gpu_interval,
            }),
            progress: !self.quiet,
            notices: !self.quiet,
            output: self.output.clone(),
            // Requests are decomposed on the timeline.
            keep_timeline: self.outputs.need_timeline() || self.requests.wanted(),
            flight: None,
            windows: false,
            until: None,
            latencies: self.requests.latencies.clone(),
        }
    }
}

fn parse_ring_kib(s: &str) -> Result<u32, String> {
    let v: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if v < 4 || !v.is_power_of_two() || v > 1 << 20 {
        return Err("must be a power of two between 4 and 1048576 (KiB)".into());
    }
    Ok(v)
}

fn parse_thread_slots(s: &str) -> Result<u32, String> {
    let v: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if v == 0 || !v.is_power_of_two() || v > 1 << 16 {
        return Err("must be a power of two between 1 and 65536".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes() {
        assert_eq!(parse_ring_kib("8192"), Ok(8192));
        assert!(parse_ring_kib("1000").is_err());
        assert!(parse_ring_kib("2").is_err());
        assert_eq!(parse_thread_slots("1"), Ok(1));
        assert_eq!(parse_thread_slots("4096"), Ok(4096));
        assert!(parse_thread_slots("0").is_err());
        assert!(parse_thread_slots("3000").is_err());
        assert!(parse_thread_slots("131072").is_err());
    }
}
