//! Network policy at pod start, with the real binaries on the simulated VPC and the
//! network-policy agent stand-in (`integration::npa`) in the node: upstream's plugin
//! (v1.23.1 `cmd/routed-eni-cni-plugin/cni.go`, `npaSocketPath`, `npAgentConnTimeout`) calls
//! `EnforceNpToPod` after wiring and before printing the result whenever ipamd's reply carries a
//! `NetworkPolicyMode` (`pkg/ipamd/rpc_handler.go` fills it from
//! `NETWORK_POLICY_ENFORCING_MODE`), fails the ADD when the agent cannot be reached or answers
//! `Success=false`, and calls `DeletePodNp` on DEL. Ours in addition (docs/plugin.md, "Network
//! policy at pod start"): a failed ADD takes its wiring back and releases the address, a
//! retried DEL still reaches the agent, and a late DEL of a re-created pod's old sandbox leaves
//! the new sandbox's policy alone.
#![allow(clippy::tests_outside_test_module)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use integration::can_run_kernel_tests;
use integration::npa::{Fault, Policy, PolicyRule};
use integration::sim::{
    AddressWatch, Attempt, Cnitool, EchoServer, Sandbox, Sim, SimConfig, TcpProbe,
};

const READY: Duration = Duration::from_secs(60);
/// A probe's SYN is answered within this on the fabric (generous: a loaded CI machine), or it
/// was dropped.
const PROBE_TIMEOUT: Duration = Duration::from_millis(700);
/// How long probing goes on after ADD returned (at least two dropped attempts' worth).
const AFTER_ADD: Duration = Duration::from_millis(2200);

fn one_node(mode: Option<&str>) -> Sim {
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    let env: Vec<(&str, &str)> = mode
        .map(|m| vec![("NETWORK_POLICY_ENFORCING_MODE", m)])
        .unwrap_or_default();
    sim.start_ipamd(0, &env, READY).expect("ipamd ready");
    sim
}

fn node_ip(sim: &Sim) -> Ipv4Addr {
    sim.nodes[0].primary_ip
}

fn host32(ip: Ipv4Addr) -> ipnet::IpNet {
    ipnet::IpNet::from(IpAddr::V4(ip))
}

/// Probes started before ADD, the ADD, and every attempt of each probe, with the instant ADD
/// returned.
struct Probed {
    pod: integration::sim::Pod,
    returned: Instant,
    /// (label, attempts) per probe.
    probes: Vec<(String, Vec<Attempt>)>,
}

/// A direction to probe: from the pod to a node port, from the node to a pod port, or from
/// another pod (its namespace) to a pod port.
#[derive(Clone)]
enum Dir {
    PodToNode(u16),
    NodeToPod(u16),
    PeerToPod(String, u16),
}

/// Creates the pod's namespace, starts listeners (node ports in the node, pod ports in the pod)
/// and one tight-loop TCP probe per direction, runs ADD, and probes on for [`AFTER_ADD`].
fn add_while_probing(sim: &mut Sim, name: &str, dirs: &[Dir]) -> Probed {
    let netns = sim.new_pod_netns().expect("pod netns");
    let node_ns = sim.nodes[0].netns.clone();
    let node = node_ip(sim);
    let watch = AddressWatch::start(&netns, "eth0", Duration::from_secs(30));
    let mut servers = Vec::new();
    let mut probes = Vec::new();
    for d in dirs {
        match d.clone() {
            Dir::PodToNode(port) => {
                servers.push(EchoServer::start(&node_ns, port).expect("node listener"));
                let to = SocketAddr::from((node, port));
                probes.push((
                    format!("pod -> node:{port}"),
                    TcpProbe::start(&netns, move || Some(to), PROBE_TIMEOUT),
                ));
            }
            Dir::NodeToPod(port) | Dir::PeerToPod(_, port) => {
                let (label, from) = match d {
                    Dir::PeerToPod(peer, _) => ("peer", peer.clone()),
                    _ => ("node", node_ns.clone()),
                };
                servers.push(EchoServer::start(&netns, port).expect("pod listener"));
                let w = watch.clone();
                probes.push((
                    format!("{label} -> pod:{port}"),
                    TcpProbe::start(
                        &from,
                        move || w.get().map(|ip| SocketAddr::from((ip, port))),
                        PROBE_TIMEOUT,
                    ),
                ));
            }
        }
    }
    let pod = sim
        .add_pod_in(0, name, netns)
        .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(0, 20)));
    let returned = Instant::now();
    std::thread::sleep(AFTER_ADD);
    let probes = probes
        .into_iter()
        .map(|(label, p)| (label, p.stop().expect("probe")))
        .collect();
    drop(servers);
    Probed {
        pod,
        returned,
        probes,
    }
}

