//! `tracer run -- CMD ARGS`: start a command held at a gate, attach, then let it exec, so the
//! recording covers it from its first instruction.

use std::{ffi::CString, os::fd::AsRawFd as _, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use super::{RecordArgs, parse_duration, print_recording, runtime};
use crate::{session::record, sources::process::Target};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Stop recording after this long (the command keeps running); default: until it exits.
    #[arg(long, short, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub record: RecordArgs,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// A child process forked and parked before exec until `release` is called.
struct GatedChild {
    pid: u32,
    gate: std::os::fd::OwnedFd,
}

impl GatedChild {
    /// Forks; the child waits for one byte on a pipe, then execs `argv` (searched in PATH).
    /// Must run before any other thread exists: only async-signal-safe calls follow the fork.
    fn spawn(argv: &[String]) -> Result<Self> {
        let args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .context("an argument contains a NUL byte")?;
        let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two-element array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe2: {}", std::io::Error::last_os_error());
        }
        // SAFETY: fork in a single-threaded process; the child only calls read, close, execvp,
        // write and _exit, all async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: child side, see above.
            unsafe {
                libc::close(fds[1]);
                let mut byte = 0u8;
                let n = libc::read(fds[0], (&mut byte as *mut u8).cast(), 1);
                if n != 1 {
                    // The tracer went away without attaching: do not run untraced.
                    libc::_exit(125);
                }
                libc::execvp(ptrs[0], ptrs.as_ptr());
                let msg = b"tracer: cannot execute the command\n";
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(127);
            }
        }
        // SAFETY: parent side; fds[0] is ours to close and fds[1] becomes owned.
        unsafe { libc::close(fds[0]) };
        let gate = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
        Ok(Self {
            pid: pid as u32,
            gate,
        })
    }

    fn release(&self) -> Result<()> {
        let byte = 1u8;
        // SAFETY: writing one byte from a local to the pipe we own.
        let n = unsafe { libc::write(self.gate.as_raw_fd(), (&byte as *const u8).cast(), 1) };
        if n != 1 {
            bail!("releasing the command: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reaps the child if it has exited; returns its exit code or signal description.
    fn try_reap(&self) -> Option<String> {
        let mut status = 0;
        // SAFETY: waitpid on our own child with WNOHANG.
        let r = unsafe { libc::waitpid(self.pid as i32, &mut status, libc::WNOHANG) };
        if r != self.pid as i32 {
            return None;
        }
        Some(if libc::WIFEXITED(status) {
            format!("exit status {}", libc::WEXITSTATUS(status))
        } else {
            format!("signal {}", libc::WTERMSIG(status))
        })
    }
}

pub fn run(args: RunArgs) -> Result<()> {
    // Fork before the runtime starts any thread.
    let child = GatedChild::spawn(&args.command)?;
    let target = Target {
        pid: child.pid,
        comm: args.command[0].clone(),
        cmdline: args.command.clone(),
        resolved_from_tid: None,
    };
    let opts = args.record.session_options(args.duration);
    // If recording fails before the release, dropping the gate makes the child exit unrun.
    let mut rec = runtime()?.block_on(record(&target, &opts, || child.release()))?;
    if !args.record.quiet {
        match child.try_reap() {
            Some(how) => eprintln!("tracer: the command ended with {how}"),
            None => eprintln!("tracer: the command is still running (PID {})", child.pid),
        }
    }
    if let Some(path) = &args.record.requests.latencies {
        super::load_latencies(&mut rec, path)?;
    }
    print_recording(&rec, args.record.json, &args.record.outputs)?;
    Ok(())
}
