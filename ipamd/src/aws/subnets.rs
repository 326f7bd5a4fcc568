//! Subnet discovery and exclusion, PURE: which subnets a new ENI may go to, in which order, and
//! whether an ENI's subnet is excluded from pod addresses, from what `DescribeSubnets` listed.
//! Custom networking is not decided here (its ENIConfig subnet wins before discovery is asked). Its
//! refusals are the port's [`Unplaceable`] (the pool branches on them). Must not: call EC2, log,
//! read the clock or the environment.

use super::Tags;
use super::ec2::SubnetInfo;
use crate::pool::ec2_port::Unplaceable;

/// The subnet tag discovery reads: `1` (any value but `0`) opts a secondary subnet in, `0` excludes
/// a subnet (the primary one included).
pub const TAG_ROLE_CNI: &str = "kubernetes.io/role/cni";
/// Value of [`TAG_ROLE_CNI`] that excludes a subnet.
pub const ROLE_CNI_EXCLUDED: &str = "0";
/// Prefix of the cluster-scoping subnet tags: a subnet carrying any such tag is used only by
/// the cluster named in one of them (`cni.networking.k8s.aws/cluster/<CLUSTER_NAME>`).
pub const CLUSTER_TAG_PREFIX: &str = "cni.networking.k8s.aws/cluster/";

fn tag<'a>(tags: &'a Tags, key: &str) -> Option<&'a str> {
    tags.get(key).map(String::as_str)
}

/// Without `CLUSTER_NAME` every subnet matches; otherwise a subnet with cluster tags must carry
/// this cluster's.
fn matches_cluster(tags: &Tags, cluster_name: &str) -> bool {
    if cluster_name.is_empty() {
        return true;
    }
    let mine = format!("{CLUSTER_TAG_PREFIX}{cluster_name}");
    let mut scoped = false;
    for k in tags.keys().filter(|k| k.starts_with(CLUSTER_TAG_PREFIX)) {
        if *k == mine {
            return true;
        }
        scoped = true;
    }
    !scoped
}

/// Whether a new ENI may go to the subnet: `role/cni=0` never; no `role/cni` tag: only the primary
/// subnet; any other value: when the cluster tags match.
#[must_use]
pub fn valid_for_new_eni(subnet: &SubnetInfo, is_primary: bool, cluster_name: &str) -> bool {
    match tag(&subnet.tags, TAG_ROLE_CNI) {
        Some(ROLE_CNI_EXCLUDED) => false,
        // a missing tag and an empty value are alike
        None | Some("") => is_primary,
        Some(_) => matches_cluster(&subnet.tags, cluster_name),
    }
}

/// Excluded from pod addresses: `role/cni=0`, or `role/cni` set with another cluster's tags. A
/// subnet the list does not hold is not excluded (cross-account subnets).
#[must_use]
pub fn is_excluded(listed: &[SubnetInfo], subnet_id: &str, cluster_name: &str) -> bool {
    let Some(s) = listed.iter().find(|s| s.subnet_id == subnet_id) else {
        return false;
    };
    match tag(&s.tags, TAG_ROLE_CNI) {
        None | Some("") => false,
        Some(ROLE_CNI_EXCLUDED) => true,
        Some(_) => !matches_cluster(&s.tags, cluster_name),
    }
}

/// Discovery on, DescribeSubnets answered: the subnets to try, in order: by
/// `AvailableIpAddressCount`, most first (a stable sort: EC2's order breaks ties), and tries every
/// valid one until a `CreateNetworkInterface` succeeds.
pub fn discovered(
    listed: &[SubnetInfo],
    primary_subnet: &str,
    cluster_name: &str,
) -> Result<Vec<String>, Unplaceable> {
    let mut sorted: Vec<&SubnetInfo> = listed.iter().collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.available_ips));
    let out: Vec<String> = sorted
        .into_iter()
        .filter(|s| valid_for_new_eni(s, s.subnet_id == primary_subnet, cluster_name))
        .map(|s| s.subnet_id.clone())
        .collect();
    if out.is_empty() {
        return Err(Unplaceable::NoValidSubnet);
    }
    Ok(out)
}

