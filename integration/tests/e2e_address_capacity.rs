//! End to end (root only), issue 41: the address capacity the cluster can see, and per-node
//! warm targets, with the real ipamd on the simulated VPC and the Kubernetes API simulator,
//! through the chart's RBAC. The Node condition `networking.k8s.aws/AddressCapacity` and the
//! opt-in taint `networking.k8s.aws/address-capacity-exhausted` follow a subnet running dry
//! (other tenants take its addresses) and recovering, touching nothing else of the Node; the
//! taint stays off unless enabled; enabled without the chart's RBAC, ipamd says so and keeps
//! serving pods; the condition is written again when another client changes or removes it.
//! The node's `networking.k8s.aws/*-target` annotations are followed live and
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

/// Node `n` with our condition set to `status`, or removed (None), as an admin's client would
/// write it (the whole object, status included).
fn overwrite_condition(sim: &Sim, status: Option<&str>) {
    let mut n = node(sim);
    let conditions = n
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
        .expect("conditions");
    conditions.retain(|c| c["type"] != CONDITION);
    if let Some(status) = status {
        conditions.push(
            json!({"type": CONDITION, "status": status, "reason": "SomeoneElse",
            "message": "written by another client"}),
        );
    }
    if let Some(m) = n["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    let api = &sim.kube().expect("kube on").api;
    api.cluster().apply_object(n).expect("admin update");
}

#[test]
fn a_condition_overwritten_or_removed_by_someone_else_is_written_again() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&with_chart(json!({"addressCapacity": {"condition": true}})))
        .expect("simulated VPC with kube");
    sim.start_ipamd(
        0,
        &env(&[("IPAMD_ADDRESS_CAPACITY_CONDITION", "true")]),
        READY,
    )
    .expect("ipamd serves");
    let is_true = |sim: &Sim| {
        let c = condition(sim);
        (c.as_ref().map(|c| (c.0.as_str(), c.1.as_str())) == Some(("True", "AddressesAvailable")))
            .then_some(())
            .ok_or_else(|| format!("condition {c:?}"))
    };
    eventually(Duration::from_secs(30), || is_true(&sim)).expect("True once ipamd runs");
    overwrite_condition(&sim, Some("False"));
    assert_eq!(condition(&sim).map(|c| c.1), Some("SomeoneElse".to_owned()));
    eventually(Duration::from_secs(30), || is_true(&sim)).expect("written again");
    assert!(
        sim.ipamd_log_tail(0, 200)
            .contains("changed or removed by someone else; writing it again"),
        "said in the log"
    );
    overwrite_condition(&sim, None);
    assert_eq!(condition(&sim), None);
    eventually(Duration::from_secs(30), || is_true(&sim)).expect("put back once removed");
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

const INVENTORY: &str = "cni-subnet-inventory";

/// cni-metrics-helper's document (as `cni_metrics_helper::round::inventory_document` writes
/// it) for `subnet`: `free` addresses, observed `age_secs` ago, running out in an hour.
fn inventory_yaml(subnet: &str, free: u32, age_secs: u64) -> String {
    use ipam_core::pool::subnet_inventory::{InventoryDocument, SubnetEntry, VERSION};
    let now = std::time::SystemTime::now();
    let doc = InventoryDocument {
        version: VERSION,
        observed_at: now - Duration::from_secs(age_secs),
        interval_seconds: 300,
        subnets: vec![SubnetEntry {
            subnet_id: subnet.to_owned(),
            free_addresses: free,
            free_prefix_blocks: free / 16,
            address_consumption_per_second: Some(0.5),
            address_exhaustion_at: Some(now + Duration::from_secs(3600)),
            prefix_block_consumption_per_second: None,
            prefix_block_exhaustion_at: None,
        }],
    };
    configmap_yaml(&doc.render())
}

fn configmap_yaml(data: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": INVENTORY, "namespace": "kube-system"},
        "data": {"inventory.json": data},
    })
    .to_string()
}

