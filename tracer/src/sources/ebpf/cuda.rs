//! Attaching the CUDA uprobes to the libcuda.so a running target has mapped: no restart, no
//! injection, no environment variable. The library is found in /proc/PID/maps and opened
//! through /proc/PID/root, so a target in another mount namespace (a container) works too.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    },
};
use tracer_common::CudaFn;

use super::elf;
use crate::recording::Capability;

/// The first mapped library of `pid` whose file name starts with `prefix`, as a path this
/// process can open, and as the target sees it.
pub(super) fn find_library(pid: u32, prefix: &str) -> Option<(PathBuf, String)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .map(|path| {
            (
                PathBuf::from(format!("/proc/{pid}/root{path}")),
                path.to_string(),
            )
        })
}

/// The libcuda.so mapped by `pid` (opened path, path as the target sees it).
pub fn find_libcuda(pid: u32) -> Option<(PathBuf, String)> {
    find_library(pid, "libcuda.so")
}

/// What attaching found and did.
pub struct CudaAttach {
    pub capability: Capability,
    pub links: Vec<UProbeLink>,
    /// The functions probed (the others are absent from the libraries).
    pub functions: Vec<CudaFn>,
}

fn not_available(reason: String) -> CudaAttach {
    CudaAttach {
        capability: Capability {
            available: false,
            reason,
        },
        links: vec![],
        functions: vec![],
    }
}

/// The distinct files among each member's mapped library `prefix` (a file mapped by several
/// members, or seen through several mount namespaces, once: by device and inode).
fn distinct_libraries(pids: &[u32], prefix: &str) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::MetadataExt as _;
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for &pid in pids {
        let Some((path, shown)) = find_library(pid, prefix) else {
            continue;
        };
        let Ok(m) = std::fs::metadata(&path) else {
            continue;
        };
        if !seen.contains(&(m.dev(), m.ino())) {
            seen.push((m.dev(), m.ino()));
            out.push((path, shown));
        }
    }
    out
}

/// The host's libcuda.so.1, as the dynamic linker finds it: the library a member that
/// initializes CUDA during the window will map (in this tool's mount namespace).
fn host_libcuda() -> Option<(PathBuf, String)> {
    let cache = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok();
    let listed = cache.and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.trim_start().starts_with("libcuda.so.1 "))
            .filter_map(|l| l.rsplit("=> ").next().map(|p| p.trim().to_string()))
            .find(|p| Path::new(p).exists())
    });
    let known = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
    ];
    listed
        .or_else(|| {
            known
                .iter()
                .find(|p| Path::new(p).exists())
                .map(|p| p.to_string())
        })
        .map(|p| (PathBuf::from(&p), p))
}

/// Attaches the entry probe to every function in `CudaFn` that libcuda (driver API) or
/// libcudart (runtime API) exports, and the return probe to the synchronizing ones, in each
/// distinct library file the members (`pids`, this tool's numbering) have mapped. Probes fire
/// for any process using the files (a per-process uprobe would only follow the thread it was
/// opened on); the programs keep the target set's threads only, so a member that maps the
/// same file later is covered. No member with CUDA yet: the host's libcuda, for one that
/// initializes it during the window.
pub fn attach(ebpf: &mut Ebpf, pids: &[u32]) -> Result<CudaAttach> {
    let mut drivers = distinct_libraries(pids, "libcuda.so");
    let later = drivers.is_empty();
    if later {
        match host_libcuda() {
            Some(host) => drivers.push(host),
            None => {
                return Ok(not_available(format!(
                    "libcuda.so is not mapped in {}, and the host has none (ldconfig -p): GPU \
                     waits are not measured",
                    members_named(pids)
                )));
            }
        }
    }
    // The runtime is a separate library in most builds (PyTorch's wheels included); where it is
    // linked statically, only the driver calls are seen.
    let runtimes = distinct_libraries(pids, "libcudart.so");
    for name in ["cuda_call_enter", "cuda_call_exit"] {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name}"))?
            .try_into()?;
        prog.load().with_context(|| format!("loading {name}"))?;
    }
    let mut links = Vec::new();
    let mut functions: Vec<CudaFn> = Vec::new();
    let mut seen = Vec::new();
    let libs = drivers
        .iter()
        .map(|l| (l, false))
        .chain(runtimes.iter().map(|l| (l, true)));
    for ((path, shown), is_runtime) in libs {
        let wanted: Vec<CudaFn> = CudaFn::ALL
            .into_iter()
            .filter(|f| f.runtime() == is_runtime)
            .collect();
        let names: Vec<&str> = wanted.iter().map(|f| f.symbol()).collect();
        let offsets = elf::symbol_offsets(path, &names)?;
        let mut probed = Vec::new();
        for f in wanted {
            let Some(&offset) = offsets.get(f.symbol()) else {
                continue;
            };
            let mut probes = vec!["cuda_call_enter"];
            if f.synchronizes() {
                probes.push("cuda_call_exit");
            }
            for name in probes {
                let prog: &mut UProbe = ebpf
                    .program_mut(name)
                    .with_context(|| format!("program {name}"))?
                    .try_into()?;
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(offset),
                    cookie: Some(f as u64),
                };
                let id = prog
                    .attach(point, path, UProbeScope::AllProcesses)
                    .with_context(|| format!("uprobe on {shown}:{}", f.symbol()))?;
                links.push(prog.take_link(id)?);
            }
            if !functions.contains(&f) {
                functions.push(f);
            }
            probed.push(f.symbol());
        }
        seen.push(format!("{shown} ({})", probed.join(", ")));
    }
    if !functions.iter().any(|f| f.synchronizes()) {
        return Ok(CudaAttach {
            capability: Capability {
                available: false,
                reason: format!("no synchronizing CUDA call exported by {}", seen.join("; ")),
            },
            links,
            functions,
        });
    }
    let when = if later {
        format!(
            "; no member had initialized CUDA yet ({}), so the host's library is probed for \
             one that does in the window",
            members_named(pids)
        )
    } else {
        String::new()
    };
    Ok(CudaAttach {
        capability: Capability {
            available: true,
            reason: format!("uprobes on {}{when}", seen.join("; ")),
        },
        links,
        functions,
    })
}

/// "PID 12", "any of PIDs 12, 13, 14".
fn members_named(pids: &[u32]) -> String {
    match pids {
        [one] => format!("PID {one}"),
        many => format!(
            "any of PIDs {}",
            many.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
