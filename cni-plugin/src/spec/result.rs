//! The CNI success result: its shape per spec version (0.4.0 adds `version` to each IP) and a
//! tolerant reader for `prevResult` in any of our versions. Owns only the wire shape; what the
//! result contains is decided by the commands.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::netconf::CniVersion;

/// An interface of the result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// MAC address (for the VLAN marker interface: the VLAN id, as upstream).
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

#[derive(Serialize, Deserialize)]
struct IpWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default, skip_deserializing)]
    cni_version: String,
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<IpWire>,
    #[serde(default)]
    routes: Vec<RouteEntry>,
    #[serde(default)]
    dns: serde_json::Map<String, serde_json::Value>,
}

impl CniResult {
    /// Reads a result of any supported version.
    pub fn from_value(v: serde_json::Value) -> Result<Self, serde_json::Error> {
        let wire: Wire = serde_json::from_value(v)?;
        Ok(Self {
            interfaces: wire.interfaces,
            ips: wire
                .ips
                .into_iter()
                .map(|ip| IpConfig {
                    address: ip.address,
                    gateway: ip.gateway,
                    interface: ip.interface,
                })
                .collect(),
            routes: wire.routes,
        })
    }

    /// The result JSON in `version`'s shape.
    #[must_use]
    pub fn to_json(&self, version: CniVersion) -> String {
        let wire = Wire {
            cni_version: version.as_str().to_owned(),
            interfaces: self.interfaces.clone(),
            ips: self
                .ips
                .iter()
                .map(|ip| IpWire {
                    version: (version == CniVersion::V0_4_0).then(|| {
                        if ip.address.addr().is_ipv4() {
                            "4"
                        } else {
                            "6"
                        }
                        .to_owned()
                    }),
                    address: ip.address,
                    gateway: ip.gateway,
                    interface: ip.interface,
                })
                .collect(),
            routes: self.routes.clone(),
            dns: serde_json::Map::new(),
        };
        serde_json::to_string(&wire).unwrap_or_default()
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

    #[test]
    fn shape_per_version_and_round_trip() {
        let r = sample();
        let v04: serde_json::Value = serde_json::from_str(&r.to_json(CniVersion::V0_4_0)).unwrap();
        assert_eq!(v04["cniVersion"], "0.4.0");
        assert_eq!(v04["ips"][0]["version"], "4");
        let v11: serde_json::Value = serde_json::from_str(&r.to_json(CniVersion::V1_1_0)).unwrap();
        assert_eq!(v11["cniVersion"], "1.1.0");
        assert!(v11["ips"][0].get("version").is_none());
        assert_eq!(v11["interfaces"][1]["sandbox"], "/var/run/netns/p");
        assert_eq!(CniResult::from_value(v04).unwrap(), r);
        assert_eq!(CniResult::from_value(v11).unwrap(), r);
    }
}
