//! gRPC over the real unix socket: 200 concurrent AddNetwork calls growing the pool on demand,
//! the version lock, health, typed errors at the instance limit, socket mode, introspection.

// Integration tests live at the top level of their own crate.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::*;
use ipamd::aws::memory::MemoryProvider;
use ipamd::datastore::checkpoint::MemoryCheckpoint;
use ipamd_proto::{ErrorReason, IpamdError};
use tonic::Code;

/// A refused AddNetwork as upstream answers it (OK, `Success=false`), with our typed reason in
/// the response metadata.
fn refused(r: tonic::Response<ipamd_proto::rpc::AddNetworkReply>) -> ErrorReason {
    assert!(!r.get_ref().success, "expected Success=false");
    assert!(r.get_ref().ip_allocation_metadata.is_empty());
    let bytes = r
        .metadata()
        .get_bin(ipamd_proto::ERROR_METADATA_KEY)
        .expect("typed error metadata")
        .to_bytes()
        .unwrap();
    IpamdError::from_details(&bytes).unwrap().reason()
}

fn reason(s: &tonic::Status) -> ErrorReason {
    IpamdError::from_details(s.details())
        .expect("typed details")
        .reason()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_adds_get_distinct_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/22", 4, 60));
    let checkpoint = MemoryCheckpoint::new();
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(1, 4, 59), Duration::from_secs(20)),
        Box::new(checkpoint.clone()),
        vec![],
        TestClock::new(),
    )
    .await;
    let token = serve(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_secs(5),
    );
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let socket = socket.clone();
        tasks.spawn(async move {
            let mut c = client(socket).await;
            let r = c
                .add_network(add_req(&format!("c{i}")))
                .await
                .map(tonic::Response::into_inner);
            (i, r)
        });
    }
    let mut ips = BTreeSet::new();
    while let Some(res) = tasks.join_next().await {
        let (i, r) = res.unwrap();
        let reply = r.unwrap_or_else(|s| panic!("add c{i}: {s:?}"));
        assert!(reply.success);
        let m = &reply.ip_allocation_metadata[0];
        assert!(
            ips.insert(m.i_pv4_addr.clone()),
            "address {} handed out twice",
            m.i_pv4_addr
        );
        assert_eq!(reply.vp_cv4_cid_rs, vec!["198.18.0.0/16".to_owned()]);
        assert_eq!(
            m.route_table_id,
            if m.device_number == 0 {
                254
            } else {
                m.device_number + 1
            }
        );
    }
    assert_eq!(ips.len(), 200);
    let stored = checkpoint.snapshot().unwrap();
    assert_eq!(
        stored.allocations.len(),
        200,
        "every reply was preceded by a checkpoint write"
    );

    // Idempotent ADD, then DEL everything, then DEL again -> UNKNOWN_POD.
    let mut c = client(socket.clone()).await;
    let again = c.add_network(add_req("c7")).await.unwrap().into_inner();
    assert!(ips.contains(&again.ip_allocation_metadata[0].i_pv4_addr));
    for i in 0..200 {
        let r = c
            .del_network(del_req(&format!("c{i}")))
            .await
            .unwrap()
            .into_inner();
        assert!(r.success);
    }
    // As upstream's handler answers ErrUnknownPod: code Unknown and its text, which upstream's
    // plugin looks for; our reason in the details.
    let s = c.del_network(del_req("c0")).await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::Unknown, ErrorReason::UnknownPod)
    );
    assert!(s.message().starts_with("datastore: unknown pod"), "{s:?}");
    assert_eq!(checkpoint.snapshot().unwrap().allocations.len(), 0);
    token.cancel();
}

