//! Carries out an [`EgressPlan`]: runs the `host-local` IPAM plugin from `CNI_PATH`, creates
//! the egress veth pair with its addresses and routes through `dataplane`, and installs or
//! removes the SNAT chain with `iptables`/`ip6tables` in the plugin's (host) netns. Must not:
//! decide what to program (plan.rs does), write stdout.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use dataplane::{Address, NetNs, NetNsError, Netlink, NetlinkError, SysctlError, VethSpec};
use ipnet::IpNet;

use super::plan::{EgressKind, EgressPlan, NatRule};
use crate::spec::{CniResult, CniVersion};

/// Directories searched for `iptables` after `PATH` (runtimes may run plugins without it).
const SBIN_FALLBACK: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// How long ADD waits for the host veth's link-local address (V6 egress).
const LINK_LOCAL_WAIT: Duration = Duration::from_secs(5);

/// A failed egress step.
#[derive(Debug, thiserror::Error)]
pub enum EgressApplyError {
    /// A program (host-local, iptables) is not installed where it is looked for.
    #[error("{0} not found in {1}")]
    NotFound(String, String),
    /// A program could not be run.
    #[error("run {0}")]
    Spawn(String, #[source] std::io::Error),
    /// host-local failed; its error message.
    #[error("running IPAM plugin failed: {0}")]
    Ipam(String),
    /// iptables refused a command.
    #[error("{cmd}: {stderr}")]
    Iptables {
        /// The command line.
        cmd: String,
        /// What it printed.
        stderr: String,
    },
    /// The pod netns could not be opened.
    #[error("open netns")]
    NetNs(#[from] NetNsError),
    /// A netlink operation failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// A sysctl write failed.
    #[error(transparent)]
    Sysctl(#[from] SysctlError),
    /// The pod's egress interface kept a tentative (or DAD-failed) IPv6 address past the DAD
    /// timeout (10 s).
    #[error("link {0} still has tentative addresses after 10s")]
    DadTimeout(String),
    /// The host veth got no IPv6 link-local address in time.
    #[error("link-local IPv6 address not found on host interface {0}")]
    NoLinkLocal(String),
    /// A created link reports no MAC.
    #[error("link {0} has no mac")]
    NoMac(String),
}

/// Finds `name` in `dirs` (first hit).
fn find_in(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The IPAM plugin named in the netconf, run as a delegate (with the process environment and the
/// plugin's own stdin).
#[derive(Debug)]
pub struct Ipam {
    path: PathBuf,
    vars: HashMap<String, String>,
}

impl Ipam {
    /// Looks `ipam_type` up in `CNI_PATH`.
    pub fn find(ipam_type: &str, vars: &HashMap<String, String>) -> Result<Self, EgressApplyError> {
        let cni_path = vars.get("CNI_PATH").cloned().unwrap_or_default();
        let dirs: Vec<PathBuf> = cni_path
            .split(':')
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect();
        let path = find_in(ipam_type, &dirs)
            .ok_or_else(|| EgressApplyError::NotFound(ipam_type.to_owned(), cni_path.clone()))?;
        Ok(Self {
            path,
            vars: vars.clone(),
        })
    }

    fn exec(&self, command: &str, stdin: &[u8]) -> Result<String, EgressApplyError> {
        let name = self.path.display().to_string();
        let mut child = Command::new(&self.path)
            .env_clear()
            .envs(&self.vars)
            .env("CNI_COMMAND", command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| EgressApplyError::Spawn(name.clone(), e))?;
        if let Some(mut input) = child.stdin.take() {
            input
                .write_all(stdin)
                .map_err(|e| EgressApplyError::Spawn(name.clone(), e))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| EgressApplyError::Spawn(name.clone(), e))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            return Ok(stdout);
        }
        let msg = serde_json::from_str::<serde_json::Value>(&stdout)
            .ok()
            .and_then(|v| {
                let msg = v.get("msg")?.as_str()?.to_owned();
                let details = v.get("details").and_then(|d| d.as_str()).unwrap_or("");
                Some(if details.is_empty() {
                    msg
                } else {
                    format!("{msg}; {details}")
                })
            })
            .unwrap_or_else(|| {
                format!("{stdout}{}", String::from_utf8_lossy(&out.stderr))
                    .trim()
                    .to_owned()
            });
        Err(EgressApplyError::Ipam(msg))
    }

    /// The newest version both the configuration and the plugin speak: Debian's host-local
    /// (plugins 1.1) stops at 1.0.0, whose result shape 1.1.0 shares.
    fn version_for(&self, conf_version: CniVersion) -> CniVersion {
        if conf_version != CniVersion::V1_1_0 {
            return conf_version;
        }
        let supported = self
            .exec("VERSION", br#"{"cniVersion":"1.1.0"}"#)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .is_some_and(|v| {
                v["supportedVersions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "1.1.0"))
            });
        if supported {
            conf_version
        } else {
            CniVersion::V1_0_0
        }
    }

    fn stdin_for(&self, stdin: &[u8], conf_version: CniVersion) -> Vec<u8> {
        let version = self.version_for(conf_version);
        if version == conf_version {
            return stdin.to_vec();
        }
        match serde_json::from_slice::<serde_json::Value>(stdin) {
            Ok(mut v) => {
                v["cniVersion"] = version.as_str().into();
                serde_json::to_vec(&v).unwrap_or_else(|_| stdin.to_vec())
            }
            Err(_) => stdin.to_vec(),
        }
    }

    /// ADD: the addresses (with gateways) the plugin handed out.
    pub fn add(
        &self,
        stdin: &[u8],
        conf_version: CniVersion,
    ) -> Result<Vec<(IpNet, Option<IpAddr>)>, EgressApplyError> {
        let version = self.version_for(conf_version);
        let out = self.exec("ADD", &self.stdin_for(stdin, conf_version))?;
        let value: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| EgressApplyError::Ipam(format!("undecodable result ({e}): {out}")))?;
        let result = CniResult::from_versioned(value, version)
            .map_err(|e| EgressApplyError::Ipam(format!("undecodable result ({e}): {out}")))?;
        Ok(result
            .ips
            .into_iter()
            .map(|ip| (ip.address, ip.gateway))
            .collect())
    }

    /// DEL: releases this container's lease (a missing one is not an error for host-local).
    pub fn del(&self, stdin: &[u8], conf_version: CniVersion) -> Result<(), EgressApplyError> {
        self.exec("DEL", &self.stdin_for(stdin, conf_version))
            .map(|_| ())
    }
}

/// `iptables` / `ip6tables` in the plugin's netns.
#[derive(Debug)]
pub struct Iptables {
    bin: PathBuf,
}

impl Iptables {
    /// Finds the program for `kind` in `PATH`, then the usual sbin directories.
    pub fn find(
        kind: EgressKind,
        vars: &HashMap<String, String>,
    ) -> Result<Self, EgressApplyError> {
        let mut dirs: Vec<PathBuf> = vars
            .get("PATH")
            .map(|p| {
                p.split(':')
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        dirs.extend(SBIN_FALLBACK.iter().map(PathBuf::from));
        let bin = find_in(kind.iptables(), &dirs).ok_or_else(|| {
            EgressApplyError::NotFound(kind.iptables().to_owned(), "PATH".to_owned())
        })?;
        Ok(Self { bin })
    }

    fn run(&self, args: &[&str]) -> Result<String, EgressApplyError> {
        let name = self.bin.display().to_string();
        let out = Command::new(&self.bin)
            .arg("-w")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| EgressApplyError::Spawn(name.clone(), e))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(EgressApplyError::Iptables {
                cmd: format!("{name} {}", args.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }

    /// go-iptables' `HasRandomFully`: version 1.6.2 or later.
    #[must_use]
    pub fn has_random_fully(&self) -> bool {
        let Ok(out) = Command::new(&self.bin).arg("--version").output() else {
            return false;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('v'))
            .unwrap_or("");
        let parts: Vec<u32> = version.split('.').filter_map(|p| p.parse().ok()).collect();
        parts.as_slice() >= [1, 6, 2].as_slice()
    }

    fn chains(&self) -> Result<Vec<String>, EgressApplyError> {
        let out = self.run(&["-t", "nat", "-S"])?;
        Ok(out
            .lines()
            .filter_map(|l| {
                l.strip_prefix("-N ")
                    .or_else(|| l.strip_prefix("-P "))
                    .and_then(|r| r.split_whitespace().next())
                    .map(str::to_owned)
            })
            .collect())
    }

    /// Whether the `nat` chain exists.
    pub fn chain_exists(&self, chain: &str) -> Result<bool, EgressApplyError> {
        Ok(self.chains()?.iter().any(|c| c == chain))
    }

    /// Whether a rule exists (`-C`).
    #[must_use]
    pub fn has_rule(&self, rule: &NatRule) -> bool {
        let mut args = vec!["-t", "nat", "-C", rule.chain.as_str()];
        args.extend(rule.args.iter().map(String::as_str));
        self.run(&args).is_ok()
    }

    /// Creates missing chains, then appends each rule unless present.
    pub fn add_rules(&self, rules: &[NatRule]) -> Result<(), EgressApplyError> {
        let mut existing = self.chains()?;
        for rule in rules {
            if !existing.contains(&rule.chain) {
                self.run(&["-t", "nat", "-N", &rule.chain])?;
                existing.push(rule.chain.clone());
            }
        }
        for rule in rules {
            if !self.has_rule(rule) {
                let mut args = vec!["-t", "nat", "-A", rule.chain.as_str()];
                args.extend(rule.args.iter().map(String::as_str));
                self.run(&args)?;
            }
        }
        Ok(())
    }

    /// Deletes the pod's SNAT, tolerant of missing pieces: the POSTROUTING jump of `src` (when
    /// known), every other POSTROUTING jump to the chain with this comment (so a DEL that no longer
    /// finds the pod's address still cleans up), then flush and delete the chain.
    pub fn delete_chain(
        &self,
        chain: &str,
        comment: &str,
        sources: &[IpAddr],
    ) -> Result<(), EgressApplyError> {
        for src in sources {
            let jump = super::plan::postrouting_jump(*src, chain, comment);
            let mut args = vec!["-t", "nat", "-D", jump.chain.as_str()];
            args.extend(jump.args.iter().map(String::as_str));
            let _ = self.run(&args);
        }
        let listing = self.run(&["-t", "nat", "-S", "POSTROUTING"])?;
        let jump = format!("-j {chain}");
        for line in listing.lines().filter(|l| l.contains(&jump)) {
            if let Some(rest) = line.strip_prefix("-A POSTROUTING ") {
                let args = split_rule(rest);
                let mut full = vec!["-t", "nat", "-D", "POSTROUTING"];
                full.extend(args.iter().map(String::as_str));
                self.run(&full)?;
            }
        }
        if self.chain_exists(chain)? {
            self.run(&["-t", "nat", "-F", chain])?;
            self.run(&["-t", "nat", "-X", chain])?;
        }
        Ok(())
    }
}

/// Splits an `iptables -S` rule into arguments, honouring double quotes (comments).
fn split_rule(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// What ADD created that the result needs.
#[derive(Debug, Clone)]
pub struct EgressApplied {
    /// Host veth MAC.
    pub host_mac: String,
    /// Pod egress interface MAC.
    pub container_mac: String,
}

/// Creates the pod's egress interface and host side (no SNAT). A leftover egress interface
/// of an earlier, unfinished ADD in the same netns is replaced.
pub async fn setup_links(
    plan: &EgressPlan,
    host: &NetNs,
    pod: &NetNs,
) -> Result<EgressApplied, EgressApplyError> {
    let host_nl = host.connect().await?;
    let pod_nl = pod.connect().await?;
    if !plan.pod_sysctls.is_empty() {
        pod.write_sysctls(&plan.pod_sysctls)?;
    }
    if !plan.host_sysctls.is_empty() {
        host.write_sysctls(&plan.host_sysctls)?;
    }
    pod_nl.delete_link_by_name(&plan.container_ifname).await?;
    pod_nl
        .add_veth(&VethSpec {
            name: &plan.container_ifname,
            mtu: plan.mtu,
            peer_name: &plan.host_veth,
            peer_mac: None,
            peer_netns: Some(host),
        })
        .await?;
    let host_link = host_nl.require_link(&plan.host_veth).await?;
    host_nl.set_link_up(host_link.index).await?;
    let pod_link = pod_nl.require_link(&plan.container_ifname).await?;
    pod_nl.set_link_up(pod_link.index).await?;
    pod_nl
        .add_address(
            &Address {
                ifindex: pod_link.index,
                prefix: plan.lease.address,
            },
            // with DAD (ADD waits for the address to settle below)
            false,
        )
        .await?;
    if let Some(subnet) = plan.pod_subnet_route(pod_link.index) {
        match pod_nl.delete_route(&subnet).await {
            Err(e) if !e.is_not_found() => return Err(e.into()),
            _ => {}
        }
    }
    let host_ll = if plan.kind == EgressKind::V6 {
        Some(wait_link_local(&host_nl, host_link.index, &plan.host_veth).await?)
    } else {
        None
    };
    for route in plan.pod_routes(pod_link.index, host_ll) {
        pod_nl.replace_route(&route).await?;
    }
    if plan.kind == EgressKind::V6 {
        let unsettled = pod_nl
            .wait_ipv6_settled(
                pod_link.index,
                crate::apply::V6_DAD_TIMEOUT,
                crate::apply::V6_DAD_INTERVAL,
            )
            .await?;
        if !unsettled.is_empty() {
            return Err(EgressApplyError::DadTimeout(plan.container_ifname.clone()));
        }
    }
    if let Some(addr) = plan.host_address() {
        match host_nl
            .add_address(
                &Address {
                    ifindex: host_link.index,
                    prefix: addr,
                },
                false,
            )
            .await
        {
            Err(e) if !e.is_exists() => return Err(e.into()),
            _ => {}
        }
    }
    host_nl
        .replace_route(&plan.host_route(host_link.index))
        .await?;
    let mac = |l: &dataplane::Link| {
        l.mac
            .map(|m| m.to_string())
            .ok_or_else(|| EgressApplyError::NoMac(l.name.clone()))
    };
    Ok(EgressApplied {
        host_mac: mac(&host_link)?,
        container_mac: mac(&pod_link)?,
    })
}

async fn wait_link_local(nl: &Netlink, index: u32, name: &str) -> Result<IpAddr, EgressApplyError> {
    let deadline = tokio::time::Instant::now() + LINK_LOCAL_WAIT;
    loop {
        let ll = nl
            .addresses(Some(index))
            .await?
            .into_iter()
            .find_map(|a| match a.prefix.addr() {
                IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some(IpAddr::V6(v6)),
                _ => None,
            });
        if let Some(ll) = ll {
            return Ok(ll);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(EgressApplyError::NoLinkLocal(name.to_owned()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The egress interface's addresses in the pod (empty when the netns or the link is gone).
pub async fn pod_addresses(pod: &NetNs, ifname: &str) -> Result<Vec<IpNet>, EgressApplyError> {
    let nl = pod.connect().await?;
    let Some(link) = nl.link_by_name(ifname).await? else {
        return Ok(Vec::new());
    };
    Ok(nl
        .addresses(Some(link.index))
        .await?
        .into_iter()
        .map(|a| a.prefix)
        .collect())
}

/// Deletes the pod's egress interface (its host peer and the host route go with it).
pub async fn delete_link(pod: &NetNs, ifname: &str) -> Result<(), EgressApplyError> {
    let nl = pod.connect().await?;
    nl.delete_link_by_name(ifname).await?;
    Ok(())
}

/// Checks the live egress wiring: interface up with the address, host peer present.
pub async fn check_links(
    pod: &NetNs,
    ifname: &str,
    address: IpNet,
) -> Result<Vec<String>, EgressApplyError> {
    let nl = pod.connect().await?;
    let mut drift = Vec::new();
    match nl.link_by_name(ifname).await? {
        None => drift.push(format!("{ifname} missing in the pod")),
        Some(link) => {
            if !link.up {
                drift.push(format!("{ifname} is down"));
            }
            let has = nl
                .addresses(Some(link.index))
                .await?
                .iter()
                .any(|a| a.prefix.addr() == address.addr());
            if !has {
                drift.push(format!("{ifname} lacks {address}"));
            }
        }
    }
    Ok(drift)
}

/// Opens `CNI_NETNS`.
pub fn open_netns(path: &Path) -> Result<NetNs, EgressApplyError> {
    Ok(NetNs::open(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_s_lines_split_with_quoted_comments() {
        assert_eq!(
            split_rule(
                r#"-s 169.254.172.2/32 -m comment --comment "name: \"aws-cni\" id: \"c1\"" -j CNI-E4-x"#
            ),
            [
                "-s",
                "169.254.172.2/32",
                "-m",
                "comment",
                "--comment",
                r#"name: "aws-cni" id: "c1""#,
                "-j",
                "CNI-E4-x"
            ]
        );
    }
}
