//! Finds the workspace's built binaries (`ipamd`, `aws-cni`, `test-ipamd`, ...) next to the
//! running test or driver: the one lookup behind [`built_binary`], the simulated VPC's
//! [`crate::sim::Bins`] and the upstream-node fixture's builds.

use std::path::PathBuf;

/// Path of the binary `name` in the target directory the running executable was built into
/// (`target/<profile>/deps/<test>` -> `target/<profile>/<name>`), or the path it was looked for
/// at when it does not exist.
pub fn find_built(name: &str) -> Result<PathBuf, PathBuf> {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if path.exists() { Ok(path) } else { Err(path) }
}

/// Path of the binary `name` in the target directory the running test was built into.
/// Panics with a hint when it has not been built (`cargo test --workspace` builds both).
#[must_use]
pub fn built_binary(name: &str) -> PathBuf {
    find_built(name).unwrap_or_else(|path| {
        panic!(
            "{} not built; run `cargo test --workspace --no-run` first",
            path.display()
        )
    })
}