impl Probed {
    /// Attempts of probe `label` that started after ADD returned: (all, connected).
    fn after_add(&self, label: &str) -> (usize, usize) {
        let attempts = &self
            .probes
            .iter()
            .find(|(l, _)| l == label)
            .unwrap_or_else(|| panic!("no probe {label}"))
            .1;
        let after: Vec<&Attempt> = attempts
            .iter()
            .filter(|a| a.started >= self.returned)
            .collect();
        (after.len(), after.iter().filter(|a| a.connected).count())
    }

    /// Every attempt of `label` after ADD returned was dropped (and there were some).
    fn assert_all_dropped(&self, label: &str) {
        let (all, connected) = self.after_add(label);
        assert!(all >= 2, "{label}: only {all} attempts after ADD returned");
        assert_eq!(
            connected, 0,
            "{label}: {connected} of {all} connections after ADD returned got through"
        );
    }

    /// Attempts of `label` after ADD returned got through (all of them).
    fn assert_all_passed(&self, label: &str) {
        let (all, connected) = self.after_add(label);
        assert!(all >= 2, "{label}: only {all} attempts after ADD returned");
        assert_eq!(
            connected,
            all,
            "{label}: {} of {all} connections after ADD returned were dropped",
            all - connected
        );
    }
}

/// (a) strict: the agent installs default deny before it answers, so no connection in either
/// direction gets through once ADD has returned (the probes run from before ADD). The agent
/// saw upstream's request: pod, namespace, the mode as configured, one interface.
#[test]
fn strict_mode_drops_a_new_pods_first_packet_both_ways() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = one_node(Some("strict"));
    let npa = sim.start_npa(0).expect("agent stand-in");
    let probed = add_while_probing(
        &mut sim,
        "web-0",
        &[Dir::PodToNode(7001), Dir::NodeToPod(7002)],
    );
    probed.assert_all_dropped("pod -> node:7001");
    probed.assert_all_dropped("node -> pod:7002");
    let calls = npa.calls();
    let enforce: Vec<_> = calls
        .iter()
        .filter(|c| c.rpc == integration::npa::Rpc::EnforceNpToPod)
        .collect();
    assert_eq!(enforce.len(), 1, "{calls:?}");
    assert_eq!(
        (
            enforce[0].pod.as_str(),
            enforce[0].namespace.as_str(),
            enforce[0].mode.as_deref(),
            enforce[0].interface_count
        ),
        ("web-0", "default", Some("strict"), Some(1))
    );
    let log = std::fs::read_to_string(sim.nodes[0].plugin_log()).unwrap_or_default();
    assert!(
        log.contains("network policy agent enforced the pod's policy")
            && log.contains("duration_ms"),
        "the plugin logs the call's outcome and duration:\n{log}"
    );
    // DEL: the agent forgets the pod; nothing is left.
    sim.del_pod(&probed.pod).expect("DEL");
    assert_eq!(npa.delete_calls_for("default", "web-0"), 1);
    assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
    sim.check_addresses().expect("addresses");
}

