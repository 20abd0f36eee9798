//! The capabilities loading and attaching the scheduler probes needs, checked before trying, so
//! the user gets a sentence instead of an EPERM.

use crate::error::TracerError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capability bits of this process.
pub fn effective_caps() -> u64 {
    super::process::status_field("/proc/self/status", "CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0)
}

fn has(caps: u64, cap: u32) -> bool {
    caps & (1u64 << cap) != 0
}

/// Names the missing capabilities, or `None` when tracing is allowed. Since Linux 5.8 tracing
/// programs need CAP_BPF and CAP_PERFMON; CAP_SYS_ADMIN implies both (kernel/bpf/syscall.c,
/// `bpf_capable()` and `perfmon_capable()`).
pub fn missing_for_tracing(caps: u64) -> Option<String> {
    if has(caps, CAP_SYS_ADMIN) {
        return None;
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(cap, _)| !has(caps, *cap))
        .map(|(_, name)| name)
        .collect();
    (!missing.is_empty()).then(|| missing.join(" and "))
}

pub fn check() -> Result<(), TracerError> {
    match missing_for_tracing(effective_caps()) {
        None => Ok(()),
        Some(missing) => Err(TracerError::Privileges { missing }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_exactly_what_is_missing() {
        assert_eq!(missing_for_tracing(1 << CAP_SYS_ADMIN), None);
        assert_eq!(
            missing_for_tracing((1 << CAP_BPF) | (1 << CAP_PERFMON)),
            None
        );
        assert_eq!(
            missing_for_tracing(1 << CAP_BPF).as_deref(),
            Some("CAP_PERFMON")
        );
        assert_eq!(
            missing_for_tracing(1 << CAP_PERFMON).as_deref(),
            Some("CAP_BPF")
        );
        assert_eq!(
            missing_for_tracing(0).as_deref(),
            Some("CAP_BPF and CAP_PERFMON")
        );
    }
}
