//! The only place the datapath's numbers and names live: host veth naming, route-table ids per ENI,
//! ip-rule priorities, link-local gateways and MTU bounds. Pure functions. Why: these are what
//! existing nodes carry, so a node can change CNI with pods running; a value changed here strands
//! every pod wired before.

use std::net::{Ipv4Addr, Ipv6Addr};

use sha1::{Digest, Sha1};

/// Gateway every IPv4 pod routes through (interface index 0); the host veth answers for it via
/// a permanent neighbour entry in the pod.
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// IPv6 pod gateway (interface index 0).
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// The VPC router's IPv6 address EC2 answers on every ENI link (`fe80:ec2::1`): the next hop of an
/// ENI route table's IPv6 default route.
pub const ENI_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0x0ec2, 0, 0, 0, 0, 0, 1);

/// Priority of a branch-ENI pod's `iif <link> lookup <vlan table>` rules (security groups for pods,
/// strict mode).
pub const VLAN_RULE_PRIORITY: u32 = 10;
/// Host veth prefix of branch-ENI pods in strict mode (it opts those pods out of SNAT and of
/// Calico's workload interfaces); standard mode uses the configured prefix.
pub const STRICT_BRANCH_VETH_PREFIX: &str = "vlan";

/// Name of the 802.1Q link of the branch ENI with VLAN `vlan_id` (`vlan.eth.<id>`).
#[must_use]
pub fn branch_vlan_link_name(vlan_id: u16) -> String {
    format!("vlan.eth.{vlan_id}")
}

/// Route table of the branch ENI with VLAN `vlan_id` (`vlanID + 100`).
#[must_use]
pub fn branch_route_table(vlan_id: u16) -> u32 {
    u32::from(vlan_id) + 100
}

/// The VLAN id whose branch route table `table` is (`vlan id + 100`, 802.1Q ids 1..=4094), if
/// it is one. ENI tables never fall there (device + 1 on card 0, 10000 + 100 × card + device
/// beyond).
#[must_use]
pub fn branch_vlan_of_table(table: u32) -> Option<u16> {
    table
        .checked_sub(100)
        .and_then(|v| u16::try_from(v).ok())
        .filter(|v| (1..=4094).contains(v))
}

/// Multi-NIC pods: the pod's interface `index` (0 = `CNI_IFNAME`, then one per further network
/// card) routes through `169.254.1.<index + 1>`.
#[must_use]
pub fn pod_gateway_v4(index: u32) -> Ipv4Addr {
    Ipv4Addr::new(169, 254, 1, u8::try_from(index + 1).unwrap_or(u8::MAX))
}

/// Name of a multi-NIC pod's interface `index` > 0 in the pod (`mNicIf<index>`); interface 0 is
/// `CNI_IFNAME`.
#[must_use]
pub fn pod_interface_name(ifname: &str, index: u32) -> String {
    if index == 0 {
        ifname.to_owned()
    } else {
        format!("mNicIf{index}")
    }
}

/// Host veth of a multi-NIC pod's interface `index` (the pod name becomes `<pod>.<index>` for an
/// index > 0).
#[must_use]
pub fn host_veth_name_at(prefix: &str, namespace: &str, pod: &str, index: u32) -> String {
    if index == 0 {
        host_veth_name(prefix, namespace, pod)
    } else {
        host_veth_name(prefix, namespace, &format!("{pod}.{index}"))
    }
}

/// In a multi-NIC pod, priority of `from <address of interface index> lookup <index>`: an interface
/// other than the first routes by its own table, numbered as its index.
pub const POD_FROM_INTERFACE_RULE_PRIORITY: u32 = 1;

/// Priority of `to <podIP> lookup main`.
pub const TO_POD_RULE_PRIORITY: u32 = 512;
/// Priority of `fwmark <connmark> lookup main` (NodePort / replies via the primary ENI).
pub const CONNMARK_RULE_PRIORITY: u32 = 1024;
/// Priority of `to <AWS_EXTERNAL_SERVICE_CIDRS> lookup main`.
pub const EXTERNAL_SERVICE_RULE_PRIORITY: u32 = 1535;
/// Priority of `from <podIP> lookup <eni table>` for pods on secondary ENIs.
pub const FROM_POD_RULE_PRIORITY: u32 = 1536;
/// Priority of `from <ENI primary IP> lookup <eni table>` for each secondary ENI.
pub const ENI_PRIMARY_IP_RULE_PRIORITY: u32 = 32765;

/// The kernel's main routing table.
pub const MAIN_TABLE: u32 = 254;
/// The kernel's local routing table.
pub const LOCAL_TABLE: u32 = 255;
/// Priority of `lookup local` on a node with security groups for pods in strict mode: moved from 0
/// to below the VLAN rules, so branch pods' traffic crosses their branch ENI even towards the
/// node's own addresses.
pub const LOCAL_RULE_PRIORITY: u32 = 20;

