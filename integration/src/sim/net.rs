//! Network helpers of the harness that need no `Sim`: namespaces, ping (one, or a continuous
//! [`PingStream`]), TCP echo servers and clients inside namespaces, waiting, and removing crashed
//! runs' leftovers. Must not touch the
//! root network namespace or processes this process did not start.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Output, Stdio};
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

/// One TCP connection attempt of a [`TcpProbe`].
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// When the SYN went out.
    pub started: Instant,
    /// Whether the connection was accepted within the probe's timeout.
    pub connected: bool,
}

/// TCP connection attempts in a tight loop from inside a namespace, each recorded with its
/// start time and outcome, from before an event until after it (e.g. "no packet passes once
/// ADD has returned"). The destination comes from `target`, asked before every attempt (the
/// address may not exist yet). Runs on its own thread until [`TcpProbe::stop`].
#[derive(Debug)]
pub struct TcpProbe {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<Vec<Attempt>, String>>>,
}

impl TcpProbe {
    /// Start probing from `ns`; each attempt waits up to `timeout` for the handshake.
    pub fn start(
        ns: &str,
        target: impl Fn() -> Option<SocketAddr> + Send + 'static,
        timeout: Duration,
    ) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let ns = ns.to_owned();
        let thread = std::thread::spawn(move || {
            in_netns(&ns, move || {
                let mut attempts = Vec::new();
                while !s.load(std::sync::atomic::Ordering::SeqCst) {
                    let Some(to) = target() else {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    };
                    let started = Instant::now();
                    let connected = TcpStream::connect_timeout(&to, timeout).is_ok();
                    attempts.push(Attempt { started, connected });
                    if connected {
                        // Paced: the listener is one thread with a small accept backlog; a
                        // flood of handshakes would overflow it and read as drops.
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                Ok(attempts)
            })
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop and return every attempt, oldest first.
    pub fn stop(mut self) -> Result<Vec<Attempt>, String> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.take().map_or(Ok(Vec::new()), |t| {
            t.join().map_err(|_| "probe thread panicked".to_owned())?
        })
    }
}

impl Drop for TcpProbe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Watches namespace `ns` from a thread until interface `ifname` has an IPv4 address, then
/// publishes it (cleared never); for probes that must start before the address exists.
#[derive(Debug, Clone, Default)]
pub struct AddressWatch(Arc<std::sync::Mutex<Option<Ipv4Addr>>>);

impl AddressWatch {
    /// Start watching (polls every millisecond, gives up after `limit`).
    pub fn start(ns: &str, ifname: &str, limit: Duration) -> Self {
        let watch = Self::default();
        let out = watch.0.clone();
        let (ns, ifname) = (ns.to_owned(), ifname.to_owned());
        std::thread::spawn(move || {
            let _ = in_netns(&ns, move || {
                let deadline = Instant::now() + limit;
                while Instant::now() < deadline {
                    let found = nix::ifaddrs::getifaddrs()
                        .map_err(std::io::Error::from)?
                        .filter(|a| a.interface_name == ifname)
                        .find_map(|a| a.address?.as_sockaddr_in().map(|s| s.ip()));
                    if let Some(ip) = found {
                        *out.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(ip);
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            });
        });
        watch
    }

    /// The address, once seen.
    #[must_use]
    pub fn get(&self) -> Option<Ipv4Addr> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// `<args>` inside `ns`, as `ip netns exec <ns> <args>` runs them (`supervisor::netns_exec`).
#[must_use]
pub fn exec_in(ns: &str, args: &[&str]) -> Output {
    let Some((program, args)) = args.split_first() else {
        return Output {
            status: std::os::unix::process::ExitStatusExt::from_raw(127 << 8),
            stdout: Vec::new(),
            stderr: b"exec_in: no program".to_vec(),
        };
    };
    crate::supervisor::netns_exec(ns, program)
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
        let child = crate::supervisor::netns_exec(ns, "busybox")
            .args(["ping", "-q", "-i", "0.05", "-W", "1"])
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
