//! The verdict on recordings built by hand, one per cause and mixed, through the whole
//! analysis (timeline, request decomposition, summary, verdict).

use tracer_common::{
    CudaFn, Event, EventKind, PERF_SLOTS, PerfSlot, THROTTLED_SHIFT, WAIT_CODE_SHIFT, WaitCode,
};

use super::*;
use crate::{
    analysis::analyze,
    recording::testutil::{recording, thread},
    recording::{
        CgroupRecording, CudaSpan, CudaTotals, PreemptorRecord, Recording,
        cgroup::{CgroupSample, CgroupVersion, CpuCgroup, Throttling},
        gpu::{GpuDevice, GpuRecording, UtilKind, UtilSample},
        requests::{RequestSet, RequestSource, RequestSpan},
        timeline::{self, State},
        waits::WaitKind,
    },
};

const MS: u64 = 1_000_000;
const TID: u32 = 10;
const HOG: u32 = 99;
/// A sibling of the serving thread (the same process) that holds a lock.
const HOLDER: u32 = 11;
#[cfg(target_arch = "x86_64")]
const FUTEX: u64 = 202;
#[cfg(not(target_arch = "x86_64"))]
const FUTEX: u64 = 98;

#[derive(Clone, Copy)]
enum Part {
    Run(u64),
    /// Preempted for this long; `prev` had the CPU last; `moved`: migrated while waiting.
    Wait {
        ns: u64,
        prev: u32,
        moved: bool,
    },
    /// Preempted for this long behind `prev`, the cgroup throttled for all of it (the
    /// kernel's throttled share in the switch-in record).
    Throttled {
        ns: u64,
        prev: u32,
    },
    /// Blocked in a CUDA synchronize.
    Gpu(u64),
    /// Blocked in a futex for this long until thread `HOLDER` of the process woke it.
    Lock(u64),
}

use Part::*;

/// A serving thread and its requests, as the probes would have recorded them.
struct Server {
    events: Vec<Event>,
    spans: Vec<RequestSpan>,
    syncs: Vec<CudaSpan>,
    slices: Vec<tracer_common::CounterSlice>,
    t: u64,
    cpu: u32,
    /// LLC misses per 1000 instructions of the `Run` parts of the next request (with a PMU).
    mpki: Option<u64>,
    /// The CUDA function of the `Gpu` parts (`CudaFn`).
    sync_fn: CudaFn,
}

impl Server {
    fn new() -> Self {
        Self {
            events: vec![],
            spans: vec![],
            syncs: vec![],
            slices: vec![],
            t: 10 * MS,
            cpu: 0,
            mpki: None,
            sync_fn: CudaFn::RtStreamSynchronize,
        }
    }

    fn ev(&mut self, ts: u64, kind: EventKind, aux: u32, value: u64) {
        self.events.push(Event {
            ts_ns: ts,
            tid: TID,
            kind: kind as u32,
            cpu: self.cpu,
            aux,
            value,
        });
    }

    /// A switch-in after `prev` ran, with the wait code the kernel side gives it.
    fn switch_in(&mut self, prev: u32, waited: u64, moved: bool) {
        let code = if moved {
            WaitCode::Migration
        } else if prev == 0 {
            WaitCode::IdleCpu
        } else {
            WaitCode::Contention
        };
        self.ev(self.t, EventKind::SwitchIn, prev, waited);
        self.events.last_mut().unwrap().kind |= (code as u32) << WAIT_CODE_SHIFT;
    }

    fn run(&mut self, ns: u64) {
        if let Some(mpki) = self.mpki {
            let instructions = ns * 2; // 2 instructions per ns
            let mut values = [0u64; PERF_SLOTS];
            values[PerfSlot::Instructions as usize] = instructions;
            values[PerfSlot::LlcMisses as usize] = instructions * mpki / 1000;
            values[PerfSlot::Cycles as usize] = ns * 3;
            self.slices.push(tracer_common::CounterSlice {
                ts_ns: self.t + ns,
                tid: TID,
                kind: EventKind::CounterSlice as u32,
                cpu: self.cpu,
                valid: (1 << PerfSlot::Instructions as u32)
                    | (1 << PerfSlot::LlcMisses as u32)
                    | (1 << PerfSlot::Cycles as u32),
                start_ns: self.t,
                values,
            });
        }
        self.t += ns;
    }

    /// One request: woken, on a CPU 20 us later, through `parts`, then blocked until the next.
    fn request(&mut self, parts: &[Part]) {
        let start = self.t;
        self.ev(start, EventKind::Wakeup, 1, 0);
        self.t += 20_000;
        self.switch_in(5, 20_000, false);
        for &p in parts {
            match p {
                Run(ns) => self.run(ns),
                Wait { ns, prev, moved } => {
                    self.ev(self.t, EventKind::SwitchOut, 1, 0);
                    if moved {
                        self.cpu ^= 1;
                        self.ev(self.t + 1, EventKind::Migrate, self.cpu ^ 1, 0);
                    }
                    self.t += ns;
                    self.switch_in(prev, ns, moved);
                }
                Throttled { ns, prev } => {
                    self.ev(self.t, EventKind::SwitchOut, 1, 0);
                    self.t += ns;
                    self.switch_in(prev, ns, false);
                    self.events.last_mut().unwrap().kind |= 1000 << THROTTLED_SHIFT;
                }
                Gpu(ns) => {
                    self.syncs.push(CudaSpan {
                        tid: TID,
                        start_ns: self.t,
                        end_ns: self.t + ns,
                        function: self.sync_fn as u32,
                    });
                    self.ev(self.t, EventKind::SwitchOut, 0, 0);
                    self.t += ns;
                    self.ev(self.t, EventKind::Wakeup, 1, 0);
                    self.switch_in(5, 1, false);
                }
                Lock(ns) => {
                    self.ev(self.t, EventKind::SwitchOut, 0, 0);
                    self.t += ns;
                    // The waker and the system call, as `sched_waking` notes them.
                    self.ev(self.t, EventKind::Wakeup, HOLDER, FUTEX + 1);
                    self.switch_in(5, 1, false);
                }
            }
        }
        self.ev(self.t, EventKind::SwitchOut, 0, 0);
        self.spans.push(RequestSpan {
            start_ns: start,
            end_ns: self.t,
            tid: TID,
            id: None,
        });
        self.t += 2 * MS;
    }

