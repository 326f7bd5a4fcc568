//! The ADD undo log against the real kernel: a plan whose last step the kernel refuses leaves
//! nothing behind in the node (veth, host route, rules added before the failure).

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use aws_cni::allocation::Allocation;
use aws_cni::apply::Datapath;
use aws_cni::plan::plan_add;
use aws_cni::spec::{CniEnv, NetConf};
use dataplane::{Family, NetNs, Rule};
use integration::{TestNode, can_run_kernel_tests};
use ipamd_proto::rpc::{AddNetworkReply, IpAllocationMetadata};

#[test]
fn failing_last_step_is_undone_in_reverse() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("undo");
    let pod = node.add_pod_netns("p");
    let vars = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "undo1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", pod.path.to_str().unwrap()),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let env = CniEnv::from_vars(&vars).unwrap();
    let conf = NetConf::parse(br#"{"cniVersion":"1.0.0","name":"aws-cni"}"#).unwrap();
    let reply = AddNetworkReply {
        success: true,
        ip_allocation_metadata: vec![IpAllocationMetadata {
            i_pv4_addr: "198.18.1.20".into(),
            device_number: 1,
            route_table_id: 2,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut plan = plan_add(&Allocation::decode(&reply).unwrap(), &conf, &env).unwrap();
    // The kernel refuses an iif name longer than IFNAMSIZ: fails after the veth, the host
    // route and the two real rules exist.
    plan.interface.host_rules.push(Rule {
        iif: Some("x".repeat(40)),
        ..Rule::lookup(Family::V4, 1537, 2)
    });

    let node_ns = NetNs::open(node.netns_path()).unwrap();
    let pod_ns = NetNs::open(&pod.path).unwrap();
    let result = node_ns
        .run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let dp = Datapath::open_current().await.unwrap();
                dp.setup(&plan, &pod_ns).await
            })
        })
        .unwrap();
    let err = result.expect_err("setup must fail");
    assert!(err.to_string().contains("add rule pref 1537"), "{err}");
    assert!(err.cleanup.is_empty(), "{:?}", err.cleanup);
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    let pod_links = std::process::Command::new("ip")
        .args(["-n", &pod.name, "-o", "link", "show"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&pod_links.stdout).contains("eth0"));
}
