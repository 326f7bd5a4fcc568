//! Whole-config table tests: upstream's defaults, fallbacks and refusals across sections (each row
//! citing the upstream function it pins) and the cross-section family rules; each section's own
//! parser is tested in its file. Must not: touch the process environment.

use std::path::PathBuf;
use std::time::Duration;

use super::env::parse_go_int_base0;
use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    let mut m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    m.entry("ENABLE_IPv4".into())
        .or_insert_with(|| "true".into());
    m
}

#[test]
fn defaults_are_upstreams() {
    let c = Config::from_env_map(&env(&[])).unwrap();
    assert_eq!(c.pool.warm_eni_target, 1);
    assert_eq!(c.pool.warm_ip_target, 0);
    assert_eq!(c.pool.max_eni, None);
    assert_eq!(c.pool.ip_cooldown_period, Duration::from_secs(30));
    assert_eq!(c.snat.connmark, 0x80);
    assert_eq!(c.node.eni_mtu, 9001);
    assert_eq!(c.node.veth_prefix, "eni");
    assert_eq!(c.snat.randomize_snat, RandomizeSnat::Prng);
    assert_eq!(
        c.node.backing_store,
        PathBuf::from("/var/run/aws-node/ipam.json")
    );
    assert_eq!(
        c.node.socket_path,
        PathBuf::from("/var/run/aws-node/ipamd.sock")
    );
    assert_eq!(
        c.http.introspection_bind,
        BindAddress::Tcp("127.0.0.1:61679".into())
    );
    assert!(c.snat.node_port_support && c.aws.enable_subnet_discovery && c.aws.manage_untagged_eni);
    assert_eq!(c.node.network_policy_mode, None);
    assert_eq!(c.aws.provider, ProviderKind::Ec2);
    assert_eq!(c.http.metrics_naming, MetricsNaming::Upstream);
    assert_eq!(c.pool.reclaim_unwired_after, Some(Duration::from_secs(300)));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

/// Values upstream v1.23.1 tolerates: ipamd starts with upstream's fallback and a warning
/// naming the variable. Each row cites where upstream's fallback is.
#[test]
fn tolerated_values_fall_back_like_upstream() {
    type Check = fn(&Config) -> bool;
    let rows: &[(&str, &str, Check, &str)] = &[
        // utils/utils.go GetBoolAsStringEnvVar: default on a parse error
        (
            "AWS_VPC_K8S_CNI_EXTERNALSNAT",
            "yes",
            |c| !c.snat.external_snat,
            "utils.go",
        ),
        (
            "AWS_VPC_CNI_NODE_PORT_SUPPORT",
            "on",
            |c| c.snat.node_port_support,
            "network.go getBoolEnvVar",
        ),
        (
            "ENABLE_PREFIX_DELEGATION",
            "enabled",
            |c| !c.pool.enable_prefix_delegation,
            "utils.go",
        ),
        (
            "DISABLE_INTROSPECTION",
            "nope",
            |c| !c.http.disable_introspection,
            "utils.go",
        ),
        // ipamd.go getWarmENITarget / getWarmIPTarget / getMinimumIPTarget / getWarmPrefixTarget
        (
            "WARM_ENI_TARGET",
            "-3",
            |c| c.pool.warm_eni_target == 1,
            "ipamd.go getWarmENITarget",
        ),
        (
            "WARM_ENI_TARGET",
            "two",
            |c| c.pool.warm_eni_target == 1,
            "ipamd.go getWarmENITarget",
        ),
        (
            "WARM_IP_TARGET",
            "-1",
            |c| c.pool.warm_ip_target == 0,
            "ipamd.go getWarmIPTarget",
        ),
        (
            "WARM_IP_TARGET",
            "lots",
            |c| c.pool.warm_ip_target == 0,
            "ipamd.go getWarmIPTarget",
        ),
        (
            "MINIMUM_IP_TARGET",
            "-5",
            |c| c.pool.minimum_ip_target == 0,
            "ipamd.go getMinimumIPTarget",
        ),
        // ipamd.go getMaxENI: < 1 or not an integer means the instance limit
        (
            "MAX_ENI",
            "0",
            |c| c.pool.max_eni.is_none(),
            "ipamd.go getMaxENI",
        ),
        (
            "MAX_ENI",
            "many",
            |c| c.pool.max_eni.is_none(),
            "ipamd.go getMaxENI",
        ),
        // network.go typeOfSNAT: unknown means prng
        (
            "AWS_VPC_K8S_CNI_RANDOMIZESNAT",
            "sometimes",
            |c| c.snat.randomize_snat == RandomizeSnat::Prng,
            "network.go typeOfSNAT",
        ),
        // network.go getConnmark: ParseInt(s, 0, 64); error, <= 0 or > MaxUint32 gives 0x80
        (
            "AWS_VPC_K8S_CNI_CONNMARK",
            "0",
            |c| c.snat.connmark == 0x80,
            "network.go getConnmark",
        ),
        (
            "AWS_VPC_K8S_CNI_CONNMARK",
            "-8",
            |c| c.snat.connmark == 0x80,
            "network.go getConnmark",
        ),
        (
            "AWS_VPC_K8S_CNI_CONNMARK",
            "0x1ffffffff",
            |c| c.snat.connmark == 0x80,
            "network.go getConnmark",
        ),
        (
            "AWS_VPC_K8S_CNI_CONNMARK",
            "mark",
            |c| c.snat.connmark == 0x80,
            "network.go getConnmark",
        ),
        // sgpp/utils.go LoadEnforcingModeFromEnv: anything else is strict (pod ENIs off, so
        // the mode has no effect either way)
        (
            "POD_SECURITY_GROUP_ENFORCING_MODE",
            "lenient",
            |_| true,
            "sgpp/utils.go",
        ),
        // network.go parseCIDRString: invalid entries are skipped
        (
            "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
            "10.0.0.0/8,bogus",
            |c| c.snat.exclude_snat_cidrs.len() == 1,
            "network.go parseCIDRString",
        ),
        // awssession/session.go: HTTP_TIMEOUT not an integer gives 10 s
        (
            "HTTP_TIMEOUT",
            "soon",
            |c| c.aws.http_timeout == Duration::from_secs(10),
            "awssession/session.go",
        ),
        // ipamd.go ADDITIONAL_ENI_TAGS: an unmarshal error tags nothing extra
        (
            "ADDITIONAL_ENI_TAGS",
            "[1]",
            |c| c.aws.additional_eni_tags.is_empty(),
            "awsutils.go",
        ),
        // logger/zaplogger.go getZapLevel: unknown is debug
        (
            "AWS_VPC_K8S_CNI_LOGLEVEL",
            "chatty",
            |c| c.log.level == LogLevel::Debug,
            "zaplogger.go getZapLevel",
        ),
    ];
    for (var, val, check, source) in rows {
        let c = Config::from_env_map(&env(&[(var, val)]))
            .unwrap_or_else(|e| panic!("{var}={val} refused ({source}): {e}"));
        assert!(check(&c), "{var}={val}: wrong fallback ({source})");
        assert_eq!(c.warnings.len(), 1, "{var}={val}: {:?}", c.warnings);
        assert_eq!(c.warnings[0].var, *var);
        assert_eq!(c.warnings[0].kind, WarningKind::Fallback);
        assert!(c.warnings[0].to_string().contains(var));
    }
}

/// Values upstream refuses (its entrypoint's validateEnvVars or ipamd's start fails), and
/// our own knobs: refused with the variable named.
#[test]
fn refused_values_name_the_variable() {
    for (var, val) in [
        ("AWS_VPC_ENI_MTU", "100"),            // aws-vpc-cni main.go validateMTU
        ("AWS_VPC_ENI_MTU", "big"),            // validateMTU
        ("AWS_VPC_K8S_CNI_VETHPREFIX", "eth"), // validateEnvVars
        ("AWS_VPC_K8S_CNI_VETHPREFIX", "toolong"),
        ("IP_COOLDOWN_PERIOD", "-1"), // validateEnvVars
        ("IP_COOLDOWN_PERIOD", "soon"),
        ("NETWORK_POLICY_ENFORCING_MODE", "lax"), // ipamd.go getNetworkPolicyMode
        ("IPAMD_ENI_PROVIDER", "gcp"),
        ("METRICS_NAMING", "openmetrics"),
        ("IPAMD_RECLAIM_UNWIRED_SECONDS", "-1"),
        ("IPAMD_POOL_TICK_SECONDS", "0"),
        ("IPAMD_LEAKED_ENI_PERIOD_SECONDS", "59"),
        ("IPAMD_SECURITY_GROUP_CHECK_SECONDS", "0"),
    ] {
        let e = Config::from_env_map(&env(&[(var, val)])).unwrap_err();
        assert_eq!(e.var, var, "{e}");
        assert!(e.to_string().contains(var) && e.to_string().contains("expected"));
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)`, as `getConnmark` reads the mark.
#[test]
fn connmark_parses_like_go_base_zero() {
    for (val, want) in [
        ("128", 128),
        ("0x80", 0x80),
        ("0X4000", 0x4000),
        ("0o200", 0o200),
        ("0200", 0o200),
        ("0b1000_0000", 0x80),
        ("+64", 64),
        ("4294967295", 0xffff_ffff),
    ] {
        let c = Config::from_env_map(&env(&[("AWS_VPC_K8S_CNI_CONNMARK", val)])).unwrap();
        assert_eq!(c.snat.connmark, want, "{val}");
        assert!(c.warnings.is_empty(), "{val}: {:?}", c.warnings);
    }
    for bad in ["1_000", "0x", "08", "0x_80_", "--1"] {
        assert_eq!(parse_go_int_base0(bad), None, "{bad}");
    }
}

/// Features this ipamd does not implement: refused where running without them would put
/// pods in the wrong subnet or without their security groups; otherwise accepted with an
/// `Unimplemented` warning. Never silent.
#[test]
fn unimplemented_features_are_refused_or_warned() {
    // Security groups for pods read the pod's annotation: refused without a Kubernetes client.
    let var = "ENABLE_POD_ENI";
    let e = Config::from_env_map(&env(&[(var, "true")])).unwrap_err();
    assert_eq!(e.var, var);
    assert!(e.to_string().contains("MY_NODE_NAME"), "{e}");
    Config::from_env_map(&env(&[(var, "false")])).unwrap();
    // custom networking needs the Node and its ENIConfig: refused without a Kubernetes client
    let e =
        Config::from_env_map(&env(&[("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true")])).unwrap_err();
    assert_eq!(e.var, "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG");
    assert!(e.to_string().contains("MY_NODE_NAME"), "{e}");
    for (var, val) in [
        ("AWS_MANAGE_ENIS_NON_SCHEDULABLE", "true"),
        ("AWS_MANAGE_ENIS_NON_SCHEDULABLE", "false"),
        ("ANNOTATE_POD_IP", "true"),
    ] {
        let c = Config::from_env_map(&env(&[(var, val)])).unwrap();
        assert_eq!(c.warnings.len(), 1, "{var}: {:?}", c.warnings);
        assert_eq!(c.warnings[0].var, var);
        assert_eq!(c.warnings[0].kind, WarningKind::Unimplemented);
    }
    // Subnet discovery is implemented (aws::subnets): no warning, on or off.
    for (var, val) in [
        ("ENABLE_MULTI_NIC", "false"),
        ("ENABLE_MULTI_NIC", "true"),
        ("ANNOTATE_POD_IP", "false"),
        ("ENABLE_SUBNET_DISCOVERY", "true"),
        ("ENABLE_SUBNET_DISCOVERY", "false"),
    ] {
        let c = Config::from_env_map(&env(&[(var, val)])).unwrap();
        assert!(c.warnings.is_empty(), "{var}={val}: {:?}", c.warnings);
    }
}

#[test]
fn family_rules() {
    // upstream's isConfigValid refusals, with its log line
    let both = Config::from_env_map(&env(&[("ENABLE_IPv6", "true")])).unwrap_err();
    assert_eq!(both.var, "ENABLE_IPv6");
    assert!(both.to_string().contains("IPv4 and IPv6 are both enabled"));
    let none = Config::from_env_map(&env(&[("ENABLE_IPv4", "false")])).unwrap_err();
    assert_eq!(none.var, "ENABLE_IPv4");
    assert!(none.to_string().contains("both disabled"));
    let no_pd = Config::from_env_map(&env(&[("ENABLE_IPv4", "false"), ("ENABLE_IPv6", "true")]))
        .unwrap_err();
    assert_eq!(no_pd.var, "ENABLE_PREFIX_DELEGATION");
    assert!(
        no_pd
            .to_string()
            .contains("IPv6 is supported only in Prefix Delegation mode")
    );
    // IPv6 mode, as the chart configures it (WARM_PREFIX_TARGET=1: upstream's entrypoint
    // refuses PD with every target at 0 in either family)
    let v6 = Config::from_env_map(&env(&[
        ("ENABLE_IPv4", "false"),
        ("ENABLE_IPv6", "true"),
        ("ENABLE_PREFIX_DELEGATION", "true"),
        ("WARM_PREFIX_TARGET", "1"),
    ]))
    .unwrap();
    assert_eq!(v6.family, AddressFamily::V6);
    assert!(v6.family.is_v6_only() && v6.family.has_v6() && !v6.family.has_v4());
    let v6_no_target = Config::from_env_map(&env(&[
        ("ENABLE_IPv4", "false"),
        ("ENABLE_IPv6", "true"),
        ("ENABLE_PREFIX_DELEGATION", "true"),
    ]))
    .unwrap_err();
    assert_eq!(v6_no_target.var, "WARM_PREFIX_TARGET");
    let pd_zero = Config::from_env_map(&env(&[("ENABLE_PREFIX_DELEGATION", "true")])).unwrap_err();
    assert_eq!(pd_zero.var, "WARM_PREFIX_TARGET");
    assert_eq!(
        Config::from_env_map(&env(&[])).unwrap().family,
        AddressFamily::V4
    );
    // dual-stack pods: ours, an IPv4-mode option
    let dual = Config::from_env_map(&env(&[(ENABLE_DUAL_STACK_PODS, "true")])).unwrap();
    assert_eq!(dual.family, AddressFamily::DualStack);
    assert!(dual.family.has_v4() && dual.family.has_v6() && !dual.family.is_v6_only());
    let dual_v6 = Config::from_env_map(&env(&[
        ("ENABLE_IPv4", "false"),
        ("ENABLE_IPv6", "true"),
        ("ENABLE_PREFIX_DELEGATION", "true"),
        ("WARM_PREFIX_TARGET", "1"),
        (ENABLE_DUAL_STACK_PODS, "true"),
    ]))
    .unwrap_err();
    assert_eq!(dual_v6.var, ENABLE_DUAL_STACK_PODS);
    let dual_custom = Config::from_env_map(&env(&[
        (ENABLE_DUAL_STACK_PODS, "true"),
        ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true"),
        ("MY_NODE_NAME", "n1"),
        ("KUBECONFIG", "/tmp/kc"),
    ]))
    .unwrap_err();
    assert_eq!(dual_custom.var, ENABLE_DUAL_STACK_PODS);
}

/// The Kubernetes section: a client when MY_NODE_NAME and a configuration exist; custom
/// networking and ANNOTATE_POD_IP then work, ENIConfig keys fall back to upstream's default.
#[test]
fn kubernetes_section() {
    let c = Config::from_env_map(&env(&[("MY_NODE_NAME", "n1")])).unwrap();
    assert_eq!(c.kube.api, None, "no client configuration");
    let c = Config::from_env_map(&env(&[
        ("MY_NODE_NAME", "n1"),
        ("MY_POD_NAME", "aws-node-x"),
        ("KUBECONFIG", "/tmp/kc"),
        ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true"),
        ("ANNOTATE_POD_IP", "true"),
        ("ENI_CONFIG_LABEL_DEF", "topology.kubernetes.io/zone"),
        ("ENI_CONFIG_ANNOTATION_DEF", ""),
    ]))
    .unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert!(c.kube.custom_network_cfg && c.kube.annotate_pod_ip);
    let k = c.kube.api.unwrap();
    assert_eq!(k.source, KubeSource::Kubeconfig("/tmp/kc".into()));
    assert_eq!(
        (
            k.node_name.as_str(),
            k.pod_name.as_str(),
            k.pod_namespace.as_str()
        ),
        ("n1", "aws-node-x", "kube-system")
    );
    assert_eq!(c.kube.eni_config_keys.label, "topology.kubernetes.io/zone");
    assert_eq!(
        c.kube.eni_config_keys.annotation,
        "k8s.amazonaws.com/eniConfig"
    );
    let c = Config::from_env_map(&env(&[
        ("MY_NODE_NAME", "n1"),
        ("KUBERNETES_SERVICE_HOST", "10.100.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("CLUSTER_ENDPOINT", "https://api.example:6443"),
        ("MY_POD_NAMESPACE", "cni"),
    ]))
    .unwrap();
    let k = c.kube.api.unwrap();
    assert!(
        matches!(k.source, KubeSource::InCluster { ref host, port: 443, .. } if host == "10.100.0.1")
    );
    assert_eq!(
        k.cluster_endpoint.as_deref(),
        Some("https://api.example:6443")
    );
    assert_eq!(k.pod_namespace, "cni");
    // custom networking with IPv6 stays refused, as upstream
    let e = Config::from_env_map(&env(&[
        ("ENABLE_IPv6", "true"),
        ("ENABLE_IPv4", "false"),
        ("ENABLE_PREFIX_DELEGATION", "true"),
        ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true"),
        ("MY_NODE_NAME", "n1"),
        ("KUBECONFIG", "/tmp/kc"),
    ]))
    .unwrap_err();
    assert_eq!(e.var, "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG");
}

/// What upstream's aws-node entrypoint refuses before it starts ipamd
/// (cmd/aws-vpc-cni/main.go v1.23.1): `validateEnvVars` L338-342 (the plugin log on stdout,
/// compared exactly), L374 (both MTUs through `validateMTU`), `validateMTU` L395-398 (`Atoi`;
/// a set empty value is no integer), L400-410 (576..=9001, or 1280..=9001 with `ENABLE_IPv6`);
/// `_main` L420-421 exits 1 (ours: `main.rs`, before anything starts).
#[test]
fn entrypoint_refusals_as_upstreams_validate_env_vars() {
    let v6 = [
        ("ENABLE_IPv4", "false"),
        ("ENABLE_IPv6", "true"),
        ("ENABLE_PREFIX_DELEGATION", "true"),
        ("WARM_PREFIX_TARGET", "1"),
    ];
    type Row<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let refused: &[Row<'_>] = &[
        (
            &[("AWS_VPC_K8S_PLUGIN_LOG_FILE", "stdout")],
            "AWS_VPC_K8S_PLUGIN_LOG_FILE",
            "cannot be set to stdout",
        ),
        (
            &[("POD_MTU", "575")],
            "POD_MTU",
            "cannot be less than 576 or greater than 9001 in IPv4",
        ),
        (&[("POD_MTU", "9002")], "POD_MTU", "in IPv4"),
        (
            &[("POD_MTU", "")],
            "POD_MTU",
            "POD_MTU MUST be a valid integer",
        ),
        (
            &[("POD_MTU", " 1500")],
            "POD_MTU",
            "MUST be a valid integer",
        ),
        (
            &[("POD_MTU", "1_500")],
            "POD_MTU",
            "MUST be a valid integer",
        ),
        (
            &[("AWS_VPC_ENI_MTU", "")],
            "AWS_VPC_ENI_MTU",
            "AWS_VPC_ENI_MTU MUST be a valid integer",
        ),
        (
            &[v6[0], v6[1], v6[2], v6[3], ("POD_MTU", "1279")],
            "POD_MTU",
            "POD_MTU cannot be less than 1280 or greater than 9001 in IPv6",
        ),
        (
            &[v6[0], v6[1], v6[2], v6[3], ("AWS_VPC_ENI_MTU", "1000")],
            "AWS_VPC_ENI_MTU",
            "AWS_VPC_ENI_MTU cannot be less than 1280 or greater than 9001 in IPv6",
        ),
    ];
    for (pairs, var, says) in refused {
        let e = Config::from_env_map(&env(pairs)).unwrap_err();
        assert_eq!(e.var, *var, "{pairs:?}: {e}");
        assert!(e.to_string().contains(says), "{pairs:?}: {e}");
    }
    let accepted: &[&[(&str, &str)]] = &[
        &[("AWS_VPC_K8S_PLUGIN_LOG_FILE", "stderr")],
        // the entrypoint compares exactly; the plugin then writes to stdout as upstream's does
        &[("AWS_VPC_K8S_PLUGIN_LOG_FILE", "STDOUT")],
        &[("POD_MTU", "576")],
        &[("POD_MTU", "+9001")],
        &[("POD_MTU", "1279"), ("AWS_VPC_ENI_MTU", "576")],
        &[
            v6[0],
            v6[1],
            v6[2],
            v6[3],
            ("POD_MTU", "1280"),
            ("AWS_VPC_ENI_MTU", "9001"),
        ],
    ];
    for pairs in accepted {
        Config::from_env_map(&env(pairs)).unwrap_or_else(|e| panic!("{pairs:?}: {e}"));
    }
}
