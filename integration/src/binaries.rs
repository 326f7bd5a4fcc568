//! Finds the workspace's built binaries (`aws-cni`, `test-ipamd`) next to the running test.

use std::path::PathBuf;

/// Path of the binary `name` in the target directory the running test was built into.
/// Panics with a hint when it has not been built (`cargo test --workspace` builds both).
#[must_use]
pub fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(|deps| {
            if deps.ends_with("deps") {
                deps.parent()
            } else {
                Some(deps)
            }
        })
        .expect("profile dir")
        .to_path_buf();
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} not built; run `cargo test --workspace` (or `cargo build -p aws-cni -p integration`)",
        path.display()
    );
    path
}
