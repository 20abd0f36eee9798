//! Kernel data layouts the eBPF programs need, read from the running kernel: `task_struct`
//! member offsets from BTF (for tp_btf programs; the classic tracepoints' record offsets are
//! in `tracefs.rs`). Nothing here is hard-coded: offsets move between kernel versions and
//! configurations (randomized struct layout included).

use std::{fs, path::Path};

use anyhow::{Context as _, Result, anyhow};
use tracer_common::Config;

use super::btf::Btf;
use crate::recording::Capability;

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Offsets in `struct task_struct` the tp_btf programs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub tgid: u32,
    pub comm: u32,
    pub cpu: u32,
    /// The way from a task to its run queue's clock, where the kernel has one.
    pub rq_clock: Option<RqClockPath>,
    /// The throttled-time counter in a `cfs_rq` (with `rq_clock`'s `task->se.cfs_rq`), where
    /// the kernel has CFS bandwidth control.
    pub throttled: Option<ThrottledField>,
    /// The task's own counters: `se.sum_exec_runtime`, `nvcsw`, `nivcsw`, `se.nr_migrations`.
    pub counts: Option<(u32, u32, u32, u32)>,
    pub real_parent: Option<u32>,
    /// From a `struct cgroup` to its id and its hierarchy's: `cgroup.kn`, `kernfs_node.id`,
    /// `cgroup.root`, `cgroup_root.hierarchy_id` (for `--cgroup`).
    pub cgroup: Option<[u32; 4]>,
    /// `task_struct.flags` (a waker's `PF_KTHREAD`).
    pub flags: u32,
    /// The system call number in `struct pt_regs`, where `bpf_task_pt_regs` (Linux 5.15) and
    /// `bpf_get_current_task_btf` (5.11) exist: what a woken thread was blocked in.
    pub regs_syscall: Option<u32>,
    /// `task_struct.on_rq`: how `sched_switch` without `prev_state` (before 5.18) tells a
    /// blocking switch-out where the task's counters were not read yet.
    pub on_rq: u32,
}

/// What a recording says about where its wakeup times come from.
pub fn wakeup_clock_note(rq_clock: bool) -> &'static str {
    if rq_clock {
        "switch and wakeup times from the run queue's clock"
    } else {
        "switch and wakeup times from the clock helper (no cfs_rq.rq: CONFIG_FAIR_GROUP_SCHED is off)"
    }
}

/// A `cfs_rq`'s own count of its throttled time: `throttled_clock_self_time` (Linux 6.6+, run
/// queue clock ns) or, before, `throttled_clock_pelt_time` (`throttled_clock_task_time` before
/// 5.19; the PELT or task clock, which can run slower than real time: below a CPU's top
/// frequency where the kernel scales for frequency, or without IRQ time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottledField {
    pub offset: u32,
    pub exact: bool,
}

/// What a recording says about its throttled waits.
pub fn throttle_note(f: Option<ThrottledField>) -> &'static str {
    match f {
        Some(ThrottledField { exact: true, .. }) => {
            "throttled waits from cfs_rq.throttled_clock_self_time"
        }
        Some(_) => {
            "throttled waits from cfs_rq's PELT-clock throttled time (Linux < 6.6: a clock that can run slower than real time, so part of a throttled wait may read as contention)"
        }
        None => {
            "throttled waits not told apart (no CFS bandwidth control in this kernel's BTF): a wait behind a cgroup's spent quota reads as contention when other tasks ran, as idle-CPU latency when none did"
        }
    }
}

/// Offsets leading from a `task_struct` to `rq->clock` of the run queue it is on:
/// `task->se.cfs_rq->rq->clock`. `cfs_rq.rq` exists only with CONFIG_FAIR_GROUP_SCHED (set by
/// the distributions' kernels); without it the wakeup program reads the clock helper instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RqClockPath {
    pub task_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
}