#[tokio::test]
async fn version_lock_health_and_invalid_requests() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 4));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(1, 2, 3), Duration::from_secs(2)),
        Box::new(MemoryCheckpoint::new()),
        vec![],
        TestClock::new(),
    )
    .await;
    let token = serve(provider.clone(), ipam, &socket, Duration::from_secs(5));
    let mut c = client(socket.clone()).await;
    let mut req = add_req("a");
    req.client_version = "0.0.0-someone-else".into();
    let s = c.add_network(req).await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::FailedPrecondition, ErrorReason::VersionMismatch)
    );
    let mut req = add_req("a");
    req.container_id.clear();
    let s = c.add_network(req).await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::InvalidArgument, ErrorReason::InvalidRequest)
    );

    // The network-policy agent's start-up call (upstream ConfigServerBackend).
    let np = ipamd_proto::rpc::config_server_backend_client::ConfigServerBackendClient::new(
        channel(socket.clone()).await,
    )
    .get_network_policy_configs(())
    .await
    .unwrap()
    .into_inner();
    assert_eq!(np.network_policy_mode, "standard");
    assert_eq!(np.node_i_pv4, "198.18.0.10");
    assert_eq!(
        (np.instance_id.as_str(), np.region.as_str()),
        ("i-0test", "us-west-2")
    );
    assert!(!np.multi_nic_enabled);

    let mut h = tonic_health::pb::health_client::HealthClient::new(channel(socket).await);
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: ipamd_proto::HEALTH_SERVICE_NAME.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_limit_fails_fast_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    // One ENI with 2 secondary IPs: the third pod can never get an address.
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 1, 3));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(0, 1, 2), Duration::from_secs(30)),
        Box::new(MemoryCheckpoint::new()),
        vec![],
        TestClock::new(),
    )
    .await;
    let token = serve(provider.clone(), ipam, &socket, Duration::from_secs(60));
    let mut c = client(socket).await;
    c.add_network(add_req("a")).await.unwrap();
    c.add_network(add_req("b")).await.unwrap();
    let started = Instant::now();
    let r = c.add_network(add_req("c")).await.unwrap();
    assert_eq!(refused(r), ErrorReason::InstanceLimitReached);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "failed at the limit, not at the deadline"
    );
    token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_failure_rolls_back_and_is_typed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let cp = MemoryCheckpoint::new();
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 5));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(2, 2, 4), Duration::from_secs(2)),
        Box::new(cp.clone()),
        vec![],
        TestClock::new(),
    )
    .await;
    let token = serve(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_secs(60),
    );
    let mut c = client(socket).await;
    let a = c.add_network(add_req("a")).await.unwrap().into_inner();
    cp.fail_writes(true);
    let r = c.add_network(add_req("b")).await.unwrap();
    assert_eq!(refused(r), ErrorReason::CheckpointFailed);
    let s = c.del_network(del_req("a")).await.unwrap_err();
    assert_eq!(reason(&s), ErrorReason::CheckpointFailed);
    cp.fail_writes(false);
    // "a" still holds its address (the failed DEL was rolled back), "b" never got one.
    let again = c.add_network(add_req("a")).await.unwrap().into_inner();
    assert_eq!(again.ip_allocation_metadata, a.ip_allocation_metadata);
    assert_eq!(ipam.index.read(|ds| ds.assigned_count()), 1);
    token.cancel();
}

