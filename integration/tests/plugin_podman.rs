//! `aws-cni` driven by a real CNI client: podman (CNI backend) inside a throwaway node netns
//! with a simulated VPC. ADD two pods (one on the secondary ENI) -> ping both ways and out via
//! the ENI -> CHECK with the result podman cached -> DEL -> nothing left behind.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use integration::node::{NODE_PRIMARY_IP, SECONDARY_TABLE, VPC_SERVICE_IP};
use integration::{CniCall, Podman, TestNode, built_binary, can_run_kernel_tests};

#[test]
fn podman_add_ping_check_del_leaves_nothing() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("podman");
    node.attach_vpc();
    let ipamd = node.start_test_ipamd();
    let network = node.name().to_owned();
    let plugin_conf = format!(
        r#"{{"type":"aws-cni","mtu":"9001","vethPrefix":"eni","podSGEnforcingMode":"strict",
            "ipamdSocket":"{}","pluginLogFile":"{}","pluginLogLevel":"Debug",
            "capabilities":{{"io.kubernetes.cri.pod-annotations":true}}}}"#,
        ipamd.socket.display(),
        node.dir().join("plugin.log").display()
    );
    let aws_cni = built_binary("aws-cni");
    let podman = Podman::new(
        &mut node,
        &network,
        &format!("[{plugin_conf}]"),
        &[&aws_cni],
    );

    let id_a = podman.run("pod-a").expect("podman run pod-a");
    let id_b = podman.run("secondary-b").expect("podman run secondary-b");
    let allocs = ipamd.allocations();
    assert_eq!(allocs.len(), 2, "{allocs:?}");
    let ip_of = |cid: &str| {
        allocs
            .iter()
            .find(|a| a["containerID"] == cid)
            .and_then(|a| a["ip"].as_str())
            .unwrap_or_else(|| panic!("no allocation for {cid}: {allocs:?}"))
            .to_owned()
    };
    let a = ip_of(&id_a);
    let b = ip_of(&id_b);
    assert!(
        b.starts_with("198.18.1."),
        "secondary pod on the secondary ENI: {b}"
    );

    // Inside the pods: eth0 with the /32 and the link-local gateway.
    let addr = podman.exec("pod-a", &["ip", "-4", "addr", "show", "eth0"]);
    assert!(String::from_utf8_lossy(&addr.stdout).contains(&format!("{a}/32")));
    let route = podman.exec("secondary-b", &["ip", "route"]);
    assert!(String::from_utf8_lossy(&route.stdout).contains("default via 169.254.1.1 dev eth0"));

    // Pod to pod both ways; the secondary pod reaches the VPC only through eth1 (table 2).
    for (from, to) in [("pod-a", b.as_str()), ("secondary-b", a.as_str())] {
        let out = podman.exec(from, &["ping", "-c", "1", "-W", "2", to]);
        assert!(out.status.success(), "{from} -> {to}: {out:?}");
    }
    let out = podman.exec(
        "secondary-b",
        &["ping", "-c", "1", "-W", "2", VPC_SERVICE_IP],
    );
    assert!(out.status.success(), "secondary pod -> vpc: {out:?}");
    let rules = node.ip_lines(&["rule", "show"]);
    assert!(
        rules.contains(&format!("1536: from {b} lookup {SECONDARY_TABLE}")),
        "{rules:?}"
    );
    assert!(
        rules.contains(&format!("512: from all to {a} lookup main")),
        "{rules:?}"
    );
    let table = node.ip(&["route", "show", "table", &SECONDARY_TABLE.to_string()]);
    assert!(table.contains("default via 198.18.1.1 dev eth1"), "{table}");

    // CHECK with what libcni cached for the containers, as a runtime would send it.
    for (name, id) in [("pod-a", &id_a), ("secondary-b", &id_b)] {
        let cached = podman.cached_result(id, "eth0").expect("cached result");
        let host_veth = cached["interfaces"][0]["name"].as_str().unwrap().to_owned();
        let get = node.ip(&[
            "route",
            "get",
            VPC_SERVICE_IP,
            "from",
            &ip_of(id),
            "iif",
            &host_veth,
        ]);
        if name == "secondary-b" {
            assert!(get.contains("dev eth1") && get.contains("table 2"), "{get}");
        } else {
            assert!(get.contains("dev eth0"), "{get}");
        }
        let sandbox = cached["interfaces"][1]["sandbox"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut conf: serde_json::Value = serde_json::from_str(&plugin_conf).unwrap();
        conf["cniVersion"] = "1.0.0".into();
        conf["name"] = network.clone().into();
        conf["prevResult"] = cached;
        let mut call = CniCall::new("CHECK", id, Some(sandbox.into()), conf.to_string());
        call.args = format!("IgnoreUnknown=1;K8S_POD_NAME={name}");
        node.cni(&call).ok();
    }

    podman.rm("pod-a").expect("rm pod-a");
    podman.rm("secondary-b").expect("rm secondary-b");
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
    assert!(podman.cached_result(&id_a, "eth0").is_none());
}

