//! `tracer attach --pid PID`: record a running process.

use std::time::Duration;

use anyhow::Result;
use clap::Args;

use super::{
    args::{RecordArgs, TargetArgs},
    emit::print_recording,
};
use crate::session::{record, runtime};

#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// How long to record (e.g. 10s, 500ms, 2m). Ctrl-C ends earlier and still reports.
    #[arg(long, short, default_value = "10s", value_parser = crate::units::parse_duration)]
    pub duration: Duration,
    #[command(flatten)]
    pub record: RecordArgs,
}

pub fn run(args: AttachArgs) -> Result<()> {
    args.record.check_inputs_and_outputs(false)?;
    let targets = args.target.resolve(&args.record)?;
    let opts = args.record.session_options(Some(args.duration));
    let mut rec = runtime()?.block_on(record(&targets, &opts, || Ok(())))?;
    let log = super::emit::unjoined(&rec, args.record.requests.latencies.as_deref());
    print_recording(&mut rec, args.record.json, &args.record.outputs, log)
}
