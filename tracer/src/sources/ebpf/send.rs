//! Sending the batches of idle CPUs from userspace (tracer-ebpf `send.rs`), so that the CPUs
//! need not send theirs at every switch to idle: where threads hand work to each other across
//! otherwise idle CPUs, that send was a ring-buffer output per handover.
//!
//! A thread of its own, pinned to one CPU (the "sender CPU"), runs `send_batch` on every other
//! online CPU when asked (at each window's cut) with BPF_PROG_TEST_RUN and
//! BPF_F_TEST_RUN_ON_CPU (Linux 5.10): the kernel runs it there in an IPI, with interrupts off,
//! as the batch requires. On the caller's own CPU it would run with interrupts on, so the
//! sender CPU keeps sending its own batch when idle (`IDLE_SENDER` = its number + 1). Where the
//! kernel cannot run a program on another CPU (before 5.10), or there is one CPU, nothing
//! changes: every CPU sends when idle.

use std::{
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    sync::mpsc,
    thread::JoinHandle,
};

use anyhow::{Context as _, Result, bail};
use aya::{Ebpf, maps::Array, programs::RawTracePoint};

/// `union bpf_attr`'s `test` member (BPF_PROG_TEST_RUN), up to `batch_size`.
#[repr(C)]
#[derive(Default)]
struct TestRun {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    /// The struct's padding, explicit: the kernel refuses an attribute whose bytes past the
    /// last field it knows are not zero, and padding left to the compiler may not be.
    _pad: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;
/// How long a window's cut waits for the idle CPUs' batches to be sent (a few microseconds a
/// CPU when the thread gets its CPU).
const WAIT: std::time::Duration = std::time::Duration::from_millis(100);
const BPF_F_TEST_RUN_ON_CPU: u32 = 1;

/// Runs the program on `cpu`; its return value.
fn run_on(prog: &OwnedFd, cpu: u32) -> std::io::Result<u32> {
    let mut attr = TestRun {
        prog_fd: prog.as_raw_fd() as u32,
        flags: BPF_F_TEST_RUN_ON_CPU,
        cpu,
        ..Default::default()
    };
    // SAFETY: the attribute is a valid `bpf_attr.test` of the size passed, alive for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &raw mut attr,
            size_of::<TestRun>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr.retval)
}

/// The thread that sends idle CPUs' batches; dropped, it ends (before the programs go).
pub struct IdleSender {
    asks: Option<mpsc::SyncSender<mpsc::SyncSender<()>>>,
    thread: Option<JoinHandle<()>>,
    /// The CPU it runs on, which still sends its own batch when idle.
    pub cpu: u32,
}

impl IdleSender {
    /// Loads `send_batch`, starts the thread and, once a run on another CPU has worked, tells
    /// the programs that only its CPU sends when idle. An error leaves every CPU sending its
    /// own (the behaviour before), and says why.
    pub fn start(ebpf: &mut Ebpf) -> Result<Self> {
        let cpus = online_cpus()?;
        let allowed = allowed_cpus();
        let Some(&mine) = cpus.iter().find(|c| allowed.contains(c)) else {
            bail!("no online CPU this process may run on");
        };
        if cpus.len() < 2 {
            bail!("one CPU: it sends its own batch");
        }
        let prog: &mut RawTracePoint = ebpf
            .program_mut("send_batch")
            .context("send_batch program")?
            .try_into()?;
        prog.load().context("loading send_batch")?;
        let fd = prog.fd()?.as_fd().try_clone_to_owned()?;
        let others: Vec<u32> = cpus.into_iter().filter(|&c| c != mine).collect();
        // Before anything relies on it: a run on another CPU (with every CPU still sending its
        // own, it sends nothing).
        run_on(&fd, others[0]).context("running a program on another CPU (Linux 5.10)")?;
        let (asks, asked) = mpsc::sync_channel::<mpsc::SyncSender<()>>(1);
        let (ready, pinned) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("tracer-idle".into())
            .spawn(move || {
                let _ = ready.send(crate::workload::server::set_affinity(0, &[mine as usize]));
                for done in asked {
                    // Moved off its CPU (its cpuset changed), a run on the CPU it is on would
                    // happen with interrupts on: none then.
                    // SAFETY: no arguments.
                    if unsafe { libc::sched_getcpu() } == mine as i32 {
                        for &cpu in &others {
                            // An offline CPU (hotplug) has nothing to send.
                            let _ = run_on(&fd, cpu);
                        }
                    }
                    let _ = done.send(());
                }
            })?;
        let sender = Self {
            asks: Some(asks),
            thread: Some(thread),
            cpu: mine,
        };
        pinned
            .recv()
            .context("the idle-batch thread ended")?
            .context("pinning the idle-batch thread")?;
        let mut idle: Array<_, u32> =
            Array::try_from(ebpf.map_mut("IDLE_SENDER").context("IDLE_SENDER map")?)?;
        idle.set(0, mine + 1, 0)?;
        Ok(sender)
    }

    /// Sends every idle CPU's batch now (their records then reach the ring buffer within
    /// microseconds). Waits at most `WAIT`: a thread kept off its CPU (a real-time task pinned
    /// there) must not hold up the window; records it did not send in time are counted late.
    pub fn send(&self) {
        let Some(asks) = &self.asks else { return };
        let (done, wait) = mpsc::sync_channel(1);
        // Full: the last ask is still being served.
        if asks.try_send(done).is_ok() {
            let _ = wait.recv_timeout(WAIT);
        }
    }
}

impl Drop for IdleSender {
    fn drop(&mut self) {
        self.asks = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn online_cpus() -> Result<Vec<u32>> {
    Ok(aya::util::online_cpus()
        .map_err(|(path, e)| anyhow::anyhow!("reading {path}: {e}"))?
        .into_iter()
        .collect())
}

/// The CPUs this process may run on (its affinity: a container's cpuset, taskset).
fn allowed_cpus() -> Vec<u32> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return vec![];
    }
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .map(|c| c as u32)
        .collect()
}
