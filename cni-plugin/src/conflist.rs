//! The conflist as the aws-node container installs it: a template (ours or the user's, e.g. an
//! existing `10-aws.conflist`) filled in from the container's real environment at start-up: every
//! placeholder replaced, then `bandwidth` (ENABLE_BANDWIDTH_PLUGIN) and `tuning` (DISABLE_POD_V6)
//! appended to the chain. Pure: the environment comes in as a map; the `aws-cni-conflist` binary
//! reads the files and the environment. Must not: talk to IMDS or ipamd, touch the network.

use std::collections::HashMap;

/// Pod IPv6 egress in an IPv4 cluster.
const EGRESS_V6: Egress = Egress {
    subnet: "fd00::ac:00/118",
    dst: "::/0",
    data_dir: "/run/cni/v4pd/egress-v6-ipam",
    log_env: "AWS_VPC_K8S_EGRESS_V6_PLUGIN_LOG_FILE",
    log_default: "/var/log/aws-routed-eni/egress-v6-plugin.log",
    enabled_env: "ENABLE_V6_EGRESS",
    enabled_default: false,
};

/// Pod IPv4 egress in an IPv6 cluster.
const EGRESS_V4: Egress = Egress {
    subnet: "169.254.172.0/22",
    dst: "0.0.0.0/0",
    data_dir: "/run/cni/v6pd/egress-v4-ipam",
    log_env: "AWS_VPC_K8S_EGRESS_V4_PLUGIN_LOG_FILE",
    log_default: "/var/log/aws-routed-eni/egress-v4-plugin.log",
    enabled_env: "ENABLE_V4_EGRESS",
    enabled_default: true,
};

struct Egress {
    subnet: &'static str,
    dst: &'static str,
    data_dir: &'static str,
    log_env: &'static str,
    log_default: &'static str,
    enabled_env: &'static str,
    enabled_default: bool,
}

/// The filled-in conflist and what the operator should hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filled {
    /// The conflist text to install.
    pub text: String,
    /// Settings that were read with a fallback or cannot take effect here (log them loudly).
    pub warnings: Vec<String>,
}

/// Why no conflist can be installed.
#[derive(Debug, thiserror::Error)]
pub enum ConflistError {
    /// The template, once filled in, is not a JSON object (fatal).
    #[error("the filled-in conflist is not a JSON object")]
    NotJson(#[source] serde_json::Error),
    /// A plugin is to be chained but the conflist has no `plugins` list.
    #[error("cannot chain {0}: the conflist has no \"plugins\" list")]
    NoPlugins(&'static str),
    /// IPv6 cluster: the node's primary IPv4 (egress-cni's `nodeIP`) is unknown (fatal). The cause
    /// is kept for `Debug` but is no `source`: the message is the installer's, unchanged.
    #[error("failed to get Node IP")]
    NodeIp(Box<dyn std::error::Error + Send + Sync>),
}

/// Which primary address [`fill`] asks for (IMDS `local-ipv4` / `ipv6`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeIpFamily {
    /// `local-ipv4`.
    V4,
    /// `ipv6`.
    V6,
}

/// The environment, read with Go's rules: a variable that is set, even to "", wins over the
/// default; booleans as `strconv.ParseBool`, an unparsable value falls back to the default, with an
/// error log.
struct Env<'a> {
    vars: &'a HashMap<String, String>,
    warnings: Vec<String>,
}

impl Env<'_> {
    fn get(&self, key: &str, default: &str) -> String {
        self.vars
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }

    fn bool(&mut self, key: &str, default: bool) -> bool {
        let Some(v) = self.vars.get(key) else {
            return default;
        };
        match v.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
            "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
            _ => {
                self.warnings.push(format!(
                    "{key}={v:?} is not a boolean; using the default {default}"
                ));
                default
            }
        }
    }
}

