//! Errors a user can act on. Each message says what went wrong and what to do about it.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TracerError {
    #[error(
        "no process with PID {pid}: check the PID (e.g. `pgrep -f vllm`) and that it is still running"
    )]
    NoSuchProcess { pid: u32 },

    #[error("cannot trace PID {pid}: {why}")]
    BadTarget { pid: u32, why: String },

    #[error(
        "not enough privilege to load BPF programs: missing {missing}. Run as root (sudo), or grant \
         the binary the capabilities: `sudo setcap cap_bpf,cap_perfmon+ep $(command -v tracer)`"
    )]
    Privileges { missing: String },

    /// The classic tracepoints were needed (`why`: chosen, or the BTF unusable) and tracefs,
    /// where their formats are, cannot be read.
    #[error("the classic tracepoints ({why}) need tracefs, which is {detail}")]
    NoTracefs { why: String, detail: String },

    #[error("loading the BPF programs failed: {detail}")]
    Load { detail: String },

    /// A command line that cannot be carried out as given: exit status 2, as for the errors
    /// the argument parser finds.
    #[error("{message}")]
    Usage { message: String },

    /// `tracer run`'s command could not be started: 127 when it was not found, 126 when it
    /// could not be executed, as a shell says.
    #[error("{message}")]
    Exec { message: String, code: u8 },
}

impl TracerError {
    /// The exit status an error ends the tool with: 2 for usage errors (as clap's own), a
    /// shell's 126/127 for a command `run` could not start, 1 for everything else.
    pub fn exit_code(e: &anyhow::Error) -> u8 {
        match e.downcast_ref::<TracerError>() {
            Some(TracerError::Usage { .. }) => 2,
            Some(TracerError::Exec { code, .. }) => *code,
            _ => 1,
        }
    }
}
