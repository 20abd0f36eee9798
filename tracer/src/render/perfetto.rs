//! Perfetto's native trace format (a protobuf `Trace` of `TracePacket`s), which the Perfetto UI
//! (ui.perfetto.dev) opens: a track per thread with its states as slices (a run-queue wait
//! names the task that had the CPU), a track per thread with its synchronizing CUDA calls and
//! one with the requests it served, a track per CPU with the target's threads running there,
//! and counter tracks for run-queue wait, MPKI, GPU utilization and clocks, and the number of
//! threads waiting on the GPU.
//!
//! The handful of messages needed are encoded by hand; field numbers are those of Perfetto's
//! published protos (protos/perfetto/trace/trace_packet.proto, clock_snapshot.proto,
//! track_event/*.proto). Timestamps are CLOCK_MONOTONIC nanoseconds, declared so (the
//! sequence's default clock) with a clock snapshot of MONOTONIC against REALTIME, so the file
//! lines up with other traces of the same host. Timed packets are written in time order.

use tracer_common::PerfSlot;

use crate::{
    recording::Recording,
    recording::timeline::{self, State},
};

/// Protobuf wire encoding of the few field kinds used.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(((field as u64) << 3) | wire as u64);
    }
    fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        self.key(field, 0);
        self.varint(v);
        self
    }
    fn double(&mut self, field: u32, v: f64) -> &mut Self {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
        self
    }
    fn string(&mut self, field: u32, s: &str) -> &mut Self {
        self.bytes(field, s.as_bytes())
    }
    fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
        self.bytes(field, &m.0)
    }
}

// TracePacket fields.
const PACKET_TIMESTAMP: u32 = 8;
const PACKET_SEQUENCE_ID: u32 = 10;
const PACKET_TRACK_EVENT: u32 = 11;
const PACKET_SEQUENCE_FLAGS: u32 = 13;
const PACKET_TRACK_DESCRIPTOR: u32 = 60;
const PACKET_CLOCK_SNAPSHOT: u32 = 6;
const PACKET_DEFAULTS: u32 = 59;
const DEFAULTS_TIMESTAMP_CLOCK_ID: u32 = 58;
const SEQ_INCREMENTAL_STATE_CLEARED: u64 = 1;
// ClockSnapshot fields, and the builtin clocks.
const SNAPSHOT_CLOCKS: u32 = 1;
const SNAPSHOT_PRIMARY_CLOCK: u32 = 2;
const CLOCK_ID: u32 = 1;
const CLOCK_TIMESTAMP: u32 = 2;
const CLOCK_REALTIME: u64 = 1;
const CLOCK_MONOTONIC: u64 = 3;
// TrackDescriptor fields.
const TRACK_UUID: u32 = 1;
const TRACK_NAME: u32 = 2;
const TRACK_PROCESS: u32 = 3;
const TRACK_THREAD: u32 = 4;
const TRACK_PARENT: u32 = 5;
const TRACK_COUNTER: u32 = 8;
// ProcessDescriptor / ThreadDescriptor fields.
const PROCESS_PID: u32 = 1;
const PROCESS_NAME: u32 = 6;
const THREAD_PID: u32 = 1;
const THREAD_TID: u32 = 2;
const THREAD_NAME: u32 = 5;
// CounterDescriptor fields.
const COUNTER_UNIT: u32 = 3;
const UNIT_TIME_NS: u64 = 1;
const UNIT_COUNT: u64 = 2;
// TrackEvent fields.
const EVENT_DEBUG_ANNOTATIONS: u32 = 4;
const EVENT_TYPE: u32 = 9;
const EVENT_TRACK: u32 = 11;
const EVENT_NAME: u32 = 23;
const EVENT_COUNTER: u32 = 30;
const EVENT_DOUBLE_COUNTER: u32 = 44;
const TYPE_SLICE_BEGIN: u64 = 1;
const TYPE_SLICE_END: u64 = 2;
const TYPE_COUNTER: u64 = 4;
// DebugAnnotation fields.
const ANNOTATION_NAME: u32 = 10;
const ANNOTATION_UINT: u32 = 3;
const ANNOTATION_STRING: u32 = 6;
// Trace field.
const TRACE_PACKET: u32 = 1;

