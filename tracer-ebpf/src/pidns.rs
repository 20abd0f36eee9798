//! A task iterator (`bpf_iter_task`, Linux 5.8+) that finds every task of one PID namespace
//! with its IDs there and in the initial namespace. The tool inside a container reads PIDs
//! from its own /proc, while the scheduler programs see `task->tgid`, the initial namespace's:
//! the loader runs this once before loading them, to learn the target's real TGID, and again
//! at the end, to name the threads born meanwhile. Cost does not matter here (it runs twice a
//! recording), so every load goes through `bpf_probe_read_kernel`.

use core::ffi::c_void;

use aya_ebpf::{helpers::bpf_probe_read_kernel, macros::map, maps::HashMap};
use tracer_common::{MAX_PIDNS_LEVELS, MAX_PIDNS_TASKS, PidNsIds};

use crate::maps::config;

/// Host TID -> the task's TGID (host) and TID in the namespace.
#[map]
pub static PIDNS_IDS: HashMap<u32, PidNsIds> =
    HashMap::with_max_entries(MAX_PIDNS_TASKS, BPF_F_NO_PREALLOC);

/// Entries are allocated as they are inserted: the map is sized for the largest namespace
/// but costs only what this one holds.
const BPF_F_NO_PREALLOC: u32 = 1;

#[inline(always)]
fn read<T>(base: *const u8, off: u32) -> Option<T> {
    unsafe { bpf_probe_read_kernel(base.wrapping_add(off as usize) as *const T).ok() }
}

/// `ctx` is `struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct *task; }`;
/// `task` is null once the iteration is over.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn pidns_tasks(ctx: *mut c_void) -> i32 {
    let task: *const u8 = unsafe { core::ptr::read_volatile((ctx as *const *const u8).add(1)) };
    if !task.is_null() {
        let _ = record(task);
    }
    0
}

/// Records `task` if its `struct pid` has a number in the namespace whose inode is
/// `pidns_inum` (`pid->numbers[level]`, one `struct upid { nr, ns }` per level up from the
/// initial namespace).
fn record(task: *const u8) -> Option<()> {
    let tgid: u32 = read(task, config!(task_tgid_off))?;
    let tid: u32 = read(task, config!(task_pid_off))?;
    let pid: *const u8 = read(task, config!(task_thread_pid_off))?;
    let level: u32 = read(pid, config!(pid_level_off))?;
    let want = config!(pidns_inum);
    for l in 0..MAX_PIDNS_LEVELS {
        if l > level {
            break;
        }
        let upid = config!(pid_numbers_off) + l * config!(upid_size);
        let ns: *const u8 = read(pid, upid + config!(upid_ns_off))?;
        let inum: u32 = read(ns, config!(pidns_inum_off))?;
        if inum == want {
            let nr: u32 = read(pid, upid + config!(upid_nr_off))?;
            let ids = PidNsIds { tgid, ns_tid: nr };
            let _ = PIDNS_IDS.insert(tid, ids, 0);
            break;
        }
    }
    Some(())
}