/// Default host veth prefix (`AWS_VPC_K8S_CNI_VETHPREFIX`).
pub const DEFAULT_VETH_PREFIX: &str = "eni";
/// Default pod and ENI MTU (`AWS_VPC_ENI_MTU`, `POD_MTU`).
pub const DEFAULT_MTU: u32 = 9001;
/// Smallest MTU accepted for IPv4.
pub const MIN_MTU_V4: u32 = 576;
/// Smallest MTU accepted for IPv6.
pub const MIN_MTU_V6: u32 = 1280;
/// Largest MTU accepted.
pub const MAX_MTU: u32 = 9001;
/// Linux interface names are at most 15 bytes.
pub const MAX_IFNAME_LEN: usize = 15;
/// Hex characters of the sha1 used in a host veth name.
pub const VETH_HASH_LEN: usize = 11;
/// Longest veth prefix (`AWS_VPC_K8S_CNI_VETHPREFIX`): prefix and hash fit [`MAX_IFNAME_LEN`].
pub const MAX_VETH_PREFIX_LEN: usize = MAX_IFNAME_LEN - VETH_HASH_LEN;

/// Route table of the ENI with `device_number` on network card 0: the primary ENI (device 0)
/// uses `main`; secondary ENIs use `device_number + 1`.
#[must_use]
pub fn route_table_for_device(device_number: u32) -> u32 {
    if device_number == 0 {
        MAIN_TABLE
    } else {
        device_number + 1
    }
}

/// Route table of the ENI with `device_number` on `network_card`: card 0 as
/// [`route_table_for_device`], card N>0 uses `10000 + device_number + 100 * N`.
#[must_use]
pub fn route_table_for(device_number: u32, network_card: u32) -> u32 {
    if network_card == 0 {
        route_table_for_device(device_number)
    } else {
        10_000 + device_number + 100 * network_card
    }
}

/// Host-side veth name: `prefix` + first 11 hex chars of sha1(`"<namespace>.<pod>"`), the name
/// existing pods' veths carry, so a node can change CNI with pods running.
#[must_use]
pub fn host_veth_name(prefix: &str, namespace: &str, pod: &str) -> String {
    hashed_name(prefix, format!("{namespace}.{pod}").as_bytes())
}

/// Host-side veth name when the runtime passed no K8S pod args (e.g. `ctr run --cni`): derived
/// from the container id and interface name, stable for the container's lifetime.
#[must_use]
pub fn host_veth_name_for_container(prefix: &str, container_id: &str, ifname: &str) -> String {
    hashed_name(prefix, format!("cid.{container_id}.{ifname}").as_bytes())
}

fn hashed_name(prefix: &str, input: &[u8]) -> String {
    let digest = hex::encode(Sha1::digest(input));
    let mut name = String::with_capacity(prefix.len() + VETH_HASH_LEN);
    name.push_str(prefix);
    name.push_str(&digest[..VETH_HASH_LEN]);
    name
}

/// Why a veth prefix is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VethPrefixError {
    /// Longer than 4 characters (the name would exceed 15 bytes).
    #[error("veth prefix {0:?} is longer than 4 characters")]
    TooLong(String),
    /// `eth`, `vlan` and `lo` collide with ENI, VLAN and loopback names.
    #[error("veth prefix {0:?} is reserved (eth, vlan and lo are not allowed)")]
    Reserved(String),
    /// Empty, or characters the kernel would refuse in a name.
    #[error("veth prefix {0:?} must be 1-4 characters of [A-Za-z0-9_-]")]
    Invalid(String),
}

/// Validates `AWS_VPC_K8S_CNI_VETHPREFIX` / netconf `vethPrefix`: non-empty, alphanumeric, `-` or
/// `_`, at most [`MAX_VETH_PREFIX_LEN`] characters, not `eth`, `vlan` or `lo`.
pub fn validate_veth_prefix(prefix: &str) -> Result<(), VethPrefixError> {
    if prefix.is_empty()
        || !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(VethPrefixError::Invalid(prefix.to_owned()));
    }
    if prefix.len() > MAX_VETH_PREFIX_LEN {
        return Err(VethPrefixError::TooLong(prefix.to_owned()));
    }
    if matches!(prefix, "eth" | "vlan" | "lo") {
        return Err(VethPrefixError::Reserved(prefix.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_name_matches_upstream_hash() {
        // `echo -n default.nginx | sha1sum` = c440f455693b69cd...
        assert_eq!(host_veth_name("eni", "default", "nginx"), "enic440f455693");
    }

    #[test]
    fn container_fallback_differs_from_pod_name() {
        let a = host_veth_name_for_container("eni", "abc", "eth0");
        let b = host_veth_name_for_container("eni", "abc", "eth1");
        assert_ne!(a, b);
        assert_eq!(a, host_veth_name_for_container("eni", "abc", "eth0"));
    }

    #[test]
    fn route_tables() {
        assert_eq!(route_table_for(0, 0), MAIN_TABLE);
        assert_eq!(route_table_for(1, 0), 2);
        assert_eq!(route_table_for(2, 1), 10_102);
    }

    #[test]
    fn veth_prefix_rules() {
        assert!(validate_veth_prefix("eni").is_ok());
        assert!(validate_veth_prefix("abcd").is_ok());
        assert_eq!(
            validate_veth_prefix("abcde"),
            Err(VethPrefixError::TooLong("abcde".into()))
        );
        assert_eq!(
            validate_veth_prefix("eth"),
            Err(VethPrefixError::Reserved("eth".into()))
        );
        assert!(validate_veth_prefix("").is_err());
        assert!(validate_veth_prefix("a/b").is_err());
    }
}
