//! Reading what the kernel side kept: per-thread totals, counters, CUDA accounting,
//! preemptors, migration routes and losses, and moving dead threads out of the maps.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use aya::maps::{HashMap, MapData, PerCpuArray, PerCpuValues};
use tracer_common::{
    BatchBuf, COUNTER_SLOTS, CudaThread, MigrationKey, Preemptor, ThreadCounters, ThreadState,
    ThreadStats, WakerKey, WakerStats,
};

use super::{Reaped, SchedProbes};
use crate::recording::{
    Losses,
    wakers::{WakerKeyOf, WakerRecord},
};

impl SchedProbes {
    fn threads_map(&mut self) -> Result<HashMap<&mut MapData, u32, ThreadStats>> {
        Ok(HashMap::try_from(
            self.ebpf.map_mut("THREADS").context("THREADS map")?,
        )?)
    }

    /// Removes the entries of threads that have exited and switched out for the last time, and
    /// returns them with their counters: the maps then have room for new threads however many
    /// come and go.
    pub fn reap_dead(&mut self) -> Result<Reaped> {
        // Every tenth call (about a second): a scan of the slots reads 4,096 cache lines (0.4 %
        // of a CPU at every call), one of the hash map costs two system calls per entry (a
        // process with 20,000 threads keeps 16,000 there: a third of a CPU at every call). A
        // dead thread's entry only keeps its room a second longer: to fill the map, a process
        // would have to start and end over 16,000 threads a second. And only while a thread
        // the records said ended has not been found dead (it is at its last switch-out), or
        // the ring buffer dropped records (an exit's among them, maybe): a server whose
        // threads live on, most, is scanned every 100th call only. Scanned cold once a second,
        // the slots were a fifth of an idle watch's CPU time.
        self.reaps += 1;
        if self.reaps % 10 != 1 {
            return Ok(Reaped::default());
        }
        let dropped = self
            .counter(tracer_common::Counter::RingbufDropped as u32)
            .unwrap_or(0);
        let scan =
            self.ended_unreaped > 0 || dropped != self.dropped_at_reap || self.reaps % 100 == 1;
        if !scan {
            return Ok(Reaped::default());
        }
        self.dropped_at_reap = dropped;
        let mut dead = self.slots.take_dead();
        let mut map = self.threads_map()?;
        let dead_hashed: Vec<ThreadStats> = map
            .iter()
            .filter_map(|r| r.ok())
            .map(|(_, v)| v)
            .filter(|v| v.state == ThreadState::Dead as u32)
            .collect();
        for t in &dead_hashed {
            let _ = map.remove(&t.tid);
        }
        dead.extend(dead_hashed);
        // A scan that found none clears the count: an exit counted that leaves no dead entry
        // (a TID reused at once, the main thread's exit in an exec that keeps its entry)
        // would otherwise keep the scans going every second for the rest of the run. A thread
        // still on its way out is found by the next exit's scan, or 10 s later.
        self.ended_unreaped = match dead.len() {
            0 => 0,
            n => self.ended_unreaped.saturating_sub(n as u64),
        };
        let mut counters = self.counters_map()?;
        let dead_counters: Vec<(u32, ThreadCounters)> = dead
            .iter()
            .filter_map(|t| Some((t.tid, counters.get(&t.tid, 0).ok()?)))
            .collect();
        for (tid, _) in &dead_counters {
            let _ = counters.remove(tid);
        }
        let mut cuda = self.cuda_map()?;
        let dead_cuda: Vec<(u32, CudaThread)> = dead
            .iter()
            .filter_map(|t| Some((t.tid, cuda.get(&t.tid, 0).ok()?)))
            .collect();
        for (tid, _) in &dead_cuda {
            let _ = cuda.remove(tid);
        }
        Ok(Reaped {
            stats: dead,
            counters: dead_counters,
            cuda: dead_cuda,
            ..Default::default()
        })
    }

    fn cuda_map(&mut self) -> Result<HashMap<&mut MapData, u32, CudaThread>> {
        Ok(HashMap::try_from(
            self.ebpf
                .map_mut("CUDA_THREADS")
                .context("CUDA_THREADS map")?,
        )?)
    }

    /// CUDA call accounting per thread.
    pub fn cuda_threads(&mut self) -> Result<Vec<(u32, CudaThread)>> {
        let map = self.cuda_map()?;
        Ok(map.iter().filter_map(|r| r.ok()).collect())
    }

    fn counters_map(&mut self) -> Result<HashMap<&mut MapData, u32, ThreadCounters>> {
        Ok(HashMap::try_from(
            self.ebpf
                .map_mut("THREAD_COUNTERS")
                .context("THREAD_COUNTERS map")?,
        )?)
    }

