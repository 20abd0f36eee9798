//! Trace files made in tests: frames in either header layout, and real payloads taken from
//! the fuzzer's seed (a version-1 file of `tracer attach` on a sleeping shell).

use super::{
    format::{FLAG_ZSTD, FORMAT_VERSION, FrameKind, MAGIC, write_frame},
    frames::{Frame, FrameReader},
};

pub const SEED: &[u8] = include_bytes!("../../../fuzz/seeds/sleeper.trace");

/// The seed's frames, decoded.
pub fn seed_frames() -> Vec<Frame> {
    let version = u32::from_le_bytes(SEED[8..12].try_into().unwrap());
    let mut r = FrameReader::new(&SEED[16..], version, SEED.len() as u64);
    std::iter::from_fn(|| r.next_frame().unwrap()).collect()
}

/// The seed's payload of `kind`.
pub fn seed_payload(kind: FrameKind) -> Vec<u8> {
    let f = seed_frames().into_iter().find(|f| f.kind == kind);
    f.expect("the seed has every frame kind but records and GPU")
        .payload
}

pub fn file_header(version: u32) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v
}

/// A current-version file of these frames (`true`: compressed).
pub fn file(frames: &[(FrameKind, &[u8], bool)]) -> Vec<u8> {
    let mut v = file_header(FORMAT_VERSION);
    for (k, p, z) in frames {
        write_frame(&mut v, *k, p, *z).unwrap();
    }
    v
}

/// One frame in the layout of versions 1 and 2: the checksum covers the stored payload only.
pub fn old_frame(kind: FrameKind, body: &[u8], zstd: bool) -> Vec<u8> {
    let mut v = vec![kind as u8, if zstd { FLAG_ZSTD } else { 0 }, 0, 0];
    v.extend_from_slice(&(body.len() as u32).to_le_bytes());
    v.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    v.extend_from_slice(body);
    v
}

/// A version-3 frame with any header fields, its checksum right for them.
pub fn raw_frame(kind: u8, flags: u8, body: &[u8], raw_len: u32) -> Vec<u8> {
    let mut v = vec![kind, flags, 0, 0];
    v.extend_from_slice(&(body.len() as u32).to_le_bytes());
    v.extend_from_slice(&raw_len.to_le_bytes());
    let crc = super::format::frame_crc(&v, body);
    v.extend_from_slice(&crc.to_le_bytes());
    v.extend_from_slice(body);
    v
}

/// Every frame of a file, until the end or the first damage (returned too).
pub fn read_all(file: &[u8]) -> (Vec<Frame>, Option<super::format::Damage>) {
    let version = u32::from_le_bytes(file[8..12].try_into().unwrap());
    let mut r = FrameReader::new(&file[16..], version, file.len() as u64);
    let mut frames = Vec::new();
    loop {
        match r.next_frame() {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => return (frames, None),
            Err(d) => return (frames, Some(d)),
        }
    }
}
