//! Reading, never writing, the kernel settings ipamd's host networking depends on but does not own:
//! reverse-path filtering of the primary interface and IPv6 on ENI links. The chart runs the
//! aws-node container unprivileged (NET_ADMIN, NET_RAW), where the container runtime mounts the
//! sysctl tree read-only; the privileged init container `aws-vpc-cni-init`
//! (charts/aws-vpc-cni/files/aws-vpc-cni-init.sh) sets these values (docs/host-networking.md,
//! "Privileges"). Owns the read seam ([`SysctlRead`]) and the guard test that keeps ipamd's sources
//! free of sysctl and sysfs writes. Must not: write a kernel setting (the seam has no write
//! operation), or read outside the namespace it was built for.

use std::fmt;

use dataplane::{NetNs, SysctlError};

/// Reads a kernel setting (key relative to the sysctl tree, e.g.
/// `net/ipv4/conf/eth0/rp_filter`) of one network namespace. Blocking: call from a blocking
/// thread. There is deliberately no write operation.
pub trait SysctlRead: fmt::Debug + Send + Sync {
    /// The setting's value, trimmed.
    fn read(&self, key: &str) -> Result<String, SysctlError>;
}

/// A namespace handle reads its own settings (on a helper thread that entered it when it is
/// not the caller's namespace).
impl SysctlRead for NetNs {
    fn read(&self, key: &str) -> Result<String, SysctlError> {
        self.read_sysctl(key)
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// What ipamd's code must never contain: the sysctl tree's path (every write under it,
    /// direct or through a shell), the `sysctl` program, the dataplane's write helpers, sysfs
    /// paths and module loading. Spelled in pieces so this file does not match itself.
    const FORBIDDEN: [&str; 6] = [
        concat!("/proc", "/sys"),
        concat!("\"sys", "ctl\""),
        concat!("\"sys", "ctl "),
        concat!("write_sys", "ctl"),
        concat!("\"/sys", "/"),
        concat!("mod", "probe"),
    ];

    /// `(line number, line)` of every non-comment line of `text` holding a forbidden string.
    fn offending_lines(text: &str) -> Vec<(usize, String)> {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with("//"))
            .filter(|(_, l)| FORBIDDEN.iter().any(|f| l.contains(f)))
            .map(|(i, l)| (i + 1, l.trim().to_owned()))
            .collect()
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

    /// Issue 37 item 3: ipamd crash-looped on every real node because it wrote `rp_filter`
    /// (and, dual-stack, `disable_ipv6`) where its container's sysctl tree is read-only. The
    /// init container sets them; ipamd only reads. Any write brought back fails here, naming
    /// the file and line.
    #[test]
    fn ipamd_sources_write_no_sysctl_or_sysfs() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        assert!(files.len() > 20, "ipamd/src not found: {}", src.display());
        let found: Vec<String> = files
            .iter()
            .flat_map(|f| {
                let text = std::fs::read_to_string(f).expect("read source");
                offending_lines(&text)
                    .into_iter()
                    .map(move |(n, l)| format!("{}:{n}: {l}", f.display()))
            })
            .collect();
        assert!(
            found.is_empty(),
            "ipamd must not write kernel settings (the aws-node container's sysctl tree is \
             read-only; the privileged init container aws-vpc-cni-init sets them, \
             docs/host-networking.md): {found:#?}"
        );
    }

    /// The scan sees the shapes the old code had (and their shell spelling), and leaves
    /// comments and the read seam alone.
    #[test]
    fn the_scan_finds_the_writes_it_exists_for() {
        let old = concat!(
            "let key = format!(\"net/ipv4/conf/{primary_interface}/rp_filter=2\");\n",
            "self.blocking(move || runner.run(\"sys",
            "ctl\", &[\"-q\", \"-w\", &key], None))\n"
        );
        assert_eq!(offending_lines(old).len(), 1, "{old}");
        let shell = concat!(
            "runner.run(\"sh\", &[\"-c\", \"echo 2 > /pr",
            "oc/sys/net/x\"])"
        );
        assert_eq!(offending_lines(shell).len(), 1);
        let direct = concat!("ns.write_", "sysctls(&entries)?;");
        assert_eq!(offending_lines(direct).len(), 1);
        let sysfs = concat!("std::fs::write(\"/sys", "/class/net/eth0/mtu\", b\"9001\")");
        assert_eq!(offending_lines(sysfs).len(), 1);
        let fine = concat!(
            "// the init container writes /proc",
            "/sys\nlet v = self.sysctls.read(\"net/ipv4/conf/eth0/rp_filter\")?;\n"
        );
        assert!(offending_lines(fine).is_empty());
    }
}