    /// `n` requests, of which every `every`-th (from the 5th) is `slow`, the rest `normal`.
    fn serve(&mut self, n: usize, every: usize, normal: &[Part], slow: &[Part]) {
        for i in 0..n {
            self.request(if i % every == 4 { slow } else { normal });
        }
    }

    fn finish(self, preemptors: Vec<PreemptorRecord>) -> Recording {
        let (start, end) = (0, self.t + MS);
        let tl = timeline::build(&self.events, start, end);
        let t = &tl[&TID];
        let waits: Vec<u64> = t.waits.iter().map(|w| w.0).collect();
        let mut th = thread(
            TID,
            t.total(State::Running),
            t.total(State::Runnable),
            &waits,
        );
        th.totals.time.blocked_ns = t.total(State::Blocked);
        th.totals.switches.migrations = t.switches.migrations;
        for ev in &self.events {
            if let Some(kind) = WaitKind::of(ev)
                && ev.value > 1
            {
                th.wait_classes.add(kind, ev.value, ev.part_ns());
            }
        }
        if !self.syncs.is_empty() {
            let sync_ns = self.syncs.iter().map(|s| s.end_ns - s.start_ns).sum();
            th.cuda = Some(CudaTotals {
                launches: 0,
                sync_calls: self.syncs.len() as u64,
                sync_ns,
                sync_max_ns: 0,
                ..Default::default()
            });
        }
        let mut rec = recording(vec![th], preemptors);
        rec.start_ns = start;
        rec.end_ns = end;
        rec.timeline.events = self.events;
        rec.timeline.slices = self.slices;
        rec.cuda_syncs = self.syncs;
        rec.requests = Some(RequestSet {
            source: RequestSource::Markers,
            spans: self.spans,
            unpaired: 0,
        });
        rec
    }
}

fn hog(wait_ns: u64) -> PreemptorRecord {
    PreemptorRecord {
        pid: HOG,
        tgid: HOG,
        comm: "cpu-hog".into(),
        process_comm: Some("cpu-hog".into()),
        wait_ns,
        slices: 10,
        ..Default::default()
    }
}

fn with_pmu(rec: &mut Recording) {
    rec.capabilities.pmu.available = true;
    rec.capabilities.pmu.llc_available = true;
    rec.counter_mask = (1 << PerfSlot::Instructions as u32)
        | (1 << PerfSlot::LlcMisses as u32)
        | (1 << PerfSlot::Cycles as u32);
}

fn with_gpu(rec: &mut Recording, util: f64) {
    rec.capabilities.gpu.available = true;
    rec.capabilities.gpu.cuda.available = true;
    rec.gpu = Some(GpuRecording {
        devices: vec![GpuDevice {
            index: 0,
            name: "H200".into(),
            uuid: "GPU-x".into(),
            gpm_supported: false,
            used_by_target: true,
            contexts: vec![],
        }],
        util_samples: vec![UtilSample {
            device: 0,
            kind: UtilKind::Gpu,
            pid: 0,
            start_ns: rec.start_ns,
            end_ns: rec.end_ns,
            pct: util,
        }],
        ..Default::default()
    });
}

fn throttled_cgroup(rec: &mut Recording) {
    let sample = |t_ns: u64, n: u64| CgroupSample {
        t_ns,
        throttling: Throttling {
            nr_periods: n * 10,
            nr_throttled: n * 5,
            throttled_ns: n * 40 * MS,
        },
        limited: vec![],
    };
    rec.cgroup = Some(CgroupRecording {
        pids: vec![],
        cgroup: CpuCgroup {
            version: CgroupVersion::V2,
            path: "/sys/fs/cgroup/server".into(),
            name: "/server".into(),
            limits: vec![],
            throttling: None,
        },
        samples: vec![sample(rec.start_ns, 0), sample(rec.end_ns, 3)],
    });
}

fn verdict(rec: &Recording) -> Verdict {
    analyze(rec).verdict
}

const NORMAL: [Part; 1] = [Run(MS)];

#[test]
fn steady_requests_give_none() {
    let mut s = Server::new();
    s.serve(200, 1000, &NORMAL, &NORMAL);
    let v = verdict(&s.finish(vec![]));
    assert_eq!(v.primary, Primary::None, "{v:?}");
    assert!(
        v.headline.starts_with("No significant jitter"),
        "{}",
        v.headline
    );
    // What was not measured is said, not taken for absent.
    assert!(v.not_assessed.iter().any(|n| n.signal == "cache_misses"));
    assert!(v.not_assessed.iter().any(|n| n.signal == "gpu"));
}

