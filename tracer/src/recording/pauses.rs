//! Runtime pauses of the target's processes: CPython's garbage collections, from its USDT
//! probes `python:gc__start` and `gc__done`.

use serde::{Deserialize, Serialize};

/// A process found to run CPython, and how that was decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Python {
    /// "3.11", from the interpreter's file name.
    pub version: String,
    /// The file holding the interpreter: the mapped libpython, or the executable itself.
    pub path: String,
    /// How it was found: "libpython3.11.so.1.0 mapped", "executable python3.11".
    pub how: String,
}

/// One collection, on the thread that ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RuntimePause {
    pub tid: u32,
    pub pid: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The generation collected (0-2), from gc__start's argument.
    pub generation: Option<u32>,
    /// Objects collected, from gc__done's argument.
    pub collected: Option<u64>,
}

impl RuntimePause {
    pub fn ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Whether a CPython member's collections were traced, and why not where not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PauseProbe {
    pub pid: u32,
    /// True: `gc__start`/`gc__done` attached and their semaphores raised.
    pub attached: bool,
    /// Why not, when not (no USDT notes in the interpreter, no attach cookies before Linux 5.15).
    pub reason: Option<String>,
}
