//! Attaching the request-marker uprobe to the pair of functions that bracket a request in the
//! target (`--request-start BIN:SYMBOL --request-end BIN:SYMBOL`).

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};
use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    },
};
use tracer_common::{REQUEST_END_COOKIE, REQUEST_START_COOKIE};

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
        let p = PathBuf::from(format!("/proc/{pid}/root{binary}"));
        if !p.exists() {
            bail!("{binary} does not exist in PID {pid}'s filesystem");
        }
        return Ok(p);
    }
    bail!(
        "no traced process has a file named {binary}* mapped (see /proc/{pid}/maps); give \
         the absolute path of the executable or library that defines the marker functions"
    )
}

pub fn attach(ebpf: &mut Ebpf, pids: &[u32], m: &RequestMarkers) -> Result<Vec<UProbeLink>> {
    let prog: &mut UProbe = ebpf
        .program_mut("request_marker")
        .context("program request_marker")?
        .try_into()?;
    prog.load().context("loading request_marker")?;
    let mut links = Vec::new();
    for (marker, cookie) in [
        (&m.start, REQUEST_START_COOKIE),
        (&m.end, REQUEST_END_COOKIE),
    ] {
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
            cookie: Some(cookie),
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
