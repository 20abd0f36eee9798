//! CPU topology from sysfs, to classify migrations: a move between SMT siblings keeps the
//! caches, one within a last-level cache keeps the LLC, one across LLCs or NUMA nodes loses
//! them. Also the kernel's CPU lists, and a thread's CPU affinity.

use std::path::Path;

use crate::recording::topology::CpuPlace;

fn read_u32(p: &Path) -> Option<u32> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// The CPUs of a kernel CPU list such as "0-3,8,10-11" (empty, or `(null)`, for none).
pub fn cpu_list(s: &str) -> Vec<u32> {
    s.trim()
        .split(',')
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
            None => r.parse().ok().map(|c| c..=c),
        })
        .flatten()
        .collect()
}

/// The lowest CPU of a cpulist such as "0-3,8-11".
fn first_of_list(s: &str) -> Option<u32> {
    cpu_list(s).into_iter().min()
}

/// Restricts thread `tid` (0: the caller) to `cpus`.
pub fn set_affinity(tid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it for any CPU below its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        anyhow::ensure!(c < libc::CPU_SETSIZE as usize, "CPU {c} is out of range");
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: the set lives for the call.
    let rc = unsafe { libc::sched_setaffinity(tid as i32, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        anyhow::bail!(
            "setting the CPU affinity of {tid} to {cpus:?}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
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

    #[test]
    fn cpu_lists_give_their_lowest_cpu() {
        assert_eq!(first_of_list("8-11,0-3\n"), Some(0));
    }

    #[test]
    fn cpu_lists_are_read() {
        assert_eq!(cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(cpu_list("\n"), Vec::<u32>::new());
        assert_eq!(cpu_list("(null)\n"), Vec::<u32>::new());
    }

    #[test]
    fn this_machine_has_a_topology() {
        let cpus: Vec<u32> =
            (0..std::thread::available_parallelism().unwrap().get() as u32).collect();
        let t = read(&cpus);
        assert_eq!(t.len(), cpus.len(), "{t:?}");
    }
}
