//! Where each CPU sits, and how far a migration moved a thread: a move between SMT siblings
//! keeps the caches, one within a last-level cache keeps the LLC, one across LLCs or NUMA
//! nodes loses them. Read from sysfs by `sources/topology.rs`.

use serde::{Deserialize, Serialize};

/// Where a CPU sits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPlace {
    pub cpu: u32,
    /// Physical core (package, core_id): SMT siblings share it.
    pub package: u32,
    pub core: u32,
    /// Lowest CPU number sharing this CPU's last-level cache: an LLC's identity.
    pub llc: u32,
    pub node: u32,
}

/// How far a migration moved a thread.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum MigrationKind {
    /// Between SMT siblings of one core.
    SameCore,
    /// Between cores sharing the last-level cache.
    SameLlc,
    /// To another LLC in the same NUMA node.
    CrossLlc,
    CrossNuma,
    /// A CPU missing from the topology.
    Unknown,
}

/// How far a move from `from` to `to` went.
pub fn classify(topo: &[CpuPlace], from: u32, to: u32) -> MigrationKind {
    let (Some(a), Some(b)) = (
        topo.iter().find(|p| p.cpu == from),
        topo.iter().find(|p| p.cpu == to),
    ) else {
        return MigrationKind::Unknown;
    };
    if a.node != b.node {
        MigrationKind::CrossNuma
    } else if (a.package, a.core) == (b.package, b.core) {
        MigrationKind::SameCore
    } else if a.llc == b.llc && a.package == b.package {
        MigrationKind::SameLlc
    } else {
        MigrationKind::CrossLlc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(cpu: u32, core: u32, llc: u32, node: u32) -> CpuPlace {
        CpuPlace {
            cpu,
            package: node,
            core,
            llc,
            node,
        }
    }

    #[test]
    fn migrations_are_classified_by_what_they_share() {
        // Two nodes; node 0 has two LLCs; cpus 0 and 1 are SMT siblings.
        let t = vec![
            p(0, 0, 0, 0),
            p(1, 0, 0, 0),
            p(2, 1, 0, 0),
            p(3, 2, 3, 0),
            p(4, 0, 4, 1),
        ];
        assert_eq!(classify(&t, 0, 1), MigrationKind::SameCore);
        assert_eq!(classify(&t, 0, 2), MigrationKind::SameLlc);
        assert_eq!(classify(&t, 2, 3), MigrationKind::CrossLlc);
        assert_eq!(classify(&t, 3, 4), MigrationKind::CrossNuma);
        assert_eq!(classify(&t, 0, 99), MigrationKind::Unknown);
    }
}