/// Our one packet sequence.
const SEQUENCE: u64 = 1;

struct Writer {
    trace: Msg,
    first: bool,
    /// Timed packets, emitted sorted by time (stable: a slice's begin stays before its end
    /// at the same time) once every descriptor is out.
    timed: Vec<(u64, Msg)>,
}

/// An argument shown with a slice.
enum Arg<'a> {
    Str(&'a str, &'a str),
    Uint(&'a str, u64),
}

impl Writer {
    /// A packet of the sequence; the first clears its state and sets its clock.
    fn packet(&mut self, ts: Option<u64>, field: u32, body: &Msg) {
        let mut p = Msg::default();
        if let Some(ts) = ts {
            p.uint(PACKET_TIMESTAMP, ts);
        }
        p.uint(PACKET_SEQUENCE_ID, SEQUENCE);
        if self.first {
            p.uint(PACKET_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED);
            let mut d = Msg::default();
            d.uint(DEFAULTS_TIMESTAMP_CLOCK_ID, CLOCK_MONOTONIC);
            p.msg(PACKET_DEFAULTS, &d);
            self.first = false;
        }
        p.msg(field, body);
        match ts {
            Some(ts) => self.timed.push((ts, p)),
            None => {
                self.trace.msg(TRACE_PACKET, &p);
            }
        }
    }

    /// The trace: descriptors first, then the timed packets in time order.
    fn finish(mut self) -> Vec<u8> {
        self.timed.sort_by_key(|(ts, _)| *ts);
        for (_, p) in &self.timed {
            self.trace.msg(TRACE_PACKET, p);
        }
        self.trace.0
    }

    /// MONOTONIC (the timestamps' clock) against REALTIME at `t`.
    fn clock_snapshot(&mut self, t: u64, realtime_minus_monotonic: i64) {
        let mut snap = Msg::default();
        for (id, ts) in [
            (CLOCK_MONOTONIC, t),
            (
                CLOCK_REALTIME,
                t.saturating_add_signed(realtime_minus_monotonic),
            ),
        ] {
            let mut c = Msg::default();
            c.uint(CLOCK_ID, id).uint(CLOCK_TIMESTAMP, ts);
            snap.msg(SNAPSHOT_CLOCKS, &c);
        }
        snap.uint(SNAPSHOT_PRIMARY_CLOCK, CLOCK_MONOTONIC);
        let mut p = Msg::default();
        p.uint(PACKET_TIMESTAMP, t)
            .uint(PACKET_SEQUENCE_ID, SEQUENCE)
            .msg(PACKET_CLOCK_SNAPSHOT, &snap);
        self.trace.msg(TRACE_PACKET, &p);
    }

    fn track(&mut self, d: &Msg) {
        self.packet(None, PACKET_TRACK_DESCRIPTOR, d);
    }

    fn counter_track(&mut self, uuid: u64, parent: u64, name: &str, unit: u64) {
        let mut c = Msg::default();
        c.uint(COUNTER_UNIT, unit);
        let mut d = Msg::default();
        d.uint(TRACK_UUID, uuid)
            .uint(TRACK_PARENT, parent)
            .string(TRACK_NAME, name)
            .msg(TRACK_COUNTER, &c);
        self.track(&d);
    }

    fn slice(&mut self, track: u64, start: u64, end: u64, name: &str) {
        self.slice_with(track, (start, end), name, &[]);
    }

    fn slice_with(&mut self, track: u64, (start, end): (u64, u64), name: &str, args: &[Arg]) {
        let mut b = Msg::default();
        b.uint(EVENT_TYPE, TYPE_SLICE_BEGIN)
            .uint(EVENT_TRACK, track)
            .string(EVENT_NAME, name);
        for a in args {
            let mut d = Msg::default();
            match a {
                Arg::Str(k, v) => d.string(ANNOTATION_NAME, k).string(ANNOTATION_STRING, v),
                Arg::Uint(k, v) => d.string(ANNOTATION_NAME, k).uint(ANNOTATION_UINT, *v),
            };
            b.msg(EVENT_DEBUG_ANNOTATIONS, &d);
        }
        self.packet(Some(start), PACKET_TRACK_EVENT, &b);
        let mut e = Msg::default();
        e.uint(EVENT_TYPE, TYPE_SLICE_END).uint(EVENT_TRACK, track);
        self.packet(Some(end), PACKET_TRACK_EVENT, &e);
    }

