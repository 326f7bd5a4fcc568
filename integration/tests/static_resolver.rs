//! ipamd ships linked statically against glibc (`scripts/build-static-ipamd.sh`), and it
//! resolves the EC2 and STS endpoints by name through `getaddrinfo` (hyper's `GaiResolver`,
//! Rust's `ToSocketAddrs`). Static glibc cannot load the `libnss_*.so` modules of a glibc it
//! was not built with; since glibc 2.34 the `files` and `dns` sources are built into libc
//! itself. This checks that a program built with the static build's flags resolves, under the
//! image's `/etc/nsswitch.conf` (Debian's default, `hosts: files dns`) and under one naming
//! modules that are absent (`myhostname`, `resolve`: looked for, skipped), both a name from
//! `/etc/hosts` and a name only DNS knows, from a `chroot` holding nothing but the program and
//! those three files (no libc, no NSS module to load): the answers come from a DNS stub on the
//! loopback of a throwaway network namespace. The control: the same program linked dynamically
//! cannot even start there. docs/performance.md, "Round 5", has the `strace` of the same
//! experiment. Must not: touch the root network namespace or anything outside a temp dir.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use integration::{TestNode, can_run_kernel_tests};

/// The flags of every static build (`scripts/static-build-env.sh`, which
/// `scripts/build-static-ipamd.sh` and the test command source), read from the script (so the
/// program here is linked as ipamd is).
fn static_flags() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/static-build-env.sh"
    );
    let script = std::fs::read_to_string(path).expect("read static-build-env.sh");
    let flags: Vec<String> = script
        .split_whitespace()
        .filter(|w| w.starts_with("-Ctarget-feature=") || w.starts_with("-Crelocation-model="))
        .map(str::to_owned)
        .collect();
    assert!(
        flags.iter().any(|f| f == "-Ctarget-feature=+crt-static"),
        "{path} does not link statically: {flags:?}"
    );
    flags
}

/// Resolves every argument as std (and hyper's `GaiResolver`) does; prints `name=addr,addr`.
const RESOLVE: &str = r#"
use std::net::ToSocketAddrs;
fn main() {
    let mut failed = false;
    for name in std::env::args().skip(1) {
        match (name.as_str(), 443).to_socket_addrs() {
            Ok(a) => println!("{name}={}", a.map(|a| a.ip().to_string()).collect::<Vec<_>>().join(",")),
            Err(e) => { println!("{name}=error {e}"); failed = true; }
        }
    }
    std::process::exit(i32::from(failed));
}
"#;

/// A DNS server on 127.0.0.1:53 answering every A query with 192.0.2.53, other types empty.
const DNS_STUB: &str = r#"
fn main() {
    let s = std::net::UdpSocket::bind("127.0.0.1:53").expect("bind 127.0.0.1:53");
    let mut q = [0u8; 512];
    loop {
        let Ok((n, peer)) = s.recv_from(&mut q) else { continue };
        let mut i = 12;
        while i < n && q[i] != 0 { i += usize::from(q[i]) + 1; }
        if i + 5 > n { continue; }
        let a = q[i + 1] == 0 && q[i + 2] == 1;
        let mut r = q[..2].to_vec();
        r.extend_from_slice(&[0x81, 0x80, 0, 1, 0, u8::from(a), 0, 0, 0, 0]);
        r.extend_from_slice(&q[12..i + 5]);
        if a {
            r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 53]);
        }
        let _ = s.send_to(&r, peer);
    }
}
"#;

fn rustc(src: &Path, out: &Path, flags: &[String]) {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let res = Command::new(rustc)
        .args(["--edition", "2021", "-O"])
        .args(flags)
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .expect("run rustc");
    assert!(
        res.status.success(),
        "rustc {}: {}",
        src.display(),
        String::from_utf8_lossy(&res.stderr)
    );
}

#[test]
fn static_glibc_resolves_hosts_and_dns_names_without_nss_modules() {
    if !can_run_kernel_tests() {
        return;
    }
    let work = tempfile::tempdir().expect("temp dir");
    let root = work.path().join("root");
    std::fs::create_dir_all(root.join("etc")).expect("mkdir");
    for (name, text) in [("resolve.rs", RESOLVE), ("dns_stub.rs", DNS_STUB)] {
        std::fs::write(work.path().join(name), text).expect("write source");
    }
    rustc(
        &work.path().join("resolve.rs"),
        &root.join("resolve"),
        &static_flags(),
    );
    rustc(
        &work.path().join("resolve.rs"),
        &root.join("resolve-dynamic"),
        &[],
    );
    rustc(
        &work.path().join("dns_stub.rs"),
        &work.path().join("dns-stub"),
        &[],
    );
    std::fs::write(
        root.join("etc/hosts"),
        "127.0.0.1 localhost\n198.51.100.7 in-hosts.example\n",
    )
    .expect("write hosts");
    std::fs::write(
        root.join("etc/resolv.conf"),
        "nameserver 127.0.0.1\noptions attempts:2 timeout:1\n",
    )
    .expect("write resolv.conf");

    let mut node = TestNode::new("resolver");
    node.ip(&["link", "set", "lo", "up"]);
    node.spawn(node.command(work.path().join("dns-stub")));
    // the stub is up once its socket is bound (`ss`, iproute2)
    let deadline = Instant::now() + Duration::from_secs(10);
    while !String::from_utf8_lossy(
        &node
            .command("ss")
            .args(["-Hlun", "sport = :53"])
            .output()
            .expect("run ss (iproute2)")
            .stdout,
    )
    .contains("127.0.0.1:53")
    {
        assert!(Instant::now() < deadline, "the DNS stub did not bind");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Debian's default (the image's debian:bookworm-slim), and one naming modules this root
    // does not have.
    for hosts in [
        "files dns",
        "files myhostname resolve [!UNAVAIL=return] dns",
    ] {
        std::fs::write(root.join("etc/nsswitch.conf"), format!("hosts: {hosts}\n"))
            .expect("write nsswitch.conf");
        let out = node
            .command("chroot")
            .arg(&root)
            .args(["/resolve", "in-hosts.example", "needs-dns.example"])
            .env_clear()
            // for finding `chroot`; the program needs nothing from the environment
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .expect("run chroot");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && stdout.contains("in-hosts.example=198.51.100.7")
                && stdout.contains("needs-dns.example=192.0.2.53"),
            "hosts: {hosts}: {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The control: in this root the dynamic build has no loader and no libc.
    let out = node
        .command("chroot")
        .arg(&root)
        .args(["/resolve-dynamic", "in-hosts.example"])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .expect("run chroot");
    assert!(
        !out.status.success(),
        "the dynamic build ran without a libc: the chroot proves nothing"
    );
}