/// (b) standard with a policy the agent already knows for the pod: from the first packet after
/// ADD, exactly what the policy allows passes (peer pod -> pod:7002, pod -> node:7001), the rest
/// is dropped (peer -> pod:7003, pod -> node:7004). The peer, a pod without a policy, is not
/// filtered (standard mode).
#[test]
fn standard_mode_applies_a_known_policy_from_the_first_packet() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = one_node(Some("standard"));
    let npa = sim.start_npa(0).expect("agent stand-in");
    let node = node_ip(&sim);
    let peer = sim.add_pod(0, "client-0").expect("ADD peer");
    assert_eq!(npa.enforce_calls_for("default", "client-0"), 1);
    npa.set_policy(
        "default",
        "api-0",
        &Policy {
            ingress: vec![PolicyRule::tcp(host32(peer.ip), 7002)],
            egress: vec![PolicyRule::tcp(host32(node), 7001)],
        },
    )
    .expect("policy");
    let probed = add_while_probing(
        &mut sim,
        "api-0",
        &[
            Dir::PodToNode(7001),
            Dir::PeerToPod(peer.netns.clone(), 7002),
            Dir::PeerToPod(peer.netns.clone(), 7003),
            Dir::PodToNode(7004),
        ],
    );
    probed.assert_all_passed("pod -> node:7001");
    probed.assert_all_passed("peer -> pod:7002");
    probed.assert_all_dropped("peer -> pod:7003");
    probed.assert_all_dropped("pod -> node:7004");

    // The peer has no policy: reachable on any port.
    let _server = EchoServer::start(&peer.netns, 7005).expect("peer listener");
    integration::sim::tcp_echo(&sim.nodes[0].netns, SocketAddr::from((peer.ip, 7005)))
        .expect("a pod without a policy is not filtered in standard mode");
    for pod in [probed.pod, peer] {
        sim.del_pod(&pod).expect("DEL");
    }
    assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
    sim.check_addresses().expect("addresses");
}

/// (c) an agent that is absent (no socket), refusing (a socket nobody listens on) or answering
/// `Success=false`: ADD fails with a CNI error naming the agent and its socket, the wiring is
/// taken back and the address released (ipamd assigns nothing, the node has no pod leftovers),
/// and the ADD retried once the agent is back succeeds.
#[test]
fn an_agent_that_does_not_enforce_fails_the_add_and_nothing_is_left() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = one_node(Some("strict"));
    let npa = sim.start_npa(0).expect("agent stand-in");
    let socket = sim.nodes[0].npa_socket();
    for case in ["absent", "refusing", "fail"] {
        match case {
            "absent" => npa.set_fault(Fault::Refuse).expect("stop listening"),
            "refusing" => {
                // A socket file nobody listens on: connect(2) gets ECONNREFUSED.
                let l = std::os::unix::net::UnixListener::bind(&socket).expect("stale socket");
                drop(l);
            }
            _ => {
                let _ = std::fs::remove_file(&socket);
                npa.set_fault(Fault::Fail).expect("fail");
            }
        }
        let started = Instant::now();
        let err = sim
            .add_pod(0, &format!("pod-{case}"))
            .expect_err("ADD must fail without enforcement");
        let took = started.elapsed();
        let e: serde_json::Value = serde_json::from_str(&err.output)
            .unwrap_or_else(|_| panic!("{case}: not a CNI error: {err}"));
        let msg = e["msg"].as_str().unwrap_or_default();
        assert!(
            msg.starts_with("add cmd: failed to setup network policy")
                && msg.contains("network policy agent")
                && msg.contains(&socket.display().to_string()),
            "{case}: {e}"
        );
        let want_code = if case == "fail" { 104 } else { 11 };
        assert_eq!(e["code"], want_code, "{case}: {e}");
        if case != "fail" {
            assert!(
                took >= Duration::from_millis(1900),
                "{case}: the plugin dials for 2 s as upstream's (took {took:?})"
            );
        }
        assert_eq!(
            sim.pod_leftovers(0),
            Vec::<String>::new(),
            "{case}: the wiring is taken back"
        );
        sim.check_addresses()
            .unwrap_or_else(|e| panic!("{case}: the address is released: {e}"));
    }
    npa.set_fault(Fault::None).expect("agent back");
    let pod = sim
        .add_pod(0, "pod-retried")
        .expect("ADD after the agent is back");
    assert_eq!(npa.enforce_calls_for("default", "pod-retried"), 1);
    sim.check_addresses().expect("addresses");
    sim.del_pod(&pod).expect("DEL");
    assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
}

