//! The target process as /proc describes it: validation, its threads, their names and states.

use std::collections::BTreeMap;

use procfs::process::Process;

use crate::error::TracerError;

/// `PF_KTHREAD` (include/linux/sched.h): the task is a kernel thread.
const PF_KTHREAD: u32 = 0x0020_0000;

/// A process that may be traced.
#[derive(Debug, Clone)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// Set when the PID given was a thread of another process, which is traced instead.
    pub resolved_from_tid: Option<u32>,
}

/// What /proc says of one thread when the recording starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThreadInfo {
    pub tid: u32,
    pub comm: String,
    /// The state letter of /proc/PID/task/TID/stat (R, S, D, ...).
    pub state: char,
}

impl Target {
    /// Checks that `pid` names a live user process and resolves a TID to its process.
    pub fn resolve(pid: u32) -> Result<Self, TracerError> {
        if pid == 0 {
            return Err(TracerError::BadTarget {
                pid,
                why: "PID 0 is the idle task, not a process".into(),
            });
        }
        let proc = Process::new(pid as i32).map_err(|_| TracerError::NoSuchProcess { pid })?;
        let stat = proc
            .stat()
            .map_err(|_| TracerError::NoSuchProcess { pid })?;
        if stat.flags & PF_KTHREAD != 0 {
            return Err(TracerError::BadTarget {
                pid,
                why: format!(
                    "it is the kernel thread [{}]; tracer attaches to user processes",
                    stat.comm
                ),
            });
        }
        if stat.state == 'Z' || stat.state == 'X' {
            return Err(TracerError::BadTarget {
                pid,
                why: format!(
                    "it has exited ({}, a zombie its parent PID {} has not reaped) and has no \
                     threads left to trace: give the PID of a running process",
                    stat.comm, stat.ppid
                ),
            });
        }
        let status = proc
            .status()
            .map_err(|_| TracerError::NoSuchProcess { pid })?;
        let tgid = status.tgid as u32;
        let (proc, resolved_from_tid) = if tgid != pid {
            let leader =
                Process::new(tgid as i32).map_err(|_| TracerError::NoSuchProcess { pid: tgid })?;
            (leader, Some(pid))
        } else {
            (proc, None)
        };
        let comm = proc.stat().map(|s| s.comm).unwrap_or_default();
        let cmdline = proc.cmdline().unwrap_or_default();
        Ok(Self {
            pid: tgid,
            comm,
            cmdline,
            resolved_from_tid,
        })
    }

    /// The process's threads now. A thread that exits while being listed is skipped.
    pub fn threads(&self) -> BTreeMap<u32, ThreadInfo> {
        let mut out = BTreeMap::new();
        let Ok(proc) = Process::new(self.pid as i32) else {
            return out;
        };
        let Ok(tasks) = proc.tasks() else {
            return out;
        };
        for task in tasks.flatten() {
            if let Ok(stat) = task.stat() {
                out.insert(
                    task.tid as u32,
                    ThreadInfo {
                        tid: task.tid as u32,
                        comm: stat.comm,
                        state: stat.state,
                    },
                );
            }
        }
        out
    }

    /// True while the process exists and has not exited (a zombie has exited).
    pub fn alive(&self) -> bool {
        Process::new(self.pid as i32)
            .and_then(|p| p.stat())
            .map(|s| s.state != 'Z' && s.state != 'X')
            .unwrap_or(false)
    }
}

/// The name of any task (a process's is its leader's), for naming preemptors' processes. From
/// /proc/PID/comm: the process's stat file would cost in proportion to its threads, as the
/// kernel adds up every thread's CPU time and faults for it (fs/proc/array.c `do_task_stat`).
pub fn comm_of(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let name = raw.strip_suffix(b"\n").unwrap_or(&raw);
    Some(String::from_utf8_lossy(name).into_owned())
}

/// This process's CPU time (user + system, every thread) and peak resident set, in bytes.
pub fn own_usage() -> (u64, u64) {
    // SAFETY: getrusage fills the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF always exists.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    let cpu_ns = (us(ru.ru_utime) + us(ru.ru_stime)) * 1000;
    (cpu_ns, ru.ru_maxrss as u64 * 1024)
}

/// Reads CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Reads CLOCK_REALTIME (NVML's driver samples are stamped with it).
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// The calling thread's own CPU time.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clocks used always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now: the realtime reading taken between two monotonic
/// ones, against their midpoint.
pub fn realtime_minus_monotonic_ns() -> i64 {
    let a = monotonic_ns();
    let r = clock_ns(libc::CLOCK_REALTIME);
    let b = monotonic_ns();
    r as i64 - (a / 2 + b / 2) as i64
}