    fn counter(&mut self, track: u64, ts: u64, value: f64) {
        let mut c = Msg::default();
        c.uint(EVENT_TYPE, TYPE_COUNTER).uint(EVENT_TRACK, track);
        if value.fract() == 0.0 && value >= 0.0 {
            c.uint(EVENT_COUNTER, value as u64);
        } else {
            c.double(EVENT_DOUBLE_COUNTER, value);
        }
        self.packet(Some(ts), PACKET_TRACK_EVENT, &c);
    }
}

/// Track identifiers: the process, each thread, each thread's CUDA, request and collection
/// tracks, the counters.
const PROCESS_UUID: u64 = 1;
/// The other processes of the target set.
fn process_uuid(pid: u32) -> u64 {
    0x4_0000_0000 | pid as u64
}
fn thread_uuid(tid: u32) -> u64 {
    0x1_0000_0000 | tid as u64
}
fn cuda_uuid(tid: u32) -> u64 {
    0x2_0000_0000 | tid as u64
}
fn requests_uuid(tid: u32) -> u64 {
    0x5_0000_0000 | tid as u64
}
fn cpu_uuid(cpu: u32) -> u64 {
    0x6_0000_0000 | cpu as u64
}
fn pauses_uuid(tid: u32) -> u64 {
    0x7_0000_0000 | tid as u64
}
const RUNQ_UUID: u64 = 10;
const MPKI_UUID: u64 = 11;
const CUDA_WAITING_UUID: u64 = 12;
fn gpu_uuid(device: u32, metric: u64) -> u64 {
    0x3_0000_0000 | ((device as u64) << 8) | metric
}

pub fn render(rec: &Recording) -> Vec<u8> {
    let mut w = Writer {
        trace: Msg::default(),
        first: true,
        timed: Vec::new(),
    };
    w.clock_snapshot(rec.start_ns, rec.host.realtime_minus_monotonic_ns);
    // A process track per member of the target set, the first given (which the counters
    // hang under) as PROCESS_UUID; recordings from before process trees have the target alone.
    let target = rec.target.pid;
    // Looked up once per thread: a search of the thread list for each was quadratic.
    let records: std::collections::HashMap<u32, &crate::recording::ThreadRecord> =
        rec.threads.iter().map(|r| (r.tid, r)).collect();
    let uuid_of = |pid: u32| {
        if pid == target {
            PROCESS_UUID
        } else {
            process_uuid(pid)
        }
    };
    let mut members: Vec<(u32, &str)> = vec![(target, rec.target.comm.as_str())];
    members.extend(
        rec.processes
            .iter()
            .filter(|p| p.pid != target)
            .map(|p| (p.pid, p.comm.as_str())),
    );
    for (pid, comm) in members {
        let mut p = Msg::default();
        p.uint(PROCESS_PID, pid as u64).string(PROCESS_NAME, comm);
        let mut d = Msg::default();
        d.uint(TRACK_UUID, uuid_of(pid)).msg(TRACK_PROCESS, &p);
        w.track(&d);
    }

    let timelines = rec.threads_over_time();
    let names = Names::new(rec);
    for t in timelines.values() {
        let record = records.get(&t.tid);
        let name = record.map_or(String::new(), |r| r.comm.clone());
        // A thread of a file from before process trees (pid 0) is the target's.
        let pid = record.map_or(target, |r| if r.pid == 0 { target } else { r.pid });
        let mut th = Msg::default();
        th.uint(THREAD_PID, pid as u64)
            .uint(THREAD_TID, t.tid as u64)
            .string(THREAD_NAME, &name);
        let mut d = Msg::default();
        d.uint(TRACK_UUID, thread_uuid(t.tid))
            .uint(TRACK_PARENT, uuid_of(pid))
            .msg(TRACK_THREAD, &th);
        w.track(&d);
        // Running and waiting are slices; blocked is the gap between them.
        for i in t.intervals.iter().filter(|i| i.state != State::Blocked) {
            state_slice(&mut w, t.tid, i, &names);
        }
        requests_track(&mut w, rec, (t.tid, &name), uuid_of(pid));
        pauses_track(&mut w, rec, (t.tid, &name), uuid_of(pid));
        let spans: Vec<_> = timeline::cuda_spans(&rec.cuda_syncs, t.tid).collect();
        if !spans.is_empty() {
            let mut d = Msg::default();
            d.uint(TRACK_UUID, cuda_uuid(t.tid))
                .uint(TRACK_PARENT, uuid_of(pid))
                .string(TRACK_NAME, &format!("{} {name}: CUDA sync", t.tid));
            w.track(&d);
            for s in spans {
                let f =
                    tracer_common::CudaFn::try_from(s.function).map_or("CUDA sync", |f| f.symbol());
                w.slice(cuda_uuid(t.tid), s.start_ns, s.end_ns, f);
            }
        }
    }

    cpu_tracks(&mut w, timelines, &names);
    run_queue_counter(&mut w, rec, timelines);
    mpki_counter(&mut w, rec);
    cuda_waiting_counter(&mut w, rec);
    gpu_counters(&mut w, rec);
    w.finish()
}

