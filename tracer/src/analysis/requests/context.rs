//! What decomposing requests on one recording reads, built once per recording: each thread's
//! states, CUDA calls, migrations and counter slices, the idle-CPU stalls, the held locks and
//! pauses. A watch window's request that began in the window before is decomposed on both
//! recordings: its earlier part on the previous window's context (`add_earlier`).

use std::collections::HashMap;

use tracer_common::{EventKind, PerfSlot};

use super::{
    RequestDetail, ThreadView, decompose,
    parts::{add_blocked, add_holder, rank_blocked, rank_holders},
    queue,
    stalls::Stalls,
};
use crate::{
    analysis::held::Held,
    recording::{CudaSpan, Recording, requests::RequestSpan, timeline::Timelines},
};

pub(super) struct Context<'a> {
    timelines: &'a Timelines,
    stalls: Stalls,
    held: Held<'a>,
    /// LLC misses and instructions were both counted.
    llc: bool,
    /// The cgroup's quota period (quota.rs).
    quota_period_ns: u64,
    /// By thread, each sorted.
    migrations: HashMap<u32, Vec<u64>>,
    /// (start, end, llc misses, instructions).
    slices: HashMap<u32, Vec<(u64, u64, u64, u64)>>,
    syncs: HashMap<u32, Vec<&'a CudaSpan>>,
}

impl<'a> Context<'a> {
    pub(super) fn new(rec: &'a Recording) -> Self {
        let timelines = rec.threads_over_time();
        let llc_mask = (1 << PerfSlot::LlcMisses as u32) | (1 << PerfSlot::Instructions as u32);
        let llc = rec.counter_mask & llc_mask == llc_mask;
        let mut migrations: HashMap<u32, Vec<u64>> = HashMap::new();
        for ev in &rec.timeline.events {
            if ev.event_kind() == Ok(EventKind::Migrate) {
                migrations.entry(ev.tid).or_default().push(ev.ts_ns);
            }
        }
        let mut slices: HashMap<u32, Vec<(u64, u64, u64, u64)>> = HashMap::new();
        if llc {
            for sl in &rec.timeline.slices {
                slices.entry(sl.tid).or_default().push((
                    sl.start_ns,
                    sl.ts_ns,
                    sl.values[PerfSlot::LlcMisses as usize],
                    sl.values[PerfSlot::Instructions as usize],
                ));
            }
        }
        let mut syncs: HashMap<u32, Vec<&CudaSpan>> = HashMap::new();
        for c in &rec.cuda_syncs {
            syncs.entry(c.tid).or_default().push(c);
        }
        migrations.values_mut().for_each(|v| v.sort_unstable());
        slices.values_mut().for_each(|v| v.sort_unstable());
        syncs
            .values_mut()
            .for_each(|v| v.sort_by_key(|c| c.start_ns));
        Self {
            timelines,
            stalls: Stalls::build(timelines),
            held: Held::build(rec, timelines),
            llc,
            quota_period_ns: super::quota::period_ns(rec),
            migrations,
            slices,
            syncs,
        }
    }

    /// Any thread's states and CUDA waits (the hop to a waker, handoff.rs, reads no more).
    fn other(&self, tid: u32) -> Option<ThreadView<'_>> {
        Some(ThreadView {
            intervals: &self.timelines.get(&tid)?.intervals,
            syncs: self.syncs.get(&tid).map_or(&[], Vec::as_slice),
            migrations: &[],
            slices: &[],
        })
    }

    /// `r` decomposed on its serving thread, which was on earlier requests until
    /// `busy_until`.
    pub(super) fn decompose(
        &self,
        r: &RequestSpan,
        busy_until: u64,
    ) -> (RequestDetail, queue::QueuedSpans) {
        let view = ThreadView {
            intervals: self.timelines.get(&r.tid).map_or(&[], |t| &t.intervals),
            syncs: self.syncs.get(&r.tid).map_or(&[], Vec::as_slice),
            migrations: self.migrations.get(&r.tid).map_or(&[], Vec::as_slice),
            slices: self.slices.get(&r.tid).map_or(&[], Vec::as_slice),
        };
        let other = |tid: u32| self.other(tid);
        decompose(
            r,
            &view,
            (&self.stalls, &self.held, &other),
            busy_until,
            (self.llc, self.quota_period_ns),
        )
    }
}

impl RequestDetail {
    /// Adds the request's part before this window, `pre`: the same request decomposed on the
    /// window before, which covers it up to that window's end. What neither covers stays
    /// uncovered.
    pub(super) fn add_earlier(&mut self, pre: &RequestDetail) {
        let mut parts = pre.parts;
        parts.uncovered_ns = 0.0;
        self.parts.uncovered_ns = 0.0;
        self.parts.add_scaled(&parts, 1.0);
        self.parts.uncovered_ns = (self.wall_ns as f64 - self.parts.covered_ns()).max(0.0);
        self.migrations += pre.migrations;
        self.cuda_device_sync_ns += pre.cuda_device_sync_ns;
        self.llc_misses = self.llc_misses.zip(pre.llc_misses).map(|(a, b)| a + b);
        self.instructions = self.instructions.zip(pre.instructions).map(|(a, b)| a + b);
        for h in &pre.lock_holders {
            add_holder(&mut self.lock_holders, *h);
        }
        rank_holders(&mut self.lock_holders);
        for b in &pre.blocked_by {
            add_blocked(&mut self.blocked_by, b.by.clone(), b.ns);
        }
        rank_blocked(&mut self.blocked_by);
    }
}