/// The primary subnet only (discovery off, or discovery on and its DescribeSubnets failed), after
/// the exclusion check. `check` is that check's DescribeSubnets (None: it failed): with discovery
/// on a failed check quits; with discovery off the ENI is made anyway.
pub fn primary_only(
    discovery: bool,
    check: Option<&[SubnetInfo]>,
    primary_subnet: &str,
    cluster_name: &str,
) -> Result<Vec<String>, Unplaceable> {
    match check {
        None if discovery => Err(Unplaceable::SubnetExclusionUnknown),
        Some(listed) if is_excluded(listed, primary_subnet, cluster_name) => {
            Err(Unplaceable::PrimarySubnetExcluded {
                subnet: primary_subnet.to_owned(),
                discovery,
            })
        }
        _ => Ok(vec![primary_subnet.to_owned()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sn(id: &str, free: u32, tags: &[(&str, &str)]) -> SubnetInfo {
        SubnetInfo {
            subnet_id: id.into(),
            availability_zone: "us-west-2a".into(),
            available_ips: free,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    const ON: (&str, &str) = (TAG_ROLE_CNI, "1");
    const OFF: (&str, &str) = (TAG_ROLE_CNI, "0");

    /// awsutils.go `GetVpcSubnets` (sort by AvailableIpAddressCount, descending) and
    /// `isSubnetValidForENICreation` (primary untagged: in; secondary untagged: out; `=0`: out).
    #[test]
    fn tagged_subnets_by_free_addresses_primary_included_untagged_and_excluded_left_out() {
        let listed = [
            sn("subnet-primary", 50, &[]),
            sn("subnet-small", 10, &[ON]),
            sn("subnet-untagged", 900, &[]),
            sn("subnet-big", 200, &[ON]),
            sn("subnet-off", 5000, &[OFF]),
            sn("subnet-other-value", 70, &[(TAG_ROLE_CNI, "yes")]),
        ];
        assert_eq!(
            discovered(&listed, "subnet-primary", "").unwrap(),
            [
                "subnet-big",
                "subnet-other-value",
                "subnet-primary",
                "subnet-small"
            ]
        );
    }

    /// A tie keeps EC2's order (upstream's `sort.SliceStable`).
    #[test]
    fn ties_keep_the_described_order() {
        let listed = [sn("subnet-b", 10, &[ON]), sn("subnet-a", 10, &[ON])];
        assert_eq!(
            discovered(&listed, "subnet-p", "").unwrap(),
            ["subnet-b", "subnet-a"]
        );
    }

    #[test]
    fn excluded_primary_is_skipped_and_nothing_valid_is_an_error() {
        let listed = [sn("subnet-p", 100, &[OFF]), sn("subnet-s", 1, &[ON])];
        assert_eq!(discovered(&listed, "subnet-p", "").unwrap(), ["subnet-s"]);
        let listed = [sn("subnet-p", 100, &[OFF]), sn("subnet-s", 1, &[])];
        assert_eq!(
            discovered(&listed, "subnet-p", ""),
            Err(Unplaceable::NoValidSubnet)
        );
    }

    /// awsutils.go `ValidSubnetTagsMatchingClusterName` / `checkClusterTags`.
    #[test]
    fn cluster_tags_scope_a_tagged_subnet() {
        let mine = format!("{CLUSTER_TAG_PREFIX}blue");
        let theirs = format!("{CLUSTER_TAG_PREFIX}green");
        let listed = [
            sn("subnet-mine", 10, &[ON, (&mine, "1")]),
            sn("subnet-theirs", 90, &[ON, (&theirs, "1")]),
            sn("subnet-shared", 50, &[ON]),
        ];
        assert_eq!(
            discovered(&listed, "subnet-p", "blue").unwrap(),
            ["subnet-shared", "subnet-mine"]
        );
        // Without CLUSTER_NAME, cluster tags are not checked.
        assert_eq!(discovered(&listed, "subnet-p", "").unwrap().len(), 3);
        assert!(is_excluded(&listed, "subnet-theirs", "blue"));
        assert!(!is_excluded(&listed, "subnet-mine", "blue"));
    }

    /// awsutils.go `IsSubnetExcluded`: untagged or unknown subnets are not excluded.
    #[test]
    fn exclusion_of_existing_enis_subnets() {
        let listed = [
            sn("subnet-p", 1, &[]),
            sn("subnet-off", 1, &[OFF]),
            sn("subnet-on", 1, &[ON]),
        ];
        assert!(is_excluded(&listed, "subnet-off", ""));
        assert!(!is_excluded(&listed, "subnet-on", ""));
        assert!(!is_excluded(&listed, "subnet-p", ""));
        assert!(!is_excluded(&listed, "subnet-elsewhere", ""));
    }

    /// awsutils.go `createENI`: the two primary-only branches (discovery off; discovery on
    /// with a failed DescribeSubnets).
    #[test]
    fn primary_only_branches() {
        let off = [sn("subnet-p", 1, &[OFF])];
        let plain = [sn("subnet-p", 1, &[])];
        assert_eq!(
            primary_only(false, Some(&plain), "subnet-p", "").unwrap(),
            ["subnet-p"]
        );
        assert_eq!(
            primary_only(false, Some(&off), "subnet-p", ""),
            Err(Unplaceable::PrimarySubnetExcluded {
                subnet: "subnet-p".into(),
                discovery: false
            })
        );
        // Discovery off: a failed check proceeds with the primary subnet.
        assert_eq!(
            primary_only(false, None, "subnet-p", "").unwrap(),
            ["subnet-p"]
        );
        // Discovery on: a failed check quits.
        assert_eq!(
            primary_only(true, None, "subnet-p", ""),
            Err(Unplaceable::SubnetExclusionUnknown)
        );
        assert!(
            primary_only(false, Some(&off), "subnet-p", "")
                .unwrap_err()
                .to_string()
                .contains("subnet discovery is disabled")
        );
    }
}
