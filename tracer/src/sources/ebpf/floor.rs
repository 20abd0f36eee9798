//! `tracer floor` (hidden, for `cargo xtask bench`): the eBPF object's empty programs attached
//! to the tracer's seven tracepoints until SIGINT/SIGTERM. What the benchmark loses to them is
//! the cost of any program on these tracepoints on this kernel, the floor under the tracer's
//! early-exit path.

use anyhow::{Context as _, Result};
use aya::{Btf, EbpfLoader, programs::BtfTracePoint};

const FLOOR: [(&str, &str); 7] = [
    ("floor_switch", "sched_switch"),
    ("floor_wakeup", "sched_wakeup"),
    ("floor_wakeup_new", "sched_wakeup_new"),
    ("floor_migrate", "sched_migrate_task"),
    ("floor_fork", "sched_process_fork"),
    ("floor_exit", "sched_process_exit"),
    ("floor_waking", "sched_waking"),
];

/// Loads and attaches the floor programs until interrupted; the caller checks the privileges.
pub fn run() -> Result<()> {
    let btf = Btf::from_sys_fs().context("the floor programs are tp_btf: they need BTF")?;
    let mut ebpf = EbpfLoader::new()
        .btf(Some(&btf))
        .map_max_entries("CPU_WAIT", super::possible_cpus()?)
        .map_max_entries("EVENTS", 64 << 10)
        .load(super::OBJECT)
        .context("loading the eBPF object")?;
    for (name, tracepoint) in FLOOR {
        let prog: &mut BtfTracePoint = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name}"))?
            .try_into()?;
        prog.load(tracepoint, &btf)?;
        prog.attach()?;
    }
    eprintln!("tracer: floor programs attached; Ctrl-C detaches them");
    // SAFETY: a signal set we own, filled and used only by these calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
    }
    // Dropping `ebpf` detaches and unloads everything.
    Ok(())
}
