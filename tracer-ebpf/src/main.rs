//! The tracer's eBPF programs: scheduler tracepoints, filtered to one target process (TGID).
//!
//! Two families attach the same logic (`sched/`): BTF-typed tracepoints (`tp_btf.rs`, the
//! default: cheaper, and free of the per-CPU recursion guard that classic tracepoints share) and
//! classic tracepoints (`classic.rs`, only where the kernel has no BTF). The loader picks one.
// Built for the bpfel target by tracer/build.rs. On the host (a workspace-wide `cargo build`
// or `cargo clippy`) it compiles to an empty program, as in aya-template.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// `atomic_xadd` for the target set (`maps::set_member`): core's atomic types have no RMW
// methods on this target.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

// First: the modules below use its macro.
#[cfg(target_arch = "bpf")]
#[macro_use]
mod debug;
#[cfg(target_arch = "bpf")]
mod classic;
#[cfg(target_arch = "bpf")]
mod clock;
#[cfg(target_arch = "bpf")]
mod counters;
#[cfg(target_arch = "bpf")]
mod cuda;
#[cfg(target_arch = "bpf")]
mod floor;
#[cfg(target_arch = "bpf")]
mod irq;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod pauses;
#[cfg(target_arch = "bpf")]
mod pidns;
#[cfg(target_arch = "bpf")]
mod requests;
#[cfg(target_arch = "bpf")]
mod sched;
#[cfg(target_arch = "bpf")]
mod send;
#[cfg(target_arch = "bpf")]
mod tp_btf;
#[cfg(target_arch = "bpf")]
mod zero;

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never called.
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
