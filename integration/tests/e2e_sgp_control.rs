//! Security groups for pods, the control plane end to end on the host kernel (root only; no
//! VLAN needed): the simulated VPC, the Kubernetes API simulator with the chart's RBAC, the VPC
//! Resource Controller stand-in (`integration::vpc_rc`, its own ServiceAccount and RBAC, driven
//! pass by pass) and the real `ipamd` with `ENABLE_POD_ENI=true` in a node namespace.
//!
//! - ipamd advertises `SecurityGroupsForPods` on the node's `CNINode` (a failure while the
//!   controller has not created the `CNINode` yet counts `awscni_pod_eni_error_count`); the
//!   controller attaches a trunk; ipamd adopts it as a trunk: set up on the host as upstream
//!   (its address, no rule for its primary IP; strict mode's `lookup local` moved to priority
//!   20), no pod address on it, never freed.
//! - A branch pod (a `SecurityGroupPolicy` matching its labels): the controller creates its
//!   branch ENI with the policy's group and annotates the pod; AddNetwork (gRPC, as the plugin
//!   calls it) answers the branch's VLAN id, MAC, address, subnet gateway and the trunk's link
//!   index; a pod without security groups still gets a datastore address.
//! - The annotation missing or malformed: AddNetwork `Success=false` with a typed reason;
//!   DelNetwork of a malformed one refused.
//! - ipamd restarted, and restarted without its checkpoint: the branch pod is answered the same.
//! - DelNetwork answers the VLAN and address; the pod deleted, the controller deletes the
//!   branch, and a DelNetwork for the vanished pod succeeds.
//! - IPv6 mode: the trunk awaited without a pool loop; the branch pod's IPv6 answer.
//! - The chart rendered without `patch` on `cninodes`: no trunk is asked for (403, counted).
#![allow(clippy::tests_outside_test_module)]

use std::time::{Duration, Instant};

use integration::can_run_kernel_tests;
use integration::sim::{KubeOptions, METRICS, Sim, SimConfig, exec_in};
use integration::vpc_rc::{self, Controller, EniDetails};
use ipamd_proto::rpc::{AddNetworkRequest, DelNetworkRequest};
use ipamd_proto::{ERROR_METADATA_KEY, ErrorReason, IpamdError};
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(90);
const NS: &str = "db";

fn add_request(pod: &str, container: &str) -> AddNetworkRequest {
    AddNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        container_id: container.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        k8s_pod_name: pod.into(),
        k8s_pod_namespace: NS.into(),
        k8s_pod_infra_container_id: container.into(),
        netns: format!("/var/run/netns/{container}"),
        ..Default::default()
    }
}

fn del_request(pod: &str, container: &str, uid: &str) -> DelNetworkRequest {
    DelNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        container_id: container.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        k8s_pod_name: pod.into(),
        k8s_pod_namespace: NS.into(),
        k8s_pod_infra_container_id: container.into(),
        k8s_pod_uid: uid.into(),
        reason: "PodDeleted".into(),
    }
}

/// A pod on `node` (labels `app=<app>`), requesting `vpc.amazonaws.com/pod-eni` when `branch`
/// (as the controller's webhook makes a matching pod do).
fn pod_object(name: &str, node: &str, app: &str, branch: bool) -> Value {
    let resources = if branch {
        json!({"limits": {vpc_rc::POD_ENI_RESOURCE: "1"}, "requests": {vpc_rc::POD_ENI_RESOURCE: "1"}})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [
            {"name": "main", "image": "registry.invalid/pause", "resources": resources}]},
        "status": {"phase": "Running"},
    })
}

