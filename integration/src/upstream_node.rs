//! Nodes as upstream aws-node v1.23 leaves them, for the migration and rolling-update suites: the
//! EC2 side (secondary IPs on the primary ENI, a second ENI created, tagged and attached as
//! upstream's ipamd does), the node's host networking (ENI table, rules 1024/32765, rp_filter,
//! SNAT/connmark chains in the current or the older chain-per-CIDR layout), pods wired as
//! upstream's plugin wires them, and `ipam.json` written by Go's `encoding/json`
//! (`integration/upstream-ipam`). Also: running an `ipamd` of a chosen build ([`IpamdBuild`],
//! through the sim's supervised spawn) and inspecting a node's links, rules and iptables.
//! Everything lives in the [`Sim`]'s namespaces (removed with it) and its run directory. Must not:
//! touch the root network namespace, use our ipamd or plugin to lay anything out, or kill processes
//! it did not start.

use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::sim::{Sim, exec_in};
use crate::supervisor::{Stop, Supervised};

/// The Go helper (`integration/upstream-ipam/main.go`), built once per run with Debian's
/// `golang-go`.
#[derive(Debug, Clone)]
pub struct UpstreamIpam {
    bin: PathBuf,
}

fn out_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl UpstreamIpam {
    /// `go build` the helper into `dir`.
    pub fn build(dir: &Path) -> Result<Self, String> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("upstream-ipam/main.go");
        let bin = dir.join("upstream-ipam");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(&src)
            .env("GO111MODULE", "off")
            .env("GOCACHE", "/tmp/aws-vpc-cni-rs-gocache")
            .current_dir(dir)
            .output()
            .map_err(|e| format!("go build (golang-go installed? integration/test.sh): {e}"))?;
        if !out.status.success() {
            return Err(format!("go build: {}", out_text(&out)));
        }
        Ok(Self { bin })
    }

    /// Write `path` as upstream's checkpointer does; returns the pods' host veth names
    /// (upstream's `GeneratePodHostVethName` with prefix `eni`), in input order.
    pub fn write(&self, path: &Path, pods: &[serde_json::Value]) -> Result<Vec<String>, String> {
        let mut child = Command::new(&self.bin)
            .arg("write")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("upstream-ipam: {e}"))?;
        if let Some(mut i) = child.stdin.take() {
            i.write_all(
                serde_json::Value::from(pods.to_vec())
                    .to_string()
                    .as_bytes(),
            )
            .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(out_text(&out));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", out_text(&out)))
    }

    /// Restore `path` as upstream's `ReadBackingStore` would on a host with `links`: the kept
    /// entries (`containerID`, `ifName`, `networkName`, `namespace`, `name`, `ipv4`,
    /// `allocated` RFC 3339, `veth`). Fails where upstream's restore fails.
    pub fn read(&self, path: &Path, links: &[String]) -> Result<Vec<serde_json::Value>, String> {
        let out = Command::new(&self.bin)
            .arg("read")
            .arg(path)
            .args(links)
            .output()
            .map_err(|e| format!("upstream-ipam: {e}"))?;
        if !out.status.success() {
            return Err(out_text(&out));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {}", out_text(&out)))
    }
}

/// Which SNAT/connmark chain layout upstream left on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainLayout {
    /// v1.6+ (and v1.23): `AWS-SNAT-CHAIN-0` with one RETURN per VPC CIDR; the connmark in
    /// `AWS-CONNMARK-CHAIN-0` on a legacy-iptables node, in v1.23's native table `ip aws-cni`
    /// (`nftables_connmark.go`) on a node whose iptables is nf_tables.
    Current,
    /// Nodes upgraded from before v1.6: one chain per CIDR (`AWS-SNAT-CHAIN-0..N`,
    /// `AWS-CONNMARK-CHAIN-0..N`), the `-m state --state NEW` connmark jump. v1.23's
    /// `network.go` still deletes `AWS-*-CHAIN-1..N` at start.
    ChainPerCidr,
}

/// A pod wired as upstream leaves it.
#[derive(Debug, Clone)]
pub struct UpstreamPod {
    /// `K8S_POD_NAME` (namespace `default`).
    pub name: String,
    /// Node index.
    pub node: usize,
    /// Pod network namespace.
    pub netns: String,
    /// Sandbox id.
    pub container_id: String,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Host veth (`eni` + sha1 prefix, computed by the Go helper).
    pub veth: String,
    /// ENI device number (0 = primary).
    pub device: u32,
}

