//! A target thread's life outside the scheduler's switches and wakeups: processes forked or
//! moved into a target cgroup joining the set, migrations between CPUs, thread creation, exec
//! and exit.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use tracer_common::{
    COMM_LEN, ChildProcess, Counter, EventKind, FLAG_CREATED, FLAG_EXECED, FLAG_EXITED, FLAG_MOVED,
    MigrationKey, ThreadState,
};

use super::counts::{counts_of, remember};
use super::cpu_wait::{waiter_add, waiter_remove};
use super::{BPF_NOEXIST, Comm, NO_CPU, enter, event, leave, read_comm, thread};
use crate::maps::{Batch, CHILDREN, MIGRATIONS, config, count, emit};

/// A fork that made a new process (`child`, its TGID) of `parent`, kept when the parent is a
/// member of the target set or a process one forked. Following children, the child joins the
/// set here, before it first runs, and its first thread is the target's from its birth:
/// returns true, and the caller records that thread. Otherwise it is only noted: the summary
/// names it, and its preemption of the target as its own children's.
#[inline(always)]
pub fn on_process_fork(child: u32, parent: u32, comm: Comm) -> bool {
    let member = crate::maps::is_member(parent);
    if !member && crate::maps::is_member(child) {
        // A TGID a member had, reused by a process outside the set after the member exited.
        crate::maps::set_member(child, false);
    }
    if !member && CHILDREN.get_ptr(parent).is_none() {
        return false;
    }
    let joins = member && config!(follow_children) != 0;
    if joins {
        crate::maps::set_member(child, true);
    }
    let mut c = ChildProcess {
        parent,
        _pad: 0,
        created_ns: unsafe { bpf_ktime_get_ns() },
        comm: [0; COMM_LEN],
    };
    read_comm(&mut c.comm, comm);
    // An entry already there is of a process that had this PID before and exited (userspace
    // takes those out a window after their exit): the new one replaces it. -E2BIG: the map is
    // full.
    if CHILDREN.insert(child, c, 0) == Err(-7) {
        count(Counter::ChildMapFull);
        anomaly!(
            "child map full: the fork of {} by {} is not noted",
            child,
            parent
        );
    }
    joins
}

/// A task moved into a cgroup (`id` in hierarchy `root`). A process whose leader moves into a
/// cgroup of `TARGET_CGROUPS` joins the set, noted as a joined process with the time (its
/// parent unknown here: 0). Its other threads move with it (cgroup.procs) and are members
/// through their TGID; a lone thread moved (cgroup.threads, v1 `tasks`) is not followed.
#[inline(always)]
pub fn on_cgroup_attach(id: u64, root: u32, pid: u32, tgid: u32, comm: Comm) {
    if pid != tgid || crate::maps::is_member(tgid) {
        return;
    }
    match unsafe { crate::maps::TARGET_CGROUPS.get(id) } {
        Some(r) if *r == root => {}
        _ => return,
    }
    crate::maps::set_member(tgid, true);
    let mut c = ChildProcess {
        parent: 0,
        _pad: 0,
        created_ns: unsafe { bpf_ktime_get_ns() },
        comm: [0; COMM_LEN],
    };
    read_comm(&mut c.comm, comm);
    if CHILDREN.insert(tgid, c, 0).is_err() {
        count(Counter::ChildMapFull);
        anomaly!(
            "child map full: {}'s move into a target cgroup is not noted",
            tgid
        );
    }
}

