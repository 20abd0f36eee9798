//! The target process as /proc describes it: validation, its threads, their names and states.

use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::Arc,
};

use procfs::process::Process;

use super::{
    clock::monotonic_ns,
    pidns::{self, PidNamespace},
};
use crate::recording::{ProcCounts, ThreadInfo, children::ChildSnapshot};

use crate::error::TracerError;

/// `PF_KTHREAD` (include/linux/sched.h): the task is a kernel thread.
const PF_KTHREAD: u32 = 0x0020_0000;

/// A kernel thread (kthreadd, kworkers) is no process to trace: `pid`'s `stat` says whether
/// it is one.
pub fn refuse_kernel_thread(pid: u32, stat: &procfs::process::Stat) -> Result<(), TracerError> {
    if stat.flags & PF_KTHREAD == 0 {
        return Ok(());
    }
    Err(TracerError::BadTarget {
        pid,
        why: format!(
            "it is the kernel thread [{}]; tracer attaches to user processes",
            crate::recording::printable(&stat.comm)
        ),
    })
}

/// A process that may be traced.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its PID as the kernel numbers it (the initial PID namespace): what the BPF programs
    /// and NVML compare with.
    pub pid: u32,
    /// Its PID in this tool's /proc: the same, unless the tool runs inside a PID namespace.
    pub proc_pid: u32,
    /// The tool's PID namespace, when it is not the initial one: how /proc's IDs map to the
    /// kernel's.
    pub pidns: Option<Arc<PidNamespace>>,
    pub comm: String,
    pub cmdline: Vec<String>,
    /// Its parent when it was resolved, in this tool's /proc numbering (0: unknown): read then,
    /// because a process that exits in the window can no longer say.
    pub ppid: u32,
    /// Its CPU cgroup when it was resolved.
    pub cgroup: Option<String>,
    /// Set when the PID given was a thread of another process, which is traced instead.
    pub resolved_from_tid: Option<u32>,
    /// Its main thread has exited (a zombie) while other threads run on.
    pub leader_exited: bool,
    /// A pidfd opened before anything was read from /proc: it pins the process, so the PID
    /// cannot stand for another one while it is held, and it becomes readable when the
    /// process exits. None where pidfd_open is missing (before Linux 5.3).
    pub pidfd: Option<Arc<OwnedFd>>,
}

/// One field of /proc/PID/status, read as bytes: the file also holds the thread's name, which
/// need not be UTF-8 (a non-ASCII name cut at 15 bytes is enough), and that must not make the
/// other fields unreadable.
pub fn status_field(path: &str, name: &str) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    bytes.split(|&b| b == b'\n').find_map(|line| {
        let rest = line.strip_prefix(name.as_bytes())?.strip_prefix(b":")?;
        Some(String::from_utf8_lossy(rest).trim().to_string())
    })
}

/// A thread's counters from /proc: schedstat's first field, and the switch counts of status.
fn read_counts(dir: &std::path::Path) -> Option<ProcCounts> {
    let schedstat = std::fs::read_to_string(dir.join("schedstat")).ok()?;
    let status = std::fs::read(dir.join("status")).ok()?;
    let t_ns = monotonic_ns();
    let field = |name: &[u8]| -> Option<u64> {
        status.split(|&b| b == b'\n').find_map(|line| {
            let v = line.strip_prefix(name)?;
            std::str::from_utf8(v).ok()?.trim().parse().ok()
        })
    };
    Some(ProcCounts {
        t_ns,
        oncpu_ns: schedstat.split_whitespace().next()?.parse().ok()?,
        voluntary: field(b"voluntary_ctxt_switches:")?,
        involuntary: field(b"nonvoluntary_ctxt_switches:")?,
    })
}

/// Opens a pidfd on `pid` (Linux 5.3+); EINVAL for a TID that is not a process's main thread.
fn open_pidfd(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process behind a pidfd still exists (signal 0 checks without sending).
pub fn pidfd_alive(fd: &OwnedFd) -> bool {
    // SAFETY: pidfd_send_signal with signal 0 and no info only checks the target.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn missing(pid: u32) -> TracerError {
    TracerError::NoSuchProcess { pid }
}

/// Any thread of `pid` that has not exited.
fn has_live_thread(pid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read(e.path().join("stat")).is_ok_and(|stat| {
            // The state follows the last ')' (the name may hold any byte but NUL).
            let state = stat
                .iter()
                .rposition(|&b| b == b')')
                .and_then(|i| stat.get(i + 2));
            !matches!(state, Some(b'Z' | b'X') | None)
        })
    })
}

/// The kernel's PID for a PID of this tool's /proc, and the namespace that maps them.
fn to_host(proc_pid: u32) -> anyhow::Result<(u32, Option<Arc<PidNamespace>>)> {
    let Some(inode) = pidns::proc_namespace() else {
        return Ok((proc_pid, None));
    };
    let ns = PidNamespace::open(inode)?;
    let host = ns.host_of(proc_pid).ok_or_else(|| {
        anyhow::anyhow!(
            "PID {proc_pid} was not found in this tool's PID namespace ({inode}) by the task \
             iterator"
        )
    })?;
    Ok((host.tgid, Some(Arc::new(ns))))
}

