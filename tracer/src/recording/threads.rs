//! What /proc says of a thread (read by `sources/process.rs`).

/// What /proc says of one thread when the recording starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThreadInfo {
    pub tid: u32,
    pub comm: String,
    /// The state letter of /proc/PID/task/TID/stat (R, S, D, ...).
    pub state: char,
}