/// Sum of one metric family in node `i`'s `/metrics`.
fn metric_sum(sim: &Sim, i: usize, family: &str) -> f64 {
    sim.http_get(i, METRICS, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(family) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn api(sim: &Sim) -> &kubesim::KubeSim {
    &sim.kube().expect("kube").api
}

fn add(
    rt: &tokio::runtime::Runtime,
    sim: &Sim,
    req: AddNetworkRequest,
) -> tonic::Response<ipamd_proto::rpc::AddNetworkReply> {
    rt.block_on(async {
        let mut c = integration::fleet::connect(sim.nodes[0].socket())
            .await
            .unwrap();
        c.add_network(req).await.expect("AddNetwork call")
    })
}

fn del(
    rt: &tokio::runtime::Runtime,
    sim: &Sim,
    req: DelNetworkRequest,
) -> Result<ipamd_proto::rpc::DelNetworkReply, tonic::Status> {
    rt.block_on(async {
        let mut c = integration::fleet::connect(sim.nodes[0].socket())
            .await
            .unwrap();
        c.del_network(req).await.map(tonic::Response::into_inner)
    })
}

fn typed_reason(metadata: &tonic::metadata::MetadataMap) -> Option<ErrorReason> {
    let bytes = metadata.get_bin(ERROR_METADATA_KEY)?.to_bytes().ok()?;
    IpamdError::from_details(&bytes).map(|e| e.reason())
}

#[test]
#[allow(clippy::too_many_lines)]
fn sgp_control_plane_with_the_controller_stand_in_and_real_ipamd() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    })
    .expect("VPC with kube");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let node_name = sim.kube().expect("kube").node_name(0).to_owned();
    api(&sim)
        .apply_yaml(vpc_rc::RBAC_YAML)
        .expect("controller RBAC");
    let creds = api(&sim)
        .service_account(vpc_rc::SERVICE_ACCOUNT.0, vpc_rc::SERVICE_ACCOUNT.1)
        .expect("controller token");
    let ec2 = rt
        .block_on(vpcsim::LocalServer::start(vpcsim::ec2::router(
            sim.world.clone(),
        )))
        .expect("EC2 for the controller");
    let controller = rt
        .block_on(Controller::connect(
            &creds.kubeconfig,
            &format!("http://{}", ec2.addr()),
            "us-west-2",
        ))
        .expect("controller");
    let pass = |c: &Controller| rt.block_on(c.reconcile_once()).expect("controller pass");

    // ipamd first: the controller has not created the CNINode yet, so advertising fails.
    sim.start_ipamd(
        0,
        &[("ENABLE_POD_ENI", "true"), ("IPAMD_POOL_TICK_SECONDS", "1")],
        READY,
    )
    .unwrap_or_else(|e| panic!("ipamd: {e}"));
    wait_for("awscni_pod_eni_error_count", READY, || {
        (metric_sum(&sim, 0, "awscni_pod_eni_error_count") > 0.0).then_some(())
    });
    let p = pass(&controller);
    assert!(
        p.applied
            .iter()
            .any(|a| matches!(a, vpc_rc::Action::CreateCniNode { .. })),
        "{p:?}"
    );
    // ipamd (with the chart's RBAC: get and patch on cninodes) adds the feature.
    let features = wait_for("SecurityGroupsForPods on the CNINode", READY, || {
        let c = api(&sim)
            .get_object("vpcresources.k8s.aws/v1alpha1", "CNINode", None, &node_name)
            .ok()?;
        let f = c.pointer("/spec/features")?.as_array()?.clone();
        f.iter()
            .any(|f| f["name"] == "SecurityGroupsForPods")
            .then_some(f)
    });
    assert_eq!(features.len(), 1, "{features:?}");

    // The controller attaches the trunk; ipamd adopts it as a trunk.
    let p = pass(&controller);
    assert!(p.failed.is_empty(), "{p:?}");
    let instance = sim.nodes[0].instance_id.clone();
    let (trunk, trunk_mac, trunk_ip) = sim.world.read(|s| {
        s.enis_of(&instance)
            .into_iter()
            .find(|e| e.interface_type == "trunk")
            .map(|e| (e.id.clone(), e.mac.clone(), e.private_ips[0]))
            .expect("trunk attached")
    });
    let enis = wait_for("ipamd's datastore has the trunk", READY, || {
        let v = sim.introspect(0, "/v1/enis").ok()?;
        let e = v.pointer(&format!("/0/ENIs/{trunk}"))?.clone();
        e["IsTrunk"].as_bool()?.then_some(v)
    });
    let trunk_entry = &enis["0"]["ENIs"][&trunk];
    assert!(
        trunk_entry["AvailableIPv4Cidrs"]
            .as_object()
            .is_none_or(serde_json::Map::is_empty),
        "no pod address on the trunk: {trunk_entry}"
    );
    // Host set-up as upstream: the link up with its address, its table's default route, no
    // rule from its primary IP.
    let netns = sim.nodes[0].netns.clone();
    let links: Value =
        serde_json::from_slice(&exec_in(&netns, &["ip", "-j", "addr"]).stdout).expect("ip -j addr");
    let link = links
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["address"] == trunk_mac.as_str())
        .expect("the trunk's link")
        .clone();
    let trunk_index = link["ifindex"].as_i64().unwrap();
    wait_for("the trunk's host set-up", READY, || {
        let links: Value =
            serde_json::from_slice(&exec_in(&netns, &["ip", "-j", "addr"]).stdout).ok()?;
        let l = links
            .as_array()?
            .iter()
            .find(|l| l["address"] == trunk_mac.as_str())?
            .clone();
        l["addr_info"]
            .as_array()?
            .iter()
            .any(|a| a["local"] == trunk_ip.to_string().as_str())
            .then_some(())
    });
    let rules = String::from_utf8(exec_in(&netns, &["ip", "rule"]).stdout).unwrap();
    assert!(
        !rules.contains(&format!("from {trunk_ip} ")),
        "no rule for the trunk's primary IP:\n{rules}"
    );
    // Strict mode (the default): lookup local moved from 0 to 20, as upstream's node set-up.
    assert!(
        rules
            .lines()
            .any(|l| l.starts_with("20:") && l.contains("lookup local")),
        "{rules}"
    );
    assert!(
        !rules
            .lines()
            .any(|l| l.starts_with("0:") && l.contains("lookup local")),
        "{rules}"
    );

    // A policy, a branch pod and a plain pod.
    let pods_sg = sim.world.read(|s| {
        s.security_groups
            .values()
            .find(|g| g.name == "pods")
            .unwrap()
            .id
            .clone()
    });
    api(&sim)
        .apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\n\
             apiVersion: vpcresources.k8s.aws/v1beta1\nkind: SecurityGroupPolicy\n\
             metadata: {{name: db-clients, namespace: {NS}}}\n\
             spec: {{podSelector: {{matchLabels: {{app: db-client}}}}, securityGroups: {{groupIds: [{pods_sg}]}}}}\n"
        ))
        .expect("policy");
    for (name, app, branch) in [("client", "db-client", true), ("plain", "web", false)] {
        api(&sim)
            .cluster()
            .apply_object(pod_object(name, &node_name, app, branch))
            .expect("pod");
    }
    let p = pass(&controller);
    assert!(p.failed.is_empty(), "{p:?}");
    let client = api(&sim)
        .get_object("v1", "Pod", Some(NS), "client")
        .unwrap();
    let uid = client["metadata"]["uid"].as_str().unwrap().to_owned();
    let details: Vec<EniDetails> = serde_json::from_str(
        client["metadata"]["annotations"][vpc_rc::POD_ENI_ANNOTATION]
            .as_str()
            .expect("annotated"),
    )
    .unwrap();
    let branch = &details[0];
    let (mac, groups, subnet) = sim.world.read(|s| {
        let e = &s.enis[&branch.eni_id];
        (
            e.mac.clone(),
            e.groups.clone(),
            s.subnets[&e.subnet_id].cidr,
        )
    });
    assert_eq!(branch.if_address, mac);
    assert_eq!(
        groups,
        std::slice::from_ref(&pods_sg),
        "the policy's group on the branch"
    );
    assert_eq!(branch.vlan_id, 1);

    let check_branch_answer = |r: &ipamd_proto::rpc::AddNetworkReply| {
        assert!(r.success, "{r:?}");
        assert_eq!(r.pod_vlan_id, 1);
        assert_eq!(r.pod_enimac, mac);
        assert_eq!(r.pod_eni_subnet_gw, "198.18.0.1", "subnet {subnet}");
        assert_eq!(i64::from(r.parent_if_index), trunk_index);
        assert_eq!(r.ip_allocation_metadata[0].i_pv4_addr, branch.private_ip);
        assert_eq!(r.ip_allocation_metadata[0].device_number, -1);
        assert!(!r.vp_cv4_cid_rs.is_empty());
    };
    let reply = add(&rt, &sim, add_request("client", "c-client"));
    check_branch_answer(reply.get_ref());
    // With the runtime's K8S_POD_UID: the pod's own answers; a stale sandbox of a pod of that
    // name re-created since (another UID) gets no answer from the new pod's object, whose VLAN
    // it must not be wired with (issue 38).
    let mut own = add_request("client", "c-client");
    own.k8s_pod_uid.clone_from(&uid);
    check_branch_answer(add(&rt, &sim, own).get_ref());
    let mut stale = add_request("client", "c-client-old");
    stale.k8s_pod_uid = "0b5e1e7e-0000-4000-8000-000000000000".into();
    let r = add(&rt, &sim, stale);
    assert!(!r.get_ref().success, "{r:?}");
    assert_eq!(
        typed_reason(r.metadata()),
        Some(ErrorReason::InvalidRequest)
    );
    // A pod without security groups gets a datastore address, not on the trunk.
    let plain = add(&rt, &sim, add_request("plain", "c-plain"));
    assert!(plain.get_ref().success, "{plain:?}");
    assert_eq!(plain.get_ref().pod_vlan_id, 0);
    let plain_ip: std::net::Ipv4Addr = plain.get_ref().ip_allocation_metadata[0]
        .i_pv4_addr
        .parse()
        .unwrap();
    assert_ne!(sim.eni_of(0, plain_ip).as_deref(), Some(trunk.as_str()));
    // Introspection shows the trunk and the branch pod.
    let view = sim
        .introspect(0, "/v1/branch-pods")
        .expect("/v1/branch-pods");
    assert_eq!(view["TrunkENI"], trunk.as_str());
    assert_eq!(view["BranchPods"][0]["Name"], "client");
    assert_eq!(view["BranchPods"][0]["VlanID"], 1);

    // Missing and malformed annotations.
    api(&sim)
        .cluster()
        .apply_object(pod_object("waiting", &node_name, "db-client", true))
        .unwrap();
    let r = add(&rt, &sim, add_request("waiting", "c-waiting"));
    assert!(!r.get_ref().success);
    assert_eq!(typed_reason(r.metadata()), Some(ErrorReason::NotReady));
    let mut broken = api(&sim)
        .get_object("v1", "Pod", Some(NS), "waiting")
        .unwrap();
    broken["metadata"]["annotations"] = json!({vpc_rc::POD_ENI_ANNOTATION: "{not json"});
    if let Some(m) = broken["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    api(&sim).cluster().apply_object(broken.clone()).unwrap();
    let r = add(&rt, &sim, add_request("waiting", "c-waiting"));
    assert!(!r.get_ref().success);
    assert_eq!(typed_reason(r.metadata()), Some(ErrorReason::Internal));
    let waiting_uid = broken["metadata"]["uid"].as_str().unwrap().to_owned();
    let refused = del(&rt, &sim, del_request("waiting", "c-waiting", &waiting_uid));
    assert!(
        refused.is_err(),
        "a malformed annotation is refused: {refused:?}"
    );

    // ipamd restarted (SIGKILL), then without its checkpoint: the branch pod's answer stands.
    sim.restart_ipamd(0, true, READY).expect("restart");
    check_branch_answer(add(&rt, &sim, add_request("client", "c-client")).get_ref());
    sim.restart_ipamd_without_checkpoint(0, READY)
        .expect("restart without checkpoint");
    check_branch_answer(add(&rt, &sim, add_request("client", "c-client")).get_ref());

    // DEL: the VLAN and address come back; the trunk stays.
    let released = del(&rt, &sim, del_request("client", "c-client", &uid)).expect("DelNetwork");
    assert!(released.success);
    assert_eq!(released.pod_vlan_id, 1);
    assert_eq!(
        released.ip_allocation_metadata[0].i_pv4_addr,
        branch.private_ip
    );
    // The pod goes: the controller deletes its branch; a DEL for the vanished pod succeeds.
    api(&sim)
        .delete_object("v1", "Pod", Some(NS), "client")
        .expect("delete pod");
    let p = pass(&controller);
    assert!(
        p.applied.iter().any(
            |a| matches!(a, vpc_rc::Action::DeleteBranch { eni_id } if *eni_id == branch.eni_id)
        ),
        "{p:?}"
    );
    assert!(sim.world.read(|s| !s.enis.contains_key(&branch.eni_id)));
    let gone = del(&rt, &sim, del_request("client", "c-client", &uid))
        .expect("DelNetwork of a vanished pod");
    assert!(gone.success);
    assert_eq!(gone.pod_vlan_id, 0);
    // The trunk is never freed by ipamd.
    assert!(sim.world.read(|s| s.enis.contains_key(&trunk)));
    let status = sim.introspect(0, "/v1/enis").unwrap();
    assert_eq!(status["0"]["ENIs"][&trunk]["IsTrunk"], true);
    drop(ec2);
}

