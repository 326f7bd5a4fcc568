//! Names and fixed addresses of the simulated fabric: namespace names per run, interface names,
//! the IMDS / EC2 endpoint / internet addresses. Owns no kernel state; must not touch anything.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Every namespace the simulator creates starts with this.
pub const NS_PREFIX: &str = "vsim";
/// Directory of run pid files (`<run id>.pid`), used to tell live runs from crashed ones.
pub const RUN_DIR: &str = "/run/vpcsim";
/// Where `ip netns add` mounts named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// IMDS address, on every node namespace's `lo`.
pub const IMDS_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// IMDS port.
pub const IMDS_PORT: u16 = 80;
/// EC2 endpoint address, on every node namespace's `lo` (not an AWS address; link-local).
pub const EC2_ENDPOINT_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 200);
/// EC2 endpoint port inside node namespaces.
pub const EC2_ENDPOINT_PORT: u16 = 80;

/// Kubernetes API relay address, on every node namespace's `lo` (link-local, like the EC2
/// endpoint); the relay forwards to kubesim when the fabric is configured with one.
pub const KUBE_API_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 201);
/// Kubernetes API relay port.
pub const KUBE_API_PORT: u16 = 443;

/// The Kubernetes API URL inside every node namespace (kubesim's certificate carries the
/// address as a SAN).
pub fn kube_api_url() -> String {
    format!("https://{KUBE_API_ADDR}:{KUBE_API_PORT}")
}

/// The router's address on the internet-gateway link.
pub const IGW_ROUTER_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The internet namespace's address on the internet-gateway link.
pub const IGW_INTERNET_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// Prefix length of the internet-gateway link.
pub const IGW_PREFIX_LEN: u8 = 24;
/// A host "on the internet": answers ping, runs a TCP echo service.
pub const INTERNET_HOST_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// TCP echo port on the internet host.
pub const INTERNET_ECHO_PORT: u16 = 7;
/// The whole simulated private range; the internet namespace routes it back to the router.
pub const SIM_PRIVATE_RANGE: &str = "198.18.0.0/15";

/// The router's IPv6 address on the internet-gateway link (documentation range, outside any VPC
/// the simulator builds by default).
pub const IGW6_ROUTER_ADDR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0xff00, 0, 0, 0, 1);
/// The internet namespace's IPv6 address on the internet-gateway link.
pub const IGW6_INTERNET_ADDR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0xff00, 0, 0, 0, 2);
/// Prefix length of the internet-gateway link's IPv6 addresses.
pub const IGW6_PREFIX_LEN: u8 = 64;
/// The IPv6 host "on the internet", behind the egress-only internet gateway: answers ping6 and
/// runs the TCP echo service on [`INTERNET_ECHO_PORT`].
pub const INTERNET_HOST_ADDR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0x10);
/// The VPC router's IPv6 address on every ENI port (link-local, as the VPC's default router is):
/// the next hop of a node's IPv6 default route.
pub const IPV6_GATEWAY: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
// EC2's other IPv6 address of the subnet router, answered on every ENI link as well
// (`fe80:ec2::1`, what ipamd routes secondary ENI tables through), is the datapath's
// convention: `dataplane::conventions::ENI_GATEWAY_V6`.

/// Router-side name of the internet-gateway veth.
pub const IGW_ROUTER_DEV: &str = "igw";
/// Internet-side name of the internet-gateway veth.
pub const IGW_INTERNET_DEV: &str = "vpc";
/// Prefix of router-side ENI ports (`vp` + 12 characters of the ENI id).
pub const ENI_PORT_PREFIX: &str = "vp";
/// Prefix of router-side branch ports (`vb` + 12 characters of the branch ENI id): 802.1Q
/// sub-interfaces of a trunk ENI's port, one per branch ENI.
pub const BRANCH_PORT_PREFIX: &str = "vb";
/// MTU of every ENI link (EC2's jumbo frames).
pub const ENI_MTU: u32 = 9001;

/// IMDS URL inside every node namespace.
pub fn imds_url() -> String {
    format!("http://{IMDS_ADDR}:{IMDS_PORT}")
}

/// EC2 endpoint URL inside every node namespace.
pub fn ec2_endpoint_url() -> String {
    format!("http://{EC2_ENDPOINT_ADDR}:{EC2_ENDPOINT_PORT}")
}

/// Dummy static credentials for SDK clients talking to the simulator (it does not check
/// signatures).
pub const ACCESS_KEY_ID: &str = "AKIAVPCSIMEXAMPLE";
/// See [`ACCESS_KEY_ID`].
pub const SECRET_ACCESS_KEY: &str = "vpcsim-secret";

