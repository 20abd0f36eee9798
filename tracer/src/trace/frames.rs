//! Reading frames back, one at a time: the header checked (from version 3 the checksum covers
//! every header byte), the payload grown as its bytes arrive, and decompressed only within the
//! bound that the file's size sets (`MAX_EXPANSION`).

use std::io::{self, Read};

use super::format::{
    Damage, EXPANSION_SLACK, FILE_HEADER, FLAG_ZSTD, FrameKind, MAGIC, MAX_EXPANSION, MAX_FRAME,
    frame_crc, frame_header_len, read_full,
};

/// zstd's window for the frames a tracer writes: level 1 uses at most 2^19 bytes, level 3
/// (files before level 1) 2^21. Capping it keeps a crafted frame from making the decoder
/// allocate and fill a 128 MiB window (zstd's default cap, 2^27).
const WINDOW_LOG_MAX: u32 = 23;

/// One frame read back.
#[derive(Debug)]
pub struct Frame {
    pub kind: FrameKind,
    /// Where its header starts in the file.
    pub offset: u64,
    pub payload: Vec<u8>,
}

/// A frame header, in either layout.
struct Header {
    kind: u8,
    flags: u8,
    reserved: u16,
    len: u32,
    /// The decompressed length (version 3).
    raw_len: Option<u32>,
    crc: u32,
}

impl Header {
    fn parse(h: &[u8], version: u32) -> Self {
        let word = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let v3 = version >= 3;
        Self {
            kind: h[0],
            flags: h[1],
            reserved: u16::from_le_bytes([h[2], h[3]]),
            len: word(4),
            raw_len: v3.then(|| word(8)),
            crc: word(if v3 { 12 } else { 8 }),
        }
    }

    /// The kind, if every field is one a tracer writes. Checked after the checksum, so that a
    /// damaged version-3 header is reported as such.
    fn check(&self) -> Result<FrameKind, String> {
        let kind = FrameKind::try_from(self.kind).map_err(|k| format!("unknown frame kind {k}"))?;
        if self.flags & !FLAG_ZSTD != 0 {
            return Err(format!("unknown frame flags {:#04x}", self.flags));
        }
        if self.reserved != 0 {
            return Err(format!(
                "reserved header bytes are {:#06x}, not 0",
                self.reserved
            ));
        }
        match self.raw_len {
            Some(raw) if raw > MAX_FRAME => {
                Err(format!("decompressed length {raw} over the limit"))
            }
            Some(raw) if self.flags & FLAG_ZSTD == 0 && raw != self.len => Err(format!(
                "uncompressed, but its lengths differ ({} stored, {raw} raw)",
                self.len
            )),
            _ => Ok(kind),
        }
    }
}

/// The frames of one file, read in order.
pub struct FrameReader<R> {
    r: R,
    version: u32,
    /// Where the next frame starts.
    offset: u64,
    /// The file's length when it was opened.
    size: u64,
    /// The payloads handed out so far, decompressed.
    total: u64,
}

impl<R: Read> FrameReader<R> {
    /// `r` is just past the file header; `size` is the file's length, which bounds what it
    /// may decompress to.
    pub fn new(r: R, version: u32, size: u64) -> Self {
        Self {
            r,
            version,
            offset: FILE_HEADER,
            size,
            total: 0,
        }
    }

    /// Where the next frame starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The most all payloads may decompress to: from the file's size, or from what has been
    /// read when that is more (a file still being written grows while it is read).
    pub fn limit(&self) -> u64 {
        MAX_EXPANSION
            .saturating_mul(self.size.max(self.offset))
            .saturating_add(EXPANSION_SLACK)
    }

