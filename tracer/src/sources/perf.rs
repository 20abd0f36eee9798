//! Per-CPU perf counters for the eBPF programs to read at each context switch of a target
//! thread (see tracer-ebpf `counters.rs` for why per-CPU rather than per-thread).
//!
//! Hardware counters need a PMU. Where they cannot be opened, the reason is kept, in words a
//! user can act on, and the recording says cache thrash was not assessed.

use std::{io, os::fd::AsRawFd as _};

use crate::recording::{PmuCapability, counters::slot_name};
use perf_event::{
    Builder, Counter,
    events::{Cache, CacheId, CacheOp, CacheResult, Event, Hardware, Software},
};
use tracer_common::PerfSlot;

/// Which counters to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CounterChoice {
    /// The hardware set (cycles, instructions, LLC references and misses), where it opens.
    Auto,
    /// The software set (cpu-clock, context-switches, cpu-migrations) read through the same
    /// path: checks the plumbing on machines without a PMU.
    Software,
    /// Both.
    All,
    /// No counters.
    None,
}

const HARDWARE: [PerfSlot; 4] = [
    PerfSlot::Cycles,
    PerfSlot::Instructions,
    PerfSlot::LlcReferences,
    PerfSlot::LlcMisses,
];
const SOFTWARE: [PerfSlot; 3] = [
    PerfSlot::CpuClock,
    PerfSlot::ContextSwitches,
    PerfSlot::CpuMigrations,
];

fn builder(slot: PerfSlot) -> Builder<'static> {
    fn b(e: impl Event + 'static) -> Builder<'static> {
        Builder::new(e)
    }
    let llc = |result| Cache {
        which: CacheId::LL,
        operation: CacheOp::READ,
        result,
    };
    match slot {
        PerfSlot::Cycles => b(Hardware::CPU_CYCLES),
        PerfSlot::Instructions => b(Hardware::INSTRUCTIONS),
        PerfSlot::LlcReferences => b(llc(CacheResult::ACCESS)),
        PerfSlot::LlcMisses => b(llc(CacheResult::MISS)),
        PerfSlot::CpuClock => b(Software::CPU_CLOCK),
        PerfSlot::ContextSwitches => b(Software::CONTEXT_SWITCHES),
        PerfSlot::CpuMigrations => b(Software::CPU_MIGRATIONS),
    }
}

/// Opens `slot` on one CPU, counting every task there, in user and kernel mode (perf-event2
/// excludes the kernel by default, which would hide context switches and migrations).
fn open_one(slot: PerfSlot, cpu: u32) -> io::Result<Counter> {
    let mut b = builder(slot);
    b.one_cpu(cpu as usize).any_pid().include_kernel();
    b.build()
}

/// True when the kernel exposes a CPU PMU (`cpu`, or `cpu_core`/`cpu_atom` on hybrid parts).
pub fn pmu_device_present() -> bool {
    std::fs::read_dir("/sys/bus/event_source/devices")
        .map(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("cpu"))
        })
        .unwrap_or(false)
}

pub fn perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Why `slot` could not be opened, in words a user can act on.
pub fn explain(slot: PerfSlot, err: &io::Error) -> String {
    let hw = HARDWARE.contains(&slot);
    match err.raw_os_error() {
        Some(libc::ENOENT | libc::ENODEV) if hw && !pmu_device_present() => {
            "no hardware PMU (virtual machine without PMU passthrough): \
             /sys/bus/event_source/devices has no cpu PMU"
                .into()
        }
        Some(libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP | libc::EINVAL) => {
            format!("this CPU's PMU does not offer {} ({err})", slot_name(slot))
        }
        Some(libc::EACCES | libc::EPERM) => format!(
            "not permitted ({err}): needs CAP_PERFMON (or kernel.perf_event_paranoid <= 0; \
             it is {})",
            perf_event_paranoid().map_or("unknown".into(), |p| p.to_string())
        ),
        _ => err.to_string(),
    }
}

/// The counters opened for a recording, one per (slot, online CPU). Dropping it closes them.
pub struct PerfSet {
    counters: Vec<(PerfSlot, u32, Counter)>,
    /// Bit k: slot k is open on every online CPU.
    pub mask: u32,
    pub pmu: PmuCapability,
    /// Software slots that failed, with why.
    pub software_errors: Vec<(PerfSlot, String)>,
    choice: CounterChoice,
    /// Hardware slots that failed to open, with why (kept for `give_up`).
    hw_errors: Vec<(PerfSlot, String)>,
}

