//! The CNI result of a wired pod ([`PodNetworkPlan::result_with`], the layout every plugin that may
//! run on the node reads back) and its marker interface (`dummy<hash>`), whose `mac` records the
//! VLAN id ([`MarkerSpelling`]) that DEL and CHECK read back from prevResult ([`marker_vlan`]).
//! Must not: decide the wiring, or serialise the result (`spec::result` writes each CNI version's
//! shape).

use dataplane::MacAddr;

use super::PodNetworkPlan;
use super::interface::any_of;
use crate::spec::{CniEnv, CniResult, Interface, IpConfig, RouteEntry};

/// How the result's marker interface (`dummy<hash>`) writes the VLAN id in its `mac`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerSpelling {
    /// A bare decimal (`"0"`, `"7"`), for kubelet's pods (`K8S_POD_NAME` and `K8S_POD_NAMESPACE`
    /// given): a plugin that reads it with `Atoi` on DEL fails the DEL of any pod whose marker does
    /// not parse, so a node rolled back to such a plugin needs it.
    Decimal,
    /// MAC-shaped (`00:00:00:00:0f:a0` for 4000), for runtimes without a pod identity (podman,
    /// ctr): podman parses every interface's `mac` and refuses a bare number; a plugin that looks
    /// the marker up by pod name never reads these.
    MacShaped,
}

impl MarkerSpelling {
    /// Decimal with a kubelet pod identity, MAC-shaped without.
    #[must_use]
    pub fn for_env(env: &CniEnv) -> Self {
        if env.k8s.has_pod() {
            Self::Decimal
        } else {
            Self::MacShaped
        }
    }

    /// The marker's `mac` for `vlan_id` (0 for a pod that is not a branch-ENI pod).
    #[must_use]
    pub fn mac(self, vlan_id: u16) -> String {
        match self {
            Self::Decimal => vlan_id.to_string(),
            Self::MacShaped => vlan_marker_mac(vlan_id).to_string(),
        }
    }
}

/// The marker interface's `mac` for a VLAN id: MAC-shaped (`00:00:00:00:0f:a0` for 4000) because
/// runtimes that parse MACs (podman) refuse a bare number.
#[must_use]
pub fn vlan_marker_mac(vlan_id: u16) -> MacAddr {
    let [hi, lo] = vlan_id.to_be_bytes();
    MacAddr([0, 0, 0, 0, hi, lo])
}

/// The VLAN id a result's marker interface (`dummy...`) records: MAC-shaped or a bare decimal
/// number. `None` without a marker or when it does not parse; `Some(0)` for a pod that is not a
/// branch-ENI pod.
#[must_use]
pub fn marker_vlan(result: &CniResult) -> Option<u16> {
    let marker = result
        .interfaces
        .iter()
        .find(|i| i.name.starts_with("dummy"))?;
    if let Ok(n) = marker.mac.parse::<u16>() {
        return Some(n);
    }
    let mac = marker.mac.parse::<MacAddr>().ok()?;
    match mac.0 {
        [0, 0, 0, 0, hi, lo] => Some(u16::from_be_bytes([hi, lo])),
        _ => None,
    }
}

/// Name of the marker interface in results (`dummy` + the host veth's hash part).
#[must_use]
pub fn vlan_marker_name(host_veth: &str) -> String {
    let hash = host_veth
        .get(host_veth.len().saturating_sub(11)..)
        .unwrap_or(host_veth);
    format!("dummy{hash}")
}

impl PodNetworkPlan {
    /// The CNI result: host veth, container interface, and the VLAN marker interface whose
    /// `sandbox` is the ENI device number, and whose `mac` carries the VLAN id (0 but for a
    /// branch-ENI pod, whose marker has no `sandbox`) spelled as [`MarkerSpelling`] says.
    #[must_use]
    pub fn result(&self, host_mac: MacAddr, container_mac: MacAddr, netns: &str) -> CniResult {
        self.result_with(&[(host_mac, container_mac)], netns)
    }

