//! The programs' load-time configuration.

use crate::{BATCH_BYTES, NO_REQUEST_ID};

/// Load-time configuration of the eBPF programs (a `.rodata` global set by the loader, so the
/// verifier sees constants).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Wake the reader once this many bytes wait in the ring buffer (it also drains on a timer).
    pub ring_wakeup_bytes: u32,
    /// Bit k set: perf counter slot k is open on every CPU (in that slot's per-CPU array).
    pub counter_mask: u32,
    /// Which argument of the request marker functions holds the request id (0-5), or
    /// `NO_REQUEST_ID` when they take none.
    pub request_id_arg: u32,
    /// Offsets in `struct task_struct`, read from the running kernel's BTF (tp_btf programs).
    pub task_pid_off: u32,
    pub task_tgid_off: u32,
    pub task_comm_off: u32,
    /// Offset of the CPU number (`thread_info.cpu` or `cpu`, whichever the kernel has).
    pub task_cpu_off: u32,
    /// 1: the wakeup programs take the time from the run queue's clock (`rq->clock`, just
    /// updated by the wakeup) through the offsets below, converted to monotonic time with an
    /// offset each CPU measures once per tick, instead of calling `bpf_ktime_get_ns`: a call
    /// that cost about 90 ns per wakeup on our VMs, more than half the program.
    pub wakeup_rq_clock: u32,
    /// `task_struct.se.cfs_rq`, `cfs_rq.rq`, `rq.clock`.
    pub task_cfs_rq_off: u32,
    pub cfs_rq_rq_off: u32,
    pub rq_clock_off: u32,
    /// `cfs_rq.throttled_clock_self_time` (Linux 6.6+; before, `throttled_clock_pelt_time`):
    /// the time CFS bandwidth control held the task's group queue on its CPU throttled, summed
    /// by the kernel at each unthrottle (`throttled_clock_task_time` before Linux 5.19). Read
    /// at a wait's start and end, it says how much of the wait was throttling
    /// (`THROTTLED_SHIFT`). 0: not known (no CONFIG_CFS_BANDWIDTH, no `task_cfs_rq_off`,
    /// classic tracepoints).
    pub cfs_rq_throttled_off: u32,
    /// Field offsets in the classic tracepoints' records, read from tracefs `format` files
    /// (classic fallback only).
    pub switch_prev_state_off: u32,
    /// Size of `prev_state` in the classic sched_switch record (`long`: 8 on 64-bit kernels).
    pub switch_prev_state_size: u32,
    pub switch_next_pid_off: u32,
    pub switch_next_comm_off: u32,
    pub wakeup_pid_off: u32,
    pub wakeup_cpu_off: u32,
    pub wakeup_comm_off: u32,
    pub migrate_pid_off: u32,
    pub migrate_orig_cpu_off: u32,
    pub migrate_dest_cpu_off: u32,
    pub newtask_pid_off: u32,
    pub newtask_flags_off: u32,
    pub newtask_comm_off: u32,
    /// 1: send every state change of the target's threads (for a timeline: a trace file, the
    /// Perfetto and HTML outputs, per-request decomposition). 0: send only what the summary
    /// reads from the records: switch-ins (each wait's length and kind), counter slices and
    /// thread births and exits; the totals are kept in maps either way.
    pub transitions: u32,
    /// `THREAD_SLOTS` as the loader sized it, minus one (a power of two minus one: a TID's
    /// slot is `tid & thread_slot_mask`).
    pub thread_slot_mask: u32,
    /// Send a CPU's batch once it holds this many bytes (at most `BATCH_BYTES`; less for a
    /// small ring buffer, which a full batch would not fit).
    pub batch_bytes: u32,
    /// The PID namespace iterator (`pidns.rs`): the inode of the namespace to list, and the
    /// way from a `task_struct` to its number there: `task->thread_pid`, `pid->level`,
    /// `pid->numbers[]` (of `upid_size` bytes each: `upid.nr`, `upid.ns`), and the inode in
    /// `pid_namespace.ns.inum`.
    pub pidns_inum: u32,
    pub task_thread_pid_off: u32,
    pub pid_level_off: u32,
    pub pid_numbers_off: u32,
    pub upid_size: u32,
    pub upid_nr_off: u32,
    pub upid_ns_off: u32,
    pub pidns_inum_off: u32,
    /// 1: the tp_btf programs read each target task's own counters (`se.sum_exec_runtime`,
    /// `nvcsw`, `nivcsw`, at these offsets) to account switches the tracepoint did not report.
    pub task_counts: u32,
    pub task_exec_off: u32,
    pub task_nvcsw_off: u32,
    pub task_nivcsw_off: u32,
    /// `se.nr_migrations` (with `task_counts`).
    pub task_migrations_off: u32,
    /// `task_struct.real_parent` (a preemptor's parent, a fork's parent process), from BTF;
    /// 0 when unknown.
    pub task_real_parent_off: u32,
    /// Classic sched_process_exec record: `pid`, `old_pid`.
    pub exec_pid_off: u32,
    pub exec_old_pid_off: u32,
    /// 1: a process a member forks joins the target set at its fork (`TARGETS`), so a service's
    /// whole tree is traced; 0: it is only noted as an untraced child (`CHILDREN`).
    pub follow_children: u32,
    /// `cgroup.kn`, `kernfs_node.id` (the cgroup's id, its directory's inode number),
    /// `cgroup.root` and `cgroup_root.hierarchy_id`, from BTF: a process moved into a cgroup
    /// of `TARGET_CGROUPS` joins the set (`--cgroup`, tp_btf only).
    pub cgroup_kn_off: u32,
    pub kernfs_id_off: u32,
    pub cgroup_root_off: u32,
    pub root_hierarchy_off: u32,
    /// `task_struct.flags` (a waker's `PF_KTHREAD`), from BTF.
    pub task_flags_off: u32,
    /// The system call number in `struct pt_regs` (`orig_ax` on x86-64, `syscallno` on arm64),
    /// from BTF; `u32::MAX` when unknown. Read from a blocked wakee's saved registers
    /// (`bpf_task_pt_regs`, Linux 5.15+): what it was blocked in (a futex, a poll, a read).
    pub regs_syscall_off: u32,
    /// The system calls of a sleep a thread asks for (nanosleep, clock_nanosleep; `u32::MAX`:
    /// none): a task outside the target that blocks in one is waiting for its own timer, not
    /// for a target thread's answer, so it is no handoff partner (an interrupt can make it
    /// look woken by one: `sched/mod.rs`).
    pub sleep_syscalls: [u32; 2],
    /// `task_struct.on_rq`, from BTF: 0 once a task that blocks has been taken off its run
    /// queue, which `sched_switch` without `prev_state` (before Linux 5.18) tells a blocking
    /// switch by when the task's own switch counters were not read yet.
    pub task_on_rq_off: u32,
    /// 1 (`--debug-bpf`): the programs log, through aya-log, each state they repair or count
    /// because it should not happen (an untraced switch, a full map, a clock that ran
    /// backwards), with its thread, CPU and times. 0: the verifier, which sees this constant,
    /// drops those branches, so they cost nothing.
    pub debug_bpf: u32,
}

