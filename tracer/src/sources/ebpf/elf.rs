//! Symbol offsets in an ELF file (a shared library or an executable), for uprobes. aya can
//! resolve a symbol itself, but it maps and parses the whole file once per symbol (libcuda is
//! tens of MB: seconds for a dozen probes on the GPU machine); this parses once for all.

use std::{collections::BTreeMap, fs::File, path::Path};

use anyhow::{Context as _, Result};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// File offsets of the symbols among `names` that `path` defines: exported (dynamic) ones first,
/// then the static symbol table, which holds an executable's own functions unless it is
/// stripped.
pub fn symbol_offsets<'n>(path: &Path, names: &[&'n str]) -> Result<BTreeMap<&'n str, u64>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: the mapping is read-only and private; a library being replaced underneath would
    // only make the parse fail.
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("mapping {}", path.display()))?;
    let obj = object::File::parse(&*map).with_context(|| format!("parsing {}", path.display()))?;
    let mut out = BTreeMap::new();
    for sym in obj.dynamic_symbols().chain(obj.symbols()) {
        let Ok(name) = sym.name() else { continue };
        let Some(&wanted) = names.iter().find(|n| **n == name) else {
            continue;
        };
        if out.contains_key(wanted) {
            continue;
        }
        let Some(index) = sym.section_index() else {
            continue; // undefined: imported, not exported
        };
        let Ok(section) = obj.section_by_index(index) else {
            continue;
        };
        let Some((file_offset, _)) = section.file_range() else {
            continue;
        };
        // The uprobe wants a file offset: the symbol's place in its section, from the
        // section's place in the file.
        out.insert(wanted, sym.address() - section.address() + file_offset);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exported_functions_of_libc() {
        // libc is on every machine the tests run on; find it through our own maps.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so"))
            .expect("libc mapped");
        let got =
            symbol_offsets(Path::new(libc), &["nanosleep", "malloc", "no_such_symbol"]).unwrap();
        assert!(
            got.contains_key("nanosleep") && got.contains_key("malloc"),
            "{got:?}"
        );
        assert!(!got.contains_key("no_such_symbol"));
        // File offsets fall inside the file.
        let len = std::fs::metadata(libc).unwrap().len();
        assert!(got.values().all(|&o| o > 0 && o < len));
    }

    #[test]
    fn finds_the_static_symbols_of_an_executable() {
        // This test binary's own functions are in .symtab only (not exported). Referenced here,
        // so the linker keeps them in the test binary.
        use crate::workload::server::{tracer_request_end, tracer_request_start};
        std::hint::black_box([
            tracer_request_start as extern "C" fn(u64),
            tracer_request_end,
        ]);
        let exe = std::env::current_exe().unwrap();
        let got = symbol_offsets(&exe, &["tracer_request_start", "tracer_request_end"]).unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        // Two probes at one address would both fire on every call.
        assert_ne!(got["tracer_request_start"], got["tracer_request_end"]);
    }
}
