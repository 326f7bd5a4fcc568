//! The support collector `scripts/aws-cni-support.sh` (issue 26, item 9), run as an operator
//! runs it on a node: inside a simulated node's network namespace (`ip netns exec`, root
//! only), with the real ipamd serving there on the simulated VPC, the collector's paths pointed
//! at the node's files through its `AWS_CNI_SUPPORT_*` overrides. Checks the archive the way a
//! support engineer reads it: name and place as upstream's collector (upstream's init image
//! installs the EKS log collector as `/opt/cni/bin/aws-cni-support.sh`:
//! `scripts/dockerfiles/Dockerfile.init` line 22, `Makefile` target `debug-script`;
//! `eks_<instance>_<date>_<version>.tar.gz` in `/var/log` with the folders `ipamd/`,
//! `networking/`, `var_log/aws-routed-eni/`, `cni/`, `sysctls/`), ipamd's log, `/v1/enis`
//! listing the node's ENIs, the routes of the secondary ENI's table, the checkpoint and its
//! side file, and a tool that is missing (`nft`) recorded in `missing.txt` instead of failing;
//! with ipamd stopped the collector still writes an archive and records the silent endpoints.
//! The collector only reads; everything the test makes goes with the simulated VPC's run
//! directory and namespaces, also when an assertion fails.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{Sim, SimConfig, eventually, exec_in};

const READY: Duration = Duration::from_secs(60);
const STANDARD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo")
        .join("scripts/aws-cni-support.sh")
}

/// A directory of symbolic links to every executable on the standard PATH except `hidden`:
/// a node where those tools are not installed.
fn path_without(dir: &Path, hidden: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir bin");
    let mut seen = BTreeSet::new();
    for d in STANDARD_PATH.split(':') {
        let Ok(entries) = std::fs::read_dir(d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if hidden.contains(&name.as_str()) || !seen.insert(name.clone()) {
                continue;
            }
            std::os::unix::fs::symlink(e.path(), dir.join(&name)).expect("symlink");
        }
    }
    dir.to_path_buf()
}

