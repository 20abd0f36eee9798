//! `tracer watch --prometheus`: each window's report added to the exported series, in the
//! OpenMetrics text format of the official Prometheus client (prometheus-client). Labels are
//! few and bounded: causes, mechanisms, process roles, waker kinds, GPUs, NVML policies; never
//! a thread or request ID (docs/METRICS.md lists every series).

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{
        MetricType, TypedMetric,
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use crate::{
    analysis::{Report, summary::Summary, wakers::Classifier},
    recording::Recording,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: String,
    mechanism_id: String,
    process_role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrimaryLabels {
    primary: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    process_role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WakerLabels {
    process_role: String,
    waker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu: String,
    uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    gpu: String,
    uuid: String,
    policy: String,
}

/// A label value from a name a process chose (a role falls back to the command name):
/// prometheus-client writes values as they are, so a quote or backslash would break the
/// exposition (and `render::otlp`, which reads it back). Those, and control characters, become
/// `_`.
fn label(v: &str) -> String {
    v.chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// The first log2 slot exported on its own: below it (1 µs) every wait is one bucket.
const FIRST_SLOT: usize = 10;

/// A histogram fed from the kernel's log2 histograms (slot i: [2^(i-1), 2^i) ns) and the
/// exact sums beside them, in seconds: the kernel already binned the values, so there is no
/// value to `observe`.
#[derive(Debug, Default, Clone)]
struct Log2Histogram(Arc<Mutex<(f64, Vec<u64>)>>);

impl Log2Histogram {
    fn add(&self, sum_ns: u64, slots: &[u32]) {
        let mut g = self.0.lock().expect("not poisoned");
        g.0 += sum_ns as f64 / 1e9;
        if g.1.len() < slots.len() {
            g.1.resize(slots.len(), 0);
        }
        for (a, &b) in g.1.iter_mut().zip(slots) {
            *a += b as u64;
        }
    }
}

impl TypedMetric for Log2Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Log2Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let g = self.0.lock().expect("not poisoned");
        let slots = &g.1;
        let mut buckets: Vec<(f64, u64)> = Vec::new();
        let below: u64 = slots.iter().take(FIRST_SLOT + 1).sum();
        buckets.push(((1u64 << FIRST_SLOT) as f64 / 1e9, below));
        for (i, &n) in slots.iter().enumerate().skip(FIRST_SLOT + 1) {
            buckets.push(((1u64 << i.min(63)) as f64 / 1e9, n));
        }
        buckets.push((f64::MAX, 0));
        let count = slots.iter().sum();
        encoder.encode_histogram::<NoLabelSet>(g.0, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Every exported series; `add` folds a window into them.
pub struct Metrics {
    registry: Registry,
    causes: CauseSeries,
    sched: SchedSeries,
    requests: RequestSeries,
    gpu: GpuSeries,
    own: OwnSeries,
    /// The tracer's resident memory, as the watch loop last read it.
    rss_now: Arc<AtomicU64>,
    /// The process roles given series of their own so far (`MAX_ROLES`).
    roles: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// At most this many process roles get series of their own, the first seen; later ones are
/// `other`. A role falls back to the command name, which a target can vary without end
/// (numbered workers, `ForkPoolWorker-N`): each new one would add some 60 series for good.
pub const MAX_ROLES: usize = 32;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every series, family by family, in the order the exposition lists them.
    pub fn new() -> Self {
        let mut r = Registry::default();
        let causes = CauseSeries::register(&mut r);
        let sched = SchedSeries::register(&mut r);
        let requests = RequestSeries::register(&mut r);
        let gpu = GpuSeries::register(&mut r);
        let own = OwnSeries::register(&mut r);
        Self {
            registry: r,
            causes,
            sched,
            requests,
            gpu,
            own,
            rss_now: Arc::default(),
            roles: Default::default(),
        }
    }

    /// The exposition, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        self.own
            .own_rss
            .set(self.rss_now.load(Ordering::Relaxed) as i64);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The tracer's resident memory now, reported at the next scrape.
    pub fn set_rss(&self, bytes: u64) {
        self.rss_now.store(bytes, Ordering::Relaxed);
    }

    pub fn set_flight_bytes(&self, bytes: u64) {
        self.own.flight_bytes.set(bytes as i64);
    }

    pub fn count_trigger(&self) {
        self.own.triggers.inc();
    }

    /// The label of a process role: its own among the first `MAX_ROLES`, else `other`.
    fn role(&self, name: &str) -> String {
        let name = label(name);
        let mut roles = self.roles.lock().unwrap_or_else(|e| e.into_inner());
        if roles.contains(&name) || roles.len() < MAX_ROLES {
            roles.insert(name.clone());
            name
        } else {
            "other".into()
        }
    }

    /// Adds one window.
    pub fn add(&self, rec: &Recording, report: &Report) {
        let (s, v) = (&report.summary, &report.verdict);
        let role_of = |pid: u32| {
            s.processes
                .iter()
                .find(|p| p.pid == pid)
                .map_or_else(|| "unknown".to_string(), |p| self.role(&p.role))
        };
        let service_role = if s.processes.len() == 1 {
            self.role(&s.processes[0].role)
        } else {
            "service".to_string()
        };
        for c in &v.causes {
            let labels = CauseLabels {
                cause: super::serde_name(&c.cause()),
                mechanism_id: c.mechanism.id().to_string(),
                process_role: c
                    .acts_in
                    .as_ref()
                    .map_or_else(|| service_role.clone(), |a| self.role(&a.role)),
            };
            self.causes
                .attributed
                .get_or_create(&labels)
                .inc_by(c.attributed_ns.max(0.0) / 1e9);
        }
        self.causes
            .windows
            .get_or_create(&PrimaryLabels {
                primary: super::serde_name(&v.primary),
            })
            .inc();
        self.causes
            .window_seconds
            .inc_by(s.duration_ns as f64 / 1e9);
        for t in &rec.threads {
            self.sched
                .runq_wait
                .get_or_create(&RoleLabels {
                    process_role: role_of(t.pid),
                })
                .add(t.totals.time.runq_wait_ns, &t.runq_wait_log2_hist);
        }
        let classify = Classifier::new(rec);
        let pid_of: std::collections::HashMap<u32, u32> =
            rec.threads.iter().map(|t| (t.tid, t.pid)).collect();
        for w in &rec.wakers {
            let pid = pid_of.get(&w.tid).copied().unwrap_or(0);
            let kind = classify.of_record(w).kind;
            self.sched
                .blocked
                .get_or_create(&WakerLabels {
                    process_role: role_of(pid),
                    waker: super::serde_name(&kind),
                })
                .add(w.blocked_ns, &w.hist);
        }
        if let Some(reqs) = &rec.requests {
            for r in &reqs.spans {
                self.requests
                    .latency
                    .observe(r.end_ns.saturating_sub(r.start_ns) as f64 / 1e9);
            }
        }
        self.add_gpu(report);
        self.add_own(rec, s);
    }

    /// Adds one window's losses, the tracer's own CPU time, and when the window ended.
    fn add_own(&self, rec: &Recording, s: &Summary) {
        let l = &s.losses;
        self.own.dropped.inc_by(
            l.ringbuf_dropped
                + l.thread_map_full
                + l.preemptor_map_full
                + l.migration_map_full
                + l.child_map_full
                + l.waker_map_full,
        );
        self.own.late.inc_by(l.late_records);
        if let Some(c) = &s.tracer_cost {
            self.own.own_cpu.inc_by(c.cpu_ns as f64 / 1e9);
        }
        self.own
            .last_window
            .set(rec.host.unix_ns(rec.end_ns) as f64 / 1e9);
    }

    fn add_gpu(&self, report: &Report) {
        let Some(g) = &report.summary.gpu else {
            return;
        };
        for d in &g.devices {
            let labels = GpuLabels {
                gpu: d.index.to_string(),
                uuid: d.uuid.clone(),
            };
            if let Some(u) = d.util_gpu_pct {
                self.gpu.gpu_util.get_or_create(&labels).set(u / 100.0);
            }
            if let Some(c) = d.sm_clock_mhz {
                self.gpu.sm_clock.get_or_create(&labels).set(c * 1e6);
            }
            for v in &d.clock_violations {
                self.gpu
                    .violation
                    .get_or_create(&PolicyLabels {
                        gpu: labels.gpu.clone(),
                        uuid: labels.uuid.clone(),
                        policy: v.policy.clone(),
                    })
                    .inc_by(v.ns as f64 / 1e9);
            }
        }
    }
}

/// The windows and the causes found in them.
struct CauseSeries {
    attributed: Family<CauseLabels, FloatCounter>,
    windows: Family<PrimaryLabels, Counter>,
    window_seconds: FloatCounter,
}

impl CauseSeries {
    /// Registers the series of the windows and their causes.
    fn register(r: &mut Registry) -> Self {
        let attributed = Family::<CauseLabels, FloatCounter>::default();
        r.register_with_unit(
            "tracer_attributed",
            "Time each cause took: the threads' time lost to it over a window, or its share of \
             the tail requests' excess over the median",
            Unit::Seconds,
            attributed.clone(),
        );
        let windows = Family::<PrimaryLabels, Counter>::default();
        r.register(
            "tracer_windows",
            "Windows closed, by their primary cause (none: nothing found)",
            windows.clone(),
        );
        let window_seconds = FloatCounter::default();
        r.register_with_unit(
            "tracer_recorded",
            "Time covered by the windows closed",
            Unit::Seconds,
            window_seconds.clone(),
        );
        Self {
            attributed,
            windows,
            window_seconds,
        }
    }
}

/// The target's threads' scheduling: run-queue waits and blocked intervals.
struct SchedSeries {
    runq_wait: Family<RoleLabels, Log2Histogram>,
    blocked: Family<WakerLabels, Log2Histogram>,
}

impl SchedSeries {
    /// Registers the run-queue wait and blocked-interval histograms.
    fn register(r: &mut Registry) -> Self {
        let runq_wait = Family::<RoleLabels, Log2Histogram>::default();
        r.register_with_unit(
            "tracer_runqueue_wait",
            "Run-queue waits of the target's threads (runnable until on a CPU), by process role",
            Unit::Seconds,
            runq_wait.clone(),
        );
        let blocked = Family::<WakerLabels, Log2Histogram>::default();
        r.register_with_unit(
            "tracer_blocked",
            "Blocked intervals of the target's threads, by process role and by what ended them",
            Unit::Seconds,
            blocked.clone(),
        );
        Self { runq_wait, blocked }
    }
}

/// The target's requests.
struct RequestSeries {
    latency: Histogram,
}

impl RequestSeries {
    /// Registers the request latency histogram.
    fn register(r: &mut Registry) -> Self {
        let latency = Histogram::new(exponential_buckets(1e-4, 2.0, 21));
        r.register_with_unit(
            "tracer_request_latency",
            "Latency of the target's requests (from its markers or latency log)",
            Unit::Seconds,
            latency.clone(),
        );
        Self { latency }
    }
}

/// The GPUs, from NVML.
struct GpuSeries {
    gpu_util: Family<GpuLabels, FloatGauge>,
    sm_clock: Family<GpuLabels, FloatGauge>,
    violation: Family<PolicyLabels, FloatCounter>,
}

impl GpuSeries {
    /// Registers the GPUs' utilization, SM clock and clock-violation series.
    fn register(r: &mut Registry) -> Self {
        let gpu_util = Family::<GpuLabels, FloatGauge>::default();
        r.register(
            "tracer_gpu_utilization_ratio",
            "GPU utilization over the last window (NVML), 0..1",
            gpu_util.clone(),
        );
        let sm_clock = Family::<GpuLabels, FloatGauge>::default();
        r.register(
            "tracer_gpu_sm_clock_hertz",
            "Mean SM clock over the last window (NVML)",
            sm_clock.clone(),
        );
        let violation = Family::<PolicyLabels, FloatCounter>::default();
        r.register_with_unit(
            "tracer_gpu_clock_violation",
            "Time an NVML performance policy held the GPU's clocks down",
            Unit::Seconds,
            violation.clone(),
        );
        Self {
            gpu_util,
            sm_clock,
            violation,
        }
    }
}

/// The tracer's own: its losses, cost, last window and flight recorder.
struct OwnSeries {
    dropped: Counter,
    late: Counter,
    own_cpu: FloatCounter,
    own_rss: Gauge,
    /// The last window's end, CLOCK_REALTIME seconds.
    last_window: FloatGauge,
    triggers: Counter,
    flight_bytes: Gauge,
}

impl OwnSeries {
    /// Registers the tracer's own series: losses, CPU and memory, last window, flight recorder.
    fn register(r: &mut Registry) -> Self {
        let dropped = Counter::default();
        r.register(
            "tracer_dropped_events",
            "Timeline records lost to a full ring buffer, and map entries that found no room \
             (the kernel's totals stay exact)",
            dropped.clone(),
        );
        let late = Counter::default();
        r.register(
            "tracer_late_records",
            "Records that arrived after their window was reported",
            late.clone(),
        );
        let own_cpu = FloatCounter::default();
        r.register_with_unit(
            "tracer_cpu",
            "CPU time of the tracer's own process (user and system)",
            Unit::Seconds,
            own_cpu.clone(),
        );
        let own_rss = Gauge::default();
        r.register_with_unit(
            "tracer_resident_memory",
            "Resident memory of the tracer's own process",
            Unit::Bytes,
            own_rss.clone(),
        );
        let last_window = FloatGauge::default();
        r.register_with_unit(
            "tracer_last_window_end_timestamp",
            "When the last window closed (Unix time)",
            Unit::Seconds,
            last_window.clone(),
        );
        let triggers = Counter::default();
        r.register(
            "tracer_triggers",
            "Flight-recorder triggers (SIGUSR1, POST /trigger, automatic)",
            triggers.clone(),
        );
        let flight_bytes = Gauge::default();
        r.register_with_unit(
            "tracer_flight_recorder",
            "Timeline records the flight recorder holds (--keep)",
            Unit::Bytes,
            flight_bytes.clone(),
        );
        Self {
            dropped,
            late,
            own_cpu,
            own_rss,
            last_window,
            triggers,
            flight_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::testutil::{recording, thread};

    /// Numbered workers (a role falls back to the command name) cannot grow the series
    /// without end: past `MAX_ROLES` they are `other`, and a role seen first keeps its own.
    #[test]
    fn process_roles_are_bounded() {
        let m = Metrics::new();
        let given: std::collections::BTreeSet<String> =
            (0..1000).map(|i| m.role(&format!("job-{i}"))).collect();
        assert_eq!(given.len(), MAX_ROLES + 1, "{given:?}");
        assert!(given.contains("other"));
        assert_eq!(m.role("job-0"), "job-0");
        assert_eq!(m.role("job-999"), "other");
    }

    #[test]
    fn a_window_becomes_series_without_thread_ids() {
        let mut t = thread(4242, 9_000, 1_000, &[2_000, 3_000_000]);
        t.pid = 100;
        let rec = recording(vec![t], vec![]);
        let report = crate::analysis::analyze(&rec);
        let m = Metrics::new();
        m.add(&rec, &report);
        m.add(&rec, &report);
        let text = m.encode();
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("# TYPE tracer_runqueue_wait_seconds histogram"),
            "{text}"
        );
        // Two windows of the same thread: its two waits twice, the 3 ms one in the 4.2 ms
        // bucket (slot 22) and above.
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .to_string()
        };
        assert!(line("tracer_runqueue_wait_seconds_count{").ends_with(" 4"));
        assert!(line("tracer_runqueue_wait_seconds_bucket{le=\"0.004194304\"").ends_with(" 4"));
        assert!(line("tracer_runqueue_wait_seconds_bucket{le=\"0.002097152\"").ends_with(" 2"));
        assert!(line("tracer_windows_total{").contains("primary=\""));
        let recorded: f64 = line("tracer_recorded_seconds_total")
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a number");
        assert!(
            (recorded - 2e-5).abs() < 1e-12,
            "two windows of 10 us: {recorded}"
        );
        assert!(
            !text.contains("4242"),
            "a thread ID is never a label or value:\n{text}"
        );
        assert!(!text.contains("tid="), "{text}");
    }

    #[test]
    fn a_process_name_cannot_break_the_exposition() {
        assert_eq!(label("py\"th\\on\n"), "py_th_on_");
        assert_eq!(label("engine_core_dp0"), "engine_core_dp0");
    }
}
