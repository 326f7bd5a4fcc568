//! End to end (root only), issue 41: the address capacity the cluster can see, and per-node
//! warm targets, with the real ipamd on the simulated VPC and the Kubernetes API simulator,
//! through the chart's RBAC. The Node condition `networking.k8s.aws/AddressCapacity` and the
//! opt-in taint `networking.k8s.aws/address-capacity-exhausted` follow a subnet running dry
//! (other tenants take its addresses) and recovering, touching nothing else of the Node; the
//! taint stays off unless enabled; enabled without the chart's RBAC, ipamd says so and keeps
//! serving pods. The node's `networking.k8s.aws/*-target` annotations are followed live and
//! refused loudly when invalid.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{KubeOptions, METRICS, Sim, SimConfig, eventually};
use serde_json::{Value, json};
use vpcsim::state::CreateEni;

const READY: Duration = Duration::from_secs(90);
const CONDITION: &str = "networking.k8s.aws/AddressCapacity";
const TAINT: &str = "networking.k8s.aws/address-capacity-exhausted";

fn with_chart(values: Value) -> SimConfig {
    SimConfig {
        nodes: 1,
        kube: Some(KubeOptions {
            chart_values: values,
            ..KubeOptions::default()
        }),
        ..SimConfig::default()
    }
}

fn node(sim: &Sim) -> Value {
    let kube = sim.kube().expect("kube on");
    kube.api
        .get_object("v1", "Node", None, kube.node_name(0))
        .expect("the Node")
}

