//! The trace file format.
//!
//! ```text
//! file   = magic (8 bytes) version (u32 LE) flags (u32 LE) frame*
//! frame  = kind (u8) flags (u8) reserved (u16) length (u32 LE) crc32 (u32 LE) payload
//! ```
//!
//! Frames are self-delimiting and checksummed, so a file cut short by a crash or a full disk
//! keeps every complete frame, and a damaged one is found. The timeline (raw ring-buffer
//! records, fixed-size and already defined by `tracer-common`) goes in zstd-compressed
//! `Records` frames written about once a second; everything structured is CBOR (RFC 8949):
//! compact, self-describing so that fields can be added without breaking old readers, and
//! readable from any language (Python's cbor2, for one). A finished file ends with a `Final`
//! frame holding the recording and an empty `End` frame.

use std::io::{self, Read, Write};

use thiserror::Error;

/// "\x89TRC\r\n\x1a\n": a non-ASCII first byte and line endings that text-mode transfers would
/// mangle, as PNG does.
pub const MAGIC: [u8; 8] = *b"\x89TRC\r\n\x1a\n";
/// Incremented on any change old readers cannot read.
/// 2: a switch-in record carries the kind of wait it ended (`tracer_common::WaitCode`), and
/// records come grouped by CPU rather than in time order. 1 is still read.
pub const FORMAT_VERSION: u32 = 2;
/// No frame is larger: a corrupted length must not make a reader allocate gigabytes.
pub const MAX_FRAME: u32 = 256 << 20;

pub const FLAG_ZSTD: u8 = 1;

#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// CBOR `TraceMeta`.
    Meta = 1,
    /// Raw ring-buffer records (`Event`, `CounterSlice`), back to back.
    Records = 2,
    /// CBOR `Vec<GpuPoll>`: streamed for recovery; the final frame has the full GPU data.
    Gpu = 3,
    /// CBOR `Vec<CgroupSample>`.
    Cgroup = 4,
    /// CBOR `Recording`: the kernel's totals and everything not derived from the records.
    Final = 5,
    /// Empty: the file was finished cleanly.
    End = 6,
}

impl TryFrom<u8> for FrameKind {
    type Error = u8;
    fn try_from(v: u8) -> Result<Self, u8> {
        Ok(match v {
            1 => Self::Meta,
            2 => Self::Records,
            3 => Self::Gpu,
            4 => Self::Cgroup,
            5 => Self::Final,
            6 => Self::End,
            other => return Err(other),
        })
    }
}

#[derive(Debug, Error)]
pub enum FormatError {
    #[error("not a tracer trace file (its first bytes are not the trace magic)")]
    Foreign,
    #[error(
        "written by a newer tracer (trace format {found}; this tracer reads up to {supported}): \
         read it with a newer tracer"
    )]
    Newer { found: u32, supported: u32 },
    #[error("the file ends inside the header")]
    ShortHeader,
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

pub fn write_header(w: &mut impl Write) -> io::Result<()> {
    w.write_all(&MAGIC)?;
    w.write_all(&FORMAT_VERSION.to_le_bytes())?;
    w.write_all(&0u32.to_le_bytes())
}

pub fn read_header(r: &mut impl Read) -> Result<u32, FormatError> {
    let mut h = [0u8; 16];
    let mut got = 0;
    while got < h.len() {
        match r.read(&mut h[got..])? {
            0 => break,
            n => got += n,
        }
    }
    if got < MAGIC.len() || h[..8] != MAGIC {
        return Err(if got >= 8 || got == 0 {
            FormatError::Foreign
        } else {
            FormatError::ShortHeader
        });
    }
    if got < h.len() {
        return Err(FormatError::ShortHeader);
    }
    let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if version > FORMAT_VERSION {
        return Err(FormatError::Newer {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(version)
}

/// Writes one frame, compressing the payload when asked.
pub fn write_frame(
    w: &mut impl Write,
    kind: FrameKind,
    payload: &[u8],
    zstd: bool,
) -> io::Result<()> {
    // The reader holds a frame's payload to the same bound, compressed or not.
    if payload.len() > MAX_FRAME as usize {
        return Err(io::Error::other("frame too large"));
    }
    let compressed;
    let (body, flags) = if zstd {
        // Level 1: at 480k records/s (the bench writing a trace file) compression is most of
        // the tracer's CPU time; level 1 took 8.3 % of a CPU against 10.7 % for level 3, and
        // its file was no larger (9.0 MB against about 10.4 MB for 400k round trips).
        compressed = zstd::bulk::compress(payload, 1)?;
        (&compressed[..], FLAG_ZSTD)
    } else {
        (payload, 0)
    };
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l <= MAX_FRAME)
        .ok_or_else(|| io::Error::other("frame too large"))?;
    let mut header = [0u8; 12];
    header[0] = kind as u8;
    header[1] = flags;
    header[4..8].copy_from_slice(&len.to_le_bytes());
    header[8..12].copy_from_slice(&crc32fast::hash(body).to_le_bytes());
    w.write_all(&header)?;
    w.write_all(body)
}

/// One frame read back.
#[derive(Debug)]
pub struct Frame {
    pub kind: FrameKind,
    pub payload: Vec<u8>,
}

/// Why reading stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// The file ends inside a frame.
    Truncated { offset: u64 },
    /// A frame's checksum, kind, length or compression is wrong.
    Corrupt { offset: u64, why: String },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { offset } => write!(f, "the file is cut short at byte {offset}"),
            Self::Corrupt { offset, why } => write!(f, "corrupt frame at byte {offset}: {why}"),
        }
    }
}