/// Upstream's chain as its entrypoint installs it on an IPv4 cluster (misc/10-aws.conflist
/// filled in by cmd/aws-vpc-cni/main.go): aws-cni, then egress-cni disabled, then portmap.
/// Driven by podman, the pod is wired, the result libcni caches is aws-cni's result handed on
/// unchanged by egress-cni, and DEL through the whole chain leaves nothing behind.
#[test]
fn podman_upstream_chain_with_disabled_egress_cni() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("podegress");
    node.attach_vpc();
    let ipamd = node.start_test_ipamd();
    let network = node.name().to_owned();
    let log = node.dir().join("plugin.log");
    let plugins = format!(
        r#"[{{"name":"aws-cni","type":"aws-cni","mtu":"9001","vethPrefix":"eni",
              "podSGEnforcingMode":"strict","ipamdSocket":"{socket}","pluginLogFile":"{log}",
              "pluginLogLevel":"Debug","capabilities":{{"io.kubernetes.cri.pod-annotations":true}}}},
            {{"name":"egress-cni","type":"egress-cni","mtu":"9001","enabled":"false",
              "randomizeSNAT":"prng","nodeIP":"",
              "ipam":{{"type":"host-local","ranges":[[{{"subnet":"fd00::ac:00/118"}}]],
                       "routes":[{{"dst":"::/0"}}],"dataDir":"/run/cni/v4pd/egress-v6-ipam"}},
              "pluginLogFile":"{log}","pluginLogLevel":"Debug"}},
            {{"type":"portmap","capabilities":{{"portMappings":true}},"snat":true}}]"#,
        socket = ipamd.socket.display(),
        log = log.display(),
    );
    let aws_cni = built_binary("aws-cni");
    let egress = built_binary("egress-cni");
    let portmap = std::path::Path::new("/usr/lib/cni/portmap");
    let podman = Podman::new(&mut node, &network, &plugins, &[&aws_cni, &egress, portmap]);

    let id = podman
        .run("pod-e")
        .expect("podman run through aws-cni, egress-cni, portmap");
    let allocs = ipamd.allocations();
    assert_eq!(allocs.len(), 1, "{allocs:?}");
    let ip = allocs[0]["ip"].as_str().unwrap().to_owned();
    let addr = podman.exec("pod-e", &["ip", "-4", "addr", "show", "eth0"]);
    assert!(String::from_utf8_lossy(&addr.stdout).contains(&format!("{ip}/32")));
    let out = podman.exec("pod-e", &["ping", "-c", "1", "-W", "2", VPC_SERVICE_IP]);
    assert!(out.status.success(), "pod -> vpc: {out:?}");
    // What portmap, the last plugin, handed back: aws-cni's result through egress-cni.
    let cached = podman.cached_result(&id, "eth0").expect("cached result");
    assert_eq!(cached["ips"][0]["address"], format!("{ip}/32"), "{cached}");
    assert_eq!(cached["interfaces"][1]["name"], "eth0", "{cached}");
    assert!(
        cached["interfaces"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("eni"),
        "{cached}"
    );

    podman.rm("pod-e").expect("rm pod-e");
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
}