impl Target {
    /// Checks that `pid` names a live user process and resolves a TID to its process. The
    /// process is pinned by a pidfd before its name is read, and checked to be alive after,
    /// so that a PID reused in between cannot be traced under the first one's name.
    pub fn resolve(pid: u32) -> Result<Self, TracerError> {
        if pid == 0 {
            return Err(TracerError::BadTarget {
                pid,
                why: "PID 0 is the idle task, not a process".into(),
            });
        }
        let tgid: u32 = status_field(&format!("/proc/{pid}/status"), "Tgid")
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| missing(pid))?;
        let pidfd = match open_pidfd(tgid) {
            Ok(fd) => Some(Arc::new(fd)),
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(missing(pid)),
            // ENOSYS before Linux 5.3: the PID is all there is.
            Err(_) => None,
        };
        let proc = Process::new(tgid as i32).map_err(|_| missing(tgid))?;
        let stat = proc.stat().map_err(|_| missing(tgid))?;
        refuse_kernel_thread(pid, &stat)?;
        let exited = stat.state == 'Z' || stat.state == 'X';
        // A main thread that exited stays a zombie until the last thread does: the process
        // still runs.
        let leader_exited = exited && has_live_thread(tgid);
        if exited && !leader_exited {
            return Err(TracerError::BadTarget {
                pid,
                why: format!(
                    "it has exited ({}, a zombie its parent PID {} has not reaped) and has no \
                     threads left to trace: give the PID of a running process",
                    crate::recording::printable(&stat.comm),
                    stat.ppid
                ),
            });
        }
        let cmdline = proc.cmdline().unwrap_or_default();
        let (host_pid, pidns) = to_host(tgid).map_err(|e| TracerError::BadTarget {
            pid,
            why: format!("{e:#}"),
        })?;
        if pidfd.as_deref().is_some_and(|fd| !pidfd_alive(fd)) {
            return Err(missing(tgid));
        }
        Ok(Self {
            pid: host_pid,
            proc_pid: tgid,
            pidns,
            ppid: u32::try_from(stat.ppid).unwrap_or(0),
            cgroup: super::cgroup::cgroup_name(tgid),
            comm: stat.comm,
            cmdline,
            resolved_from_tid: (tgid != pid).then_some(pid),
            leader_exited,
            pidfd,
        })
    }

    /// A process this tool just forked (`tracer run`): pinned by a pidfd the same way.
    pub fn child(pid: u32, argv: &[String]) -> anyhow::Result<Self> {
        let (host_pid, pidns) = to_host(pid)?;
        Ok(Self {
            pid: host_pid,
            proc_pid: pid,
            pidns,
            comm: argv.first().cloned().unwrap_or_default(),
            cmdline: argv.to_vec(),
            ppid: std::process::id(),
            cgroup: super::cgroup::cgroup_name(pid),
            resolved_from_tid: None,
            leader_exited: false,
            pidfd: open_pidfd(pid).ok().map(Arc::new),
        })
    }

    /// The kernel's TID for a TID of this tool's /proc.
    pub fn host_tid(&self, proc_tid: u32) -> Option<u32> {
        match &self.pidns {
            None => Some(proc_tid),
            Some(ns) => ns.host_of(proc_tid).map(|h| h.tid),
        }
    }

    /// The PID in this tool's /proc of a task the kernel calls `host_pid` (None for a task
    /// outside the tool's PID namespace, which its /proc cannot show).
    pub fn proc_pid_of(&self, host_pid: u32) -> Option<u32> {
        match &self.pidns {
            None => Some(host_pid),
            Some(ns) => ns.ns_of(host_pid),
        }
    }

    /// Whether the process is gone (exited, or its PID no longer names it).
    pub fn gone(&self) -> bool {
        match &self.pidfd {
            Some(fd) => !pidfd_alive(fd),
            None => !self.alive(),
        }
    }

    /// The process's threads now, by their kernel TIDs. A thread that exits while being
    /// listed is skipped.
    pub fn threads(&self) -> BTreeMap<u32, ThreadInfo> {
        let mut out = BTreeMap::new();
        let Ok(proc) = Process::new(self.proc_pid as i32) else {
            return out;
        };
        let Ok(tasks) = proc.tasks() else {
            return out;
        };
        for task in tasks.flatten() {
            let (Ok(stat), Some(tid)) = (task.stat(), self.host_tid(task.tid as u32)) else {
                continue;
            };
            out.insert(
                tid,
                ThreadInfo {
                    tid,
                    pid: self.pid,
                    comm: stat.comm,
                    state: stat.state,
                },
            );
        }
        out
    }

    /// The own counters of the process's threads now, by kernel TID: at most `limit` threads
    /// (reading two files each), and how many more there were.
    pub fn thread_counts(&self, limit: usize) -> (BTreeMap<u32, ProcCounts>, u64) {
        let mut out = BTreeMap::new();
        let mut more = 0;
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.proc_pid)) else {
            return (out, more);
        };
        for e in dir.flatten() {
            if out.len() >= limit {
                more += 1;
                continue;
            }
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let (Some(host), Some(c)) = (self.host_tid(tid), read_counts(&e.path())) {
                out.insert(host, c);
            }
        }
        (out, more)
    }

    /// The processes descended from it now (in `table`), by the kernel's PIDs.
    pub fn children(&self, table: &ProcTable) -> Vec<ChildSnapshot> {
        descendants_in(table, self.proc_pid)
            .into_iter()
            .filter_map(|(pid, parent, comm, cpu_ns)| {
                Some(ChildSnapshot {
                    pid: self.host_tid(pid)?,
                    parent: self.host_tid(parent)?,
                    comm,
                    cpu_ns,
                })
            })
            .collect()
    }

    /// True while the process has a thread that has not exited.
    pub fn alive(&self) -> bool {
        has_live_thread(self.proc_pid)
    }

    /// Kernel TID -> TID in this tool's PID namespace, for every task seen in it; None
    /// outside a namespace. Listed again first, to name the threads born since.
    pub fn namespace_ids(&self) -> Option<(u64, BTreeMap<u32, u32>)> {
        let ns = self.pidns.as_ref()?;
        let _ = ns.scan();
        Some((ns.inode, ns.table()))
    }
}