/// A running or runnable interval; a wait ended by a switch-in names the task that had the
/// CPU before the thread got it.
fn state_slice(w: &mut Writer, tid: u32, i: &timeline::Interval, names: &Names) {
    let span = (i.start_ns, i.end_ns);
    match (i.state, i.cpu, i.wait) {
        (State::Running, Some(c), _) => w.slice(
            thread_uuid(tid),
            span.0,
            span.1,
            &format!("running on CPU {c}"),
        ),
        (State::Runnable, _, Some((kind, prev))) => {
            let who = names.describe(prev);
            let args = [
                Arg::Str("ran_before", &who),
                Arg::Uint("ran_before_tid", prev as u64),
                Arg::Str("wait", kind.name()),
                // The part its cgroup's quota held it (0 where not throttled).
                Arg::Uint("throttled_ns", i.throttled_ns),
            ];
            w.slice_with(thread_uuid(tid), span, "waiting for a CPU", &args)
        }
        (s, _, _) => w.slice(thread_uuid(tid), span.0, span.1, s.name()),
    }
}

/// A thread's garbage collections, on a track of their own: a collection runs on the thread
/// and spans its state slices (it may be preempted inside one), so it cannot nest in them.
fn pauses_track(w: &mut Writer, rec: &Recording, (tid, name): (u32, &str), parent: u64) {
    let mut pauses = rec
        .runtime_pauses
        .iter()
        .filter(|p| p.tid == tid)
        .peekable();
    if pauses.peek().is_none() {
        return;
    }
    let mut d = Msg::default();
    d.uint(TRACK_UUID, pauses_uuid(tid))
        .uint(TRACK_PARENT, parent)
        .string(TRACK_NAME, &format!("{tid} {name}: garbage collections"));
    w.track(&d);
    for p in pauses {
        let generation = p.generation.map(u64::from);
        let mut args = Vec::new();
        if let Some(g) = generation {
            args.push(Arg::Uint("generation", g));
        }
        if let Some(c) = p.collected {
            args.push(Arg::Uint("collected", c));
        }
        let title = match generation {
            Some(g) => format!("gc (generation {g})"),
            None => "gc".to_string(),
        };
        w.slice_with(pauses_uuid(tid), (p.start_ns, p.end_ns), &title, &args);
    }
}