/// egress-cni enabled for IPv6 egress on a node without a global IPv6 (`nodeIP` empty, as the
/// entrypoint would never render it enabled): the pod's ADD fails with upstream's message, and
/// the address aws-cni took is given back by the runtime's DEL through the chain.
#[test]
fn podman_enabled_egress_cni_without_node_ipv6_refuses_without_leaking() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("podegron");
    node.attach_vpc();
    let ipamd = node.start_test_ipamd();
    let network = node.name().to_owned();
    let plugins = format!(
        r#"[{{"type":"aws-cni","mtu":"9001","vethPrefix":"eni","ipamdSocket":"{socket}"}},
            {{"name":"egress-cni","type":"egress-cni","mtu":"9001","enabled":"true","nodeIP":"",
              "ipam":{{"type":"host-local","ranges":[[{{"subnet":"fd00::ac:00/118"}}]],
                       "routes":[{{"dst":"::/0"}}],"dataDir":"{leases}"}}}}]"#,
        socket = ipamd.socket.display(),
        leases = node.dir().join("egress-ipam").display(),
    );
    let aws_cni = built_binary("aws-cni");
    let egress = built_binary("egress-cni");
    let host_local = std::path::Path::new("/usr/lib/cni/host-local");
    let podman = Podman::new(
        &mut node,
        &network,
        &plugins,
        &[&aws_cni, &egress, host_local],
    );
    let err = podman
        .run("pod-x")
        .expect_err("egress-cni without a node IPv6 must refuse ADD");
    assert!(err.contains("global unicast IPv6"), "{err}");
    let _ = podman.rm("pod-x");
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
}