/// `set_task_cpu` on a target thread.
#[inline(always)]
pub fn on_migrate(tid: u32, tgid: u32, from: u32, to: u32, comm: Comm) {
    if from == to {
        return;
    }
    let Some(t) = thread(tid, tgid, comm) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    t.migrations += 1;
    // A runnable thread moved by the load balancer now waits in another run queue, and its
    // wait is a migration's.
    if t.state == ThreadState::Runnable as u32 {
        t.flags |= FLAG_MOVED;
        if t.wait_cpu != NO_CPU {
            waiter_remove(t.wait_cpu, now);
            waiter_add(to, now);
            t.wait_cpu = to;
        }
    }
    let key = MigrationKey {
        tid,
        from_cpu: from,
        to_cpu: to,
        _pad: 0,
    };
    match MIGRATIONS.get_ptr_mut(key) {
        Some(n) => unsafe { *n += 1 },
        None => {
            if MIGRATIONS.insert(key, 1, BPF_NOEXIST).is_err() {
                count(Counter::MigrationMapFull);
                anomaly!(
                    "migration map full: tid {} CPU {} -> {} not noted",
                    tid,
                    from,
                    to
                );
            }
        }
    }
    if config!(transitions) != 0
        && let Some(mut out) = Batch::get()
    {
        out.push(&event(now, tid, EventKind::Migrate, to, from, 0));
    }
}

/// A new thread of the member `tgid`, created by `parent` (a thread of its own process, or of
/// the member that forked it).
#[inline(always)]
pub fn on_thread_new(tid: u32, tgid: u32, parent: u32, comm: Comm) {
    let Some(t) = thread(tid, tgid, comm) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    t.flags |= FLAG_CREATED;
    t.created_ts_ns = now;
    t.parent_tid = parent;
    // Created now: nothing before this belongs to it.
    t.first_state = ThreadState::New as u32;
    t.first_ts_ns = now;
    enter(t, ThreadState::New, now);
    emit(&event(now, tid, EventKind::ThreadNew, NO_CPU, parent, 0));
}

/// The target's thread `old_tid` exec'd (`tid`, which is `current`, is its TID now). When it
/// was not the main thread, the kernel gave it the main thread's TID, which is the TGID, once
/// every other thread (the old main one too) had exited (`de_thread`, fs/exec.c): its own
/// entry ends here, and the main TID's, which that exit marked dead, goes on as this thread,
/// running. Without this the old TID stayed "running" to the end of the window and the main
/// thread, alive, showed as exited.
#[inline(always)]
pub fn on_exec(tid: u32, tgid: u32, old_tid: u32, task: *const u8) {
    let counts = counts_of(task);
    let now = unsafe { bpf_ktime_get_ns() };
    if old_tid != tid
        && let Some(t) = thread(old_tid, tgid, Comm::Current)
    {
        leave(t, now, ThreadState::Running);
        t.flags |= FLAG_EXITED | FLAG_EXECED;
        t.exited_ts_ns = now;
        enter(t, ThreadState::Dead, now);
    }
    let Some(t) = thread(tid, tgid, Comm::Current) else {
        return;
    };
    if old_tid != tid {
        // The dead main thread's interval is over; this one is running from now on.
        t.flags &= !FLAG_EXITED;
        t.exited_ts_ns = 0;
        t.wait_cpu = NO_CPU;
        if t.state == ThreadState::Unknown as u32 {
            t.first_state = ThreadState::Running as u32;
            t.first_ts_ns = now;
        }
        enter(t, ThreadState::Running, now);
        remember(t, counts.as_ref());
        emit(&event(now, tid, EventKind::Exec, NO_CPU, old_tid, 0));
    }
    // The new program's name.
    read_comm(&mut t.comm, Comm::Current);
}

/// The target thread `tid`, which is `current`, exits.
#[inline(always)]
pub fn on_thread_exit(tid: u32, tgid: u32) {
    let Some(t) = thread(tid, tgid, Comm::Current) else {
        return;
    };
    let now = unsafe { bpf_ktime_get_ns() };
    t.flags |= FLAG_EXITED;
    t.exited_ts_ns = now;
    // Keep the name it had last, for the report.
    read_comm(&mut t.comm, Comm::Current);
    emit(&event(now, tid, EventKind::ThreadExit, NO_CPU, 0, 0));
}
