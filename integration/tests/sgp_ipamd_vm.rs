//! Security groups for pods end to end with the real control plane, in the test VM (802.1Q
//! needed; `integration::vm`): the simulated VPC with its fabric, two nodes, the Kubernetes API
//! simulator with the chart's RBAC, the VPC Resource Controller stand-in
//! (`integration::vpc_rc`), the real `ipamd` with `ENABLE_POD_ENI=true` and the real `aws-cni`
//! through the chart's conflist (rendered by `aws-cni-conflist` with
//! `POD_SECURITY_GROUP_ENFORCING_MODE`, as the init container does), once per enforcing mode.
//! Where `sgp_fabric_vm` answers the plugin with `test-ipamd` from hand-written annotations,
//! here the controller attaches the trunks and writes the pods' annotations and ipamd answers
//! the plugin (`PodVlanId`, `PodENIMAC`, `PodENISubnetGW`, `ParentIfIndex`).
//!
//! Checked per mode: branch pods get their own branch ENI's address through `vlan.eth.<id>`
//! (the VLAN link with the branch MAC, the mode's rules), CHECK passes; groups decide across
//! nodes (`web` in `default` admits the other node's pods, `locked` refuses them, the drop
//! counted by the router's chain of that branch); pods without a policy on the same node get
//! pool addresses and reach everything as before; kubelet-style TCP probes from the node to a
//! branch pod as upstream documents (strict: through the VPC, so the pod's groups decide;
//! standard: through the veth, always); killing ipamd, and losing its checkpoint, keeps the
//! branch pods working and never hands out their addresses; takeover: a branch pod wired as
//! upstream's plugin wires it (`upstream_node::wire_branch_pod`) before our ipamd starts keeps
//! working, passes our CHECK with upstream's prevResult and is deleted by it; DEL (twice)
//! leaves no VLAN link, rule or route of them.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Output;
use std::time::{Duration, Instant};

use integration::sim::{EchoServer, KubeOptions, Pod, Sim, SimConfig, exec_in, tcp_echo};
use integration::vpc_rc::{self, Controller, EniDetails};
use serde_json::{Value, json};

const MODULES: &[&str] = &["8021q", "veth"];
const READY: Duration = Duration::from_secs(240);
/// `K8S_POD_NAMESPACE` of the harness's plugin calls.
const NS: &str = "default";
/// The port the pods' "kubelet probe" server listens on.
const PROBE_PORT: u16 = 8080;

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

/// A kubelet-style TCP probe from `ns` to `ip`'s probe port.
fn probe(ns: &str, ip: Ipv4Addr) -> bool {
    tcp_echo(ns, SocketAddr::from((ip, PROBE_PORT))).is_ok()
}

/// A pod on `node` labelled `app=<app>`; with `branch`, it requests
/// `vpc.amazonaws.com/pod-eni` (as the controller's webhook makes a pod a
/// `SecurityGroupPolicy` selects do).
fn pod_object(name: &str, node: &str, app: &str, branch: bool) -> Value {
    let resources = if branch {
        json!({"limits": {vpc_rc::POD_ENI_RESOURCE: "1"},
               "requests": {vpc_rc::POD_ENI_RESOURCE: "1"}})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{
            "name": "main", "image": "registry.invalid/pause", "resources": resources}]},
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

/// Pod `name`'s `vpc.amazonaws.com/pod-eni` annotation (its first branch ENI).
fn annotation(sim: &Sim, name: &str) -> EniDetails {
    let pod = api(sim).get_object("v1", "Pod", Some(NS), name).unwrap();
    let details: Vec<EniDetails> = serde_json::from_str(
        pod["metadata"]["annotations"][vpc_rc::POD_ENI_ANNOTATION]
            .as_str()
            .expect("annotated"),
    )
    .expect("annotation");
    details[0].clone()
}

/// The node's links, rules and every table's routes, for leftovers.
fn host_state(sim: &Sim, node: usize) -> String {
    text(&exec_in(
        &sim.nodes[node].netns,
        &[
            "sh",
            "-c",
            "ip -o link show; ip rule show; ip route show table all",
        ],
    ))
}

/// Addresses ipamd's datastore holds for pods on `node` (introspection `/v1/enis`).
fn assigned_by_ipamd(sim: &Sim, node: usize) -> Vec<String> {
    sim.assigned(node)
        .expect("introspection")
        .keys()
        .map(ToString::to_string)
        .collect()
}

