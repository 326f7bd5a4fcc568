//! `aws-cni-conflist TEMPLATE OUT`: fills in the conflist template from this process's
//! environment (`aws_cni::conflist`) and installs it at OUT atomically (a temporary file in the
//! same directory, then rename), mode 0644. Run by the aws-node container once ipamd is
//! healthy (charts/aws-vpc-cni/files/aws-node.sh). Writes only stderr; exit 1 on failure.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn install(template: &Path, out: &Path, vars: &HashMap<String, String>) -> Result<(), String> {
    let text = std::fs::read_to_string(template)
        .map_err(|e| format!("read {}: {e}", template.display()))?;
    let filled = aws_cni::conflist::fill(&text, vars).map_err(|e| {
        let mut msg = e.to_string();
        let mut cur = std::error::Error::source(&e);
        while let Some(s) = cur {
            msg.push_str(&format!(": {s}"));
            cur = s.source();
        }
        msg
    })?;
    for w in &filled.warnings {
        eprintln!("aws-cni-conflist: WARNING: {w}");
    }
    let dir = out.parent().unwrap_or(Path::new("."));
    let name = out
        .file_name()
        .ok_or_else(|| format!("{} names no file", out.display()))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(filled.text.as_bytes())?;
        f.sync_all()?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, out)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("install {}: {e}", out.display())
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = match args.as_slice() {
        [_, template, out] => {
            let vars = std::env::vars().collect();
            match install(Path::new(template), Path::new(out), &vars) {
                Ok(()) => {
                    eprintln!("aws-cni-conflist: installed {out}");
                    0
                }
                Err(e) => {
                    eprintln!("aws-cni-conflist: {e}");
                    1
                }
            }
        }
        _ => {
            eprintln!("usage: aws-cni-conflist TEMPLATE OUT");
            2
        }
    };
    #[allow(clippy::exit)]
    std::process::exit(code);
}
