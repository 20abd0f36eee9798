//! `--debug-bpf`: the programs' aya-log records (tracer-ebpf `debug.rs`: each state they
//! repair or only count because it should not happen), printed to stderr as `bpf: ...` lines
//! whenever the event ring is drained, and once more after the programs are detached.

use anyhow::{Result, anyhow};
use aya::Ebpf;

/// Prints each record's message; the programs log only warnings, with their context in the
/// message itself.
pub struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        eprintln!("bpf: {}", record.args());
    }

    fn flush(&self) {}
}

pub type Logger = aya_log::EbpfLogger<Stderr>;

/// Takes the programs' log ring (`AYA_LOGS`) from the loaded object.
pub fn start(ebpf: &mut Ebpf) -> Result<Logger> {
    aya_log::EbpfLogger::init_with_logger(ebpf, Stderr)
        .map_err(|e| anyhow!("--debug-bpf: the programs' log ring: {e}"))
}
