//! The layering ARCHITECTURE.md draws, checked against the code's own `crate::` paths: the
//! recording at the bottom, the sources, the trace file and the analysis on it, the renderers on
//! the analysis, the session and the commands on top. A module that reaches above its layer
//! fails this test, which names the file and the path. (Paths through `super::` stay within a
//! folder in this code; unit tests are not held to it.)

/// Each folder (or leaf file) of `tracer/src`, and the top-level modules it may name.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves: every layer may use them, and they use nothing of the crate.
    ("units.rs", &[]),
    ("error.rs", &[]),
    // Its message is made safe for a terminal as every name is.
    ("signals.rs", &["recording"]),
    ("recording", &["recording", "units", "error"]),
    ("sources", &["sources", "recording", "units", "error"]),
    (
        "trace",
        &["trace", "recording", "units", "error", "signals"],
    ),
    ("analysis", &["analysis", "recording", "units"]),
    ("render", &["render", "analysis", "recording", "units"]),
    ("workload", &["workload", "sources", "recording", "units"]),
];

/// The top-level module names in `crate::` paths of `src`: `crate::a::b`, `crate::{a, b::c}`.
fn named_modules(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            // Top-level items of the brace group: split at depth-0 commas.
            let mut depth = 0;
            let mut item = String::new();
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(head(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            out.push(head(&item));
        } else {
            out.push(head(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

/// The first path segment of `s`.
fn head(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn no_module_reaches_above_its_layer() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (place, allowed) in ALLOWED {
        let path = root.join(place);
        let files: Vec<std::path::PathBuf> = if path.is_dir() {
            walk(&path)
        } else {
            vec![path]
        };
        assert!(!files.is_empty(), "{place} has no sources");
        for f in files {
            let src = std::fs::read_to_string(&f).unwrap();
            // A file's unit tests (at its end, by this code's habit) may use anything.
            let code = src
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap_or_default();
            for m in named_modules(code) {
                if !allowed.contains(&m.as_str()) {
                    broken.push(format!("{} names crate::{m}", f.display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports above their layer:\n{}",
        broken.join("\n")
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

#[test]
fn paths_are_read_whole() {
    let src = "use crate::{\n    recording::{A, b::C},\n    sources::x,\n};\nlet y = crate::units::dur(1);";
    assert_eq!(named_modules(src), ["recording", "sources", "units"]);
}
