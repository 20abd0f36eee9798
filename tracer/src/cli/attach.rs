//! `tracer attach --pid PID`: record a running process.

use std::time::Duration;

use anyhow::Result;
use clap::Args;

use super::{args::RecordArgs, emit::print_recording};
use crate::{
    session::{record, runtime},
    sources::{cgroup_target, targets::Targets},
};

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The processes to record: `-p 12,34` or `-p 12 -p 34` (a thread ID is resolved to its
    /// process). Each brings its child processes unless --no-children.
    #[arg(
        long,
        short,
        required_unless_present = "cgroup",
        value_delimiter = ',',
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub pid: Vec<u32>,
    /// Record every process in this cgroup and its descendant cgroups, and those that join
    /// them during the recording: a container, a systemd unit, a Kubernetes pod. A cgroup v2
    /// directory or a v1 one (/sys/fs/cgroup/cpu/...), or a path relative to the cgroup mount
    /// (/system.slice/NAME.service). With -p, both.
    #[arg(long, value_name = "PATH", conflicts_with = "no_children")]
    pub cgroup: Option<String>,
    /// How long to record (e.g. 10s, 500ms, 2m). Ctrl-C ends earlier and still reports.
    #[arg(long, short, default_value = "10s", value_parser = crate::units::parse_duration)]
    pub duration: Duration,
    #[command(flatten)]
    pub record: RecordArgs,
}

pub fn run(args: AttachArgs) -> Result<()> {
    args.record.check_inputs_and_outputs(false)?;
    let targets = match &args.cgroup {
        Some(path) => Targets::with_cgroup(&args.pid, cgroup_target::resolve(path)?)?,
        None => Targets::resolve(&args.pid, !args.record.no_children)?,
    };
    for target in &targets.members {
        if let Some(tid) = target.resolved_from_tid
            && !args.record.quiet
        {
            eprintln!(
                "tracer: {tid} is a thread of process {} ({}); recording the whole process",
                target.pid,
                crate::recording::printable(&target.comm)
            );
        }
    }
    let opts = args.record.session_options(Some(args.duration));
    let mut rec = runtime()?.block_on(record(&targets, &opts, || Ok(())))?;
    print_recording(
        &mut rec,
        args.record.json,
        &args.record.outputs,
        args.record.requests.latencies.as_deref(),
    )
}
