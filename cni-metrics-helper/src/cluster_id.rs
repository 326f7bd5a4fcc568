//! The `CLUSTER_ID` dimension when `AWS_CLUSTER_ID` is unset: the instance the helper runs on
//! (IMDS), then `DescribeTags` of that instance for `eks:cluster-name`, `CLUSTER_ID`, `Name`, in
//! that order; the first non-empty value wins, else `k8s-cluster`. Also the region from IMDS when
//! `AWS_REGION` is unset. Owns only these lookups: it never fails the helper (IMDS blocked → the
//! default).

use std::time::Duration;

use crate::config::DEFAULT_CLUSTER_ID;

/// The tags that name the cluster, in priority order.
pub const CLUSTER_ID_TAGS: [&str; 3] = ["eks:cluster-name", "CLUSTER_ID", "Name"];

/// The pure rule: the first tag of [`CLUSTER_ID_TAGS`] with a non-empty value, else the default.
pub fn pick(value_of: impl Fn(&str) -> Option<String>) -> String {
    CLUSTER_ID_TAGS
        .iter()
        .find_map(|k| value_of(k).filter(|v| !v.is_empty()))
        .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_owned())
}

fn imds() -> aws_config::imds::Client {
    let provider = aws_config::provider_config::ProviderConfig::default()
        .with_http_client(crate::cloudwatch::http_client());
    aws_config::imds::Client::builder()
        .configure(&provider)
        .max_attempts(2)
        .connect_timeout(Duration::from_secs(2))
        .operation_timeout(Duration::from_secs(10))
        .build()
}

/// The instance's region from IMDS (`placement/region`), `None` when IMDS does not answer.
pub async fn region_from_imds() -> Option<String> {
    imds()
        .get("/latest/meta-data/placement/region")
        .await
        .ok()
        .map(|v| v.as_ref().trim().to_owned())
        .filter(|r| !r.is_empty())
}

/// The lookup; every failure (IMDS blocked, no permission, no tag) ends in the default.
pub async fn from_instance_tags(region: Option<&str>) -> String {
    let instance = match imds().get("/latest/meta-data/instance-id").await {
        Ok(id) => id.as_ref().trim().to_owned(),
        Err(e) => {
            tracing::warn!("cannot read the instance id from IMDS ({e}); CLUSTER_ID defaults");
            return DEFAULT_CLUSTER_ID.to_owned();
        }
    };
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(crate::cloudwatch::http_client());
    if let Some(r) = region {
        loader = loader.region(aws_config::Region::new(r.to_owned()));
    }
    let ec2 = aws_sdk_ec2::Client::new(&loader.load().await);
    let mut found = std::collections::BTreeMap::new();
    for key in CLUSTER_ID_TAGS {
        tracing::info!("Calling DescribeTags with key {key}");
        let filter = |name: &str, value: &str| {
            aws_sdk_ec2::types::Filter::builder()
                .name(name)
                .values(value)
                .build()
        };
        match ec2
            .describe_tags()
            .filters(filter("resource-id", &instance))
            .filters(filter("key", key))
            .send()
            .await
        {
            Ok(out) => {
                if let Some(v) = out.tags().first().and_then(|t| t.value()) {
                    found.insert(key, v.to_owned());
                    if !v.is_empty() {
                        break;
                    }
                }
            }
            Err(e) => tracing::warn!("DescribeTags {key}: {e}"),
        }
    }
    pick(|k| found.get(k).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_non_empty_tag_in_upstreams_order_else_the_default() {
        let tags = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            pick(tags(&[("Name", "n"), ("eks:cluster-name", "prod")])),
            "prod"
        );
        assert_eq!(
            pick(tags(&[("eks:cluster-name", ""), ("CLUSTER_ID", "c")])),
            "c"
        );
        assert_eq!(pick(tags(&[("Name", "node-1")])), "node-1");
        assert_eq!(pick(tags(&[])), DEFAULT_CLUSTER_ID);
    }
}