/// `rec` cut to `[start, end)`: its events and the requests that end there (a watch window).
fn window_of(rec: &Recording, start: u64, end: u64) -> Recording {
    let mut w = rec.clone();
    (w.start_ns, w.end_ns) = (start, end);
    w.timeline
        .events
        .retain(|e| (start..end).contains(&e.ts_ns));
    let set = w.requests.as_mut().unwrap();
    set.spans.retain(|s| (start..end).contains(&s.end_ns));
    w
}

/// A request that began in one watch window and ended in the next is decomposed on both, as
/// the whole recording would: its parts add up to the same. Without the window before, its
/// part there is uncovered.
#[test]
fn a_request_across_windows_is_decomposed_on_both() {
    let mut s = Server::new();
    let slow = [
        Run(MS),
        Wait {
            ns: 20 * MS,
            prev: HOG,
            moved: false,
        },
        Run(MS),
    ];
    s.serve(30, 1000, &NORMAL, &slow);
    let whole = s.finish(vec![]);
    let long = whole.requests.as_ref().unwrap().spans[4];
    let cut = long.start_ns + 10 * MS;
    let (first, second) = (
        window_of(&whole, whole.start_ns, cut),
        window_of(&whole, cut, whole.end_ns),
    );
    let slowest = |r: &crate::analysis::requests::RequestAnalysis| r.slowest[0].clone();
    let all = crate::analysis::requests::analyze(&whole, None).unwrap();
    let joined = crate::analysis::requests::analyze(&second, Some(&first)).unwrap();
    let alone = crate::analysis::requests::analyze(&second, None).unwrap();
    assert_eq!(joined.requests, alone.requests);
    // Alone, the window does not cover the request's first 10 ms.
    let before = slowest(&alone).parts.uncovered_ns;
    assert!((before - 10.0 * MS as f64).abs() < 1.0, "{before}");
    let (a, b) = (slowest(&all), slowest(&joined));
    assert_eq!((a.start_ns, a.wall_ns), (b.start_ns, b.wall_ns));
    for (k, (x, y)) in a.parts.values().iter().zip(b.parts.values()).enumerate() {
        assert!(
            (x - y).abs() < 1.0,
            "{}: {x} whole, {y} across",
            crate::analysis::requests::Breakdown::FIELDS[k]
        );
    }
    assert!(
        b.parts.runq_contention_ns >= 19.0 * MS as f64,
        "{:?}",
        b.parts
    );
    assert!(b.parts.uncovered_ns < 1.0, "{:?}", b.parts);
}

/// Requests that name a thread the recording does not trace (a latency log's tid from another
/// process, or a Python thread ident instead of gettid()) are counted and named: their time is
/// all uncovered.
#[test]
fn requests_of_untraced_threads_are_named() {
    let mut s = Server::new();
    s.serve(50, 1000, &NORMAL, &NORMAL);
    let mut rec = s.finish(vec![]);
    let set = rec.requests.as_mut().unwrap();
    for span in set.spans.iter_mut().take(3) {
        span.tid = 4242;
    }
    let report = analyze(&rec);
    let r = report.summary.requests.as_ref().unwrap();
    assert_eq!(
        (r.untraced_requests, r.untraced_tids.clone()),
        (3, vec![4242])
    );
}

#[test]
fn futex_waits_a_sibling_ends_are_lock_contention_with_the_holder() {
    let mut s = Server::new();
    s.serve(200, 20, &NORMAL, &[Run(MS / 2), Lock(4 * MS), Run(MS / 2)]);
    let mut rec = s.finish(vec![]);
    let mut holder = thread(HOLDER, 0, 0, &[]);
    holder.comm = "lock-holder".into();
    rec.threads.push(holder);
    let report = analyze(&rec);
    let r = report.summary.requests.as_ref().expect("requests");
    // All of the tail's blocked time was the sibling's lock: its holder ended it.
    assert!(
        (r.tail.mean.lock_wait_ns - 4.0 * MS as f64).abs() < 1e3,
        "{:?}",
        r.tail.mean
    );
    assert_eq!(r.tail.lock_holders.first().map(|h| h.tid), Some(HOLDER));
    let by = &r.tail.blocked_by[0];
    let who = by.by.as_ref().expect("a waker");
    assert_eq!(
        (who.tid, who.kind),
        (HOLDER, crate::analysis::wakers::WakerKind::SameProcess)
    );
    assert_eq!(who.comm, "lock-holder");
    let blocked = r.tail.mean.lock_wait_ns + r.tail.mean.blocked_ns;
    let attributed: f64 = r.tail.blocked_by.iter().map(|b| b.ns).sum();
    assert!(
        (attributed - blocked).abs() < 1.0,
        "{attributed} vs {blocked}"
    );
    let v = &report.verdict;
    assert_eq!(v.primary, Primary::LockContention, "{v:?}");
    assert!(v.headline.contains("lock-holder"), "{}", v.headline);
    assert!(!v.headline.contains("GIL"), "{}", v.headline);
}

#[test]
fn waits_behind_another_task_are_contention() {
    let mut s = Server::new();
    let slow = [
        Run(MS / 2),
        Wait {
            ns: 5 * MS,
            prev: HOG,
            moved: false,
        },
        Run(MS / 2),
    ];
    s.serve(200, 20, &NORMAL, &slow);
    let v = verdict(&s.finish(vec![hog(50 * MS)]));
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    assert_eq!(v.basis, Basis::TailExcess);
    let top = &v.causes[0];
    assert!(
        top.mechanism.to_string().contains("cpu-hog"),
        "{}",
        top.mechanism
    );
    assert!(top.share > 0.9, "{}", top.share);
}