#[tokio::test]
async fn introspection_has_upstream_shape_and_hides_container_ids() {
    use tower::ServiceExt as _;
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 4));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(2, 2, 3), Duration::from_secs(2)),
        Box::new(MemoryCheckpoint::new()),
        vec![],
        TestClock::new(),
    )
    .await;
    let mut m = ipamd::pool::manager::Manager::new(provider.clone());
    m.settle(&ipam).await;
    ipam.add(
        &ipamd::datastore::IpamKey::new("aws-cni", "secret-container", "eth0"),
        ipamd::datastore::PodMetadata {
            namespace: "default".into(),
            name: "nginx".into(),
            interfaces_count: 1,
        },
    )
    .await
    .unwrap();
    // A second pod, deleted: its address is listed as released, with its last assignment time.
    let gone = ipamd::datastore::IpamKey::new("aws-cni", "gone-container", "eth0");
    let released = ipam
        .add(&gone, ipamd::datastore::PodMetadata::default())
        .await
        .unwrap()
        .ip;
    ipam.del(&gone, "", "", "PodDeleted").unwrap();
    let cfg = ipamd::config::Config::from_env_map(
        &[("ENABLE_IPv4".to_owned(), "true".to_owned())]
            .into_iter()
            .collect(),
    )
    .unwrap();
    let failures = std::sync::Arc::new(ipamd::failures::AddFailures::new(ipam.metrics.clone()));
    let router = ipamd::http::introspection_router(
        ipam,
        ipamd::http::DebugSettings::from_config(&cfg),
        failures,
    );
    let get_any = |path: &'static str| {
        let router = router.clone();
        async move {
            let resp = router
                .oneshot(
                    axum::http::Request::get(path)
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&bytes)
                    .unwrap_or_else(|_| serde_json::json!(String::from_utf8_lossy(&bytes))),
            )
        }
    };
    let get = |path: &'static str| async move {
        let (status, body) = get_any(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        body
    };
    let root = get("/").await;
    assert_eq!(root["AvailableCommands"].as_array().unwrap().len(), 4);
    // upstream's ServeMux pattern "/" answers every unknown path with the same list.
    assert_eq!(get("/v2/nothing-here").await, root);
    let enis = get("/v1/enis").await;
    let card = &enis["0"];
    assert_eq!(card["AssignedIPs"], 1);
    let eni = card["ENIs"].as_object().unwrap().values().next().unwrap();
    for field in [
        "ID",
        "IsPrimary",
        "IsTrunk",
        "IsEFA",
        "DeviceNumber",
        "AvailableIPv4Cidrs",
        "IPv6Cidrs",
        "IsExcludedForPodIPs",
        "RouteTableID",
        "SubnetID",
    ] {
        assert!(eni.get(field).is_some(), "ENI.{field} missing: {eni}");
    }
    let text = enis.to_string();
    assert!(
        !text.contains("secret-container"),
        "container id leaked: {text}"
    );
    assert!(text.contains("\"k8sPodName\":\"nginx\""));
    assert!(text.contains("\"Mask\":\"/////w==\""));
    // upstream keeps a released address's AssignedTime and sets its UnassignedTime.
    let released_entry = enis["0"]["ENIs"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|e| e["AvailableIPv4Cidrs"].as_object().unwrap().values())
        .find_map(|c| c["IPAddresses"].get(released.to_string()))
        .unwrap_or_else(|| panic!("released {released} not listed: {enis}"))
        .clone();
    assert_eq!(
        released_entry["IPAMKey"]["networkName"], "",
        "{released_entry}"
    );
    for field in ["AssignedTime", "UnassignedTime"] {
        assert_ne!(
            released_entry[field], "0001-01-01T00:00:00Z",
            "{field} of a released address: {released_entry}"
        );
    }
    // upstream's GetENIInfos copies every CidrInfo field but AddressFamily.
    let cidr = eni["AvailableIPv4Cidrs"]
        .as_object()
        .unwrap()
        .values()
        .next()
        .unwrap();
    assert_eq!(cidr["AddressFamily"], "");
    // upstream reads the ENIConfig name from the Node object and answers 404 when it cannot;
    // this ipamd does not read the Node yet, so it never guesses "default".
    let (status, _) = get_any("/v1/eni-configs").await;
    assert_eq!(status, 404);
    // Keys, types and values as upstream's GetConfigForDebug (ipamd.go, networkutils/network.go)
    // produce them for the defaults.
    let ipamd_env = get("/v1/ipamd-env-settings").await;
    for (key, want) in [
        ("WARM_IP_TARGET", serde_json::json!(0)),
        ("WARM_ENI_TARGET", serde_json::json!(1)),
        (
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG",
            serde_json::json!(false),
        ),
        ("AWS_MANAGE_ENIS_NON_SCHEDULABLE", serde_json::json!(false)),
        ("ENABLE_SUBNET_DISCOVERY", serde_json::json!(true)),
    ] {
        assert_eq!(ipamd_env[key], want, "ipamd-env-settings {key}");
    }
    assert_eq!(ipamd_env.as_object().unwrap().len(), 5);
    let net_env = get("/v1/networkutils-env-settings").await;
    for (key, want) in [
        ("AWS_VPC_K8S_CNI_CONNMARK", serde_json::json!(128)),
        // parseCIDRString returns a nil slice for an empty list
        (
            "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
            serde_json::Value::Null,
        ),
        ("AWS_VPC_K8S_CNI_EXTERNALSNAT", serde_json::json!(false)),
        ("AWS_EXTERNAL_SERVICE_CIDRS", serde_json::Value::Null),
        ("AWS_VPC_ENI_MTU", serde_json::json!(9001)),
        ("AWS_VPC_K8S_CNI_VETHPREFIX", serde_json::json!("eni")),
        ("AWS_VPC_CNI_NODE_PORT_SUPPORT", serde_json::json!(true)),
        // snatType: sequentialSNAT=0, randomHashSNAT=1, randomPRNGSNAT=2 (the default)
        ("AWS_VPC_K8S_CNI_RANDOMIZESNAT", serde_json::json!(2)),
    ] {
        assert_eq!(net_env[key], want, "networkutils-env-settings {key}");
    }
    assert_eq!(net_env.as_object().unwrap().len(), 8);
}

/// The client half of `non_root_peers_are_refused`, run in a child process as another user.
/// Does nothing unless `IPAMD_TEST_PEER_SOCKET` names the socket to call.
#[tokio::test]
async fn peer_client_half() {
    let Ok(socket) = std::env::var("IPAMD_TEST_PEER_SOCKET") else {
        return;
    };
    let outcome = match tokio::net::UnixStream::connect(&socket).await {
        Err(e) => format!("CONNECT-ERR {:?}", e.kind()),
        Ok(_) => match client(socket.into())
            .await
            .add_network(add_req("intruder"))
            .await
        {
            Ok(_) => "OK".to_owned(),
            Err(s) => format!(
                "STATUS {:?} {:?}",
                s.code(),
                IpamdError::from_details(s.details()).map(|e| e.reason())
            ),
        },
    };
    println!("PEER-RESULT {outcome}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
    })
}