impl PerfSet {
    pub fn open(choice: CounterChoice, cpus: &[u32]) -> Self {
        let mut slots: Vec<PerfSlot> = Vec::new();
        if matches!(choice, CounterChoice::Auto | CounterChoice::All) {
            slots.extend(HARDWARE);
        }
        if matches!(choice, CounterChoice::Software | CounterChoice::All) {
            slots.extend(SOFTWARE);
        }
        let mut counters = Vec::new();
        let mut mask = 0u32;
        let mut hw_errors: Vec<(PerfSlot, String)> = Vec::new();
        let mut software_errors = Vec::new();
        'slots: for slot in slots {
            let mut opened = Vec::new();
            for &cpu in cpus {
                match open_one(slot, cpu).and_then(|mut c| c.enable().map(|()| c)) {
                    Ok(c) => opened.push((slot, cpu, c)),
                    Err(e) => {
                        let why = explain(slot, &e);
                        if HARDWARE.contains(&slot) {
                            hw_errors.push((slot, why));
                        } else {
                            software_errors.push((slot, why));
                        }
                        continue 'slots;
                    }
                }
            }
            mask |= 1 << slot as u32;
            counters.extend(opened);
        }
        let pmu = pmu_capability(choice, mask, &hw_errors);
        Self {
            counters,
            mask,
            pmu,
            software_errors,
            choice,
            hw_errors,
        }
    }

    /// Closes every counter because the kernel would not take the programs that read them
    /// (`why`): each slot that was open is then unavailable for that reason, and the recording
    /// says so rather than giving figures it did not measure.
    pub fn give_up(&mut self, why: &str) {
        let given_up = |slots: &[PerfSlot]| -> Vec<(PerfSlot, String)> {
            (slots.iter())
                .filter(|&&s| self.mask & (1 << s as u32) != 0)
                .map(|&s| (s, why.to_string()))
                .collect()
        };
        let hardware = given_up(&HARDWARE);
        self.software_errors.extend(given_up(&SOFTWARE));
        self.counters.clear();
        self.mask = 0;
        if !hardware.is_empty() {
            // With the slots that had failed to open, and their reasons.
            self.hw_errors.extend(hardware);
            self.pmu = pmu_capability(self.choice, 0, &self.hw_errors);
        }
    }

    /// (slot, cpu, fd) of every open counter.
    pub fn fds(&self) -> impl Iterator<Item = (PerfSlot, u32, i32)> + '_ {
        self.counters
            .iter()
            .map(|(slot, cpu, c)| (*slot, *cpu, c.as_raw_fd()))
    }
}

fn pmu_capability(
    choice: CounterChoice,
    mask: u32,
    errors: &[(PerfSlot, String)],
) -> PmuCapability {
    let events: std::collections::BTreeMap<String, bool> = HARDWARE
        .iter()
        .map(|&s| (slot_name(s).to_string(), mask & (1 << s as u32) != 0))
        .collect();
    let llc_available = events["llc_references"] && events["llc_misses"];
    let any = events.values().any(|&v| v);
    let reason = if !matches!(choice, CounterChoice::Auto | CounterChoice::All) {
        "hardware counters not requested (--counters)".to_string()
    } else if errors.is_empty() {
        "all hardware events opened".to_string()
    } else {
        // Usually one reason for all (no PMU, no permission); say each distinct one once.
        let mut reasons: Vec<String> = Vec::new();
        for (slot, why) in errors {
            let line = if errors.iter().all(|(_, w)| w == why) {
                why.clone()
            } else {
                format!("{}: {why}", slot_name(*slot))
            };
            if !reasons.contains(&line) {
                reasons.push(line);
            }
        }
        reasons.join("; ")
    };
    PmuCapability {
        available: any,
        reason,
        events,
        llc_available,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_actionable() {
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert!(explain(PerfSlot::Cycles, &denied).contains("CAP_PERFMON"));
        let missing = io::Error::from_raw_os_error(libc::ENOENT);
        let why = explain(PerfSlot::LlcMisses, &missing);
        if pmu_device_present() {
            assert!(why.contains("does not offer llc_misses"), "{why}");
        } else {
            assert!(why.contains("no hardware PMU"), "{why}");
        }
    }

    #[test]
    fn one_reason_is_said_once() {
        let errors: Vec<(PerfSlot, String)> =
            HARDWARE.iter().map(|&s| (s, "no PMU".into())).collect();
        let cap = pmu_capability(CounterChoice::Auto, 0, &errors);
        assert!(!cap.available);
        assert_eq!(cap.reason, "no PMU");
        assert!(!cap.llc_available);
        // Cycles and instructions open, the LLC events do not: available, not for cache.
        let mask = (1 << PerfSlot::Cycles as u32) | (1 << PerfSlot::Instructions as u32);
        let cap = pmu_capability(CounterChoice::Auto, mask, &errors[2..]);
        assert!(cap.available && !cap.llc_available);
        assert_eq!(cap.reason, "no PMU");
    }
}
