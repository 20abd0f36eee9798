//! `tracer report FILE`: read a trace file back and print its summary, as `attach` did.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use super::{args::OutputArgs, emit::print_recording};
use crate::trace::{reader, recover};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A trace file written by `tracer attach --output` or `tracer run --output` (a partial
    /// `.tmp` left by an interrupted recording reads too).
    pub file: PathBuf,
    /// Print one JSON document on stdout instead of the text summary (the same document the
    /// recording printed with --json; the trace holds the requests of the latency log it was
    /// recorded with).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub outputs: OutputArgs,
    /// A latency log of the target's requests (see `tracer attach --help`), for the
    /// request-level verdict: in place of the requests the trace holds, if any.
    #[arg(long, value_name = "FILE")]
    pub latencies: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> Result<()> {
    crate::trace::output::check_input("the trace file", &args.file)?;
    let mut inputs = vec![("the trace file", args.file.as_path())];
    if let Some(p) = &args.latencies {
        crate::sources::latency_log::check(p, false)?;
        inputs.push(("the latency log", p.as_path()));
    }
    args.outputs.check(&inputs)?;
    let contents = reader::read(&args.file)?;
    let damage = contents.damage.clone();
    let complete = contents.complete && contents.final_recording.is_some();
    let mut rec = recover::into_recording(
        contents,
        args.outputs.need_timeline() || args.latencies.is_some(),
    );
    print_recording(
        &mut rec,
        args.json,
        &args.outputs,
        args.latencies.as_deref(),
    )?;
    if let Some(d) = damage {
        bail!(
            "{}: {d}; the summary above covers what could be recovered",
            args.file.display()
        );
    }
    if !complete {
        bail!(
            "{} was not finished (the tracer stopped before writing its end); the summary \
             above is rebuilt from the timeline it holds",
            args.file.display()
        );
    }
    Ok(())
}