impl TaskOffsets {
    pub fn from_btf_file(path: &Path) -> Result<Self> {
        let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let btf = Btf::parse(&data).with_context(|| format!("parsing {}", path.display()))?;
        let task = btf.struct_id("task_struct")?;
        let at = |path: &[&str]| {
            btf.member_offset(task, path)
                .ok_or_else(|| anyhow!("task_struct has no member {}", path.join(".")))
        };
        // Since Linux 5.16 the CPU lives in thread_info when THREAD_INFO_IN_TASK is set
        // (commit bcf9033e5449, "sched: move CPU field back into thread_info"); older kernels
        // have task_struct.cpu.
        let cpu = at(&["thread_info", "cpu"]).or_else(|_| at(&["cpu"]))?;
        let rq_clock = (|| {
            Some(RqClockPath {
                task_cfs_rq: btf.member_offset(task, &["se", "cfs_rq"])?,
                cfs_rq_rq: btf.member_offset(btf.struct_id("cfs_rq").ok()?, &["rq"])?,
                rq_clock: btf.member_offset(btf.struct_id("rq").ok()?, &["clock"])?,
            })
        })();
        let throttled = (|| {
            let cfs_rq = btf.struct_id("cfs_rq").ok()?;
            let at = |name| btf.member_offset(cfs_rq, &[name]);
            at("throttled_clock_self_time")
                .map(|offset| ThrottledField {
                    offset,
                    exact: true,
                })
                .or_else(|| {
                    // Named throttled_clock_task_time before Linux 5.19.
                    at("throttled_clock_pelt_time")
                        .or_else(|| at("throttled_clock_task_time"))
                        .map(|offset| ThrottledField {
                            offset,
                            exact: false,
                        })
                })
        })()
        .filter(|_| rq_clock.is_some());
        let counts = (|| {
            Some((
                at(&["se", "sum_exec_runtime"]).ok()?,
                at(&["nvcsw"]).ok()?,
                at(&["nivcsw"]).ok()?,
                at(&["se", "nr_migrations"]).ok()?,
            ))
        })();
        Ok(Self {
            pid: at(&["pid"])?,
            tgid: at(&["tgid"])?,
            comm: at(&["comm"])?,
            cpu,
            rq_clock,
            throttled,
            counts,
            real_parent: at(&["real_parent"]).ok(),
            flags: at(&["flags"])?,
            on_rq: at(&["on_rq"])?,
            regs_syscall: (|| {
                if !btf.has_func("bpf_task_pt_regs") || !btf.has_func("bpf_get_current_task_btf") {
                    return None;
                }
                let regs = btf.struct_id("pt_regs").ok()?;
                // x86-64 keeps the number the call was made with in orig_ax, arm64 in
                // syscallno; both -1 outside a system call.
                btf.member_offset(regs, &["orig_ax"])
                    .or_else(|| btf.member_offset(regs, &["syscallno"]))
            })(),
            cgroup: (|| {
                let cgroup = btf.struct_id("cgroup").ok()?;
                Some([
                    btf.member_offset(cgroup, &["kn"])?,
                    btf.member_offset(btf.struct_id("kernfs_node").ok()?, &["id"])?,
                    btf.member_offset(cgroup, &["root"])?,
                    btf.member_offset(btf.struct_id("cgroup_root").ok()?, &["hierarchy_id"])?,
                ])
            })(),
        })
    }

    pub fn apply(&self, config: &mut Config) {
        config.task_pid_off = self.pid;
        config.task_tgid_off = self.tgid;
        config.task_comm_off = self.comm;
        config.task_cpu_off = self.cpu;
        config.task_real_parent_off = self.real_parent.unwrap_or(0);
        config.task_flags_off = self.flags;
        config.task_on_rq_off = self.on_rq;
        config.regs_syscall_off = self.regs_syscall.unwrap_or(u32::MAX);
        config.sleep_syscalls = crate::recording::wakers::BlockedIn::sleep_numbers();
        if let Some([kn, id, root, hierarchy]) = self.cgroup {
            config.cgroup_kn_off = kn;
            config.kernfs_id_off = id;
            config.cgroup_root_off = root;
            config.root_hierarchy_off = hierarchy;
        }
        if let Some((exec, nvcsw, nivcsw, migrations)) = self.counts {
            config.task_counts = 1;
            config.task_exec_off = exec;
            config.task_nvcsw_off = nvcsw;
            config.task_nivcsw_off = nivcsw;
            config.task_migrations_off = migrations;
        }
        if let Some(p) = self.rq_clock {
            config.wakeup_rq_clock = 1;
            config.task_cfs_rq_off = p.task_cfs_rq;
            config.cfs_rq_rq_off = p.cfs_rq_rq;
            config.rq_clock_off = p.rq_clock;
            config.cfs_rq_throttled_off = self.throttled.map_or(0, |f| f.offset);
        }
    }
}

/// The way from a `task_struct` to its number in a PID namespace, for the namespace iterator
/// (tracer-ebpf `pidns.rs`): `task->thread_pid->numbers[level]` is `{ nr, ns }`, and a
/// namespace is known by `ns->ns.inum`, the inode /proc/PID/ns/pid shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNsOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_thread_pid: u32,
    pub pid_level: u32,
    pub pid_numbers: u32,
    pub upid_size: u32,
    pub upid_nr: u32,
    pub upid_ns: u32,
    pub pidns_inum: u32,
}

