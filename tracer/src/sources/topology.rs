//! CPU topology from sysfs, to classify migrations: a move between SMT siblings keeps the
//! caches, one within a last-level cache keeps the LLC, one across LLCs or NUMA nodes loses
//! them.

use std::path::Path;

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

fn read_u32(p: &Path) -> Option<u32> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// The lowest CPU of a cpulist such as "0-3,8-11".
fn first_of_list(s: &str) -> Option<u32> {
    s.trim()
        .split(',')
        .filter_map(|r| r.split('-').next()?.parse().ok())
        .min()
}

/// The last-level cache of `cpu`: the highest cache index's shared CPU list.
fn llc_of(cpu_dir: &Path) -> Option<u32> {
    let cache = cpu_dir.join("cache");
    let mut best: Option<(u32, u32)> = None;
    for e in std::fs::read_dir(&cache).ok()?.flatten() {
        if !e.file_name().to_str()?.starts_with("index") {
            continue;
        }
        let level = read_u32(&e.path().join("level")).unwrap_or(0);
        let shared = std::fs::read_to_string(e.path().join("shared_cpu_list")).ok();
        if let Some(first) = shared.as_deref().and_then(first_of_list)
            && best.is_none_or(|(l, _)| level > l)
        {
            best = Some((level, first));
        }
    }
    best.map(|(_, first)| first)
}

fn node_of(cpu_dir: &Path) -> u32 {
    std::fs::read_dir(cpu_dir)
        .ok()
        .and_then(|d| {
            d.flatten().find_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("node")?
                    .parse::<u32>()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// The size in bytes of `cpu`'s unified or data cache at `level` (sysfs `cache/index*`).
pub fn cache_size(cpu: u32, level: u32) -> Option<usize> {
    let dir = Path::new("/sys/devices/system/cpu").join(format!("cpu{cpu}/cache"));
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let p = e.path();
        let text = |f: &str| std::fs::read_to_string(p.join(f)).ok();
        if read_u32(&p.join("level")) != Some(level) || text("type")?.trim() == "Instruction" {
            return None;
        }
        parse_size(text("size")?.trim())
    })
}

/// "512K", "32768K", "2M", "1024" (bytes).
fn parse_size(s: &str) -> Option<usize> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

/// Every online CPU's place; CPUs sysfs does not describe are left out.
pub fn read(cpus: &[u32]) -> Vec<CpuPlace> {
    cpus.iter()
        .filter_map(|&cpu| {
            let dir = Path::new("/sys/devices/system/cpu").join(format!("cpu{cpu}"));
            let topo = dir.join("topology");
            Some(CpuPlace {
                cpu,
                package: read_u32(&topo.join("physical_package_id")).unwrap_or(0),
                core: read_u32(&topo.join("core_id"))?,
                // Without cache information, assume one LLC per package.
                llc: llc_of(&dir).unwrap_or(u32::MAX),
                node: node_of(&dir),
            })
        })
        .collect()
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

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_size("512K"), Some(512 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
        // This machine has an L2 or L3 of some size (every CPU we run on).
        assert!(cache_size(0, 2).or(cache_size(0, 3)).is_some());
    }

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
        assert_eq!(first_of_list("8-11,0-3\n"), Some(0));
    }

    #[test]
    fn this_machine_has_a_topology() {
        let cpus: Vec<u32> =
            (0..std::thread::available_parallelism().unwrap().get() as u32).collect();
        let t = read(&cpus);
        assert_eq!(t.len(), cpus.len(), "{t:?}");
    }
}