/// An IPv6 cluster's chain as the entrypoint renders it (aws-cni, egress-cni with IPv4 egress
/// SNATed to the node's primary IPv4, portmap) driven by podman: the IPv6 pod gets its /128 on
/// eth0 and `v4if0` from host-local, reaches an IPv4 VPC host through the egress path (the
/// VPC only routes back to the node IP, so this proves the SNAT); CHECK of each plugin with
/// the result libcni cached passes; `podman rm` (DEL through the chain) and a second DEL leave
/// no veth, address, chain or lease.
#[test]
fn podman_ipv6_chain_with_ipv4_egress() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("podv6");
    node.attach_vpc();
    let ipamd = node.start_test_ipamd_with(&["--ipv6"]);
    let network = node.name().to_owned();
    let log = node.dir().join("plugin.log");
    let leases = node.dir().join("egress-ipam");
    // The chart's conflist template rendered as aws-node renders it in an IPv6 cluster
    // (aws-cni-conflist: ENABLE_IPv6=true, nodeIP = the node's primary IPv4 from IMDS), with
    // test-only paths: ipamd's socket, log files and host-local's dataDir under the node dir.
    let filled = aws_cni::conflist::fill(
        &integration::sim::chart_conflist_template(),
        &[("ENABLE_IPv6", "true")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        &|_| Ok::<_, std::io::Error>(NODE_PRIMARY_IP.to_owned()),
    )
    .expect("render the conflist");
    let mut rendered: serde_json::Value = serde_json::from_str(&filled.text).unwrap();
    let plugins_json = rendered["plugins"].as_array_mut().unwrap();
    assert_eq!(plugins_json[1]["type"], "egress-cni");
    assert_eq!(plugins_json[1]["enabled"], "true");
    assert_eq!(plugins_json[1]["nodeIP"], NODE_PRIMARY_IP);
    assert_eq!(
        plugins_json[1]["ipam"]["dataDir"],
        "/run/cni/v6pd/egress-v4-ipam"
    );
    plugins_json[0]["ipamdSocket"] = ipamd.socket.display().to_string().into();
    plugins_json[0]["pluginLogFile"] = log.display().to_string().into();
    plugins_json[1]["pluginLogFile"] = log.display().to_string().into();
    plugins_json[1]["ipam"]["dataDir"] = leases.display().to_string().into();
    let aws_conf = plugins_json[0].to_string();
    let egress_conf = plugins_json[1].to_string();
    let plugins = serde_json::Value::Array(plugins_json.clone()).to_string();
    let aws_cni = built_binary("aws-cni");
    let egress = built_binary("egress-cni");
    let portmap = std::path::Path::new("/usr/lib/cni/portmap");
    let host_local = std::path::Path::new("/usr/lib/cni/host-local");
    let podman = Podman::new(
        &mut node,
        &network,
        &plugins,
        &[&aws_cni, &egress, portmap, host_local],
    );

    let id = podman
        .run("pod-6")
        .expect("podman run through aws-cni, egress-cni, portmap");
    let allocs = ipamd.allocations();
    assert_eq!(allocs.len(), 1, "{allocs:?}");
    let ip = allocs[0]["ip"].as_str().unwrap().to_owned();
    assert!(ip.contains(':'), "{ip}");
    let addr = podman.exec("pod-6", &["ip", "-6", "addr", "show", "eth0"]);
    assert!(String::from_utf8_lossy(&addr.stdout).contains(&format!("{ip}/128")));
    let v4 = podman.exec("pod-6", &["ip", "-4", "addr", "show", "v4if0"]);
    assert!(
        String::from_utf8_lossy(&v4.stdout).contains("inet 169.254.17"),
        "{v4:?}"
    );
    let out = podman.exec("pod-6", &["ping", "-c", "1", "-W", "2", VPC_SERVICE_IP]);
    assert!(
        out.status.success(),
        "ipv6 pod -> ipv4 vpc host via egress: {out:?}"
    );
    let nat = String::from_utf8_lossy(
        &node
            .command("iptables")
            .args(["-w", "-t", "nat", "-S"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(nat.contains("-N CNI-E4-"), "{nat}");
    assert!(
        nat.contains(&format!("--to-source {NODE_PRIMARY_IP}")),
        "{nat}"
    );

    // The result libcni cached: aws-cni's, plus egress-cni's host veth and v4if0.
    let cached = podman.cached_result(&id, "eth0").expect("cached result");
    let names: Vec<&str> = cached["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names.len(), 5, "{cached}");
    assert_eq!(names[4], "v4if0", "{cached}");
    assert_eq!(cached["ips"][0]["address"], format!("{ip}/128"), "{cached}");
    let sandbox = cached["interfaces"][1]["sandbox"]
        .as_str()
        .unwrap()
        .to_owned();

    // CHECK each plugin of the chain with the cached result, as libcni would.
    let call = |command: &str, conf: &str| {
        let mut c: serde_json::Value = serde_json::from_str(conf).unwrap();
        c["cniVersion"] = "1.0.0".into();
        c["name"] = network.clone().into();
        c["prevResult"] = cached.clone();
        CniCall::new(command, &id, Some(sandbox.clone().into()), c.to_string())
    };
    node.cni(&call("CHECK", &aws_conf)).ok();
    integration::cni::run_plugin(&node, &egress, &call("CHECK", &egress_conf)).ok();

    podman.rm("pod-6").expect("rm pod-6");
    // DEL again, as a runtime retrying: egress-cni then aws-cni, both succeed.
    integration::cni::run_plugin(&node, &egress, &call("DEL", &egress_conf)).ok();
    node.cni(&call("DEL", &aws_conf)).ok();
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
    let nat = String::from_utf8_lossy(
        &node
            .command("iptables")
            .args(["-w", "-t", "nat", "-S"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(!nat.contains("CNI-E4-"), "{nat}");
    let left: Vec<_> = std::fs::read_dir(leases.join(&network))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(left, Vec::<String>::new());
}
