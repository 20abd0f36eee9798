//! A target thread's entry: found, or created and initialised on first sight, in its slot of
//! `THREAD_SLOTS` or else in `THREADS`; and the reading of a task's name (`Comm`), which a new
//! entry starts with and the other records that name a task use too.

use aya_ebpf::helpers::{bpf_probe_read_kernel_buf, generated};
use tracer_common::{COMM_LEN, Counter, RUNQ_HIST_SLOTS, ThreadState, ThreadStats};

use super::{BPF_NOEXIST, NO_CPU};
use crate::maps::{THREAD_SLOTS, THREAD_TEMPLATE, THREADS, config, count};

/// Where to take a task's name from.
#[derive(Clone, Copy)]
pub enum Comm {
    /// The task is `current`.
    Current,
    /// A kernel address holding the 16-byte name (in a task_struct or a trace record).
    At(*const u8),
}

pub(super) fn read_comm(dst: &mut [u8; COMM_LEN], from: Comm) {
    match from {
        Comm::Current => unsafe {
            generated::bpf_get_current_comm(dst.as_mut_ptr().cast(), COMM_LEN as u32);
        },
        Comm::At(src) => {
            if !src.is_null() {
                let _ = unsafe { bpf_probe_read_kernel_buf(src, dst) };
            }
        }
    }
}

/// Sets every field of a new entry for `tid`.
#[inline(always)]
fn init(t: &mut ThreadStats, tid: u32, tgid: u32, comm: Comm) {
    t.tgid = tgid;
    t.comm = [0; COMM_LEN];
    read_comm(&mut t.comm, comm);
    t.state = ThreadState::Unknown as u32;
    t.first_state = ThreadState::Unknown as u32;
    t.first_ts_ns = 0;
    t.state_ts_ns = 0;
    t.created_ts_ns = 0;
    t.exited_ts_ns = 0;
    t.voluntary_switches = 0;
    t.involuntary_switches = 0;
    t.migrations = 0;
    t.wakeups = 0;
    t.oncpu_ns = 0;
    t.runq_wait_ns = 0;
    t.blocked_ns = 0;
    t.runq_waits = 0;
    t.runq_wait_max_ns = 0;
    t.wait_cpu = NO_CPU;
    t.last_cpu = NO_CPU;
    t.parent_tid = 0;
    t.flags = 0;
    t.caused_wait_ns = 0;
    t.caused_slices = 0;
    t.seen_exec_ns = 0;
    t.seen_nvcsw = 0;
    t.seen_nivcsw = 0;
    t.seen_migrations = 0;
    t.runq_hist = [0; RUNQ_HIST_SLOTS];
    t.waker_tid = 0;
    t.waker_tgid = 0;
    t.waker_syscall = 0;
    t.waker_flags = 0;
    t.waker_comm = [0; COMM_LEN];
    t.tid = tid;
}

/// The thread's entry, created on first sight: its slot if free or its own, else the hash map.
#[inline(always)]
pub(super) fn thread(tid: u32, tgid: u32, comm: Comm) -> Option<&'static mut ThreadStats> {
    let slot = THREAD_SLOTS.get_ptr_mut(tid & config!(thread_slot_mask));
    if let Some(s) = slot {
        let s = unsafe { &mut *s };
        if s.tid == tid {
            return Some(s);
        }
    }
    if let Some(t) = THREADS.get_ptr_mut(tid) {
        return Some(unsafe { &mut *t });
    }
    if let Some(s) = slot {
        // Free (userspace frees the slots of dead threads), and the thread has no entry in
        // the hash map, checked just above: a thread never has two entries. Two new threads
        // whose TIDs share a slot, first seen on two CPUs in the same instant, could both
        // take it; nothing cheaper than an atomic exchange (which this eBPF target lacks)
        // would rule that out.
        let s = unsafe { &mut *s };
        if s.tid == 0 {
            init(s, tid, tgid, comm);
            return Some(s);
        }
    }
    let template = THREAD_TEMPLATE.get_ptr_mut(0)?;
    let t = unsafe { &mut *template };
    init(t, tid, tgid, comm);
    // NOEXIST: if another CPU created it meanwhile, keep theirs. Passed by reference: by value
    // it would be copied onto the stack first.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let inserted = THREADS.insert(tid, &*t, BPF_NOEXIST);
    if inserted.is_err() && THREADS.get_ptr_mut(tid).is_none() {
        count(Counter::ThreadMapFull);
        anomaly!(
            "thread map full: tid {} of tgid {} is not tracked",
            tid,
            tgid
        );
        return None;
    }
    THREADS.get_ptr_mut(tid).map(|t| unsafe { &mut *t })
}
