//! Plain value types for kernel networking objects (links, addresses, routes, rules,
//! neighbours, MAC addresses). Owns no I/O: the netlink layer converts them to and from
//! messages; planners build them.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// An Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// A random unicast, locally-administered address (bit 1 of the first octet set, bit 0 clear),
    /// given to host veths to defeat udev's `MACAddressPolicy`.
    #[must_use]
    pub fn random_local() -> Self {
        let mut bytes: [u8; 6] = rand::random();
        bytes[0] = (bytes[0] & 0xfe) | 0x02;
        Self(bytes)
    }

    /// Whether the locally-administered bit is set and the multicast bit clear.
    #[must_use]
    pub fn is_local_unicast(&self) -> bool {
        self.0[0] & 0x03 == 0x02
    }

    /// Parses raw link-layer bytes (6 bytes for Ethernet).
    #[must_use]
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        <[u8; 6]>::try_from(bytes).ok().map(Self)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// Why a MAC address string is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid mac address {0:?}")]
pub struct MacParseError(pub String);

impl FromStr for MacAddr {
    type Err = MacParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0_u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(|| MacParseError(s.to_owned()))?;
            if part.len() != 2 {
                return Err(MacParseError(s.to_owned()));
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| MacParseError(s.to_owned()))?;
        }
        if parts.next().is_some() {
            return Err(MacParseError(s.to_owned()));
        }
        Ok(Self(out))
    }
}

/// Address family of a route, rule or neighbour dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    #[must_use]
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}

/// A network interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address, if any.
    pub mac: Option<MacAddr>,
    /// MTU.
    pub mtu: u32,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// `IFLA_INFO_KIND` (`veth`, `bridge`, ...), if reported.
    pub kind: Option<String>,
}

/// An interface address (`ip addr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Address {
    /// Interface index.
    pub ifindex: u32,
    /// Address with prefix length.
    pub prefix: IpNet,
}

/// Route scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scope {
    /// `scope global` (the default).
    #[default]
    Universe,
    /// `scope link`: the destination is directly on the link.
    Link,
    /// `scope host`.
    Host,
}

/// A unicast route (`ip route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    /// Destination prefix (`0.0.0.0/0` / `::/0` for default).
    pub dst: IpNet,
    /// Next hop, if any.
    pub gateway: Option<IpAddr>,
    /// Output interface index, if any.
    pub oif: Option<u32>,
    /// Routing table id.
    pub table: u32,
    /// Scope.
    pub scope: Scope,
}

impl Route {
    /// Address family of the destination.
    #[must_use]
    pub fn family(&self) -> Family {
        Family::of(self.dst.addr())
    }
}

/// A policy-routing rule (`ip rule`) whose action is `lookup <table>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// Address family.
    pub family: Family,
    /// Priority (`pref`).
    pub priority: u32,
    /// `from` selector.
    pub src: Option<IpNet>,
    /// `to` selector.
    pub dst: Option<IpNet>,
    /// `iif` selector.
    pub iif: Option<String>,
    /// `fwmark value/mask` selector.
    pub fwmark: Option<(u32, u32)>,
    /// `ipproto` selector (an IP protocol number, e.g. 58 for ICMPv6).
    pub ip_proto: Option<u8>,
    /// Table looked up.
    pub table: u32,
}

impl Rule {
    /// A rule with only a priority and table; add selectors with struct update syntax.
    #[must_use]
    pub fn lookup(family: Family, priority: u32, table: u32) -> Self {
        Self {
            family,
            priority,
            src: None,
            dst: None,
            iif: None,
            fwmark: None,
            ip_proto: None,
            table,
        }
    }
}

/// A neighbour (ARP/NDP) entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Neighbour {
    /// Interface index.
    pub ifindex: u32,
    /// Protocol address.
    pub ip: IpAddr,
    /// Link-layer address, if resolved.
    pub mac: Option<MacAddr>,
    /// `NUD_PERMANENT`.
    pub permanent: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trip_and_local_bit() {
        let m: MacAddr = "02:ab:cd:ef:01:23".parse().unwrap();
        assert_eq!(m.to_string(), "02:ab:cd:ef:01:23");
        assert!(m.is_local_unicast());
        assert!("02:ab:cd:ef:01".parse::<MacAddr>().is_err());
        assert!("02:ab:cd:ef:01:23:45".parse::<MacAddr>().is_err());
        assert!("zz:ab:cd:ef:01:23".parse::<MacAddr>().is_err());
        for _ in 0..64 {
            assert!(MacAddr::random_local().is_local_unicast());
        }
    }
}