#[test]
fn waits_on_an_idle_cpu_in_a_throttled_cgroup_are_throttling() {
    let mut s = Server::new();
    let slow = [
        Run(MS / 2),
        Wait {
            ns: 5 * MS,
            prev: 0,
            moved: false,
        },
        Run(MS / 2),
    ];
    s.serve(200, 20, &NORMAL, &slow);
    let mut rec = s.finish(vec![]);
    throttled_cgroup(&mut rec);
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    assert_eq!(v.causes[0].mechanism.to_string(), "cgroup CPU throttling");
    // Without throttling, the same waits are a slow wakeup, not throttling.
    rec.cgroup = None;
    let v = verdict(&rec);
    assert_eq!(
        v.causes[0].mechanism.to_string(),
        "wakeup latency of idle CPUs"
    );
}

#[test]
fn waits_the_quota_held_behind_other_tasks_are_throttling() {
    // The kernel said the cgroup was throttled for all of the tail's waits, while a task of
    // another cgroup ran: the quota held the server, not the other task.
    let mut s = Server::new();
    let slow = [
        Run(MS / 2),
        Throttled {
            ns: 5 * MS,
            prev: HOG,
        },
        Run(MS / 2),
    ];
    s.serve(200, 20, &NORMAL, &slow);
    let mut rec = s.finish(vec![hog(50 * MS)]);
    throttled_cgroup(&mut rec);
    let report = analyze(&rec);
    let t = &report.summary.totals.wait_classes;
    assert_eq!(t.throttled_waits, 10);
    assert_eq!(t.throttled_ns, 50 * MS);
    let v = &report.verdict;
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    assert_eq!(v.causes[0].mechanism.to_string(), "cgroup CPU throttling");
    assert!(v.causes[0].share > 0.9, "{v:?}");
}

/// Over the window, a cgroup that ended 90 % of its periods throttled ran its quota in them
/// whatever else ran: that share of its waits behind other tasks goes to the quota.
#[test]
fn over_the_window_the_quota_makes_up_for_waits_behind_others_in_throttled_periods() {
    let mut rec = window(600, 300, vec![hog(300 * MS)]);
    throttled_cgroup(&mut rec);
    let c = rec.cgroup.as_mut().unwrap();
    c.samples[1].throttling.nr_throttled = 27;
    let v = verdict(&rec);
    assert_eq!(
        v.causes[0].mechanism.to_string(),
        "cgroup CPU throttling",
        "{v:?}"
    );
    // The 30 ms left behind the hog are 3 % of the wanted time, under `CONTENTION_MIN`.
    assert_eq!(v.causes.len(), 1, "{v:?}");
    assert!(
        v.causes[0]
            .evidence
            .contains("270ms of the waits behind other tasks"),
        "{}",
        v.causes[0].evidence
    );
    // Throttled in a tenth of its periods: the contention stays first.
    rec.cgroup.as_mut().unwrap().samples[1]
        .throttling
        .nr_throttled = 3;
    let v = verdict(&rec);
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .contains("run-queue contention"),
        "{v:?}"
    );
}

/// In a service over several cgroups, one member's throttled cgroup does not make another
/// member's waits behind other tasks its quota's.
#[test]
fn the_quota_rule_counts_each_members_own_cgroup() {
    let mut rec = window(600, 300, vec![hog(300 * MS)]);
    throttled_cgroup(&mut rec);
    let throttled = rec.cgroup.as_mut().unwrap();
    throttled.samples[1].throttling.nr_throttled = 27;
    throttled.pids = vec![999];
    let mut own = throttled.clone();
    own.pids = vec![100];
    own.samples[1].throttling.nr_throttled = 0;
    own.samples[1].throttling.throttled_ns = 0;
    rec.other_cgroups = vec![own];
    let v = verdict(&rec);
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .contains("run-queue contention"),
        "{v:?}"
    );
}

#[test]
fn waits_after_forced_moves_are_migrations() {
    let mut s = Server::new();
    let slow = [
        Run(MS / 2),
        Wait {
            ns: 3 * MS,
            prev: HOG,
            moved: true,
        },
        Run(MS / 2),
    ];
    s.serve(200, 20, &NORMAL, &slow);
    let v = verdict(&s.finish(vec![hog(30 * MS)]));
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    assert_eq!(v.causes[0].mechanism.to_string(), "migrations");
}

#[test]
fn moves_take_at_most_a_millisecond_of_extra_on_cpu_time_each() {
    // The tail moved once more and ran 4.5 ms longer: the move refilled caches for at most
    // MIGRATION_COST_MAX_NS; the rest was more work.
    let mut s = Server::new();
    let slow = [
        Run(MS / 2),
        Wait {
            ns: 50_000,
            prev: HOG,
            moved: true,
        },
        Run(5 * MS),
    ];
    s.serve(200, 20, &NORMAL, &slow);
    let v = verdict(&s.finish(vec![hog(MS)]));
    let share = |m: &str| {
        v.causes
            .iter()
            .find(|c| c.mechanism.to_string() == m)
            .map_or(0.0, |c| c.share)
    };
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .starts_with("longer on-CPU"),
        "{v:?}"
    );
    let moves = share("migrations");
    assert!(moves > 0.15 && moves < 0.3, "{moves}");
}

/// Tail requests run three times longer; with `mpki_tail`, their LLC MPKI.
fn slower_on_cpu(pmu: bool, mpki_tail: u64) -> Recording {
    let mut s = Server::new();
    for i in 0..200 {
        let slow = i % 20 == 4;
        if pmu {
            s.mpki = Some(if slow { mpki_tail } else { 2 });
        }
        s.request(&[Run(if slow { 3 * MS } else { MS })]);
    }
    let mut rec = s.finish(vec![]);
    if pmu {
        with_pmu(&mut rec);
    }
    rec
}

