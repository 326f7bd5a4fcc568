//! Network helpers of the harness that need no `Sim`: namespaces, ping (one, or a continuous
//! [`PingStream`]), TCP echo servers and clients inside namespaces, waiting, and removing crashed
//! runs' leftovers. Must not touch the
//! root network namespace or processes this process did not start.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::RUN_ROOT;

/// Kill ipamd processes and remove directories of runs that are no longer alive (the shared
/// [`crate::supervisor::remove_stale_runs`] over [`RUN_ROOT`]; a run is live while its fabric's
/// owner runs).
pub fn remove_stale_runs() {
    crate::supervisor::remove_stale_runs(std::path::Path::new(RUN_ROOT), |run| {
        vpcsim::fabric::netns::run_is_live(run)
    });
}

/// Run `f` on a fresh thread inside network namespace `ns` (never on a tokio worker).
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, String> {
    vpcsim::fabric::netns::in_netns(ns, f).map_err(|e| e.to_string())
}

/// A TCP echo server inside a namespace, served by a thread until dropped.
#[derive(Debug)]
pub struct EchoServer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    /// Listen on `0.0.0.0:port` inside `ns`.
    pub fn start(ns: &str, port: u16) -> Result<Self, String> {
        Self::start_at(ns, SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
    }

    /// Listen on `at` inside `ns` (`[::]:port` for IPv6).
    pub fn start_at(ns: &str, at: SocketAddr) -> Result<Self, String> {
        let listener = in_netns(ns, move || {
            let l = std::net::TcpListener::bind(at)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut buf = [0u8; 512];
                        if let Ok(n) = conn.read(&mut buf) {
                            let _ = conn.write_all(&buf[..n]);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connect from inside `ns` to `to`, send a line, expect it echoed back.
pub fn tcp_echo(ns: &str, to: SocketAddr) -> Result<(), String> {
    let msg = format!("hello from {ns}\n");
    let sent = msg.clone();
    let got = in_netns(ns, move || {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(sent.as_bytes())?;
        let mut buf = vec![0u8; sent.len()];
        s.read_exact(&mut buf)?;
        Ok(buf)
    })?;
    if got == msg.as_bytes() {
        Ok(())
    } else {
        Err(format!(
            "echo mismatch: {:?}",
            String::from_utf8_lossy(&got)
        ))
    }
}

/// `ip netns exec <ns> <args>`.
#[must_use]
pub fn exec_in(ns: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| Output {
            status: std::os::unix::process::ExitStatusExt::from_raw(127 << 8),
            stdout: Vec::new(),
            stderr: e.to_string().into_bytes(),
        })
}

/// One ping (busybox, 2 s) from inside `ns` to `to`.
pub fn ping(ns: &str, to: Ipv4Addr) -> Result<(), String> {
    ping_any(ns, IpAddr::V4(to))
}

/// One ping6 (busybox, 2 s) from inside `ns` to `to`.
pub fn ping6(ns: &str, to: Ipv6Addr) -> Result<(), String> {
    ping_any(ns, IpAddr::V6(to))
}

fn ping_any(ns: &str, to: IpAddr) -> Result<(), String> {
    let fam = if to.is_ipv6() { "-6" } else { "-4" };
    let out = exec_in(
        ns,
        &[
            "busybox",
            "ping",
            fam,
            "-c",
            "1",
            "-W",
            "2",
            &to.to_string(),
        ],
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ping {to} from {ns}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Retry `f` until it succeeds or `timeout` passes; the last error on timeout.
pub fn eventually<T>(
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// A continuous ping (busybox, every 50 ms) from one namespace to an address.
#[derive(Debug)]
pub struct PingStream {
    child: Option<Child>,
    what: String,
}

/// Counts of a stopped [`PingStream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingCount {
    /// Echo requests sent.
    pub sent: u64,
    /// Replies received.
    pub received: u64,
}

impl PingCount {
    /// Requests without a reply.
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }
}

impl PingStream {
    /// Start pinging `to` from `ns` every 50 ms.
    pub fn start(ns: &str, to: Ipv4Addr) -> Result<Self, String> {
        let child = Command::new("ip")
            .args([
                "netns", "exec", ns, "busybox", "ping", "-q", "-i", "0.05", "-W", "1",
            ])
            .arg(to.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("ping: {e}"))?;
        Ok(Self {
            child: Some(child),
            what: format!("{ns} -> {to}"),
        })
    }

    /// What it pings (for messages).
    #[must_use]
    pub fn what(&self) -> &str {
        &self.what
    }

    /// SIGINT (busybox prints its statistics), then the counts; the last request may still
    /// be in flight, so one lost reply is within the measurement's error.
    pub fn stop(mut self) -> Result<PingCount, String> {
        let child = self.child.take().ok_or("stopped")?;
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGINT,
            );
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .ok_or_else(|| format!("{}: no statistics: {text}", self.what))?;
        let nums: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|s| s.parse().ok())
            .collect();
        match nums.as_slice() {
            [sent, received, ..] => Ok(PingCount {
                sent: *sent,
                received: *received,
            }),
            _ => Err(format!("{}: {line}", self.what)),
        }
    }
}

impl Drop for PingStream {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
