//! Security groups for pods end to end with the real control plane, in the test VM (802.1Q
//! needed; `integration::vm`): the simulated VPC with its fabric, the Kubernetes API simulator
//! with the chart's RBAC, the VPC Resource Controller stand-in (`integration::vpc_rc`), the real
//! `ipamd` with `ENABLE_POD_ENI=true` and the real `aws-cni` (strict mode, the default). Where
//! `sgp_fabric_vm` answers the plugin with `test-ipamd` from hand-written annotations, here the
//! controller attaches the trunk and writes the pods' annotations and ipamd answers the plugin
//! (`PodVlanId`, `PodENIMAC`, `PodENISubnetGW`, `ParentIfIndex`).
//!
//! Checked: the VLAN link on the trunk's link with the branch's MAC; the pod reaches the node's
//! primary address and back through its branch ENI, whose groups admit it (`default`); the
//! node cannot reach a pod whose only group (`pods`) admits nothing, the drop counted by the
//! router's chain of that branch; DEL (prevResult's VLAN id) leaves no VLAN link and no rule.

use std::process::Output;
use std::time::{Duration, Instant};

use integration::sim::{KubeOptions, Sim, SimConfig, exec_in};
use integration::vpc_rc::{self, Controller, EniDetails};
use serde_json::{Value, json};

const MODULES: &[&str] = &["8021q", "veth"];
const READY: Duration = Duration::from_secs(240);
/// `K8S_POD_NAMESPACE` of the harness's plugin calls.
const NS: &str = "default";

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ping(ns: &str, dst: &str) -> bool {
    exec_in(
        ns,
        &["busybox", "ping", "-c", "2", "-W", "2", "-i", "0.3", dst],
    )
    .status
    .success()
}

/// A branch pod (requests `vpc.amazonaws.com/pod-eni`, as the controller's webhook makes a pod
/// a `SecurityGroupPolicy` selects do) on `node`, labelled `app=<app>`.
fn pod_object(name: &str, node: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "registry.invalid/pause",
            "resources": {"limits": {vpc_rc::POD_ENI_RESOURCE: "1"},
                          "requests": {vpc_rc::POD_ENI_RESOURCE: "1"}}}]},
        "status": {"phase": "Running"},
    })
}

/// Packets dropped by the router's DROP rule of `chain`.
fn drops(router: &str, chain: &str) -> u64 {
    let save = text(&exec_in(router, &["iptables-save", "-c", "-t", "filter"]));
    save.lines()
        .filter(|l| l.contains(&format!("-A {chain} ")) && l.ends_with("-j DROP"))
        .filter_map(|l| l.strip_prefix('[')?.split(':').next()?.parse::<u64>().ok())
        .sum()
}

fn api(sim: &Sim) -> &kubesim::KubeSim {
    &sim.kube().expect("kube").api
}