/// Fills in `template` from `vars` (see the module doc). `primary_ip` answers the node's primary
/// address of a family: an IPv6 cluster always needs the IPv4 (`nodeIP` of the IPv4 egress; failure
/// is fatal), an IPv4 cluster with `ENABLE_V6_EGRESS` the IPv6 (failure disables the egress with a
/// warning naming its cause chain).
pub fn fill<E>(
    template: &str,
    vars: &HashMap<String, String>,
    primary_ip: &dyn Fn(NodeIpFamily) -> Result<String, E>,
) -> Result<Filled, ConflistError>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut env = Env {
        vars,
        warnings: Vec::new(),
    };
    let ipv6_cluster = env.bool("ENABLE_IPv6", false);
    let egress = if ipv6_cluster { &EGRESS_V4 } else { &EGRESS_V6 };
    let mut egress_enabled = env.bool(egress.enabled_env, egress.enabled_default);
    let mut node_ip = String::new();
    if ipv6_cluster {
        node_ip = primary_ip(NodeIpFamily::V4).map_err(|e| ConflistError::NodeIp(e.into()))?;
    } else if egress_enabled {
        match primary_ip(NodeIpFamily::V6) {
            Ok(ip) => node_ip = ip,
            Err(e) => {
                let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                env.warnings.push(format!(
                    "To support IPv6 egress, node primary ENI must have a global IPv6 address, \
                     error: {}; egress-cni disabled",
                    crate::spec::error::chain(&*e)
                ));
                egress_enabled = false;
            }
        }
    }
    let eni_mtu = env.get("AWS_VPC_ENI_MTU", "9001");
    // The order of replacement matters: a value containing a later placeholder gets it filled.
    let replacements = [
        (
            "__VETHPREFIX__",
            env.get("AWS_VPC_K8S_CNI_VETHPREFIX", "eni"),
        ),
        ("__MTU__", env.get("POD_MTU", &eni_mtu)),
        (
            "__PODSGENFORCINGMODE__",
            env.get("POD_SECURITY_GROUP_ENFORCING_MODE", "strict"),
        ),
        (
            "__PLUGINLOGFILE__",
            env.get(
                "AWS_VPC_K8S_PLUGIN_LOG_FILE",
                "/var/log/aws-routed-eni/plugin.log",
            ),
        ),
        (
            "__PLUGINLOGLEVEL__",
            env.get("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "Debug"),
        ),
        (
            "__EGRESSPLUGINLOGFILE__",
            env.get(egress.log_env, egress.log_default),
        ),
        ("__EGRESSPLUGINENABLED__", egress_enabled.to_string()),
        ("__EGRESSPLUGINIPAMSUBNET__", egress.subnet.to_owned()),
        ("__EGRESSPLUGINIPAMDST__", egress.dst.to_owned()),
        ("__EGRESSPLUGINIPAMDATADIR__", egress.data_dir.to_owned()),
        (
            "__RANDOMIZESNAT__",
            env.get("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "prng"),
        ),
        ("__NODEIP__", node_ip),
    ];
    let mut text = template.to_owned();
    for (placeholder, value) in &replacements {
        text = text.replace(placeholder, value);
    }
    let bandwidth = env.bool("ENABLE_BANDWIDTH_PLUGIN", false);
    let disable_pod_v6 = env.bool("DISABLE_POD_V6", false);
    let mut conf: serde_json::Value =
        serde_json::from_str(&text).map_err(ConflistError::NotJson)?;
    if !conf.is_object() {
        return Err(ConflistError::NotJson(serde::de::Error::custom(
            "not an object",
        )));
    }
    if bandwidth || disable_pod_v6 {
        let mut append = |name: &'static str, plugin: serde_json::Value| {
            conf.get_mut("plugins")
                .and_then(serde_json::Value::as_array_mut)
                .ok_or(ConflistError::NoPlugins(name))
                .map(|plugins| plugins.push(plugin))
        };
        if bandwidth {
            append(
                "bandwidth",
                serde_json::json!({"type": "bandwidth", "capabilities": {"bandwidth": true}}),
            )?;
        }
        if disable_pod_v6 {
            append(
                "tuning",
                serde_json::json!({"type": "tuning", "sysctl": {
                    "net.ipv6.conf.all.disable_ipv6": "1",
                    "net.ipv6.conf.default.disable_ipv6": "1",
                    "net.ipv6.conf.lo.disable_ipv6": "1"}}),
            )?;
        }
        // The chain keeps every field of the template (a re-marshal through a fixed struct would
        // drop fields it does not know, e.g. portmap's "snat").
        text = serde_json::to_string_pretty(&conf).map_err(ConflistError::NotJson)?;
    }
    Ok(Filled {
        text,
        warnings: env.warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// A node with both primary addresses.
    fn imds(family: NodeIpFamily) -> Result<String, std::io::Error> {
        Ok(match family {
            NodeIpFamily::V4 => "198.18.0.10".to_owned(),
            NodeIpFamily::V6 => "2001:db8::10".to_owned(),
        })
    }

    /// Every placeholder of upstream's template, one per field so each can be checked.
    const TEMPLATE: &str = r#"{"cniVersion":"0.4.0","name":"aws-cni","plugins":[{"type":"aws-cni",
        "vethPrefix":"__VETHPREFIX__","mtu":"__MTU__","podSGEnforcingMode":"__PODSGENFORCINGMODE__",
        "pluginLogFile":"__PLUGINLOGFILE__","pluginLogLevel":"__PLUGINLOGLEVEL__"},
        {"type":"egress-cni","enabled":"__EGRESSPLUGINENABLED__","randomizeSNAT":"__RANDOMIZESNAT__",
        "nodeIP":"__NODEIP__","pluginLogFile":"__EGRESSPLUGINLOGFILE__",
        "ipam":{"subnet":"__EGRESSPLUGINIPAMSUBNET__","dst":"__EGRESSPLUGINIPAMDST__","dataDir":"__EGRESSPLUGINIPAMDATADIR__"}},
        {"type":"portmap","snat":true}]}"#;

    fn fields(vars: &[(&str, &str)]) -> (serde_json::Value, Vec<String>) {
        let f = fill(TEMPLATE, &env(vars), &imds).unwrap();
        (serde_json::from_str(&f.text).unwrap(), f.warnings)
    }

    /// Placeholders of older upstream templates that v1.23.1's entrypoint no longer replaces
    /// stay as written (a custom template still carrying them is not silently rewritten).
    #[test]
    fn older_egress_placeholders_are_not_replaced_as_v1_23_1() {
        let template = r#"{"cniVersion":"0.4.0","name":"aws-cni","plugins":[{"type":"aws-cni"},
            {"type":"egress-v4-cni","enabled":"__EGRESSV4PLUGINENABLED__",
            "pluginLogFile":"__EGRESSV4PLUGINLOGFILE__"}]}"#;
        let f = fill(template, &env(&[("ENABLE_IPv6", "true")]), &imds).unwrap();
        assert!(f.text.contains("__EGRESSV4PLUGINENABLED__"), "{}", f.text);
        assert!(f.text.contains("__EGRESSV4PLUGINLOGFILE__"), "{}", f.text);
    }

    /// Each row: environment, then (JSON pointer, value) as upstream's generateJSON fills it
    /// (cmd/aws-vpc-cni/main.go: defaults defaultVethPrefix, defaultMTU, POD_MTU over
    /// AWS_VPC_ENI_MTU, defaultPodSGEnforcingMode, defaultPluginLogFile, defaultPluginLogLevel
    /// "Debug", defaultRandomizeSNAT, the egressPlugin* constants per cluster family).
    #[test]
    fn placeholders_as_upstreams_entrypoint() {
        type Pairs<'a> = &'a [(&'a str, &'a str)];
        let table: &[(Pairs<'_>, Pairs<'_>)] = &[
            (
                &[],
                &[
                    ("/plugins/0/vethPrefix", "eni"),
                    ("/plugins/0/mtu", "9001"),
                    ("/plugins/0/podSGEnforcingMode", "strict"),
                    (
                        "/plugins/0/pluginLogFile",
                        "/var/log/aws-routed-eni/plugin.log",
                    ),
                    ("/plugins/0/pluginLogLevel", "Debug"),
                    ("/plugins/1/enabled", "false"),
                    ("/plugins/1/randomizeSNAT", "prng"),
                    ("/plugins/1/nodeIP", ""),
                    (
                        "/plugins/1/pluginLogFile",
                        "/var/log/aws-routed-eni/egress-v6-plugin.log",
                    ),
                    ("/plugins/1/ipam/subnet", "fd00::ac:00/118"),
                    ("/plugins/1/ipam/dst", "::/0"),
                    ("/plugins/1/ipam/dataDir", "/run/cni/v4pd/egress-v6-ipam"),
                ],
            ),
            (
                &[("AWS_VPC_ENI_MTU", "1500")],
                &[("/plugins/0/mtu", "1500")],
            ),
            (
                &[("AWS_VPC_ENI_MTU", "1500"), ("POD_MTU", "1400")],
                &[("/plugins/0/mtu", "1400")],
            ),
            // Set but empty wins over the default (utils.GetEnv uses os.LookupEnv).
            (
                &[("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "")],
                &[("/plugins/0/pluginLogLevel", "")],
            ),
            (
                &[
                    ("AWS_VPC_K8S_CNI_VETHPREFIX", "pod"),
                    ("POD_SECURITY_GROUP_ENFORCING_MODE", "standard"),
                    ("AWS_VPC_K8S_PLUGIN_LOG_FILE", "stderr"),
                    ("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "none"),
                ],
                &[
                    ("/plugins/0/vethPrefix", "pod"),
                    ("/plugins/0/podSGEnforcingMode", "standard"),
                    ("/plugins/0/pluginLogFile", "stderr"),
                    ("/plugins/1/randomizeSNAT", "none"),
                ],
            ),
            (
                &[("AWS_VPC_K8S_EGRESS_V6_PLUGIN_LOG_FILE", "/tmp/e6.log")],
                &[("/plugins/1/pluginLogFile", "/tmp/e6.log")],
            ),
            (
                &[("ENABLE_V6_EGRESS", "true")],
                &[
                    ("/plugins/1/enabled", "true"),
                    ("/plugins/1/nodeIP", "2001:db8::10"),
                ],
            ),
            (
                &[("ENABLE_V6_EGRESS", "yes")],
                &[("/plugins/1/enabled", "false")],
            ),
            // IPv6 cluster: IPv4 egress, on by default (ENABLE_V4_EGRESS).
            (
                &[("ENABLE_IPv6", "true")],
                &[
                    ("/plugins/1/enabled", "true"),
                    ("/plugins/1/nodeIP", "198.18.0.10"),
                    ("/plugins/1/ipam/subnet", "169.254.172.0/22"),
                    ("/plugins/1/ipam/dst", "0.0.0.0/0"),
                    ("/plugins/1/ipam/dataDir", "/run/cni/v6pd/egress-v4-ipam"),
                    (
                        "/plugins/1/pluginLogFile",
                        "/var/log/aws-routed-eni/egress-v4-plugin.log",
                    ),
                ],
            ),
            (
                &[("ENABLE_IPv6", "1"), ("ENABLE_V4_EGRESS", "false")],
                &[
                    ("/plugins/1/enabled", "false"),
                    ("/plugins/1/nodeIP", "198.18.0.10"),
                ],
            ),
        ];
        for (vars, want) in table {
            let (got, _) = fields(vars);
            for (pointer, value) in *want {
                assert_eq!(
                    got.pointer(pointer).and_then(|v| v.as_str()),
                    Some(*value),
                    "{vars:?} {pointer}"
                );
            }
        }
    }

    /// bandwidth, then tuning, appended after the template's chain (upstream's order).
    #[test]
    fn optional_plugins_are_chained_in_upstreams_order() {
        let types = |vars: &[(&str, &str)]| {
            let (got, _) = fields(vars);
            got["plugins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["type"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(types(&[]), ["aws-cni", "egress-cni", "portmap"]);
        assert_eq!(
            types(&[("ENABLE_BANDWIDTH_PLUGIN", "true"), ("DISABLE_POD_V6", "T")]),
            ["aws-cni", "egress-cni", "portmap", "bandwidth", "tuning"]
        );
        assert_eq!(
            types(&[("DISABLE_POD_V6", "1")]),
            ["aws-cni", "egress-cni", "portmap", "tuning"]
        );
        assert_eq!(
            types(&[("ENABLE_BANDWIDTH_PLUGIN", "False")]),
            ["aws-cni", "egress-cni", "portmap"]
        );
        let (got, _) = fields(&[("DISABLE_POD_V6", "true")]);
        assert_eq!(
            got["plugins"][3]["sysctl"]["net.ipv6.conf.lo.disable_ipv6"],
            "1"
        );
        // Fields upstream's re-marshal would drop are kept.
        assert_eq!(got["plugins"][2]["snat"], true);
    }

    #[test]
    fn warnings_and_refusals() {
        let (_, warnings) = fields(&[("ENABLE_BANDWIDTH_PLUGIN", "maybe")]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // An IPv4-only node with ENABLE_V6_EGRESS: egress disabled with a warning (upstream).
        let v4_only = |f: NodeIpFamily| match f {
            NodeIpFamily::V4 => Ok("198.18.0.10".to_owned()),
            NodeIpFamily::V6 => Err(std::io::Error::other("no ipv6")),
        };
        let f = fill(TEMPLATE, &env(&[("ENABLE_V6_EGRESS", "true")]), &v4_only).unwrap();
        let got: serde_json::Value = serde_json::from_str(&f.text).unwrap();
        assert_eq!(got["plugins"][1]["enabled"], "false");
        assert_eq!(got["plugins"][1]["nodeIP"], "");
        assert!(
            f.warnings.iter().any(|w| w.contains("global IPv6")),
            "{:?}",
            f.warnings
        );
        // The cause is named in the warning, whatever the lookup's error type (a plain text
        // one, as callers outside the plugin pass, included).
        let text = |_: NodeIpFamily| Err::<String, String>("no ipv6".to_owned());
        let f = fill(TEMPLATE, &env(&[("ENABLE_V6_EGRESS", "true")]), &text).unwrap();
        assert_eq!(
            f.warnings,
            [
                "To support IPv6 egress, node primary ENI must have a global IPv6 address, error: no ipv6; egress-cni disabled"
            ]
        );
        // An IPv6 cluster without the node's IPv4: fatal, as upstream.
        let none = |_: NodeIpFamily| Err::<String, _>(std::io::Error::other("imds down"));
        assert!(matches!(
            fill(TEMPLATE, &env(&[("ENABLE_IPv6", "true")]), &none),
            Err(ConflistError::NodeIp(_))
        ));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("ENABLE_BANDWIDTH_PLUGIN=\"maybe\"")),
            "{warnings:?}"
        );
        assert!(matches!(
            fill("{\"a\":\"__MTU__\"", &env(&[]), &imds),
            Err(ConflistError::NotJson(_))
        ));
        assert!(matches!(
            fill("[1]", &env(&[]), &imds),
            Err(ConflistError::NotJson(_))
        ));
        assert!(matches!(
            fill(
                "{\"name\":\"x\"}",
                &env(&[("DISABLE_POD_V6", "true")]),
                &imds
            ),
            Err(ConflistError::NoPlugins("tuning"))
        ));
        // Without chaining, the text is the template with its placeholders replaced, verbatim.
        assert_eq!(
            fill("{\"mtu\": \"__MTU__\"}", &env(&[]), &imds)
                .unwrap()
                .text,
            "{\"mtu\": \"9001\"}"
        );
    }
}
