//! Issue 42: no detached work in ipamd's production code. Every long-running or
//! fire-and-forget piece of work belongs to a task set its owner awaits (the daemon's
//! `Daemon::serve`, the Kubernetes client's `ClusterTasks::beside`); a `tokio::spawn` whose
//! handle is dropped outlives shutdown and hides its failures. This scans `ipamd/src` (its
//! `#[cfg(test)]` items and test-only modules left out) for the spawns that detach, naming file
//! and line. Owns only the scan; must not run or build anything of ipamd.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A token of Rust source: comments and literals are dropped, so text in them never matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Punct(char),
    /// A string, char or number literal (its text does not matter).
    Lit,
}

/// `(token, line)` of `src`. Handles line and nested block comments, (raw, byte) strings, char
/// literals and lifetimes; enough of Rust's lexical grammar for this scan.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= c.len() {
                    break;
                }
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' || ((ch == 'b' || ch == 'r' || ch == 'c') && starts_string(&c, i)) {
            let start_line = line;
            // prefix letters, then hashes of a raw string
            let mut raw = false;
            while c[i] != '"' && c[i] != '#' {
                raw |= c[i] == 'r';
                i += 1;
            }
            let mut hashes = 0;
            while c[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1; // opening quote
            loop {
                if i >= c.len() {
                    break;
                }
                match c[i] {
                    '\\' if !raw => {
                        if at(i + 1) == '\n' {
                            line += 1;
                        }
                        i += 2;
                    }
                    '"' if (0..hashes).all(|h| at(i + 1 + h) == '#') => {
                        i += 1 + hashes;
                        break;
                    }
                    '\n' => {
                        line += 1;
                        i += 1;
                    }
                    _ => i += 1,
                }
            }
            out.push((Tok::Lit, start_line));
        } else if ch == '\'' {
            // a char literal ('x', '\n', '\u{..}') or a lifetime ('a)
            if at(i + 1) == '\\' {
                // past the quote, the backslash and the escaped character, then to the close
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push((Tok::Lit, line));
            } else if at(i + 2) == '\'' {
                i += 3;
                out.push((Tok::Lit, line));
            } else {
                i += 1; // a lifetime: its name follows as an identifier
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Lit, line));
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// A string literal starts at `i` (`b"`, `r"`, `r#"`, `br"`, `c"`...), not an identifier.
fn starts_string(c: &[char], i: usize) -> bool {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return false;
    }
    let mut j = i;
    while j < c.len() && j < i + 2 && matches!(c[j], 'b' | 'r' | 'c') {
        j += 1;
    }
    while j < c.len() && c[j] == '#' {
        j += 1;
    }
    j < c.len() && c[j] == '"' && (j == i + 1 || c[i..j].contains(&'r'))
}

fn is_ident(t: Option<&(Tok, usize)>, name: &str) -> bool {
    matches!(t, Some((Tok::Ident(s), _)) if s == name)
}

fn is_punct(t: Option<&(Tok, usize)>, p: char) -> bool {
    matches!(t, Some((Tok::Punct(q), _)) if *q == p)
}

