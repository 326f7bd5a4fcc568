//! The node's security groups on the ENIs ipamd manages: the primary ENI's groups as IMDS lists
//! them now, applied to every managed ENI when they change, so that an operator who tightens the
//! node's groups tightens its pods' too. Must not touch the datastore, the kernel, or an ENI ipamd
//! does not manage (`no_manage`, cards it does not serve, anything under custom networking).

use std::collections::BTreeSet;

use super::Ec2Provider;
use crate::aws::ec2::Ec2;
use crate::aws::imds::Imds;
use crate::pool::ec2_port::{AttachedEni, ProviderError};

/// What one check of the node's groups found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupCheck {
    /// Groups the primary ENI gained since the last check.
    pub added: Vec<String>,
    /// Groups it lost.
    pub removed: Vec<String>,
    /// ENIs whose groups were set to the primary's.
    pub updated: Vec<String>,
    /// ENIs EC2 refused (each logged and counted; tried again at the next change).
    pub failed: Vec<String>,
}

/// Whether ipamd manages `eni`'s groups: every ENI of the pools (primary, trunk, EFA, ENIs in an
/// excluded subnet: the pools hold them) on a served card (card 0, every card with
/// `ENABLE_MULTI_NIC`), never a `no_manage` one.
#[must_use]
pub fn manages_groups_of(eni: &AttachedEni, multi_nic: bool) -> bool {
    let no_manage = eni.is_excluded && !eni.subnet_excluded && !eni.is_primary;
    !no_manage && (eni.network_card == 0 || multi_nic)
}

/// The ENIs of `enis` to give `groups`: managed ([`manages_groups_of`]) and, as EC2 last described
/// them (`described`), carrying another set (an ENI never described is updated). An ENI that
/// already carries the set costs no call.
pub fn enis_to_update<'a>(
    enis: &'a [AttachedEni],
    groups: &BTreeSet<String>,
    multi_nic: bool,
    described: impl Fn(&str) -> Option<BTreeSet<String>>,
) -> Vec<&'a str> {
    enis.iter()
        .filter(|e| manages_groups_of(e, multi_nic))
        .filter(|e| described(&e.id).as_ref() != Some(groups))
        .map(|e| e.id.as_str())
        .collect()
}

