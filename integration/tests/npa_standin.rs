//! Kernel test of `npa-standin`, the network-policy agent stand-in (`integration::npa`): in a
//! throwaway node namespace with one pod namespace below it (host veth named as the plugin
//! names it), `rpc.NPBackend` calls over the unix socket isolate the pod before the reply,
//! policies allow exactly their peers and ports, `DeletePodNp` opens it again, the faults act
//! as documented and `calls.jsonl` records connects and calls. Root only (skips otherwise).
//! Must not: touch the root network namespace; its namespaces and files go on drop.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use integration::PREFIX;
use integration::npa::{Action, Fault, NpaStandin, Policy, PolicyRule, Rpc, chains_installed};
use integration::supervisor::{self, OwnedNetns};
use ipamd_proto::rpc::np_backend_client::NpBackendClient;
use ipamd_proto::rpc::{DeleteNpRequest, EnforceNpRequest};
use tonic::transport::{Channel, Endpoint};

const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const POD_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// The pod's port a policy allows.
const POD_PORT: u16 = 8080;
/// The pod's port no policy allows.
const POD_OTHER_PORT: u16 = 9090;
/// The node's port.
const NODE_PORT: u16 = 7070;
const NAMESPACE: &str = "default";
const POD: &str = "web-0";
/// Connect timeout when a connection must pass.
const PASS_TIMEOUT: Duration = Duration::from_secs(1);
/// Connect timeout when the SYN must be dropped.
const DROP_TIMEOUT: Duration = Duration::from_millis(150);

/// Runs `f` on a fresh thread inside namespace `ns`.
fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let path = supervisor::netns_path(ns);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path)?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        f()
    })
    .join()
    .expect("netns worker panicked")
}

