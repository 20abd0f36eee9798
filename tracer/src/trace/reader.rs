//! Reading a trace file back, recovering what a damaged or unfinished one still holds.

use std::{fs::File, io::BufReader, path::Path};

use anyhow::{Context as _, Result, anyhow, bail};

use super::{
    TraceMeta,
    format::{Damage, FrameKind, read_frames, read_header},
};
use crate::{
    recording::{Recording, gpu::GpuPoll},
    sources::cgroup::CgroupSample,
};

/// Everything read from a trace file.
pub struct TraceContents {
    pub meta: TraceMeta,
    /// The raw ring-buffer records, in the order they were received.
    pub records: Vec<u8>,
    pub gpu: Vec<GpuPoll>,
    pub cgroup: Vec<CgroupSample>,
    /// The finished recording; absent if the tracer stopped before writing it.
    pub final_recording: Option<Recording>,
    /// Why reading stopped early, if it did.
    pub damage: Option<Damage>,
    /// The file's format version (`format::FORMAT_VERSION` or older).
    pub version: u32,
    /// The `End` frame was reached: the file is complete.
    pub complete: bool,
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, payload: &[u8]) -> Result<T> {
    ciborium::from_reader(payload).map_err(|e| anyhow!("the {what} frame does not decode: {e}"))
}

pub fn read(path: &Path) -> Result<TraceContents> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    read_from(BufReader::new(file), &path.display().to_string())
}

/// Reads a trace from any reader (`name` says where it came from, in errors): the file path
/// above, and the fuzzer's bytes.
pub fn read_from(mut r: impl std::io::Read, name: &str) -> Result<TraceContents> {
    let version = read_header(&mut r).with_context(|| name.to_string())?;
    let (frames, damage) = read_frames(&mut r, 16);
    let mut meta = None;
    let mut out = TraceContents {
        meta: placeholder_meta(),
        records: Vec::new(),
        gpu: Vec::new(),
        cgroup: Vec::new(),
        final_recording: None,
        damage,
        version,
        complete: false,
    };
    for f in frames {
        match f.kind {
            FrameKind::Meta => meta = Some(decode::<TraceMeta>("metadata", &f.payload)?),
            FrameKind::Records => out.records.extend_from_slice(&f.payload),
            FrameKind::Gpu => out.gpu.extend(decode::<Vec<GpuPoll>>("GPU", &f.payload)?),
            FrameKind::Cgroup => out
                .cgroup
                .extend(decode::<Vec<CgroupSample>>("cgroup", &f.payload)?),
            FrameKind::Final => {
                out.final_recording = Some(decode::<Recording>("final", &f.payload)?)
            }
            FrameKind::End => out.complete = true,
        }
    }
    let Some(meta) = meta else {
        let why = out
            .damage
            .map_or("it has no metadata frame".to_string(), |d| d.to_string());
        bail!("{name}: nothing can be recovered: {why}");
    };
    out.meta = meta;
    Ok(out)
}

fn placeholder_meta() -> TraceMeta {
    TraceMeta {
        tracer_version: String::new(),
        target: crate::recording::TargetMeta {
            pid: 0,
            comm: String::new(),
            cmdline: vec![],
        },
        host: Default::default(),
        probe_mode: crate::sources::ebpf::ProbeMode::TpBtf,
        start_ns: 0,
        bin_ns: 0,
        counter_mask: 0,
        threads: Default::default(),
        pid_namespace: None,
    }
}