    /// The next frame; `Ok(None)` at the end of the file. After an `Err` (the first damage)
    /// the reader must not be used again.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, Damage> {
        let offset = self.offset;
        let corrupt = |why: String| Damage::Corrupt { offset, why };
        let hlen = frame_header_len(self.version);
        let mut h = [0u8; 16];
        let got = read_full(&mut self.r, &mut h[..hlen]).map_err(|e| corrupt(e.to_string()))?;
        if got == 0 {
            return Ok(None);
        }
        if got >= MAGIC.len() && h[..MAGIC.len()] == MAGIC {
            return Err(Damage::Misplaced {
                offset,
                why: "another trace file's header: a trace was appended to this one".into(),
            });
        }
        if got < hlen {
            return Err(Damage::Truncated { offset });
        }
        let header = Header::parse(&h[..hlen], self.version);
        if header.len > MAX_FRAME {
            return Err(corrupt(format!(
                "frame length {} over the limit",
                header.len
            )));
        }
        // Grown as the bytes arrive, not allocated from the header's word: a damaged length
        // costs no more memory than the file has.
        let mut body = Vec::new();
        match (&mut self.r)
            .take(u64::from(header.len))
            .read_to_end(&mut body)
        {
            Ok(n) if n == header.len as usize => {}
            Ok(_) => return Err(Damage::Truncated { offset }),
            Err(e) => return Err(corrupt(e.to_string())),
        }
        let crc = match header.raw_len {
            Some(_) => frame_crc(&h, &body),
            None => crc32fast::hash(&body),
        };
        if crc != header.crc {
            return Err(corrupt("checksum mismatch".into()));
        }
        let kind = header.check().map_err(corrupt)?;
        let payload = self.payload(&header, body)?;
        self.total += payload.len() as u64;
        self.offset += (hlen + header.len as usize) as u64;
        Ok(Some(Frame {
            kind,
            offset,
            payload,
        }))
    }

    /// A checked frame's payload, decompressed within what is left of the bound.
    fn payload(&self, h: &Header, body: Vec<u8>) -> Result<Vec<u8>, Damage> {
        if h.flags & FLAG_ZSTD == 0 {
            // Stored as is: no larger than the file, so within the bound.
            return Ok(body);
        }
        let offset = self.offset;
        let corrupt = |why: String| Damage::Corrupt { offset, why };
        let too_large = Damage::TooLarge {
            offset,
            limit: self.limit(),
            size: self.size,
        };
        let left = self.limit().saturating_sub(self.total);
        let cap = match h.raw_len {
            // Refused before decompressing anything.
            Some(raw) if u64::from(raw) > left => return Err(too_large),
            Some(raw) => u64::from(raw),
            // Versions 1 and 2 do not say: the same bound, applied while decompressing.
            None => left.min(u64::from(MAX_FRAME)),
        };
        let out = decompress(&body, cap).map_err(|e| corrupt(format!("bad compression: {e}")))?;
        let got = out.len() as u64;
        match h.raw_len {
            Some(raw) if got != u64::from(raw) => Err(corrupt(if got > cap {
                format!("decompresses to more than the {raw} bytes its header says")
            } else {
                format!("decompresses to {got} bytes, not the {raw} its header says")
            })),
            None if got > cap && cap < left => {
                Err(corrupt("decompresses past the frame limit".into()))
            }
            None if got > cap => Err(too_large),
            _ => Ok(out),
        }
    }

    /// How many bytes follow the last frame read (reading them, holding none).
    pub fn rest(&mut self) -> io::Result<u64> {
        io::copy(&mut self.r, &mut io::sink())
    }
}

