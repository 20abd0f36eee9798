//! The parts a request's wall time is split into, and who ended its waits.

use serde::Serialize;

use crate::analysis::wakers::WakerRef;

/// Where one request's (or a group's mean) wall time went, in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Breakdown {
    /// On a CPU working on this request.
    pub oncpu_ns: f64,
    /// On a CPU while the serving thread was still finishing earlier requests: queueing.
    pub queued_oncpu_ns: f64,
    /// Waiting for a CPU while other tasks ran.
    pub runq_contention_ns: f64,
    /// Waiting for a CPU after being moved to another one.
    pub runq_migration_ns: f64,
    /// Waiting for a CPU that was idle when the thread finally ran (cgroup throttling, or a
    /// slow wakeup).
    pub runq_idle_cpu_ns: f64,
    /// Waiting for a CPU while the thread's cgroup was throttled (its CPU quota spent) and
    /// other tasks ran (the kernel's throttled-time count of the thread's group queue says how
    /// much of a wait), and waits behind other tasks that a throttle later in the same period
    /// made up for (quota.rs).
    pub runq_throttled_ns: f64,
    /// Inside a synchronizing CUDA call (waiting for the GPU), on or off the CPU.
    pub cuda_sync_ns: f64,
    /// Off the CPU and not runnable, other than waiting for the GPU, a lock or a pause (I/O,
    /// sleeps, events).
    pub blocked_ns: f64,
    /// Blocked in a futex that another thread of the process held (`held.rs`): a lock, the GIL.
    pub lock_wait_ns: f64,
    /// Inside a runtime pause of the process (a garbage collection), in any state.
    pub runtime_pause_ns: f64,
    /// Not covered by the timeline (thread unseen, events lost).
    pub uncovered_ns: f64,
}

impl Breakdown {
    pub const FIELDS: [&'static str; PARTS] = [
        "oncpu",
        "queued_oncpu",
        "runq_contention",
        "runq_migration",
        "runq_idle_cpu",
        "runq_throttled",
        "cuda_sync",
        "blocked",
        "lock_wait",
        "runtime_pause",
        "uncovered",
    ];

    pub fn values(&self) -> [f64; PARTS] {
        [
            self.oncpu_ns,
            self.queued_oncpu_ns,
            self.runq_contention_ns,
            self.runq_migration_ns,
            self.runq_idle_cpu_ns,
            self.runq_throttled_ns,
            self.cuda_sync_ns,
            self.blocked_ns,
            self.lock_wait_ns,
            self.runtime_pause_ns,
            self.uncovered_ns,
        ]
    }

    pub fn from_values(v: [f64; PARTS]) -> Self {
        Self {
            oncpu_ns: v[0],
            queued_oncpu_ns: v[1],
            runq_contention_ns: v[2],
            runq_migration_ns: v[3],
            runq_idle_cpu_ns: v[4],
            runq_throttled_ns: v[5],
            cuda_sync_ns: v[6],
            blocked_ns: v[7],
            lock_wait_ns: v[8],
            runtime_pause_ns: v[9],
            uncovered_ns: v[10],
        }
    }

    /// Everything the timeline accounts for.
    pub fn covered_ns(&self) -> f64 {
        self.values()[..PARTS - 1].iter().sum()
    }

    pub(super) fn mean(items: &[&Breakdown]) -> Self {
        let mut sum = [0.0; PARTS];
        for b in items {
            for (s, v) in sum.iter_mut().zip(b.values()) {
                *s += v;
            }
        }
        let n = items.len().max(1) as f64;
        Self::from_values(sum.map(|s| s / n))
    }

    /// Adds `f` times `o`, part by part.
    pub fn add_scaled(&mut self, o: &Self, f: f64) {
        let (a, b) = (self.values(), o.values());
        *self = Self::from_values(std::array::from_fn(|k| a[k] + b[k] * f));
    }

    pub fn minus(&self, o: &Self) -> Self {
        let (a, b) = (self.values(), o.values());
        Self::from_values(std::array::from_fn(|i| a[i] - b[i]))
    }
}

/// The parts of a `Breakdown`; `uncovered` is the last.
const PARTS: usize = 11;

/// A thread that held a lock a request's serving thread waited for, and for how long (ns; a
/// group's mean per request).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub struct HolderTime {
    pub tid: u32,
    pub ns: f64,
    /// The part of `ns` in single futex waits longer than CPython's GIL waiters ever wait
    /// (`held::GIL_WAIT_MAX_NS`): a lock of the program's own, not the GIL.
    pub long_ns: f64,
}

impl HolderTime {
    /// `ns` held by `tid`, in waits longer than a GIL wait or not.
    pub fn of(tid: u32, ns: f64, long: bool) -> Self {
        Self {
            tid,
            ns,
            long_ns: if long { ns } else { 0.0 },
        }
    }

