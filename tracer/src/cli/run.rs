//! `tracer run -- CMD ARGS`: start a command held at a gate, attach, then let it exec, so the
//! recording covers it from its first instruction.

use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use super::{args::RecordArgs, emit::print_recording};
use crate::{
    error::TracerError,
    session::{record, runtime},
    sources::{process::Target, targets::Targets},
};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Stop recording after this long (the command keeps running); default: until it exits.
    #[arg(long, short, value_parser = crate::units::parse_duration)]
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
    gate: OwnedFd,
    /// Closed by a successful exec (it is close-on-exec); carries errno if exec failed.
    exec_status: OwnedFd,
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe2: {}", std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
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
        let (gate_r, gate_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        // SAFETY: fork in a single-threaded process; the child only calls read, close, execvp,
        // write and _exit, all async-signal-safe.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: child side, see above.
            unsafe {
                // The parent's ends: with the gate's write end open here, the read below could
                // never see the tracer go away.
                libc::close(gate_w.as_raw_fd());
                libc::close(status_r.as_raw_fd());
                let mut byte = 0u8;
                let n = libc::read(gate_r.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
                if n != 1 {
                    // The tracer went away without attaching: do not run untraced.
                    libc::_exit(125);
                }
                libc::execvp(ptrs[0], ptrs.as_ptr());
                let errno = *libc::__errno_location();
                let bytes = errno.to_ne_bytes();
                libc::write(status_w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                libc::_exit(127);
            }
        }
        drop((gate_r, status_w));
        Ok(Self {
            pid: pid as u32,
            gate: gate_w,
            exec_status: status_r,
        })
    }

    /// Lets the child exec, and waits until it has (or failed to: the error says why, with a
    /// shell's exit status).
    fn release(&self, command: &str) -> Result<()> {
        let byte = 1u8;
        // SAFETY: writing one byte from a local to the pipe we own.
        let n = unsafe { libc::write(self.gate.as_raw_fd(), (&byte as *const u8).cast(), 1) };
        if n != 1 {
            bail!("releasing the command: {}", std::io::Error::last_os_error());
        }
        let mut errno = [0u8; 4];
        // SAFETY: reading into a local buffer from the pipe we own; EOF (0) means the exec
        // succeeded and closed the child's end.
        let n = unsafe {
            libc::read(
                self.exec_status.as_raw_fd(),
                errno.as_mut_ptr().cast(),
                errno.len(),
            )
        };
        if n == errno.len() as isize {
            let err = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
            let code = if err.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            // It writes errno and exits at once: wait for that, not a WNOHANG that can come
            // first and leave the zombie to be reparented.
            let mut status = 0;
            // SAFETY: waitpid on our own child, which is exiting.
            unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
            return Err(TracerError::Exec {
                message: format!("cannot run {command}: {err}"),
                code,
            }
            .into());
        }
        Ok(())
    }

    /// Reaps the child if it has exited: its exit status, or 128 + the signal that ended it,
    /// as a shell reports it.
    fn try_reap(&self) -> Option<(u8, String)> {
        let mut status = 0;
        // SAFETY: waitpid on our own child with WNOHANG.
        let r = unsafe { libc::waitpid(self.pid as i32, &mut status, libc::WNOHANG) };
        if r != self.pid as i32 {
            return None;
        }
        Some(if libc::WIFEXITED(status) {
            let code = libc::WEXITSTATUS(status);
            (code as u8, format!("exit status {code}"))
        } else {
            let sig = libc::WTERMSIG(status);
            ((128 + sig) as u8, format!("signal {sig}"))
        })
    }
}

/// Records the command; the exit status is the command's own when it ended during the
/// recording (0 when it is still running), unless the tracer itself failed.
pub fn run(args: RunArgs) -> Result<u8> {
    args.record.check_inputs_and_outputs(true)?;
    // Fork before the runtime starts any thread.
    let child = GatedChild::spawn(&args.command)?;
    // The command's whole tree: it has no children yet, and the kernel side follows its forks.
    let targets = Targets::of(
        Target::child(child.pid, &args.command)?,
        !args.record.no_children,
    );
    let opts = args.record.session_options(args.duration);
    // If recording fails before the release, dropping the gate makes the child exit unrun.
    let mut rec =
        runtime()?.block_on(record(&targets, &opts, || child.release(&args.command[0])))?;
    let ended = child.try_reap();
    if !args.record.quiet {
        match &ended {
            Some((_, how)) => eprintln!("tracer: the command ended with {how}"),
            None => eprintln!("tracer: the command is still running (PID {})", child.pid),
        }
    }
    let log = super::emit::unjoined(&rec, args.record.requests.latencies.as_deref());
    print_recording(&mut rec, args.record.json, &args.record.outputs, log)?;
    Ok(ended.map_or(0, |(code, _)| code))
}