/// A TCP echo server in a namespace, one thread per connection (a held-open connection does
/// not block others), until dropped.
struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    fn start(ns: &str, port: u16) -> Self {
        let listener = in_netns(ns, move || {
            let l = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .unwrap_or_else(|e| panic!("listen on {port} in {ns}: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                std::thread::spawn(move || {
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = [0u8; 256];
                    while let Ok(n @ 1..) = conn.read(&mut buf) {
                        if conn.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One echo round trip on `conn` within `timeout`.
fn echo(conn: &mut TcpStream, timeout: Duration) -> std::io::Result<()> {
    conn.set_read_timeout(Some(timeout))?;
    conn.write_all(b"ping\n")?;
    let mut buf = [0u8; 5];
    conn.read_exact(&mut buf)?;
    assert_eq!(&buf, b"ping\n");
    Ok(())
}

/// A new connection from `ns` to `to` and one echo round trip.
fn tcp(ns: &str, to: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    in_netns(ns, move || {
        let mut conn = TcpStream::connect_timeout(&to, timeout)?;
        echo(&mut conn, timeout)
    })
}

fn assert_passes(ns: &str, to: SocketAddr, when: &str) {
    if let Err(e) = tcp(ns, to, PASS_TIMEOUT) {
        panic!("{when}: TCP {ns} -> {to} should pass: {e}");
    }
}

fn assert_dropped(ns: &str, to: SocketAddr, when: &str) {
    match tcp(ns, to, DROP_TIMEOUT) {
        Ok(()) => panic!("{when}: TCP {ns} -> {to} should be dropped, it passed"),
        // a dropped SYN times out; a refused one (RST) would mean no filtering
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::TimedOut,
            "{when}: TCP {ns} -> {to}: {e}"
        ),
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pod's veth pair: `veth` (198.18.0.1/24) in the node, `eth0` (198.18.0.2/24) in the pod.
fn wire_pod(node: &str, pod: &str, veth: &str) {
    ip(&[
        "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pod,
    ]);
    ip(&["-n", node, "addr", "add", "198.18.0.1/24", "dev", veth]);
    ip(&["-n", node, "link", "set", veth, "up"]);
    ip(&["-n", pod, "addr", "add", "198.18.0.2/24", "dev", "eth0"]);
    ip(&["-n", pod, "link", "set", "eth0", "up"]);
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// The plugin's side: a fresh connection per call, as `aws-cni` dials the agent.
struct Client {
    rt: tokio::runtime::Runtime,
    socket: std::path::PathBuf,
    /// Connections established so far (each one the stand-in must record).
    dials: usize,
}

impl Client {
    fn connect(&mut self) -> Result<NpBackendClient<Channel>, tonic::transport::Error> {
        let endpoint = Endpoint::from_shared(format!("unix://{}", self.socket.display()))?
            .connect_timeout(Duration::from_millis(200));
        let channel = self.rt.block_on(endpoint.connect())?;
        self.dials += 1;
        Ok(NpBackendClient::new(channel))
    }

    /// EnforceNpToPod for the pod: `Success` and how long the answer took.
    fn enforce(&mut self, mode: &str) -> (bool, Duration) {
        let mut client = self.connect().expect("connect to npa-standin");
        let req = EnforceNpRequest {
            k8s_pod_name: POD.into(),
            k8s_pod_namespace: NAMESPACE.into(),
            network_policy_mode: mode.into(),
            interface_count: 1,
        };
        let start = Instant::now();
        let reply = self
            .rt
            .block_on(client.enforce_np_to_pod(req))
            .expect("EnforceNpToPod");
        (reply.into_inner().success, start.elapsed())
    }

    fn delete(&mut self) -> bool {
        let mut client = self.connect().expect("connect to npa-standin");
        let req = DeleteNpRequest {
            k8s_pod_name: POD.into(),
            k8s_pod_namespace: NAMESPACE.into(),
        };
        self.rt
            .block_on(client.delete_pod_np(req))
            .expect("DeletePodNp")
            .into_inner()
            .success
    }
}

#[test]
fn the_stand_in_filters_before_it_answers_and_follows_its_control_files() {
    if !integration::can_run_kernel_tests() {
        return;
    }
    let started = Instant::now();
    integration::node::remove_stale();
    let base = format!("{PREFIX}{}-npa", std::process::id());
    let node = format!("{base}-node");
    let pod = format!("{base}-pod");
    // drop order (reverse of declaration): stand-in, servers, state dir, namespaces
    let mut netns = OwnedNetns::default();
    netns.create(&node).unwrap();
    netns.create(&pod).unwrap();
    let dir = tempfile::Builder::new()
        .prefix(&format!("{base}-"))
        .tempdir()
        .unwrap();
    let veth = dataplane::conventions::host_veth_name("eni", NAMESPACE, POD);
    wire_pod(&node, &pod, &veth);
    let _pod_port = Echo::start(&pod, POD_PORT);
    let _pod_other_port = Echo::start(&pod, POD_OTHER_PORT);
    let _node_port = Echo::start(&node, NODE_PORT);
    let to_pod = SocketAddr::from((POD_IP, POD_PORT));
    let to_pod_other = SocketAddr::from((POD_IP, POD_OTHER_PORT));
    let to_node = SocketAddr::from((NODE_IP, NODE_PORT));
    assert_passes(&node, to_pod, "before the agent");
    assert_passes(&pod, to_node, "before the agent");

    let npa = NpaStandin::start(&node, dir.path()).unwrap();
    assert_eq!(npa.veth_for(NAMESPACE, POD), veth);
    let mut client = Client {
        rt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
        socket: npa.socket(),
        dials: 0,
    };
    let mut established = in_netns(&node, move || {
        let mut conn = TcpStream::connect_timeout(&to_pod, PASS_TIMEOUT)?;
        echo(&mut conn, PASS_TIMEOUT)?;
        Ok(conn)
    })
    .unwrap();

    // strict, no policy: default-deny both ways, in place when the reply arrives
    let (ok, _) = client.enforce("Strict");
    let replied_ms = now_ms();
    assert!(ok, "strict EnforceNpToPod failed: {:?}", npa.calls());
    assert_dropped(&node, to_pod, "strict default-deny");
    assert_dropped(&pod, to_node, "strict default-deny");
    assert!(
        echo(&mut established, Duration::from_millis(200)).is_err(),
        "an established flow survived enforcement"
    );
    drop(established);
    let call = npa.calls().pop().unwrap();
    assert_eq!(call.rpc, Rpc::EnforceNpToPod);
    assert_eq!(
        (call.pod.as_str(), call.namespace.as_str()),
        (POD, NAMESPACE)
    );
    assert_eq!(call.mode.as_deref(), Some("Strict"));
    assert_eq!(call.interface_count, Some(1));
    assert_eq!(call.veth, veth);
    assert_eq!(call.action, Action::DefaultDeny);
    assert!(call.success && call.at_ms <= replied_ms, "{call:?}");
    assert!(chains_installed(&node, &veth));

    // the jumps match by name: a pod re-created with the same name is filtered from the start
    ip(&["-n", &node, "link", "del", &veth]);
    wire_pod(&node, &pod, &veth);
    assert_dropped(&node, to_pod, "re-created veth");
    assert_dropped(&pod, to_node, "re-created veth");

    // DeletePodNp opens the pod again, and is idempotent
    assert!(client.delete(), "DeletePodNp failed");
    assert!(!chains_installed(&node, &veth));
    assert_passes(&node, to_pod, "after DeletePodNp");
    assert_passes(&pod, to_node, "after DeletePodNp");
    assert!(client.delete(), "second DeletePodNp failed");
    assert_eq!(npa.delete_calls_for(NAMESPACE, POD), 2);
    assert_eq!(npa.calls().last().unwrap().action, Action::Removed);

    // standard with a policy: exactly the allowed peer and port, replies stateless
    let node_net = "198.18.0.1/32".parse().unwrap();
    let ingress_only = Policy {
        ingress: vec![PolicyRule::tcp(node_net, POD_PORT)],
        egress: vec![],
    };
    npa.set_policy(NAMESPACE, POD, &ingress_only).unwrap();
    assert!(client.enforce("standard").0);
    assert_passes(&node, to_pod, "ingress policy, allowed port");
    assert_dropped(&node, to_pod_other, "ingress policy, other port");
    assert_dropped(&pod, to_node, "ingress policy, egress");
    assert_eq!(npa.calls().last().unwrap().action, Action::Policy);

    // re-enforcing replaces the pod's rules
    let egress_only = Policy {
        ingress: vec![],
        egress: vec![PolicyRule::tcp(node_net, NODE_PORT)],
    };
    npa.set_policy(NAMESPACE, POD, &egress_only).unwrap();
    assert!(client.enforce("standard").0);
    assert_passes(&pod, to_node, "egress policy, allowed port");
    assert_dropped(&node, to_pod, "egress policy, ingress");

    // standard without a policy: nothing remains; `none`: nothing touched
    npa.remove_policy(NAMESPACE, POD).unwrap();
    assert!(client.enforce("standard").0);
    assert!(!chains_installed(&node, &veth));
    assert_passes(&node, to_pod, "standard without a policy");
    assert!(client.enforce("none").0);
    assert_eq!(npa.calls().last().unwrap().action, Action::Untouched);
    assert!(!chains_installed(&node, &veth));

    // fail: Success=false, recorded, nothing installed
    npa.set_fault(Fault::Fail).unwrap();
    assert!(
        !client.enforce("strict").0,
        "fail fault answered Success=true"
    );
    let call = npa.calls().pop().unwrap();
    assert!(!call.success && call.error.is_some(), "{call:?}");
    assert!(!chains_installed(&node, &veth));
    assert_passes(&node, to_pod, "fail fault");

    // slow: the answer waits
    npa.set_fault(Fault::Slow(Duration::from_millis(300)))
        .unwrap();
    let (ok, took) = client.enforce("none");
    assert!(ok);
    assert!(
        took >= Duration::from_millis(300),
        "slow 300 answered in {took:?}"
    );

    // refuse: nobody listens until the file changes
    npa.set_fault(Fault::Refuse).unwrap();
    assert!(!npa.socket().exists());
    assert!(client.connect().is_err(), "connected to a refusing agent");
    npa.set_fault(Fault::None).unwrap();
    assert!(client.enforce("strict").0);
    assert_dropped(&node, to_pod, "strict after refuse");
    assert!(client.delete());
    assert_passes(&node, to_pod, "final DeletePodNp");

    // the journal: one connect per dial, every call in order
    assert_eq!(npa.connects(), client.dials);
    let rpcs: Vec<Rpc> = npa.calls().iter().map(|c| c.rpc).collect();
    use Rpc::{DeletePodNp as D, EnforceNpToPod as E};
    assert_eq!(rpcs, [E, D, D, E, E, E, E, E, E, E, D]);
    assert_eq!(npa.enforce_calls_for(NAMESPACE, POD), 8);
    let stamps: Vec<u64> = npa.calls().iter().map(|c| c.at_ms).collect();
    assert!(stamps.is_sorted(), "{stamps:?}");
    eprintln!("npa_standin: {:?}", started.elapsed());
    drop(npa);
    assert!(!dir.path().join("npa.sock").exists());
}