fn inventory_state(sim: &Sim) -> (String, String) {
    let c = capacity(sim);
    let i = &c["subnetInventory"];
    (
        i["state"].as_str().unwrap_or_default().to_owned(),
        i["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

#[test]
fn the_helpers_recount_bounds_the_capacity_and_bad_or_stale_inventories_are_ignored() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&with_chart(json!({
        "addressCapacity": {"condition": true},
        "subnetInventory": {"configMap": INVENTORY},
    })))
    .expect("simulated VPC with kube");
    let extra = [
        ("IPAMD_ADDRESS_CAPACITY_CONDITION", "true"),
        (
            "IPAMD_SUBNET_INVENTORY_CONFIGMAP",
            "kube-system/cni-subnet-inventory",
        ),
    ];
    sim.start_ipamd(0, &env(&extra), READY)
        .expect("ipamd serves");
    wait_free(&sim, 1);
    // no ConfigMap yet: said, ipamd's own figure
    eventually(Duration::from_secs(30), || {
        let s = inventory_state(&sim);
        (s.0 == "missing")
            .then_some(())
            .ok_or_else(|| format!("{s:?}"))
    })
    .expect("the missing ConfigMap is said");
    let own = capacity(&sim)["obtainable"].as_u64().unwrap();
    assert!(own > 10, "thousands free in the subnet: {own}");

    // The helper counts 0 free in the node's subnet (the VPC still has thousands, and ipamd's
    // own listing says so): nothing more from EC2 in the figure, only what the node holds
    // (the pool still keeps its one warm address: EC2 really has them).
    let subnet = primary_subnet(&sim);
    assert!(sim.world.read(|s| s.available_ip_count(&subnet)) > 100);
    sim.kube_apply(&inventory_yaml(&subnet, 0, 0)).unwrap();
    eventually(Duration::from_secs(60), || {
        let c = capacity(&sim);
        (c["fromEc2"] == 0 && c["subnetFree"] == 0 && c["bound"] == "subnet")
            .then_some(())
            .ok_or_else(|| format!("{c}"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    let c = capacity(&sim);
    assert_eq!(inventory_state(&sim).0, "used");
    assert_eq!(
        c["obtainable"].as_u64(),
        Some(c["free"].as_u64().unwrap() + c["cooling"].as_u64().unwrap()),
        "{c}"
    );
    assert!(c["obtainable"].as_u64() < Some(own), "{c}");
    assert_eq!(
        c["subnetDry"], false,
        "no refusal: the helper's figure alone: {c}"
    );
    assert!(c["subnetExhaustionForecast"].as_str().is_some(), "{c}");
    let text = status(&sim, &extra);
    assert!(
        text.contains("subnet inventory kube-system/cni-subnet-inventory: USED")
            && text.contains("subnets forecast to run out at"),
        "{text}"
    );

    // The helper's next round counts room again: the figure recovers.
    sim.kube_apply(&inventory_yaml(&subnet, 500, 0)).unwrap();
    eventually(Duration::from_secs(60), || {
        let c = capacity(&sim);
        (c["subnetFree"] == 500 && c["fromEc2"].as_u64() > Some(10))
            .then_some(())
            .ok_or_else(|| format!("{c}"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));

    // Malformed: refused loudly, ipamd's own figure.
    sim.kube_apply(&configmap_yaml("{\"version\": 1, \"subnets\": "))
        .unwrap();
    eventually(Duration::from_secs(30), || {
        let s = inventory_state(&sim);
        (s.0 == "malformed")
            .then_some(())
            .ok_or_else(|| format!("{s:?}"))
    })
    .expect("malformed said");
    assert!(capacity(&sim)["subnetFree"] != 500);
    assert!(
        sim.ipamd_log_tail(0, 300)
            .contains("cni-metrics-helper's subnet inventory cannot be used")
    );

    // Stale (three intervals of 300 s and more): ignored, said; a 0 in it changes nothing.
    sim.kube_apply(&inventory_yaml(&subnet, 0, 3600)).unwrap();
    eventually(Duration::from_secs(30), || {
        let s = inventory_state(&sim);
        (s.0 == "ignored" && s.1.starts_with("stale"))
            .then_some(())
            .ok_or_else(|| format!("{s:?}"))
    })
    .expect("stale said");
    let c = capacity(&sim);
    assert!(c["obtainable"].as_u64() > Some(10), "{c}");
    assert!(c["subnetExhaustionForecast"].is_null(), "{c}");
    let text = status(&sim, &extra);
    assert!(
        text.contains("subnet inventory kube-system/cni-subnet-inventory: IGNORED (stale"),
        "{text}"
    );
}

#[test]
fn the_inventory_without_the_charts_rbac_is_said_refused_and_ipamd_keeps_its_figure() {
    if !can_run_kernel_tests() {
        return;
    }
    // the chart without subnetInventory: no Role on the ConfigMap; the variable set by hand
    let mut sim = Sim::start(&with_chart(json!({}))).expect("simulated VPC with kube");
    let subnet = primary_subnet(&sim);
    sim.kube_apply(&inventory_yaml(&subnet, 0, 0)).unwrap();
    sim.start_ipamd(
        0,
        &env(&[(
            "IPAMD_SUBNET_INVENTORY_CONFIGMAP",
            "kube-system/cni-subnet-inventory",
        )]),
        READY,
    )
    .expect("ipamd serves");
    wait_free(&sim, 1);
    eventually(Duration::from_secs(30), || {
        let s = inventory_state(&sim);
        (s.0 == "refused")
            .then_some(())
            .ok_or_else(|| format!("{s:?}"))
    })
    .expect("the refusal is said");
    let c = capacity(&sim);
    assert!(
        c["obtainable"].as_u64() > Some(10),
        "the helper's 0 was never read: {c}"
    );
    assert!(
        sim.ipamd_log_tail(0, 300)
            .contains("cni-metrics-helper's subnet inventory cannot be used")
    );
}
