//! What a verdict is, apart from how it is reached: the summary holds one, and the rules in
//! `verdict/` read the summary, so the types live here, where neither imports the other.

use serde::Serialize;

pub use super::{
    mechanism::{Mechanism, Primary},
    placement::ActsIn,
};

/// What the shares are shares of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The tail requests' mean excess over the median requests.
    TailExcess,
    /// The time the target's threads lost to impediments over the window.
    LostTime,
}

/// One cause of the verdict. Its category, text and advice all follow from the mechanism.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub mechanism: Mechanism,
    /// Share of the tail excess (or of the lost time), 0..1.
    pub share: f64,
    /// The numbers behind it, in words.
    pub evidence: String,
    /// The member of the target set it acts in (set once the causes are ranked).
    pub acts_in: Option<ActsIn>,
    /// The time it took, ns (set once the causes are ranked): over the window, the threads'
    /// time lost to it; for the tail, its share of the tail requests' excess over the median,
    /// added up over them. What `tracer watch` exports as `tracer_attributed_seconds_total`.
    pub attributed_ns: f64,
}

impl Cause {
    pub fn new(mechanism: Mechanism, share: f64, evidence: String) -> Self {
        Self {
            mechanism,
            share,
            evidence,
            acts_in: None,
            attributed_ns: 0.0,
        }
    }

    pub fn cause(&self) -> Primary {
        self.mechanism.cause()
    }
}

/// One cause of the verdict, as the JSON document has it: its category, how it worked (in
/// words, and as an id with its data), its share, the evidence and what to do.
#[derive(Serialize, schemars::JsonSchema)]
#[schemars(rename = "Cause")]
struct CauseDoc<'a> {
    /// `scheduling`, `cache_thrash`, `gpu_saturation`, or `unexplained` for a part of the
    /// excess no measured signal accounts for.
    cause: Primary,
    /// How, in words: "run-queue contention: preempted by ...", "cgroup CPU throttling",
    /// "migrations", "SM saturation (GPU 97% busy)", ...
    mechanism: String,
    /// The same as a stable snake_case id (`run_queue_contention`, `cgroup_throttling`,
    /// `migrations`, `idle_cpu_wakeup`, `llc_misses`, `sm_saturation`, ...), with its data in
    /// `mechanism_data` when it has any (the neighbours named, the GPU's busy share, ...).
    #[serde(flatten)]
    id: &'a Mechanism,
    /// Share of the tail excess (or of the lost time), 0..1.
    share: f64,
    /// The numbers behind it, in words.
    evidence: &'a str,
    /// The process of the target set whose threads bore most of it: the member to look at,
    /// whichever PID was given.
    acts_in: Option<&'a ActsIn>,
    /// The time it took, ns: over the window, the threads' time lost to it; for the tail,
    /// its share of the tail requests' excess over the median, summed over them.
    attributed_ns: f64,
    /// What to do about it.
    advice: String,
}

impl<'a> From<&'a Cause> for CauseDoc<'a> {
    fn from(c: &'a Cause) -> Self {
        Self {
            cause: c.cause(),
            mechanism: c.mechanism.to_string(),
            id: &c.mechanism,
            share: c.share,
            evidence: &c.evidence,
            acts_in: c.acts_in.as_ref(),
            attributed_ns: c.attributed_ns,
            advice: c.mechanism.advice(),
        }
    }
}

impl Serialize for Cause {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        CauseDoc::from(self).serialize(s)
    }
}

impl schemars::JsonSchema for Cause {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        CauseDoc::schema_name()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        CauseDoc::json_schema(g)
    }
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
