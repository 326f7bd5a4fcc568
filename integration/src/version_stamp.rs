//! Re-stamping a copy of a built binary with another build version (`ipamd_proto`'s version
//! stamp), so the rolling-update test has "two builds" from one compilation. Owns only the byte
//! rewrite of a copy; must not touch the original binary.

use std::path::Path;

use ipamd_proto::{VERSION_STAMP_CAPACITY, VERSION_STAMP_MARKER};

/// Why a binary could not be re-stamped.
#[derive(Debug, thiserror::Error)]
pub enum RestampError {
    /// Reading or writing a file.
    #[error("{path}: {source}")]
    Io {
        /// the file
        path: String,
        /// cause
        source: std::io::Error,
    },
    /// The stamp must occur exactly once.
    #[error("{path}: version stamp found {found} times (expected once)")]
    Stamp {
        /// the file
        path: String,
        /// occurrences
        found: usize,
    },
    /// The new version does not fit.
    #[error("version {0:?} longer than the stamp allows")]
    TooLong(String),
}

/// Rewrite the version after the stamp marker in `bytes` (pure).
pub fn restamp_bytes(bytes: &mut [u8], version: &str) -> Result<(), usize> {
    let m = VERSION_STAMP_MARKER.as_slice();
    let hits: Vec<usize> = bytes
        .windows(m.len())
        .enumerate()
        .filter_map(|(i, w)| (w == m).then_some(i))
        .collect();
    let [at] = hits.as_slice() else {
        return Err(hits.len());
    };
    let field = &mut bytes[at + m.len()..at + m.len() + VERSION_STAMP_CAPACITY];
    field.fill(0);
    field[..version.len()].copy_from_slice(version.as_bytes());
    Ok(())
}

/// Copy `src` to `dst` (mode kept) with its build version replaced by `version`.
pub fn restamp(src: &Path, dst: &Path, version: &str) -> Result<(), RestampError> {
    if version.len() >= VERSION_STAMP_CAPACITY {
        return Err(RestampError::TooLong(version.to_owned()));
    }
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| RestampError::Io { path, source }
    };
    let mut bytes = std::fs::read(src).map_err(io(src))?;
    restamp_bytes(&mut bytes, version).map_err(|found| RestampError::Stamp {
        path: src.display().to_string(),
        found,
    })?;
    let tmp = dst.with_extension("restamp-tmp");
    write_in_child(&tmp, &bytes).map_err(io(&tmp))?;
    let perm = std::fs::metadata(src).map_err(io(src))?.permissions();
    std::fs::set_permissions(&tmp, perm).map_err(io(&tmp))?;
    // rename: a plugin being exec'd while it is replaced sees the old or the new file
    std::fs::rename(&tmp, dst).map_err(io(dst))
}

/// Writes `bytes` to `path` through a child process (`tee`), so this process never holds the
/// file open for writing: a test that forks from another thread meanwhile would hand its child
/// a copy of that descriptor until the child execs, and executing the copy then fails with
/// "Text file busy" (ETXTBSY) for as long as any such child has not exec'd yet.
fn write_in_child(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("tee")
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()?;
    let written = child
        .stdin
        .take()
        .map_or(Ok(()), |mut stdin| stdin.write_all(bytes));
    let status = child.wait()?;
    written?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "tee {}: {status}",
            path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restamps_exactly_the_version_field() {
        let mut bin = b"head".to_vec();
        bin.extend_from_slice(VERSION_STAMP_MARKER);
        let mut field = [0u8; VERSION_STAMP_CAPACITY];
        field[..5].copy_from_slice(b"0.1.0");
        bin.extend_from_slice(&field);
        bin.extend_from_slice(b"tail");
        restamp_bytes(&mut bin, "0.2.0-next").unwrap();
        let at = 4 + VERSION_STAMP_MARKER.len();
        assert_eq!(&bin[at..at + 11], b"0.2.0-next\0");
        assert!(bin.ends_with(b"tail"));
        assert_eq!(
            bin.len(),
            4 + VERSION_STAMP_MARKER.len() + VERSION_STAMP_CAPACITY + 4
        );
    }

    #[test]
    fn refuses_a_binary_without_or_with_two_stamps() {
        assert_eq!(restamp_bytes(&mut b"nothing".to_vec(), "x"), Err(0));
        let mut two = VERSION_STAMP_MARKER.repeat(2);
        two.extend_from_slice(&[0u8; VERSION_STAMP_CAPACITY]);
        assert_eq!(restamp_bytes(&mut two, "x"), Err(2));
    }
}
