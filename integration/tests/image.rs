//! The container image, built from the repository's `Dockerfile` by a real engine (podman 4 /
//! buildah from Debian) and run for real against a simulated node: the init container installs
//! the plugins into a mounted host CNI bin dir and sets its sysctl in the node's netns; the
//! aws-node container (the chart's command and environment, rendered by real Helm) starts ipamd
//! in the node's netns (`--network ns:`), installs `10-aws.conflist` only once ipamd is healthy,
//! answers the chart's probes (`podman exec`), a pod wired by the installed plugin reaches the
//! node, and SIGTERM stops it cleanly.
//!
//! Offline: registry images cannot be pulled, so `debian:bookworm-slim` is bootstrapped from
//! Debian's packages (debootstrap, cached as a tarball under [`integration::images::CACHE_DIR`]) and imported under
//! its registry name; the Dockerfile's `BINARIES=prebuilt` feeds it the binaries this test was
//! built with, so the workspace is not compiled twice. Everything podman stores lives in a
//! private storage root under a temp dir, removed afterwards (also on failure); the machine's
//! root netns is never touched (`--network host` only for the build's `apt-get`, which creates
//! no links; containers run with `--network ns:<node netns>`).
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use integration::images::Engine;
use integration::{CniCall, TestNode, can_run_kernel_tests, cni::run_plugin};

const IMAGE: &str = "localhost/aws-vpc-cni-rs:image-test";
const METRICS_HELPER_IMAGE: &str = "localhost/cni-metrics-helper-rs:image-test";
/// The Dockerfile's `init` target (upstream's separate init image).
const INIT_IMAGE: &str = "localhost/aws-vpc-cni-rs-init:image-test";

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
    engine.import_base();
    engine.build_target(None, IMAGE);
}

/// Builds the Dockerfile's `target` as `tag` (`integration::images`, shared with the kubelet
/// tier).
fn build_target(engine: &Engine, target: Option<&str>, tag: &str) {
    engine.build_target(target, tag);
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

    // The image's own ENTRYPOINT (what `podman run IMAGE` starts: the aws-node start-up, in
    // upstream's image's shape, scripts/dockerfiles/Dockerfile.release L17 `WORKDIR /app`, L30
    // `ENTRYPOINT ["/app/aws-vpc-cni"]`) names an executable.
    let (entrypoint, cmd, workdir) = image_config(&engine, IMAGE);
    assert_eq!(
        (entrypoint.as_slice(), cmd.as_slice(), workdir.as_str()),
        (&["/app/aws-node.sh".to_owned()][..], &[][..], "/app"),
        "aws-node image's ENTRYPOINT, CMD, WORKDIR"
    );
    let first = entrypoint[0].clone();
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
    before_init(&node);
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
    // The chart's init command (the image's /app/aws-vpc-cni-init.sh) in the aws-node image:
    // the chart's default init image is the aws-node image.
    args.extend([
        "--entrypoint".to_owned(),
        serde_json::to_string(&init["command"]).expect("json"),
        IMAGE.to_owned(),
    ]);
    engine.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_init_did_its_work(&node, &bin_dir);

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
            ("IPAMD_MEMORY_PROVIDER", MEMORY_PROVIDER.to_owned()),
            ("WARM_IP_TARGET", "1".to_owned()),
        ],
    ));
    // No command, as the chart renders it (and upstream's manifests): the image's ENTRYPOINT.
    assert!(
        aws_node["command"].is_null(),
        "the chart's aws-node has a command"
    );
    args.push(IMAGE.to_owned());
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
    drop(node);

    let started = Instant::now();
    upstream_manifest_with_our_images(&engine);
    eprintln!(
        "image: upstream's manifest with our images (init target build + both containers) in {:.0?}",
        started.elapsed()
    );

    metrics_helper_image_publishes_a_round(&engine);
}

/// The in-memory ENI provider standing in for EC2 inside the container (TEST/DEMO ONLY).
const MEMORY_PROVIDER: &str = "subnet=198.18.0.0/24,vpc=198.18.0.0/16,max_enis=2,ipv4_per_eni=4,\
                               state=/var/run/aws-node/ec2.json";

