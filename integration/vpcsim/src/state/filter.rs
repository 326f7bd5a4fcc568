//! EC2 `Filter.N.Name/Value.M` semantics for the Describe calls: values within one filter are
//! OR-ed, filters are AND-ed, values may hold `*` and `?` wildcards. Unknown filter names are
//! refused (EC2 answers InvalidParameterValue). Must not know HTTP.

use super::{Eni, Instance, State, StateError, Subnet};
use std::collections::BTreeMap;

/// One `Filter.N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// Filter name, e.g. `tag:cluster`.
    pub name: String,
    /// Accepted values.
    pub values: Vec<String>,
}

/// EC2 wildcard match: `*` any run, `?` one character.
pub fn wildcard(pattern: &str, value: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let v: Vec<char> = value.chars().collect();
    let (mut pi, mut vi, mut star, mut mark) = (0usize, 0usize, None::<usize>, 0usize);
    while vi < v.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == v[vi]) {
            pi += 1;
            vi += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = vi;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            vi = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn any_matches<'a>(values: &[String], mut candidates: impl Iterator<Item = &'a str>) -> bool {
    candidates.any(|c| values.iter().any(|p| wildcard(p, c)))
}

fn tag_filter(name: &str, values: &[String], tags: &BTreeMap<String, String>) -> Option<bool> {
    if let Some(key) = name.strip_prefix("tag:") {
        return Some(
            tags.get(key)
                .is_some_and(|v| any_matches(values, std::iter::once(v.as_str()))),
        );
    }
    if name == "tag-key" {
        return Some(any_matches(values, tags.keys().map(String::as_str)));
    }
    if name == "tag-value" {
        return Some(any_matches(values, tags.values().map(String::as_str)));
    }
    None
}

fn unknown(name: &str) -> StateError {
    StateError::InvalidParameterValue(format!("the filter '{name}' is invalid"))
}

/// One row of `DescribeTags`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagRow {
    /// `i-...`, `eni-...`, `subnet-...`.
    pub resource_id: String,
    /// `instance`, `network-interface`, `subnet`.
    pub resource_type: &'static str,
    /// Tag key.
    pub key: String,
    /// Tag value.
    pub value: String,
}

impl State {
    /// `DescribeTags`: every tag of instances, ENIs and subnets passing every filter
    /// (`resource-id`, `resource-type`, `key`, `value`; others are refused as EC2 does).
    pub fn describe_tags(&self, filters: &[Filter]) -> Result<Vec<TagRow>, StateError> {
        for f in filters {
            if !matches!(
                f.name.as_str(),
                "resource-id" | "resource-type" | "key" | "value"
            ) {
                return Err(unknown(&f.name));
            }
        }
        let tagged = self
            .instances
            .values()
            .map(|i| (i.id.as_str(), "instance", &i.tags))
            .chain(
                self.enis
                    .values()
                    .map(|e| (e.id.as_str(), "network-interface", &e.tags)),
            )
            .chain(
                self.subnets
                    .values()
                    .map(|s| (s.id.as_str(), "subnet", &s.tags)),
            );
        let mut rows = Vec::new();
        for (id, ty, tags) in tagged {
            for (k, v) in tags {
                let pass = filters.iter().all(|f| {
                    let candidate = match f.name.as_str() {
                        "resource-id" => id,
                        "resource-type" => ty,
                        "key" => k.as_str(),
                        _ => v.as_str(),
                    };
                    any_matches(&f.values, std::iter::once(candidate))
                });
                if pass {
                    rows.push(TagRow {
                        resource_id: id.to_owned(),
                        resource_type: ty,
                        key: k.clone(),
                        value: v.clone(),
                    });
                }
            }
        }
        Ok(rows)
    }

