//! What /proc says of a thread (read by `sources/process.rs`).

/// What /proc says of one thread when the recording starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThreadInfo {
    pub tid: u32,
    /// Its process (the kernel's TGID); absent from trace files before process trees.
    #[serde(default)]
    pub pid: u32,
    pub comm: String,
    /// The state letter of /proc/PID/task/TID/stat (R, S, D, ...).
    pub state: char,
}

/// A thread's switches, moves and wakeups over the window (the kernel's nvcsw, nivcsw and
/// nr_migrations, and its wakeups from blocked).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct Switches {
    /// Switches out while blocking.
    pub voluntary_switches: u64,
    /// Switches out while still runnable: preemption or yield.
    pub involuntary_switches: u64,
    /// Changes of CPU.
    pub migrations: u64,
    /// Wakeups from blocked to runnable.
    pub wakeups: u64,
}

/// Where a thread's time in the window went: on a CPU, waiting in a run queue, blocked. The
/// three cover its life in the window.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct StateTimes {
    pub oncpu_ns: u64,
    pub runq_wait_ns: u64,
    pub blocked_ns: u64,
}

impl StateTimes {
    pub fn offcpu_ns(&self) -> u64 {
        self.runq_wait_ns + self.blocked_ns
    }

    pub fn alive_ns(&self) -> u64 {
        self.oncpu_ns + self.offcpu_ns()
    }

    /// Adds `ns` spent in the kernel side's `ThreadState` `state` (a thread being created
    /// counts as blocked; an unknown state adds nothing).
    pub fn add_in(&mut self, state: u32, ns: u64) {
        use tracer_common::ThreadState;
        match ThreadState::try_from(state) {
            Ok(ThreadState::Running) => self.oncpu_ns += ns,
            Ok(ThreadState::Runnable) => self.runq_wait_ns += ns,
            Ok(ThreadState::Blocked | ThreadState::New) => self.blocked_ns += ns,
            _ => {}
        }
    }
}

/// One thread's totals: the per-thread figures every layer carries (the kernel's account, the
/// thread record, the summary's row, the timeline) and sums (the process totals), one type.
/// Flattened in every serialized form, so the field names are those of the parts.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct ThreadTotals {
    #[serde(flatten)]
    pub switches: Switches,
    #[serde(flatten)]
    pub time: StateTimes,
}

impl std::ops::AddAssign for Switches {
    fn add_assign(&mut self, o: Self) {
        self.voluntary_switches += o.voluntary_switches;
        self.involuntary_switches += o.involuntary_switches;
        self.migrations += o.migrations;
        self.wakeups += o.wakeups;
    }
}

impl std::ops::AddAssign for StateTimes {
    fn add_assign(&mut self, o: Self) {
        self.oncpu_ns += o.oncpu_ns;
        self.runq_wait_ns += o.runq_wait_ns;
        self.blocked_ns += o.blocked_ns;
    }
}

impl std::ops::AddAssign for ThreadTotals {
    fn add_assign(&mut self, o: Self) {
        self.switches += o.switches;
        self.time += o.time;
    }
}

impl From<&tracer_common::ThreadStats> for Switches {
    fn from(s: &tracer_common::ThreadStats) -> Self {
        Self {
            voluntary_switches: s.voluntary_switches,
            involuntary_switches: s.involuntary_switches,
            migrations: s.migrations,
            wakeups: s.wakeups,
        }
    }
}

impl From<&tracer_common::ThreadStats> for StateTimes {
    /// The kernel's account as it stands: the intervals before its first and after its last
    /// event are not in it (`close_thread` adds them).
    fn from(s: &tracer_common::ThreadStats) -> Self {
        Self {
            oncpu_ns: s.oncpu_ns,
            runq_wait_ns: s.runq_wait_ns,
            blocked_ns: s.blocked_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_add_field_by_field() {
        let one = ThreadTotals {
            switches: Switches {
                voluntary_switches: 1,
                involuntary_switches: 2,
                migrations: 3,
                wakeups: 4,
            },
            time: StateTimes {
                oncpu_ns: 10,
                runq_wait_ns: 20,
                blocked_ns: 30,
            },
        };
        let mut sum = ThreadTotals::default();
        sum += one;
        sum += one;
        assert_eq!(sum.switches.wakeups, 8);
        assert_eq!(sum.switches.migrations, 6);
        assert_eq!(sum.time.alive_ns(), 120);
        assert_eq!(sum.time.offcpu_ns(), 100);
        // Flattened: the JSON has the parts' names, in this order.
        assert_eq!(
            serde_json::to_string(&one).unwrap(),
            "{\"voluntary_switches\":1,\"involuntary_switches\":2,\"migrations\":3,\"wakeups\":4,\
             \"oncpu_ns\":10,\"runq_wait_ns\":20,\"blocked_ns\":30}"
        );
    }
}