impl<E: Ec2 + 'static, I: Imds + 'static> Ec2Provider<E, I> {
    /// One check: reads the primary ENI's groups from IMDS; when they differ from `applied` (empty
    /// before the first check, so the first check always compares), logs what changed and, when
    /// `apply` (off under custom networking: the ENIConfig's groups rule there), sets them on every
    /// managed ENI ([`enis_to_update`]). `applied` becomes the IMDS set whatever EC2 answered.
    ///
    /// When the set did not change, the check still sets it on a managed ENI that EC2 last
    /// described with other groups: an ENI whose creation read the groups just before a change and
    /// whose attachment IMDS listed only after the check that applied it. Known from the cache, so
    /// a node whose ENIs all carry the set costs no call beyond the IMDS read. An ENI EC2 refused
    /// is asked again at the next change, as upstream. An IMDS failure is the error (nothing
    /// changed).
    pub async fn check_security_groups(
        &self,
        applied: &mut BTreeSet<String>,
        multi_nic: bool,
        apply: bool,
    ) -> Result<GroupCheck, ProviderError> {
        let primary = self.primary().await?;
        let now: BTreeSet<String> = self
            .imds
            .security_groups(&primary.mac)
            .await
            .map_err(|e| super::imds_failure(&e))?
            .into_iter()
            .collect();
        let mut check = GroupCheck {
            added: now.difference(applied).cloned().collect(),
            removed: applied.difference(&now).cloned().collect(),
            ..GroupCheck::default()
        };
        // the primary ENI carries what IMDS lists for it, whatever EC2 described before
        if let Some(k) = self
            .cache()
            .known
            .values_mut()
            .find(|k| k.mac == primary.mac)
        {
            k.security_groups = now.iter().cloned().collect();
        }
        let changed = !(check.added.is_empty() && check.removed.is_empty());
        if changed {
            self.cache().groups_refused.clear();
            for sg in &check.added {
                tracing::info!(security_group = %sg, "Found primary SG {sg}, added to ipamd cache");
            }
            for sg in &check.removed {
                tracing::info!(security_group = %sg, "Removed primary SG {sg} from ipamd cache");
            }
            applied.clone_from(&now);
            // the next ENI is created with the new set, not the one cached at start
            if let Some(p) = self.cache().primary.as_mut() {
                p.security_groups = now.iter().cloned().collect();
            }
        }
        if !apply || (!changed && !self.some_known_eni_differs(&now)) {
            return Ok(check);
        }
        let enis = self.imds_view().await?;
        let targets: Vec<String> = {
            let c = self.cache();
            enis_to_update(&enis, &now, multi_nic, |id| {
                match c.known.get(id) {
                    // refused: asked again when the set changes, not at every check
                    _ if !changed && c.groups_refused.contains(id) => Some(now.clone()),
                    Some(k) => Some(k.security_groups.iter().cloned().collect()),
                    // never described: updated when the set changes, not at every check
                    None if !changed => Some(now.clone()),
                    None => None,
                }
            })
            .into_iter()
            .map(str::to_owned)
            .collect()
        };
        let groups: Vec<String> = now.iter().cloned().collect();
        for eni in targets {
            match self.ec2.set_security_groups(&eni, &groups).await {
                Ok(()) => {
                    tracing::info!(%eni, security_groups = ?groups, "Update ENI {eni} with the node's security groups");
                    let mut c = self.cache();
                    c.groups_refused.remove(&eni);
                    if let Some(k) = c.known.get_mut(&eni) {
                        k.security_groups.clone_from(&groups);
                    }
                    drop(c);
                    check.updated.push(eni);
                }
                Err(e) => {
                    // counted in awscni_aws_api_error_count by the EC2 layer; not fatal; asked
                    // again at the next change, as upstream
                    tracing::warn!(%eni, error = %e, "Update: unable to update ENI {eni} security groups");
                    self.cache().groups_refused.insert(eni.clone());
                    check.failed.push(eni);
                }
            }
        }
        Ok(check)
    }

    /// Whether EC2 last described an ENI attached to this instance, and not refused the set, with
    /// groups other than `now` (whether ipamd manages it is decided later, on IMDS's view).
    fn some_known_eni_differs(&self, now: &BTreeSet<String>) -> bool {
        let c = self.cache();
        let me = c.identity.as_ref().map(|i| i.instance_id.as_str());
        c.known.values().any(|k| {
            k.attachment.as_ref().map(|a| a.instance_id.as_str()) == me
                && !c.groups_refused.contains(&k.eni_id)
                && k.security_groups.iter().cloned().collect::<BTreeSet<_>>() != *now
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eni(id: &str, card: u32) -> AttachedEni {
        AttachedEni {
            id: id.into(),
            network_card: card,
            ..AttachedEni::unflagged()
        }
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn every_managed_eni_of_a_served_card_that_differs_is_updated() {
        let mut primary = eni("eni-p", 0);
        primary.is_primary = true;
        let mut no_manage = eni("eni-nm", 0);
        no_manage.is_excluded = true;
        let mut excluded_subnet = eni("eni-xs", 0);
        excluded_subnet.is_excluded = true;
        excluded_subnet.subnet_excluded = true;
        let mut trunk = eni("eni-t", 0);
        trunk.is_trunk = true;
        let enis = vec![
            primary,
            eni("eni-same", 0),
            eni("eni-old", 0),
            no_manage,
            excluded_subnet,
            trunk,
            eni("eni-card1", 1),
        ];
        let want = set(&["sg-b"]);
        let described = |id: &str| match id {
            "eni-p" | "eni-same" => Some(set(&["sg-b"])),
            "eni-t" => None,
            _ => Some(set(&["sg-a"])),
        };
        assert_eq!(
            enis_to_update(&enis, &want, false, described),
            ["eni-old", "eni-xs", "eni-t"]
        );
        assert_eq!(
            enis_to_update(&enis, &want, true, described),
            ["eni-old", "eni-xs", "eni-t", "eni-card1"]
        );
    }
}
