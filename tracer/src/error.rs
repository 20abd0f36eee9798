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

    #[error(
        "the kernel has no BTF (/sys/kernel/btf/vmlinux) and tracefs is not mounted, so neither \
         BTF nor classic tracepoints can be used: mount tracefs with \
         `mount -t tracefs nodev /sys/kernel/tracing` ({detail})"
    )]
    NoTracefs { detail: String },

    #[error("loading the BPF programs failed: {detail}")]
    Load { detail: String },
}
