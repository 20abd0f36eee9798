//! What a verdict is, apart from how it is reached: the summary holds one, and the rules in
//! `verdict/` read the summary, so the types live here, where neither imports the other.

use serde::Serialize;

/// The cause the verdict names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Primary {
    Scheduling,
    CacheThrash,
    GpuSaturation,
    /// No significant jitter, and no impediment above its threshold.
    None,
    /// Jitter present, but not explained by what was measured.
    Unexplained,
}

impl Primary {
    pub fn name(self) -> &'static str {
        match self {
            Self::Scheduling => "scheduling",
            Self::CacheThrash => "cache thrash",
            Self::GpuSaturation => "GPU saturation",
            Self::None => "no significant jitter",
            Self::Unexplained => "unexplained",
        }
    }
}

/// What the shares are shares of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The tail requests' mean excess over the median requests.
    TailExcess,
    /// The time the target's threads lost to impediments over the window.
    LostTime,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Cause {
    /// `scheduling`, `cache_thrash`, `gpu_saturation`, or `unexplained` for a part of the
    /// excess no measured signal accounts for.
    pub cause: Primary,
    /// How: "run-queue contention", "cgroup CPU throttling", "migrations", "preemption by
    /// <comm>", "SM saturation", "power capping", ...
    pub mechanism: String,
    /// Share of the tail excess (or of the lost time), 0..1.
    pub share: f64,
    /// The numbers behind it, in words.
    pub evidence: String,
    /// What to do about it.
    pub advice: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct NotAssessed {
    pub signal: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Verdict {
    pub primary: Primary,
    /// One line a person can act on; the text output starts with it.
    pub headline: String,
    pub basis: Basis,
    /// Ranked, largest share first.
    pub causes: Vec<Cause>,
    /// Signals that could not be measured: never reported as absent causes.
    pub not_assessed: Vec<NotAssessed>,
    /// What bounds throughput, by the usual rules of thumb (GPU-bound, memory-bound,
    /// host-bound), when the GPU was sampled.
    pub bound: Option<String>,
}

impl Default for Verdict {
    fn default() -> Self {
        Self {
            primary: Primary::None,
            headline: String::new(),
            basis: Basis::LostTime,
            causes: vec![],
            not_assessed: vec![],
            bound: None,
        }
    }
}