/// Runs the collector inside `netns` with exactly `env` (plus `args`).
fn collect(netns: &str, env: &[(String, String)], args: &[&str]) -> Output {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "/bin/sh"])
        .arg(script())
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .output()
        .expect("run the collector");
    assert!(
        out.status.success(),
        "collector failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The archive path the collector printed (its stdout's last line), checked for upstream's
/// name and place.
fn archive_path(out: &Output, out_dir: &Path, instance_id: &str) -> PathBuf {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = PathBuf::from(stdout.lines().last().expect("a path on stdout").trim());
    assert_eq!(path.parent(), Some(out_dir), "archive place: {path:?}");
    let name = path
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    let prefix = format!("eks_{instance_id}_");
    assert!(
        name.starts_with(&prefix) && name.ends_with(".tar.gz"),
        "archive name {name}, expected {prefix}<date>_<version>.tar.gz"
    );
    // <UTC %Y-%m-%d_%H%M-%Z>_<version>: e.g. 2026-11-25_1909-UTC_rs1
    let middle = &name[prefix.len()..name.len() - ".tar.gz".len()];
    let parts: Vec<&str> = middle.split('_').collect();
    assert_eq!(parts.len(), 3, "date_time_version in {name}");
    assert_eq!(parts[0].len(), 10, "date in {name}");
    assert!(parts[1].ends_with("-UTC"), "time and zone in {name}");
    assert!(path.is_file(), "{path:?} written");
    path
}

/// Extracts `archive` into `into` (created) and returns `into`.
fn extract(archive: &Path, into: &Path) -> PathBuf {
    std::fs::create_dir_all(into).expect("mkdir");
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .status()
        .expect("tar");
    assert!(st.success(), "tar -xzf {archive:?}");
    into.to_path_buf()
}

fn read(dir: &Path, rel: &str) -> String {
    std::fs::read_to_string(dir.join(rel)).unwrap_or_else(|e| panic!("{rel} in the archive: {e}"))
}

/// The non-primary ENI with its route table, once `/v1/enis` shows it host-ready with a route
/// in that table.
fn secondary_eni(sim: &Sim) -> Result<(String, u64), String> {
    let enis = sim.introspect(0, "/v1/enis")?;
    let found = enis
        .as_object()
        .into_iter()
        .flat_map(|cards| cards.values())
        .filter_map(|card| card["ENIs"].as_object())
        .flat_map(|m| m.iter())
        .find(|(_, e)| e["IsPrimary"] == false)
        .and_then(|(id, e)| Some((id.clone(), e["RouteTableID"].as_u64()?)));
    let Some((id, table)) = found else {
        return Err(format!("no secondary ENI yet: {enis}"));
    };
    let routes = exec_in(
        &sim.nodes[0].netns,
        &["ip", "route", "show", "table", &table.to_string()],
    );
    if String::from_utf8_lossy(&routes.stdout).contains("default via") {
        Ok((id, table))
    } else {
        Err(format!("table {table} of {id} has no default route yet"))
    }
}

/// Every ENI id listed in a `/v1/enis` document (all network cards).
fn listed_enis(enis: &serde_json::Value) -> BTreeSet<String> {
    enis.as_object()
        .into_iter()
        .flat_map(|cards| cards.values())
        .filter_map(|card| card["ENIs"].as_object())
        .flat_map(|m| m.keys().cloned())
        .collect()
}

#[test]
fn collector_archives_a_simulated_nodes_state() {
    if !can_run_kernel_tests() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let dir = sim.nodes[0].dir.clone();
    let netns = sim.nodes[0].netns.clone();
    let instance_id = sim.nodes[0].instance_id.clone();
    // the node's /var/log/aws-routed-eni: ipamd's log there, the plugin's linked in
    let logs = dir.join("aws-routed-eni");
    std::fs::create_dir_all(&logs).expect("mkdir logs");
    let ipamd_log = logs.join("ipamd.log").display().to_string();
    sim.start_ipamd(
        0,
        &[
            ("AWS_VPC_K8S_CNI_LOG_FILE", ipamd_log.as_str()),
            ("IPAMD_POOL_TICK_SECONDS", "1"),
            // more than the primary ENI's 9 (m5.large): a secondary ENI and its table
            ("WARM_IP_TARGET", "12"),
        ],
        READY,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (secondary, table) = eventually(Duration::from_secs(60), || secondary_eni(&sim))
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));

    // two pods, one deleted: the checkpoint holds one, the side file the other's cooldown
    let kept = sim.add_pod(0, "support-a").expect("ADD a");
    let gone = sim.add_pod(0, "support-b").expect("ADD b");
    sim.del_pod(&gone).expect("DEL b");
    std::os::unix::fs::symlink(sim.nodes[0].plugin_log(), logs.join("plugin.log"))
        .expect("link plugin.log");
    let checkpoint = sim.nodes[0].checkpoint();
    let cooldown = PathBuf::from(format!("{}.cooldown", checkpoint.display()));
    assert!(cooldown.is_file(), "ipamd wrote no {cooldown:?}");

    let conf_dir = dir.join("net.d");
    std::fs::create_dir_all(&conf_dir).expect("mkdir net.d");
    let conflist = sim.nodes[0].netconf();
    std::fs::write(conf_dir.join("10-aws.conflist"), &conflist).expect("conflist");
    let bin = path_without(&dir.join("bin-without-nft"), &["nft"]);
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("mkdir tmp");
    let out_dir = dir.join("var-log");
    let env = |path: &Path, out: &Path| -> Vec<(String, String)> {
        [
            ("PATH", path.display().to_string()),
            ("TMPDIR", tmp.display().to_string()),
            ("AWS_CNI_SUPPORT_LOG_DIR", logs.display().to_string()),
            (
                "AWS_CNI_SUPPORT_CHECKPOINT",
                checkpoint.display().to_string(),
            ),
            (
                "AWS_CNI_SUPPORT_CNI_CONF_DIR",
                conf_dir.display().to_string(),
            ),
            (
                "AWS_CNI_SUPPORT_CNI_BIN_DIR",
                dir.join("no-cni-bin").display().to_string(),
            ),
            ("AWS_CNI_SUPPORT_OUTPUT_DIR", out.display().to_string()),
            // not this machine's cloud-init file: the node's id comes from the simulated IMDS
            (
                "AWS_CNI_SUPPORT_INSTANCE_ID_FILE",
                dir.join("no-instance-id").display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };

    let out = collect(&netns, &env(&bin, &out_dir), &[]);
    let archive = archive_path(&out, &out_dir, &instance_id);
    let x = extract(&archive, &dir.join("extracted"));

    // logs: ipamd's (zap JSON lines) and the plugin's, through the symbolic link
    let log = read(&x, "var_log/aws-routed-eni/ipamd.log");
    assert!(
        log.lines().any(|l| l.contains("\"msg\"")),
        "ipamd.log: {log:.300}"
    );
    assert!(
        !read(&x, "var_log/aws-routed-eni/plugin.log").is_empty(),
        "plugin.log empty"
    );
    // introspection: /v1/enis parses and lists the node's ENIs, as EC2 has them
    let enis: serde_json::Value =
        serde_json::from_str(&read(&x, "ipamd/enis.json")).expect("enis.json is JSON");
    let listed = listed_enis(&enis);
    for id in sim.ec2_enis(0).keys() {
        assert!(listed.contains(id), "{id} not in enis.json: {listed:?}");
    }
    assert!(listed.contains(&secondary), "{secondary} not in {listed:?}");
    for ep in [
        "eni-configs",
        "networkutils-env-settings",
        "ipamd-env-settings",
    ] {
        assert!(
            x.join(format!("ipamd/{ep}.json")).is_file(),
            "ipamd/{ep}.json"
        );
    }
    assert!(
        read(&x, "ipamd/metrics.json").contains("awscni_"),
        "metrics"
    );
    // checkpoint and side file, as on disk
    let ck: serde_json::Value =
        serde_json::from_str(&read(&x, "ipamd/ipam.json")).expect("ipam.json is JSON");
    assert!(ck.to_string().contains(&kept.ip.to_string()), "{ck}");
    assert!(
        read(&x, "ipamd/ipam.json.cooldown").contains(&gone.ip.to_string()),
        "the released address's cooldown"
    );
    // rules, routes of every table (the secondary ENI's), links, firewall, sysctls, CNI conf
    let routes = read(&x, "networking/iproute.txt");
    assert!(
        routes.contains(&format!("table {table}")),
        "table {table} of {secondary} not in iproute.txt:\n{routes}"
    );
    let rules = read(&x, "networking/iprule.txt");
    assert!(
        rules.contains(&format!("to {} lookup main", kept.ip)),
        "pod rule not in iprule.txt:\n{rules}"
    );
    assert!(read(&x, "networking/iplink.txt").contains("eth1"), "links");
    assert!(
        read(&x, "networking/ipaddr.txt").contains(&sim.nodes[0].primary_ip.to_string()),
        "addresses"
    );
    let firewall: String = ["iptables-save", "iptables-nft-save", "iptables-legacy-save"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(x.join(format!("networking/{f}.txt"))).ok())
        .collect();
    assert!(firewall.contains("AWS-SNAT-CHAIN-0"), "iptables dumps");
    assert!(
        read(&x, "sysctls/cni-sysctls.txt").contains("net.ipv4.conf.eth0.rp_filter = "),
        "sysctls"
    );
    assert_eq!(read(&x, "cni/10-aws.conflist"), conflist);
    assert_eq!(read(&x, "system/instance-id.txt").trim(), instance_id);
    // the missing tool is recorded, not fatal; so is the missing bin dir
    let missing = read(&x, "missing.txt");
    assert!(missing.contains("tool nft: not found"), "{missing}");
    assert!(missing.contains("no-cni-bin"), "{missing}");
    assert!(!x.join("networking/nft-ruleset.txt").exists());
    // nothing left behind but the archive
    assert_eq!(
        std::fs::read_dir(&tmp).expect("tmp").count(),
        0,
        "temp dir left"
    );
    assert_eq!(std::fs::read_dir(&out_dir).expect("out").count(), 1);

    // ipamd down: still an archive, with the checkpoint and the silent endpoints recorded;
    // nft present this time, its ruleset collected
    sim.stop_ipamd(0, false);
    let out_dir2 = dir.join("var-log-2");
    let out = collect(
        &netns,
        &env(Path::new(STANDARD_PATH), &out_dir2),
        &["--ignore_metrics=true"],
    );
    let archive = archive_path(&out, &out_dir2, &instance_id);
    let x = extract(&archive, &dir.join("extracted-2"));
    let missing = read(&x, "missing.txt");
    assert!(
        missing.contains("introspection http://127.0.0.1:61679/v1/enis: no answer"),
        "{missing}"
    );
    assert!(
        !missing.contains("metrics"),
        "metrics were to be skipped: {missing}"
    );
    assert!(x.join("ipamd/ipam_metrics_ignore.txt").is_file());
    assert!(!x.join("ipamd/enis.json").exists());
    assert!(x.join("ipamd/ipam.json").is_file());
    if which("nft") {
        assert!(
            x.join("networking/nft-ruleset.txt").is_file(),
            "nft ruleset"
        );
    }

    // the pod goes before the VPC
    sim.del_pod(&kept).expect("DEL a");
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

fn which(tool: &str) -> bool {
    STANDARD_PATH
        .split(':')
        .any(|d| Path::new(d).join(tool).is_file())
}

/// POSIX `sh` and shellcheck-clean (when shellcheck is installed); options as upstream's.
#[test]
fn collector_is_posix_shell_with_upstreams_options() {
    let s = script();
    let meta = std::fs::metadata(&s).expect("the script");
    assert!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0,
        "executable in the repository (the image copies its mode)"
    );
    let st = Command::new("sh").arg("-n").arg(&s).status().expect("sh");
    assert!(st.success(), "sh -n");
    if which("shellcheck") {
        let o = Command::new("shellcheck")
            .args(["-s", "sh"])
            .arg(&s)
            .output()
            .expect("shellcheck");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    } else {
        eprintln!("shellcheck not installed: lint skipped");
    }
    // --help answers before any collection (no root needed); an unknown option is refused
    let help = Command::new("sh")
        .arg(&s)
        .arg("--help")
        .output()
        .expect("sh");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--ignore_introspection") && text.contains("--ignore_metrics"),
        "{text}"
    );
    let bad = Command::new("sh")
        .arg(&s)
        .arg("--bogus")
        .output()
        .expect("sh");
    assert_eq!(bad.status.code(), Some(1));
}
