//! Trace files taken apart and put together byte by byte, independently of the tracer's code:
//! the layout in docs/TRACE-FILE.md.

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