/// The environment that points an AWS SDK client (ipamd) running inside node namespace `netns`
/// at the simulator: EC2 endpoint and IMDS on the node's `lo`, region, static credentials,
/// `ENABLE_IPv4=true` (ipamd's code default is false; upstream's manifest and our chart set it),
/// plus `VPCSIM_NETNS` / `VPCSIM_INSTANCE_ID` for scripts.
pub fn node_env(region: &str, netns: &str, instance_id: &str) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL_EC2", ec2_endpoint_url()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds_url()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv4".to_owned()),
        ("AWS_REGION", region.to_owned()),
        ("AWS_DEFAULT_REGION", region.to_owned()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.to_owned()),
        ("ENABLE_IPv4", "true".to_owned()),
        ("VPCSIM_NETNS", netns.to_owned()),
        ("VPCSIM_INSTANCE_ID", instance_id.to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Names of one run's namespaces: `vsim<run id>-vpc`, `vsim<run id>-inet`,
/// `vsim<run id>-<instance id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunNames {
    run_id: String,
}

impl RunNames {
    /// Names for the run `run_id` (short, `[0-9a-z]`, no `-`).
    pub fn new(run_id: impl Into<String>) -> Self {
        Self {
            run_id: run_id.into(),
        }
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Prefix shared by all namespaces of this run.
    pub fn prefix(&self) -> String {
        format!("{NS_PREFIX}{}-", self.run_id)
    }

    /// The VPC router namespace.
    pub fn router_ns(&self) -> String {
        format!("{}vpc", self.prefix())
    }

    /// The internet namespace.
    pub fn internet_ns(&self) -> String {
        format!("{}inet", self.prefix())
    }

    /// The node namespace of an instance.
    pub fn node_ns(&self, instance_id: &str) -> String {
        format!("{}{instance_id}", self.prefix())
    }

    /// The instance id of a node namespace of this run, if `ns` is one.
    pub fn instance_of_ns<'a>(&self, ns: &'a str) -> Option<&'a str> {
        let rest = ns.strip_prefix(&self.prefix())?;
        rest.starts_with("i-").then_some(rest)
    }

    /// Pid file of this run.
    pub fn pid_file(&self) -> std::path::PathBuf {
        std::path::Path::new(RUN_DIR).join(format!("{}.pid", self.run_id))
    }
}

/// Run id of a namespace created by any simulator run (`vsim<id>-...`).
pub fn run_id_of_ns(ns: &str) -> Option<&str> {
    let rest = ns.strip_prefix(NS_PREFIX)?;
    let (id, _) = rest.split_once('-')?;
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric())).then_some(id)
}

/// Router-side port name of an ENI: `vp` + the last 12 characters of its id.
pub fn eni_port(eni_id: &str) -> String {
    format!("{ENI_PORT_PREFIX}{}", id_tail(eni_id))
}

/// Router-side port name of a branch ENI (a VLAN sub-interface of its trunk's port): `vb` +
/// the last 12 characters of its id.
pub fn branch_port(eni_id: &str) -> String {
    format!("{BRANCH_PORT_PREFIX}{}", id_tail(eni_id))
}

/// True for the router links the fabric manages routes and neighbours on (ENI and branch
/// ports).
pub fn is_managed_port(dev: &str) -> bool {
    dev.starts_with(ENI_PORT_PREFIX) || dev.starts_with(BRANCH_PORT_PREFIX)
}

fn id_tail(eni_id: &str) -> String {
    let id = eni_id.strip_prefix("eni-").unwrap_or(eni_id);
    id.chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .take(12)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

/// Node-side name of an ENI: `eth<device index>`.
pub fn eni_dev(device_index: u32) -> String {
    format!("eth{device_index}")
}

/// A fresh run id: 6 base-36 characters from the pid and the clock.
pub fn fresh_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut x = nanos ^ (u128::from(std::process::id()) << 40) ^ (u128::from(n) << 90);
    // splitmix-style scramble so consecutive ids differ in every character
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    x ^= x >> 64;
    let alphabet = b"0123456789abcdefghijklmnopqrstuvwxyz";
    (0..6)
        .map(|i| char::from(alphabet[usize::try_from((x >> (i * 6)) % 36).unwrap_or(0)]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_round_trip() {
        let n = RunNames::new("ab12cd");
        assert_eq!(n.router_ns(), "vsimab12cd-vpc");
        let ns = n.node_ns("i-0123456789abcdef0");
        assert_eq!(n.instance_of_ns(&ns), Some("i-0123456789abcdef0"));
        assert_eq!(n.instance_of_ns(&n.router_ns()), None);
        assert_eq!(run_id_of_ns(&ns), Some("ab12cd"));
        assert_eq!(run_id_of_ns("vsim-x"), None);
        assert_eq!(run_id_of_ns("other"), None);
        let port = eni_port("eni-0123456789abcdef0");
        assert_eq!(port, "vp56789abcdef0");
        assert!(port.len() <= 15);
        assert_eq!(eni_port("eni-1"), "vp1");
        assert_eq!(eni_dev(3), "eth3");
    }

    #[test]
    fn run_ids_are_short_and_distinct() {
        let a = fresh_run_id();
        let b = fresh_run_id();
        assert_eq!(a.len(), 6);
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