/// A zstd payload, at most `cap` bytes of it and one more (to tell that there is more), grown
/// as it decompresses: `zstd::bulk::decompress` would reserve its whole bound up front for
/// every frame (the fuzzer found that).
fn decompress(body: &[u8], cap: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut d = zstd::stream::read::Decoder::with_buffer(body)?;
    d.window_log_max(WINDOW_LOG_MAX)?;
    d.take(cap + 1).read_to_end(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::testfile::{file, file_header, old_frame, raw_frame, read_all};

    #[test]
    fn frames_round_trip_compressed_or_not() {
        let big = vec![7u8; 100_000];
        let v = file(&[
            (FrameKind::Meta, b"meta", false),
            (FrameKind::Records, &big, true),
        ]);
        let (frames, damage) = read_all(&v);
        assert_eq!(damage, None);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].payload, b"meta");
        assert_eq!((frames[1].offset, &frames[1].payload), (16 + 16 + 4, &big));
        // Compression did its job on a repetitive payload.
        assert!(v.len() < 1_000, "{}", v.len());
    }

    #[test]
    fn truncation_and_corruption_keep_the_good_frames() {
        let v = file(&[
            (FrameKind::Meta, b"meta", false),
            (FrameKind::Records, b"0123456789", false),
        ]);
        let second = 16 + 16 + 4;
        // Cut inside the second frame.
        let (frames, damage) = read_all(&v[..v.len() - 3]);
        assert_eq!(frames.len(), 1);
        assert_eq!(damage, Some(Damage::Truncated { offset: second }));
        // Flip a payload byte of the second frame.
        let mut bad = v.clone();
        *bad.last_mut().unwrap() ^= 0xff;
        let (frames, damage) = read_all(&bad);
        assert_eq!(frames.len(), 1);
        assert!(matches!(damage, Some(Damage::Corrupt { why, .. }) if why.contains("checksum")));
        // A length beyond the limit is refused before any allocation.
        let mut huge = v.clone();
        huge[16 + 4..16 + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let (frames, damage) = read_all(&huge);
        assert!(frames.is_empty());
        assert!(matches!(damage, Some(Damage::Corrupt { why, .. }) if why.contains("limit")));
    }

    /// Issue 13 (16): a flipped kind or flags byte was outside the checksum, and the frame was
    /// read as something else.
    #[test]
    fn every_header_byte_is_inside_the_checksum() {
        let payload = zstd::bulk::compress(&[5u8; 4096], 1).unwrap();
        let v = file(&[
            (FrameKind::Meta, b"meta", false),
            (FrameKind::Records, &[5u8; 4096], true),
        ]);
        let second = 16 + 16 + 4;
        assert_eq!(v.len(), second + 16 + payload.len());
        for byte in second..second + 16 {
            for bit in 0..8 {
                let mut bad = v.clone();
                bad[byte] ^= 1 << bit;
                let (frames, damage) = read_all(&bad);
                assert_eq!(frames.len(), 1, "byte {byte} bit {bit}");
                let offset = match damage {
                    Some(Damage::Corrupt { offset, .. } | Damage::Truncated { offset }) => offset,
                    other => panic!("byte {byte} bit {bit}: {other:?}"),
                };
                assert_eq!(offset, second as u64, "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn fields_a_tracer_never_writes_are_refused() {
        let mut v = file_header(3);
        v.extend(raw_frame(1, 0, b"meta", 4));
        let ok = v.len();
        let why = |frame: Vec<u8>| {
            let mut f = v.clone();
            f.extend(frame);
            match read_all(&f) {
                (frames, Some(Damage::Corrupt { offset, why })) if frames.len() == 1 => {
                    assert_eq!(offset, ok as u64);
                    why
                }
                other => panic!("{other:?}"),
            }
        };
        assert!(why(raw_frame(9, 0, b"x", 1)).contains("unknown frame kind 9"));
        assert!(why(raw_frame(2, 2, b"x", 1)).contains("unknown frame flags"));
        assert!(why(raw_frame(2, 0, b"x", 2)).contains("lengths differ"));
        let mut reserved = raw_frame(2, 0, b"x", 1);
        reserved[3] = 1;
        let crc = crate::trace::format::frame_crc(&reserved, b"x");
        reserved[12..16].copy_from_slice(&crc.to_le_bytes());
        assert!(why(reserved).contains("reserved"));
        // The decompressed length is checked against what decompression gives, both ways.
        let z = zstd::bulk::compress(&[1u8; 1000], 1).unwrap();
        assert!(why(raw_frame(2, FLAG_ZSTD, &z, 10)).contains("more than the 10 bytes"));
        assert!(why(raw_frame(2, FLAG_ZSTD, &z, 2000)).contains("1000 bytes, not the 2000"));
    }

    #[test]
    fn version_2_frames_still_read() {
        let mut v = file_header(2);
        v.extend(old_frame(FrameKind::Meta, b"meta", false));
        let z = zstd::bulk::compress(&[3u8; 5000], 1).unwrap();
        v.extend(old_frame(FrameKind::Records, &z, true));
        let (frames, damage) = read_all(&v);
        assert_eq!(damage, None);
        assert_eq!(frames[1].offset, 16 + 12 + 4);
        assert_eq!(frames[1].payload, [3u8; 5000]);
    }

    /// A frame asking for a larger zstd window than a tracer uses is refused, not given one.
    #[test]
    fn a_large_zstd_window_is_refused() {
        use std::io::Write as _;
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        enc.set_parameter(zstd::stream::raw::CParameter::WindowLog(WINDOW_LOG_MAX + 1))
            .unwrap();
        enc.write_all(&[9u8; 1000]).unwrap();
        let z = enc.finish().unwrap();
        let mut v = file_header(3);
        v.extend(raw_frame(2, FLAG_ZSTD, &z, 1000));
        let (_, damage) = read_all(&v);
        assert!(
            matches!(&damage, Some(Damage::Corrupt { why, .. }) if why.contains("bad compression")),
            "{damage:?}"
        );
        // The writer's own frames are well inside it.
        let big: Vec<u8> = (0..8u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        let (frames, damage) = read_all(&file(&[(FrameKind::Records, &big, true)]));
        assert_eq!((frames.len(), damage), (1, None));
    }

    /// Issue 13 (10): 40 frames of 256 MiB of zeros in 331 KB made `report` use 6 GB.
    #[test]
    fn a_decompression_bomb_is_refused_within_the_bound() {
        let zeros = zstd::bulk::compress(&vec![0u8; 40 << 20], 1).unwrap();
        // Versions 1 and 2 do not declare the decompressed length: stopped while decompressing.
        let mut v = file_header(2);
        v.extend(old_frame(FrameKind::Meta, b"meta", false));
        let bomb = v.len() as u64;
        v.extend(old_frame(FrameKind::Records, &zeros, true));
        let (frames, damage) = read_all(&v);
        assert_eq!(frames.len(), 1);
        let size = v.len() as u64;
        let limit = MAX_EXPANSION * size + EXPANSION_SLACK;
        assert_eq!(
            damage,
            Some(Damage::TooLarge {
                offset: bomb,
                limit,
                size
            })
        );
        let text = damage.unwrap().to_string();
        assert!(
            text.contains("not written by tracer, or is damaged"),
            "{text}"
        );
        // Version 3 declares it: refused before decompressing anything (the body here is not
        // even zstd).
        let mut v = file_header(3);
        v.extend(raw_frame(1, 0, b"meta", 4));
        v.extend(raw_frame(2, FLAG_ZSTD, b"not zstd", 40 << 20));
        let (frames, damage) = read_all(&v);
        assert_eq!(frames.len(), 1);
        assert!(
            matches!(damage, Some(Damage::TooLarge { .. })),
            "{damage:?}"
        );
        // Below the bound, the same payload reads.
        let mut v = file_header(3);
        v.extend(raw_frame(2, FLAG_ZSTD, &zeros[..], 40 << 20));
        v.resize(v.len() + (100 << 10), 0);
        let (frames, _) = read_all(&v);
        assert_eq!(frames[0].payload.len(), 40 << 20);
    }

    #[test]
    fn another_trace_appended_is_named() {
        let mut v = file(&[(FrameKind::Meta, b"meta", false)]);
        let at = v.len() as u64;
        v.extend(file(&[(FrameKind::Meta, b"meta", false)]));
        let (frames, damage) = read_all(&v);
        assert_eq!(frames.len(), 1);
        assert!(
            matches!(damage, Some(Damage::Misplaced { offset, why }) if offset == at && why.contains("appended")),
        );
    }
}
