//! A minimal HTTP/1.0 client for the control API on loopback (JSON in, JSON out). Must not be
//! used for anything but the simulator's own endpoints.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A control-API call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connect/read/write.
    #[error("{addr}: {source}")]
    Io {
        /// endpoint
        addr: SocketAddr,
        /// cause
        source: std::io::Error,
    },
    /// Not an HTTP answer.
    #[error("{addr}: malformed http answer")]
    Malformed {
        /// endpoint
        addr: SocketAddr,
    },
    /// A non-2xx answer.
    #[error("{method} {path}: http {status}: {body}")]
    Status {
        /// method
        method: String,
        /// path
        path: String,
        /// status code
        status: u16,
        /// answer body
        body: String,
    },
}

/// `method path` with an optional JSON body; returns the body of a 2xx answer.
pub fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> Result<String, ClientError> {
    let io = |source| ClientError::Io { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(io)?;
    let body = json.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or(ClientError::Malformed { addr })?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(ClientError::Malformed { addr })?;
    if (200..300).contains(&status) {
        Ok(body.to_owned())
    } else {
        Err(ClientError::Status {
            method: method.into(),
            path: path.into(),
            status,
            body: body.to_owned(),
        })
    }
}
