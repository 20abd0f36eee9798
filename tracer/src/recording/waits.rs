//! Why a run-queue wait happened, told from the transitions around it: the thread was moved to
//! another CPU while it waited (a forced migration: affinity change, load balancing), the CPU
//! it waited for was idle when it finally ran (cgroup throttling, or a slow wakeup of an idle
//! CPU), the thread it had just woken held the CPU (a handoff, not lost time), or another task
//! held the CPU (contention). Apart from its kind, each wait says how much
//! of it the thread's cgroup was throttled (its CPU quota spent), from the kernel's own
//! throttled-time count of the thread's group queue: that part is throttling, whoever ran.
//! The kernel side decides (tracer-ebpf `sched/`) and says so in each switch-in record; `trace/upgrade.rs` decides the same for
//! the records of trace format 1, which did not say.

use serde::{Deserialize, Serialize};
use tracer_common::{Event, WaitCode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// Another task ran on the CPU meanwhile.
    Contention,
    /// The thread was moved to another CPU while it waited.
    Migration,
    /// The CPU was idle when the thread got it: the thread could not run although a CPU was
    /// free (its cgroup was throttled), or the idle CPU took long to wake.
    IdleCpu,
    /// A handoff: the thread waited behind the task it exchanges work with, which held the
    /// CPU until it blocked: one it had just woken and was preempted by (a request passed to
    /// a worker or another process on the same CPU), or the one that had woken it on its own
    /// CPU and ran on (a sync wakeup; a socket's reader wakes its writer). The wait is the
    /// exchange, not a CPU denied: it is not contention, and a request's decomposition
    /// follows it to that thread like a blocked wait ended by it.
    Handoff,
}

impl WaitKind {
    /// As the JSON names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Contention => "contention",
            Self::Migration => "migration",
            Self::IdleCpu => "idle_cpu",
            Self::Handoff => "handoff",
        }
    }

    /// What the kernel side decided for the wait a switch-in record ended (none in records
    /// of trace format 1).
    pub fn of(ev: &Event) -> Option<WaitKind> {
        match ev.wait_code() {
            WaitCode::None => None,
            WaitCode::Contention => Some(Self::Contention),
            WaitCode::Migration => Some(Self::Migration),
            WaitCode::IdleCpu => Some(Self::IdleCpu),
            WaitCode::Handoff => Some(Self::Handoff),
        }
    }
}

/// Waits at least this long that end on an idle CPU are counted apart: wakeup latency of an
/// idle CPU is tens of microseconds (hundreds on a VM whose vCPU the host descheduled), while a
/// cgroup bandwidth throttle holds a thread for the rest of its period, milliseconds.
pub const LONG_IDLE_WAIT_NS: u64 = 1_000_000;

/// One thread's waits by kind over the window.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct WaitClasses {
    pub contention_ns: u64,
    pub contention_waits: u64,
    pub migration_ns: u64,
    pub migration_waits: u64,
    pub idle_cpu_ns: u64,
    pub idle_cpu_waits: u64,
    /// The part of the idle-CPU waits that lasted `LONG_IDLE_WAIT_NS` or more.
    pub idle_cpu_long_ns: u64,
    pub idle_cpu_long_waits: u64,
    /// The parts of contention waits their cgroup was throttled (its quota spent): other
    /// tasks ran, but the quota held the thread. Taken out of `contention_ns`. (A wait on an
    /// idle CPU stays `idle_cpu` whole, judged by the cgroup's counters; a moved thread's
    /// share is not known.) Recordings from before the kernel said have none.
    #[serde(default)]
    pub throttled_ns: u64,
    /// The waits with such a part.
    #[serde(default)]
    pub throttled_waits: u64,
    /// Handoffs: waits behind the task it exchanges work with, until that one blocked
    /// (`WaitKind::Handoff`): the part its partner held the CPU (the rest, behind other tasks,
    /// is in `contention_ns`, the wait counted here). Recordings from before the kernel said
    /// have none.
    #[serde(default)]
    pub handoff_ns: u64,
    #[serde(default)]
    pub handoff_waits: u64,
}

