//! The container image, built from the repository's `Dockerfile` by a real engine (podman 4 /
//! buildah from Debian) and run for real against a simulated node: the init container installs
//! the plugins into a mounted host CNI bin dir and sets its sysctl in the node's netns; the
//! aws-node container (the chart's command and environment, rendered by real Helm) starts ipamd
//! in the node's netns (`--network ns:`), installs `10-aws.conflist` only once ipamd is healthy,
//! answers the chart's probes (`podman exec`), a pod wired by the installed plugin reaches the
//! node, and SIGTERM stops it cleanly.
//!
//! Offline: registry images cannot be pulled, so `debian:bookworm-slim` is bootstrapped from
//! Debian's packages (debootstrap, cached as a tarball under [`CACHE_DIR`]) and imported under
//! its registry name; the Dockerfile's `BINARIES=prebuilt` feeds it the binaries this test was
//! built with, so the workspace is not compiled twice. Everything podman stores lives in a
//! private storage root under a temp dir, removed afterwards (also on failure); the machine's
//! root netns is never touched (`--network host` only for the build's `apt-get`, which creates
//! no links; containers run with `--network ns:<node netns>`).
#![allow(clippy::tests_outside_test_module)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use integration::{CniCall, TestNode, built_binary, can_run_kernel_tests, cni::run_plugin};

/// Where the bootstrapped Debian rootfs tarball is kept across runs.
const CACHE_DIR: &str = "/var/tmp/aws-vpc-cni-rs-image-cache";
const BASE: &str = "docker.io/library/debian:bookworm-slim";
const IMAGE: &str = "localhost/aws-vpc-cni-rs:image-test";
const METRICS_HELPER_IMAGE: &str = "localhost/cni-metrics-helper-rs:image-test";
const BINARIES: [&str; 6] = [
    "ipamd",
    "aws-cni",
    "egress-cni",
    "aws-cni-conflist",
    "grpc-health-probe",
    "cni-metrics-helper",
];

/// Apt sources as the registry's `debian:bookworm-slim` has them (debootstrap writes only
/// `bookworm main`).
const DEBIAN_SOURCES: &str = "Types: deb\nURIs: http://deb.debian.org/debian\n\
Suites: bookworm bookworm-updates\nComponents: main\n\
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\
Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";

/// A podman with private storage; its containers and images are removed on drop.
struct Engine {
    dir: tempfile::TempDir,
}

impl Engine {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("aws-vpc-cni-rs-image-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        for sub in ["root", "runroot", "tmp"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        Self { dir }
    }

