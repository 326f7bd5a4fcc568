//! The CNI success result and its wire shape in every spec version, as the reference CNI library
//! (containernetworking/cni v1.3.0, `pkg/types/{020,040,100}`) writes and reads it: 0.1.0/0.2.0
//! `ip4`/`ip6`, 0.3.x/0.4.0 `ips[].version` and an always-present `dns`, 1.x without either; and
//! the conversions between them. Owns only the wire shape; what the result contains is decided by
//! the commands. Must not: decide the result's content.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::netconf::{CniVersion, ResultShape};
/// An interface of the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC address (for the VLAN marker interface: the VLAN id).
    #[serde(default)]
    pub mac: String,
    /// Netns path for container interfaces (for the marker: the ENI device number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// An IP configuration of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// Address with prefix.
    pub address: IpNet,
    /// Gateway.
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    pub interface: Option<usize>,
}

/// A route of the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    /// Destination.
    pub dst: IpNet,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

/// A CNI result (also the parsed `prevResult`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CniResult {
    /// Interfaces.
    pub interfaces: Vec<Interface>,
    /// IP configurations.
    pub ips: Vec<IpConfig>,
    /// Routes.
    pub routes: Vec<RouteEntry>,
}

/// `prevResult` as handed to DEL/CHECK.
pub type PrevResult = CniResult;

impl CniResult {
    /// Reads a result in the 0.3/0.4/1.x shape (`ips`).
    pub fn from_value(v: serde_json::Value) -> Result<Self, serde_json::Error> {
        Self::from_versioned(v, CniVersion::LATEST)
    }

    /// Reads a result (a `prevResult`) in the shape of `version`, as the library's creator for
    /// that version does (0.1.0/0.2.0: `ip4`/`ip6`, their routes merged, no interfaces).
    pub fn from_versioned(
        v: serde_json::Value,
        version: CniVersion,
    ) -> Result<Self, serde_json::Error> {
        let wire = WireResult::from_value(v, version)?;
        Ok(Self {
            interfaces: wire
                .interfaces
                .into_iter()
                .map(|i| Interface {
                    name: i.name,
                    mac: i.mac,
                    sandbox: (!i.sandbox.is_empty()).then_some(i.sandbox),
                })
                .collect(),
            ips: wire
                .ips
                .into_iter()
                .map(|ip| IpConfig {
                    address: ip.address,
                    gateway: ip.gateway,
                    interface: ip.interface,
                })
                .collect(),
            routes: wire
                .routes
                .into_iter()
                .map(|r| RouteEntry {
                    dst: r.dst,
                    gw: r.gw,
                })
                .collect(),
        })
    }

    /// The result JSON in `version`'s shape. In 0.1.0/0.2.0 only the first IPv4 and the first
    /// IPv6 address fit; a result without any address cannot be written there (the library
    /// refuses), see [`CniResult::try_to_json`]; this writes `{"cniVersion":..,"dns":{}}` then.
    #[must_use]
    pub fn to_json(&self, version: CniVersion) -> String {
        self.try_to_json(version).unwrap_or_else(|_| {
            serde_json::json!({"cniVersion": version.as_str(), "dns": {}}).to_string()
        })
    }

    /// The result JSON in `version`'s shape, or why it has none.
    pub fn try_to_json(&self, version: CniVersion) -> Result<String, ConvertError> {
        self.to_wire().to_json(version)
    }

    fn to_wire(&self) -> WireResult {
        WireResult {
            interfaces: self
                .interfaces
                .iter()
                .map(|i| WireInterface {
                    name: i.name.clone(),
                    mac: i.mac.clone(),
                    sandbox: i.sandbox.clone().unwrap_or_default(),
                    ..WireInterface::default()
                })
                .collect(),
            ips: self
                .ips
                .iter()
                .map(|ip| WireIp {
                    interface: ip.interface,
                    address: ip.address,
                    gateway: ip.gateway,
                })
                .collect(),
            routes: self
                .routes
                .iter()
                .map(|r| WireRoute {
                    dst: r.dst,
                    gw: r.gw,
                    ..WireRoute::new(r.dst)
                })
                .collect(),
            dns: Dns::default(),
        }
    }
}

/// Why a result has no form in the requested version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// 0.1.0/0.2.0 results need at least one address (the library's "cannot convert: no valid
    /// IP addresses").
    #[error("cannot convert: no valid IP addresses")]
    NoAddress,
}

