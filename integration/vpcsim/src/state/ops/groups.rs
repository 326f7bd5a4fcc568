//! Security groups: `CreateSecurityGroup`, `AuthorizeSecurityGroupIngress/Egress` and
//! `RevokeSecurityGroupIngress/Egress` with EC2's rules (unique names per VPC, the default
//! egress rule, duplicate and unknown permissions refused, peers that exist). Must not know
//! HTTP or knobs.

use super::super::{SecurityGroup, SgRule, State, StateError};
use std::collections::BTreeMap;

/// Which rule list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Ingress rules.
    Ingress,
    /// Egress rules.
    Egress,
}

/// EC2's protocol names for the numbers it accepts in their place.
fn protocol_name(p: &str) -> Result<String, StateError> {
    let lower = p.to_ascii_lowercase();
    Ok(match lower.as_str() {
        "-1" | "all" => "-1",
        "tcp" | "6" => "tcp",
        "udp" | "17" => "udp",
        "icmp" | "1" => "icmp",
        "icmpv6" | "58" => "icmpv6",
        _ => {
            return Err(StateError::InvalidParameterValue(format!(
                "invalid value '{p}' for IP protocol (the simulator knows -1, tcp, udp, icmp, icmpv6)"
            )));
        }
    }
    .to_owned())
}

impl State {
    /// `CreateSecurityGroup` in this VPC (`vpc_id` empty: this VPC); EC2 adds the allow-all
    /// egress rule. Returns the group id.
    pub fn create_security_group(
        &mut self,
        name: &str,
        description: &str,
        vpc_id: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<String, StateError> {
        if name.is_empty() {
            return Err(StateError::MissingParameter("GroupName".into()));
        }
        if description.is_empty() {
            return Err(StateError::MissingParameter("GroupDescription".into()));
        }
        if !vpc_id.is_empty() && vpc_id != self.vpc.id {
            return Err(StateError::VpcNotFound(vpc_id.to_owned()));
        }
        if self
            .security_groups
            .values()
            .any(|g| g.vpc_id == self.vpc.id && g.name == name)
        {
            return Err(StateError::GroupDuplicate(name.to_owned()));
        }
        let id = self.mint("sg");
        self.security_groups.insert(
            id.clone(),
            SecurityGroup {
                id: id.clone(),
                name: name.to_owned(),
                description: description.to_owned(),
                vpc_id: self.vpc.id.clone(),
                tags,
                ingress: Vec::new(),
                egress: SgRule::default_egress(),
            },
        );
        Ok(id)
    }

    fn checked_rules(&self, rules: Vec<SgRule>) -> Result<Vec<SgRule>, StateError> {
        if rules.is_empty() {
            return Err(StateError::MissingParameter("IpPermissions".into()));
        }
        let mut out = Vec::with_capacity(rules.len());
        for mut r in rules {
            r.protocol = protocol_name(&r.protocol)?;
            if matches!(r.protocol.as_str(), "tcp" | "udp")
                && (r.from_port.is_none() || r.to_port.is_none())
            {
                return Err(StateError::InvalidParameterValue(
                    "invalid value 'Must specify both from and to ports with TCP/UDP.'".into(),
                ));
            }
            if let (Some(a), Some(b)) = (r.from_port, r.to_port)
                && matches!(r.protocol.as_str(), "tcp" | "udp")
                && a > b
            {
                return Err(StateError::InvalidParameterValue(format!(
                    "invalid TCP/UDP port range {a}-{b}"
                )));
            }
            if r.protocol == "-1" {
                r.from_port = None;
                r.to_port = None;
            }
            for g in &r.groups {
                if !self.security_groups.contains_key(g) {
                    return Err(StateError::GroupNotFound(g.clone()));
                }
            }
            r.cidrs = r.cidrs.iter().map(ipnet::IpNet::trunc).collect();
            out.push(r);
        }
        Ok(out)
    }

    /// `AuthorizeSecurityGroupIngress` / `Egress`: every rule is new (`InvalidPermission.Duplicate`
    /// otherwise) and names existing groups. Returns the rules with the `sgr-` id EC2 gives
    /// each peer of each (ids are minted for the answer only: `DescribeSecurityGroupRules` is
    /// not simulated).
    pub fn authorize_security_group(
        &mut self,
        group_id: &str,
        direction: Direction,
        rules: Vec<SgRule>,
    ) -> Result<Vec<(String, SgRule)>, StateError> {
        let rules = self.checked_rules(rules)?;
        let mut ids = Vec::new();
        for r in &rules {
            for _ in 0..(r.cidrs.len() + r.groups.len()).max(1) {
                ids.push(self.mint("sgr"));
            }
        }
        let group = self
            .security_groups
            .get_mut(group_id)
            .ok_or_else(|| StateError::GroupNotFound(group_id.to_owned()))?;
        let list = match direction {
            Direction::Ingress => &mut group.ingress,
            Direction::Egress => &mut group.egress,
        };
        if let Some(dup) = rules.iter().find(|r| list.contains(r)) {
            return Err(StateError::PermissionDuplicate(format!(
                "{} {:?}-{:?}",
                dup.protocol, dup.from_port, dup.to_port
            )));
        }
        list.extend(rules.iter().cloned());
        // One answer row per peer, as EC2 splits a permission into rules.
        let mut ids = ids.into_iter();
        let mut out = Vec::new();
        for r in rules {
            let peers: Vec<SgRule> = r
                .cidrs
                .iter()
                .map(|c| SgRule {
                    cidrs: vec![*c],
                    groups: Vec::new(),
                    ..r.clone()
                })
                .chain(r.groups.iter().map(|g| SgRule {
                    cidrs: Vec::new(),
                    groups: vec![g.clone()],
                    ..r.clone()
                }))
                .collect();
            let peers = if peers.is_empty() { vec![r] } else { peers };
            for p in peers {
                out.push((ids.next().unwrap_or_default(), p));
            }
        }
        Ok(out)
    }

    /// `RevokeSecurityGroupIngress` / `Egress`: every rule must exist as authorized.
    pub fn revoke_security_group(
        &mut self,
        group_id: &str,
        direction: Direction,
        rules: Vec<SgRule>,
    ) -> Result<(), StateError> {
        let rules = self.checked_rules(rules)?;
        let group = self
            .security_groups
            .get_mut(group_id)
            .ok_or_else(|| StateError::GroupNotFound(group_id.to_owned()))?;
        let list = match direction {
            Direction::Ingress => &mut group.ingress,
            Direction::Egress => &mut group.egress,
        };
        if let Some(missing) = rules.iter().find(|r| !list.contains(r)) {
            return Err(StateError::PermissionNotFound(format!(
                "{} {:?}-{:?}",
                missing.protocol, missing.from_port, missing.to_port
            )));
        }
        list.retain(|r| !rules.contains(r));
        Ok(())
    }
}