/// The requests a thread served, on a track of their own (a request spans many of the
/// thread's state slices, which cannot nest in it).
fn requests_track(w: &mut Writer, rec: &Recording, (tid, name): (u32, &str), parent: u64) {
    let Some(set) = &rec.requests else { return };
    let spans: Vec<_> = set.spans.iter().filter(|r| r.tid == tid).collect();
    if spans.is_empty() {
        return;
    }
    let mut d = Msg::default();
    d.uint(TRACK_UUID, requests_uuid(tid))
        .uint(TRACK_PARENT, parent)
        .string(TRACK_NAME, &format!("{tid} {name}: requests"));
    w.track(&d);
    for r in spans {
        let label =
            r.id.map_or("request".to_string(), |id| format!("request {id}"));
        let mut args = vec![Arg::Uint("wall_ns", r.end_ns - r.start_ns)];
        if let Some(id) = r.id {
            args.push(Arg::Uint("id", id));
        }
        w.slice_with(requests_uuid(tid), (r.start_ns, r.end_ns), &label, &args);
    }
}

/// Per CPU, the target's threads running on it: the CPU's view, as Perfetto shows a kernel
/// trace's. Intervals that the timeline's clock makes overlap by a little are cut at the
/// previous one's end, so each track's slices never nest.
fn cpu_tracks(w: &mut Writer, timelines: &timeline::Timelines, names: &Names) {
    let mut per_cpu: std::collections::BTreeMap<u32, Vec<(u64, u64, u32)>> = Default::default();
    for t in timelines.values() {
        for i in t.intervals.iter().filter(|i| i.state == State::Running) {
            if let Some(c) = i.cpu {
                per_cpu
                    .entry(c)
                    .or_default()
                    .push((i.start_ns, i.end_ns, t.tid));
            }
        }
    }
    for (cpu, mut v) in per_cpu {
        let mut d = Msg::default();
        d.uint(TRACK_UUID, cpu_uuid(cpu))
            .string(TRACK_NAME, &format!("CPU {cpu}: the target's threads"));
        w.track(&d);
        v.sort_unstable();
        let mut last = 0;
        for (a, b, tid) in v {
            let a = a.max(last);
            if b <= a {
                continue;
            }
            last = b;
            let name = format!("{tid} {}", names.threads.get(&tid).copied().unwrap_or(""));
            w.slice(cpu_uuid(cpu), a, b, &name);
        }
    }
}

/// Names of the tasks that had a CPU before a target thread got it: the target's threads and
/// the preemptors the kernel side recorded.
struct Names<'a> {
    threads: std::collections::HashMap<u32, &'a str>,
    others: std::collections::HashMap<u32, (&'a str, u32)>,
}

impl<'a> Names<'a> {
    fn new(rec: &'a Recording) -> Self {
        Self {
            threads: rec
                .threads
                .iter()
                .map(|t| (t.tid, t.comm.as_str()))
                .collect(),
            others: rec
                .preemptors
                .iter()
                .map(|p| (p.pid, (p.comm.as_str(), p.tgid)))
                .collect(),
        }
    }

    fn describe(&self, tid: u32) -> String {
        if tid == 0 {
            return "idle (no task)".into();
        }
        if let Some(c) = self.threads.get(&tid) {
            return format!("{c} (thread {tid} of the target)");
        }
        match self.others.get(&tid) {
            Some((c, tgid)) => format!("{c} (PID {tgid}, thread {tid})"),
            None => format!("thread {tid}"),
        }
    }
}

/// Run-queue wait of all threads per counter bin (ns of waiting per bin).
fn run_queue_counter(
    w: &mut Writer,
    rec: &Recording,
    timelines: &std::collections::BTreeMap<u32, timeline::ThreadTimeline>,
) {
    let bin = rec.counter_bins.bin_ns.max(1);
    let span = rec.end_ns.saturating_sub(rec.start_ns);
    if span == 0 || timelines.is_empty() {
        return;
    }
    let n = span.div_ceil(bin) as usize;
    let mut per_bin = vec![0u64; n];
    for i in timelines
        .values()
        .flat_map(|t| &t.intervals)
        .filter(|i| i.state == State::Runnable)
    {
        let mut t = i.start_ns;
        while t < i.end_ns {
            let b = ((t - rec.start_ns) / bin) as usize;
            let until = i.end_ns.min(rec.start_ns + (b as u64 + 1) * bin);
            if let Some(v) = per_bin.get_mut(b) {
                *v += until - t;
            }
            t = until;
        }
    }
    w.counter_track(
        RUNQ_UUID,
        PROCESS_UUID,
        "run-queue wait per bin",
        UNIT_TIME_NS,
    );
    for (b, v) in per_bin.iter().enumerate() {
        w.counter(RUNQ_UUID, rec.start_ns + b as u64 * bin, *v as f64);
    }
}

