//! Reading a trace file back, recovering what a damaged or unfinished one still holds.
//!
//! The frames must come in the order the writer makes them (docs/TRACE-FILE.md):
//! `Meta (Records | Gpu | Cgroup)* [Final End]`, and nothing after `End`. Anything else is
//! damage at its offset, handled like a bad checksum: what precedes it is kept and the report
//! says where it stopped. Without these rules a trace appended to another, or frames after the
//! end, were merged into the recording silently.

use std::{fs::File, io::BufReader, path::Path};

use anyhow::{Context as _, Result, bail};

use super::{
    TraceMeta,
    format::{Damage, FrameKind, read_header},
    frames::{Frame, FrameReader},
};
use crate::recording::{Recording, cgroup::CgroupSample, gpu::GpuPoll};

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

/// Where in the file's grammar the frames read so far leave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Nothing read: the metadata frame comes first.
    Start,
    /// After the metadata: streamed frames, or the final frame.
    Body,
    /// After the final frame: only the end frame.
    Final,
    /// After the end frame: nothing.
    End,
}

impl Place {
    /// Where a frame of `kind` leads, or why it may not come here.
    fn then(self, kind: FrameKind) -> Result<Self, String> {
        use FrameKind as K;
        match (self, kind) {
            (Self::Start, K::Meta) => Ok(Self::Body),
            (Self::Start, k) => Err(format!(
                "the first frame is a {} frame, not the metadata frame",
                k.name()
            )),
            (Self::Body, K::Records | K::Gpu | K::Cgroup) => Ok(Self::Body),
            (Self::Body, K::Final) => Ok(Self::Final),
            (Self::Body, K::Meta) => {
                Err("a second metadata frame: another trace was appended to this one".into())
            }
            (Self::Body, K::End) => Err("an end frame without a final frame before it".into()),
            (Self::Final, K::End) => Ok(Self::End),
            (Self::Final, k) => Err(format!(
                "a {} frame after the final frame, where only the end frame may come",
                k.name()
            )),
            (Self::End, _) => unreachable!("nothing is read after the end frame"),
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(f: &Frame) -> Result<T, Damage> {
    ciborium::from_reader(&f.payload[..]).map_err(|e| Damage::Corrupt {
        offset: f.offset,
        why: format!("the {} frame does not decode: {e}", f.kind.name()),
    })
}

pub fn read(path: &Path) -> Result<TraceContents> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // The file's size bounds what it may decompress to (`format::MAX_EXPANSION`).
    let size = file
        .metadata()
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    read_from(BufReader::new(file), size, &path.display().to_string())
}

/// Reads a trace of `size` bytes from any reader (`name` says where it came from, in errors):
/// the file path above, and the fuzzer's bytes.
pub fn read_from(mut r: impl std::io::Read, size: u64, name: &str) -> Result<TraceContents> {
    let version = read_header(&mut r).with_context(|| name.to_string())?;
    let mut frames = FrameReader::new(r, version, size);
    let mut meta = None;
    let mut out = TraceContents {
        meta: placeholder_meta(),
        records: Vec::new(),
        gpu: Vec::new(),
        cgroup: Vec::new(),
        final_recording: None,
        damage: None,
        version,
        complete: false,
    };
    out.damage = read_frames(&mut frames, &mut out, &mut meta).err();
    let Some(meta) = meta else {
        let why = out
            .damage
            .map_or("it has no metadata frame".to_string(), |d| d.to_string());
        bail!("{name}: nothing can be recovered: {why}");
    };
    out.meta = meta;
    Ok(out)
}

/// Takes every frame into `out` (the metadata into `meta`) until the end or the first damage.
fn read_frames(
    frames: &mut FrameReader<impl std::io::Read>,
    out: &mut TraceContents,
    meta: &mut Option<TraceMeta>,
) -> Result<(), Damage> {
    let mut place = Place::Start;
    while let Some(f) = frames.next_frame()? {
        place = place.then(f.kind).map_err(|why| Damage::Misplaced {
            offset: f.offset,
            why,
        })?;
        match f.kind {
            FrameKind::Meta => *meta = Some(decode(&f)?),
            FrameKind::Records => out.records.extend_from_slice(&f.payload),
            FrameKind::Gpu => out.gpu.extend(decode::<Vec<GpuPoll>>(&f)?),
            FrameKind::Cgroup => out.cgroup.extend(decode::<Vec<CgroupSample>>(&f)?),
            FrameKind::Final => {
                let rec: Recording = decode(&f)?;
                if let Some(why) = impossible(&rec) {
                    return Err(Damage::Corrupt {
                        offset: f.offset,
                        why: format!("the final frame holds an impossible recording: {why}"),
                    });
                }
                out.final_recording = Some(rec);
            }
            FrameKind::End if !f.payload.is_empty() => {
                return Err(Damage::Corrupt {
                    offset: f.offset,
                    why: "the end frame is not empty".into(),
                });
            }
            FrameKind::End => {
                out.complete = true;
                return trailing(frames);
            }
        }
    }
    Ok(())
}

/// What no recording the writer made can hold (a checksum covers the bytes, not whether
/// they were ever a recording), as a reason, if the recording holds it.
fn impossible(rec: &Recording) -> Option<String> {
    if rec.end_ns < rec.start_ns {
        return Some(format!(
            "its window ends ({} ns) before it starts ({} ns)",
            rec.end_ns, rec.start_ns
        ));
    }
    if let Some(t) = rec.target_exited_ns.filter(|&t| t < rec.start_ns) {
        return Some(format!(
            "its target exited ({t} ns) before the window started ({} ns)",
            rec.start_ns
        ));
    }
    None
}

/// The end frame ends the file: anything after it was appended.
fn trailing(frames: &mut FrameReader<impl std::io::Read>) -> Result<(), Damage> {
    let offset = frames.offset();
    match frames.rest() {
        Ok(0) => Ok(()),
        Ok(n) => Err(Damage::Misplaced {
            offset,
            why: format!(
                "{n} more bytes after the end frame: the trace ended there, and something was \
                 appended to it"
            ),
        }),
        Err(e) => Err(Damage::Corrupt {
            offset,
            why: e.to_string(),
        }),
    }
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
        probe_mode: crate::recording::ProbeMode::TpBtf,
        start_ns: 0,
        bin_ns: 0,
        counter_mask: 0,
        threads: Default::default(),
        pid_namespace: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::testfile::{SEED, file, seed_payload};

    /// The cgroup samples in the seed's one cgroup frame.
    const SEED_SAMPLES: usize = 4;

    fn read_bytes(v: &[u8]) -> Result<TraceContents> {
        read_from(v, v.len() as u64, "test")
    }

    /// The seed's frames in the current layout, `extra` inserted before the final frame.
    fn trace(extra: &[(FrameKind, &[u8], bool)], finished: bool) -> Vec<u8> {
        let (meta, cgroup, fin) = (
            seed_payload(FrameKind::Meta),
            seed_payload(FrameKind::Cgroup),
            seed_payload(FrameKind::Final),
        );
        let mut frames = vec![(FrameKind::Meta, &meta[..], false)];
        frames.push((FrameKind::Cgroup, &cgroup[..], false));
        frames.extend_from_slice(extra);
        if finished {
            frames.extend([
                (FrameKind::Final, &fin[..], true),
                (FrameKind::End, &[][..], false),
            ]);
        }
        file(&frames)
    }

    fn misplaced(c: &TraceContents) -> (u64, &str) {
        match &c.damage {
            Some(Damage::Misplaced { offset, why }) => (*offset, why),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_complete_file_reads_in_either_version() {
        for v in [SEED.to_vec(), trace(&[], true)] {
            let c = read_bytes(&v).unwrap();
            assert!(c.complete && c.final_recording.is_some() && c.damage.is_none());
            assert_eq!(c.cgroup.len(), SEED_SAMPLES);
        }
        assert_eq!(read_bytes(SEED).unwrap().version, 1);
    }

    /// A recording whose window ends before it starts (checksums fine: the bytes are as
    /// written, the content was never a recording) is damage, not a report of "0ns".
    #[test]
    fn an_impossible_final_recording_is_damage() {
        let mut rec: Recording =
            ciborium::from_reader(&seed_payload(FrameKind::Final)[..]).unwrap();
        rec.end_ns = rec.start_ns - 1_000;
        let mut fin = Vec::new();
        ciborium::into_writer(&rec, &mut fin).unwrap();
        let meta = seed_payload(FrameKind::Meta);
        let v = file(&[
            (FrameKind::Meta, &meta[..], false),
            (FrameKind::Final, &fin[..], true),
            (FrameKind::End, &[][..], false),
        ]);
        let c = read_bytes(&v).unwrap();
        assert!(c.final_recording.is_none());
        match &c.damage {
            Some(Damage::Corrupt { why, .. }) => {
                assert!(
                    why.contains("ends") && why.contains("before it starts"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    /// Issue 13 (16): frames after the end frame were merged into the recording.
    #[test]
    fn anything_after_the_end_frame_is_refused_and_the_trace_before_kept() {
        let one = trace(&[], true);
        for appended in [
            trace(&[], true),
            trace(&[], true)[16..].to_vec(),
            vec![0; 7],
        ] {
            let mut v = one.clone();
            v.extend_from_slice(&appended);
            let c = read_bytes(&v).unwrap();
            let (offset, why) = misplaced(&c);
            assert_eq!(offset, one.len() as u64);
            let n = appended.len();
            assert!(
                why.contains(&format!("{n} more bytes after the end frame")),
                "{why}"
            );
            assert!(c.complete && c.final_recording.is_some());
            assert_eq!(c.cgroup.len(), SEED_SAMPLES, "nothing appended is merged");
        }
    }

    #[test]
    fn frames_out_of_order_are_refused_at_their_offset() {
        // An unfinished trace with another appended: its metadata frame is the damage.
        let partial = trace(&[], false);
        let mut v = partial.clone();
        v.extend_from_slice(&trace(&[], true)[16..]);
        let c = read_bytes(&v).unwrap();
        assert_eq!(
            misplaced(&c),
            (
                partial.len() as u64,
                "a second metadata frame: another trace was appended to this one"
            )
        );
        assert!(!c.complete && c.final_recording.is_none());
        assert_eq!(c.cgroup.len(), SEED_SAMPLES);
        // Only the end frame may follow the final frame.
        let done = trace(&[], true);
        let end = done.len() - 16;
        let mut v = done[..end].to_vec();
        v.extend_from_slice(&done[16..16 + 16 + seed_payload(FrameKind::Meta).len()]);
        let c = read_bytes(&v).unwrap();
        let (offset, why) = misplaced(&c);
        assert_eq!(offset, end as u64);
        assert!(
            why.contains("a metadata frame after the final frame"),
            "{why}"
        );
        assert!(c.final_recording.is_some() && !c.complete);
        // An end frame needs a final frame before it.
        let c = read_bytes(&trace(&[(FrameKind::End, b"", false)], false)).unwrap();
        assert!(misplaced(&c).1.contains("without a final frame"));
        // The metadata frame comes first, or nothing can be recovered.
        let v = file(&[(FrameKind::Records, &[0u8; 32], false)]);
        let err = format!("{:#}", read_bytes(&v).err().unwrap());
        assert!(err.contains("not the metadata frame"), "{err}");
    }

    #[test]
    fn a_frame_that_does_not_decode_is_damage_not_a_failure() {
        let c = read_bytes(&trace(&[(FrameKind::Gpu, b"\xff\xff", false)], true)).unwrap();
        match c.damage {
            Some(Damage::Corrupt { why, .. }) => assert!(why.contains("GPU frame"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(c.cgroup.len(), SEED_SAMPLES);
    }
}