/// A result in the library's model: every field its types carry (the 1.x ones), so a result
/// read in one version and written in another loses only what the target shape cannot hold.
/// Used as is by pass-through plugins (egress-cni) that hand `prevResult` on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WireResult {
    /// Interfaces.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub interfaces: Vec<WireInterface>,
    /// Addresses.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ips: Vec<WireIp>,
    /// Routes.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub routes: Vec<WireRoute>,
    /// DNS.
    #[serde(default)]
    pub dns: Dns,
}

/// An interface (1.x fields; 0.3/0.4 carry only name, mac, sandbox).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireInterface {
    /// Name.
    pub name: String,
    /// MAC.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// MTU (1.x).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: i64,
    /// Sandbox.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    /// Socket path (1.x).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    /// PCI id (1.x).
    #[serde(default, rename = "pciID", skip_serializing_if = "String::is_empty")]
    pub pci_id: String,
}

/// An address (0.3/0.4 add `version`, derived from the address family when written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireIp {
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
    /// Address with prefix.
    pub address: IpNet,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

/// A route (0.1/0.2 carry only `dst` and `gw`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireRoute {
    /// Destination.
    pub dst: IpNet,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    /// MTU.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: i64,
    /// Advertised MSS.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub advmss: i64,
    /// Priority.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i64,
    /// Route table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<i64>,
    /// Scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<i64>,
}

impl WireRoute {
    fn new(dst: IpNet) -> Self {
        Self {
            dst,
            gw: None,
            mtu: 0,
            advmss: 0,
            priority: 0,
            table: None,
            scope: None,
        }
    }
}

/// DNS settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub nameservers: Vec<String>,
    /// Domain.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// Search domains.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub search: Vec<String>,
    /// Options.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub options: Vec<String>,
}

impl Dns {
    fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(v: &i64) -> bool {
    *v == 0
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// 0.1.0/0.2.0 address block.
#[derive(Serialize, Deserialize)]
struct V02Ip {
    ip: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    routes: Vec<V02Route>,
}

/// 0.1.0/0.2.0 route: the library keeps only `dst` and `gw` when writing this shape.
#[derive(Serialize, Deserialize)]
struct V02Route {
    dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gw: Option<IpAddr>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V02Wire {
    #[serde(default, skip_deserializing)]
    cni_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip4: Option<V02Ip>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip6: Option<V02Ip>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Serialize)]
struct V04Interface<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    mac: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    sandbox: &'a str,
}

#[derive(Serialize)]
struct V04Ip {
    version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
    address: IpNet,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct V04Wire<'a> {
    cni_version: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<V04Interface<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ips: Vec<V04Ip>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    routes: &'a [WireRoute],
    // A struct under `omitempty` is never omitted by Go's encoder: 0.4 results always carry it.
    dns: &'a Dns,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct V1Wire<'a> {
    cni_version: &'static str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    interfaces: &'a [WireInterface],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    ips: &'a [WireIp],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    routes: &'a [WireRoute],
    // types100.Result.MarshalJSON drops an empty dns.
    #[serde(skip_serializing_if = "Dns::is_empty")]
    dns: &'a Dns,
}

fn family(net: &IpNet) -> &'static str {
    if net.addr().is_ipv4() { "4" } else { "6" }
}

impl WireResult {
    /// Reads a result in `version`'s shape.
    pub fn from_value(
        v: serde_json::Value,
        version: CniVersion,
    ) -> Result<Self, serde_json::Error> {
        if version.result_shape() != ResultShape::V02 {
            return serde_json::from_value(v);
        }
        // convertFrom02x: ip4 then ip6, each block's routes in that order, no interfaces.
        let old: V02Wire = serde_json::from_value(v)?;
        let mut out = Self {
            dns: old.dns,
            ..Self::default()
        };
        for block in [old.ip4, old.ip6].into_iter().flatten() {
            out.ips.push(WireIp {
                interface: None,
                address: block.ip,
                gateway: block.gateway,
            });
            out.routes
                .extend(block.routes.into_iter().map(|r| WireRoute {
                    gw: r.gw,
                    ..WireRoute::new(r.dst)
                }));
        }
        Ok(out)
    }