impl UpstreamPod {
    /// The result upstream's plugin returned for this pod (conflist `cniVersion` 0.4.0), which
    /// the runtime keeps and passes back as `prevResult` on DEL: host veth, container veth
    /// (`mac` = route table id), `dummy<hash>` (`mac` = VLAN 0, `sandbox` = device number).
    #[must_use]
    pub fn prev_result(&self, netns_path: &str) -> serde_json::Value {
        let table = if self.device == 0 {
            254
        } else {
            self.device + 1
        };
        let hash = self.veth.trim_start_matches("eni");
        serde_json::json!({
            "cniVersion": "0.4.0",
            "interfaces": [
                {"name": self.veth},
                {"name": "eth0", "mac": table.to_string(), "sandbox": netns_path},
                {"name": format!("dummy{hash}"), "mac": "0", "sandbox": self.device.to_string()},
            ],
            "ips": [{"version": "4", "interface": 1, "address": format!("{}/32", self.ip)}],
            "dns": {}
        })
    }
}

/// What the fixture laid out on one node.
#[derive(Debug, Clone)]
pub struct UpstreamNode {
    /// Node index.
    pub node: usize,
    /// The pods.
    pub pods: Vec<UpstreamPod>,
    /// The secondary ENI upstream attached (device 1).
    pub secondary_eni: String,
}

fn ip_in(ns: &str, args: &[&str]) -> Result<(), String> {
    let mut full = vec!["ip"];
    full.extend_from_slice(args);
    let out = exec_in(ns, &full);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{ns}: ip {}: {}", args.join(" "), out_text(&out)))
    }
}

fn sh_in(ns: &str, args: &[&str]) -> Result<String, String> {
    let out = exec_in(ns, args);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{ns}: {}: {}", args.join(" "), out_text(&out)))
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// upstream v1.23's connmark table (`nftables_connmark.go` `Setup`), in `nft -f` syntax that
/// compiles to the bytecode its netlink code writes (the CIDR as a 4-byte load, mask, compare).
pub fn upstream_nft_table(vpc_cidr: &ipnet::Ipv4Net) -> String {
    format!(
        "table ip aws-cni {{
  chain nat-prerouting {{
    type nat hook prerouting priority -90; policy accept;
    fib daddr type local return
    iifname \"eni*\" counter jump snat-mark
    counter meta mark set ct mark & 0x80
  }}
  chain snat-mark {{
    counter ip daddr & {} == {} return
    counter ct mark set ct mark | 0x80
  }}
}}
",
        vpc_cidr.netmask(),
        vpc_cidr.network()
    )
}

