//! The code layout lists cannot go stale silently (docs/performance.md, "Code layout"):
//! `ipamd/code-order.txt` and `cni-plugin/code-order.txt` name functions by key (demangled
//! path without hashes, `scripts/code-layout.sh`); the workspace's linker translates a list into
//! the symbols of every optimised build. These tests fail when fewer than 90% of a list's
//! functions still exist in the binaries built from the current sources (renamed or removed
//! code, a dependency or toolchain update that changed what runs): refresh the lists with
//! `sudo scripts/code-order.sh`. The debug binaries `cargo test --workspace` built are read:
//! they define every function the release build may keep out of line, under the same keys (the
//! workspace mangles with v0 in every profile), so a listed function missing from them is gone
//! from the sources (a C function of the static build's libc is looked for in `libc.a`). And
//! the translation itself is checked: the linker's mapping of a list over
//! a built binary names real symbols, in the list's order.

#[cfg(test)]
mod lists {
    use std::path::Path;
    use std::process::Command;

    use integration::binaries::built_binary;

    const MIN_SHARE: f64 = 0.90;

    fn workspace() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root")
    }

    fn layout(args: &[&str]) -> String {
        let out = Command::new(workspace().join("scripts/code-layout.sh"))
            .args(args)
            .output()
            .expect("run scripts/code-layout.sh (needs nm and c++filt: binutils)");
        assert!(
            out.status.success(),
            "code-layout.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `(found, listed)` of `list` in `binaries`.
    fn found(list: &Path, binaries: &[std::path::PathBuf]) -> (usize, usize) {
        let mut args = vec!["count".to_owned(), list.to_string_lossy().into_owned()];
        args.extend(binaries.iter().map(|p| p.to_string_lossy().into_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = layout(&args);
        let mut words = out.split_whitespace();
        let have = words.next().and_then(|n| n.parse().ok()).expect("N of M");
        let all = words.nth(1).and_then(|n| n.parse().ok()).expect("N of M");
        (have, all)
    }

    /// The static glibc the image's ipamd links (`cc -print-file-name=libc.a`): the list names
    /// the libc functions the profile saw running in that build by their C names, and the debug
    /// binaries read here are dynamic.
    fn static_libc() -> std::path::PathBuf {
        let out = Command::new("cc")
            .arg("-print-file-name=libc.a")
            .output()
            .expect("cc");
        let path = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(path.is_file(), "no libc.a ({}): libc6-dev", path.display());
        path
    }

    fn assert_fresh(list: &str, binaries: &[&str], also: &[std::path::PathBuf]) {
        let list = workspace().join(list);
        let mut paths: Vec<_> = binaries.iter().map(|b| built_binary(b)).collect();
        paths.extend(also.iter().cloned());
        let (have, all) = found(&list, &paths);
        assert!(all > 100, "{} lists only {all} functions", list.display());
        #[allow(clippy::cast_precision_loss)]
        let share = have as f64 / all as f64;
        assert!(
            share >= MIN_SHARE,
            "{}: only {have} of {all} listed functions ({:.0}%) exist in {binaries:?} built from these \
             sources: the code layout is stale; refresh it with `sudo scripts/code-order.sh` \
             (docs/performance.md, \"Code layout\")",
            list.display(),
            share * 100.0
        );
    }

    #[test]
    fn ipamd_layout_names_functions_ipamd_still_has() {
        assert_fresh("ipamd/code-order.txt", &["ipamd"], &[static_libc()]);
    }

    #[test]
    fn the_plugin_layout_names_functions_aws_cni_still_has() {
        assert_fresh("cni-plugin/code-order.txt", &["aws-cni"], &[]);
    }

    /// The linker's translation: keys in, this binary's symbols out, in the list's order; a key
    /// the binary lacks is skipped, a made-up one never matches.
    #[test]
    fn the_linker_translates_a_list_into_symbols_of_the_link() {
        let binary = built_binary("ipamd");
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("code-order.txt");
        std::fs::write(
            &list,
            "ipamd::main\nno::such::function\n<ipamd::flows::ledger::Ledger>::named\n",
        )
        .unwrap();
        let order = layout(&["map", &list.to_string_lossy(), &binary.to_string_lossy()]);
        let symbols: Vec<&str> = order.lines().collect();
        assert_eq!(symbols.len(), 2, "two of the three keys exist: {symbols:?}");
        let keys = layout(&["key", symbols[0], symbols[1]]);
        assert_eq!(
            keys.lines().collect::<Vec<_>>(),
            ["ipamd::main", "<ipamd::flows::ledger::Ledger>::named"],
            "the symbols of the listed keys, in the list's order"
        );
        assert!(
            symbols.iter().all(|s| s.starts_with("_R")),
            "v0 symbols: {symbols:?}"
        );
        let (have, all) = found(&list, &[binary]);
        assert_eq!((have, all), (2, 3));
    }
}
