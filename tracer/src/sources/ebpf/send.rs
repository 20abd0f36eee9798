//! Sending the batches of idle CPUs from userspace (tracer-ebpf `send.rs`), so that the CPUs
//! need not send theirs at every switch to idle: where threads hand work to each other across
//! otherwise idle CPUs, that send was a ring-buffer output per handover.
//!
//! A single recording (`attach`, `run`) needs nothing from here: every CPU leaves its batch
//! when it goes idle, and the end takes what is left from the map. A watch needs each window's
//! records when the window is assembled: a thread of its own, pinned to one CPU (the "sender
//! CPU"), runs `send_batch` on other CPUs when asked (once a window, when its records are
//! taken: `session/windows.rs` `end_cut`) with BPF_PROG_TEST_RUN and BPF_F_TEST_RUN_ON_CPU
//! (Linux 5.10): the kernel runs it there in an IPI, with interrupts off, as the batch
//! requires. Only CPUs whose batch holds records are
//! asked (the caller reads the batches first), so an idle host is not interrupted at all.
//! Those CPUs leave their batch to it when they go idle (`IDLE_SENDER`); the sender CPU, and
//! CPUs kept free of interruptions (`isolated`, `nohz_full`), still send their own. Where the
//! kernel cannot run a program on another CPU (before 5.10), or there is one CPU, every CPU of
//! a watch sends its own when idle.

use std::{
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use aya::{Ebpf, maps::Array, programs::RawTracePoint};

use crate::sources::topology::{cpu_list, set_affinity};

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
const BPF_F_TEST_RUN_ON_CPU: u32 = 1;
/// How long `end_cut` waits for the batches to be sent (a few microseconds a CPU when
/// the thread gets its CPU), and the end for the thread to stop.
const WAIT: Duration = Duration::from_millis(100);

/// Loads `send_batch` and checks that the kernel runs a program on a given CPU (Linux 5.10),
/// without interrupting another: a run on the calling thread's own CPU, which the program
/// leaves alone (the caller's ID is its own). Should the thread move in between, the run is an
/// IPI to the CPU it left, and sends that CPU's batch, as a watch's sender would.
pub fn load(ebpf: &mut Ebpf) -> Result<OwnedFd> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut("send_batch")
        .context("send_batch program")?
        .try_into()?;
    if prog.fd().is_err() {
        prog.load().context("loading send_batch")?;
    }
    let fd = prog.fd()?.as_fd().try_clone_to_owned()?;
    // SAFETY: no arguments.
    let cpu = unsafe { libc::sched_getcpu() } as u32;
    run_on(&fd, cpu, gettid()).context("running a program on a given CPU (Linux 5.10)")?;
    Ok(fd)
}