/// upstream's `-j SNAT` / chain rules for `layout`, as `iptables-restore --noflush` input;
/// without the nat connmark when `nft_connmark` (v1.23 on an nf_tables node).
fn upstream_iptables(
    layout: ChainLayout,
    vpc_cidr: &str,
    primary_ip: Ipv4Addr,
    nft_connmark: bool,
) -> String {
    let mut nat = vec!["*nat".to_owned()];
    match layout {
        ChainLayout::Current => {
            nat.extend(
                [
                    ":AWS-SNAT-CHAIN-0 - [0:0]",
                    r#"-A POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0"#,
                    &format!(r#"-A AWS-SNAT-CHAIN-0 -d {vpc_cidr} -m comment --comment "AWS SNAT CHAIN" -j RETURN"#),
                    &format!(r#"-A AWS-SNAT-CHAIN-0 ! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! --dst-type LOCAL -j SNAT --to-source {primary_ip} --random-fully"#),
                ]
                .map(str::to_owned),
            );
            if !nft_connmark {
                nat.extend(
                    [
                        ":AWS-CONNMARK-CHAIN-0 - [0:0]",
                        r#"-A PREROUTING -i eni+ -m comment --comment "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0"#,
                        r#"-A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
                        &format!(r#"-A AWS-CONNMARK-CHAIN-0 -d {vpc_cidr} -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#),
                        r#"-A AWS-CONNMARK-CHAIN-0 -m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark 0x80/0x80"#,
                    ]
                    .map(str::to_owned),
                );
            }
        }
        ChainLayout::ChainPerCidr => {
            nat.extend(
                [
                    ":AWS-SNAT-CHAIN-0 - [0:0]",
                    ":AWS-SNAT-CHAIN-1 - [0:0]",
                    ":AWS-CONNMARK-CHAIN-0 - [0:0]",
                    ":AWS-CONNMARK-CHAIN-1 - [0:0]",
                    r#"-A POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0"#,
                    &format!(r#"-A AWS-SNAT-CHAIN-0 ! -d {vpc_cidr} -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-1"#),
                    &format!(r#"-A AWS-SNAT-CHAIN-1 ! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! --dst-type LOCAL -j SNAT --to-source {primary_ip}"#),
                    r#"-A PREROUTING -i eni+ -m comment --comment "AWS, outbound connections" -m state --state NEW -j AWS-CONNMARK-CHAIN-0"#,
                    r#"-A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
                    &format!(r#"-A AWS-CONNMARK-CHAIN-0 ! -d {vpc_cidr} -m comment --comment "AWS CONNMARK CHAIN, VPC CIDR" -j AWS-CONNMARK-CHAIN-1"#),
                    r#"-A AWS-CONNMARK-CHAIN-1 -m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark 0x80/0x80"#,
                ]
                .map(str::to_owned),
            );
        }
    }
    nat.push("COMMIT".into());
    let mangle = [
        "*mangle",
        r#"-A PREROUTING -i eth0 -m comment --comment "AWS, primary ENI" -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK --set-xmark 0x80/0x80"#,
        r#"-A PREROUTING -i eni+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
        r#"-A PREROUTING -i vlan+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
        "COMMIT",
    ];
    let mut text = nat.join("\n");
    text.push('\n');
    text.push_str(&mangle.join("\n"));
    text.push('\n');
    text
}

/// Lay node `node` of `sim` out as upstream aws-node v1.23 leaves it (no ipamd of ours may be
/// running there): `primary_pods` pods on the primary ENI, `secondary_pods` on a second ENI,
/// each ENI with one free address beyond its pods (upstream's warm pool), `ipam.json` at the
/// node's checkpoint path.
pub fn lay_out(
    sim: &Sim,
    go: &UpstreamIpam,
    node: usize,
    primary_pods: u32,
    secondary_pods: u32,
    layout: ChainLayout,
) -> Result<UpstreamNode, String> {
    let n = &sim.nodes[node];
    let ns = n.netns.clone();
    let instance = n.instance_id.clone();
    // EC2, as upstream's ipamd: secondary IPs on the primary ENI (its warm pool), one ENI created
    // with upstream's description and tags, attached at device 1, with its own secondary IPs.
    let (primary_eni, subnet_id) = sim.world.read(|s| {
        let e = s.enis_of(&instance);
        let p = e
            .iter()
            .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
            .map(|e| (e.id.clone(), e.subnet_id.clone()));
        p.unwrap_or_default()
    });
    let created_at = time_rfc3339();
    let secondary_eni = sim
        .world
        .mutate(|s, now| {
            s.assign_ipv4(
                &primary_eni,
                vpcsim::state::AssignIpv4 {
                    count: primary_pods + 1,
                    ..Default::default()
                },
            )?;
            let id = s.create_eni(vpcsim::state::CreateEni {
                subnet_id: subnet_id.clone(),
                description: format!("aws-K8S-{instance}"),
                secondary_count: secondary_pods + 1,
                tags: [
                    (
                        "node.k8s.amazonaws.com/instance_id".to_owned(),
                        instance.clone(),
                    ),
                    (
                        "node.k8s.amazonaws.com/createdAt".to_owned(),
                        created_at.clone(),
                    ),
                    (
                        "cluster.k8s.amazonaws.com/name".to_owned(),
                        "vpcsim-e2e".to_owned(),
                    ),
                ]
                .into_iter()
                .collect(),
                ..Default::default()
            })?;
            s.stamp_created(&id, now);
            s.attach_eni(&id, &instance, 1, now)?;
            Ok(id)
        })
        .map_err(|e| format!("EC2: {e}"))?;
    let view = vpcsim::World::fabric_view(&sim.world, sim.world.now());
    let inst = view
        .instance(&instance)
        .ok_or_else(|| format!("{instance} not in view"))?;
    let vpc_cidr = view.vpc_cidr.to_string();
    let eni = |dev: u32| {
        inst.enis
            .iter()
            .find(|e| e.device_index == dev)
            .cloned()
            .ok_or_else(|| format!("no ENI at device {dev}"))
    };
    let (eth0, eth1) = (eni(0)?, eni(1)?);
    // the fabric adds eth1 once the attachment is visible
    let deadline = Instant::now() + Duration::from_secs(20);
    while ip_in(&ns, &["link", "show", "eth1"]).is_err() {
        if Instant::now() > deadline {
            return Err(format!("{ns}: eth1 never appeared"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Node: upstream's init container and SetupHostNetwork.
    sh_in(&ns, &["sysctl", "-qw", "net.ipv4.conf.eth0.rp_filter=2"])?;
    ip_in(
        &ns,
        &[
            "rule",
            "add",
            "fwmark",
            "0x80/0x80",
            "lookup",
            "main",
            "priority",
            "1024",
        ],
    )?;
    // v1.23 picks its connmark by `iptables --version` (GetIptablesMode); the chain-per-CIDR
    // layout is from before v1.23, iptables only.
    let nft_connmark = layout == ChainLayout::Current
        && sh_in(&ns, &["iptables", "--version"])?.contains("nf_tables");
    let rules = upstream_iptables(layout, &vpc_cidr, eth0.primary_ip, nft_connmark);
    let out = crate::supervisor::netns_exec(&ns, "iptables-restore")
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            if let Some(mut i) = c.stdin.take() {
                i.write_all(rules.as_bytes())?;
            }
            c.wait_with_output()
        })
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("iptables-restore: {}\n{rules}", out_text(&out)));
    }
    if nft_connmark {
        let cidr: ipnet::Ipv4Net = vpc_cidr
            .parse()
            .map_err(|e| format!("vpc cidr {vpc_cidr}: {e}"))?;
        let table = upstream_nft_table(&cidr);
        nft_in(&ns, &table)?;
    }
    // Secondary ENI: upstream's setupENINetwork (table device+1).
    let gw = eth1.subnet_cidr.network().to_bits() + 1;
    let gw = Ipv4Addr::from_bits(gw).to_string();
    let table = "2";
    let addr = format!("{}/{}", eth1.primary_ip, eth1.subnet_cidr.prefix_len());
    ip_in(&ns, &["link", "set", "eth1", "mtu", "9001", "up"])?;
    ip_in(&ns, &["addr", "add", &addr, "dev", "eth1"])?;
    ip_in(
        &ns,
        &[
            "route", "add", &gw, "dev", "eth1", "scope", "link", "table", table,
        ],
    )?;
    ip_in(
        &ns,
        &[
            "route", "add", "default", "via", &gw, "dev", "eth1", "table", table,
        ],
    )?;
    let subnet = eth1.subnet_cidr.to_string();
    ip_in(&ns, &["route", "del", &subnet, "dev", "eth1"])?;
    let eni_ip = eth1.primary_ip.to_string();
    ip_in(
        &ns,
        &[
            "rule", "add", "from", &eni_ip, "lookup", table, "priority", "32765",
        ],
    )?;
    // Pods, then the checkpoint upstream wrote for them.
    let mut specs = Vec::new();
    let mut pods = Vec::new();
    let placements = eth0
        .secondary_ips
        .iter()
        .take(primary_pods as usize)
        .map(|ip| (*ip, 0))
        .chain(
            eth1.secondary_ips
                .iter()
                .take(secondary_pods as usize)
                .map(|ip| (*ip, 1)),
        );
    for (k, (ip, device)) in placements.enumerate() {
        let name = format!("up-n{node}-{k}");
        let container_id = format!(
            "{:064x}",
            ((node as u128) << 64) | (0xc0ffee_u128 << 32) | k as u128
        );
        specs.push(serde_json::json!({
            "containerID": container_id, "namespace": "default", "name": name,
            "ipv4": ip.to_string(), "allocationTimestamp": now_ns(),
        }));
        pods.push(UpstreamPod {
            netns: format!("{}u{node}x{k}", sim.prefix()),
            name,
            node,
            container_id,
            ip,
            veth: String::new(),
            device,
        });
    }
    let veths = go.write(&n.checkpoint(), &specs)?;
    for (pod, veth) in pods.iter_mut().zip(veths) {
        pod.veth = veth;
        wire_pod(&ns, pod)?;
    }
    Ok(UpstreamNode {
        node,
        pods,
        secondary_eni,
    })
}

fn time_rfc3339() -> String {
    // upstream tags createdAt with time.Now().Format(time.RFC3339); any past instant will do
    // for the leaked-ENI check, which only reads it as "old enough".
    "2026-01-01T00:00:00Z".to_owned()
}

/// Wire one pod as upstream's plugin (`driver.go` SetupPodNetwork) does.
fn wire_pod(node_ns: &str, pod: &UpstreamPod) -> Result<(), String> {
    let p = pod.netns.as_str();
    crate::supervisor::add_netns(p)?;
    let v = pod.veth.as_str();
    ip_in(
        node_ns,
        &[
            "link", "add", v, "type", "veth", "peer", "name", "eth0", "netns", p,
        ],
    )?;
    for (k, val) in [
        ("accept_ra", "0"),
        ("accept_redirects", "1"),
        ("forwarding", "0"),
    ] {
        let _ = sh_in(
            node_ns,
            &["sysctl", "-qw", &format!("net.ipv6.conf.{v}.{k}={val}")],
        );
    }
    ip_in(node_ns, &["link", "set", v, "up"])?;
    ip_in(p, &["link", "set", "eth0", "up"])?;
    ip_in(
        p,
        &[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ],
    )?;
    ip_in(
        p,
        &[
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ],
    )?;
    let ip = pod.ip.to_string();
    ip_in(p, &["addr", "add", &format!("{ip}/32"), "dev", "eth0"])?;
    let mac = sh_in(node_ns, &["cat", &format!("/sys/class/net/{v}/address")])?;
    ip_in(
        p,
        &[
            "neigh",
            "add",
            "169.254.1.1",
            "lladdr",
            mac.trim(),
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
    )?;
    ip_in(node_ns, &["route", "add", &ip, "dev", v, "scope", "link"])?;
    ip_in(
        node_ns,
        &[
            "rule", "add", "to", &ip, "lookup", "main", "priority", "512",
        ],
    )?;
    if pod.device > 0 {
        let table = (pod.device + 1).to_string();
        ip_in(
            node_ns,
            &[
                "rule", "add", "from", &ip, "lookup", &table, "priority", "1536",
            ],
        )?;
    }
    Ok(())
}

/// An `ipamd` of a chosen build running in a node (the harness's own ipamd is not started);
/// stopped (SIGTERM, then SIGKILL by PID) on drop.
#[derive(Debug)]
pub struct IpamdBuild {
    process: Supervised,
}

impl IpamdBuild {
    /// Start `bin` in node `i` with the harness's environment for that node plus `extra`, and
    /// wait until its socket and introspection answer.
    pub fn start(
        sim: &Sim,
        i: usize,
        bin: &Path,
        extra: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Self, String> {
        let mut process = sim
            .spawn_ipamd_process(i, bin, &sim.ipamd_env(i, extra))
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = process.exited() {
                return Err(format!("ipamd exited: {st}\n{}", sim.ipamd_log_tail(i, 40)));
            }
            if sim.ipamd_ready(i) {
                return Ok(Self { process });
            }
            if Instant::now() > deadline {
                return Err(format!("ipamd not ready\n{}", sim.ipamd_log_tail(i, 40)));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, up to 10 s, then SIGKILL.
    pub fn stop(&mut self) {
        self.process.stop(Stop::Term(Duration::from_secs(10)));
    }
}

/// Host links of node `i` (names).
pub fn host_links(sim: &Sim, i: usize) -> Result<Vec<String>, String> {
    let text = sh_in(&sim.nodes[i].netns, &["ip", "-o", "link", "show"])?;
    Ok(text
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .collect())
}

/// `iptables-save` in node `i` (the node's default backend).
pub fn iptables_save(sim: &Sim, i: usize) -> Result<String, String> {
    sh_in(&sim.nodes[i].netns, &["iptables-save"])
}

fn nft_in(ns: &str, script: &str) -> Result<(), String> {
    let out = crate::supervisor::netns_exec(ns, "nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            if let Some(mut i) = c.stdin.take() {
                i.write_all(script.as_bytes())?;
            }
            c.wait_with_output()
        })
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("nft -f: {}\n{script}", out_text(&out)))
    }
}

/// `nft -a list table ip aws-cni` of node `i` with its packet and byte counts zeroed (handles
/// kept: a rebuilt table shows), or `None` without the table.
pub fn aws_cni_table(sim: &Sim, i: usize) -> Result<Option<String>, String> {
    let ns = &sim.nodes[i].netns;
    let tables = sh_in(ns, &["nft", "list", "tables"])?;
    if !tables.lines().any(|l| l.trim() == "table ip aws-cni") {
        return Ok(None);
    }
    let listing = sh_in(ns, &["nft", "-a", "list", "table", "ip", "aws-cni"])?;
    let words: Vec<&str> = listing.split(' ').collect();
    let mut out: Vec<&str> = Vec::with_capacity(words.len());
    let mut skip = false;
    for (k, w) in words.iter().enumerate() {
        if skip {
            skip = false;
            out.push("0");
            continue;
        }
        out.push(w);
        skip = matches!(*w, "packets" | "bytes") && k + 1 < words.len();
    }
    Ok(Some(out.join(" ")))
}

/// `ip -4 rule show` and `ip -4 route show table all` of node `i`, whitespace-normalised.
pub fn rules_and_routes(sim: &Sim, i: usize) -> Result<(Vec<String>, Vec<String>), String> {
    let norm = |t: String| -> Vec<String> {
        t.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    };
    let ns = &sim.nodes[i].netns;
    Ok((
        norm(sh_in(ns, &["ip", "-4", "rule", "show"])?),
        norm(sh_in(ns, &["ip", "-4", "route", "show", "table", "all"])?),
    ))
}

/// Path of the built binary `name` next to the running test (`ipamd`, `aws-cni`).
pub fn built(name: &str) -> Result<PathBuf, String> {
    crate::binaries::find_built(name).map_err(|p| format!("{} not built", p.display()))
}

/// A security-groups-for-pods pod as upstream's plugin v1.23 leaves it (`driver.go`
/// `SetupBranchENIPodNetwork`), laid out by hand with `ip` so that a test can show our plugin
/// checks and deletes what upstream made (takeover of a node with branch pods).
#[derive(Debug, Clone)]
pub struct UpstreamBranchPod {
    /// `K8S_POD_NAME` (namespace `default`).
    pub name: String,
    /// Pod network namespace (created by [`wire_branch_pod`]).
    pub netns: String,
    /// The branch ENI's address.
    pub ip: Ipv4Addr,
    /// Host veth: `vlan<hash>` (strict) or `eni<hash>` (standard), hash = the first 11 hex of
    /// `sha1("default.<name>")`, computed by `sha1sum` (upstream `GeneratePodHostVethName`).
    pub veth: String,
    /// 802.1Q id of the branch ENI.
    pub vlan: u16,
}

impl UpstreamBranchPod {
    /// The result upstream's plugin returned (conflist `cniVersion` 0.4.0), which the runtime
    /// passes back as `prevResult`: host veth (MAC), container veth (MAC, sandbox),
    /// `dummy<hash>` whose `mac` is the VLAN id as a bare number and which has no sandbox; the
    /// address's gateway is the branch subnet's.
    #[must_use]
    pub fn prev_result(&self, node_ns: &str, netns_path: &str, subnet_gw: Ipv4Addr) -> Value {
        let mac_of = |ns: &str, link: &str| {
            sh_in(ns, &["cat", &format!("/sys/class/net/{link}/address")])
                .map(|m| m.trim().to_owned())
                .unwrap_or_default()
        };
        let hash = &self.veth[self.veth.len() - 11..];
        serde_json::json!({
            "cniVersion": "0.4.0",
            "interfaces": [
                {"name": self.veth, "mac": mac_of(node_ns, &self.veth)},
                {"name": "eth0", "mac": mac_of(&self.netns, "eth0"), "sandbox": netns_path},
                {"name": format!("dummy{hash}"), "mac": self.vlan.to_string()},
            ],
            "ips": [{"version": "4", "interface": 1, "address": format!("{}/32", self.ip),
                     "gateway": subnet_gw.to_string()}],
            "dns": {}
        })
    }
}

/// Wire pod `default/<name>` on branch ENI (`ip`, `vlan`, `branch_mac`, subnet gateway
/// `subnet_gw`) over the trunk link `trunk` of `node_ns`, as upstream's plugin does in `mode`
/// (`strict`: `vlan<hash>` veth, route to the pod in table vlan+100, `iif` rules at 10 for the
/// VLAN link and the veth; `standard`: `eni<hash>` veth, route in main, `to <ip> lookup main`
/// at 512 and `from <ip> lookup <vlan+100>` at 1536). `pod_netns` is created here.
#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
pub fn wire_branch_pod(
    node_ns: &str,
    pod_netns: &str,
    name: &str,
    ip: Ipv4Addr,
    vlan: u16,
    branch_mac: &str,
    subnet_gw: Ipv4Addr,
    trunk: &str,
    mode: &str,
) -> Result<UpstreamBranchPod, String> {
    let sum = sh_in(
        node_ns,
        &["sh", "-c", &format!("printf %s default.{name} | sha1sum")],
    )?;
    let hash = sum.get(..11).ok_or("sha1sum output")?;
    let veth = format!("{}{hash}", if mode == "strict" { "vlan" } else { "eni" });
    let p = pod_netns;
    crate::supervisor::add_netns(p)?;
    // createVethPairContext.run: the pod's eth0, the host end up (IPv6 sysctls first).
    ip_in(
        node_ns,
        &[
            "link", "add", &veth, "mtu", "9001", "type", "veth", "peer", "name", "eth0", "mtu",
            "9001", "netns", p,
        ],
    )?;
    for (k, val) in [
        ("accept_ra", "0"),
        ("accept_redirects", "1"),
        ("forwarding", "0"),
    ] {
        let _ = sh_in(
            node_ns,
            &["sysctl", "-qw", &format!("net.ipv6.conf.{veth}.{k}={val}")],
        );
    }
    ip_in(node_ns, &["link", "set", &veth, "up"])?;
    ip_in(p, &["link", "set", "eth0", "up"])?;
    ip_in(
        p,
        &[
            "route",
            "add",
            "169.254.1.1",
            "dev",
            "eth0",
            "scope",
            "link",
        ],
    )?;
    ip_in(
        p,
        &[
            "route",
            "add",
            "default",
            "via",
            "169.254.1.1",
            "dev",
            "eth0",
        ],
    )?;
    let addr = ip.to_string();
    ip_in(p, &["addr", "add", &format!("{addr}/32"), "dev", "eth0"])?;
    let host_mac = sh_in(node_ns, &["cat", &format!("/sys/class/net/{veth}/address")])?;
    ip_in(
        p,
        &[
            "neigh",
            "add",
            "169.254.1.1",
            "lladdr",
            host_mac.trim(),
            "dev",
            "eth0",
            "nud",
            "permanent",
        ],
    )?;
    // setupVlan: vlan.eth.<id> on the trunk with the branch MAC, IPv6 sysctls, up, its table's
    // routes.
    let vlan_link = format!("vlan.eth.{vlan}");
    let table = (u32::from(vlan) + 100).to_string();
    ip_in(
        node_ns,
        &[
            "link",
            "add",
            "link",
            trunk,
            "name",
            &vlan_link,
            "address",
            branch_mac,
            "type",
            "vlan",
            "id",
            &vlan.to_string(),
        ],
    )?;
    for (k, val) in [
        ("accept_ra", "0"),
        ("accept_redirects", "1"),
        ("forwarding", "0"),
    ] {
        let _ = sh_in(
            node_ns,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{vlan_link}.{k}={val}"),
            ],
        );
    }
    ip_in(node_ns, &["link", "set", &vlan_link, "up"])?;
    let gw = subnet_gw.to_string();
    ip_in(
        node_ns,
        &[
            "route", "replace", &gw, "dev", &vlan_link, "scope", "link", "table", &table,
        ],
    )?;
    ip_in(
        node_ns,
        &[
            "route", "replace", "default", "via", &gw, "dev", &vlan_link, "table", &table,
        ],
    )?;
    if mode == "strict" {
        // setupIIFBasedContainerRouteRules
        ip_in(
            node_ns,
            &[
                "route", "replace", &addr, "dev", &veth, "scope", "link", "table", &table,
            ],
        )?;
        for iif in [vlan_link.as_str(), veth.as_str()] {
            ip_in(
                node_ns,
                &[
                    "rule", "add", "iif", iif, "lookup", &table, "priority", "10",
                ],
            )?;
        }
    } else {
        // setupIPBasedContainerRouteRules
        ip_in(
            node_ns,
            &["route", "replace", &addr, "dev", &veth, "scope", "link"],
        )?;
        ip_in(
            node_ns,
            &[
                "rule", "add", "to", &addr, "lookup", "main", "priority", "512",
            ],
        )?;
        ip_in(
            node_ns,
            &[
                "rule", "add", "from", &addr, "lookup", &table, "priority", "1536",
            ],
        )?;
    }
    Ok(UpstreamBranchPod {
        name: name.to_owned(),
        netns: p.to_owned(),
        ip,
        veth,
        vlan,
    })
}