impl PidNsOffsets {
    pub fn from_btf_file(path: &Path) -> Result<Self> {
        let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let btf = Btf::parse(&data).with_context(|| format!("parsing {}", path.display()))?;
        let member = |st: &str, path: &[&str]| -> Result<u32> {
            btf.member_offset(btf.struct_id(st)?, path)
                .ok_or_else(|| anyhow!("struct {st} has no member {}", path.join(".")))
        };
        let upid = btf.struct_id("upid")?;
        Ok(Self {
            task_pid: member("task_struct", &["pid"])?,
            task_tgid: member("task_struct", &["tgid"])?,
            task_thread_pid: member("task_struct", &["thread_pid"])?,
            pid_level: member("pid", &["level"])?,
            pid_numbers: member("pid", &["numbers"])?,
            upid_size: btf
                .struct_size(upid)
                .ok_or_else(|| anyhow!("struct upid has no size"))?,
            upid_nr: member("upid", &["nr"])?,
            upid_ns: member("upid", &["ns"])?,
            pidns_inum: member("pid_namespace", &["ns", "inum"])?,
        })
    }

    pub fn apply(&self, config: &mut Config) {
        config.task_pid_off = self.task_pid;
        config.task_tgid_off = self.task_tgid;
        config.task_thread_pid_off = self.task_thread_pid;
        config.pid_level_off = self.pid_level;
        config.pid_numbers_off = self.pid_numbers;
        config.upid_size = self.upid_size;
        config.upid_nr_off = self.upid_nr;
        config.upid_ns_off = self.upid_ns;
        config.pidns_inum_off = self.pidns_inum;
    }
}

/// Kernel BTF, which tp_btf programs and the task_struct offsets need.
pub fn btf_capability(path: &Path) -> Capability {
    if !path.exists() {
        return Capability::no(format!(
            "{} is missing: the kernel was built without CONFIG_DEBUG_INFO_BTF; classic \
             tracepoints are used instead",
            path.display()
        ));
    }
    match TaskOffsets::from_btf_file(path) {
        Ok(o) => Capability::yes(format!(
            "{} parsed; task_struct offsets found; {}; {}",
            path.display(),
            wakeup_clock_note(o.rq_clock.is_some()),
            throttle_note(o.throttled)
        )),
        Err(e) => Capability::no(format!("{} unusable: {e:#}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btf_missing_says_what_happens_instead() {
        let c = btf_capability(Path::new("/nonexistent/vmlinux"));
        assert!(!c.available);
        assert!(c.reason.contains("classic tracepoints"), "{}", c.reason);
    }

    /// The offsets against bpftool's own BTF dump, an independent reader.
    #[test]
    fn task_offsets_agree_with_bpftool() {
        let path = Path::new(VMLINUX_BTF);
        let ours = TaskOffsets::from_btf_file(path).expect("task_struct offsets");
        let out = std::process::Command::new("bpftool")
            .args(["btf", "dump", "file", VMLINUX_BTF, "format", "raw"])
            .output()
            .expect("bpftool (cargo xtask setup installs it)");
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        // "[ID] STRUCT 'task_struct' size=... vlen=..." then one "\t'name' type_id=.. bits_offset=.."
        // line per member.
        let bits_in = |st: &str, name: &str| -> u32 {
            let line = text
                .lines()
                .skip_while(|l| !l.contains(&format!("STRUCT '{st}' ")))
                .skip(1)
                .take_while(|l| l.starts_with('\t'))
                .find(|l| l.trim_start().starts_with(&format!("'{name}' ")))
                .unwrap_or_else(|| panic!("bpftool shows no {st}.{name}"));
            line.split("bits_offset=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let bits = |name: &str| bits_in("task_struct", name);
        assert_eq!(ours.pid * 8, bits("pid"));
        assert_eq!(ours.tgid * 8, bits("tgid"));
        assert_eq!(ours.comm * 8, bits("comm"));
        // thread_info is the first member and cpu is its fourth field (flags, syscall_work,
        // status, cpu) on x86-64.
        assert_eq!(bits("thread_info"), 0);
        assert_eq!(ours.cpu, 8 + 8 + 4);
        // The way to the run queue's clock (this kernel has CONFIG_FAIR_GROUP_SCHED).
        let rq = ours.rq_clock.expect("se.cfs_rq->rq->clock");
        assert_eq!(
            rq.task_cfs_rq * 8,
            bits("se") + bits_in("sched_entity", "cfs_rq")
        );
        assert_eq!(rq.cfs_rq_rq * 8, bits_in("cfs_rq", "rq"));
        assert_eq!(rq.rq_clock * 8, bits_in("rq", "clock"));
        // This kernel (6.18) has CFS bandwidth control and the exact counter.
        let t = ours.throttled.expect("cfs_rq.throttled_clock_self_time");
        assert!(t.exact);
        assert_eq!(t.offset * 8, bits_in("cfs_rq", "throttled_clock_self_time"));
    }
}
