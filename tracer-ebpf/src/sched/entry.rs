//! A target thread's entry: found, or created and initialised on first sight, in its slot of
//! `THREAD_SLOTS` or else in `THREADS`; and the reading of a task's name (`Comm`), which a new
//! entry starts with and the other records that name a task use too.

use aya_ebpf::helpers::{bpf_probe_read_kernel_buf, generated};
use tracer_common::{COMM_LEN, Counter, ThreadState, ThreadStats};

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

/// Sets every field of a new entry for `tid`: zero, but for its ids, name and CPUs. Zeroed a
/// word at a time with volatile stores: plain ones (field by field, or `= [0; N]`) were merged
/// into calls to a byte-by-byte memset, which the verifier walked at every path through an
/// entry's creation, hundreds of instructions each (the classic tracepoints' switch program
/// with the counter reads went over its million).
#[inline(always)]
fn init(t: &mut ThreadStats, tid: u32, tgid: u32, comm: Comm) {
    let words = (t as *mut ThreadStats).cast::<u64>();
    // Word 0 holds the TID, written last: a slot whose TID is 0 is free (`thread`).
    for i in 1..size_of::<ThreadStats>() / 8 {
        // SAFETY: inside the entry, which is 8-aligned and a whole number of words (asserted
        // below).
        unsafe { words.add(i).write_volatile(0) };
    }
    t.tgid = tgid;
    read_comm(&mut t.comm, comm);
    t.state = ThreadState::Unknown as u32;
    t.first_state = ThreadState::Unknown as u32;
    t.wait_cpu = NO_CPU;
    t.last_cpu = NO_CPU;
    t.tid = tid;
}
const _: () = assert!(
    core::mem::align_of::<ThreadStats>() == 8
        && size_of::<ThreadStats>().is_multiple_of(8)
        && core::mem::offset_of!(ThreadStats, tid) == 0
        && core::mem::offset_of!(ThreadStats, tgid) == 4
);

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