/// (d) DEL while the agent is down fails (kubelet retries); the retry, to which ipamd answers
/// "unknown pod", still reaches the agent: exactly one `DeletePodNp` for the pod; a further DEL
/// succeeds too.
#[test]
fn a_del_with_the_agent_down_fails_and_its_retry_reaches_the_agent() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = one_node(Some("standard"));
    let npa = sim.start_npa(0).expect("agent stand-in");
    let pod = sim.add_pod(0, "cache-0").expect("ADD");
    npa.set_fault(Fault::Refuse).expect("agent down");
    let err = sim
        .del_pod(&pod)
        .expect_err("DEL must fail while the agent is down");
    assert!(
        err.output
            .contains("del cmd: failed to connect to network policy agent")
            && err.output.contains("npa.sock"),
        "{err}"
    );
    assert_eq!(npa.delete_calls_for("default", "cache-0"), 0);
    // The teardown itself happened; only the agent is owed its call.
    assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
    npa.set_fault(Fault::None).expect("agent back");
    sim.del_pod_again(&pod).expect("retried DEL");
    assert_eq!(npa.delete_calls_for("default", "cache-0"), 1);
    sim.del_pod_again(&pod).expect("DEL once more");
    sim.check_addresses().expect("addresses");
}

/// (e) no `NETWORK_POLICY_ENFORCING_MODE` (upstream's opt-out): the plugin never dials the
/// agent, and the pod is reachable from the first attempt after ADD (the probes of (a) and (b)
/// see traffic when nothing filters it).
#[test]
fn without_a_mode_the_agent_is_never_dialled() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = one_node(None);
    let npa = sim.start_npa(0).expect("agent stand-in");
    let probed = add_while_probing(
        &mut sim,
        "web-0",
        &[Dir::PodToNode(7001), Dir::NodeToPod(7002)],
    );
    probed.assert_all_passed("pod -> node:7001");
    probed.assert_all_passed("node -> pod:7002");
    sim.del_pod(&probed.pod).expect("DEL");
    sim.del_pod_again(&probed.pod).expect("DEL again");
    assert_eq!(npa.connects(), 0, "{:?}", npa.events());
}

/// (f) a StatefulSet pod re-created under the same name on the same node: the new sandbox's
/// ADD replaces the old veth and is enforced; the old sandbox's DEL, arriving late, finds the
/// pod's veth wired to the new sandbox and does not ask the agent to forget the pod, which
/// stays filtered. The new sandbox's own DEL then does.
#[test]
fn a_late_del_of_a_re_created_pods_old_sandbox_leaves_the_new_one_enforced() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = one_node(Some("strict"));
    let npa = sim.start_npa(0).expect("agent stand-in");
    let old = sim.add_pod(0, "db-0").expect("ADD (old sandbox)");
    let new = add_while_probing(&mut sim, "db-0", &[Dir::NodeToPod(7002)]);
    new.assert_all_dropped("node -> pod:7002");
    assert_eq!(npa.enforce_calls_for("default", "db-0"), 2);
    sim.del_pod(&old).expect("late DEL of the old sandbox");
    assert_eq!(
        npa.delete_calls_for("default", "db-0"),
        0,
        "the old sandbox's DEL must not drop the new sandbox's policy"
    );
    let log = std::fs::read_to_string(sim.nodes[0].plugin_log()).unwrap_or_default();
    assert!(log.contains("its network policy is left in place"), "{log}");
    // Still filtered: a fresh probe from the node gets nothing through.
    let to = SocketAddr::from((new.pod.ip, 7002));
    let _server = EchoServer::start(&new.pod.netns, 7002).expect("listener");
    let probe = TcpProbe::start(&sim.nodes[0].netns, move || Some(to), PROBE_TIMEOUT);
    std::thread::sleep(Duration::from_millis(1600));
    let attempts = probe.stop().expect("probe");
    assert!(
        attempts.len() >= 2 && attempts.iter().all(|a| !a.connected),
        "{attempts:?}"
    );
    sim.del_pod(&new.pod).expect("DEL (new sandbox)");
    assert_eq!(npa.delete_calls_for("default", "db-0"), 1);
    assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
    sim.check_addresses().expect("addresses");
}

