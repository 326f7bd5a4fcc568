//! Every failed ADD names its reason, end to end (root only; issue 29 item 1): the real
//! `ipamd` and `aws-cni` on the simulated VPC with the Kubernetes API simulator (the chart's
//! RBAC for aws-node). Each reason is driven for real — the ENI limit, addresses cooling down,
//! max-pods, ipamd down, a plugin of another build, the network-policy agent away, a missing
//! IAM permission and EC2 throttling (vpcsim's `denied_actions` and throttle knobs), a full
//! subnet, and a fragmented subnet with no free /28 under prefix delegation — and checked in
//! the three places an operator looks: the CNI error text kubelet shows (upstream's message
//! as the prefix, then the code and what to do), `awscni_add_failures_total{reason}` on the
//! node's `/metrics`, and a Warning Event on the pod (its uid, reason = the code), bumped
//! rather than duplicated when the same pod fails again. `ipamd status`'s source
//! (`/v1/add-failures`) lists them.
#![allow(clippy::tests_outside_test_module)]

use std::net::Ipv4Addr;
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{
    KubeOptions, METRICS, PluginTarget, Sandbox, Sim, SimConfig, eventually, run_plugin,
};
use serde_json::{Value, json};
use vpcsim::state::CreateEni;

const READY: Duration = Duration::from_secs(90);