    pub fn scaled(self, f: f64) -> Self {
        Self {
            ns: self.ns * f,
            long_ns: self.long_ns * f,
            ..self
        }
    }
}

/// Adds `h` to its thread's entry.
pub fn add_holder(v: &mut Vec<HolderTime>, h: HolderTime) {
    match v.iter_mut().find(|x| x.tid == h.tid) {
        Some(x) => {
            x.ns += h.ns;
            x.long_ns += h.long_ns;
        }
        None => v.push(h),
    }
}

/// The part of a request's blocked time (lock waits and other blocked time, not GPU waits)
/// that one task ended (ns; a group's mean per request). `by` is absent for the rest: waits
/// whose end the recording did not see (a lost record), and the wakers past the first few.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct BlockedBy {
    pub by: Option<WakerRef>,
    pub ns: f64,
}

/// Wakers kept per request and per group, largest first; the rest are summed into the last.
const BLOCKED_BY_KEPT: usize = 5;

/// Adds `ns` to `by`'s entry.
pub(super) fn add_blocked(v: &mut Vec<BlockedBy>, by: Option<WakerRef>, ns: f64) {
    let same = |b: &BlockedBy| match (&b.by, &by) {
        (Some(a), Some(c)) => a.tid == c.tid && a.kind == c.kind,
        (a, c) => a.is_none() && c.is_none(),
    };
    match v.iter_mut().find(|b| same(b)) {
        Some(b) => b.ns += ns,
        None => v.push(BlockedBy { by, ns }),
    }
}

/// Largest first (by thread ID where equal).
pub(super) fn rank_holders(v: &mut [HolderTime]) {
    v.sort_by(|a, b| b.ns.total_cmp(&a.ns).then(a.tid.cmp(&b.tid)));
}

/// Largest first, at most `BLOCKED_BY_KEPT` (the rest folded into an unattributed entry, so
/// the entries still add up to the blocked time).
pub(super) fn rank_blocked(v: &mut Vec<BlockedBy>) {
    v.sort_by(|a, b| b.ns.total_cmp(&a.ns));
    if v.len() > BLOCKED_BY_KEPT {
        let rest: f64 = v.drain(BLOCKED_BY_KEPT - 1..).map(|b| b.ns).sum();
        v.push(BlockedBy { by: None, ns: rest });
    }
}

/// A request, as the queue chase names it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub struct RequestRef {
    pub tid: u32,
    /// Its id, when the markers or the latency log carry one.
    pub id: Option<u64>,
    pub start_ns: u64,
    pub wall_ns: u64,
    /// Its own on-CPU time (not counting the earlier requests it waited behind).
    pub oncpu_ns: f64,
}

/// A part of a request's queued time (`queued_oncpu`: its serving thread on earlier requests)
/// and what it went to (ns; a group's mean per request).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct QueuedBy {
    /// `request`: an earlier request's own on-CPU work beyond the median request's (head-of-line
    /// blocking), named in `request`; a part of the earlier requests' own excess, named as in
    /// `parts` (`runq_contention`, `lock_wait`, `runtime_pause`, `cuda_sync`, ...): they were
    /// late for that reason; `backlog`: they were served in normal time, arrivals outpaced
    /// service.
    pub cause: &'static str,
    /// For `request`: which (absent for the requests past the first few, summed).
    pub request: Option<RequestRef>,
    pub ns: f64,
}

/// Request entries kept per request and per group, largest first; the rest are summed into
/// one `request` entry without a name.
const QUEUED_REQUESTS_KEPT: usize = 5;

/// Adds `ns` to the entry of `cause` (and `request`).
pub(super) fn add_queued(
    v: &mut Vec<QueuedBy>,
    cause: &'static str,
    request: Option<RequestRef>,
    ns: f64,
) {
    let same = |q: &QueuedBy| {
        q.cause == cause
            && q.request.map(|r| (r.tid, r.start_ns)) == request.map(|r| (r.tid, r.start_ns))
    };
    match v.iter_mut().find(|q| same(q)) {
        Some(q) => q.ns += ns,
        None => v.push(QueuedBy { cause, request, ns }),
    }
}

/// Largest first; named requests past the first few folded into one unnamed `request` entry,
/// so the entries still add up to the queued time.
pub(super) fn rank_queued(v: &mut Vec<QueuedBy>) {
    v.sort_by(|a, b| b.ns.total_cmp(&a.ns));
    let mut named = 0;
    let mut folded = 0.0;
    v.retain(|q| {
        if q.request.is_none() {
            return true;
        }
        named += 1;
        if named <= QUEUED_REQUESTS_KEPT {
            return true;
        }
        folded += q.ns;
        false
    });
    if folded > 0.0 {
        add_queued(v, "request", None, folded);
        v.sort_by(|a, b| b.ns.total_cmp(&a.ns));
    }
}
