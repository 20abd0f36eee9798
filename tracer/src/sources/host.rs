//! What this host lets the tracer measure: BTF, tracefs, the PMU, NVIDIA GPUs. Shared by
//! `tracer doctor` and the `capabilities` object every recording carries.

use serde::Serialize;

use super::{clock::realtime_minus_monotonic_ns, ebpf::tracefs};
use crate::recording::Capability;

/// tracefs, which only the classic fallback needs.
pub fn tracefs() -> Capability {
    match tracefs::find_tracefs() {
        tracefs::Tracefs::At(root) => Capability::yes(format!("mounted at {}", root.display())),
        other => Capability::no(format!(
            "{} (only needed without BTF)",
            other.problem().unwrap_or_default()
        )),
    }
}

/// One NVIDIA GPU as NVML describes it.
#[derive(Debug, Clone, Serialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// GPM (GPU performance monitoring: SM activity, occupancy, tensor, DRAM), Hopper and later.
    pub gpm_supported: bool,
}

/// What NVML reports about this host's GPUs.
#[derive(Debug, Clone, Serialize)]
pub struct GpuReport {
    #[serde(flatten)]
    pub capability: Capability,
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
}

impl GpuReport {
    /// Whether any of the GPUs offers GPM.
    pub fn gpm(&self) -> Capability {
        if !self.capability.available {
            return Capability::no(format!("no GPU: {}", self.capability.reason));
        }
        let with: Vec<String> = self
            .gpus
            .iter()
            .filter(|g| g.gpm_supported)
            .map(|g| g.index.to_string())
            .collect();
        if with.is_empty() {
            Capability::no(
                "GPM unsupported on these GPUs (it needs Hopper or later): SM activity, \
                occupancy, tensor and DRAM metrics are not assessed",
            )
        } else {
            Capability::yes(format!("GPM on GPU {}", with.join(", ")))
        }
    }
}

/// Opens NVML. The driver installs `libnvidia-ml.so.1`; the unversioned name exists only with
/// development packages, which nvml-wrapper's default expects.
pub fn nvml() -> Result<nvml_wrapper::Nvml, nvml_wrapper::error::NvmlError> {
    nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
        .or_else(|_| nvml_wrapper::Nvml::init())
}

/// Why NVML could not be opened, in words a user can act on.
pub fn nvml_error_reason(e: &nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError;
    match e {
        NvmlError::LibloadingError(_) => {
            "no NVML library (libnvidia-ml.so.1): no NVIDIA driver on this host".into()
        }
        NvmlError::DriverNotLoaded => "NVML found but the NVIDIA driver is not loaded".into(),
        NvmlError::NoPermission => "NVML has no permission to talk to the driver".into(),
        other => format!("NVML failed to initialize: {other}"),
    }
}

pub fn gpu() -> GpuReport {
    let nvml = match nvml() {
        Ok(n) => n,
        Err(e) => {
            return GpuReport {
                capability: Capability::no(nvml_error_reason(&e)),
                driver_version: None,
                gpus: vec![],
            };
        }
    };
    let driver_version = nvml.sys_driver_version().ok();
    let count = nvml.device_count().unwrap_or(0);
    let gpus: Vec<GpuInfo> = (0..count)
        .filter_map(|index| {
            let d = nvml.device_by_index(index).ok()?;
            Some(GpuInfo {
                index,
                name: d.name().unwrap_or_default(),
                uuid: d.uuid().unwrap_or_default(),
                gpm_supported: d.gpm_support().unwrap_or(false),
            })
        })
        .collect();
    let capability = if gpus.is_empty() {
        Capability::no("NVML works but reports no GPU")
    } else {
        Capability::yes(format!(
            "{} GPU(s) through NVML, driver {}",
            gpus.len(),
            driver_version.as_deref().unwrap_or("unknown")
        ))
    };
    GpuReport {
        capability,
        driver_version,
        gpus,
    }
}

/// The machine, as recorded in every trace.
pub fn host_meta(cpus: &[u32]) -> crate::recording::HostMeta {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    crate::recording::HostMeta {
        hostname: read("/proc/sys/kernel/hostname"),
        kernel: read("/proc/sys/kernel/osrelease"),
        clocksource: read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
        cpu_model,
        cpus_online: cpus.to_vec(),
        topology: super::topology::read(cpus),
        argv: std::env::args().collect(),
        realtime_minus_monotonic_ns: realtime_minus_monotonic_ns(),
    }
}