/// The chart's aws-node RBAC is what makes the feature reach the controller: rendered without
/// `patch` on `cninodes`, ipamd's `SecurityGroupsForPods` is refused (403), every attempt counts
/// `awscni_pod_eni_error_count`, the `CNINode` keeps no feature and no trunk is attached.
#[test]
fn without_the_charts_cninode_patch_no_trunk_is_asked_for() {
    if !can_run_kernel_tests() {
        return;
    }
    let rendered = kubesim::chart::render_chart(&json!({})).expect("helm render");
    let full = "resources: [\"cninodes\"]\n    verbs: [\"get\", \"list\", \"watch\", \"patch\"]";
    assert!(rendered.contains(full), "the chart's cninodes rule moved");
    let cut = rendered.replace(
        full,
        "resources: [\"cninodes\"]\n    verbs: [\"get\", \"list\", \"watch\"]",
    );
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        kube: Some(KubeOptions {
            rendered: Some(cut),
            ..KubeOptions::default()
        }),
        ..SimConfig::default()
    })
    .expect("VPC with kube");
    let node_name = sim.kube().expect("kube").node_name(0).to_owned();
    api(&sim)
        .cluster()
        .apply_object(json!({
            "apiVersion": "vpcresources.k8s.aws/v1alpha1", "kind": "CNINode",
            "metadata": {"name": node_name}, "spec": {},
        }))
        .expect("CNINode, as the controller creates it");
    sim.start_ipamd(
        0,
        &[("ENABLE_POD_ENI", "true"), ("IPAMD_POOL_TICK_SECONDS", "1")],
        READY,
    )
    .unwrap_or_else(|e| panic!("ipamd: {e}"));
    wait_for("two refused attempts counted", READY, || {
        (metric_sum(&sim, 0, "awscni_pod_eni_error_count") >= 2.0).then_some(())
    });
    let c = api(&sim)
        .get_object("vpcresources.k8s.aws/v1alpha1", "CNINode", None, &node_name)
        .unwrap();
    assert!(
        c.pointer("/spec/features")
            .is_none_or(|f| f.as_array().is_none_or(Vec::is_empty)),
        "{c}"
    );
    let log = sim.ipamd_log_tail(0, 200);
    assert!(
        log.contains("Failed to add SGP feature to CNINode"),
        "{log}"
    );
}