/// The name of any task (a process's is its leader's), for naming preemptors' processes. From
/// /proc/PID/comm: the process's stat file would cost in proportion to its threads, as the
/// kernel adds up every thread's CPU time and faults for it (fs/proc/array.c `do_task_stat`).
/// Each CPU's steal time so far, ns (/proc/stat's eighth value, in USER_HZ ticks).
pub fn cpu_steal() -> Vec<(u32, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    stat.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let cpu: u32 = it.next()?.strip_prefix("cpu")?.parse().ok()?;
            let ticks: u64 = it.nth(7)?.parse().ok()?;
            Some((cpu, ticks * 1_000_000_000 / hz))
        })
        .collect()
}

/// The thread IDs of process `pid` now (empty when it is gone).
pub fn task_ids(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

pub fn comm_of(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let name = raw.strip_suffix(b"\n").unwrap_or(&raw);
    Some(String::from_utf8_lossy(name).into_owned())
}

/// `pid`'s parent, name and CPU time so far (user + system, all its threads), from
/// /proc/PID/stat (clock ticks, USER_HZ).
pub fn process_stat(pid: u32) -> Option<(u32, String, u64)> {
    let s = Process::new(pid as i32).ok()?.stat().ok()?;
    // SAFETY: sysconf has no side effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let cpu_ns = (s.utime + s.stime) * 1_000_000_000 / hz;
    Some((s.ppid as u32, s.comm, cpu_ns))
}

/// When `pid` started, on CLOCK_MONOTONIC (/proc/PID/stat's start time is in clock ticks
/// since boot: to the tick, 10 ms at USER_HZ 100). None when /proc has no such process.
pub fn started_ns(pid: u32) -> Option<u64> {
    let s = Process::new(pid as i32).ok()?.stat().ok()?;
    // SAFETY: sysconf has no side effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let boot_ns = s.starttime * 1_000_000_000 / hz;
    let suspended =
        crate::sources::clock::boottime_ns().saturating_sub(crate::sources::clock::monotonic_ns());
    Some(boot_ns.saturating_sub(suspended))
}

/// Every process of the host (by this tool's /proc) with its parent, name and CPU time so far:
/// one pass over /proc, a file per process, so taken once for all the members' descendants.
pub struct ProcTable {
    all: BTreeMap<u32, (u32, String, u64)>,
    kids: BTreeMap<u32, Vec<u32>>,
}

impl ProcTable {
    pub fn read() -> Self {
        let all: BTreeMap<u32, (u32, String, u64)> = match std::fs::read_dir("/proc") {
            Ok(dir) => dir
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|p| Some((p, process_stat(p)?)))
                .collect(),
            Err(_) => BTreeMap::new(),
        };
        let mut kids: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (&p, (ppid, _, _)) in &all {
            kids.entry(*ppid).or_default().push(p);
        }
        Self { all, kids }
    }
}

/// Every process whose parent chain leads to `pid`, with its parent, name and CPU time so far:
/// one pass over /proc.
pub fn descendants(pid: u32) -> Vec<(u32, u32, String, u64)> {
    descendants_in(&ProcTable::read(), pid)
}

/// `descendants` from a table already read.
pub fn descendants_in(table: &ProcTable, pid: u32) -> Vec<(u32, u32, String, u64)> {
    let (all, kids) = (&table.all, &table.kids);
    let mut out = Vec::new();
    let mut todo = vec![pid];
    let mut seen = std::collections::BTreeSet::from([pid]);
    while let Some(p) = todo.pop() {
        for &c in kids.get(&p).into_iter().flatten() {
            if !seen.insert(c) {
                continue;
            }
            let (ppid, comm, cpu) = all[&c].clone();
            out.push((c, ppid, comm, cpu));
            todo.push(c);
        }
    }
    out
}

/// This process's resident memory now (/proc/self/statm), bytes.
pub fn own_rss() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64
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
