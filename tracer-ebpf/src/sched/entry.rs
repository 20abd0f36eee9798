//! A target thread's entry: found, or created and initialised on first sight, in its slot of
//! `THREAD_SLOTS` or else in `THREADS`; and the reading of a task's name (`Comm`), which a new
//! entry starts with and the other records that name a task use too.

use aya_ebpf::helpers::{bpf_probe_read_kernel_buf, generated};
use tracer_common::{COMM_LEN, Counter, ThreadState, ThreadStats};

use super::{BPF_NOEXIST, NO_CPU};
use crate::maps::{THREAD_SLOTS, THREAD_TEMPLATE, THREADS, config, count};
use crate::zero::zero_words;

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

/// A new entry's words after the first (which holds the TID and TGID).
type EntryTail = [u64; size_of::<ThreadStats>() / 8 - 1];
const _: () = assert!(
    ThreadState::Unknown as u32 == 0
        && align_of::<ThreadStats>() == 8
        && size_of::<ThreadStats>().is_multiple_of(8)
        && core::mem::offset_of!(ThreadStats, tid) == 0
        && core::mem::offset_of!(ThreadStats, tgid) == 4
        && core::mem::offset_of!(ThreadStats, comm) == 8
);

/// Sets every field of a new entry for `tid`: zero, but for its ids, name and CPUs. Zeroed a
/// word at a time (`zero.rs`): field by field, it was memset calls that the verifier walked
/// byte by byte at every path through an entry's creation (the classic switch program with the
/// counter reads went over its million instructions), and fields it left alone kept a dead
/// thread's values in a reused slot (its run of waits by one waker went to the next thread).
#[inline(always)]
fn init(t: &mut ThreadStats, tid: u32, tgid: u32, comm: Comm) {
    // SAFETY: the entry from its second word on (`EntryTail`), a pointer into the whole entry.
    unsafe {
        zero_words(
            (t as *mut ThreadStats)
                .cast::<u64>()
                .add(1)
                .cast::<EntryTail>(),
        )
    };
    read_comm(&mut t.comm, comm);
    // Volatile too, so that the TID is written after every other field (the state, Unknown,
    // is 0: zeroed above): a slot whose TID is 0 is free.
    // SAFETY: fields of the entry.
    unsafe {
        (&raw mut t.tgid).write_volatile(tgid);
        (&raw mut t.wait_cpu).write_volatile(NO_CPU);
        (&raw mut t.last_cpu).write_volatile(NO_CPU);
        (&raw mut t.tid).write_volatile(tid);
    }
}

/// The thread's entry if it has one (its slot, else the hash map); none is made.
#[inline(always)]
pub(super) fn existing(tid: u32) -> Option<&'static mut ThreadStats> {
    if let Some(s) = THREAD_SLOTS.get_ptr_mut(tid & config!(thread_slot_mask)) {
        let s = unsafe { &mut *s };
        if s.tid == tid {
            return Some(s);
        }
    }
    THREADS.get_ptr_mut(tid).map(|t| unsafe { &mut *t })
}

/// The thread's entry, created on first sight: its slot if free or its own, else the hash map.
#[inline(always)]
pub(super) fn thread(tid: u32, tgid: u32, comm: Comm) -> Option<&'static mut ThreadStats> {
    if let Some(t) = existing(tid) {
        return Some(t);
    }
    // (An array lookup the verifier inlines: a few instructions, on a new thread's path only.)
    if let Some(s) = THREAD_SLOTS.get_ptr_mut(tid & config!(thread_slot_mask)) {
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