/// Runs the program on `cpu`, telling it the caller's thread ID (in whose context it must do
/// nothing: that is a run on the caller's own CPU, with interrupts on); its return value.
fn run_on(prog: &OwnedFd, cpu: u32, caller: u32) -> std::io::Result<u32> {
    let ctx = [u64::from(caller)];
    let mut attr = TestRun {
        prog_fd: prog.as_raw_fd() as u32,
        ctx_size_in: size_of_val(&ctx) as u32,
        ctx_in: ctx.as_ptr() as u64,
        flags: BPF_F_TEST_RUN_ON_CPU,
        cpu,
        ..Default::default()
    };
    // SAFETY: the attribute is a valid `bpf_attr.test` of the size passed, and it and the
    // context it points to live for the call.
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

enum Ask {
    /// Send the batches of these CPUs; answered with why it no longer can, if so.
    Send(Vec<u32>, mpsc::SyncSender<Result<(), String>>),
    Stop(mpsc::SyncSender<()>),
}

/// The thread that sends idle CPUs' batches. Dropped, it ends once it has served what it was
/// asked (not waited for: a thread kept off its CPU must not hold up the exit; the program it
/// runs is never attached and goes with the process).
pub struct IdleSender {
    asks: mpsc::SyncSender<Ask>,
    /// Set by `stop`, read before each run: an ask still queued when the thread is stopped
    /// (it was starved past `WAIT`) sends nothing.
    stopped: Arc<AtomicBool>,
    /// The CPU it runs on, which still sends its own batch when idle.
    pub cpu: u32,
    /// The CPUs that leave their batch to it.
    pub left: Vec<u32>,
}

impl IdleSender {
    /// Starts the thread, which runs `send_batch` (`fd`, from `load`) for the CPUs that leave
    /// their batch to it; its own CPU and those kept free of interruptions send their own. An
    /// error leaves every CPU sending its own, and says why.
    pub fn start(ebpf: &mut Ebpf, fd: OwnedFd, possible: u32) -> Result<Self> {
        let kept_free: Vec<u32> = ["isolated", "nohz_full"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(format!("/sys/devices/system/cpu/{f}")).ok())
            .flat_map(|l| cpu_list(&l))
            .collect();
        let allowed = allowed_cpus();
        let online = online_cpus();
        let Some(&mine) = online
            .iter()
            .find(|c| allowed.contains(c) && !kept_free.contains(c))
        else {
            bail!("no online CPU this process may run on that is not kept free");
        };
        let left: Vec<u32> = (0..possible)
            .filter(|c| *c != mine && !kept_free.contains(c))
            .collect();
        if !online.iter().any(|c| left.contains(c)) {
            bail!("no other CPU to send the batches of");
        }
        let (asks, asked) = mpsc::sync_channel::<Ask>(1);
        let (ready, checked) = mpsc::sync_channel(1);
        let sent_to = left.clone();
        let stopped = Arc::new(AtomicBool::new(false));
        let stop_seen = stopped.clone();
        std::thread::Builder::new()
            .name("tracer-idle".into())
            .spawn(move || {
                let check =
                    set_affinity(0, &[mine as usize]).context("pinning the idle-batch thread");
                let ok = check.is_ok();
                let _ = ready.send(check);
                if ok {
                    serve(&fd, mine, &sent_to, &stop_seen, asked);
                }
            })?;
        checked
            .recv_timeout(Duration::from_secs(1))
            .context("the idle-batch thread did not start")??;
        // Every CPU leaves its batch until now (`SchedProbes::load`): the thread's and the
        // kept-free CPUs send their own from here.
        let keep: Vec<u32> = (0..possible).filter(|c| !left.contains(c)).collect();
        set_left(ebpf, &keep, 0)?;
        Ok(Self {
            asks,
            stopped,
            cpu: mine,
            left,
        })
    }

    /// Sends the batches of `cpus` (those of them left to it: `send_on`) now: their records are in the
    /// ring buffer when this returns. Waits at most `WAIT`: a thread kept off its CPU (a
    /// real-time task pinned there) must not hold up the window; records not sent in time are
    /// counted late. An error says why it can send no more (its thread has left its CPU, or
    /// the kernel refused a run): the CPUs must send their own again.
    pub fn send(&self, cpus: Vec<u32>) -> Result<(), String> {
        // Asked even with no CPU to send for: the thread checks that it is still on its CPU.
        let (done, wait) = mpsc::sync_channel(1);
        // Full: the last ask is still being served.
        if self.asks.try_send(Ask::Send(cpus, done)).is_err() {
            return Ok(());
        }
        wait.recv_timeout(WAIT).unwrap_or(Ok(()))
    }

    /// Stops the thread (waiting at most `WAIT`), so that nothing is sent once the last
    /// records have been taken.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let (done, wait) = mpsc::sync_channel(1);
        if self.asks.try_send(Ask::Stop(done)).is_ok() {
            let _ = wait.recv_timeout(WAIT);
        }
    }
}

/// The calling thread's ID. The system call, not glibc's wrapper: the release binary links
/// against glibc 2.28, which has none (2.30 added it).
fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// The thread: each ask, `send_batch` on the CPUs asked for that are online and left to it.
fn serve(fd: &OwnedFd, mine: u32, left: &[u32], stopped: &AtomicBool, asked: mpsc::Receiver<Ask>) {
    let me = gettid();
    for ask in asked {
        match ask {
            Ask::Send(cpus, done) => {
                let _ = done.send(send_on(fd, mine, me, left, stopped, cpus));
            }
            Ask::Stop(done) => {
                let _ = done.send(());
                return;
            }
        }
    }
}

/// One ask: `send_batch` on each of `cpus` that is online and left to the thread.
fn send_on(
    fd: &OwnedFd,
    mine: u32,
    me: u32,
    left: &[u32],
    stopped: &AtomicBool,
    cpus: Vec<u32>,
) -> Result<(), String> {
    // SAFETY: no arguments.
    if unsafe { libc::sched_getcpu() } != mine as i32 {
        return Err("its thread was moved off its CPU (a cpuset change?)".into());
    }
    // Read each time: an offline CPU cannot be asked.
    let online = online_cpus();
    for cpu in cpus
        .into_iter()
        .filter(|c| left.contains(c) && online.contains(c))
    {
        if stopped.load(Ordering::SeqCst) {
            break;
        }
        match run_on(fd, cpu, me) {
            Ok(_) => {}
            // Gone offline since it was read: its records went with it.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
            Err(e) => return Err(format!("running send_batch on CPU {cpu}: {e}")),
        }
    }
    Ok(())
}

/// Marks `cpus` as leaving their batch to userspace (1) or sending it when idle (0).
pub fn set_left(ebpf: &mut Ebpf, cpus: &[u32], value: u32) -> Result<()> {
    let mut idle: Array<_, u32> =
        Array::try_from(ebpf.map_mut("IDLE_SENDER").context("IDLE_SENDER map")?)?;
    for &c in cpus {
        idle.set(c, value, 0)?;
    }
    Ok(())
}

fn online_cpus() -> Vec<u32> {
    aya::util::online_cpus().unwrap_or_default()
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