fn metric(sim: &Sim, node: usize, reason: &str) -> f64 {
    let text = sim.http_get(node, METRICS, "/metrics").unwrap_or_default();
    let want = format!("awscni_add_failures_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// The Pod object kubelet would have (the Event needs its uid).
fn pod_object(sim: &Sim, node: usize, name: &str) -> String {
    let kube = sim.kube().unwrap();
    let pod = kube
        .api
        .add_pod("default", name, kube.node_name(node), "", json!({}))
        .expect("pod object");
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// The plugin's CNI error message of a failed ADD of `name` on `node`.
fn failed_add(sim: &mut Sim, node: usize, name: &str) -> String {
    match sim.add_pod(node, name) {
        Ok(p) => panic!(
            "ADD {name} succeeded ({}) \n{}",
            p.ip,
            sim.ipamd_log_tail(node, 30)
        ),
        Err(e) => {
            let v: Value = serde_json::from_str(&e.output)
                .unwrap_or_else(|_| panic!("not a CNI error: {}", e.output));
            v["msg"].as_str().unwrap_or_default().to_owned()
        }
    }
}

/// The Warning Event on pod `name` with `reason`, once it is there (count checked by callers).
fn event(sim: &Sim, name: &str, uid: &str, reason: &str, min_count: u64) -> Value {
    eventually(Duration::from_secs(20), || {
        let events = sim.kube_events(Some("default"))?;
        events
            .into_iter()
            .find(|e| {
                e["involvedObject"]["name"] == name
                    && e["reason"] == reason
                    && e["count"].as_u64().unwrap_or_default() >= min_count
            })
            .ok_or_else(|| format!("no {reason} Event (count >= {min_count}) on {name} yet"))
    })
    .map(|e| {
        assert_eq!(e["involvedObject"]["uid"], uid, "{e}");
        assert_eq!(e["involvedObject"]["kind"], "Pod");
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["source"]["component"], "aws-node");
        e
    })
    .unwrap_or_else(|err| panic!("{err}\n{:#?}", sim.kube_events(Some("default"))))
}

/// Drives one failure of pod `name` and checks message, metric and Event.
fn expect_reason(sim: &mut Sim, node: usize, name: &str, reason: &str, says: &[&str]) -> String {
    let uid = pod_object(sim, node, name);
    let before = metric(sim, node, reason);
    let msg = failed_add(sim, node, name);
    assert!(
        msg.contains(&format!(": {reason}: ")),
        "{reason}: message does not name it: {msg}\n{}",
        sim.ipamd_log_tail(node, 20)
    );
    for s in says {
        assert!(msg.contains(s), "{reason}: message lacks {s:?}: {msg}");
    }
    eventually(Duration::from_secs(15), || {
        let now = metric(sim, node, reason);
        (now >= before.max(0.0) + 1.0).then_some(()).ok_or(format!(
            "awscni_add_failures_total{{reason={reason}}} {before} -> {now}"
        ))
    })
    .unwrap();
    let e = event(sim, name, &uid, reason, 1);
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("failed to assign an IP address to container: "),
        "{e}"
    );
    msg
}

fn primary_subnet(sim: &Sim, node: usize) -> (String, ipnet::Ipv4Net) {
    let id = sim.nodes[node].instance_id.clone();
    sim.world.read(|s| {
        let eni = s.eni(&s.instances[&id].primary_eni).unwrap();
        (eni.subnet_id.clone(), s.subnets[&eni.subnet_id].cidr)
    })
}

/// Other tenants' ENIs take every free address of `subnet`; their ids.
fn fill_subnet(sim: &Sim, subnet: &str) -> Vec<String> {
    sim.world
        .mutate(|s, _| {
            let mut ids = Vec::new();
            while s.available_ip_count(subnet) > 0 {
                let take = s.available_ip_count(subnet).min(40);
                ids.push(s.create_eni(CreateEni {
                    subnet_id: subnet.to_owned(),
                    description: "other tenant".into(),
                    secondary_count: u32::try_from(take - 1).unwrap_or(0),
                    ..CreateEni::default()
                })?);
            }
            Ok(ids)
        })
        .unwrap()
}

/// Other tenants hold one address in every /28 of `subnet` that has none in use: no aligned
/// /28 is free, most /32s are.
fn fragment_subnet(sim: &Sim, subnet: &str, cidr: ipnet::Ipv4Net) {
    let used: std::collections::BTreeSet<Ipv4Addr> = sim.world.read(|s| {
        s.enis
            .values()
            .filter(|e| e.subnet_id == subnet)
            .flat_map(|e| {
                e.private_ips
                    .iter()
                    .copied()
                    .chain(e.ipv4_prefixes.iter().flat_map(|p| p.hosts()))
            })
            .collect()
    });
    let picks: Vec<Ipv4Addr> = cidr
        .subnets(28)
        .unwrap()
        .filter(|b| !b.hosts().any(|ip| used.contains(&ip)))
        .map(|b| Ipv4Addr::from(u32::from(b.network()) + 8))
        .collect();
    assert!(picks.len() > 4, "{picks:?}");
    sim.world
        .mutate(|s, _| {
            for chunk in picks.chunks(30) {
                s.create_eni(CreateEni {
                    subnet_id: subnet.to_owned(),
                    description: "other tenant".into(),
                    primary_ip: Some(chunk[0]),
                    secondary_ips: chunk[1..].to_vec(),
                    ..CreateEni::default()
                })?;
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn every_failed_add_names_its_reason_in_the_error_the_metric_and_an_event() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 2,
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    })
    .expect("simulated VPC with kube");
    let base = [
        ("IPAMD_POOL_TICK_SECONDS", "1"),
        ("IPAMD_ADD_WAIT_TIMEOUT", "3"),
        // the throttled pod's wait (100 s by default); longer than one EC2 call's throttle
        // retries (aws::sdk::THROTTLE_RETRY_BUDGET, 20 s) so the failure is EC2's
        ("IPAMD_BUSY_POOL_WAIT_SECONDS", "25"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&'static str, &'static str)> {
        base.iter().chain(extra).copied().collect()
    };

    // --- node 0: one ENI (MAX_ENI=1, 9 addresses), addresses cooling for 10 minutes.
    sim.start_ipamd(
        0,
        &with(&[("MAX_ENI", "1"), ("IP_COOLDOWN_PERIOD", "600")]),
        READY,
    )
    .expect("ipamd node 0");
    let mut pods = Vec::new();
    for k in 0..9 {
        pods.push(
            sim.add_pod(0, &format!("web-{k}"))
                .expect("the ENI's 9 addresses"),
        );
    }
    expect_reason(
        &mut sim,
        0,
        "eni-limit",
        "EniLimit",
        &[
            "add cmd: failed to assign an IP address to container: EniLimit",
            "every ENI is full",
            "prefix delegation",
        ],
    );

    let freed = pods.remove(0);
    sim.del_pod(&freed).expect("DEL");
    expect_reason(
        &mut sim,
        0,
        "cooling",
        "CoolingDown",
        &[
            "cooling down after their release",
            "IP_COOLDOWN_PERIOD=600s",
            "free again in",
        ],
    );

    // max-pods 9 on the same ENI, no cooldown: the freed address goes to a pod, then the pool
    // is at max-pods. The same pod failing twice bumps one Event.
    sim.stop_ipamd(0, false);
    sim.start_ipamd(
        0,
        &with(&[
            ("MAX_ENI", "1"),
            ("IP_COOLDOWN_PERIOD", "0"),
            ("IPAMD_MAX_PODS", "9"),
        ]),
        READY,
    )
    .expect("ipamd node 0 with max-pods");
    pods.push(sim.add_pod(0, "web-9").expect("the freed address"));
    let msg = expect_reason(
        &mut sim,
        0,
        "max-pods",
        "MaxPods",
        &["max pods reached", "max-pods"],
    );
    assert!(!msg.contains("every ENI is full"), "{msg}");
    let uid = sim
        .kube()
        .unwrap()
        .api
        .get_object("v1", "Pod", Some("default"), "max-pods")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    failed_add(&mut sim, 0, "max-pods");
    event(&sim, "max-pods", &uid, "MaxPods", 2);
    let same: Vec<Value> = sim
        .kube_events(Some("default"))
        .unwrap()
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == "max-pods" && e["reason"] == "MaxPods")
        .collect();
    assert_eq!(same.len(), 1, "deduplicated into one Event: {same:#?}");
    let f = sim
        .introspect(0, "/v1/add-failures")
        .expect("/v1/add-failures");
    assert_eq!(f["totals"]["MaxPods"], 2, "{f}");
    assert!(
        f["recent"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["pod"] == "max-pods" && e["reason"] == "MaxPods" && e["count"] == 2),
        "{f}"
    );

    // ipamd down: the plugin says so and spools the failure; ipamd counts it and writes the
    // Event once it is back.
    sim.stop_ipamd(0, false);
    let uid = pod_object(&sim, 0, "ipamd-down");
    let msg = failed_add(&mut sim, 0, "ipamd-down");
    assert!(
        msg.starts_with("add cmd: failed to connect to backend server: IpamdUnavailable: ipamd is not reachable at "),
        "{msg}"
    );
    sim.start_ipamd(
        0,
        &with(&[
            ("MAX_ENI", "1"),
            ("IP_COOLDOWN_PERIOD", "0"),
            ("IPAMD_MAX_PODS", "9"),
        ]),
        READY,
    )
    .expect("ipamd node 0 back");
    eventually(Duration::from_secs(15), || {
        (metric(&sim, 0, "IpamdUnavailable") >= 1.0)
            .then_some(())
            .ok_or_else(|| "IpamdUnavailable not counted".to_owned())
    })
    .unwrap();
    event(&sim, "ipamd-down", &uid, "IpamdUnavailable", 1);

    // A plugin of another build: ipamd refuses it (and counts, and writes the Event).
    let other = sim.dir().join("aws-cni-other");
    integration::version_stamp::restamp(
        &integration::built_binary("aws-cni"),
        &other,
        &format!("{}-other", ipamd_proto::BUILD_VERSION),
    )
    .expect("restamp");
    let uid = pod_object(&sim, 0, "old-plugin");
    let netns = sim.new_pod_netns().unwrap();
    let err = run_plugin(
        &other,
        &PluginTarget::of(&sim, 0),
        "ADD",
        Sandbox {
            pod_name: "old-plugin",
            container_id: "0123456789abcdef0123",
            netns: &netns,
        },
        None,
    )
    .expect_err("a plugin of another build is refused");
    assert!(
        err.1.contains(
            "add cmd: Error received from AddNetwork gRPC call: VersionMismatch: client version"
        ),
        "{err:?}"
    );
    assert!(metric(&sim, 0, "VersionMismatch") >= 1.0);
    event(&sim, "old-plugin", &uid, "VersionMismatch", 1);

    // The network-policy agent is not running while ipamd hands out a policy mode.
    let freed = pods.remove(0);
    sim.del_pod(&freed).expect("DEL");
    sim.stop_ipamd(0, false);
    sim.start_ipamd(
        0,
        &with(&[
            ("MAX_ENI", "1"),
            ("IP_COOLDOWN_PERIOD", "0"),
            ("NETWORK_POLICY_ENFORCING_MODE", "standard"),
        ]),
        READY,
    )
    .expect("ipamd node 0 with network policy");
    expect_reason(
        &mut sim,
        0,
        "no-agent",
        "PolicyAgentUnavailable",
        &["add cmd: failed to setup network policy: PolicyAgentUnavailable"],
    );

    // --- node 1: EC2 refuses.
    // A missing IAM permission: the message names the action.
    sim.set_knobs(|k| {
        k.denied_actions = vec![
            "AssignPrivateIpAddresses".into(),
            "CreateNetworkInterface".into(),
        ];
    });
    sim.start_ipamd(1, &with(&[]), READY).expect("ipamd node 1");
    expect_reason(
        &mut sim,
        1,
        "no-iam",
        "Ec2Unauthorized",
        &["EC2 denied ec2:AssignPrivateIpAddresses", "IAM policy"],
    );

    // EC2 throttles every mutating call for longer than ipamd's retries: the waiting pod is
    // told so (after ipamd's longest wait for a pool action: 100 s, here
    // IPAMD_BUSY_POOL_WAIT_SECONDS=25, past one EC2 call's 20 s throttle retry budget).
    sim.set_knobs(|k| {
        k.denied_actions.clear();
        k.throttle.mutate.capacity = 0;
        k.throttle.mutate.refill_per_sec = 0.0001;
    });
    expect_reason(
        &mut sim,
        1,
        "throttled",
        "Ec2Throttled",
        &["RequestLimitExceeded"],
    );

    // A full subnet (other tenants took every address).
    let (subnet, cidr) = primary_subnet(&sim, 1);
    let fillers = fill_subnet(&sim, &subnet);
    sim.set_knobs(|k| *k = vpcsim::Knobs::default());
    let msg = expect_reason(
        &mut sim,
        1,
        "subnet-full",
        "SubnetFull",
        &[&subnet, "no free addresses"],
    );
    assert!(msg.contains("give pods another subnet"), "{msg}");

    // A fragmented subnet under prefix delegation: no aligned /28 left, /32s plenty. ipamd
    // falls back to /32s; once the one ENI is full of them the pod is told the subnet's /28s
    // are the cause, not the instance.
    sim.world
        .mutate(|s, _| {
            for id in &fillers {
                s.delete_eni(id)?;
            }
            Ok(())
        })
        .unwrap();
    fragment_subnet(&sim, &subnet, cidr);
    sim.stop_ipamd(1, false);
    sim.start_ipamd(
        1,
        &with(&[
            ("ENABLE_PREFIX_DELEGATION", "true"),
            ("WARM_PREFIX_TARGET", "1"),
            ("MAX_ENI", "1"),
        ]),
        READY,
    )
    .expect("ipamd node 1 with prefix delegation");
    let uid = pod_object(&sim, 1, "no-prefix");
    let before = metric(&sim, 1, "NoFreePrefix");
    let mut msg = String::new();
    for k in 0..20 {
        match sim.add_pod(1, "no-prefix") {
            Ok(p) => pods.push(p),
            Err(e) => {
                msg = serde_json::from_str::<Value>(&e.output).unwrap()["msg"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                assert!(k > 0, "the /32 fallback gave no address: {msg}");
                break;
            }
        }
    }
    assert!(
        msg.contains(": NoFreePrefix: ")
            && msg.contains("no free aligned /28")
            && msg.contains("fell back to /32"),
        "{msg}\n{}",
        sim.ipamd_log_tail(1, 30)
    );
    assert!(metric(&sim, 1, "NoFreePrefix") >= before.max(0.0) + 1.0);
    event(&sim, "no-prefix", &uid, "NoFreePrefix", 1);

    // `ipamd status` on node 1 (its ipamd restarted since the earlier reasons: the counts are
    // this process's) names the failure and the node's subnet with its free addresses.
    let env = sim.ipamd_env(
        1,
        &with(&[
            ("ENABLE_PREFIX_DELEGATION", "true"),
            ("WARM_PREFIX_TARGET", "1"),
            ("MAX_ENI", "1"),
        ]),
    );
    let mut args: Vec<String> = vec!["env".into(), "-i".into()];
    args.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    args.push(integration::built_binary("ipamd").display().to_string());
    args.push("status".into());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = integration::sim::exec_in(&sim.nodes[1].netns, &argv);
    let status = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{status}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        status.contains("failed ADDs since start: NoFreePrefix x1"),
        "{status}"
    );
    assert!(status.contains("default/no-prefix x1"), "{status}");
    let subnet_line = status
        .lines()
        .find(|l| l.trim_start().starts_with(subnet.as_str()) && l.contains("free addresses:"))
        .unwrap_or_else(|| panic!("no line for {subnet}:\n{status}"));
    assert!(
        subnet_line.contains("free /28 blocks: not known"),
        "{subnet_line}"
    );
    assert!(status.contains("InsufficientCidrBlocks) x"), "{status}");
    let f = sim
        .introspect(0, "/v1/add-failures")
        .expect("/v1/add-failures");
    assert_eq!(f["totals"]["PolicyAgentUnavailable"], 1, "{f}");
    // All of it with the chart's ClusterRole: aws-node read the pods and created and patched
    // (bumped) core Events in the pods' namespace, and was refused nothing.
    let audit = sim.kube().unwrap().api.audit();
    let aws_node: Vec<_> = audit
        .iter()
        .filter(|e| e.user == "system:serviceaccount:kube-system:aws-node")
        .collect();
    for (verb, resource) in [("get", "pods"), ("create", "events"), ("patch", "events")] {
        assert!(
            aws_node.iter().any(|e| e.verb == verb
                && e.resource == resource
                && e.group.is_empty()
                && e.namespace.as_deref() == Some("default")
                && e.code < 300),
            "aws-node never did {verb} {resource} in default"
        );
    }
    let refused: Vec<_> = aws_node.iter().filter(|e| e.code == 403).collect();
    assert!(
        refused.is_empty(),
        "refused by the chart's RBAC: {refused:?}"
    );
    drop(pods);
    for w in sim.shutdown() {
        eprintln!("shutdown: {w}");
    }
}
