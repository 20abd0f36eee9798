//! Trace files taken apart and put together byte by byte, independently of the tracer's code:
//! the layout in docs/TRACE-FILE.md, a CRC-32 and a zstd frame written out by hand.

/// The file header's length.
pub const FILE_HEADER: usize = 16;

pub fn version(file: &[u8]) -> u32 {
    u32::from_le_bytes(file[8..12].try_into().unwrap())
}

/// A frame header's length: 12 bytes in versions 1 and 2, 16 from version 3.
pub fn header_len(version: u32) -> usize {
    if version >= 3 { 16 } else { 12 }
}

/// One frame of a file: where it starts, its kind, its length with the header.
#[derive(Debug, Clone, Copy)]
pub struct FrameAt {
    pub offset: usize,
    pub kind: u8,
    pub len: usize,
}

/// Every frame of a sound file.
pub fn frames(file: &[u8]) -> Vec<FrameAt> {
    let hlen = header_len(version(file));
    let mut at = FILE_HEADER;
    let mut out = Vec::new();
    while at < file.len() {
        let len = u32::from_le_bytes(file[at + 4..at + 8].try_into().unwrap()) as usize;
        out.push(FrameAt {
            offset: at,
            kind: file[at],
            len: hlen + len,
        });
        at += hlen + len;
    }
    out
}

/// CRC-32 (ISO-HDLC, the one zlib and crc32fast compute), bit by bit.
pub fn crc32(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for &b in parts.iter().flat_map(|p| p.iter()) {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A frame in the layout of `version`; `raw_len` is the decompressed length that version 3
/// declares.
pub fn frame(version: u32, kind: u8, zstd: bool, body: &[u8], raw_len: u32) -> Vec<u8> {
    let mut h = vec![kind, u8::from(zstd), 0, 0];
    h.extend_from_slice(&(body.len() as u32).to_le_bytes());
    let crc = if version >= 3 {
        h.extend_from_slice(&raw_len.to_le_bytes());
        crc32(&[&h, body])
    } else {
        crc32(&[body])
    };
    h.extend_from_slice(&crc.to_le_bytes());
    h.extend_from_slice(body);
    h
}

/// A zstd frame (RFC 8878) of `n` zero bytes as RLE blocks of 128 KiB: 4 bytes a block, so
/// 256 MiB of zeros take 8 KiB. No content size in its header, as a streaming encoder writes.
pub fn zstd_zeros(n: usize) -> Vec<u8> {
    const BLOCK: usize = 128 << 10;
    let mut v = 0xFD2F_B528u32.to_le_bytes().to_vec();
    // Frame header descriptor: no content size, no checksum, no dictionary; then the window
    // descriptor: 2^(10 + 7) = 128 KiB.
    v.extend_from_slice(&[0x00, 7 << 3]);
    let mut left = n;
    while left > 0 {
        let size = left.min(BLOCK);
        left -= size;
        let last = u32::from(left == 0);
        // Block header: last-block bit, type 1 (RLE), then the regenerated size; one byte.
        let header = last | (1 << 1) | ((size as u32) << 3);
        v.extend_from_slice(&header.to_le_bytes()[..3]);
        v.push(0);
    }
    v
}