impl Config {
    pub const fn zeroed() -> Self {
        Self {
            ring_wakeup_bytes: 0,
            counter_mask: 0,
            request_id_arg: NO_REQUEST_ID,
            task_pid_off: 0,
            task_tgid_off: 0,
            task_comm_off: 0,
            task_cpu_off: 0,
            wakeup_rq_clock: 0,
            task_cfs_rq_off: 0,
            cfs_rq_rq_off: 0,
            rq_clock_off: 0,
            cfs_rq_throttled_off: 0,
            switch_prev_state_off: 0,
            switch_prev_state_size: 8,
            switch_next_pid_off: 0,
            switch_next_comm_off: 0,
            wakeup_pid_off: 0,
            wakeup_cpu_off: 0,
            wakeup_comm_off: 0,
            migrate_pid_off: 0,
            migrate_orig_cpu_off: 0,
            migrate_dest_cpu_off: 0,
            newtask_pid_off: 0,
            newtask_flags_off: 0,
            newtask_comm_off: 0,
            transitions: 1,
            thread_slot_mask: 0,
            batch_bytes: BATCH_BYTES as u32,
            pidns_inum: 0,
            task_thread_pid_off: 0,
            pid_level_off: 0,
            pid_numbers_off: 0,
            upid_size: 0,
            upid_nr_off: 0,
            upid_ns_off: 0,
            pidns_inum_off: 0,
            task_counts: 0,
            task_real_parent_off: 0,
            task_exec_off: 0,
            task_nvcsw_off: 0,
            task_nivcsw_off: 0,
            task_migrations_off: 0,
            exec_pid_off: 0,
            exec_old_pid_off: 0,
            follow_children: 0,
            cgroup_kn_off: 0,
            kernfs_id_off: 0,
            cgroup_root_off: 0,
            root_hierarchy_off: 0,
            task_flags_off: 0,
            regs_syscall_off: u32::MAX,
            sleep_syscalls: [u32::MAX; 2],
            task_on_rq_off: 0,
            debug_bpf: 0,
        }
    }
}