/// Index just past the bracket group opening at `open` (`(`, `[` or `{`).
fn close_of(toks: &[(Tok, usize)], open: usize) -> usize {
    let mut depth = 0_i32;
    for (k, (t, _)) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// A `#[cfg(..)]` (or `#![cfg(..)]`) at `i` that compiles only under test: `test` named, and
/// neither `not` nor `any` (`cfg(not(test))` is production code). Returns the index past it.
fn test_only_attribute(toks: &[(Tok, usize)], i: usize) -> Option<usize> {
    if !is_punct(toks.get(i), '#') {
        return None;
    }
    let open = if is_punct(toks.get(i + 1), '!') {
        i + 2
    } else {
        i + 1
    };
    if !is_punct(toks.get(open), '[') || !is_ident(toks.get(open + 1), "cfg") {
        return None;
    }
    let end = close_of(toks, open);
    let inner = &toks[open..end];
    let names = |n: &str| inner.iter().any(|(t, _)| *t == Tok::Ident(n.to_owned()));
    (names("test") && !names("not") && !names("any")).then_some(end)
}

/// What one file's scan found.
#[derive(Debug, Default)]
struct Scan {
    /// `(line, what)` of each detached spawn outside test-only code.
    detached: Vec<(usize, String)>,
    /// `mod name;` declared test-only (their files are test code).
    test_modules: Vec<String>,
    /// The whole file is test-only (`#![cfg(test)]`).
    test_only: bool,
}

/// Scans one file's text.
fn scan(src: &str) -> Scan {
    let toks = lex(src);
    let mut out = Scan::default();
    let mut i = 0;
    while i < toks.len() {
        if let Some(after) = test_only_attribute(&toks, i) {
            if is_punct(toks.get(i + 1), '!') {
                out.test_only = true;
                return out;
            }
            // the item (or statement, field, arm) the attribute applies to: other attributes,
            // then up to its `;`, its `{..}` body, or the `,`/closing bracket of its list
            let mut k = after;
            while is_punct(toks.get(k), '#') {
                k = close_of(&toks, k + 1);
            }
            if is_ident(toks.get(k), "mod")
                && let Some((Tok::Ident(name), _)) = toks.get(k + 1)
                && is_punct(toks.get(k + 2), ';')
            {
                out.test_modules.push(name.clone());
            }
            loop {
                match toks.get(k) {
                    None => break,
                    Some((Tok::Punct(';' | ','), _)) => {
                        k += 1;
                        break;
                    }
                    Some((Tok::Punct('{'), _)) => {
                        k = close_of(&toks, k);
                        break;
                    }
                    Some((Tok::Punct('(' | '['), _)) => k = close_of(&toks, k),
                    Some((Tok::Punct(')' | ']' | '}'), _)) => break,
                    Some(_) => k += 1,
                }
            }
            i = k;
            continue;
        }
        if let Some(found) = detached_at(&toks, i) {
            out.detached.push((toks[i].1, found));
        }
        i += 1;
    }
    out
}

/// A detached spawn starting at token `i`: `tokio::spawn`, `task::spawn`, `thread::spawn`,
/// `thread::Builder`, any `spawn_local`, and a `spawn_blocking(..)` not awaited right there.
/// A `JoinSet`'s `.spawn(` is owned (the set awaits or aborts it) and not matched.
fn detached_at(toks: &[(Tok, usize)], i: usize) -> Option<String> {
    let Some((Tok::Ident(name), _)) = toks.get(i) else {
        return None;
    };
    let path_from = |owner: &str| {
        i >= 3
            && is_punct(toks.get(i - 1), ':')
            && is_punct(toks.get(i - 2), ':')
            && is_ident(toks.get(i - 3), owner)
    };
    match name.as_str() {
        "spawn" if path_from("tokio") => Some("tokio::spawn".into()),
        "spawn" if path_from("task") => Some("task::spawn".into()),
        "spawn" if path_from("thread") => Some("thread::spawn".into()),
        "Builder" if path_from("thread") => Some("thread::Builder".into()),
        "spawn_local" => Some("spawn_local".into()),
        "spawn_blocking" if is_punct(toks.get(i + 1), '(') => {
            let end = close_of(toks, i + 1);
            let awaited = is_punct(toks.get(end), '.') && is_ident(toks.get(end + 1), "await");
            (!awaited).then(|| "spawn_blocking not awaited in place".into())
        }
        _ => None,
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read ipamd/src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The directory a file's `mod name;` declarations live in.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().expect("a file in a directory");
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") => parent.to_owned(),
        Some(stem) => parent.join(stem),
        None => parent.to_owned(),
    }
}

/// Issue 42: none of ipamd's production code spawns detached work. A finding names the file
/// and line: give the work to the daemon's task set (a `Task` in `Daemon::serve`'s set, or
/// one of `ClusterTasks`), or drive it in place (`join!`/`select!`, an awaited `JoinSet`).
#[test]
fn ipamd_production_code_spawns_nothing_detached() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "ipamd/src not found: {}", src.display());
    let scans: Vec<(PathBuf, Scan)> = files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("read source");
            let s = scan(&text);
            (f, s)
        })
        .collect();
    // files of test-only modules (`#[cfg(test)] mod scenarios;`): `name.rs` or `name/..`
    let test_paths: BTreeSet<PathBuf> = scans
        .iter()
        .flat_map(|(f, s)| {
            let dir = module_dir(f);
            s.test_modules
                .iter()
                .flat_map(move |m| [dir.join(format!("{m}.rs")), dir.join(m)])
        })
        .collect();
    let mut scanned = 0;
    let mut found = Vec::new();
    for (f, s) in &scans {
        if s.test_only || test_paths.iter().any(|t| f.starts_with(t)) {
            continue;
        }
        scanned += 1;
        for (line, what) in &s.detached {
            let rel = f.strip_prefix(&src).unwrap_or(f);
            found.push(format!("ipamd/src/{}:{line}: {what}", rel.display()));
        }
    }
    assert!(scanned > 20, "every production file is scanned: {scanned}");
    assert!(
        found.is_empty(),
        "detached spawns in ipamd's production code (issue 42: every task belongs to a set \
         that its owner awaits): {found:#?}"
    );
}

