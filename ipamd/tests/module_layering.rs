//! The daemon's layering, checked: no import cycle between ipamd's top-level modules (a
//! module's production code naming `crate::<other>`, doc links included), and `lib.rs` a
//! composition root of bounded size. The pure core below them is the `ipam-core` crate, which
//! the compiler keeps from depending on the daemon.

#![allow(clippy::tests_outside_test_module)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            // test-only folders (`mod tests;` under `#[cfg(test)]`)
            if path.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_none_or(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The production part of a source file: up to its `#[cfg(test)] mod tests`.
fn production(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |i| &text[..i])
}

/// The identifier `text` starts with.
fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Every top-level module's dependencies on the others.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(&root).expect("read src") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path.clone());
        }
        modules.entry(name).or_default().extend(files);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    let mut g = BTreeMap::new();
    for (name, files) in &modules {
        let mut deps = BTreeSet::new();
        for f in files {
            let text = std::fs::read_to_string(f).expect("read");
            for part in production(&text).split("crate::").skip(1) {
                // `crate::x::…`, or a group `crate::{x, y::z, …}`
                let named: Vec<String> = match part.strip_prefix('{') {
                    Some(group) => group
                        .split('}')
                        .next()
                        .unwrap_or_default()
                        .split(',')
                        .map(|p| ident(p.trim_start()))
                        .collect(),
                    None => vec![ident(part)],
                };
                for other in named {
                    if other != *name && names.contains(&other) {
                        deps.insert(other);
                    }
                }
            }
        }
        g.insert(name.clone(), deps);
    }
    g
}

/// A cycle through `start`, if any (depth-first).
fn cycle_from(
    g: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
    at: &str,
    path: &mut Vec<String>,
    seen: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    for next in &g[at] {
        if next == start {
            let mut c = path.clone();
            c.push(start.to_owned());
            return Some(c);
        }
        if seen.insert(next.clone()) {
            path.push(next.clone());
            if let Some(c) = cycle_from(g, start, next, path, seen) {
                return Some(c);
            }
            path.pop();
        }
    }
    None
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let g = graph();
    assert!(g.contains_key("ipam") && g.contains_key("rpc"), "{g:?}");
    // grouped imports are seen
    assert!(g["daemon"].contains("sgp"), "{g:?}");
    let cycles: Vec<String> = g
        .keys()
        .filter_map(|m| {
            cycle_from(&g, m, m, &mut vec![m.clone()], &mut BTreeSet::new()).map(|c| c.join(" -> "))
        })
        .collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

#[test]
fn the_check_sees_a_cycle() {
    let mut g = BTreeMap::new();
    g.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    g.insert("b".to_owned(), BTreeSet::from(["a".to_owned()]));
    assert_eq!(
        cycle_from(&g, "a", "a", &mut vec!["a".into()], &mut BTreeSet::new()),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
}

#[test]
fn the_core_below_the_daemon_is_a_crate_of_its_own() {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../ipam-core/Cargo.toml"),
    )
    .expect("ipam-core/Cargo.toml");
    assert!(
        !manifest
            .lines()
            .any(|l| l.trim_start().starts_with("ipamd")),
        "ipam-core must not depend on the daemon"
    );
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    assert!(lib.contains("pub use ipam_core::datastore;"));
}

#[test]
fn lib_rs_is_a_small_root() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let lines = lib.lines().count();
    assert!(
        lines <= 300,
        "ipamd/src/lib.rs has {lines} lines: features start in their modules"
    );
    assert!(
        !lib.contains("spawn") && !lib.contains("Ipam::"),
        "lib.rs declares modules, logging and the signal-driven run; the daemon composes"
    );
}