/// Runs `peer_client_half` of this test binary as uid/gid 65534 against `socket`. The binary is
/// copied next to the socket first (a directory others may enter), wherever the checkout is.
fn call_as_nobody(socket: &std::path::Path) -> String {
    let exe = socket.with_file_name("peer-client");
    if !exe.exists() {
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args([
            "--exact",
            "rpc_socket::peer_client_half",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IPAMD_TEST_PEER_SOCKET", socket)
        .output()
        .expect("setpriv (util-linux) runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .lines()
        .find_map(|l| {
            l.split_once("PEER-RESULT ")
                .map(|(_, r)| r.trim().to_owned())
        })
        .unwrap_or_else(|| {
            panic!(
                "the client half ({}) did not run as uid 65534:\n{stdout}\n{}",
                exe.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_root_peers_are_refused() {
    if !is_root() {
        eprintln!("SKIP: needs root (runs a client as another uid with setpriv)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("ipamd.sock");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 1, 5));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(1, 1, 4), Duration::from_secs(5)),
        Box::new(MemoryCheckpoint::new()),
        vec![],
        TestClock::new(),
    )
    .await;
    let token = serve(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_secs(60),
    );

    // The socket's mode (0660, root's) keeps other users out before any gRPC.
    let s = socket.clone();
    let got = tokio::task::spawn_blocking(move || call_as_nobody(&s))
        .await
        .unwrap();
    assert_eq!(got, "CONNECT-ERR PermissionDenied");

    // Even with the mode opened up, the peer credentials refuse the call, with its reason.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let s = socket.clone();
    let got = tokio::task::spawn_blocking(move || call_as_nobody(&s))
        .await
        .unwrap();
    assert_eq!(got, "STATUS PermissionDenied Some(PermissionDenied)");
    assert_eq!(
        ipam.index.read(|ds| ds.assigned_count()),
        0,
        "nothing was assigned"
    );

    // Root (this process) is served.
    let mut c = client(socket).await;
    assert!(
        c.add_network(add_req("root"))
            .await
            .unwrap()
            .into_inner()
            .success
    );
    token.cancel();
}

/// A pod annotated `k8s.amazonaws.com/nicConfig: multi-nic-attachment` (the plugin's
/// `RequiresMultiNICAttachment`): without `ENABLE_MULTI_NIC` refused as upstream
/// (`pkg/ipamd/rpc_handler.go` AddNetwork: "enable multi-nic feature on CNI for creating
/// multi-nic-attachment pods", `Success=false`), and no address is taken. With it, on an
/// instance type with one network card, upstream's `ipsRequired = len(DataStores)` is 1: the
/// pod gets card 0's address, one `IPAllocationMetadata` (several cards:
/// `ipamd/tests/multi_nic.rs`).
#[tokio::test]
async fn a_multi_nic_pod_is_refused_without_enable_multi_nic_and_takes_no_address() {
    for enabled in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ipamd.sock");
        let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 4));
        let checkpoint = MemoryCheckpoint::new();
        let (ipam, _) = start(
            provider.clone(),
            settings(targets(1, 2, 3), Duration::from_secs(2)),
            Box::new(checkpoint.clone()),
            vec![],
            TestClock::new(),
        )
        .await;
        let reply = ipamd::rpc::ReplySettings {
            multi_nic: enabled,
            ..reply_settings()
        };
        let token = serve_with(
            provider.clone(),
            ipam.clone(),
            &socket,
            Duration::from_secs(5),
            reply,
        );
        let mut c = client(socket.clone()).await;
        let mut req = add_req("multi");
        req.requires_multi_nic_attachment = true;
        let r = c.add_network(req).await.unwrap();
        if enabled {
            let r = r.into_inner();
            assert!(r.success);
            assert_eq!(
                r.ip_allocation_metadata.len(),
                1,
                "one network card, one entry"
            );
            token.cancel();
            continue;
        }
        let bytes = r
            .metadata()
            .get_bin(ipamd_proto::ERROR_METADATA_KEY)
            .expect("typed error metadata")
            .to_bytes()
            .unwrap();
        let e = IpamdError::from_details(&bytes).unwrap();
        assert_eq!(refused(r), ErrorReason::Unsupported);
        assert!(
            e.message
                .contains("enable multi-nic feature on CNI for creating multi-nic-attachment pods"),
            "{}",
            e.message
        );
        assert!(
            checkpoint
                .snapshot()
                .is_none_or(|d| d.allocations.is_empty()),
            "no address taken"
        );
        // The same pod without the annotation gets its address.
        let r = c.add_network(add_req("single")).await.unwrap().into_inner();
        assert!(r.success);
        token.cancel();
    }
}