    fn podman(&self) -> Command {
        let mut c = Command::new("podman");
        c.arg("--root")
            .arg(self.dir.path().join("root"))
            .arg("--runroot")
            .arg(self.dir.path().join("runroot"))
            .args([
                "--storage-driver",
                "overlay",
                "--cgroup-manager",
                "cgroupfs",
            ])
            .args(["--events-backend", "file"])
            .env("TMPDIR", self.dir.path().join("tmp"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.podman()
            .args(args)
            .output()
            .expect("podman is installed (integration/test.sh)")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force", "--time", "2"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        let _ = self.run(&["system", "reset", "--force"]);
    }
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The bootstrapped `debian:bookworm-slim` rootfs as a tarball, built once and cached.
fn base_tarball() -> PathBuf {
    let cache = Path::new(CACHE_DIR);
    let tar = cache.join("debian-bookworm-minbase.tar");
    if tar.exists() {
        return tar;
    }
    std::fs::create_dir_all(cache).expect("cache dir");
    let started = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("bootstrap-")
        .tempdir_in(cache)
        .expect("tempdir");
    let rootfs = work.path().join("rootfs");
    sh(Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(&rootfs)
        .arg("http://deb.debian.org/debian"));
    let _ = std::fs::remove_file(rootfs.join("etc/apt/sources.list"));
    std::fs::write(
        rootfs.join("etc/apt/sources.list.d/debian.sources"),
        DEBIAN_SOURCES,
    )
    .expect("sources");
    for d in ["var/lib/apt/lists", "var/cache/apt/archives"] {
        for e in std::fs::read_dir(rootfs.join(d))
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.path().is_file() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let partial = work.path().join("base.tar");
    sh(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["--numeric-owner", "-cf"])
        .arg(&partial)
        .arg("."));
    std::fs::rename(&partial, &tar).expect("publish tarball");
    eprintln!(
        "image: bootstrapped {BASE} from Debian's packages in {:.0?}",
        started.elapsed()
    );
    tar
}

/// The chart (real Helm): containers' command, env, securityContext, probes, conflist template.
fn rendered_chart() -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("chart/render_daemonset.py");
    let out = Command::new("python3")
        .arg(script)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "render_daemonset.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("chart JSON")
}

fn env_args(env: &serde_json::Value, extra: &[(&str, String)]) -> Vec<String> {
    let mut args = Vec::new();
    for (k, v) in env.as_object().expect("env") {
        args.push("--env".to_owned());
        args.push(format!("{k}={}", v.as_str().expect("env value")));
    }
    for (k, v) in extra {
        args.push("--env".to_owned());
        args.push(format!("{k}={v}"));
    }
    args
}

fn strs(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

fn build_image(engine: &Engine) {
    build_target(engine, None, IMAGE);
}

/// Builds the Dockerfile's default target (aws-node), or `target`, as `tag`.
fn build_target(engine: &Engine, target: Option<&str>, tag: &str) {
    let started = Instant::now();
    if target.is_none() {
        engine.ok(&["import", &base_tarball().display().to_string(), BASE]);
    }
    let ctx = engine.dir.path().join("context");
    std::fs::create_dir_all(ctx.join("prebuilt")).expect("mkdir");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo");
    for b in BINARIES {
        std::fs::copy(built_binary(b), ctx.join("prebuilt").join(b)).expect("copy binary");
    }
    // the support collector the Dockerfile copies from the repository (mode kept: executable)
    std::fs::create_dir_all(ctx.join("scripts")).expect("mkdir");
    std::fs::copy(
        repo.join("scripts/aws-cni-support.sh"),
        ctx.join("scripts/aws-cni-support.sh"),
    )
    .expect("copy aws-cni-support.sh");
    let dockerfile = repo.join("Dockerfile");
    // `--network host`: the build's apt-get needs the network; host networking creates
    // nothing in the root netns (the default bridge would add links and iptables rules).
    let dockerfile = dockerfile.display().to_string();
    let ctx = ctx.display().to_string();
    let mut args = vec![
        "build",
        "--network",
        "host",
        "--pull=never",
        "--build-arg",
        "BINARIES=prebuilt",
        "--file",
        &dockerfile,
        "--tag",
        tag,
    ];
    if let Some(t) = target {
        args.extend(["--target", t]);
    }
    args.push(&ctx);
    engine.ok(&args);
    let size = engine.ok(&["image", "inspect", "--format", "{{.Size}}", tag]);
    eprintln!(
        "image: built {tag} in {:.0?}, size {} MB",
        started.elapsed(),
        size.trim().parse::<u64>().unwrap_or(0) / 1_000_000
    );
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("image: timed out waiting for {what}");
    false
}

/// Milliseconds since the epoch of an RFC 3339 UTC timestamp `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn epoch_ms(ts: &str) -> Option<u128> {
    let n = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (h, mi, s, ms) = (n(11..13)?, n(14..16)?, n(17..19)?, n(20..23)?);
    // Days from civil date (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u128::try_from((((days * 24 + h) * 60 + mi) * 60 + s) * 1000 + ms).ok()
}

#[test]
fn image_builds_and_runs_as_the_daemonset_runs_it() {
    if !can_run_kernel_tests() {
        return;
    }
    let chart = rendered_chart();
    let engine = Engine::new();
    // (`--ulimit nofile=1024:1024,nproc` on every run: this sandbox's hard RLIMIT_NOFILE is below podman's
    // default, which runc could not set.)
    build_image(&engine);

    // The image's own ENTRYPOINT (what `podman run IMAGE` starts) names an executable.
    let entrypoint: Vec<String> = serde_json::from_str(&engine.ok(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config.Entrypoint}}",
        IMAGE,
    ]))
    .expect("entrypoint JSON");
    let first = entrypoint
        .first()
        .expect("the image has an ENTRYPOINT")
        .clone();
    engine.ok(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--entrypoint",
        "/bin/sh",
        IMAGE,
        "-c",
        "test -x \"$0\"",
        &first,
    ]);

    let mut node = TestNode::new("image");
    let netns = format!("ns:{}", node.netns_path().display());
    let host = node.dir().join("host");
    let bin_dir = host.join("opt/cni/bin");
    let net_dir = host.join("etc/cni/net.d");
    let log_dir = host.join("var/log/aws-routed-eni");
    let run_dir = host.join("var/run/aws-node");
    for d in [&bin_dir, &net_dir, &log_dir, &run_dir] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let template = host.join("10-aws.conflist.template");
    std::fs::write(
        &template,
        chart["conflist_template"].as_str().expect("template"),
    )
    .expect("template");
    let mount = |src: &Path, dst: &str| format!("{}:{dst}", src.display());

    // Init container: the chart's command, privileged, in the node's netns.
    node.sysctl("net/ipv4/tcp_early_demux", "0");
    let init = &chart["init"];
    assert_eq!(init["securityContext"]["privileged"], true);
    let mut args: Vec<String> = [
        "run",
        "--rm",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        &netns,
        "--privileged",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(["--volume".to_owned(), mount(&bin_dir, "/host/opt/cni/bin")]);
    args.extend(env_args(&init["env"], &[]));
    args.extend([
        "--entrypoint".to_owned(),
        serde_json::to_string(&init["command"]).expect("json"),
        IMAGE.to_owned(),
    ]);
    engine.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    for b in [
        "aws-cni",
        "egress-cni",
        "host-local",
        "portmap",
        "loopback",
        "bandwidth",
        "tuning",
        // as upstream's init image (cmd/aws-vpc-cni-init/main.go:156 installs every file of
        // its /init, which scripts/dockerfiles/Dockerfile.init gives aws-cni-support.sh)
        "aws-cni-support.sh",
    ] {
        let meta = std::fs::metadata(bin_dir.join(b))
            .unwrap_or_else(|e| panic!("init did not install {b}: {e}"));
        assert!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0,
            "{b} not executable"
        );
    }
    let demux = node
        .command("cat")
        .arg("/proc/sys/net/ipv4/tcp_early_demux")
        .output()
        .expect("cat");
    assert_eq!(
        String::from_utf8_lossy(&demux.stdout).trim(),
        "1",
        "init sets tcp_early_demux in the node's netns"
    );

    // aws-node container: the chart's command and env, ipamd with the in-memory ENI provider.
    let aws_node = &chart["node"];
    let caps = strs(&aws_node["securityContext"]["capabilities"]["add"]).join(",");
    let name = format!("aws-node-image-test-{}", std::process::id());
    let mut args: Vec<String> = [
        "run",
        "--detach",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--name",
        &name,
        "--network",
        &netns,
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(["--cap-add".to_owned(), caps]);
    for (src, dst) in [
        (&bin_dir, "/host/opt/cni/bin"),
        (&net_dir, "/host/etc/cni/net.d"),
        (&log_dir, "/host/var/log/aws-routed-eni"),
        (&run_dir, "/var/run/aws-node"),
    ] {
        args.extend(["--volume".to_owned(), mount(src, dst)]);
    }
    args.extend([
        "--volume".to_owned(),
        format!("{}:/app/10-aws.conflist:ro", template.display()),
    ]);
    args.extend(env_args(
        &aws_node["env"],
        &[
            ("IPAMD_ENI_PROVIDER", "memory".to_owned()),
            (
                "IPAMD_MEMORY_PROVIDER",
                "subnet=198.18.0.0/24,vpc=198.18.0.0/16,max_enis=2,ipv4_per_eni=4,\
                 state=/var/run/aws-node/ec2.json"
                    .to_owned(),
            ),
            ("WARM_IP_TARGET", "1".to_owned()),
        ],
    ));
    args.extend([
        "--entrypoint".to_owned(),
        serde_json::to_string(&aws_node["command"]).expect("json"),
        IMAGE.to_owned(),
    ]);
    engine.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let logs = || {
        let out = engine.run(&["logs", &name]);
        format!(
            "{}{}\nipamd.log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(log_dir.join("ipamd.log")).unwrap_or_default()
        )
    };

    // The conflist appears only once ipamd is healthy (its socket serves).
    let socket = run_dir.join("ipamd.sock");
    let conflist = net_dir.join("10-aws.conflist");
    let mut early = false;
    let installed = wait_for("10-aws.conflist", Duration::from_secs(90), || {
        let present = conflist.exists();
        if present && std::os::unix::net::UnixStream::connect(&socket).is_err() {
            early = true;
        }
        present
    });
    assert!(installed, "conflist never installed:\n{}", logs());
    assert!(
        !early,
        "conflist installed before ipamd served:\n{}",
        logs()
    );
    // And by the clocks: the conflist's mtime is not before ipamd's "serving" log line.
    let log = std::fs::read_to_string(log_dir.join("ipamd.log")).unwrap_or_default();
    let serving_ms = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["msg"] == "serving CNIBackend")
        .and_then(|v| v["ts"].as_str().and_then(epoch_ms))
        .unwrap_or_else(|| panic!("no serving line in ipamd.log:\n{log}"));
    let installed_ms = std::fs::metadata(&conflist)
        .and_then(|m| m.modified())
        .expect("mtime")
        .duration_since(std::time::UNIX_EPOCH)
        .expect("epoch")
        .as_millis();
    assert!(
        installed_ms >= serving_ms,
        "conflist installed at {installed_ms} ms, ipamd served at {serving_ms} ms:\n{}",
        logs()
    );

    for probe in ["liveness", "readiness"] {
        let mut args = vec!["exec".to_owned(), name.clone()];
        args.extend(strs(&aws_node[probe]));
        let out = engine.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(
            out.status.success(),
            "{probe} probe failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs()
        );
    }

    // A pod through the installed plugin and conflist; the socket and log paths are the
    // host side of the container's mounts.
    let installed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conflist).expect("conflist")).expect("json");
    let mut plugin = installed["plugins"][0].clone();
    assert_eq!(plugin["type"], "aws-cni");
    plugin["cniVersion"] = installed["cniVersion"].clone();
    plugin["name"] = installed["name"].clone();
    plugin["ipamdSocket"] = socket.display().to_string().into();
    plugin["pluginLogFile"] = node.dir().join("plugin.log").display().to_string().into();
    // The chart renders NETWORK_POLICY_ENFORCING_MODE=standard with its node-agent sidecar
    // (upstream's image, not built here): its stand-in serves the socket the plugin dials.
    let npa_socket = node.dir().join("npa.sock");
    plugin["npaSocket"] = npa_socket.display().to_string().into();
    let npa = integration::npa::NpaStandin::start_with(
        node.name(),
        &node.dir().join("npa"),
        &integration::npa::NpaOptions {
            socket: Some(npa_socket),
            ..integration::npa::NpaOptions::default()
        },
    )
    .expect("network-policy agent stand-in");
    let pod = node.add_pod_netns("p0");
    let mut add = CniCall::new(
        "ADD",
        "container-0",
        Some(pod.path.clone()),
        plugin.to_string(),
    );
    add.args = "IgnoreUnknown=1;K8S_POD_NAME=pod-0;K8S_POD_NAMESPACE=default".to_owned();
    let res = run_plugin(&node, &bin_dir.join("aws-cni"), &add);
    assert_eq!(
        res.code,
        0,
        "ADD: {} {}\n{}",
        res.stdout,
        res.stderr,
        logs()
    );
    let ip = res.json()["ips"][0]["address"]
        .as_str()
        .expect("address")
        .trim_end_matches("/32")
        .to_owned();
    assert!(ip.starts_with("198.18.0."), "{ip}");
    // The node's own address (a /32 on its loopback) answers the pod through the host route.
    node.ip(&["addr", "add", "198.18.0.250/32", "dev", "lo"]);
    let ping = node
        .command("busybox")
        .args(["ping", "-c", "1", "-W", "2", "-I", "198.18.0.250", &ip])
        .output()
        .expect("ping");
    assert!(
        ping.status.success(),
        "node -> pod {ip}: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    let mut del = add.clone();
    del.command = "DEL".to_owned();
    let res = run_plugin(&node, &bin_dir.join("aws-cni"), &del);
    assert_eq!(res.code, 0, "DEL: {} {}", res.stdout, res.stderr);
    let calls = npa.calls();
    assert_eq!(
        calls
            .iter()
            .map(|c| (c.rpc, c.pod.as_str(), c.mode.as_deref()))
            .collect::<Vec<_>>(),
        vec![
            (
                integration::npa::Rpc::EnforceNpToPod,
                "pod-0",
                Some("standard")
            ),
            (integration::npa::Rpc::DeletePodNp, "pod-0", None),
        ],
        "the chart's mode reaches the agent through the image's ipamd and plugin"
    );
    drop(npa);

    // SIGTERM (podman stop): ipamd stops cleanly, the container exits 0.
    engine.ok(&["stop", "--time", "20", &name]);
    let code = engine.ok(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(code.trim(), "0", "exit code after SIGTERM:\n{}", logs());
    assert!(!socket.exists(), "ipamd's socket left behind");

    metrics_helper_image_publishes_a_round(&engine);
}

/// The `cni-metrics-helper` target of the same Dockerfile: its container (host network: it only
/// talks to loopback servers) finds an aws-node pod through the API simulator with the chart's
/// RBAC, scrapes it through the pod proxy and publishes to moto's CloudWatch, which is read back.
fn metrics_helper_image_publishes_a_round(engine: &Engine) {
    build_target(engine, Some("cni-metrics-helper"), METRICS_HELPER_IMAGE);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let kube = rt
        .block_on(kubesim::KubeSim::start(kubesim::Config::new(dir.path())))
        .expect("kubesim");
    let chart =
        kubesim::chart::render_metrics_helper_chart(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    kube.apply_yaml(&chart).expect("chart applied");
    let sa = kube
        .service_account("kube-system", "cni-metrics-helper")
        .expect("service account");
    // one aws-node whose metrics port is a loopback stand-in serving ipamd's exposition
    let stand_in = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let stand_in_addr = stand_in.local_addr().expect("addr");
    std::thread::spawn(move || {
        use std::io::{Read as _, Write as _};
        for mut conn in stand_in.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let body = "# TYPE awscni_total_ip_addresses gauge\nawscni_total_ip_addresses 18\n";
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    kube.add_node("node-a", "198.18.0.10", serde_json::json!({}))
        .expect("node");
    kube.add_pod(
        "kube-system",
        "aws-node-aaaaa",
        "node-a",
        "198.18.0.10",
        serde_json::json!({"k8s-app": "aws-node"}),
    )
    .expect("pod");
    kube.route_pod_port("kube-system", "aws-node-aaaaa", 61678, stand_in_addr);
    let moto = integration::moto::MotoServer::start().unwrap_or_else(|e| panic!("{e}"));

    let mount = format!("{}:/kubeconfig:ro", sa.kubeconfig.display());
    let endpoint = format!("CNI_METRICS_HELPER_CLOUDWATCH_ENDPOINT={}", moto.url);
    let out = engine.ok(&[
        "run",
        "--rm",
        "--network",
        "host",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "-v",
        &mount,
        "-e",
        "KUBECONFIG=/kubeconfig",
        "-e",
        "AWS_REGION=us-west-2",
        "-e",
        "AWS_ACCESS_KEY_ID=testing",
        "-e",
        "AWS_SECRET_ACCESS_KEY=testing",
        "-e",
        "AWS_EC2_METADATA_DISABLED=true",
        "-e",
        "AWS_CLUSTER_ID=image-test",
        "-e",
        "METRIC_UPDATE_INTERVAL=1",
        "-e",
        "CNI_METRICS_HELPER_ROUNDS=1",
        "-e",
        &endpoint,
        METRICS_HELPER_IMAGE,
    ]);
    assert!(out.contains("Starting CNIMetricsHelper"), "{out}");
    // read back what the container published
    let listed = rt.block_on(async {
        moto.cloudwatch_reader(cni_metrics_helper::cloudwatch::http_client())
            .await
            .list_metrics()
            .namespace(cni_metrics_helper::cloudwatch::NAMESPACE)
            .metric_name("totalIPAddresses")
            .send()
            .await
            .expect("ListMetrics")
    });
    let clusters: Vec<_> = listed
        .metrics()
        .iter()
        .flat_map(|m| m.dimensions().iter().filter_map(|d| d.value()))
        .collect();
    assert!(clusters.contains(&"image-test"), "{clusters:?}");
    drop(kube);
    rt.shutdown_timeout(Duration::from_secs(5));
}