    /// The result JSON in `version`'s shape.
    pub fn to_json(&self, version: CniVersion) -> Result<String, ConvertError> {
        let text = match version.result_shape() {
            ResultShape::V1 => serde_json::to_string(&V1Wire {
                cni_version: version.as_str(),
                interfaces: &self.interfaces,
                ips: &self.ips,
                routes: &self.routes,
                dns: &self.dns,
            }),
            ResultShape::V04 => serde_json::to_string(&V04Wire {
                cni_version: version.as_str(),
                interfaces: self
                    .interfaces
                    .iter()
                    .map(|i| V04Interface {
                        name: &i.name,
                        mac: &i.mac,
                        sandbox: &i.sandbox,
                    })
                    .collect(),
                ips: self
                    .ips
                    .iter()
                    .map(|ip| V04Ip {
                        version: family(&ip.address),
                        interface: ip.interface,
                        address: ip.address,
                        gateway: ip.gateway,
                    })
                    .collect(),
                routes: &self.routes,
                dns: &self.dns,
            }),
            ResultShape::V02 => serde_json::to_string(&self.to_v02(version)?),
        };
        // Serializing these plain structs cannot fail.
        Ok(text.unwrap_or_default())
    }

    /// convertTo02x: the first IPv4 and the first IPv6 address; each route goes to the block
    /// of its destination's family, if that block exists.
    fn to_v02(&self, version: CniVersion) -> Result<V02Wire, ConvertError> {
        let block = |v4: bool| {
            self.ips
                .iter()
                .find(|ip| ip.address.addr().is_ipv4() == v4)
                .map(|ip| V02Ip {
                    ip: ip.address,
                    gateway: ip.gateway,
                    routes: self
                        .routes
                        .iter()
                        .filter(|r| r.dst.addr().is_ipv4() == v4)
                        .map(|r| V02Route {
                            dst: r.dst,
                            gw: r.gw,
                        })
                        .collect(),
                })
        };
        let (ip4, ip6) = (block(true), block(false));
        if ip4.is_none() && ip6.is_none() {
            return Err(ConvertError::NoAddress);
        }
        Ok(V02Wire {
            cni_version: version.as_str().to_owned(),
            ip4,
            ip6,
            dns: self.dns.clone(),
        })
    }
}

/// The VERSION answer.
#[must_use]
pub fn version_json(version: CniVersion) -> String {
    serde_json::json!({
        "cniVersion": version.as_str(),
        "supportedVersions": super::netconf::SUPPORTED_VERSIONS,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface {
                    name: "eni1234".into(),
                    mac: "02:00:00:00:00:01".into(),
                    sandbox: None,
                },
                Interface {
                    name: "eth0".into(),
                    mac: "02:00:00:00:00:02".into(),
                    sandbox: Some("/var/run/netns/p".into()),
                },
            ],
            ips: vec![IpConfig {
                address: "198.18.0.5/32".parse().unwrap(),
                gateway: Some("169.254.1.1".parse().unwrap()),
                interface: Some(1),
            }],
            routes: vec![RouteEntry {
                dst: "0.0.0.0/0".parse().unwrap(),
                gw: Some("169.254.1.1".parse().unwrap()),
            }],
        }
    }

