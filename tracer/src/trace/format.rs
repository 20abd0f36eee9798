//! The trace file format.
//!
//! ```text
//! file   = magic (8 bytes) version (u32 LE) flags (u32 LE) frame*
//! frame  = kind (u8) flags (u8) reserved (u16) length (u32 LE) raw_length (u32 LE)
//!          crc32 (u32 LE) payload
//! ```
//!
//! Frames are self-delimiting and checksummed, so a file cut short by a crash or a full disk
//! keeps every complete frame, and a damaged one is found. The checksum covers the first 12
//! header bytes and the payload: a flipped kind or compression flag is found like a flipped
//! payload byte (versions 1 and 2 have a 12-byte header, without `raw_length`, whose checksum
//! covers the payload only). `raw_length` is the payload's length once decompressed, so that
//! a reader can refuse a frame that would take it past its bound before decompressing it. The
//! timeline (raw ring-buffer records, fixed-size and already defined by `tracer-common`) goes
//! in zstd-compressed `Records` frames written about once a second; everything structured is
//! CBOR (RFC 8949): compact, self-describing so that fields can be added without breaking old
//! readers, and readable from any language (Python's cbor2, for one). A finished file ends
//! with a `Final` frame holding the recording and an empty `End` frame. Reading is in
//! `frames.rs` (one frame at a time) and `reader.rs` (which frame may come where).

use std::io::{self, Read, Write};

use thiserror::Error;

/// "\x89TRC\r\n\x1a\n": a non-ASCII first byte and line endings that text-mode transfers would
/// mangle, as PNG does.
pub const MAGIC: [u8; 8] = *b"\x89TRC\r\n\x1a\n";
/// The file header's length: where the first frame starts.
pub const FILE_HEADER: u64 = 16;
/// Incremented on any change old readers cannot read.
/// 2: a switch-in record carries the kind of wait it ended (`tracer_common::WaitCode`), and
/// records come grouped by CPU rather than in time order.
/// 3: 16-byte frame headers that carry the decompressed length and are inside the checksum.
/// 1 and 2 are still read.
pub const FORMAT_VERSION: u32 = 3;
/// No frame is larger: a corrupted length must not make a reader allocate gigabytes.
pub const MAX_FRAME: u32 = 256 << 20;
/// A file decompresses to at most `MAX_EXPANSION` times its size plus `EXPANSION_SLACK`; a
/// reader refuses more, so that a small file cannot make it use gigabytes (zstd turns 8 KiB
/// into 256 MiB of zeros). Measured on traces from this tracer (docs/TRACE-FILE.md): whole
/// files expand 1.7× (idle) to 7.3× (busy, counters), 11.6× with 1000 idle threads; the most
/// compressible frame seen was that file's final frame, 105×; GPU polls of 8 idle GPUs, 25×.
pub const MAX_EXPANSION: u64 = 256;
/// For small files, where a single well-compressed final frame dominates.
pub const EXPANSION_SLACK: u64 = 16 << 20;

pub const FLAG_ZSTD: u8 = 1;

/// A frame header's length in a file of `version`.
pub fn frame_header_len(version: u32) -> usize {
    if version >= 3 { 16 } else { 12 }
}

/// The checksum of a version-3 frame: its first 12 header bytes, then the stored payload.
pub fn frame_crc(header: &[u8], body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header[..12]);
    h.update(body);
    h.finalize()
}

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

