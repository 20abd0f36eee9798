//! What the timeline records add to a recording: run-queue wait samples and their kinds,
//! counter bins, CUDA spans and launch bins, requests from the marker probes, and (when kept)
//! the records themselves. The same code runs while
//! recording and when a trace file is read back, so both give the same recording.

use std::collections::BTreeMap;

use tracer_common::EventKind;

use super::{
    CudaSpan, Recording, Timeline, WaitSamples,
    counters::CounterBins,
    requests::Pairing,
    waits::{WaitClasses, WaitTracker},
};
use crate::sources::ebpf::Record;

pub struct Collector {
    samples: BTreeMap<u32, WaitSamples>,
    bins: CounterBins,
    cuda_syncs: Vec<CudaSpan>,
    cuda_launches: BTreeMap<u32, BTreeMap<u64, u64>>,
    timeline: Option<Timeline>,
    tracker: WaitTracker,
    waits: BTreeMap<u32, WaitClasses>,
    requests: Pairing,
    /// Records seen.
    pub records: u64,
}

impl Collector {
    /// `keep`: also keep every record (for outputs that draw the timeline).
    pub fn new(start_ns: u64, bin_ns: u64, keep: bool) -> Self {
        Self {
            samples: BTreeMap::new(),
            bins: CounterBins::new(start_ns, bin_ns),
            cuda_syncs: Vec::new(),
            cuda_launches: BTreeMap::new(),
            timeline: keep.then(Timeline::default),
            tracker: WaitTracker::default(),
            waits: BTreeMap::new(),
            requests: Pairing::default(),
            records: 0,
        }
    }

    pub fn on_record(&mut self, rec: Record) {
        self.records += 1;
        match rec {
            Record::Event(ev) => {
                let ended = self.tracker.on_event(&ev);
                match EventKind::try_from(ev.kind) {
                    Ok(EventKind::SwitchIn) if ev.value > 0 => {
                        self.samples.entry(ev.tid).or_default().record(ev.value);
                        if let Some(w) = ended {
                            self.waits.entry(ev.tid).or_default().add(w.kind, ev.value);
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
                    Ok(EventKind::CudaLaunch) => {
                        let bin = ev.ts_ns.saturating_sub(self.bins.start_ns) / self.bins.bin_ns;
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
                self.bins.add(&slice);
                if let Some(t) = self.timeline.as_mut() {
                    t.slices.push(slice);
                }
            }
        }
    }

    /// Run-queue wait samples by thread, for assembling thread records.
    pub fn take_samples(&mut self) -> BTreeMap<u32, WaitSamples> {
        std::mem::take(&mut self.samples)
    }

    /// Run-queue waits by kind, by thread.
    pub fn take_waits(&mut self) -> BTreeMap<u32, WaitClasses> {
        std::mem::take(&mut self.waits)
    }

    /// Puts the derived data into `rec`; CUDA calls and requests that ended after the window
    /// are left out.
    pub fn finish_into(self, rec: &mut Recording) {
        let end = rec.end_ns;
        if self.requests.seen {
            rec.requests = Some(self.requests.finish(end));
        }
        let mut syncs = self.cuda_syncs;
        syncs.retain(|s| s.end_ns <= end);
        rec.cuda_syncs = syncs;
        rec.cuda_launch_bins = self.cuda_launches;
        rec.counter_bins = self.bins;
        rec.timeline = self.timeline.unwrap_or_default();
    }
}
