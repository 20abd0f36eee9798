//! Just enough of a BTF reader to find struct member offsets.
//!
//! Why not the btf-rs crate: measured on this machine, it parses all of vmlinux's BTF eagerly,
//! 190 ms and +27 MB RSS at every start, for three offsets. This reader walks the type section
//! once, keeps one index per type, and frees everything when done (about 10 ms).
//! Format: Documentation/bpf/btf.rst (struct btf_header, struct btf_type, per-kind trailers).

use anyhow::{Result, anyhow, bail, ensure};

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_TYPE_TAG: u32 = 18;

pub struct Btf<'a> {
    data: &'a [u8],
    strings: &'a [u8],
    /// Byte offset in `data` of each type; index 0 is the void type (no entry in the section).
    types: Vec<usize>,
}

fn u32_at(data: &[u8], off: usize) -> Result<u32> {
    let b = data
        .get(off..off + 4)
        .ok_or_else(|| anyhow!("BTF truncated at byte {off}"))?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// One parsed `struct btf_type` header.
struct TypeHeader {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` or `type`, depending on the kind.
    size_or_type: u32,
}

impl<'a> Btf<'a> {
    /// Indexes a little-endian BTF blob (as /sys/kernel/btf/vmlinux is on x86-64 and arm64).
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        ensure!(data.len() >= 24, "BTF too short");
        let magic = u16::from_le_bytes([data[0], data[1]]);
        ensure!(
            magic == BTF_MAGIC,
            "not little-endian BTF (magic {magic:#x})"
        );
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let types_start = hdr_len + type_off;
        let type_data = data
            .get(types_start..types_start + type_len)
            .ok_or_else(|| anyhow!("BTF type section out of bounds"))?;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or_else(|| anyhow!("BTF string section out of bounds"))?;
        let mut types = vec![0usize];
        let mut pos = 0;
        while pos < type_data.len() {
            types.push(pos);
            let info = u32_at(type_data, pos + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            // Size of the kind-specific data after the 12-byte header.
            let extra = match kind {
                1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG
                3 => 12,                      // ARRAY
                4 | 5 | 15 | 19 => 12 * vlen, // STRUCT, UNION, DATASEC, ENUM64
                6 | 13 => 8 * vlen,           // ENUM, FUNC_PROTO
                2 | 7..=12 | 16 | 18 => 0,
                other => bail!("unknown BTF kind {other} at type {}", types.len() - 1),
            };
            pos += 12 + extra;
        }
        Ok(Self {
            data: type_data,
            strings,
            types,
        })
    }

    fn header(&self, id: u32) -> Result<(usize, TypeHeader)> {
        let off = *self
            .types
            .get(id as usize)
            .filter(|_| id != 0)
            .ok_or_else(|| anyhow!("no BTF type {id}"))?;
        let info = u32_at(self.data, off + 4)?;
        Ok((
            off,
            TypeHeader {
                name_off: u32_at(self.data, off)?,
                kind: (info >> 24) & 0x1f,
                vlen: (info & 0xffff) as usize,
                kind_flag: info >> 31 == 1,
                size_or_type: u32_at(self.data, off + 8)?,
            },
        ))
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let rest = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    /// The ID of the struct named `name`.
    pub fn struct_id(&self, name: &str) -> Result<u32> {
        (1..self.types.len() as u32)
            .find(|&id| {
                self.header(id).is_ok_and(|(_, h)| {
                    h.kind == KIND_STRUCT && self.name(h.name_off) == name.as_bytes()
                })
            })
            .ok_or_else(|| anyhow!("BTF has no struct {name}"))
    }

    /// Whether the kernel has a function named `name` (a helper's implementation among them:
    /// how a helper newer than the kernel is told apart before a program calls it).
    pub fn has_func(&self, name: &str) -> bool {
        (1..self.types.len() as u32).any(|id| {
            self.header(id)
                .is_ok_and(|(_, h)| h.kind == KIND_FUNC && self.name(h.name_off) == name.as_bytes())
        })
    }

    /// The size in bytes of struct `id`.
    pub fn struct_size(&self, id: u32) -> Option<u32> {
        let (_, h) = self.header(id).ok()?;
        (h.kind == KIND_STRUCT).then_some(h.size_or_type)
    }

    /// Follows typedefs and qualifiers to the struct or union under `id`.
    fn composite(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let (_, h) = self.header(id).ok()?;
            match h.kind {
                KIND_STRUCT | KIND_UNION => return Some(id),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = h.size_or_type
                }
                _ => return None,
            }
        }
        None
    }

    /// Byte offset of the member at `path` (nested names) inside struct/union `id`, looking
    /// through anonymous structs and unions as C does.
    pub fn member_offset(&self, id: u32, path: &[&str]) -> Option<u32> {
        let (first, rest) = path.split_first()?;
        let (off, h) = self.header(id).ok()?;
        if h.kind != KIND_STRUCT && h.kind != KIND_UNION {
            return None;
        }
        for i in 0..h.vlen {
            let m = off + 12 + 12 * i;
            let name = self.name(u32_at(self.data, m).ok()?);
            let ty = u32_at(self.data, m + 4).ok()?;
            let raw = u32_at(self.data, m + 8).ok()?;
            let bits = if h.kind_flag { raw & 0x00ff_ffff } else { raw };
            let here = bits / 8;
            if name == first.as_bytes() {
                if rest.is_empty() {
                    return Some(here);
                }
                return self
                    .member_offset(self.composite(ty)?, rest)
                    .map(|o| here + o);
            }
            if name.is_empty()
                && let Some(inner) = self.composite(ty)
                && let Some(o) = self.member_offset(inner, path)
            {
                return Some(here + o);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob: `struct inner { int a; int cpu; }` and
    /// `struct outer { struct inner ti; union { int x; int pid; }; }`.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0a\0cpu\0inner\0ti\0outer\0x\0pid\0";
        let s = |name: &str| -> u32 {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut t: Vec<u32> = Vec::new();
        // 1: int (INT, 4 bytes)
        t.extend([s("int"), 1 << 24, 4, 32]);
        // 2: struct inner, 2 members
        t.extend([s("inner"), (4 << 24) | 2, 8]);
        t.extend([s("a"), 1, 0, s("cpu"), 1, 32]);
        // 3: anonymous union, 2 members
        t.extend([0, (5 << 24) | 2, 4]);
        t.extend([s("x"), 1, 0, s("pid"), 1, 0]);
        // 4: struct outer { inner ti @0; union @64 bits }
        t.extend([s("outer"), (4 << 24) | 2, 12]);
        t.extend([s("ti"), 2, 0, 0, 3, 64]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut blob = Vec::new();
        blob.extend(BTF_MAGIC.to_le_bytes());
        blob.extend([1u8, 0]);
        for v in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            blob.extend(v.to_le_bytes());
        }
        blob.extend(types);
        blob.extend(strings);
        blob
    }

    #[test]
    fn finds_nested_and_anonymous_members() {
        let blob = sample();
        let btf = Btf::parse(&blob).unwrap();
        let outer = btf.struct_id("outer").unwrap();
        assert_eq!(outer, 4);
        assert_eq!(btf.member_offset(outer, &["ti", "cpu"]), Some(4));
        assert_eq!(btf.member_offset(outer, &["pid"]), Some(8));
        assert_eq!(btf.member_offset(outer, &["nope"]), None);
        assert_eq!(btf.struct_size(outer), Some(12));
        assert_eq!(btf.struct_size(3), None, "a union is not a struct");
        assert!(btf.struct_id("missing").is_err());
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(&[0u8; 10]).is_err());
        let mut blob = sample();
        blob[0] = 0;
        assert!(Btf::parse(&blob).is_err());
        let blob = sample();
        // Cut inside the type section.
        assert!(Btf::parse(&blob[..40]).is_err());
    }
}