/// Issue 38's suspicion: a DEL decides "no other sandbox is wired under this pod's names" and
/// only then calls `DeletePodNp` (after redialling the agent for up to 2 s when it is away); a
/// same-name pod's ADD in between would wire and be enforced, and the late `DeletePodNp` would
/// then drop the new sandbox's policy. ADD and DEL of one pod hold a per-pod lock for the
/// whole verb (`pod_lock`): with the agent slow (3 s a call), the re-created pod's ADD, started
/// while the old sandbox's DEL waits for its `DeletePodNp`, is wired and enforced only after
/// that DEL is done (its `EnforceNpToPod` recorded a whole slow call after the `DeletePodNp`),
/// and the new pod ends enforced. Without the lock the two overlapped.
#[test]
fn a_del_and_an_add_of_the_same_pod_never_overlap() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = one_node(Some("strict"));
    let npa = sim.start_npa(0).expect("agent stand-in");
    let old = sim.add_pod(0, "db-0").expect("ADD (old sandbox)");
    let slow = Duration::from_millis(3000);
    npa.set_fault(Fault::Slow(slow)).expect("slow agent");
    let target = integration::sim::PluginTarget::of(&sim, 0);
    let bin = integration::sim::Bins::beside_current_exe()
        .expect("binaries built")
        .aws_cni;
    let new = std::thread::scope(|scope| {
        let del = scope.spawn(|| {
            integration::sim::run_plugin(&bin, &target, "DEL", old.sandbox(), Some(&old.result))
        });
        std::thread::sleep(Duration::from_millis(300));
        let new = sim.add_pod(0, "db-0").expect("ADD (new sandbox)");
        del.join()
            .expect("DEL thread")
            .expect("late DEL of the old sandbox");
        new
    });
    let at = |rpc: integration::npa::Rpc| {
        npa.calls()
            .iter()
            .filter(|c| c.rpc == rpc && c.pod == "db-0")
            .map(|c| c.at_ms)
            .max()
            .expect("call recorded")
    };
    let deleted = at(integration::npa::Rpc::DeletePodNp);
    let enforced = at(integration::npa::Rpc::EnforceNpToPod);
    let gap = Duration::from_millis(enforced.saturating_sub(deleted));
    assert!(
        gap >= slow - Duration::from_millis(500),
        "the new sandbox's ADD overlapped the old sandbox's DEL: EnforceNpToPod only {gap:?} after DeletePodNp"
    );
    npa.set_fault(Fault::None).expect("agent back");
    let veth = npa.veth_for("default", "db-0");
    assert!(
        integration::npa::chains_installed(&sim.nodes[0].netns, &veth),
        "the new sandbox is enforced"
    );
    sim.del_pod(&new).expect("DEL (new sandbox)");
    integration::supervisor::delete_netns(&old.netns);
    assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
}