/// The scan finds each detached form, and leaves owned or awaited ones, comments, strings,
/// and test-only code alone.
#[test]
fn the_scan_finds_the_spawns_it_exists_for() {
    let lines = |src: &str| -> Vec<usize> { scan(src).detached.iter().map(|(l, _)| *l).collect() };
    let detached = concat!(
        "fn a() {\n",
        "    tokio::spawn(async move { post(ev).await });\n",
        "    let h = tokio::task::spawn(work());\n",
        "    std::thread::spawn(move || loop {});\n",
        "    let _ = tokio::task::spawn_blocking(move || read());\n",
        "    tokio::task::spawn_local(x);\n",
        "    std::thread::Builder::new().spawn(f);\n",
        "}\n",
    );
    assert_eq!(lines(detached), [2, 3, 4, 5, 6, 7]);
    let owned = concat!(
        "// tokio::spawn(conn) was here\n",
        "/* thread::spawn /* nested */ tokio::spawn */\n",
        "fn b() -> &'static str {\n",
        "    let s = \"tokio::spawn(x)\";\n",
        "    let r = r#\"thread::spawn\"#;\n",
        "    let c = '\"'; let d = b'\\'';\n",
        "    tasks.spawn(async move { w.await });\n",
        "    let out = tokio::task::spawn_blocking(move || f(a, (b, c))).await?;\n",
        "    match tokio::task::spawn_blocking(read).await { _ => {} }\n",
        "    cmd.spawn()\n",
        "}\n",
        "#[cfg(test)]\n",
        "mod tests {\n",
        "    fn t() { tokio::spawn(async {}); }\n",
        "}\n",
        "#[cfg(test)]\n",
        "#[allow(dead_code)]\n",
        "fn helper() { std::thread::spawn(|| {}); }\n",
        "#[cfg(test)]\n",
        "mod scenarios;\n",
        "#[cfg(not(test))]\n",
        "fn prod() { tokio::spawn(async {}); }\n",
    );
    let s = scan(owned);
    assert_eq!(
        s.detached.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        [22],
        "{s:?}"
    );
    assert_eq!(s.test_modules, ["scenarios"]);
    assert!(scan("#![cfg(test)]\nfn x() { tokio::spawn(y); }\n").test_only);
    assert_eq!(
        module_dir(Path::new("/r/ipamd/src/aws/mod.rs")),
        Path::new("/r/ipamd/src/aws")
    );
    assert_eq!(
        module_dir(Path::new("/r/ipamd/src/host/iptables.rs")),
        Path::new("/r/ipamd/src/host/iptables")
    );
}
