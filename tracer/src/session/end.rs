//! The end of a run: every program detached and what it recorded taken, the last window (the
//! only one, for `attach`) and, where windows were cut, the whole run, then the trace file
//! finished. Apart from windows.rs, which cuts windows while the programs run.

use anyhow::Result;

use super::{DETACH_GRACE, Session, assemble, windows::ProcSide};
use crate::{
    recording::{EndReason, Recording, TracerCost, collect::Collector, gpu::GpuRecording},
    sources::{clock::monotonic_ns, process},
};

/// The end of a run: the window being cut when it ended, if one was, and the last window.
pub struct Finished {
    pub cut: Option<Recording>,
    pub last: Recording,
    /// The flight recorder's records (`--keep`), for a file the last windows trigger.
    pub flight: Option<super::FlightHeld>,
}

impl Session<'_> {
    /// Detaches everything and closes the last window (the only one, for `attach`).
    pub async fn finish(mut self, end_reason: EndReason) -> Result<Finished> {
        self.bar.finish_and_clear();
        // The window is closed: from here a signal ends the tool at once (signals.rs).
        crate::signals::exit_on_interrupt(&match &self.writer {
            Some(w) => format!(
                "the partial trace is in {} (`tracer report` reads it)",
                w.temp().display()
            ),
            None => "no summary was printed".into(),
        });
        let (end, proc_end, cuda_at_end) = self.detach_and_drain().await?;
        // A window being cut when the run ended is complete now.
        let cut = match self.closing.is_some() {
            true => Some(self.end_cut()?),
            false => None,
        };
        let mut cgroups = std::mem::take(&mut self.throttling);
        for (i, (t, _)) in self.throttle.0.iter().enumerate() {
            cgroups[i].extend(t.sample(end));
        }
        let (gpu, gpu_capability) = self.stop_sampler();
        let mut ended = self.ended(end, end_reason, gpu, gpu_capability, cgroups, proc_end);
        let kernel = assemble::Kernel::read(&mut self.probes, &self.finished, Some(cuda_at_end))?;
        let col = std::mem::replace(&mut self.col, Collector::new(end, 1, false));
        let cpu_end = process::own_usage().0;
        // Windows were cut and a trace file is written: its final frame is the whole run, from
        // the same accounts before the last window's are taken off. Without cuts the last
        // window is the run, and nothing whole is kept.
        if !self.windows.cut_any() {
            self.windows.whole_cgroups = None;
        }
        let whole_parts = self.windows.whole_cgroups.is_some().then(|| {
            // Its GPU samples are the windows' put together, not this one's again.
            let gpu = ended.gpu.take();
            let whole_ended = ended.clone();
            ended.gpu = gpu;
            let reaped = self.windows.whole_reaped.take().unwrap_or_default();
            (kernel.clone().with_reaped(reaped), whole_ended)
        });
        let cpu_total = cpu_end - self.cpu_at_start;
        // Adds this window's GPU and cgroup samples to the whole run's.
        let mut rec = self.window_of(kernel, col, ended, cpu_end)?;
        let whole = match whole_parts {
            Some(parts) => Some(self.whole_run(parts, end, cpu_total)?),
            None => None,
        };
        self.write_trace(&mut rec, whole.as_ref())?;
        Ok(Finished {
            cut,
            last: rec,
            flight: self.take_flight(),
        })
    }

    /// Detaches every program and takes what they recorded: the ring buffer, then what each
    /// CPU had not sent. (The end of the run, the threads' /proc counts there, the CUDA
    /// accounts as of then.)
    async fn detach_and_drain(
        &mut self,
    ) -> Result<(u64, ProcSide, Vec<(u32, tracer_common::CudaThread)>)> {
        self.probes.detach_sched();
        // The records CPUs still hold are taken from the map below: nothing may send them
        // into the ring buffer after it is drained.
        self.probes.stop_idle_sender();
        let end = monotonic_ns();
        let proc_end = ProcSide::read(self);
        // The CUDA accounting as of the window's end; the uprobes come off after (slowly).
        let cuda_at_end = self.probes.cuda_threads()?;
        self.probes.detach_uprobes();
        // Nothing more arrives once detached: take all that is left in the ring buffer, then
        // the records each CPU had not sent yet. A program that started before the detach may
        // still be running on another CPU (for microseconds; longer only if the hypervisor
        // stops that vCPU): give it time to finish its batch.
        tokio::time::sleep(DETACH_GRACE).await;
        while self.drain() > 0 {}
        self.take_unsent()?;
        Ok((end, proc_end, cuda_at_end))
    }

    /// Stops the GPU sampler: its recording, and what it could measure.
    fn stop_sampler(&mut self) -> (Option<GpuRecording>, crate::recording::Capability) {
        let sampler = std::mem::replace(
            &mut self.sampler,
            Err(crate::recording::Capability {
                available: false,
                reason: "the sampler was stopped".into(),
            }),
        );
        match sampler {
            Ok(s) => {
                let cap = s.capability.clone();
                (Some(s.finish()), cap)
            }
            Err(cap) => (None, cap),
        }
    }

    /// The whole run, where windows were cut and a trace file is written: from the same
    /// accounts before the last window's were taken off, with every window's GPU and cgroup
    /// samples and the tracer's cost over the run.
    fn whole_run(
        &mut self,
        (kernel, ended): (assemble::Kernel, assemble::Ended),
        end: u64,
        cpu_total: u64,
    ) -> Result<Recording> {
        let mut w = assemble::recording(
            &self.targets,
            &self.probes,
            kernel,
            Collector::new(self.start, 1, false),
            ended,
        )?;
        w.gpu = self.windows.whole_gpu.take();
        if let Some(all) = self.windows.whole_cgroups.take() {
            let mut all = all.into_iter();
            for cg in std::iter::once(&mut w.cgroup)
                .flatten()
                .chain(w.other_cgroups.iter_mut())
            {
                cg.samples = all.next().unwrap_or_default();
            }
            w.tracer_cost = Some(TracerCost {
                cpu_ns: cpu_total,
                cpu_share: cpu_total as f64 / (end - self.start).max(1) as f64,
                peak_rss_bytes: process::own_usage().1,
            });
        }
        Ok(w)
    }

    /// Finishes the trace file with the whole run (`whole`, else `rec`, the only window).
    fn write_trace(&mut self, rec: &mut Recording, whole: Option<&Recording>) -> Result<()> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        // A signal from here until the message below says the file is complete waits (the
        // file renamed into place while the message still named the temporary one told a
        // user who interrupted then that the complete trace was partial).
        let _held = crate::signals::Deferred::new();
        // The file holds the requests of a latency log (its final frame): `tracer report`
        // then needs no log. One that cannot be read leaves them out, and says so; the
        // command reads it again to report why (`cli::emit`).
        if let Some(log) = self.opts.latencies.as_deref()
            && let Err(e) = crate::sources::latency_log::load(rec, log)
        {
            eprintln!(
                "tracer: the trace file holds no requests: the latency log could not be read \
                 before it was finished ({e:#}); `tracer report --latencies` joins them"
            );
        }
        // A file that cannot be finished (full disk) must not cost the recording: it is still
        // reported, and the command fails after.
        match w.finish(whole.unwrap_or(rec)) {
            Ok(path) => {
                crate::signals::exit_on_interrupt(&format!(
                    "the trace file {} is complete (`tracer report` reads it)",
                    path.display()
                ));
                if self.opts.notices {
                    eprintln!("tracer: trace written to {}", path.display());
                }
            }
            Err(e) => rec.output_error = Some(format!("{e:#}")),
        }
        Ok(())
    }
}
