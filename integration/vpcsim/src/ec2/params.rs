//! EC2 Query parameters (`Action=..&Filter.1.Name=..&Filter.1.Value.1=..`): typed getters for
//! scalars, `.N` lists, `.N.Field` structures, filters and tags. Parsing errors become
//! `InvalidParameterValue`/`MissingParameter`. Must not touch the world.

use crate::state::StateError;
use crate::state::filter::Filter;
use std::collections::BTreeMap;
use std::str::FromStr;

/// The decoded form body of one request.
#[derive(Debug, Clone, Default)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    /// From decoded `key=value` pairs.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(pairs.into_iter().collect())
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The value of `key` or `MissingParameter`.
    pub fn required(&self, key: &str) -> Result<&str, StateError> {
        self.get(key)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| StateError::MissingParameter(key.to_owned()))
    }

    /// `key` parsed as `T`.
    pub fn parse<T: FromStr>(&self, key: &str) -> Result<Option<T>, StateError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                StateError::InvalidParameterValue(format!(
                    "value ({v}) for parameter {key} is invalid"
                ))
            }),
        }
    }

    /// `key` as a boolean (`true`/`false`).
    pub fn flag(&self, key: &str) -> Result<bool, StateError> {
        Ok(self.parse::<bool>(key)?.unwrap_or(false))
    }

    /// Values of `prefix.1`, `prefix.2`, ... in index order.
    pub fn list(&self, prefix: &str) -> Vec<String> {
        let mut out: Vec<(u32, String)> = self
            .0
            .iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix(prefix)?.strip_prefix('.')?;
                let n = rest.parse::<u32>().ok()?;
                Some((n, v.clone()))
            })
            .collect();
        out.sort_by_key(|(n, _)| *n);
        out.into_iter().map(|(_, v)| v).collect()
    }

    /// `prefix.N` values parsed as `T`.
    pub fn parsed_list<T: FromStr>(&self, prefix: &str) -> Result<Vec<T>, StateError> {
        self.list(prefix)
            .into_iter()
            .map(|v| {
                v.parse().map_err(|_| {
                    StateError::InvalidParameterValue(format!(
                        "value ({v}) for parameter {prefix} is invalid"
                    ))
                })
            })
            .collect()
    }

    /// Sub-parameters of `prefix.N.*`, one `Params` per N in index order.
    pub fn structs(&self, prefix: &str) -> Vec<Params> {
        let mut groups: BTreeMap<u32, Params> = BTreeMap::new();
        for (k, v) in &self.0 {
            let Some(rest) = k.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')) else {
                continue;
            };
            let Some((n, field)) = rest.split_once('.') else {
                continue;
            };
            let Ok(n) = n.parse::<u32>() else { continue };
            groups
                .entry(n)
                .or_default()
                .0
                .insert(field.to_owned(), v.clone());
        }
        groups.into_values().collect()
    }

    /// `Filter.N.Name` / `Filter.N.Value.M`.
    pub fn filters(&self) -> Vec<Filter> {
        self.structs("Filter")
            .into_iter()
            .map(|f| Filter {
                name: f.get("Name").unwrap_or_default().to_owned(),
                values: f.list("Value"),
            })
            .collect()
    }

    /// `prefix.N.Key` / `prefix.N.Value` as a map.
    pub fn tags(&self, prefix: &str) -> BTreeMap<String, String> {
        self.structs(prefix)
            .into_iter()
            .filter_map(|t| {
                Some((
                    t.get("Key")?.to_owned(),
                    t.get("Value").unwrap_or_default().to_owned(),
                ))
            })
            .collect()
    }

    /// Tags of `TagSpecification.N` whose `ResourceType` is `resource_type`.
    pub fn tag_specs(&self, resource_type: &str) -> Result<BTreeMap<String, String>, StateError> {
        let mut out = BTreeMap::new();
        for spec in self.structs("TagSpecification") {
            match spec.get("ResourceType") {
                Some(rt) if rt == resource_type => out.extend(spec.tags("Tag")),
                Some(_) | None => {
                    return Err(StateError::InvalidParameterValue(format!(
                        "tag specifications must have resource type '{resource_type}'"
                    )));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Params {
        Params::from_pairs(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    }

    #[test]
    fn lists_structs_filters() {
        let params = p(&[
            ("NetworkInterfaceId.2", "eni-b"),
            ("NetworkInterfaceId.10", "eni-c"),
            ("NetworkInterfaceId.1", "eni-a"),
            ("Filter.1.Name", "tag:k"),
            ("Filter.1.Value.1", "v1"),
            ("Filter.1.Value.2", "v2"),
            ("Filter.2.Name", "status"),
            ("Filter.2.Value.1", "available"),
            ("TagSpecification.1.ResourceType", "network-interface"),
            ("TagSpecification.1.Tag.1.Key", "a"),
            ("TagSpecification.1.Tag.1.Value", "b"),
        ]);
        assert_eq!(
            params.list("NetworkInterfaceId"),
            ["eni-a", "eni-b", "eni-c"]
        );
        let f = params.filters();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].name, "tag:k");
        assert_eq!(f[0].values, ["v1", "v2"]);
        assert_eq!(
            params
                .tag_specs("network-interface")
                .unwrap()
                .get("a")
                .map(String::as_str),
            Some("b")
        );
        assert!(params.tag_specs("instance").is_err());
        assert!(params.parse::<u32>("NetworkInterfaceId.1").is_err());
    }
}