#[test]
fn longer_on_cpu_time_with_llc_misses_is_cache_thrash() {
    let v = verdict(&slower_on_cpu(true, 20));
    assert_eq!(v.primary, Primary::CacheThrash, "{v:?}");
    assert_eq!(v.causes[0].mechanism.to_string(), "LLC misses");
    assert!(!v.not_assessed.iter().any(|n| n.signal == "cache_misses"));
}

#[test]
fn longer_on_cpu_time_with_unchanged_misses_is_not_cache_thrash() {
    let v = verdict(&slower_on_cpu(true, 2));
    assert_eq!(v.primary, Primary::Unexplained, "{v:?}");
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .contains("cache misses unchanged")
    );
}

#[test]
fn without_a_pmu_cache_thrash_is_unexplained_and_not_assessed() {
    let v = verdict(&slower_on_cpu(false, 0));
    assert_eq!(v.primary, Primary::Unexplained, "{v:?}");
    assert!(v.causes[0].mechanism.to_string().contains("not measured"));
    assert!(v.not_assessed.iter().any(|n| n.signal == "cache_misses"));
    assert!(v.headline.starts_with("Unexplained"), "{}", v.headline);
}

#[test]
fn gpu_waits_on_a_busy_gpu_are_gpu_saturation() {
    let mut s = Server::new();
    s.serve(200, 20, &[Run(MS), Gpu(MS / 5)], &[Run(MS), Gpu(6 * MS)]);
    let mut rec = s.finish(vec![]);
    with_gpu(&mut rec, 95.0);
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::GpuSaturation, "{v:?}");
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .starts_with("SM saturation (GPU 95%"),
        "{}",
        v.causes[0].mechanism
    );
    assert_eq!(
        v.bound.as_deref().map(|b| b.starts_with("GPU-bound")),
        Some(true)
    );
}

#[test]
fn gpu_waits_in_device_wide_synchronize_are_sync_stalls() {
    let mut s = Server::new();
    s.sync_fn = CudaFn::RtDeviceSynchronize;
    s.serve(200, 20, &[Run(MS), Gpu(MS / 5)], &[Run(MS), Gpu(6 * MS)]);
    let mut rec = s.finish(vec![]);
    with_gpu(&mut rec, 60.0);
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::GpuSaturation, "{v:?}");
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .starts_with("synchronization stalls"),
        "{}",
        v.causes[0].mechanism
    );
}

#[test]
fn a_gpu_busy_with_other_processes_is_named() {
    let mut s = Server::new();
    s.serve(200, 20, &[Run(MS), Gpu(MS / 5)], &[Run(MS), Gpu(6 * MS)]);
    let mut rec = s.finish(vec![]);
    with_gpu(&mut rec, 98.0);
    let g = rec.gpu.as_mut().unwrap();
    let own = UtilSample {
        kind: UtilKind::ProcessSm,
        pct: 30.0,
        ..g.util_samples[0]
    };
    g.util_samples.push(own);
    let v = verdict(&rec);
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .starts_with("SM saturation by other processes"),
        "{}",
        v.causes[0].mechanism
    );
}

#[test]
fn in_mixed_cases_the_larger_cause_ranks_first() {
    let wait = |ns| Wait {
        ns,
        prev: HOG,
        moved: false,
    };
    for (wait_ms, gpu_ms, first) in [(4, 1, Primary::Scheduling), (1, 4, Primary::GpuSaturation)] {
        let mut s = Server::new();
        s.serve(
            200,
            20,
            &[Run(MS), Gpu(MS / 5)],
            &[
                Run(MS / 2),
                wait(wait_ms * MS),
                Run(MS / 2),
                Gpu(MS / 5 + gpu_ms * MS),
            ],
        );
        let mut rec = s.finish(vec![hog(40 * MS)]);
        with_gpu(&mut rec, 95.0);
        let v = verdict(&rec);
        assert_eq!(
            v.primary, first,
            "{wait_ms} ms waiting, {gpu_ms} ms GPU: {v:?}"
        );
        assert_eq!(v.causes.len(), 2, "{v:?}");
        let (a, b) = (&v.causes[0], &v.causes[1]);
        assert!(a.share > b.share);
        assert!(
            (a.share - 0.8).abs() < 0.05 && (b.share - 0.2).abs() < 0.05,
            "{a:?} {b:?}"
        );
    }
}

/// Window-level: no requests, only thread totals.
fn window(on_ms: u64, rq_ms: u64, preemptors: Vec<PreemptorRecord>) -> Recording {
    let mut t = thread(TID, on_ms * MS, rq_ms * MS, &[rq_ms * MS]);
    t.wait_classes
        .add(crate::recording::waits::WaitKind::Contention, rq_ms * MS, 0);
    let mut rec = recording(vec![t], preemptors);
    rec.start_ns = 0;
    rec.end_ns = 1000 * MS;
    rec
}

/// A cause found in a window of milliseconds stands, and says how little it rests on
/// (`tracer run -- sh -c 'exit 3'`: "migrations" from one move in 4.4 ms, said as if sure).
#[test]
fn a_cause_from_a_short_window_says_so() {
    let mut rec = window(6, 3, vec![hog(3 * MS)]);
    rec.end_ns = 10 * MS;
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    assert!(
        v.headline.starts_with("Scheduling in only 10.0ms: "),
        "{}",
        v.headline
    );
    let whole = verdict(&window(600, 300, vec![hog(300 * MS)]));
    assert!(!whole.headline.contains("in only"), "{}", whole.headline);
}

