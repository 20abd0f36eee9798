//! What the timeline records add to a recording: run-queue wait samples and their kinds,
//! counter bins, CUDA spans and launch bins, requests from the marker probes, and (when kept)
//! the records themselves. The same code runs while
//! recording and when a trace file is read back, so both give the same recording.

use std::collections::BTreeMap;

use tracer_common::EventKind;

use super::records::Record;
use super::{
    CudaSpan, Recording, Timeline, WaitSamples,
    counters::CounterBins,
    requests::Pairing,
    waits::{WaitClasses, WaitKind},
};

/// One thread's run-queue waits, as they come.
#[derive(Default)]
struct ThreadWaits {
    samples: WaitSamples,
    classes: WaitClasses,
}

pub struct Collector {
    /// Looked up at every switch-in: a fast hash (foldhash) rather than a tree or SipHash,
    /// which were most of the reader's time at 500k events/s (BENCHMARKS.md).
    waits: foldhash::HashMap<u32, ThreadWaits>,
    bins: CounterBins,
    cuda_syncs: Vec<CudaSpan>,
    cuda_launches: BTreeMap<u32, BTreeMap<u64, u64>>,
    timeline: Option<Timeline>,
    requests: Pairing,
    /// Collections begun and not ended, by thread (start, generation); and those ended.
    gc_open: foldhash::HashMap<u32, (u64, Option<u32>)>,
    pauses: Vec<super::pauses::RuntimePause>,
    /// Handoff time by partner (the task that held the CPU until it blocked: the switch-in
    /// record's `aux`), for the preemptor records.
    handoffs: foldhash::HashMap<u32, u64>,
    /// Records seen.
    pub records: u64,
}

impl Collector {
    /// `keep`: also keep every record (for outputs that draw the timeline).
    pub fn new(start_ns: u64, bin_ns: u64, keep: bool) -> Self {
        Self {
            waits: Default::default(),
            bins: CounterBins::new(start_ns, bin_ns),
            cuda_syncs: Vec::new(),
            cuda_launches: BTreeMap::new(),
            timeline: keep.then(Timeline::default),
            requests: Pairing::default(),
            gc_open: Default::default(),
            pauses: Vec::new(),
            handoffs: Default::default(),
            records: 0,
        }
    }

    pub fn on_record(&mut self, rec: Record) {
        self.records += 1;
        match rec {
            Record::Event(ev) => {
                match ev.event_kind() {
                    Ok(EventKind::SwitchIn) if ev.value > 0 => {
                        let t = self.waits.entry(ev.tid).or_default();
                        t.samples.record(ev.value);
                        if let Some(kind) = WaitKind::of(&ev) {
                            t.classes.add(kind, ev.value, ev.part_ns());
                            if kind == WaitKind::Handoff {
                                *self.handoffs.entry(ev.aux).or_default() += ev.handoff_ns();
                            }
                        }
                    }
                    Ok(EventKind::RequestStart | EventKind::RequestEnd) => {
                        self.requests.on_event(&ev)
                    }
                    Ok(EventKind::CudaSync) => self.cuda_syncs.push(CudaSpan {
                        tid: ev.tid,
                        start_ns: ev.ts_ns.saturating_sub(ev.value),
                        end_ns: ev.ts_ns,
                        function: ev.aux,
                    }),
                    Ok(EventKind::GcStart) => {
                        let generation = (ev.aux == 1).then_some(ev.value as u32);
                        self.gc_open.insert(ev.tid, (ev.ts_ns, generation));
                    }
                    Ok(EventKind::GcDone) => {
                        // A collection that began before the probes were attached has no start.
                        if let Some((start, generation)) = self.gc_open.remove(&ev.tid) {
                            self.pauses.push(super::pauses::RuntimePause {
                                tid: ev.tid,
                                pid: 0,
                                start_ns: start,
                                end_ns: ev.ts_ns,
                                generation,
                                collected: (ev.aux == 1).then_some(ev.value),
                            });
                        }
                    }
                    Ok(EventKind::CudaLaunch) => {
                        let bin = self.bin_of(ev.ts_ns);
                        *self
                            .cuda_launches
                            .entry(ev.tid)
                            .or_default()
                            .entry(bin)
                            .or_default() += 1;
                    }
                    _ => {}
                }
                if let Some(t) = self.timeline.as_mut() {
                    t.events.push(ev);
                }
            }
            Record::Counters(slice) => {
                let width = self.bins.bin_ns;
                self.bins.add(&slice);
                self.follow_widening(width);
                if let Some(t) = self.timeline.as_mut() {
                    t.slices.push(slice);
                }
            }
        }
    }

    /// The collector of the window that starts at `start`, where this one's ends (`tracer
    /// watch`): a collection begun in this window ends in that one, so its start moves over.
    pub fn successor(&mut self, start: u64) -> Self {
        let mut next = Self::new(start, self.bins.bin_ns, self.timeline.is_some());
        next.gc_open = std::mem::take(&mut self.gc_open);
        next
    }