/// IPv6 mode (upstream `checkForTrunkENI`: no pool loop, the trunk still awaited and set up): a
/// branch pod's AddNetwork answers its IPv6 address, the VPC router `fe80:ec2::1` and the
/// trunk's link.
#[test]
fn ipv6_mode_awaits_the_trunk_and_answers_branch_pods() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ipv6: true,
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    })
    .expect("VPC with kube");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let node_name = sim.kube().expect("kube").node_name(0).to_owned();
    api(&sim)
        .apply_yaml(vpc_rc::RBAC_YAML)
        .expect("controller RBAC");
    let creds = api(&sim)
        .service_account(vpc_rc::SERVICE_ACCOUNT.0, vpc_rc::SERVICE_ACCOUNT.1)
        .expect("controller token");
    let ec2 = rt
        .block_on(vpcsim::LocalServer::start(vpcsim::ec2::router(
            sim.world.clone(),
        )))
        .expect("EC2 for the controller");
    let controller = rt
        .block_on(Controller::connect(
            &creds.kubeconfig,
            &format!("http://{}", ec2.addr()),
            "us-west-2",
        ))
        .expect("controller");
    let pass = |c: &Controller| rt.block_on(c.reconcile_once()).expect("controller pass");
    pass(&controller); // the CNINode
    sim.start_ipamd(
        0,
        &[
            ("ENABLE_IPv4", "false"),
            ("ENABLE_IPv6", "true"),
            ("ENABLE_PREFIX_DELEGATION", "true"),
            ("WARM_PREFIX_TARGET", "1"),
            ("ENABLE_POD_ENI", "true"),
            ("IPAMD_POOL_TICK_SECONDS", "1"),
        ],
        READY,
    )
    .unwrap_or_else(|e| panic!("ipamd: {e}"));
    wait_for("SecurityGroupsForPods on the CNINode", READY, || {
        let c = api(&sim)
            .get_object("vpcresources.k8s.aws/v1alpha1", "CNINode", None, &node_name)
            .ok()?;
        c.pointer("/spec/features")?
            .as_array()?
            .iter()
            .any(|f| f["name"] == "SecurityGroupsForPods")
            .then_some(())
    });
    let p = pass(&controller);
    assert!(p.failed.is_empty(), "{p:?}");
    let instance = sim.nodes[0].instance_id.clone();
    let (trunk, trunk_mac) = sim.world.read(|s| {
        s.enis_of(&instance)
            .into_iter()
            .find(|e| e.interface_type == "trunk")
            .map(|e| (e.id.clone(), e.mac.clone()))
            .expect("trunk attached")
    });
    wait_for("ipamd's datastore has the trunk (IPv6 mode)", READY, || {
        let v = sim.introspect(0, "/v1/enis").ok()?;
        v.pointer(&format!("/0/ENIs/{trunk}/IsTrunk"))?
            .as_bool()?
            .then_some(())
    });
    api(&sim)
        .apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"
        ))
        .expect("namespace");
    api(&sim)
        .cluster()
        .apply_object(pod_object("client6", &node_name, "db-client", true))
        .expect("pod");
    let p = pass(&controller);
    assert!(p.failed.is_empty(), "{p:?}");
    let client = api(&sim)
        .get_object("v1", "Pod", Some(NS), "client6")
        .unwrap();
    let details: Vec<EniDetails> = serde_json::from_str(
        client["metadata"]["annotations"][vpc_rc::POD_ENI_ANNOTATION]
            .as_str()
            .expect("annotated"),
    )
    .unwrap();
    assert!(!details[0].ipv6_addr.is_empty(), "{details:?}");
    let links: Value =
        serde_json::from_slice(&exec_in(&sim.nodes[0].netns, &["ip", "-j", "link"]).stdout)
            .unwrap();
    let trunk_index = links
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["address"] == trunk_mac.as_str())
        .and_then(|l| l["ifindex"].as_i64())
        .expect("the trunk's link");
    let r = add(&rt, &sim, add_request("client6", "c-client6"));
    let r = r.get_ref();
    assert!(r.success, "{r:?}");
    assert_eq!(r.ip_allocation_metadata[0].i_pv6_addr, details[0].ipv6_addr);
    assert_eq!(r.ip_allocation_metadata[0].i_pv4_addr, "");
    assert_eq!(r.pod_eni_subnet_gw, "fe80:ec2::1");
    assert_eq!(i64::from(r.parent_if_index), trunk_index);
    assert_eq!(r.pod_vlan_id, i32::from(details[0].vlan_id));
    drop(ec2);
}