    /// The CNI result of a pod with one or more interfaces (`macs`: host and container MAC of each,
    /// in [`Self::interfaces`] order): host veth and container interface of each in turn, then the
    /// marker; each address on its container interface (`interface` 1, 3, 5, ...). Only the first
    /// interface's routes are the pod's defaults (the others route through their own tables).
    #[must_use]
    pub fn result_with(&self, macs: &[(MacAddr, MacAddr)], netns: &str) -> CniResult {
        // A branch-ENI pod (never multi-card) has a marker carrying its VLAN id and no device
        // number, and its address the branch subnet's gateway.
        let (marker_mac, marker_sandbox) = match &self.branch {
            Some(b) => (self.marker.mac(b.vlan_id), None),
            None => (
                self.marker.mac(0),
                Some(self.interface.device_number.to_string()),
            ),
        };
        let mut interfaces = Vec::new();
        let mut ips = Vec::new();
        for (i, (plan, (host_mac, container_mac))) in self.interfaces().zip(macs).enumerate() {
            interfaces.push(Interface {
                name: plan.host_veth.clone(),
                mac: host_mac.to_string(),
                sandbox: None,
            });
            interfaces.push(Interface {
                name: plan.container_ifname.clone(),
                mac: container_mac.to_string(),
                sandbox: Some(netns.to_owned()),
            });
            ips.extend(plan.addresses().iter().map(|a| IpConfig {
                address: a.address,
                gateway: Some(self.branch.as_ref().map_or(a.gateway, |b| b.subnet_gateway)),
                interface: Some(2 * i + 1),
            }));
        }
        interfaces.push(Interface {
            name: vlan_marker_name(&self.interface.host_veth),
            mac: marker_mac,
            sandbox: marker_sandbox,
        });
        CniResult {
            interfaces,
            ips,
            routes: self
                .interface
                .addresses()
                .iter()
                .map(|a| RouteEntry {
                    dst: any_of(a.gateway),
                    gw: Some(a.gateway),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{mk_conf, mk_env, mk_reply, plan_reply};
    use super::*;

    /// Upstream writes the VLAN id as a bare number, we MAC-shaped: DEL reads both.
    #[test]
    fn marker_vlan_reads_both_spellings() {
        let with = |mac: &str| CniResult {
            interfaces: vec![Interface {
                name: "dummyabc".into(),
                mac: mac.into(),
                sandbox: None,
            }],
            ips: Vec::new(),
            routes: Vec::new(),
        };
        assert_eq!(marker_vlan(&with("7")), Some(7));
        assert_eq!(marker_vlan(&with("0")), Some(0));
        assert_eq!(marker_vlan(&with("00:00:00:00:0f:a0")), Some(4000));
        assert_eq!(marker_vlan(&with("02:00:00:00:00:01")), None);
    }

    #[test]
    fn result_has_marker_interface() {
        let plan = plan_reply(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        let r = plan.result(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            "/ns",
        );
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[2].name, "dummyc440f455693");
        // upstream's Atoi-able spelling for kubelet's pods (a node rolled back to upstream
        // deletes them), MAC-shaped without a pod identity (podman parses MACs)
        assert_eq!(r.interfaces[2].mac, "0");
        assert_eq!(r.interfaces[2].sandbox.as_deref(), Some("1"));
        assert_eq!(r.ips[0].interface, Some(1));
        assert_eq!(marker_vlan(&r), Some(0));
        let podman = plan_reply(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(false),
        )
        .unwrap()
        .result(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            "/ns",
        );
        assert_eq!(podman.interfaces[2].mac, "00:00:00:00:00:00");
        assert_eq!(marker_vlan(&podman), Some(0));
        assert_eq!(
            (
                MarkerSpelling::Decimal.mac(4000),
                MarkerSpelling::MacShaped.mac(4000)
            ),
            ("4000".to_owned(), "00:00:00:00:0f:a0".to_owned())
        );
    }
}