/// Reads frames until the end of the file or the first damage.
pub fn read_frames(r: &mut impl Read, mut offset: u64) -> (Vec<Frame>, Option<Damage>) {
    let mut frames = Vec::new();
    loop {
        let mut header = [0u8; 12];
        match read_full(r, &mut header) {
            Ok(0) => return (frames, None),
            Ok(12) => {}
            Ok(_) => return (frames, Some(Damage::Truncated { offset })),
            Err(e) => {
                return (
                    frames,
                    Some(Damage::Corrupt {
                        offset,
                        why: e.to_string(),
                    }),
                );
            }
        }
        let corrupt = |why: String| Some(Damage::Corrupt { offset, why });
        let Ok(kind) = FrameKind::try_from(header[0]) else {
            return (frames, corrupt(format!("unknown frame kind {}", header[0])));
        };
        let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if len > MAX_FRAME {
            return (
                frames,
                corrupt(format!("frame length {len} over the limit")),
            );
        }
        let crc = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        // Grown as the bytes arrive, not allocated from the header's word: a damaged length
        // costs no more memory than the file has.
        let mut body = Vec::new();
        match r.by_ref().take(u64::from(len)).read_to_end(&mut body) {
            Ok(n) if n == len as usize => {}
            Ok(_) => return (frames, Some(Damage::Truncated { offset })),
            Err(e) => return (frames, corrupt(e.to_string())),
        }
        if crc32fast::hash(&body) != crc {
            return (frames, corrupt("checksum mismatch".into()));
        }
        let payload = if header[1] & FLAG_ZSTD != 0 {
            match decompress(&body) {
                Ok(p) => p,
                Err(e) => return (frames, corrupt(format!("bad compression: {e}"))),
            }
        } else {
            body
        };
        offset += 12 + len as u64;
        frames.push(Frame { kind, payload });
    }
}

/// A frame's zstd payload, never past `MAX_FRAME` decompressed (the writer never makes more),
/// and grown as it decompresses: `zstd::bulk::decompress` would reserve its whole bound up
/// front for every frame (the fuzzer found that).
fn decompress(body: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(body)?
        .take(u64::from(MAX_FRAME) + 1)
        .read_to_end(&mut out)?;
    if out.len() > MAX_FRAME as usize {
        return Err(io::Error::other("decompresses past the frame limit"));
    }
    Ok(out)
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(frames: &[(FrameKind, &[u8], bool)]) -> Vec<u8> {
        let mut v = Vec::new();
        write_header(&mut v).unwrap();
        for (k, p, z) in frames {
            write_frame(&mut v, *k, p, *z).unwrap();
        }
        v
    }

    #[test]
    fn frames_round_trip_compressed_or_not() {
        let big = vec![7u8; 100_000];
        let v = file(&[
            (FrameKind::Meta, b"meta", false),
            (FrameKind::Records, &big, true),
        ]);
        let mut r = &v[..];
        assert_eq!(read_header(&mut r).unwrap(), FORMAT_VERSION);
        let (frames, damage) = read_frames(&mut r, 16);
        assert_eq!(damage, None);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].payload, b"meta");
        assert_eq!(frames[1].payload, big);
        // Compression did its job on a repetitive payload.
        assert!(v.len() < 1_000, "{}", v.len());
    }

    #[test]
    fn truncation_and_corruption_keep_the_good_frames() {
        let v = file(&[
            (FrameKind::Meta, b"meta", false),
            (FrameKind::Records, b"0123456789", false),
        ]);
        // Cut inside the second frame.
        let mut r = &v[16..v.len() - 3];
        let (frames, damage) = read_frames(&mut r, 16);
        assert_eq!(frames.len(), 1);
        assert_eq!(
            damage,
            Some(Damage::Truncated {
                offset: 16 + 12 + 4
            })
        );
        // Flip a payload byte of the second frame.
        let mut bad = v.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let (frames, damage) = read_frames(&mut &bad[16..], 16);
        assert_eq!(frames.len(), 1);
        assert!(matches!(damage, Some(Damage::Corrupt { why, .. }) if why.contains("checksum")));
        // A length beyond the limit is refused before any allocation.
        let mut huge = v.clone();
        huge[16 + 4..16 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let (frames, damage) = read_frames(&mut &huge[16..], 16);
        assert!(frames.is_empty());
        assert!(matches!(damage, Some(Damage::Corrupt { why, .. }) if why.contains("limit")));
    }

    #[test]
    fn foreign_and_newer_files_are_named() {
        assert!(matches!(
            read_header(&mut &b"{\"json\": true}"[..]),
            Err(FormatError::Foreign)
        ));
        assert!(matches!(
            read_header(&mut &b""[..]),
            Err(FormatError::Foreign)
        ));
        let mut newer = Vec::new();
        newer.extend_from_slice(&MAGIC);
        newer.extend_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        newer.extend_from_slice(&0u32.to_le_bytes());
        let err = read_header(&mut &newer[..]).unwrap_err();
        assert!(err.to_string().contains("newer tracer"), "{err}");
        assert!(matches!(
            read_header(&mut &MAGIC[..4]),
            Err(FormatError::ShortHeader)
        ));
    }
}
