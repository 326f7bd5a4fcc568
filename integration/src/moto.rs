//! moto's server (PyPI `moto[server]`, installed by integration/test.sh) as a child process on a
//! free loopback port: the third-party EC2/CloudWatch implementation the tests cross-check
//! against. Owns only that child; kills it (by its own handle) on drop, also on panic.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `moto_server` on `127.0.0.1`.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its port.
    pub port: u16,
}

impl MotoServer {
    /// Starts `moto_server` and waits (up to 30 s) until it accepts connections.
    ///
    /// # Errors
    /// When `moto_server` is not on PATH, exits, or does not listen in time.
    pub fn start() -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("moto_server could not be started ({e}); integration/test.sh installs moto[server]")
            })?;
        let mut moto = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(moto);
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!("moto_server exited before listening: {status}"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "moto_server did not listen on port {port} within 30 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
