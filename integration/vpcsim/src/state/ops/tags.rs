//! `CreateTags` / `DeleteTags` on ENIs, instances, subnets and security groups. Must not know
//! HTTP or knobs.

use super::super::{State, StateError};
use std::collections::BTreeMap;

impl State {
    pub(super) fn tags_mut(
        &mut self,
        resource: &str,
    ) -> Result<&mut BTreeMap<String, String>, StateError> {
        let not_found = || {
            StateError::InvalidParameterValue(format!(
                "the resource id '{resource}' does not exist"
            ))
        };
        if resource.starts_with("eni-") {
            return Ok(&mut self.eni_mut(resource)?.tags);
        }
        if resource.starts_with("i-") {
            return self
                .instances
                .get_mut(resource)
                .map(|i| &mut i.tags)
                .ok_or_else(|| StateError::InstanceNotFound(resource.to_owned()));
        }
        if resource.starts_with("subnet-") {
            return self
                .subnets
                .get_mut(resource)
                .map(|s| &mut s.tags)
                .ok_or_else(|| StateError::SubnetNotFound(resource.to_owned()));
        }
        if resource.starts_with("sg-") {
            return self
                .security_groups
                .get_mut(resource)
                .map(|s| &mut s.tags)
                .ok_or_else(|| StateError::GroupNotFound(resource.to_owned()));
        }
        Err(not_found())
    }

    /// `CreateTags`: all resources must exist; then tags are set on each.
    pub fn create_tags(
        &mut self,
        resources: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        for r in resources {
            self.tags_mut(r)?;
        }
        for r in resources {
            self.tags_mut(r)?
                .extend(tags.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Ok(())
    }

    /// `DeleteTags`: a tag with a value is removed only if the value matches.
    pub fn delete_tags(
        &mut self,
        resources: &[String],
        tags: &[(String, Option<String>)],
    ) -> Result<(), StateError> {
        for r in resources {
            self.tags_mut(r)?;
        }
        for r in resources {
            let map = self.tags_mut(r)?;
            for (k, v) in tags {
                if v.as_ref().is_none_or(|v| map.get(k) == Some(v)) {
                    map.remove(k);
                }
            }
        }
        Ok(())
    }
}