    /// Perf counter totals per thread.
    pub fn thread_counters(&mut self) -> Result<Vec<(u32, ThreadCounters)>> {
        let map = self.counters_map()?;
        Ok(map.iter().filter_map(|r| r.ok()).collect())
    }

    /// The records each CPU had gathered but not sent (tracer-ebpf `Batch`), for after the
    /// programs are detached.
    pub fn unsent_batches(&self) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .batches()?
            .iter()
            .map(|b| b.bytes[..(b.len as usize).min(b.bytes.len())].to_vec())
            .filter(|b| !b.is_empty())
            .collect())
    }

    /// The CPUs whose batch held records when read (a hint: each CPU keeps appending).
    pub fn cpus_holding_records(&self) -> Result<Vec<u32>> {
        Ok(self
            .batches()?
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len != 0)
            .map(|(cpu, _)| cpu as u32)
            .collect())
    }

    /// Each possible CPU's batch, by CPU number.
    fn batches(&self) -> Result<PerCpuValues<BatchBuf>> {
        let map: PerCpuArray<_, BatchBuf> =
            PerCpuArray::try_from(self.ebpf.map("BATCH").context("BATCH map")?)?;
        Ok(map.get(&0, 0)?)
    }

    /// Every thread's totals: the slots in use, and the threads whose slot was taken.
    pub fn threads(&mut self) -> Result<Vec<ThreadStats>> {
        let mut threads = self.slots.used();
        let map = self.threads_map()?;
        threads.extend(map.iter().filter_map(|r| r.ok()).map(|(_, v)| v));
        Ok(threads)
    }

    pub fn preemptors(&self) -> Result<Vec<Preemptor>> {
        let map: HashMap<_, u32, Preemptor> =
            HashMap::try_from(self.ebpf.map("PREEMPTORS").context("PREEMPTORS map")?)?;
        Ok(map.iter().filter_map(|r| r.ok()).map(|(_, v)| v).collect())
    }

    /// The processes the target forked during the recording, and theirs: TGID and entry.
    pub fn children(&self) -> Result<Vec<(u32, tracer_common::ChildProcess)>> {
        let map: HashMap<_, u32, tracer_common::ChildProcess> =
            HashMap::try_from(self.ebpf.map("CHILDREN").context("CHILDREN map")?)?;
        Ok(map.iter().filter_map(|r| r.ok()).collect())
    }

    /// Takes the processes `exited` (PID, and when it was forked or joined) out of
    /// `CHILDREN` (they have exited and been reported), and returns their entries: else the map
    /// holds every process forked in the run, to its capacity, and each window lists them all.
    /// An entry of another time is left: its PID was taken again by a new child since.
    pub fn forget_children(
        &mut self,
        exited: &std::collections::BTreeMap<u32, u64>,
    ) -> Result<Vec<(u32, tracer_common::ChildProcess)>> {
        let mut map: HashMap<_, u32, tracer_common::ChildProcess> =
            HashMap::try_from(self.ebpf.map_mut("CHILDREN").context("CHILDREN map")?)?;
        let mut out = Vec::new();
        for (&pid, &created) in exited {
            if let Ok(c) = map.get(&pid, 0)
                && c.created_ns == created
            {
                let _ = map.remove(&pid);
                out.push((pid, c));
            }
        }
        Ok(out)
    }

    /// Each target thread's blocked time by who ended it (`WAKERS`).
    pub fn wakers(&self) -> Result<Vec<WakerRecord>> {
        let map: HashMap<_, WakerKey, WakerStats> =
            HashMap::try_from(self.ebpf.map("WAKERS").context("WAKERS map")?)?;
        Ok(map
            .iter()
            .filter_map(|r| r.ok())
            .map(|(k, v)| WakerRecord::from_kernel(&k, &v))
            .collect())
    }

    pub fn migrations(&self) -> Result<Vec<(MigrationKey, u64)>> {
        let map: HashMap<_, MigrationKey, u64> =
            HashMap::try_from(self.ebpf.map("MIGRATIONS").context("MIGRATIONS map")?)?;
        Ok(map.iter().filter_map(|r| r.ok()).collect())
    }

    /// Takes the blocked-time and migration-route entries of ended threads out of `WAKERS`
    /// and `MIGRATIONS`: those of `ended` (as the window's reading has them). Only for threads
    /// that ended and were reported in full (a watch's cut): no program writes their entries
    /// again, so nothing is lost, and a watch that runs for days on a server whose threads
    /// come and go does not fill the maps (the next threads' accounts would be lost).
    pub fn forget_thread_accounts(&mut self, ended: &Reaped) -> Result<()> {
        if !ended.wakers.is_empty() {
            let mut map: HashMap<_, WakerKey, WakerStats> =
                HashMap::try_from(self.ebpf.map_mut("WAKERS").context("WAKERS map")?)?;
            // A last run of waits never added to the map has no entry: nothing to take out.
            for w in &ended.wakers {
                let _ = map.remove(&w.kernel_key());
            }
        }
        if !ended.migrations.is_empty() {
            let mut map: HashMap<_, MigrationKey, u64> =
                HashMap::try_from(self.ebpf.map_mut("MIGRATIONS").context("MIGRATIONS map")?)?;
            for (k, _) in &ended.migrations {
                let _ = map.remove(k);
            }
        }
        Ok(())
    }

    /// Takes the tasks `exited` out of `PREEMPTORS`, each only if its entry still holds the
    /// totals given with it (wait, slices: what was reported of it), and returns those taken
    /// out, as read: one charged after the window's reading, before it exited, is reported
    /// first.
    pub fn forget_preemptors(&mut self, exited: &[(u32, (u64, u64))]) -> Result<Vec<Preemptor>> {
        let mut map: HashMap<_, u32, Preemptor> =
            HashMap::try_from(self.ebpf.map_mut("PREEMPTORS").context("PREEMPTORS map")?)?;
        let mut out = Vec::new();
        for &(pid, (wait_ns, slices)) in exited {
            if let Ok(p) = map.get(&pid, 0)
                && (p.wait_ns, p.slices) == (wait_ns, slices)
                && map.remove(&pid).is_ok()
            {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Takes out of `WAKERS` the entries `quiet` (keys as `WakerRecord::key` gives them, with
    /// what was reported of each: blocked time, count), whose wakers have exited, and returns
    /// those taken out, as read. An entry is left where it holds more than was reported, or
    /// where its thread's run of waits not yet added (`ThreadStats::run`) is that waker's: the
    /// run would be added to the entry as it was being taken out. Otherwise nothing writes it
    /// again: its waker, gone, ends no more waits.
    pub fn forget_wakers(
        &mut self,
        quiet: &BTreeMap<WakerKeyOf, (u64, u64)>,
    ) -> Result<Vec<WakerRecord>> {
        let mut out = Vec::new();
        for (&key, &reported) in quiet {
            let k = crate::recording::wakers::kernel_key(key);
            // The run first, the entry after: once the run is another waker's, the exited
            // waker's entry has no writer left, so the value read next is the one taken out.
            if self.run_waker(k.tid) == Some(k.waker_tid) {
                continue;
            }
            let mut map: HashMap<_, WakerKey, WakerStats> =
                HashMap::try_from(self.ebpf.map_mut("WAKERS").context("WAKERS map")?)?;
            let Ok(v) = map.get(&k, 0) else { continue };
            if (v.blocked_ns, v.count) == reported && map.remove(&k).is_ok() {
                out.push(WakerRecord::from_kernel(&k, &v));
            }
        }
        Ok(out)
    }

    /// The waker of thread `tid`'s run of waits not yet added to `WAKERS`; None where the
    /// thread has no entry.
    fn run_waker(&mut self, tid: u32) -> Option<u32> {
        if let Some(w) = self.slots.run_waker(tid) {
            return Some(w);
        }
        let map = self.threads_map().ok()?;
        map.get(&tid, 0).ok().map(|t| t.run.waker_tid)
    }

    /// The programs' count in `slot` of `COUNTERS` (a `Counter`), summed over the CPUs: one
    /// system call.
    fn counter(&self, slot: u32) -> Result<u64> {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("COUNTERS").context("COUNTERS map")?)?;
        Ok(map.get(&slot, 0)?.iter().sum())
    }

    pub fn losses(&self) -> Result<Losses> {
        let mut sums = [0u64; COUNTER_SLOTS as usize];
        for (i, sum) in sums.iter_mut().enumerate() {
            *sum = self.counter(i as u32)?;
        }
        Ok(Losses {
            ringbuf_dropped: sums[0],
            thread_map_full: sums[1],
            preemptor_map_full: sums[2],
            migration_map_full: sums[3],
            unseen_switch_ins: sums[4],
            unseen_switch_outs: sums[5],
            perf_read_failed: sums[6],
            clock_checks: sums[7],
            clock_error_ns: sums[8],
            child_map_full: sums[9],
            waker_map_full: sums[10],
            unseen_wakeups: sums[11],
            late_records: 0,
        })
    }
}