impl WaitClasses {
    /// A wait of `ns` and its `part` (`Event::part_ns`): of a contention wait, the part with
    /// the cgroup throttled; of a handoff, the part its partner held the CPU, the rest of it
    /// behind other tasks (contention).
    pub fn add(&mut self, kind: WaitKind, ns: u64, part: u64) {
        if kind == WaitKind::Handoff {
            let handoff = part.min(ns);
            self.handoff_ns += handoff;
            self.handoff_waits += 1;
            // One wait, counted once, as a handoff; its time behind others is contention's.
            self.contention_ns += ns - handoff;
            return;
        }
        let throttled = if kind == WaitKind::Contention {
            part.min(ns)
        } else {
            0
        };
        if throttled > 0 {
            self.throttled_ns += throttled;
            self.throttled_waits += 1;
        }
        let ns = ns - throttled;
        match kind {
            WaitKind::Contention => {
                self.contention_ns += ns;
                self.contention_waits += 1;
            }
            WaitKind::Migration => {
                self.migration_ns += ns;
                self.migration_waits += 1;
            }
            WaitKind::IdleCpu => {
                self.idle_cpu_ns += ns;
                self.idle_cpu_waits += 1;
                if ns >= LONG_IDLE_WAIT_NS {
                    self.idle_cpu_long_ns += ns;
                    self.idle_cpu_long_waits += 1;
                }
            }
            WaitKind::Handoff => {}
        }
    }

    /// All the waits' time, whatever their kind.
    pub fn total_ns(&self) -> u64 {
        self.contention_ns
            + self.migration_ns
            + self.idle_cpu_ns
            + self.throttled_ns
            + self.handoff_ns
    }

    pub fn merge(&mut self, o: &WaitClasses) {
        self.contention_ns += o.contention_ns;
        self.contention_waits += o.contention_waits;
        self.migration_ns += o.migration_ns;
        self.migration_waits += o.migration_waits;
        self.idle_cpu_ns += o.idle_cpu_ns;
        self.idle_cpu_waits += o.idle_cpu_waits;
        self.idle_cpu_long_ns += o.idle_cpu_long_ns;
        self.idle_cpu_long_waits += o.idle_cpu_long_waits;
        self.throttled_ns += o.throttled_ns;
        self.throttled_waits += o.throttled_waits;
        self.handoff_ns += o.handoff_ns;
        self.handoff_waits += o.handoff_waits;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_idle_waits_are_counted_apart() {
        let mut c = WaitClasses::default();
        c.add(WaitKind::IdleCpu, 50_000, 0);
        c.add(WaitKind::IdleCpu, 5_000_000, 0);
        c.add(WaitKind::Contention, 10, 0);
        assert_eq!((c.idle_cpu_waits, c.idle_cpu_ns), (2, 5_050_000));
        assert_eq!((c.idle_cpu_long_waits, c.idle_cpu_long_ns), (1, 5_000_000));
        let mut d = WaitClasses::default();
        d.merge(&c);
        d.merge(&c);
        assert_eq!(d.contention_ns, 20);
    }

    #[test]
    fn a_handoff_s_part_is_its_own_class_and_the_rest_contention() {
        let mut c = WaitClasses::default();
        c.add(WaitKind::Handoff, 700, 300);
        c.add(WaitKind::Handoff, 200, 200);
        c.add(WaitKind::Contention, 100, 40);
        assert_eq!((c.handoff_waits, c.handoff_ns), (2, 500));
        assert_eq!((c.contention_waits, c.contention_ns), (1, 400 + 60));
        assert_eq!(c.throttled_ns, 40);
        assert_eq!(c.total_ns(), 1000);
        let mut d = WaitClasses::default();
        d.merge(&c);
        assert_eq!((d.handoff_waits, d.handoff_ns), (2, 500));
    }
}