#[test]
fn without_requests_the_impediments_decide() {
    let v = verdict(&window(600, 300, vec![hog(300 * MS)]));
    assert_eq!(
        (v.primary, v.basis),
        (Primary::Scheduling, Basis::LostTime),
        "{v:?}"
    );
    assert!(v.causes[0].mechanism.to_string().contains("cpu-hog"));
    assert!(v.not_assessed.iter().any(|n| n.signal == "request_latency"));
    // 2 % waiting is below the threshold.
    let v = verdict(&window(980, 20, vec![hog(20 * MS)]));
    assert_eq!(v.primary, Primary::None, "{v:?}");
}

/// A serving thread that passes each request to a worker on its own CPU waits behind it until
/// it blocks (`WaitKind::Handoff`): the same run-queue wait, charged to the same thread, is
/// contention only when the kernel did not call it a handoff.
#[test]
fn handoff_waits_are_not_contention() {
    use crate::recording::waits::WaitKind;
    let worker = || PreemptorRecord {
        pid: TID + 1,
        tgid: 100,
        comm: "worker".into(),
        process_comm: Some("server".into()),
        wait_ns: 300 * MS,
        slices: 300,
        ..Default::default()
    };
    // The serving thread's waits: `handoff` ms of handoffs, `contention` ms behind others.
    let split = |mut rec: Recording, handoff: u64, contention: u64| {
        let c = &mut rec.threads[0].wait_classes;
        *c = Default::default();
        c.add(WaitKind::Handoff, handoff * MS, handoff * MS);
        c.add(WaitKind::Contention, contention * MS, 0);
        verdict(&rec)
    };
    let contended = verdict(&window(600, 300, vec![worker()]));
    assert_eq!(contended.primary, Primary::Scheduling, "{contended:?}");
    let v = split(window(600, 300, vec![worker()]), 280, 20);
    assert_eq!(v.primary, Primary::None, "{v:?}");
    // With a hog beside them, the waits behind it are contention, and the hog, not the
    // worker's handoffs, is the one named.
    let v = split(window(600, 400, vec![worker(), hog(100 * MS)]), 280, 120);
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    let named = v.causes[0].mechanism.to_string();
    assert!(
        named.contains("cpu-hog") && !named.contains("server"),
        "{named}"
    );
}

/// The partner can be outside the target set (a client, a front end left out): its handoffs
/// come off its own share, not the service's, and the neighbour that really took the CPU is
/// the one named.
#[test]
fn an_outside_partner_s_handoffs_come_off_its_own_share() {
    use crate::recording::waits::WaitKind;
    let client = PreemptorRecord {
        pid: 300,
        tgid: 300,
        comm: "client".into(),
        process_comm: Some("client".into()),
        wait_ns: 200 * MS,
        slices: 200,
        handoff_ns: 180 * MS,
        ..Default::default()
    };
    let mut rec = window(600, 300, vec![client, hog(100 * MS)]);
    let c = &mut rec.threads[0].wait_classes;
    *c = Default::default();
    c.add(WaitKind::Handoff, 180 * MS, 180 * MS);
    c.add(WaitKind::Contention, 120 * MS, 0);
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    let named = v.causes[0].mechanism.to_string();
    assert!(
        named.contains("cpu-hog") && !named.contains("client"),
        "{named}"
    );
    // Without the partners (a recording from before them), the total comes off the service's
    // own share only: the client, 200 ms, is named.
    rec.preemptors.iter_mut().for_each(|p| p.handoff_ns = 0);
    let named = verdict(&rec).causes[0].mechanism.to_string();
    assert!(named.contains("client"), "{named}");
}

#[test]
fn without_requests_a_thread_waiting_on_a_saturated_gpu_is_gpu_saturation() {
    let mut rec = window(300, 0, vec![]);
    rec.threads[0].cuda = Some(CudaTotals {
        launches: 1000,
        sync_calls: 100,
        sync_ns: 500 * MS,
        sync_max_ns: 10 * MS,
        ..Default::default()
    });
    with_gpu(&mut rec, 97.0);
    rec.threads[0].totals.time.blocked_ns = 700 * MS;
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::GpuSaturation, "{v:?}");
    // The same waits on a GPU at 40 %: not saturation.
    with_gpu(&mut rec, 40.0);
    assert_eq!(verdict(&rec).primary, Primary::None);
    // A server idle most of the window (30 ms on a CPU, 30 ms waiting on the GPU in 1 s) is
    // still slowed by a saturated GPU: the share is of its busy time.
    let mut rec = window(30, 0, vec![]);
    rec.threads[0].cuda = Some(CudaTotals {
        launches: 100,
        sync_calls: 30,
        sync_ns: 30 * MS,
        sync_max_ns: MS,
        ..Default::default()
    });
    rec.threads[0].totals.time.blocked_ns = 970 * MS;
    with_gpu(&mut rec, 97.0);
    assert_eq!(verdict(&rec).primary, Primary::GpuSaturation);
}

/// The serving thread launches kernels (100,000 in the window) and hardly synchronizes.
fn launching(rec: &mut Recording) {
    rec.threads.iter_mut().find(|t| t.tid == TID).unwrap().cuda = Some(CudaTotals {
        launches: 100_000,
        sync_calls: 10,
        sync_ns: 10_000,
        sync_max_ns: 1_000,
        ..Default::default()
    });
}

