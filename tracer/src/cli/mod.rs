//! Command-line interface: the commands and their dispatch. One module per subcommand; the
//! arguments the recording commands share are in `args.rs`.

mod args;
mod attach;
mod demo;
mod doctor;
mod emit;
mod generate;
mod report;
mod run;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{render, workload};

/// Tell why an inference server's latency jitters: attach to a running process and attribute
/// its lost time to scheduling, cache thrash or GPU saturation.
#[derive(Debug, Parser)]
#[command(name = "tracer", version = crate::VERSION, about, long_about = None)]
#[command(after_help = "EXAMPLES:
    tracer demo                          # built-in workload + CPU hogs, attached and explained
    tracer demo --scenario cfs-throttle  # another injected cause (see --help)
    tracer doctor                        # what this host can measure
    sudo tracer attach --pid 1234        # record PID 1234 for 10 s and summarize
    sudo tracer attach --pid 1234 -d 30s --json > trace.json
    sudo tracer run -- python3 serve.py  # trace a command from its first instruction
    sudo tracer attach -p 1234 --request-start /srv/server:req_begin --request-end \
         /srv/server:req_done --request-id-arg 0   # per-request verdict
    sudo tracer attach -p 1234 --latencies /tmp/requests.jsonl
    sudo tracer attach -p 1234 -o rec.trace && tracer report rec.trace --html rec.html
    sudo tracer watch -p 1234 --interval 10s --prometheus 127.0.0.1:9464")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Record a running process and print where its threads' time went.
    Attach(attach::AttachArgs),
    /// Start a command and record it from its first instruction until it exits.
    Run(run::RunArgs),
    /// Stay attached and close a window every interval, each with its verdict; serve the
    /// series to Prometheus.
    // --html and --perfetto draw one recording, which a watch is not (`watch::run` says what
    // to do instead): shared with attach, but kept out of watch's help.
    #[command(mut_arg("html", |a| a.hide(true)), mut_arg("perfetto", |a| a.hide(true)))]
    Watch(watch::WatchArgs),
    /// Run the built-in inference-like workload under a CPU disturbance and explain it.
    Demo(demo::DemoArgs),
    /// Say what this host lets the tracer measure, and what to do about the rest.
    Doctor(doctor::DoctorArgs),
    /// Read a trace file written with --output and print its summary again.
    Report(report::ReportArgs),
    /// The built-in workload (used by `demo` and the tests).
    #[command(hide = true)]
    Workload(workload::server::WorkloadArgs),
    /// The demo's disturbances: CPU hogs, a cache thrasher, a migrator.
    #[command(hide = true)]
    Disturb(workload::disturb::DisturbArgs),
    /// Print the JSON Schema of a --json document.
    #[command(hide = true)]
    Schema {
        #[arg(value_enum, default_value = "summary")]
        document: Document,
    },
    /// Empty programs on the tracer's tracepoints until Ctrl-C (the bench's floor).
    #[command(hide = true)]
    Floor,
    /// Write the shell completions and man pages (`cargo xtask dist` packages them).
    #[command(hide = true)]
    Generate(generate::GenerateArgs),
}

/// The `--json` documents, each with its schema committed as docs/NAME.schema.json (`cargo
/// xtask schema` writes them all, a unit test checks they are current).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Document {
    /// The summary: attach, run and report.
    Summary,
    /// The summary and the scenario's outcome: demo.
    Demo,
}

impl Document {
    pub fn json_schema(self) -> String {
        match self {
            Self::Summary => render::json_schema(),
            Self::Demo => demo::json_schema(),
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Attach(a) => attach::run(a).map(|()| 0),
        Command::Run(r) => run::run(r),
        Command::Watch(w) => watch::run(w).map(|()| 0),
        Command::Demo(d) => demo::run(d).map(|()| 0),
        Command::Doctor(d) => doctor::run(d).map(|()| 0),
        Command::Report(r) => report::run(r).map(|()| 0),
        Command::Workload(w) => workload::server::run(w).map(|()| 0),
        Command::Disturb(d) => workload::disturb::run(d).map(|()| 0),
        Command::Floor => crate::sources::privileges::check()
            .map_err(anyhow::Error::from)
            .and_then(|()| crate::sources::ebpf::floor::run())
            .map(|()| 0),
        Command::Generate(g) => generate::run(g).map(|()| 0),
        Command::Schema { document } => emit::stdout(&document.json_schema()).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let message = format!("{e:#}");
            eprintln!(
                "tracer: error: {}",
                crate::recording::terminal_safe(&message)
            );
            ExitCode::from(crate::error::TracerError::exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_schemas_are_current() {
        use clap::ValueEnum as _;
        for doc in Document::value_variants() {
            let name = doc.to_possible_value().expect("not skipped");
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../docs/{}.schema.json", name.get_name()));
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == doc.json_schema(),
                "{} is out of date with its Rust types: regenerate it with `cargo xtask schema`",
                path.display()
            );
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