    /// Does `eni` pass every filter?
    pub fn eni_matches(&self, eni: &Eni, filters: &[Filter]) -> Result<bool, StateError> {
        for f in filters {
            let v = &f.values;
            let ok = if let Some(ok) = tag_filter(&f.name, v, &eni.tags) {
                ok
            } else {
                let att = eni.attachment.as_ref();
                match f.name.as_str() {
                    "network-interface-id" => any_matches(v, std::iter::once(eni.id.as_str())),
                    "attachment.instance-id" => {
                        att.is_some_and(|a| any_matches(v, std::iter::once(a.instance_id.as_str())))
                    }
                    "attachment.attachment-id" => {
                        att.is_some_and(|a| any_matches(v, std::iter::once(a.id.as_str())))
                    }
                    "attachment.status" => {
                        att.is_some_and(|_| any_matches(v, std::iter::once("attached")))
                    }
                    "attachment.device-index" => att.is_some_and(|a| {
                        any_matches(v, std::iter::once(a.device_index.to_string().as_str()))
                    }),
                    "status" => any_matches(v, std::iter::once(eni.status())),
                    "vpc-id" => any_matches(v, std::iter::once(self.vpc.id.as_str())),
                    "subnet-id" => any_matches(v, std::iter::once(eni.subnet_id.as_str())),
                    "description" => any_matches(v, std::iter::once(eni.description.as_str())),
                    "mac-address" => any_matches(v, std::iter::once(eni.mac.as_str())),
                    "availability-zone" => {
                        any_matches(v, std::iter::once(self.subnet_az(&eni.subnet_id)))
                    }
                    "group-id" => any_matches(v, eni.groups.iter().map(String::as_str)),
                    "private-ip-address" | "addresses.private-ip-address" => {
                        let ips: Vec<String> =
                            eni.private_ips.iter().map(ToString::to_string).collect();
                        any_matches(v, ips.iter().map(String::as_str))
                    }
                    other => return Err(unknown(other)),
                }
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Does `subnet` pass every filter?
    pub fn subnet_matches(&self, subnet: &Subnet, filters: &[Filter]) -> Result<bool, StateError> {
        for f in filters {
            let v = &f.values;
            let ok = if let Some(ok) = tag_filter(&f.name, v, &subnet.tags) {
                ok
            } else {
                match f.name.as_str() {
                    "subnet-id" => any_matches(v, std::iter::once(subnet.id.as_str())),
                    "vpc-id" => any_matches(v, std::iter::once(self.vpc.id.as_str())),
                    "cidr-block" | "cidr" => {
                        any_matches(v, std::iter::once(subnet.cidr.to_string().as_str()))
                    }
                    "availability-zone" => {
                        any_matches(v, std::iter::once(subnet.availability_zone.as_str()))
                    }
                    "state" => any_matches(v, std::iter::once("available")),
                    other => return Err(unknown(other)),
                }
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Does `instance` pass every filter?
    pub fn instance_matches(
        &self,
        inst: &Instance,
        filters: &[Filter],
    ) -> Result<bool, StateError> {
        for f in filters {
            let v = &f.values;
            let ok = if let Some(ok) = tag_filter(&f.name, v, &inst.tags) {
                ok
            } else {
                match f.name.as_str() {
                    "instance-id" => any_matches(v, std::iter::once(inst.id.as_str())),
                    "instance-type" => any_matches(v, std::iter::once(inst.instance_type.as_str())),
                    "instance-state-name" => any_matches(v, std::iter::once(inst.state.name())),
                    "subnet-id" => any_matches(v, std::iter::once(inst.subnet_id.as_str())),
                    "vpc-id" => any_matches(v, std::iter::once(self.vpc.id.as_str())),
                    other => return Err(unknown(other)),
                }
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Does the security group pass every filter?
    pub fn group_matches(
        &self,
        group: &super::SecurityGroup,
        filters: &[Filter],
    ) -> Result<bool, StateError> {
        for f in filters {
            let v = &f.values;
            let ok = if let Some(ok) = tag_filter(&f.name, v, &group.tags) {
                ok
            } else {
                match f.name.as_str() {
                    "group-id" => any_matches(v, std::iter::once(group.id.as_str())),
                    "group-name" => any_matches(v, std::iter::once(group.name.as_str())),
                    "vpc-id" => any_matches(v, std::iter::once(self.vpc.id.as_str())),
                    other => return Err(unknown(other)),
                }
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::wildcard;

    #[test]
    fn wildcards() {
        assert!(wildcard("aws-K8S-*", "aws-K8S-i-0123"));
        assert!(!wildcard("aws-K8S-*", "other"));
        assert!(wildcard("a?c", "abc"));
        assert!(!wildcard("a?c", "abbc"));
        assert!(wildcard("*", ""));
        assert!(wildcard("exact", "exact"));
        assert!(!wildcard("exact", "exactly"));
    }
}