#[test]
fn a_server_on_its_cpu_through_every_request_while_the_gpu_idles_is_host_bound() {
    // Requests of 1 ms on a CPU launching kernels, 2 ms apart: on a CPU a third of the window
    // but all of each request, the GPU 20 % busy.
    let mut s = Server::new();
    s.serve(200, 20, &NORMAL, &NORMAL);
    let mut rec = s.finish(vec![]);
    launching(&mut rec);
    with_gpu(&mut rec, 20.0);
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::HostBound, "{v:?}");
    assert!(
        v.causes[0].evidence.contains("of its requests' time"),
        "{}",
        v.causes[0].evidence
    );
    assert!(
        v.causes[0]
            .mechanism
            .to_string()
            .contains("of its requests' time outside"),
        "{}",
        v.causes[0].mechanism
    );
    // Without the requests, a third of the window is not "most of it".
    rec.requests = None;
    assert_eq!(verdict(&rec).primary, Primary::None);
}

#[test]
fn a_tail_of_longer_on_cpu_time_in_a_thread_pacing_its_gpu_is_host_bound() {
    // Every fifth request runs 3 ms on its CPU instead of 1 ms: with no thread pacing a GPU the
    // extra time is unexplained; in a thread launching kernels through its requests while the
    // GPU idles, it is the host work the GPU waits for.
    let mut s = Server::new();
    s.serve(200, 5, &NORMAL, &[Run(3 * MS)]);
    let mut rec = s.finish(vec![]);
    assert_eq!(verdict(&rec).primary, Primary::Unexplained);
    launching(&mut rec);
    with_gpu(&mut rec, 20.0);
    let v = verdict(&rec);
    assert_eq!(
        (v.primary, v.basis),
        (Primary::HostBound, Basis::TailExcess),
        "{v:?}"
    );
    assert!(
        v.causes[0].evidence.contains("paces its GPU"),
        "{}",
        v.causes[0].evidence
    );
    // A busy GPU is not paced by the host: the extra time stays unexplained.
    with_gpu(&mut rec, 95.0);
    assert_eq!(verdict(&rec).primary, Primary::Unexplained);
}

fn member(pid: u32, ppid: u32, title: &str, given: bool) -> crate::recording::ProcessRecord {
    crate::recording::ProcessRecord {
        pid,
        ppid,
        comm: "python3".into(),
        cmdline: vec![title.into()],
        given,
        joined_ns: None,
        cgroup: None,
        python: None,
    }
}

/// A front end (PID 100, given) whose engine child (PID 200) waits behind a hog, and another
/// where the front end's own thread takes the engine's CPU.
fn service(front_end_waits: bool) -> Recording {
    let mut rec = window(600, 300, vec![]);
    rec.threads[0].tid = 201;
    rec.threads[0].pid = 200;
    let mut api = thread(101, 50 * MS, MS, &[MS]);
    api.wait_classes.add(WaitKind::Contention, MS, 0);
    rec.threads.push(api);
    rec.processes = vec![
        member(100, 1, "vllm serve", true),
        member(200, 100, "VLLM::EngineCore_DP0", false),
    ];
    rec.preemptors = vec![if front_end_waits {
        PreemptorRecord {
            pid: 101,
            tgid: 100,
            comm: "python3".into(),
            wait_ns: 300 * MS,
            ..hog(0)
        }
    } else {
        hog(300 * MS)
    }];
    rec
}

#[test]
fn the_member_where_the_cause_acts_is_named_whichever_pid_was_given() {
    let v = verdict(&service(false));
    assert_eq!(v.primary, Primary::Scheduling, "{v:?}");
    let at = v.causes[0].acts_in.as_ref().expect("placed");
    assert_eq!((at.pid, at.role.as_str()), (200, "engine_core_dp0"));
    assert!(at.share > 0.99, "{at:?}");
    assert!(
        v.headline.starts_with(
            "Scheduling in engine_core_dp0 (PID 200): run-queue contention: preempted by cpu-hog"
        ),
        "{}",
        v.headline
    );
    // A member taking another's CPU is the service itself, named, not a foreign process.
    let v = verdict(&service(true));
    let m = v.causes[0].mechanism.to_string();
    assert_eq!(
        m,
        "run-queue contention within the service: preempted by the service itself: \
         api_server (PID 100)",
        "{v:?}"
    );
}

#[test]
fn requests_queued_behind_long_ones_are_head_of_line_with_the_long_ones_named() {
    let mut s = Server::new();
    s.serve(200, 50, &NORMAL, &[Run(60 * MS)]);
    let mut rec = s.finish(vec![]);
    let spans = &mut rec.requests.as_mut().expect("requests").spans;
    // The three requests after each long one arrived while it ran, 10, 20 and 30 ms into it:
    // they waited in line (nothing else about them is slow).
    let long: Vec<u64> = (4..spans.len())
        .step_by(50)
        .map(|i| spans[i].start_ns)
        .collect();
    for i in (4..spans.len()).step_by(50) {
        for k in 1..=3 {
            spans[i + k].start_ns = spans[i].start_ns + k as u64 * 10 * MS;
        }
    }
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::HeadOfLine, "{v:#?}");
    let Mechanism::LongRequestOnServingThread { requests } = &v.causes[0].mechanism else {
        panic!("{v:#?}")
    };
    assert!(!requests.is_empty());
    for r in requests {
        assert!(
            long.contains(&(r.at_ns + rec.start_ns)),
            "{r:?} is not a long one"
        );
    }
    assert!(v.causes[0].share > 0.8, "{v:#?}");
    // The queued part is not left as queueing.
    assert!(
        v.causes.iter().all(|c| c.mechanism != Mechanism::Queueing),
        "{v:#?}"
    );
}