/// What the init container installs into the host's CNI bin dir: our plugins, every reference
/// plugin, and, as upstream's init image (cmd/aws-vpc-cni-init/main.go:156 installs every file
/// of its /init, which scripts/dockerfiles/Dockerfile.init gives aws-cni-support.sh), the
/// support collector.
fn installed() -> Vec<&'static str> {
    ["aws-cni", "egress-cni"]
        .into_iter()
        .chain(integration::binaries::REFERENCE_PLUGINS)
        .chain(["aws-cni-support.sh"])
        .collect()
}

/// An image's `(ENTRYPOINT, CMD, WORKDIR)`.
fn image_config(engine: &Engine, image: &str) -> (Vec<String>, Vec<String>, String) {
    let v: serde_json::Value = serde_json::from_str(&engine.ok(&[
        "image",
        "inspect",
        "--format",
        "{{json .Config}}",
        image,
    ]))
    .expect("config JSON");
    let list = |k: &str| {
        v[k].as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    (
        list("Entrypoint"),
        list("Cmd"),
        v["WorkingDir"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The node's state before the init runs: `tcp_early_demux` 0, and a primary interface
/// `eth0` (a veth) holding the IPv4 default route with strict `rp_filter`.
fn before_init(node: &TestNode) {
    node.sysctl("net/ipv4/tcp_early_demux", "0");
    node.ip(&[
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0-peer",
    ]);
    node.ip(&["link", "set", "eth0", "up"]);
    node.ip(&["addr", "add", "192.0.2.2/24", "dev", "eth0"]);
    node.ip(&["route", "add", "default", "via", "192.0.2.1", "dev", "eth0"]);
    node.sysctl("net/ipv4/conf/eth0/rp_filter", "1");
}

/// Every plugin and the support collector installed executable in `bin_dir`,
/// `tcp_early_demux` (set to 0 before the init ran) back to 1 in the node's netns: upstream's
/// init with `DISABLE_TCP_EARLY_DEMUX` false (cmd/aws-vpc-cni-init/main.go L83-98), and
/// `rp_filter` of the default route's interface (1 before) 2 (L73-80; ipamd may not write it,
/// issue 37).
fn assert_init_did_its_work(node: &TestNode, bin_dir: &Path) {
    for b in installed() {
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
    let rp_filter = node
        .command("cat")
        .arg("/proc/sys/net/ipv4/conf/eth0/rp_filter")
        .output()
        .expect("cat");
    assert_eq!(
        String::from_utf8_lossy(&rp_filter.stdout).trim(),
        "2",
        "init sets rp_filter=2 on the default route's interface in the node's netns"
    );
}

// Upstream v1.23.1's own manifest, config/master/aws-k8s-cni.yaml (its DaemonSet starts at L161),
// written here as data (facts, not upstream's file). Neither container has a `command`.
//
// Init container (L189-205): image amazon-k8s-cni-init, env L193-197, `privileged: true` L199,
// one mount L204. Its image: scripts/dockerfiles/Dockerfile.init L18 `WORKDIR /init`, L25
// `CMD ["/init/aws-vpc-cni-init"]`.
const UPSTREAM_INIT_ENV: [(&str, &str); 2] = [
    ("DISABLE_TCP_EARLY_DEMUX", "false"),
    ("ENABLE_IPv6", "false"),
];
const UPSTREAM_INIT_MOUNTS: [&str; 1] = ["/host/opt/cni/bin"];
// aws-node container (L212-315): image amazon-k8s-cni, env L236-296 (the list below, then
// MY_NODE_NAME and MY_POD_NAME from the downward API), capabilities L300-304, mounts L305-315
// (hostPaths L361-377: /run/xtables.lock is a FileOrCreate file, the others directories),
// liveness/readiness probes L218-235.
const UPSTREAM_NODE_ENV: [(&str, &str); 25] = [
    ("ADDITIONAL_ENI_TAGS", "{}"),
    ("AWS_VPC_CNI_NODE_PORT_SUPPORT", "true"),
    ("AWS_VPC_ENI_MTU", "9001"),
    ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "false"),
    ("AWS_VPC_K8S_CNI_EXTERNALSNAT", "false"),
    ("AWS_VPC_K8S_CNI_LOGLEVEL", "DEBUG"),
    (
        "AWS_VPC_K8S_CNI_LOG_FILE",
        "/host/var/log/aws-routed-eni/ipamd.log",
    ),
    ("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "prng"),
    ("AWS_VPC_K8S_CNI_VETHPREFIX", "eni"),
    (
        "AWS_VPC_K8S_PLUGIN_LOG_FILE",
        "/var/log/aws-routed-eni/plugin.log",
    ),
    ("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "DEBUG"),
    ("DISABLE_INTROSPECTION", "false"),
    ("DISABLE_METRICS", "false"),
    ("DISABLE_NETWORK_RESOURCE_PROVISIONING", "false"),
    ("ENABLE_IMDS_ONLY_MODE", "false"),
    ("ENABLE_IPv4", "true"),
    ("ENABLE_IPv6", "false"),
    ("ENABLE_MULTI_NIC", "false"),
    ("ENABLE_POD_ENI", "false"),
    ("ENABLE_PREFIX_DELEGATION", "false"),
    ("ENABLE_SUBNET_DISCOVERY", "true"),
    ("NETWORK_POLICY_ENFORCING_MODE", "standard"),
    ("VPC_CNI_VERSION", "v1.23.1"),
    ("WARM_ENI_TARGET", "1"),
    ("WARM_PREFIX_TARGET", "1"),
];
const UPSTREAM_NODE_CAPS: [&str; 2] = ["NET_ADMIN", "NET_RAW"];
const UPSTREAM_NODE_DIR_MOUNTS: [&str; 4] = [
    "/host/opt/cni/bin",
    "/host/etc/cni/net.d",
    "/host/var/log/aws-routed-eni",
    "/var/run/aws-node",
];
const UPSTREAM_NODE_FILE_MOUNT: &str = "/run/xtables.lock";
const UPSTREAM_PROBE: [&str; 4] = [
    "/app/grpc-health-probe",
    "-addr=unix:///var/run/aws-node/ipamd.sock",
    "-connect-timeout=5s",
    "-rpc-timeout=5s",
];

/// Issue 26 item 8, "swapping only the image works": the two containers run as upstream's own
/// manifest runs upstream's images (the constants above), with our images in their place (the
/// Dockerfile's default target as amazon-k8s-cni, its `init` target as amazon-k8s-cni-init):
/// no command, upstream's env and mount paths, privileged init, in a node netns this test made.
/// The init installs the plugins and sets the sysctl; aws-node starts ipamd (the in-memory
/// provider stands in for EC2: the only env that is not upstream's, with MY_NODE_NAME and
/// MY_POD_NAME, which the downward API would give), installs the conflist filled in from
/// upstream's env, serves the introspection endpoint and answers upstream's probe.
fn upstream_manifest_with_our_images(engine: &Engine) {
    build_target(engine, Some("init"), INIT_IMAGE);
    let (entrypoint, cmd, workdir) = image_config(engine, INIT_IMAGE);
    assert!(
        entrypoint.is_empty() && cmd == ["/app/aws-vpc-cni-init.sh"] && workdir == "/app",
        "init image: ENTRYPOINT {entrypoint:?}, CMD {cmd:?}, WORKDIR {workdir:?}"
    );

    let node = TestNode::new("swap");
    let netns = format!("ns:{}", node.netns_path().display());
    let host = node.dir().join("host");
    let host_path = |p: &str| host.join(p.trim_start_matches('/'));
    for d in UPSTREAM_NODE_DIR_MOUNTS {
        std::fs::create_dir_all(host_path(d)).expect("mkdir");
    }
    std::fs::create_dir_all(host_path("/run")).expect("mkdir");
    std::fs::write(host_path(UPSTREAM_NODE_FILE_MOUNT), "").expect("xtables.lock");
    let volume = |p: &str| {
        vec![
            "--volume".to_owned(),
            format!("{}:{p}", host_path(p).display()),
        ]
    };
    let base = |name: &str| -> Vec<String> {
        [
            "run",
            "--name",
            name,
            "--network",
            &netns,
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ]
        .map(str::to_owned)
        .to_vec()
    };

    // Init container: privileged, upstream's env and mount, the init image's own command.
    before_init(&node);
    let init_name = format!("aws-vpc-cni-init-swap-{}", std::process::id());
    let mut args = base(&init_name);
    args.push("--privileged".to_owned());
    for (k, v) in UPSTREAM_INIT_ENV {
        args.extend(["--env".to_owned(), format!("{k}={v}")]);
    }
    for m in UPSTREAM_INIT_MOUNTS {
        args.extend(volume(m));
    }
    args.push(INIT_IMAGE.to_owned());
    let out = engine.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let code = engine.ok(&["inspect", "--format", "{{.State.ExitCode}}", &init_name]);
    assert_eq!(code.trim(), "0", "init container: {out}");
    assert_init_did_its_work(&node, &host_path("/host/opt/cni/bin"));

    // aws-node container: upstream's capabilities, env and mounts, the image's own entrypoint.
    let name = format!("aws-node-swap-{}", std::process::id());
    let mut args = base(&name);
    args.push("--detach".to_owned());
    args.extend(["--cap-add".to_owned(), UPSTREAM_NODE_CAPS.join(",")]);
    for m in UPSTREAM_NODE_DIR_MOUNTS
        .into_iter()
        .chain([UPSTREAM_NODE_FILE_MOUNT])
    {
        args.extend(volume(m));
    }
    for (k, v) in UPSTREAM_NODE_ENV.into_iter().chain([
        ("MY_NODE_NAME", "ip-198-18-0-10.ec2.internal"),
        ("MY_POD_NAME", "aws-node-swap"),
        ("IPAMD_ENI_PROVIDER", "memory"),
        ("IPAMD_MEMORY_PROVIDER", MEMORY_PROVIDER),
    ]) {
        args.extend(["--env".to_owned(), format!("{k}={v}")]);
    }
    args.push(IMAGE.to_owned());
    engine.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let log_dir = host_path("/host/var/log/aws-routed-eni");
    let logs = || {
        let out = engine.run(&["logs", &name]);
        format!(
            "{}{}\nipamd.log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(log_dir.join("ipamd.log")).unwrap_or_default()
        )
    };

    // The conflist, filled in from upstream's env, in the host-path mount.
    let conflist = host_path("/host/etc/cni/net.d").join("10-aws.conflist");
    assert!(
        wait_for("10-aws.conflist", Duration::from_secs(90), || conflist
            .exists()),
        "conflist never installed:\n{}",
        logs()
    );
    let installed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conflist).expect("conflist")).expect("json");
    let aws_cni = &installed["plugins"][0];
    assert_eq!(
        (
            &aws_cni["type"],
            &aws_cni["vethPrefix"],
            &aws_cni["mtu"],
            &aws_cni["pluginLogFile"],
            &aws_cni["pluginLogLevel"],
        ),
        (
            &"aws-cni".into(),
            &"eni".into(),
            &"9001".into(),
            &"/var/log/aws-routed-eni/plugin.log".into(),
            &"DEBUG".into(),
        ),
        "{installed}"
    );
    assert_eq!(
        installed["plugins"]
            .as_array()
            .expect("plugins")
            .iter()
            .map(|p| p["type"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["aws-cni", "egress-cni", "portmap"],
        "upstream's default chain"
    );

    // Upstream's probe command answers (podman exec), and the introspection endpoint serves
    // the pool from inside the node's netns.
    let mut probe = vec!["exec", name.as_str()];
    probe.extend(UPSTREAM_PROBE);
    let out = engine.run(&probe);
    assert!(
        out.status.success(),
        "upstream's probe failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs()
    );
    let mut enis = serde_json::Value::Null;
    let served = wait_for("/v1/enis", Duration::from_secs(30), || {
        let out = node
            .command("curl")
            .args(["-sf", "--max-time", "5", "http://127.0.0.1:61679/v1/enis"])
            .output()
            .expect("curl");
        enis = serde_json::from_slice(&out.stdout).unwrap_or_default();
        out.status.success() && enis.is_object()
    });
    assert!(served, "introspection /v1/enis: {enis}\n{}", logs());
    assert!(
        enis.to_string().contains("198.18.0."),
        "the pool in /v1/enis: {enis}"
    );

    engine.ok(&["stop", "--time", "20", &name]);
    let code = engine.ok(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(code.trim(), "0", "exit code after SIGTERM:\n{}", logs());
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