/// The aws-node container's environment as the chart renders it for `values` (real Helm,
/// `integration/chart/render_daemonset.py`), and the pod's container names.
fn rendered_node_env(values: &str) -> (serde_json::Value, Vec<String>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("chart/render_daemonset.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(values)
        .output()
        .expect("python3 (integration/test.sh installs helm-python-sdk)");
    assert!(
        out.status.success(),
        "render_daemonset.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let containers = v["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str().map(str::to_owned))
        .collect();
    (v["node"]["env"].clone(), containers)
}

/// A real CNI client (libcni's `cnitool`) ADD, CHECK, DEL on the conflist the chart's template
/// renders, ipamd started with `NETWORK_POLICY_ENFORCING_MODE` exactly as the chart renders it:
/// with the node agent (chart default, `standard`) the agent enforces and forgets the pod; with
/// `nodeAgent.enabled=false` the variable is not rendered and the plugin never dials.
#[test]
fn cnitool_on_the_rendered_conflist_with_and_without_the_node_agent() {
    if !can_run_kernel_tests() {
        return;
    }
    for (values, agent) in [("{}", true), (r#"{"nodeAgent":{"enabled":false}}"#, false)] {
        let (env, containers) = rendered_node_env(values);
        assert_eq!(
            containers.iter().any(|c| c == "aws-eks-nodeagent"),
            agent,
            "{values}: {containers:?}"
        );
        let mode = env["NETWORK_POLICY_ENFORCING_MODE"]
            .as_str()
            .map(str::to_owned);
        assert_eq!(mode.as_deref(), agent.then_some("standard"), "{values}");
        let mut sim = one_node(mode.as_deref());
        sim.install_conflist(0, &[]).expect("conflist");
        sim.edit_conflist(0, |c| c["disableCheck"] = false.into())
            .expect("conflist");
        let npa = sim.start_npa(0).expect("agent stand-in");
        let tool = Cnitool::build(sim.dir()).expect("build cnitool");
        let netns = sim.new_pod_netns().expect("pod netns");
        let sandbox = Sandbox {
            pod_name: "cnitool-pod",
            container_id: "cnitool0123456789",
            netns: &netns,
        };
        sim.cnitool(&tool, 0, "add", sandbox)
            .unwrap_or_else(|e| panic!("{values}: {e}\n{}", sim.ipamd_log_tail(0, 20)));
        sim.cnitool(&tool, 0, "check", sandbox).expect("CHECK");
        sim.cnitool(&tool, 0, "del", sandbox).expect("DEL");
        sim.cnitool(&tool, 0, "del", sandbox).expect("DEL again");
        if agent {
            assert_eq!(npa.enforce_calls_for("default", "cnitool-pod"), 1);
            assert!(npa.delete_calls_for("default", "cnitool-pod") >= 1);
            let calls = npa.calls();
            assert!(
                calls
                    .iter()
                    .all(|c| c.mode.is_none() || c.mode.as_deref() == Some("standard")),
                "{calls:?}"
            );
        } else {
            assert_eq!(npa.connects(), 0, "{values}: {:?}", npa.events());
        }
        assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
        sim.check_addresses().expect("addresses");
        drop(npa);
        let errors = sim.shutdown();
        assert!(errors.is_empty(), "{errors:?}");
    }
}

/// `GetNetworkPolicyConfigs` over node 0's ipamd socket (the agent's start-up call).
fn agent_config(sim: &Sim) -> ipamd_proto::rpc::NetworkPolicyAgentConfigReply {
    let socket = sim.nodes[0].socket();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect to ipamd");
        ipamd_proto::rpc::config_server_backend_client::ConfigServerBackendClient::new(channel)
            .get_network_policy_configs(())
            .await
            .expect("GetNetworkPolicyConfigs")
            .into_inner()
    })
}