/// Our condition's (status, reason), if the Node has it.
fn condition(sim: &Sim) -> Option<(String, String)> {
    node(sim)["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == CONDITION)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

fn tainted(sim: &Sim) -> bool {
    node(sim)["spec"]["taints"].as_array().is_some_and(|t| {
        t.iter()
            .any(|t| t["key"] == TAINT && t["effect"] == "NoSchedule")
    })
}

/// The Node without what may change: its resourceVersion and managed fields, our condition,
/// our taint.
fn rest_of(mut n: Value) -> Value {
    if let Some(m) = n["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    if let Some(c) = n
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        c.retain(|c| c["type"] != CONDITION);
    }
    // a Node without taints has no `spec.taints` (omitempty), as before ours was added
    if let Some(spec) = n.get_mut("spec").and_then(Value::as_object_mut) {
        let none_left = spec
            .get_mut("taints")
            .and_then(Value::as_array_mut)
            .is_some_and(|t| {
                t.retain(|t| t["key"] != TAINT);
                t.is_empty()
            });
        if none_left {
            spec.remove("taints");
        }
    }
    n
}

fn capacity(sim: &Sim) -> Value {
    sim.introspect(0, "/v1/address-capacity")
        .unwrap_or(Value::Null)
}

fn metric(sim: &Sim, name: &str) -> Option<f64> {
    let text = sim.http_get(0, METRICS, "/metrics").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

fn primary_subnet(sim: &Sim) -> String {
    let id = sim.nodes[0].instance_id.clone();
    sim.world.read(|s| {
        s.eni(&s.instances[&id].primary_eni)
            .unwrap()
            .subnet_id
            .clone()
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

fn free_subnet(sim: &Sim, fillers: &[String]) {
    sim.world
        .mutate(|s, _| {
            for id in fillers {
                s.delete_eni(id)?;
            }
            Ok(())
        })
        .unwrap();
}

/// ipamd with a pool of one warm address, paced for a test.
const SMALL_POOL: [(&str, &str); 4] = [
    ("WARM_IP_TARGET", "1"),
    ("IPAMD_POOL_TICK_SECONDS", "1"),
    ("IPAMD_ADD_WAIT_TIMEOUT", "3"),
    ("IPAMD_BUSY_POOL_WAIT_SECONDS", "10"),
];

fn env(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    SMALL_POOL
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect()
}

/// `ipamd status` run on node 0 with the same environment as its ipamd.
fn status(sim: &Sim, extra: &[(&'static str, &'static str)]) -> String {
    let env = sim.ipamd_env(0, &env(extra));
    let mut args: Vec<String> = vec!["env".into(), "-i".into()];
    args.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    args.push(integration::built_binary("ipamd").display().to_string());
    args.push("status".into());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = integration::sim::exec_in(&sim.nodes[0].netns, &argv);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn wait_free(sim: &Sim, at_least: u64) {
    eventually(Duration::from_secs(60), || {
        let c = capacity(sim);
        (c["free"].as_u64() >= Some(at_least))
            .then_some(())
            .ok_or_else(|| format!("capacity {c}"))
    })
    .expect("the warm address");
}

#[test]
fn the_condition_and_taint_follow_a_subnet_running_dry_and_recovering_and_nothing_else() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&with_chart(
        json!({"addressCapacity": {"condition": true, "taint": true}}),
    ))
    .expect("simulated VPC with kube");
    sim.start_ipamd(
        0,
        &env(&[
            ("IPAMD_ADDRESS_CAPACITY_CONDITION", "true"),
            ("IPAMD_ADDRESS_CAPACITY_TAINT", "true"),
        ]),
        READY,
    )
    .expect("ipamd serves");
    eventually(Duration::from_secs(30), || {
        let c = condition(&sim);
        (c.as_ref().map(|c| c.0.as_str()) == Some("True"))
            .then_some(())
            .ok_or_else(|| format!("condition {c:?}"))
    })
    .expect("the condition says True once ipamd runs");
    assert!(!tainted(&sim));
    wait_free(&sim, 1);
    let before = rest_of(node(&sim));
    let figure = metric(&sim, "awscni_address_capacity").expect("the metric");
    assert!(
        figure > 10.0,
        "m5.large with a subnet of thousands: {figure}"
    );

    // Other tenants take the subnet; a pod takes the one warm address: nothing more to get.
    let subnet = primary_subnet(&sim);
    let fillers = fill_subnet(&sim, &subnet);
    let pod = sim.add_pod(0, "last").expect("the warm address");
    eventually(Duration::from_secs(60), || {
        let c = condition(&sim);
        (c == Some(("False".into(), "AddressesExhausted".into())) && tainted(&sim))
            .then_some(())
            .ok_or_else(|| {
                format!(
                    "condition {c:?}, tainted {}, {}",
                    tainted(&sim),
                    capacity(&sim)
                )
            })
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    let c = capacity(&sim);
    assert_eq!(c["obtainable"], 0, "{c}");
    assert_eq!(c["subnetDry"], true, "{c}");
    assert_eq!(metric(&sim, "awscni_address_capacity"), Some(0.0));
    assert_eq!(metric(&sim, "awscni_address_capacity_exhausted"), Some(1.0));
    assert_eq!(
        rest_of(node(&sim)),
        before,
        "nothing else of the Node changed"
    );

    // The tenants leave: after the subnet's back-off (120 s) the pool grows again, and after
    // the recovery hold the condition and the taint follow.
    free_subnet(&sim, &fillers);
    eventually(Duration::from_secs(240), || {
        let c = condition(&sim);
        (c == Some(("True".into(), "AddressesAvailable".into())) && !tainted(&sim))
            .then_some(())
            .ok_or_else(|| {
                format!(
                    "condition {c:?}, tainted {}, {}",
                    tainted(&sim),
                    capacity(&sim)
                )
            })
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    assert_eq!(metric(&sim, "awscni_address_capacity_exhausted"), Some(0.0));
    assert_eq!(
        rest_of(node(&sim)),
        before,
        "nothing else of the Node changed: spec {}",
        node(&sim)["spec"]
    );
    let other = sim.add_pod(0, "after").expect("addresses again");
    sim.del_pod(&other).unwrap();
    sim.del_pod(&pod).unwrap();
}

#[test]
fn the_taint_is_off_by_default_while_the_condition_says_exhausted() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&with_chart(json!({"addressCapacity": {"condition": true}})))
        .expect("simulated VPC with kube");
    let subnet = primary_subnet(&sim);
    fill_subnet(&sim, &subnet);
    let before = rest_of(node(&sim));
    sim.start_ipamd(
        0,
        &env(&[("IPAMD_ADDRESS_CAPACITY_CONDITION", "true")]),
        READY,
    )
    .expect("ipamd serves");
    eventually(Duration::from_secs(60), || {
        let c = condition(&sim);
        (c == Some(("False".into(), "AddressesExhausted".into())))
            .then_some(())
            .ok_or_else(|| format!("condition {c:?}, {}", capacity(&sim)))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !tainted(&sim),
        "no taint unless IPAMD_ADDRESS_CAPACITY_TAINT=true"
    );
    let c = capacity(&sim);
    assert_eq!(c["taint"]["state"]["enabled"], false, "{c}");
    assert_eq!(
        rest_of(node(&sim)),
        before,
        "nothing else of the Node changed"
    );
}

#[test]
fn enabled_without_the_charts_rbac_ipamd_says_so_and_keeps_serving() {
    if !can_run_kernel_tests() {
        return;
    }
    // the chart's defaults: no patch on nodes or nodes/status; the variables set by hand
    let mut sim = Sim::start(&with_chart(json!({}))).expect("simulated VPC with kube");
    let before = rest_of(node(&sim));
    sim.start_ipamd(
        0,
        &env(&[
            ("IPAMD_ADDRESS_CAPACITY_CONDITION", "true"),
            ("IPAMD_ADDRESS_CAPACITY_TAINT", "true"),
        ]),
        READY,
    )
    .expect("ipamd serves");
    eventually(Duration::from_secs(30), || {
        let log = sim.ipamd_log_tail(0, 200);
        log.contains("cannot write the address-capacity condition on the Node")
            .then_some(())
            .ok_or_else(|| "no refusal logged yet".to_owned())
    })
    .expect("the condition's refusal is logged");
    let pod = sim.add_pod(0, "a").expect("ADD works");
    wait_free(&sim, 1);
    let subnet = primary_subnet(&sim);
    fill_subnet(&sim, &subnet);
    let last = sim.add_pod(0, "b").expect("the warm address");
    eventually(Duration::from_secs(60), || {
        let log = sim.ipamd_log_tail(0, 300);
        log.contains("cannot write the address-capacity taint on the Node")
            .then_some(())
            .ok_or_else(|| format!("no taint refusal logged yet: {}", capacity(&sim)))
    })
    .expect("the taint's refusal is logged");
    let c = capacity(&sim);
    assert!(
        c["condition"]["state"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("forbidden") || e.contains("Forbidden")),
        "{c}"
    );
    assert!(c["taint"]["state"]["error"].as_str().is_some(), "{c}");
    assert_eq!(c["exhausted"], true, "{c}");
    let text = status(
        &sim,
        &[
            ("IPAMD_ADDRESS_CAPACITY_CONDITION", "true"),
            ("IPAMD_ADDRESS_CAPACITY_TAINT", "true"),
        ],
    );
    assert!(
        text.contains("address capacity: 0 obtainable for new pods"),
        "{text}"
    );
    assert!(
        text.contains("condition networking.k8s.aws/AddressCapacity: REFUSED by the API server")
            && text.contains(
                "taint networking.k8s.aws/address-capacity-exhausted: REFUSED by the API server"
            ),
        "{text}"
    );
    assert_eq!(condition(&sim), None);
    assert!(!tainted(&sim));
    assert_eq!(rest_of(node(&sim)), before);
    sim.del_pod(&last).unwrap();
    sim.del_pod(&pod).unwrap();
}

#[test]
fn the_nodes_warm_target_annotations_are_followed_live_and_bad_ones_refused() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&with_chart(json!({}))).expect("simulated VPC with kube");
    sim.start_ipamd(0, &env(&[]), READY).expect("ipamd serves");
    wait_free(&sim, 1);
    let targets = |sim: &Sim| capacity(sim)["warmTargets"].clone();
    assert_eq!(targets(&sim)["WARM_IP_TARGET"], 1);
    assert_eq!(targets(&sim)["fromNode"], false);

    // The node asks for 6 warm addresses: the pool grows to them, no restart.
    sim.annotate_node(0, "networking.k8s.aws/warm-ip-target", Some("6"))
        .unwrap();
    eventually(Duration::from_secs(60), || {
        let c = capacity(&sim);
        (c["warmTargets"]["WARM_IP_TARGET"] == 6 && c["free"].as_u64() >= Some(6))
            .then_some(())
            .ok_or_else(|| format!("{c}"))
    })
    .expect("the pool follows the node's annotation");
    assert_eq!(targets(&sim)["fromNode"], true);
    let text = status(&sim, &[]);
    assert!(
        text.contains("warm targets: from the node's annotations (networking.k8s.aws/warm-ip-target=6): WARM_IP_TARGET=6"),
        "{text}"
    );

    // An invalid value: refused as a whole, said in the log, the status and an Event; the
    // environment's targets are in force.
    sim.annotate_node(0, "networking.k8s.aws/minimum-ip-target", Some("lots"))
        .unwrap();
    eventually(Duration::from_secs(30), || {
        let t = targets(&sim);
        (t["refused"].as_str().is_some() && t["WARM_IP_TARGET"] == 1)
            .then_some(())
            .ok_or_else(|| format!("{t}"))
    })
    .expect("refused");
    assert!(
        targets(&sim)["refused"]
            .as_str()
            .unwrap()
            .contains("networking.k8s.aws/minimum-ip-target=\"lots\""),
        "{}",
        targets(&sim)
    );
    assert!(
        sim.ipamd_log_tail(0, 200)
            .contains("the node's warm-target annotations are refused")
    );
    let text = status(&sim, &[]);
    assert!(
        text.contains("warm targets: the node's annotations are REFUSED (networking.k8s.aws/minimum-ip-target=lots networking.k8s.aws/warm-ip-target=6)")
            && text.contains("the environment's targets are in force"),
        "{text}"
    );
    eventually(Duration::from_secs(30), || {
        let events = sim.kube_events(None)?;
        events
            .iter()
            .any(|e| e["reason"] == "WarmTargetsRefused" && e["type"] == "Warning")
            .then_some(())
            .ok_or_else(|| "no Warning Event yet".to_owned())
    })
    .expect("a Warning Event on the aws-node pod");

    // Fixed, then removed: the node's value, then the environment's again.
    sim.annotate_node(0, "networking.k8s.aws/minimum-ip-target", None)
        .unwrap();
    eventually(Duration::from_secs(30), || {
        let t = targets(&sim);
        (t["refused"].is_null() && t["WARM_IP_TARGET"] == 6)
            .then_some(())
            .ok_or_else(|| format!("{t}"))
    })
    .expect("the node's value again");
    sim.annotate_node(0, "networking.k8s.aws/warm-ip-target", None)
        .unwrap();
    eventually(Duration::from_secs(30), || {
        let t = targets(&sim);
        (t["WARM_IP_TARGET"] == 1 && t["fromNode"] == false)
            .then_some(())
            .ok_or_else(|| format!("{t}"))
    })
    .expect("back to the environment's");
}
