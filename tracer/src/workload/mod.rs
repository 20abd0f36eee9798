//! The built-in workload and disturbances that `tracer demo` runs (as hidden subcommands of
//! this binary, so the demo needs nothing else installed).

pub mod disturb;
pub mod limit;
pub mod server;
pub mod work;

/// Makes a demo child die with its parent (the demo's children with the demo, the engine
/// process with its front end), even one that ends without unwinding (a signal after the
/// window exits at once, signals.rs): the disturbances are CPU hogs.
pub fn die_with_parent(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}