#[test]
fn the_late_rank_is_named_and_its_spinning_peer_is_not_gpu_saturation() {
    let rec = crate::recording::testutil::two_ranks();
    let s = crate::analysis::summary::build(&rec);
    let ranks = s.ranks.as_ref().expect("two ranks");
    assert_eq!(
        ranks
            .ranks
            .iter()
            .map(|r| (r.pid, r.gpus.clone()))
            .collect::<Vec<_>>(),
        vec![(300, vec![0]), (400, vec![1])]
    );
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::LateRank, "{v:#?}");
    let lead = &v.causes[0];
    assert_eq!(lead.mechanism.id(), "late_rank");
    assert_eq!(lead.acts_in.as_ref().map(|a| a.pid), Some(400));
    assert!(
        lead.mechanism
            .to_string()
            .starts_with("the rank on GPU 1 late, by off-CPU waits: the other ranks waited 450ms"),
        "{}",
        lead.mechanism
    );
    assert!(
        !v.causes.iter().any(|c| c.cause() == Primary::GpuSaturation),
        "{v:#?}"
    );
    // The same two processes without the late one's sleep: nobody is late, and the GPU waits
    // of PID 300 on its busy GPU are GPU saturation again.
    let mut rec = crate::recording::testutil::two_ranks();
    rec.threads[1].cuda = rec.threads[0].cuda;
    rec.threads[1].totals.time.blocked_ns = 200 * MS;
    let v = verdict(&rec);
    assert_eq!(v.primary, Primary::GpuSaturation, "{v:#?}");
}

/// An absence is claimed only from a window long enough to show one: a short window says how
/// little it rests on, an unfinished trace file says so, and no time at all judges nothing.
#[test]
fn absence_claims_say_what_they_rest_on() {
    // Requests of 1 ms each, back to back.
    let served = |n: usize| {
        let mut s = Server::new();
        s.serve(n, 1000, &NORMAL, &NORMAL);
        s.finish(vec![])
    };
    let short = verdict(&served(200));
    assert_eq!(short.primary, Primary::None, "{short:?}");
    assert!(short.headline.contains(" in only "), "{}", short.headline);
    assert!(
        short
            .not_assessed
            .iter()
            .any(|n| n.signal == "window_length"),
        "{short:?}"
    );

    let whole = verdict(&served(2000));
    assert_eq!(whole.primary, Primary::None, "{whole:?}");
    assert!(!whole.headline.contains("in only"), "{}", whole.headline);
    assert!(
        !whole
            .not_assessed
            .iter()
            .any(|n| n.signal == "window_length")
    );

    let mut cut = served(2000);
    cut.incomplete = Some("the file is cut short at byte 545".into());
    let cut = verdict(&cut);
    assert!(
        cut.headline.contains("of an unfinished trace file"),
        "{}",
        cut.headline
    );
    assert!(
        cut.not_assessed
            .iter()
            .any(|n| n.signal == "complete_recording"),
        "{cut:?}"
    );
    // A watch's `-i 1s` window a few ms short of the second is not a short window.
    let mut second = served(2000);
    second.end_ns = second.start_ns + 995 * MS;
    let second = verdict(&second);
    assert!(!second.headline.contains("in only"), "{}", second.headline);

    let mut empty = recording(vec![], vec![]);
    empty.end_ns = empty.start_ns;
    let empty = verdict(&empty);
    assert!(
        empty.headline.starts_with("Nothing to judge"),
        "{}",
        empty.headline
    );
}

/// Over the window, without requests: a worker's futex waits that a sibling ended are lock
/// contention when that sibling worked about as long as the worker waited for it, busy or not
/// over the whole window (a holder working in bursts); the waits a dispatcher ended, which ran
/// a sliver of them (it hands the worker its next job), are not.
#[test]
fn a_bursty_holder_over_the_window_is_lock_contention_and_a_dispatcher_is_not() {
    use crate::recording::wakers::WakerRecord;
    const DISPATCHER: u32 = 12;
    let by = |waker_tid: u32, blocked_ns: u64| WakerRecord {
        tid: TID,
        waker_tid,
        waker_tgid: 100,
        waker_comm: format!("t{waker_tid}"),
        kernel_thread: false,
        timer: false,
        syscall: Some(FUTEX as u32),
        blocked_ns,
        count: 5,
        max_ns: blocked_ns / 5,
        hist: vec![],
    };
    // A 10-us window: the worker on a CPU 30 % of it, blocked the rest.
    let with_holder = |holder_oncpu: u64| {
        let mut rec = recording(
            vec![
                thread(TID, 3_000, 0, &[]),
                thread(HOLDER, holder_oncpu, 0, &[]),
                thread(DISPATCHER, 10, 0, &[]),
            ],
            vec![],
        );
        rec.threads[0].totals.time.blocked_ns = 7_000;
        rec.wakers = vec![by(DISPATCHER, 5_700), by(HOLDER, 1_300)];
        rec
    };
    // The holder on a CPU 16 % of the window, the waits it ended 13 %.
    let v = verdict(&with_holder(1_600));
    assert_eq!(v.primary, Primary::LockContention, "{v:?}");
    assert!(v.headline.contains("thread 11"), "{}", v.headline);
    assert!(!v.headline.contains("thread 12"), "{}", v.headline);
    // The same waits ended by a thread that ran 3 % of the window: a hand-off, not a lock.
    let v = verdict(&with_holder(300));
    assert_ne!(v.primary, Primary::LockContention, "{v:?}");
}