/// Runs `first` (a start or restart of node `i`'s ipamd) and, while ipamd exits before it is
/// ready, starts it again with the same environment after a doubling back-off (10 s, 20 s, ...)
/// as kubelet restarts a crashing container, until [`READY`] has passed: ipamd exits when its
/// init fails (an EC2 or IMDS call out of time on a loaded TCG VM), as upstream's does.
fn as_kubelet(
    sim: &mut Sim,
    i: usize,
    what: &str,
    first: impl FnOnce(&mut Sim) -> Result<(), integration::sim::SimError>,
) {
    let deadline = Instant::now() + READY;
    let mut back_off = Duration::from_secs(10);
    let mut result = first(sim);
    while let Err(e) = result {
        assert!(
            Instant::now() + back_off < deadline,
            "{what}: ipamd {i}: {e}"
        );
        eprintln!(
            "{what}: ipamd {i} exited ({e}); starting it again in {back_off:?} as kubelet would"
        );
        std::thread::sleep(back_off);
        back_off *= 2;
        result = sim.restart_ipamd_process(i, READY);
    }
}

#[allow(clippy::too_many_lines)]
fn branch_pods_with_the_real_control_plane(mode: &str) {
    let mut sim = Sim::start(&SimConfig {
        nodes: 2,
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    })
    .expect("VPC with kube");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let names: Vec<String> = (0..2)
        .map(|i| sim.kube().expect("kube").node_name(i).to_owned())
        .collect();
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

    // Both nodes: the chart's conflist for the mode, ipamd advertising the feature, the
    // controller attaching a trunk, ipamd setting it up.
    // DISABLE_TCP_EARLY_DEMUX=true as upstream's documentation asks for TCP probes to branch
    // pods (without it the node's probe to a strict-mode pod never connects: the early-demuxed
    // socket's cached route disagrees with the VLAN path its replies take).
    let mode_env = [
        ("ENABLE_POD_ENI", "true"),
        ("POD_SECURITY_GROUP_ENFORCING_MODE", mode),
        ("DISABLE_TCP_EARLY_DEMUX", "true"),
    ];
    pass(&controller);
    for i in 0..2 {
        let list = sim.install_conflist(i, &mode_env).expect("conflist");
        assert_eq!(list["plugins"][0]["podSGEnforcingMode"], mode, "{list}");
        let env = [mode_env[0], mode_env[1], ("IPAMD_POOL_TICK_SECONDS", "1")];
        as_kubelet(&mut sim, i, &format!("{mode}: start"), |s| {
            s.start_ipamd(i, &env, READY)
        });
    }
    for name in &names {
        wait_for("SecurityGroupsForPods on the CNINodes", READY, || {
            let c = api(&sim)
                .get_object("vpcresources.k8s.aws/v1alpha1", "CNINode", None, name)
                .ok()?;
            c.pointer("/spec/features")?
                .as_array()?
                .iter()
                .any(|f| f["name"] == "SecurityGroupsForPods")
                .then_some(())
        });
    }
    pass(&controller);
    let mut node_ips = Vec::new();
    for i in 0..2 {
        let instance = sim.nodes[i].instance_id.clone();
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
            let v = sim.introspect(i, "/v1/enis").ok()?;
            v.pointer(&format!("/0/ENIs/{trunk}/IsTrunk"))?
                .as_bool()?
                .then_some(())
        });
        // ... and the host shows its link, up (the fabric creates it after EC2's attach;
        // before that ipamd answers branch pods NOT_READY and kubelet would retry).
        let trunk_mac = sim.world.read(|s| {
            s.enis_of(&instance)
                .iter()
                .find(|e| e.id == trunk)
                .map(|e| e.mac.clone())
                .expect("trunk")
        });
        let node_ns = sim.nodes[i].netns.clone();
        wait_for("the trunk's link up on the host", READY, || {
            text(&exec_in(&node_ns, &["ip", "-o", "link", "show", "up"]))
                .contains(&format!("link/ether {trunk_mac} "))
                .then_some(())
        });
        node_ips.push(node_ip);
    }
    let rules0 = text(&exec_in(&sim.nodes[0].netns, &["ip", "rule"]));
    assert_eq!(
        rules0.contains("20:\tfrom all lookup local"),
        mode == "strict",
        "{mode}: lookup local moved to 20 in strict mode only\n{rules0}"
    );

    // Policies: `web` in `pods` and `default` (the nodes' group admits its members: the other
    // node's pods and the nodes), `locked` in `pods` only (no ingress rule).
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
    // node 0: web and locked (branch pods), plain (no policy); node 1: peer (no policy).
    for (name, node, app, branch) in [
        ("web", 0, "web", true),
        ("locked", 0, "locked", true),
        ("plain", 0, "plain", false),
        ("peer", 1, "peer", false),
    ] {
        api(&sim)
            .cluster()
            .apply_object(pod_object(name, &names[node], app, branch))
            .expect("pod");
    }
    pass(&controller);
    let (web_eni, locked_eni) = (annotation(&sim, "web"), annotation(&sim, "locked"));
    assert_ne!(web_eni.vlan_id, locked_eni.vlan_id);

    // ADD through the chart's chain, answered by the real ipamd; CHECK passes.
    let node_ns = sim.nodes[0].netns.clone();
    let add = |sim: &mut Sim, node: usize, name: &str| -> Pod {
        let pod = sim
            .add_pod(node, name)
            .unwrap_or_else(|e| panic!("{mode}: ADD {name}: {e:?}"));
        sim.check_pod(&pod)
            .unwrap_or_else(|e| panic!("{mode}: CHECK {name}: {e:?}"));
        pod
    };
    let web = add(&mut sim, 0, "web");
    let locked = add(&mut sim, 0, "locked");
    let plain = add(&mut sim, 0, "plain");
    let peer = add(&mut sim, 1, "peer");
    assert_eq!(web.ip.to_string(), web_eni.private_ip);
    assert_eq!(locked.ip.to_string(), locked_eni.private_ip);
    let mut branch_ips = vec![web.ip.to_string(), locked.ip.to_string()];
    assert!(
        !branch_ips.contains(&plain.ip.to_string()),
        "{mode}: the plain pod gets a pool address"
    );
    assert!(
        sim.eni_of(0, plain.ip).is_some(),
        "{mode}: the plain pod's address is on one of node 0's ENIs"
    );
    let held = assigned_by_ipamd(&sim, 0);
    assert!(
        held.contains(&plain.ip.to_string()) && !branch_ips.iter().any(|b| held.contains(b)),
        "{mode}: ipamd's datastore holds the plain pod, never a branch address: {held:?}"
    );
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
        web_eni.vlan_id.to_string(),
        "{mode}: the marker carries the VLAN id as upstream spells it: {marker}"
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
    let table = 100 + u32::from(web_eni.vlan_id);
    if mode == "strict" {
        assert!(
            rules.contains(&format!("iif {vlan_link} lookup {table}")),
            "{rules}"
        );
    } else {
        assert!(
            rules.contains(&format!("from {} lookup {table}", web.ip))
                && rules.contains(&format!("to {} lookup main", web.ip)),
            "{rules}"
        );
    }

    // Through the branch ENI and back (the fabric's loop adds the branch ports: retried).
    let node0 = node_ips[0].to_string();
    wait_for("web pod -> node through its branch", READY, || {
        ping(&web.netns, &node0).then_some(())
    });
    // Across nodes: web's `default` admits node 1's pod; locked's `pods` admits nothing.
    let router = format!("{}vpc", sim.prefix());
    let locked_in = format!(
        "in-{}",
        vpcsim::fabric::names::branch_port(&locked_eni.eni_id)
    );
    assert!(
        ping(&peer.netns, &web.ip.to_string()),
        "{mode}: node 1's pod -> web (admitted by default)"
    );
    // Every attempt is refused; the refusal is the locked branch's ingress once the router
    // routes the branch's address to its port (the fabric may still be applying the new
    // branch's route: a ping lost before it reaches the port counts nowhere, so try again).
    let before = drops(&router, &locked_in);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            !ping(&peer.netns, &locked.ip.to_string()),
            "{mode}: node 1's pod -> locked refused by the pods group"
        );
        if drops(&router, &locked_in) > before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{mode}: dropped by the locked branch's ingress ({locked_in})\n{}",
            text(&exec_in(&router, &["iptables-save", "-c", "-t", "filter"]))
        );
    }
    // The plain pod on the branch pods' node is unaffected: it reaches its node, the other
    // node's pod and the web pod.
    for (what, dst) in [
        ("its node", node0.clone()),
        ("node 1's pod", peer.ip.to_string()),
        ("web", web.ip.to_string()),
    ] {
        assert!(ping(&plain.netns, &dst), "{mode}: plain pod -> {what}");
    }
    assert!(
        ping(&peer.netns, &plain.ip.to_string()),
        "{mode}: peer -> plain"
    );

    // Kubelet-style probes (TCP from the node): strict routes them out of the node and in
    // through the branch, so the pod's groups decide (locked refuses the node); standard
    // delivers them through the veth, groups not applying (upstream's documented behaviour).
    let servers: Vec<EchoServer> = [&web, &locked, &plain]
        .iter()
        .map(|p| EchoServer::start(&p.netns, PROBE_PORT).expect("probe server"))
        .collect();
    let probes_ok = |sim: &Sim, what: &str| {
        let ns = &sim.nodes[0].netns;
        wait_for(&format!("{mode}: probe web ({what})"), READY, || {
            probe(ns, web.ip).then_some(())
        });
        assert!(probe(ns, plain.ip), "{mode}: probe plain ({what})");
        let before = drops(&router, &locked_in);
        let to_locked = probe(ns, locked.ip);
        if mode == "strict" {
            assert!(
                !to_locked,
                "{mode}: probe to locked refused by its group ({what})"
            );
            assert!(
                drops(&router, &locked_in) > before,
                "{mode}: the probe dropped at the locked branch ({what})"
            );
        } else {
            assert!(
                to_locked,
                "{mode}: probe to locked through the veth ({what})"
            );
        }
    };
    probes_ok(&sim, "first start");

    // ipamd killed, then restarted without its checkpoint: the branch pods keep working,
    // their addresses are never handed out, CHECK still passes.
    as_kubelet(&mut sim, 0, &format!("{mode}: restart"), |s| {
        s.restart_ipamd(0, true, READY)
    });
    probes_ok(&sim, "after a crash");
    // Takeover: a branch pod upstream's plugin wired (by hand, as `driver.go` does) while no
    // ipamd of ours ran, then ipamd started without a checkpoint (upstream's `ipam.json`
    // format is migration.rs's; it never lists branch pods). The same moment is our checkpoint
    // loss for the pods above.
    api(&sim)
        .cluster()
        .apply_object(pod_object("legacy", &names[0], "web", true))
        .expect("pod");
    pass(&controller);
    let legacy_eni = annotation(&sim, "legacy");
    let trunk_mac = sim.world.read(|s| {
        s.enis_of(&sim.nodes[0].instance_id)
            .iter()
            .find(|e| e.interface_type == "trunk")
            .map(|e| e.mac.clone())
            .expect("trunk")
    });
    let trunk_link = text(&exec_in(&node_ns, &["ip", "-o", "link", "show"]))
        .lines()
        .find(|l| l.contains(&format!("link/ether {trunk_mac} ")))
        .and_then(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .expect("trunk link");
    let subnet: ipnet::Ipv4Net = legacy_eni.subnet_cidr.parse().expect("branch subnet");
    let subnet_gw = Ipv4Addr::from_bits(subnet.network().to_bits() + 1);
    sim.stop_ipamd(0, true);
    let legacy_ns = format!("{}legacy", sim.prefix());
    let upstream = integration::upstream_node::wire_branch_pod(
        &node_ns,
        &legacy_ns,
        "legacy",
        legacy_eni.private_ip.parse().expect("branch address"),
        legacy_eni.vlan_id,
        &legacy_eni.if_address,
        subnet_gw,
        &trunk_link,
        mode,
    )
    .unwrap_or_else(|e| panic!("{mode}: upstream's branch pod: {e}"));
    let legacy = Pod {
        name: "legacy".to_owned(),
        node: 0,
        netns: legacy_ns.clone(),
        container_id: "0000legacy0000".to_owned(),
        ip: upstream.ip,
        ipv6: None,
        result: upstream.prev_result(
            &node_ns,
            &integration::sim::netns_path(&legacy_ns),
            subnet_gw,
        ),
    };
    as_kubelet(
        &mut sim,
        0,
        &format!("{mode}: restart without checkpoint"),
        |s| s.restart_ipamd_without_checkpoint(0, READY),
    );
    probes_ok(&sim, "after checkpoint loss");
    wait_for(
        "upstream's branch pod -> node through its branch",
        READY,
        || ping(&legacy.netns, &node0).then_some(()),
    );
    assert!(
        ping(&peer.netns, &legacy.ip.to_string()),
        "{mode}: node 1's pod -> upstream's branch pod (web's groups)"
    );
    sim.check_pod(&legacy).unwrap_or_else(|e| {
        panic!(
            "{mode}: our CHECK of upstream's branch pod (prevResult VLAN as a bare number): {e:?}"
        )
    });
    assert!(
        ping(&web.netns, &node0),
        "{mode}: web -> node after restarts"
    );
    for p in [&web, &locked, &plain] {
        sim.check_pod(p)
            .unwrap_or_else(|e| panic!("{mode}: CHECK {} after restarts: {e:?}", p.name));
    }
    branch_ips.push(legacy.ip.to_string());
    let held = assigned_by_ipamd(&sim, 0);
    assert!(
        held.contains(&plain.ip.to_string()) && !branch_ips.iter().any(|b| held.contains(b)),
        "{mode}: recovered from the host: the plain pod, never a branch address: {held:?}"
    );
    api(&sim)
        .cluster()
        .apply_object(pod_object("late", &names[0], "late", false))
        .expect("pod");
    let late = add(&mut sim, 0, "late");
    assert!(
        !branch_ips.contains(&late.ip.to_string()) && late.ip != plain.ip,
        "{mode}: a new pod gets none of the live pods' addresses ({})",
        late.ip
    );
    drop(servers);

    // DEL (by prevResult's VLAN id for branch pods), twice: nothing of them is left.
    for p in [&web, &locked, &plain, &late, &legacy] {
        sim.del_pod(p)
            .unwrap_or_else(|e| panic!("{mode}: DEL {}: {e:?}", p.name));
        sim.del_pod_again(p)
            .unwrap_or_else(|e| panic!("{mode}: DEL {} again: {e:?}", p.name));
    }
    let left = host_state(&sim, 0);
    assert!(!left.contains("vlan.eth."), "{mode}: {left}");
    for b in &branch_ips {
        assert!(!left.contains(&format!("{b} ")), "{mode}: {b} left: {left}");
    }
    for v in [web_eni.vlan_id, locked_eni.vlan_id, legacy_eni.vlan_id] {
        assert!(
            !left.contains(&format!("table {}", 100 + u32::from(v))),
            "{mode}: table of VLAN {v} left: {left}"
        );
    }
    assert!(
        ping(&peer.netns, &node0),
        "{mode}: node 1's pod still reaches node 0"
    );
    sim.del_pod(&peer).expect("DEL peer");
    drop(ec2);
}

