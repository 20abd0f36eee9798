//! The recording loop: drain the ring buffer as it fills and every tick, and do the periodic
//! work (dead threads reaped, members that joined, cgroup samples, GPU polls to the trace
//! file), until a deadline, a signal or the target's exit.

use anyhow::{Context as _, Result};
use indicatif::ProgressBar;

use super::{
    Session, SessionOptions, TICK, Wake,
    flight::FlightRing,
    members_joined,
    windows::{Closing, Windows},
};
use crate::{
    recording::{
        collect::Collector,
        records::{Record, encode},
    },
    sources::{clock::monotonic_ns, ebpf::SchedProbes},
    trace::writer::TraceWriter,
};

impl Session<'_> {
    /// Records until `deadline` (None: no deadline), a signal, or the target's exit.
    pub async fn wait(&mut self, deadline: Option<tokio::time::Instant>) -> Result<Wake> {
        let mut tick = tokio::time::interval(TICK);
        loop {
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            // Which of the processes given exited (none given: never).
            let exited = std::future::poll_fn(|cx| {
                match self
                    .exit_fds
                    .iter()
                    .position(|(_, fd)| fd.poll_read_ready(cx).is_ready())
                {
                    Some(i) => std::task::Poll::Ready(i),
                    None => std::task::Poll::Pending,
                }
            });
            let hangup = async {
                match self.hangup.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            let user1 = async {
                match self.user1.as_mut() {
                    Some(s) => drop(s.recv().await),
                    None => std::future::pending().await,
                }
            };
            let trigger = async {
                if let Some(t) = self.trigger.as_mut()
                    && t.recv().await.is_some()
                {
                    return;
                }
                // None, or closed (the exporter is gone): never again.
                std::future::pending::<()>().await
            };
            let woke = tokio::select! {
                guard = self.probes.events().readable_mut() => {
                    let mut guard = guard.context("waiting on the ring buffer")?;
                    guard.clear_ready();
                    drop(guard);
                    None
                }
                _ = tick.tick() => Some(None),
                _ = sleep => Some(Some(Wake::Deadline)),
                _ = self.interrupt.recv() => Some(Some(Wake::Interrupted)),
                _ = self.terminate.recv() => Some(Some(Wake::Interrupted)),
                _ = hangup => Some(Some(Wake::Hangup)),
                _ = user1 => Some(Some(Wake::Trigger)),
                _ = trigger => Some(Some(Wake::Trigger)),
                i = exited => self.given_exited(i),
            };
            self.drain();
            match woke {
                None => {}
                Some(None) => self.on_tick()?,
                Some(Some(w)) => return Ok(w),
            }
        }
    }

    /// The process given `i`-th among those still running exited: the recording goes on while
    /// another runs, and says so.
    fn given_exited(&mut self, i: usize) -> Option<Option<Wake>> {
        let (pid, _) = self.exit_fds.swap_remove(i);
        if self.exit_fds.is_empty() {
            self.target_exited_ns = Some(monotonic_ns());
            return Some(Some(Wake::TargetExited));
        }
        if self.opts.notices {
            let left: Vec<String> = self.exit_fds.iter().map(|(p, _)| p.to_string()).collect();
            self.bar.suspend(|| {
                eprintln!(
                    "tracer: PID {pid} exited; the recording goes on while PID {} runs",
                    left.join(", ")
                )
            });
        }
        None
    }

    fn on_tick(&mut self) -> Result<()> {
        self.finished.extend(self.probes.reap_dead()?);
        self.ticks += 1;
        if self.ticks.is_multiple_of(10)
            && let Some(notice) = members_joined(
                &mut self.probes,
                &self.targets,
                &mut self.cgroup_watch,
                &self.gpu_members,
            )?
            && self.opts.notices
        {
            self.bar.suspend(|| eprintln!("{notice}"));
        }
        let now = monotonic_ns();
        for (i, (t, _)) in self.throttle.0.iter().enumerate() {
            let Some(s) = t.sample(now) else { continue };
            // The first member's cgroup is streamed for recovery.
            if let (0, Some(w)) = (i, self.writer.as_mut()) {
                w.cgroup(s.clone());
            }
            self.throttling[i].push(s);
        }
        if let Ok(g) = &self.sampler {
            // Drained whether or not a trace file takes them: a long watch must not pile
            // them up.
            let polls: Vec<_> = g.polls.try_iter().collect();
            if let Some(w) = self.writer.as_mut() {
                w.gpu_polls(&polls);
            }
        }
        if let Some(w) = self.writer.as_mut() {
            w.maybe_flush();
        }
        progress(&self.bar, self.opts, self.col.records, &self.probes);
        Ok(())
    }

    /// Takes every record in the ring buffer to its window's collector and, when writing a
    /// trace, to the file.
    pub(super) fn drain(&mut self) -> usize {
        let Self {
            probes,
            col,
            closing,
            writer,
            windows,
            flight,
            ..
        } = self;
        probes.drain(|r| take(r, col, closing, writer, windows, flight))
    }

    /// The records the CPUs had not sent yet, once the programs are detached.
    pub(super) fn take_unsent(&mut self) -> Result<()> {
        for batch in self.probes.unsent_batches()? {
            for r in crate::recording::records::split(&batch) {
                take(
                    r,
                    &mut self.col,
                    &mut self.closing,
                    &mut self.writer,
                    &mut self.windows,
                    &mut self.flight,
                );
            }
        }
        Ok(())
    }
}

/// A record goes to the window its time falls in: while a window is being cut, records of
/// other CPUs' batches from before its end still arrive. One from before a window already
/// reported is counted late.
fn take(
    r: Record,
    col: &mut Collector,
    closing: &mut Option<Closing>,
    writer: &mut Option<TraceWriter>,
    windows: &mut Windows,
    flight: &mut Option<FlightRing>,
) {
    let t = r.ts_ns();
    if writer.is_some() || flight.is_some() {
        let bytes = encode(&r);
        if let Some(w) = writer.as_mut() {
            w.record(bytes);
        }
        if let Some(f) = flight.as_mut() {
            f.push(t, bytes);
        }
    }
    match closing {
        Some(c) if t < c.end => c.col.on_record(r),
        Some(c) if c.start > t => windows.late += 1,
        // Before any window was cut, nothing is late (a wakeup's time, from the run queue's
        // clock, can fall just before the start).
        None if windows.cut_any() && windows.window_start() > t => windows.late += 1,
        _ => col.on_record(r),
    }
}

fn progress(bar: &ProgressBar, opts: &SessionOptions, records: u64, probes: &SchedProbes) {
    // Nothing drawn (not a terminal, `--quiet`, a watch): the losses are a system call per
    // CPU's map entry, at every tick of a watch that runs for days.
    if bar.is_hidden() {
        return;
    }
    if let Some(d) = opts.duration {
        bar.set_position(bar.elapsed().as_millis().min(d.as_millis()) as u64);
    } else {
        bar.tick();
    }
    let dropped = probes.losses().map(|l| l.ringbuf_dropped).unwrap_or(0);
    bar.set_message(format!("{records} events, {dropped} dropped"));
}
