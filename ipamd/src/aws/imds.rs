//! The `Imds` port: what the instance metadata service says about this node and its ENIs.
//! IMDS is eventually consistent with EC2 and is treated as a hint everywhere. Also the pure
//! parsers of IMDS values, shared by the SDK implementation and its tests.

use std::future::Future;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::error::ImdsError;
use super::{ImdsEni, InstanceIdentity};

/// Read-only view of IMDS, domain-shaped.
pub trait Imds: Send + Sync {
    /// Instance id, type, region, AZ and primary MAC.
    fn identity(&self) -> impl Future<Output = Result<InstanceIdentity, ImdsError>> + Send;
    /// Every ENI IMDS lists under `network/interfaces/macs/`, by device number.
    fn enis(&self) -> impl Future<Output = Result<Vec<ImdsEni>, ImdsError>> + Send;
    /// The VPC's IPv4 CIDR blocks as the primary ENI (`primary_mac`) lists them
    /// (`vpc-ipv4-cidr-blocks`), read now: what following the VPC's blocks needs, without
    /// listing every ENI. The default reads them through [`Imds::enis`].
    fn vpc_ipv4_cidrs(
        &self,
        primary_mac: &str,
    ) -> impl Future<Output = Result<Vec<Ipv4Net>, ImdsError>> + Send {
        let mac = primary_mac.to_owned();
        async move {
            Ok(self
                .enis()
                .await?
                .into_iter()
                .find(|e| e.mac == mac)
                .map(|e| e.vpc_cidrs)
                .unwrap_or_default())
        }
    }

    /// The security groups of the primary ENI (`primary_mac`) as IMDS lists them now
    /// (`security-group-ids`): what the security-group follower follows. The default reads them
    /// through [`Imds::enis`]; an ENI IMDS does not list is an error.
    fn security_groups(
        &self,
        primary_mac: &str,
    ) -> impl Future<Output = Result<Vec<String>, ImdsError>> + Send {
        let mac = primary_mac.to_owned();
        async move {
            self.enis()
                .await?
                .into_iter()
                .find(|e| e.mac == mac)
                .map(|e| e.security_groups)
                .ok_or(ImdsError::NotFound(format!(
                    "network/interfaces/macs/{mac}/security-group-ids"
                )))
        }
    }
}

/// Lines of a listing (`a\nb/\n`), trailing `/` stripped, blanks dropped.
pub fn parse_listing(body: &str) -> Vec<String> {
    body.lines()
        .map(|l| l.trim().trim_end_matches('/').to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// A listing of values of one kind (addresses, CIDRs), one per line; a value that does not
/// parse names its path.
pub fn parse_values<T: std::str::FromStr>(path: &str, body: &str) -> Result<Vec<T>, ImdsError> {
    parse_listing(body)
        .into_iter()
        .map(|l| {
            l.parse().map_err(|_| ImdsError::Malformed {
                path: path.to_owned(),
                value: l,
            })
        })
        .collect()
}

/// A list of IPv4 addresses, one per line.
pub fn parse_ips(path: &str, body: &str) -> Result<Vec<Ipv4Addr>, ImdsError> {
    parse_values(path, body)
}

/// A list of IPv4 CIDRs, one per line.
pub fn parse_cidrs(path: &str, body: &str) -> Result<Vec<Ipv4Net>, ImdsError> {
    parse_values(path, body)
}

/// A decimal number.
pub fn parse_u32(path: &str, body: &str) -> Result<u32, ImdsError> {
    body.trim().parse().map_err(|_| ImdsError::Malformed {
        path: path.to_owned(),
        value: body.to_owned(),
    })
}

/// A listing of IPv6 addresses (`ipv6s`); an empty body is an empty list.
pub fn parse_ipv6s(path: &str, body: &str) -> Result<Vec<std::net::Ipv6Addr>, ImdsError> {
    parse_values(path, body)
}

/// A listing of IPv6 CIDRs (`vpc-ipv6-cidr-blocks`, `ipv6-prefix`).
pub fn parse_ipv6_cidrs(path: &str, body: &str) -> Result<Vec<ipnet::Ipv6Net>, ImdsError> {
    parse_values(path, body)
}

/// Region of an availability zone (`us-west-2a` → `us-west-2`), for IMDS servers that lack
/// `placement/region`.
pub fn region_of_az(az: &str) -> String {
    az.trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .to_owned()
}

/// Assemble one ENI from its per-MAC values; `local_ipv4s` lists the primary address first.
#[allow(clippy::too_many_arguments)]
pub fn assemble_eni(
    mac: &str,
    eni_id: String,
    device_number: u32,
    network_card: u32,
    subnet_id: String,
    subnet_cidr: Ipv4Net,
    vpc_cidrs: Vec<Ipv4Net>,
    security_groups: Vec<String>,
    local_ipv4s: Vec<Ipv4Addr>,
    prefixes: Vec<Ipv4Net>,
) -> Result<ImdsEni, ImdsError> {
    let mut ips = local_ipv4s.into_iter();
    let primary_ip = ips.next().ok_or_else(|| ImdsError::Malformed {
        path: format!("network/interfaces/macs/{mac}/local-ipv4s"),
        value: String::new(),
    })?;
    Ok(ImdsEni {
        mac: mac.to_owned(),
        eni_id,
        device_number,
        network_card,
        subnet_id,
        subnet_cidr,
        vpc_cidrs,
        security_groups,
        primary_ip,
        secondary_ips: ips.collect(),
        prefixes,
        ipv6s: Vec::new(),
        vpc_ipv6_cidrs: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_and_values_parse() {
        assert_eq!(parse_listing("0e:aa/\n0e:bb/\n"), vec!["0e:aa", "0e:bb"]);
        assert_eq!(parse_ips("p", "198.18.0.5\n198.18.0.6").unwrap().len(), 2);
        assert!(parse_ips("p", "198.18.0.5\nbogus").is_err());
        assert_eq!(
            parse_cidrs("p", "198.18.1.16/28\n").unwrap()[0].prefix_len(),
            28
        );
        assert_eq!(region_of_az("us-west-2a"), "us-west-2");
    }

    #[test]
    fn primary_address_is_first_local_ipv4() {
        let eni = assemble_eni(
            "0e:aa",
            "eni-1".into(),
            0,
            0,
            "subnet-1".into(),
            "198.18.0.0/24".parse().unwrap(),
            vec![],
            vec![],
            vec![
                "198.18.0.10".parse().unwrap(),
                "198.18.0.11".parse().unwrap(),
            ],
            vec![],
        )
        .unwrap();
        assert_eq!(eni.primary_ip, "198.18.0.10".parse::<Ipv4Addr>().unwrap());
        assert_eq!(
            eni.secondary_ips,
            vec!["198.18.0.11".parse::<Ipv4Addr>().unwrap()]
        );
    }
}