impl FrameKind {
    /// How errors name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Meta => "metadata",
            Self::Records => "records",
            Self::Gpu => "GPU",
            Self::Cgroup => "cgroup",
            Self::Final => "final",
            Self::End => "end",
        }
    }
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
        "the file is empty: no recording was written to it (a tracer stopped before it \
         began, or another program made the file)"
    )]
    Empty,
    #[error(
        "written by a newer tracer (trace format {found}; this tracer reads up to {supported}): \
         read it with a newer tracer"
    )]
    Newer { found: u32, supported: u32 },
    /// Version 0 was never written: the header is damaged.
    #[error("its header names trace format 0, which no tracer writes: the file is damaged")]
    NoVersion,
    /// Header flags are reserved (every tracer so far writes 0): a reader that does not know
    /// what a set one means cannot read the file right.
    #[error(
        "its header sets flags {0:#x}, which this tracer does not know: written by a newer          tracer (read it with that one), or damaged"
    )]
    UnknownFlags(u32),
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
    let mut h = [0u8; FILE_HEADER as usize];
    let got = read_full(r, &mut h)?;
    if got < MAGIC.len() || h[..8] != MAGIC {
        return Err(if got == 0 {
            FormatError::Empty
        } else if got >= 8 {
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
    if version == 0 {
        return Err(FormatError::NoVersion);
    }
    let flags = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
    if flags != 0 {
        return Err(FormatError::UnknownFlags(flags));
    }
    Ok(version)
}

/// Writes one frame (current version), compressing the payload when asked.
pub fn write_frame(
    w: &mut impl Write,
    kind: FrameKind,
    payload: &[u8],
    zstd: bool,
) -> io::Result<()> {
    // The reader holds a frame's payload to the same bound, compressed or not.
    let too_large = || io::Error::other("frame too large");
    let raw = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_FRAME)
        .ok_or_else(too_large)?;
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
        .ok_or_else(too_large)?;
    let mut header = [0u8; 16];
    header[0] = kind as u8;
    header[1] = flags;
    header[4..8].copy_from_slice(&len.to_le_bytes());
    header[8..12].copy_from_slice(&raw.to_le_bytes());
    let crc = frame_crc(&header, body);
    header[12..16].copy_from_slice(&crc.to_le_bytes());
    w.write_all(&header)?;
    w.write_all(body)
}

/// Why reading stopped before the end of the file. Every frame before `offset` was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// The file ends inside a frame.
    Truncated { offset: u64 },
    /// A frame's checksum, kind, flags, length or compression is wrong.
    Corrupt { offset: u64, why: String },
    /// Something where the format allows nothing, or not that: data after the end frame, a
    /// second metadata frame (another trace appended to this one), a frame after the final
    /// frame other than the end frame.
    Misplaced { offset: u64, why: String },
    /// Decompressing the frame at `offset` would take the file past its bound (`limit` bytes,
    /// from the file's `size`).
    TooLarge { offset: u64, limit: u64, size: u64 },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated { offset } => write!(f, "the file is cut short at byte {offset}"),
            Self::Corrupt { offset, why } => write!(f, "corrupt frame at byte {offset}: {why}"),
            Self::Misplaced { offset, why } => write!(f, "unexpected data at byte {offset}: {why}"),
            Self::TooLarge {
                offset,
                limit,
                size,
            } => write!(
                f,
                "frame at byte {offset}: the trace would decompress to more than {MAX_EXPANSION}× \
                 its size plus {} MiB ({} MiB for this file of {size} bytes); it was not written \
                 by tracer, or is damaged",
                EXPANSION_SLACK >> 20,
                limit >> 20,
            ),
        }
    }
}

/// Reads until `buf` is full or the input ends; returns how much was read.
pub fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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

    #[test]
    fn a_frame_header_is_what_the_docs_say() {
        let mut v = Vec::new();
        write_frame(&mut v, FrameKind::Cgroup, b"abc", false).unwrap();
        assert_eq!(v.len(), 16 + 3);
        assert_eq!(v[..4], [4, 0, 0, 0]);
        assert_eq!(v[4..8], 3u32.to_le_bytes());
        assert_eq!(v[8..12], 3u32.to_le_bytes());
        let crc = crc32fast::hash(&[&v[..12], b"abc"].concat());
        assert_eq!(v[12..16], crc.to_le_bytes());
        // Compressed: the stored length differs, the raw length is the payload's.
        let mut z = Vec::new();
        write_frame(&mut z, FrameKind::Records, &[0u8; 10_000], true).unwrap();
        assert_eq!(z[1], FLAG_ZSTD);
        assert_eq!(z[4..8], ((z.len() - 16) as u32).to_le_bytes());
        assert_eq!(z[8..12], 10_000u32.to_le_bytes());
    }

    #[test]
    fn foreign_and_newer_files_are_named() {
        assert!(matches!(
            read_header(&mut &b"{\"json\": true}"[..]),
            Err(FormatError::Foreign)
        ));
        assert!(matches!(
            read_header(&mut &b""[..]),
            Err(FormatError::Empty)
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
        // Version 0, and flags no tracer writes.
        let header = |version: u32, flags: u32| {
            let mut h = MAGIC.to_vec();
            h.extend_from_slice(&version.to_le_bytes());
            h.extend_from_slice(&flags.to_le_bytes());
            h
        };
        assert!(matches!(
            read_header(&mut &header(0, 0)[..]),
            Err(FormatError::NoVersion)
        ));
        let err = read_header(&mut &header(FORMAT_VERSION, 4)[..]).unwrap_err();
        assert!(matches!(err, FormatError::UnknownFlags(4)), "{err}");
        assert!(err.to_string().contains("0x4"), "{err}");
        assert_eq!(read_header(&mut &header(1, 0)[..]).unwrap(), 1);
    }
}