/// IPv6 mode (upstream's) and dual-stack pods (ours), each through the chain the chart's
/// conflist renders (aws-cni, egress-cni, portmap): the plugin hands the pod to the agent with
/// one interface (`InterfaceCount` = the allocation's entries, as upstream counts them; a
/// dual-stack allocation is one entry), and strict mode's default deny covers the pod's IPv6
/// from the first packet after ADD. ipamd tells the agent one node address family in IPv6 mode
/// (upstream `GetNetworkPolicyConfigs`: `NodeIPv6` only), IPv4 otherwise.
#[test]
fn ipv6_and_dual_stack_pods_are_enforced_with_one_interface() {
    if !can_run_kernel_tests() {
        return;
    }
    let ipv6_mode: &[(&str, &str)] = &[
        ("ENABLE_IPv6", "true"),
        ("ENABLE_IPv4", "false"),
        ("ENABLE_PREFIX_DELEGATION", "true"),
        ("WARM_PREFIX_TARGET", "1"),
        ("NETWORK_POLICY_ENFORCING_MODE", "strict"),
    ];
    let dual: &[(&str, &str)] = &[
        ("ENABLE_DUAL_STACK_PODS", "true"),
        ("NETWORK_POLICY_ENFORCING_MODE", "strict"),
    ];
    for (label, env) in [("ipv6", ipv6_mode), ("dual-stack", dual)] {
        let mut sim = Sim::start(&SimConfig {
            nodes: 1,
            ipv6: true,
            ..SimConfig::default()
        })
        .expect("simulated VPC");
        let conflist_env: Vec<(&str, &str)> = env
            .iter()
            .copied()
            .filter(|(k, _)| *k != "NETWORK_POLICY_ENFORCING_MODE")
            .collect();
        sim.install_conflist(0, &conflist_env).expect("conflist");
        sim.start_ipamd(0, env, READY).expect("ipamd ready");
        let config = agent_config(&sim);
        assert_eq!(config.network_policy_mode, "strict", "{label}");
        let node_v6 = sim.nodes[0].primary_ipv6.expect("node IPv6").to_string();
        if label == "ipv6" {
            assert_eq!(
                (config.node_i_pv4.as_str(), config.node_i_pv6.as_str()),
                ("", node_v6.as_str())
            );
        } else {
            assert_eq!(
                (config.node_i_pv4, config.node_i_pv6),
                (sim.nodes[0].primary_ip.to_string(), String::new())
            );
        }
        let npa = sim.start_npa(0).expect("agent stand-in");
        let pod = sim
            .add_pod(0, "v6-0")
            .unwrap_or_else(|e| panic!("{label}: {e}\n{}", sim.ipamd_log_tail(0, 20)));
        let returned = Instant::now();
        let v6 = pod
            .ipv6
            .unwrap_or_else(|| panic!("{label}: no IPv6 in {}", pod.result));
        let calls = npa.calls();
        assert_eq!(calls.len(), 1, "{label}: {calls:?}");
        assert_eq!(
            (calls[0].mode.as_deref(), calls[0].interface_count),
            (Some("strict"), Some(1)),
            "{label}"
        );
        let _server = EchoServer::start_at(
            &pod.netns,
            SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 7002)),
        )
        .expect("pod listener");
        let to = SocketAddr::from((v6, 7002));
        let probe = TcpProbe::start(&sim.nodes[0].netns, move || Some(to), PROBE_TIMEOUT);
        std::thread::sleep(Duration::from_millis(1600));
        let attempts = probe.stop().expect("probe");
        assert!(
            attempts.len() >= 2
                && attempts
                    .iter()
                    .all(|a| a.started < returned || !a.connected),
            "{label}: node -> [{v6}]:7002 must be dropped: {attempts:?}"
        );
        sim.del_pod(&pod).expect("DEL");
        assert_eq!(npa.delete_calls_for("default", "v6-0"), 1, "{label}");
        assert_eq!(sim.pod_leftovers(0), Vec::<String>::new(), "{label}");
        drop(npa);
        let errors = sim.shutdown();
        assert!(errors.is_empty(), "{label}: {errors:?}");
    }
}