/// LLC misses per thousand instructions, all threads, per counter bin (with a PMU only).
fn mpki_counter(w: &mut Writer, rec: &Recording) {
    let need = (1 << PerfSlot::LlcMisses as u32) | (1 << PerfSlot::Instructions as u32);
    if rec.counter_mask & need != need {
        return;
    }
    let mut sums: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for bins in rec.counter_bins.threads.values() {
        for (b, v) in bins {
            let e = sums.entry(*b).or_default();
            e.0 += v[PerfSlot::LlcMisses as usize];
            e.1 += v[PerfSlot::Instructions as usize];
        }
    }
    w.counter_track(MPKI_UUID, PROCESS_UUID, "LLC MPKI", UNIT_COUNT);
    for (b, (misses, instr)) in sums {
        if instr > 0.0 {
            let ts = rec.counter_bins.start_ns + b * rec.counter_bins.bin_ns;
            w.counter(MPKI_UUID, ts, misses * 1000.0 / instr);
        }
    }
}

/// How many threads are inside a synchronizing CUDA call, at each change.
fn cuda_waiting_counter(w: &mut Writer, rec: &Recording) {
    if rec.cuda_syncs.is_empty() {
        return;
    }
    let mut edges: Vec<(u64, i64)> = rec
        .cuda_syncs
        .iter()
        .flat_map(|s| [(s.start_ns, 1), (s.end_ns, -1)])
        .collect();
    edges.sort();
    w.counter_track(
        CUDA_WAITING_UUID,
        PROCESS_UUID,
        "threads waiting on the GPU (CUDA sync)",
        UNIT_COUNT,
    );
    let mut n = 0i64;
    for (ts, d) in edges {
        n += d;
        w.counter(CUDA_WAITING_UUID, ts, n.max(0) as f64);
    }
}

/// One GPU metric of a poll.
type Metric = fn(&crate::recording::gpu::GpuPoll) -> Option<f64>;

fn gpu_counters(w: &mut Writer, rec: &Recording) {
    let Some(g) = &rec.gpu else { return };
    for d in &g.devices {
        let polls: Vec<_> = g.polls.iter().filter(|p| p.device == d.index).collect();
        let metrics: [(u64, &str, Metric); 4] = [
            (1, "utilization %", |p| p.util_gpu_pct.map(f64::from)),
            (2, "SM activity %", |p| p.gpm?.sm_activity_pct),
            (3, "tensor activity %", |p| p.gpm?.tensor_activity_pct),
            (4, "SM clock MHz", |p| p.sm_clock_mhz.map(f64::from)),
        ];
        for (id, name, get) in metrics {
            let values: Vec<(u64, f64)> = polls
                .iter()
                .filter_map(|p| Some((p.t_ns, get(p)?)))
                .collect();
            if values.is_empty() {
                continue;
            }
            let uuid = gpu_uuid(d.index, id);
            w.counter_track(
                uuid,
                PROCESS_UUID,
                &format!("GPU {} {name}", d.index),
                UNIT_COUNT,
            );
            for (ts, v) in values {
                w.counter(uuid, ts, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_protobuf_varints() {
        let mut m = Msg::default();
        m.varint(1);
        m.varint(300);
        m.varint(u64::MAX);
        assert_eq!(&m.0[..3], &[0x01, 0xac, 0x02]);
        assert_eq!(m.0.len(), 3 + 10);
        let mut k = Msg::default();
        k.uint(PACKET_TRACK_DESCRIPTOR, 5);
        // Field 60, wire type 0: (60 << 3) = 480 = 0xe0 0x03.
        assert_eq!(k.0, vec![0xe0, 0x03, 0x05]);
    }
}