#[cfg(test)]
mod vm {
    fn prepare() {
        for bin in ["ipamd", "aws-cni", "aws-cni-conflist", "egress-cni"] {
            let _ = integration::built_binary(bin);
        }
    }

    /// Both modes, one after the other in one VM (`integration::vm::in_one_vm`): each runs two
    /// nodes, the API server simulator and the controller on the VM's 2 TCG vCPUs.
    #[test]
    fn branch_pods_with_the_real_control_plane_in_one_vm() {
        integration::vm::in_one_vm(
            "sgp_ipamd_vm::vm::inside::",
            super::MODULES,
            std::time::Duration::from_secs(1800),
            prepare,
        );
    }

    mod inside {
        #[test]
        #[ignore = "runs in the test VM: sgp_ipamd_vm::vm::branch_pods_with_the_real_control_plane_in_one_vm"]
        fn branch_pods_with_the_real_control_plane_strict() {
            integration::vm::assert_inside();
            super::super::branch_pods_with_the_real_control_plane("strict");
        }

        #[test]
        #[ignore = "runs in the test VM: sgp_ipamd_vm::vm::branch_pods_with_the_real_control_plane_in_one_vm"]
        fn branch_pods_with_the_real_control_plane_standard() {
            integration::vm::assert_inside();
            super::super::branch_pods_with_the_real_control_plane("standard");
        }
    }
}
