//! `aws-cni-conflist TEMPLATE OUT`: fills in the conflist template from this process's
//! environment (`aws_cni::conflist`) and installs it at OUT atomically (a temporary file in the
//! same directory, then rename), mode 0644. Run by the aws-node container once ipamd is
//! healthy (charts/aws-vpc-cni/files/aws-node.sh). The node's primary addresses (egress-cni's
//! `nodeIP`) come from IMDS (`local-ipv4` / `ipv6`, IMDSv2 then v1) at
//! `AWS_EC2_METADATA_SERVICE_ENDPOINT` (default `http://169.254.169.254`), only when the
//! conflist needs one. Writes only stderr; exit 1 on failure.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aws_cni::conflist::{ConflistError, NodeIpFamily};

const IMDS_TIMEOUT: Duration = Duration::from_secs(2);
const IMDS_ATTEMPTS: usize = 3;

/// A failed IMDS request: the transport step that failed (its I/O error the `source`), or
/// what IMDS answered.
#[derive(Debug, thiserror::Error)]
enum ImdsError {
    /// The endpoint's authority does not resolve.
    #[error("resolve {authority}")]
    Resolve {
        /// `host:port`.
        authority: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The endpoint's authority resolves to nothing.
    #[error("resolve {0}: no address")]
    NoAddress(String),
    /// The TCP connection failed.
    #[error("connect {authority}")]
    Connect {
        /// `host:port`.
        authority: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Sending the request failed.
    #[error("write {authority}")]
    Write {
        /// `host:port`.
        authority: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Reading the response failed.
    #[error("read {authority}")]
    Read {
        /// `host:port`.
        authority: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The response has no HTTP status line.
    #[error("bad response from {0}")]
    BadResponse(String),
    /// The metadata key holds something that is not an address.
    #[error("imds {key}: not an address: {body:?}")]
    NotAnAddress {
        /// `local-ipv4` or `ipv6`.
        key: &'static str,
        /// What IMDS answered.
        body: String,
    },
    /// The node has no such address (HTTP 404).
    #[error("imds {0}: not found")]
    NotFound(&'static str),
    /// Any other HTTP status.
    #[error("imds {key}: HTTP {status}")]
    Http {
        /// `local-ipv4` or `ipv6`.
        key: &'static str,
        /// The status code.
        status: u16,
    },
}

/// Why no conflist was installed (exit code 1).
#[derive(Debug, thiserror::Error)]
enum InstallError {
    /// The template cannot be read.
    #[error("read {}", path.display())]
    ReadTemplate {
        /// The template's path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The template cannot be filled in.
    #[error(transparent)]
    Fill(#[from] ConflistError),
    /// OUT is no file path.
    #[error("{} names no file", .0.display())]
    NoFileName(PathBuf),
    /// Writing, or renaming into place, failed.
    #[error("install {}", path.display())]
    Write {
        /// OUT.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The error as the installer prints it: its message, then each `source`'s, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        msg.push_str(&format!(": {s}"));
        cur = s.source();
    }
    msg
}

/// One HTTP/1.1 request to IMDS (`Connection: close`); the status and body.
fn imds_request(
    authority: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String), ImdsError> {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .map_err(|source| ImdsError::Resolve {
            authority: authority.to_owned(),
            source,
        })?
        .next()
        .ok_or_else(|| ImdsError::NoAddress(authority.to_owned()))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, IMDS_TIMEOUT).map_err(|source| ImdsError::Connect {
            authority: authority.to_owned(),
            source,
        })?;
    let _ = stream.set_read_timeout(Some(IMDS_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IMDS_TIMEOUT));
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    stream
        .write_all(req.as_bytes())
        .map_err(|source| ImdsError::Write {
            authority: authority.to_owned(),
            source,
        })?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|source| ImdsError::Read {
            authority: authority.to_owned(),
            source,
        })?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ImdsError::BadResponse(authority.to_owned()))?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The node's primary IP: IMDS `local-ipv4` or `ipv6` (the first line), IMDSv2 then v1,
/// [`IMDS_ATTEMPTS`] times 200 ms apart (a 404 ends it at once).
fn primary_ip(vars: &HashMap<String, String>, family: NodeIpFamily) -> Result<String, ImdsError> {
    let endpoint = vars
        .get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .map_or("http://169.254.169.254", String::as_str);
    let authority = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let authority = if authority.contains(':') && !authority.ends_with(']') {
        authority
    } else {
        format!("{authority}:80")
    };
    let key = match family {
        NodeIpFamily::V4 => "local-ipv4",
        NodeIpFamily::V6 => "ipv6",
    };
    let mut attempt = 1;
    loop {
        let token = imds_request(
            &authority,
            "PUT",
            "/latest/api/token",
            &[("X-aws-ec2-metadata-token-ttl-seconds", "60")],
        )
        .ok()
        .filter(|(status, _)| *status == 200)
        .map(|(_, t)| t.trim().to_owned());
        let headers: Vec<(&str, &str)> = token
            .as_deref()
            .map(|t| vec![("X-aws-ec2-metadata-token", t)])
            .unwrap_or_default();
        let last = match imds_request(
            &authority,
            "GET",
            &format!("/latest/meta-data/{key}"),
            &headers,
        ) {
            Ok((200, body)) => {
                let ip = body.lines().next().unwrap_or("").trim().to_owned();
                if ip.parse::<std::net::IpAddr>().is_ok() {
                    return Ok(ip);
                }
                ImdsError::NotAnAddress { key, body }
            }
            // Not found: the node has no such address; asking again does not help.
            Ok((404, _)) => return Err(ImdsError::NotFound(key)),
            Ok((status, _)) => ImdsError::Http { key, status },
            Err(e) => e,
        };
        std::thread::sleep(Duration::from_millis(200));
        if attempt == IMDS_ATTEMPTS {
            return Err(last);
        }
        attempt += 1;
    }
}

fn install(
    template: &Path,
    out: &Path,
    vars: &HashMap<String, String>,
) -> Result<(), InstallError> {
    let text = std::fs::read_to_string(template).map_err(|source| InstallError::ReadTemplate {
        path: template.to_path_buf(),
        source,
    })?;
    let filled = aws_cni::conflist::fill(&text, vars, &|f| primary_ip(vars, f))?;
    for w in &filled.warnings {
        eprintln!("aws-cni-conflist: WARNING: {w}");
    }
    let dir = out.parent().unwrap_or(Path::new("."));
    let name = out
        .file_name()
        .ok_or_else(|| InstallError::NoFileName(out.to_path_buf()))?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(filled.text.as_bytes())?;
        f.sync_all()?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&tmp, out)
    };
    write().map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        InstallError::Write {
            path: out.to_path_buf(),
            source,
        }
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
                    eprintln!("aws-cni-conflist: {}", error_chain(&e));
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