    /// Once this window (from `start`) has all its records (`tracer watch`): the requests
    /// begun in it and still open end in the next, `next`, so their starts move over (and meet
    /// the ends that reached `next` first).
    pub fn hand_over_requests(&mut self, start: u64, next: &mut Collector) {
        next.requests.adopt(self.requests.take_open(start));
    }

    /// The counter bin of time `t` (the launch bins share their width).
    fn bin_of(&mut self, t: u64) -> u64 {
        let width = self.bins.bin_ns;
        let b = self.bins.bin_of(t);
        self.follow_widening(width);
        b
    }

    /// Widens the launch bins as the counter bins were, from `width`.
    fn follow_widening(&mut self, mut width: u64) {
        while width < self.bins.bin_ns {
            for bins in self.cuda_launches.values_mut() {
                super::counters::widen(bins, |a, b| *a += b);
            }
            width *= 2;
        }
    }

    /// Run-queue wait samples by thread, for assembling thread records.
    pub fn take_samples(&mut self) -> BTreeMap<u32, WaitSamples> {
        self.waits
            .iter_mut()
            .map(|(&tid, t)| (tid, std::mem::take(&mut t.samples)))
            .collect()
    }

    /// Run-queue waits by kind, by thread.
    pub fn take_waits(&mut self) -> BTreeMap<u32, WaitClasses> {
        self.waits
            .iter_mut()
            .map(|(&tid, t)| (tid, std::mem::take(&mut t.classes)))
            .collect()
    }

    /// Puts the derived data into `rec`; CUDA calls and requests that ended after the window
    /// are left out. The events are sorted by time here, once (stable: equal stamps keep
    /// their arrival order), for everything that follows threads through them.
    pub fn finish_into(self, rec: &mut Recording) {
        let end = rec.end_ns;
        if self.requests.seen {
            rec.requests = Some(self.requests.finish(end));
        }
        let mut syncs = self.cuda_syncs;
        syncs.retain(|s| s.end_ns <= end);
        rec.cuda_syncs = syncs;
        rec.cuda_launch_bins = self.cuda_launches;
        // Each pause's process, from its thread; the ones wholly in the window, in time order.
        let pid_of: std::collections::HashMap<u32, u32> =
            rec.threads.iter().map(|t| (t.tid, t.pid)).collect();
        let mut pauses = self.pauses;
        pauses.retain(|p| p.start_ns >= rec.start_ns && p.end_ns <= end);
        for p in &mut pauses {
            p.pid = pid_of.get(&p.tid).copied().unwrap_or(rec.target.pid);
        }
        pauses.sort_by_key(|p| p.start_ns);
        rec.runtime_pauses = pauses;
        rec.counter_bins = self.bins;
        for p in &mut rec.preemptors {
            p.handoff_ns = self
                .handoffs
                .get(&p.pid)
                .copied()
                .unwrap_or(0)
                .min(p.wait_ns);
        }
        let mut timeline = self.timeline.unwrap_or_default();
        timeline.events.sort_by_key(|e| e.ts_ns);
        rec.timeline = timeline;
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::{Event, WAIT_CODE_SHIFT, WaitCode};

    use super::*;

    fn ev(ts_ns: u64, tid: u32, kind: EventKind, aux: u32, value: u64) -> Record {
        Record::Event(Event {
            ts_ns,
            tid,
            kind: kind as u32,
            cpu: 0,
            aux,
            value,
        })
    }

    fn coded(r: Record, code: WaitCode) -> Record {
        match r {
            Record::Event(mut e) => {
                e.kind |= (code as u32) << WAIT_CODE_SHIFT;
                Record::Event(e)
            }
            other => other,
        }
    }

    #[test]
    fn waits_are_classified_by_the_kernel_whatever_the_arrival_order() {
        // Thread 1 is preempted on CPU 0 and moved; it runs on CPU 1, whose batch arrives
        // first. The switch-in says what the wait was: order does not matter.
        let records = [
            coded(ev(300, 1, EventKind::SwitchIn, 7, 200), WaitCode::Migration),
            ev(150, 1, EventKind::Migrate, 0, 0),
            ev(100, 1, EventKind::SwitchOut, 1, 50),
            coded(ev(500, 2, EventKind::SwitchIn, 0, 40), WaitCode::IdleCpu),
        ];
        let mut c = Collector::new(0, 1_000, false);
        for r in records {
            c.on_record(r);
        }
        let waits = c.take_waits();
        assert_eq!(
            (waits[&1].migration_waits, waits[&1].migration_ns),
            (1, 200)
        );
        assert_eq!(waits[&1].contention_waits, 0);
        assert_eq!((waits[&2].idle_cpu_waits, waits[&2].idle_cpu_ns), (1, 40));
        assert_eq!(c.take_samples()[&1].len(), 1);
    }
}
