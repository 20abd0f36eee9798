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

/// Attaches the entry probe to every function in `CudaFn` that libcuda (driver API) or
/// libcudart (runtime API) exports, and the return probe to the synchronizing ones. Probes
/// fire for any process using the libraries (a per-process uprobe would only follow the thread
/// it was opened on); the programs keep the target's threads only.
pub fn attach(ebpf: &mut Ebpf, pid: u32) -> Result<CudaAttach> {
    let Some(driver) = find_libcuda(pid) else {
        return Ok(not_available(format!(
            "libcuda.so is not mapped in PID {pid}: it has not initialized CUDA (GPU waits are \
             not measured)"
        )));
    };
    // The runtime is a separate library in most builds (PyTorch's wheels included); where it is
    // linked statically, only the driver calls are seen.
    let runtime = find_library(pid, "libcudart.so");
    for name in ["cuda_call_enter", "cuda_call_exit"] {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name}"))?
            .try_into()?;
        prog.load().with_context(|| format!("loading {name}"))?;
    }
    let mut links = Vec::new();
    let mut functions = Vec::new();
    let mut seen = Vec::new();
    for (lib, is_runtime) in [(Some(&driver), false), (runtime.as_ref(), true)] {
        let Some((path, shown)) = lib else { continue };
        let wanted: Vec<CudaFn> = CudaFn::ALL
            .into_iter()
            .filter(|f| f.runtime() == is_runtime)
            .collect();
        let names: Vec<&str> = wanted.iter().map(|f| f.symbol()).collect();
        let offsets = elf::symbol_offsets(path, &names)?;
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
            functions.push(f);
        }
        let probed: Vec<&str> = functions
            .iter()
            .filter(|f| f.runtime() == is_runtime)
            .map(|f| f.symbol())
            .collect();
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
    Ok(CudaAttach {
        capability: Capability {
            available: true,
            reason: format!("uprobes on {}", seen.join("; ")),
        },
        links,
        functions,
    })
}