    /// What the CNI library (containernetworking/cni v1.3.0) prints for the same result in
    /// each version: pkg/types/100/types.go (1.x: no ips[].version, empty dns dropped by
    /// Result.MarshalJSON), pkg/types/040/types.go (0.3.x/0.4.0: ips[].version from the address
    /// family, dns always present: a struct under omitempty), pkg/types/020/types.go via
    /// 040's convertTo02x (0.1.0/0.2.0: ip4/ip6 with routes by family, no interfaces).
    #[test]
    fn result_shape_of_every_version_is_the_librarys() {
        let v1 = |v: &str| {
            serde_json::json!({"cniVersion": v,
                "interfaces": [{"name": "eni1234", "mac": "02:00:00:00:00:01"},
                               {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/p"}],
                "ips": [{"interface": 1, "address": "198.18.0.5/32", "gateway": "169.254.1.1"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]})
        };
        let v04 = |v: &str| {
            serde_json::json!({"cniVersion": v,
                "interfaces": [{"name": "eni1234", "mac": "02:00:00:00:00:01"},
                               {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/p"}],
                "ips": [{"version": "4", "interface": 1, "address": "198.18.0.5/32", "gateway": "169.254.1.1"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}],
                "dns": {}})
        };
        let v02 = |v: &str| {
            serde_json::json!({"cniVersion": v,
                "ip4": {"ip": "198.18.0.5/32", "gateway": "169.254.1.1",
                        "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]},
                "dns": {}})
        };
        let table = [
            (CniVersion::V0_1_0, v02("0.1.0")),
            (CniVersion::V0_2_0, v02("0.2.0")),
            (CniVersion::V0_3_0, v04("0.3.0")),
            (CniVersion::V0_3_1, v04("0.3.1")),
            (CniVersion::V0_4_0, v04("0.4.0")),
            (CniVersion::V1_0_0, v1("1.0.0")),
            (CniVersion::V1_1_0, v1("1.1.0")),
        ];
        let r = sample();
        for (version, want) in table {
            let got: serde_json::Value = serde_json::from_str(&r.to_json(version)).unwrap();
            assert_eq!(got, want, "{version:?}");
            // Read back in the same version: 0.2 loses interfaces and the ip's interface index.
            let back = CniResult::from_versioned(got, version).unwrap();
            if version.result_shape() == ResultShape::V02 {
                assert!(back.interfaces.is_empty());
                assert_eq!(back.ips[0].address, r.ips[0].address);
                assert_eq!(back.ips[0].interface, None);
                assert_eq!(back.routes, r.routes);
            } else {
                assert_eq!(back, r, "{version:?}");
            }
        }
    }

    /// convertTo02x keeps the first address of each family and sorts routes by the family of
    /// their destination; with no address at all there is no 0.2.0 result.
    #[test]
    fn v02_takes_first_address_per_family_and_refuses_none() {
        let wire = WireResult {
            ips: vec![
                WireIp {
                    interface: None,
                    address: "198.18.0.5/32".parse().unwrap(),
                    gateway: None,
                },
                WireIp {
                    interface: None,
                    address: "fd00::5/128".parse().unwrap(),
                    gateway: Some("fe80::1".parse().unwrap()),
                },
                WireIp {
                    interface: None,
                    address: "198.18.0.6/32".parse().unwrap(),
                    gateway: None,
                },
            ],
            routes: vec![
                WireRoute {
                    mtu: 1400,
                    ..WireRoute::new("::/0".parse().unwrap())
                },
                WireRoute::new("10.0.0.0/8".parse().unwrap()),
            ],
            ..WireResult::default()
        };
        let got: serde_json::Value =
            serde_json::from_str(&wire.to_json(CniVersion::V0_2_0).unwrap()).unwrap();
        assert_eq!(
            got,
            serde_json::json!({"cniVersion": "0.2.0",
                "ip4": {"ip": "198.18.0.5/32", "routes": [{"dst": "10.0.0.0/8"}]},
                "ip6": {"ip": "fd00::5/128", "gateway": "fe80::1", "routes": [{"dst": "::/0"}]},
                "dns": {}})
        );
        assert_eq!(
            WireResult::default().to_json(CniVersion::V0_1_0),
            Err(ConvertError::NoAddress)
        );
        // 1.x keeps every route field and drops the empty dns; 0.4 keeps route fields too.
        let v1: serde_json::Value =
            serde_json::from_str(&wire.to_json(CniVersion::V1_0_0).unwrap()).unwrap();
        assert_eq!(
            v1["routes"][0],
            serde_json::json!({"dst": "::/0", "mtu": 1400})
        );
        assert!(v1.get("dns").is_none());
        let v04: serde_json::Value =
            serde_json::from_str(&wire.to_json(CniVersion::V0_4_0).unwrap()).unwrap();
        assert_eq!(v04["ips"][1]["version"], "6");
        assert_eq!(v04["routes"][0]["mtu"], 1400);
    }

    /// A 0.2.0 prevResult is read as convertFrom02x does: ip4 then ip6, routes of both.
    #[test]
    fn v02_prev_result_is_read() {
        let prev = serde_json::json!({"cniVersion": "0.2.0",
            "ip4": {"ip": "198.18.0.5/32", "gateway": "169.254.1.1", "routes": [{"dst": "0.0.0.0/0"}]},
            "ip6": {"ip": "fd00::5/128"},
            "dns": {"nameservers": ["10.0.0.2"]}});
        let wire = WireResult::from_value(prev, CniVersion::V0_2_0).unwrap();
        assert_eq!(wire.ips.len(), 2);
        assert_eq!(wire.ips[1].address, "fd00::5/128".parse::<IpNet>().unwrap());
        assert_eq!(wire.routes.len(), 1);
        assert_eq!(wire.dns.nameservers, vec!["10.0.0.2".to_owned()]);
        // Written as 1.1.0 the dns is kept (not empty) and the interfaces stay absent.
        let v11: serde_json::Value =
            serde_json::from_str(&wire.to_json(CniVersion::V1_1_0).unwrap()).unwrap();
        assert_eq!(v11["dns"]["nameservers"][0], "10.0.0.2");
        assert!(v11.get("interfaces").is_none());
    }
}
