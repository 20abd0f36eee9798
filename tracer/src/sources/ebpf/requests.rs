//! Attaching the request-marker uprobe to the pair of functions that bracket a request in the
//! target (`--request-start BIN:SYMBOL --request-end BIN:SYMBOL`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    },
};

use super::{cuda::find_library, elf};

/// A function in the target: the file it lives in, as the target sees it, and its symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// An absolute path, or the file name (or its start) of a file the target has mapped.
    pub binary: String,
    pub symbol: String,
}

impl std::str::FromStr for Marker {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.rsplit_once(':') {
            Some((b, sym)) if !b.is_empty() && !sym.is_empty() => Ok(Self {
                binary: b.into(),
                symbol: sym.into(),
            }),
            _ => Err(format!(
                "expected BINARY:SYMBOL (e.g. /usr/bin/server:handle_request or \
                 libserve.so:request_done), got {s:?}"
            )),
        }
    }
}

/// The request-start and request-end functions, and which argument carries the request id.
#[derive(Debug, Clone)]
pub struct RequestMarkers {
    pub start: Marker,
    pub end: Marker,
    /// 0-5: the argument holding the request id; None: requests are paired per thread.
    pub id_arg: Option<u8>,
}

/// The file behind `binary` for the members `pids` (the first given first): an absolute path
/// is taken in the first member's mount namespace; a bare name must be a file a member has
/// mapped (its executable or a library).
fn resolve(pids: &[u32], binary: &str) -> Result<PathBuf> {
    let pid = pids.first().copied().context("no process to probe")?;
    if let Some((p, _)) = (!binary.starts_with('/'))
        .then(|| pids.iter().find_map(|&m| find_library(m, binary)))
        .flatten()
    {
        return Ok(p);
    }
    if binary.starts_with('/') {
        // The executable of a member itself: /proc/M/exe leads the kernel straight to the
        // file, without walking the path again (on a 9p root under qemu, walks through
        // /proc/PID/root failed intermittently with ENOENT, in our lookup and the kernel's).
        if let Some(m) = pids.iter().find(|&&m| {
            std::fs::read_link(format!("/proc/{m}/exe")).is_ok_and(|e| e == Path::new(binary))
        }) {
            return Ok(PathBuf::from(format!("/proc/{m}/exe")));
        }
        let p = PathBuf::from(format!("/proc/{pid}/root{binary}"));
        if p.exists() {
            return Ok(p);
        }
        // /proc/PID/root does not lead through every filesystem (a 9p or virtiofs root under
        // qemu, seen with virtme-ng): in our own mount namespace the path is the same file.
        let ns = |who: &str| std::fs::read_link(format!("/proc/{who}/ns/mnt")).ok();
        if ns("self").is_some() && ns("self") == ns(&pid.to_string()) && Path::new(binary).exists()
        {
            return Ok(PathBuf::from(binary));
        }
        let why = std::fs::metadata(&p)
            .err()
            .map_or(String::new(), |e| format!(" ({e})"));
        bail!("{binary} does not exist in PID {pid}'s filesystem{why}");
    }
    bail!(
        "no traced process has a file named {binary}* mapped (see /proc/{pid}/maps); give \
         the absolute path of the executable or library that defines the marker functions"
    )
}

pub fn attach(ebpf: &mut Ebpf, pids: &[u32], m: &RequestMarkers) -> Result<Vec<UProbeLink>> {
    let mut links = Vec::new();
    for (marker, name) in [(&m.start, "request_start"), (&m.end, "request_end")] {
        let prog: &mut UProbe = ebpf
            .program_mut(name)
            .with_context(|| format!("program {name}"))?
            .try_into()?;
        prog.load().with_context(|| format!("loading {name}"))?;
        let path = resolve(pids, &marker.binary)?;
        let offsets = elf::symbol_offsets(&path, &[marker.symbol.as_str()])?;
        let Some(&offset) = offsets.get(marker.symbol.as_str()) else {
            bail!(
                "{} does not define {} (looked in its dynamic and static symbol tables; a \
                 stripped binary has no static ones, and C++/Rust names must be given mangled \
                 unless the function is extern \"C\")",
                marker.binary,
                marker.symbol
            );
        };
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: None,
        };
        let id = prog
            .attach(point, &path, UProbeScope::AllProcesses)
            .with_context(|| format!("uprobe on {}:{}", marker.binary, marker.symbol))?;
        links.push(prog.take_link(id)?);
    }
    Ok(links)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_parse() {
        let m: Marker = "/usr/bin/server:handle".parse().unwrap();
        assert_eq!(
            (m.binary.as_str(), m.symbol.as_str()),
            ("/usr/bin/server", "handle")
        );
        // The symbol is after the last colon.
        let m: Marker = "C:/x:f".parse().unwrap();
        assert_eq!(m.symbol, "f");
        assert!("nosymbol".parse::<Marker>().is_err());
        assert!("bin:".parse::<Marker>().is_err());
        assert!(":sym".parse::<Marker>().is_err());
    }
}