#[allow(clippy::too_many_lines)]
fn real_ipamd_answers_the_plugin() {
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
        .expect("runtime");
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
    let pass = |c: &Controller| {
        let p = rt.block_on(c.reconcile_once()).expect("controller pass");
        assert!(p.failed.is_empty(), "{p:?}");
    };

    // The controller creates the CNINode, ipamd asks for the trunk, the controller attaches it
    // and ipamd sets it up.
    pass(&controller);
    sim.start_ipamd(
        0,
        &[("ENABLE_POD_ENI", "true"), ("IPAMD_POOL_TICK_SECONDS", "1")],
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
    pass(&controller);
    let instance = sim.nodes[0].instance_id.clone();
    let (trunk, node_ip) = sim.world.read(|s| {
        let enis = s.enis_of(&instance);
        let trunk = enis
            .iter()
            .find(|e| e.interface_type == "trunk")
            .map(|e| e.id.clone())
            .expect("trunk attached");
        let primary = enis
            .iter()
            .find(|e| e.interface_type != "trunk" && e.id != trunk)
            .map(|e| e.private_ips[0])
            .expect("primary ENI");
        (trunk, primary)
    });
    wait_for("ipamd's datastore has the trunk", READY, || {
        let v = sim.introspect(0, "/v1/enis").ok()?;
        v.pointer(&format!("/0/ENIs/{trunk}/IsTrunk"))?
            .as_bool()?
            .then_some(())
    });

    // Two policies: `web` in `pods` and `default` (the node's group admits its members),
    // `locked` in `pods` only (no ingress rule).
    let group = |name: &str| {
        sim.world.read(|s| {
            s.security_groups
                .values()
                .find(|g| g.name == name)
                .map(|g| g.id.clone())
                .expect("group")
        })
    };
    let (pods_sg, default_sg) = (group("pods"), group("default"));
    api(&sim)
        .apply_yaml(&format!(
            "apiVersion: vpcresources.k8s.aws/v1beta1\nkind: SecurityGroupPolicy\n\
             metadata: {{name: web, namespace: {NS}}}\n\
             spec: {{podSelector: {{matchLabels: {{app: web}}}}, securityGroups: {{groupIds: [{pods_sg}, {default_sg}]}}}}\n\
             ---\n\
             apiVersion: vpcresources.k8s.aws/v1beta1\nkind: SecurityGroupPolicy\n\
             metadata: {{name: locked, namespace: {NS}}}\n\
             spec: {{podSelector: {{matchLabels: {{app: locked}}}}, securityGroups: {{groupIds: [{pods_sg}]}}}}\n"
        ))
        .expect("policies");
    for (name, app) in [("web", "web"), ("locked", "locked")] {
        api(&sim)
            .cluster()
            .apply_object(pod_object(name, &node_name, app))
            .expect("pod");
    }
    pass(&controller);
    let annotation = |name: &str| -> EniDetails {
        let pod = api(&sim).get_object("v1", "Pod", Some(NS), name).unwrap();
        let details: Vec<EniDetails> = serde_json::from_str(
            pod["metadata"]["annotations"][vpc_rc::POD_ENI_ANNOTATION]
                .as_str()
                .expect("annotated"),
        )
        .expect("annotation");
        details[0].clone()
    };
    let (web_eni, locked_eni) = (annotation("web"), annotation("locked"));
    assert_ne!(web_eni.vlan_id, locked_eni.vlan_id);

    // ADD through the real plugin, answered by the real ipamd.
    let node_ns = sim.nodes[0].netns.clone();
    let web = sim
        .add_pod(0, "web")
        .unwrap_or_else(|e| panic!("ADD web: {e:?}"));
    let locked = sim
        .add_pod(0, "locked")
        .unwrap_or_else(|e| panic!("ADD locked: {e:?}"));
    assert_eq!(web.ip.to_string(), web_eni.private_ip);
    assert_eq!(locked.ip.to_string(), locked_eni.private_ip);
    let marker = web.result["interfaces"]
        .as_array()
        .and_then(|i| {
            i.iter()
                .find(|i| i["name"].as_str().is_some_and(|n| n.starts_with("dummy")))
        })
        .cloned()
        .expect("marker");
    assert_eq!(
        marker["mac"],
        format!("00:00:00:00:00:{:02x}", web_eni.vlan_id),
        "{marker}"
    );
    let vlan_link = format!("vlan.eth.{}", web_eni.vlan_id);
    let link = text(&exec_in(
        &node_ns,
        &["ip", "-d", "link", "show", &vlan_link],
    ));
    assert!(
        link.contains(&web_eni.if_address) && link.contains(&format!("id {} ", web_eni.vlan_id)),
        "{link}"
    );
    let rules = text(&exec_in(&node_ns, &["ip", "rule"]));
    assert!(
        rules.contains(&format!("iif {vlan_link} lookup {}", 100 + web_eni.vlan_id)),
        "{rules}"
    );

    // Through the branch ENI and back (the fabric's loop adds the branch ports: retried).
    let ok = wait_for("web pod -> node through its branch", READY, || {
        ping(&web.netns, &node_ip.to_string()).then_some(true)
    });
    assert!(ok);
    assert!(
        ping(&node_ns, &web.ip.to_string()),
        "node -> web (admitted by default)"
    );
    let router = format!("{}vpc", sim.prefix());
    let chain = format!(
        "in-{}",
        vpcsim::fabric::names::branch_port(&locked_eni.eni_id)
    );
    let before = drops(&router, &chain);
    assert!(
        !ping(&node_ns, &locked.ip.to_string()),
        "node -> locked refused by the pods group"
    );
    assert!(
        drops(&router, &chain) >= before + 2,
        "dropped by the locked branch's ingress ({chain})"
    );

    // DEL by prevResult's VLAN id: nothing of either pod is left.
    sim.del_pod(&web).expect("DEL web");
    sim.del_pod(&locked).expect("DEL locked");
    let left = text(&exec_in(
        &node_ns,
        &["sh", "-c", "ip -o link show; ip rule show"],
    ));
    assert!(!left.contains("vlan.eth."), "{left}");
    assert!(!left.contains(&web.ip.to_string()), "{left}");
    drop(ec2);
}

#[cfg(test)]
mod vm {
    #[test]
    fn real_ipamd_answers_the_plugin_for_branch_pods() {
        integration::vm::in_vm(
            "vm::real_ipamd_answers_the_plugin_for_branch_pods",
            super::MODULES,
            || {
                for bin in ["ipamd", "aws-cni"] {
                    let _ = integration::built_binary(bin);
                }
            },
            super::real_ipamd_answers_the_plugin,
        );
    }
}
