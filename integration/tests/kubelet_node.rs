//! The kubelet tier: the node as kubelet runs it. Two simulated nodes (vpcsim: EC2 API, IMDS,
//! VPC router, internet gateway; kubesim behind the fabric's API relay), each with Debian's
//! containerd started inside the node's network namespace (its own root, state, socket; the
//! node's `/opt/cni/bin`, `/etc/cni/net.d`, `/run`, `/var/log`), the images built from the
//! `Dockerfile` imported into it, and a kubelet stand-in that runs the chart's `aws-node`
//! DaemonSet pod — rendered by real Helm with default values, edited only for image names and
//! the downward-API values — through the CRI as kubelet does: host network, the init container
//! privileged to completion, then aws-node non-privileged (NET_ADMIN, NET_RAW; `/proc/sys`
//! read-only) with the network-policy agent (the project's stand-in in an image), the rendered
//! hostPath volumes, ConfigMap, service-account token, probes and restarts. ipamd runs the real
//! EC2 provider against the simulated EC2 and IMDS. Workload pods are CRI sandboxes whose network
//! comes from what the init container and aws-node left in the node's CNI directories.
//!
//! Checked: aws-node Ready by its own readiness probe; ipamd gives its start-up code pages back
//! there (madvise allowed as the container runs); every binary the init container installed
//! is static; 10 pods per node; pod↔pod on a node and across nodes (ping, HTTP), pod → internet
//! (ping, TCP through SNAT); then the aws-node container killed (restarted by the stand-in), a
//! rolling update to a new image tag (old pod stopped, new pod started), a StatefulSet pod deleted
//! and re-created, and aws-node swapped alone (init from an image that installs no `aws-cni`, on
//! a node whose `aws-cni` is gone): after each, every running pod keeps its address and traffic
//! and no address is held twice (pods, the simulated EC2, ipamd's checkpoint).
#![allow(clippy::tests_outside_test_module)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration::binaries::built_binary;
use integration::can_run_kernel_tests;
use integration::images::{Engine, FileSource};
use integration::kubelet::{
    Kubelet, NodeContext, NodeRuntime, PAUSE_IMAGE, PodMeta, RenderedChart, plan_pod, set_images,
};
use integration::sim::{INTERNET_ECHO_PORT, INTERNET_HOST, KubeOptions, Sim, SimConfig};
use k8s_openapi::api::core::v1::PodSpec;

const AWS_NODE: &str = "localhost/aws-vpc-cni-rs:kubelet-v1";
/// The same build under a new tag: the rolling update's image.
const AWS_NODE_V2: &str = "localhost/aws-vpc-cni-rs:kubelet-v2";
const INIT: &str = "localhost/aws-vpc-cni-rs-init:kubelet-v1";
/// An init image in upstream's shape: installs the reference plugins only, no `aws-cni`.
const INIT_WITHOUT_PLUGIN: &str = "localhost/other-cni-init:kubelet";
const AGENT: &str = "localhost/npa-standin:kubelet";
const BUSYBOX: &str = "localhost/busybox:kubelet-node";
const PODS_PER_NODE: usize = 10;
const READY: Duration = Duration::from_secs(240);
const HTTP_PORT: u16 = 8080;

/// The agent image's entrypoint: the project's network-policy agent stand-in serving the socket
/// the plugin dials (`/var/run/aws-node/npa.sock`, the run-dir mount); upstream's agent flags,
/// which the chart passes, mean nothing to it.
const AGENT_ENTRYPOINT: &str = "#!/bin/sh\n\
exec /app/npa-standin --socket /var/run/aws-node/npa.sock --state-dir /var/run/aws-node/npa-standin\n";

fn build_images(engine: &Engine, archive: &Path) {
    engine.import_base();
    engine.build_target(None, AWS_NODE);
    engine.build_target(Some("init"), INIT);
    engine.ok(&["tag", AWS_NODE, AWS_NODE_V2]);
    let busybox = Path::new("/bin/busybox");
    engine.build_from(
        BUSYBOX,
        "FROM scratch\nCOPY busybox /bin/busybox\n\
         ENTRYPOINT [\"/bin/busybox\", \"sleep\", \"2147483647\"]\n",
        &[("busybox", FileSource::Copy(busybox))],
    );
    engine.ok(&["tag", BUSYBOX, PAUSE_IMAGE]);
    let npa = built_binary("npa-standin");
    engine.build_from(
        AGENT,
        &format!(
            "FROM {AWS_NODE}\nCOPY npa-standin /app/npa-standin\nCOPY agent.sh /app/agent.sh\n\
             ENTRYPOINT [\"/app/agent.sh\"]\n"
        ),
        &[
            ("npa-standin", FileSource::Copy(&npa)),
            ("agent.sh", FileSource::Text(AGENT_ENTRYPOINT)),
        ],
    );
    // upstream's init image installs the reference plugins, not aws-cni/egress-cni
    engine.build_from(
        INIT_WITHOUT_PLUGIN,
        &format!(
            "FROM {INIT}\nRUN rm /app/aws-cni /app/egress-cni \
             && sed -i 's/^for b in aws-cni egress-cni /for b in /' /app/aws-vpc-cni-init.sh \
             && ! grep -q 'aws-cni egress-cni' /app/aws-vpc-cni-init.sh\n"
        ),
        &[],
    );
    engine.save(
        &[
            AWS_NODE,
            AWS_NODE_V2,
            INIT,
            INIT_WITHOUT_PLUGIN,
            AGENT,
            BUSYBOX,
            PAUSE_IMAGE,
        ],
        archive,
    );
}

/// One node: its containerd, its kubelet, what it runs.
struct Node {
    index: usize,
    kubelet: Kubelet,
    runtime: Arc<NodeRuntime>,
    node_name: String,
    host_ip: Ipv4Addr,
    sa_dir: PathBuf,
    aws_node: String,
    /// workload pod key → its address
    pods: BTreeMap<String, Ipv4Addr>,
    uid_seq: u32,
}

impl Node {
    fn context(&self, meta: &PodMeta, host_network: bool, service_account: bool) -> NodeContext {
        let (volumes_dir, log_dir) = integration::kubelet::pod::pod_dirs(
            &self.runtime.dir().join("pods"),
            &self.runtime.dir().join("logs"),
            meta,
        );
        NodeContext {
            node_name: self.node_name.clone(),
            host_ip: self.host_ip.to_string(),
            pod_ip: host_network.then(|| self.host_ip.to_string()),
            api_service: Some((
                vpcsim::fabric::names::KUBE_API_ADDR.to_string(),
                vpcsim::fabric::names::KUBE_API_PORT,
            )),
            service_account_dir: service_account.then(|| self.sa_dir.clone()),
            volumes_dir,
            log_dir,
        }
    }

    fn uid(&mut self, what: &str) -> String {
        self.uid_seq += 1;
        format!("{what}-n{}-{:04}", self.index, self.uid_seq)
    }

    /// Run the chart's aws-node pod (new pod object: new UID) with these images.
    fn run_aws_node(
        &mut self,
        chart: &RenderedChart,
        pod_name: &str,
        images: &BTreeMap<&str, String>,
    ) {
        let mut spec = chart.pod_spec();
        set_images(&mut spec, images);
        let meta = PodMeta {
            name: pod_name.to_owned(),
            namespace: "kube-system".into(),
            uid: self.uid("aws-node"),
            labels: chart.pod_labels(),
        };
        let ctx = self.context(&meta, true, true);
        let plan = plan_pod(&meta, &spec, &ctx).expect("aws-node plan");
        self.kubelet
            .run_pod(plan, &chart.config_maps)
            .expect("run aws-node");
        self.aws_node = format!("kube-system/{pod_name}");
    }

    fn wait_aws_node_ready(&self) {
        if let Err(e) = self.kubelet.wait_ready(&self.aws_node, READY) {
            panic!(
                "node {}: {e}\n{}\ncontainerd:\n{}",
                self.index,
                self.logs(),
                self.runtime.log_tail(20)
            );
        }
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for rel in [
            "host/var/log/aws-routed-eni/ipamd.log",
            "host/var/log/aws-routed-eni/plugin.log",
        ] {
            let text = std::fs::read_to_string(self.runtime.dir().join(rel)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "[{rel}]\n{}\n",
                lines[lines.len().saturating_sub(25)..].join("\n")
            ));
        }
        for e in walk(&self.runtime.dir().join("logs")) {
            let text = std::fs::read_to_string(&e).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "[{}]\n{}\n",
                e.display(),
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        out
    }

    /// A workload pod: busybox serving its /etc (hostname) over HTTP.
    fn run_workload(&mut self, name: &str) {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{
                "name": "web",
                "image": BUSYBOX,
                "command": ["/bin/busybox", "httpd", "-f", "-p", HTTP_PORT.to_string(), "-h", "/etc"],
                "readinessProbe": {"tcpSocket": {"port": HTTP_PORT}, "periodSeconds": 2},
            }],
            "terminationGracePeriodSeconds": 2,
        }))
        .expect("pod spec");
        let meta = PodMeta {
            name: name.to_owned(),
            namespace: "default".into(),
            uid: self.uid(name),
            labels: BTreeMap::from([("app".to_owned(), "web".to_owned())]),
        };
        let ctx = self.context(&meta, false, false);
        let plan = plan_pod(&meta, &spec, &ctx).expect("workload plan");
        self.kubelet
            .run_pod(plan, &BTreeMap::new())
            .expect("run workload");
    }

    fn wait_workload(&mut self, name: &str) -> Ipv4Addr {
        let key = format!("default/{name}");
        let st = self
            .kubelet
            .wait_ready(&key, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("node {}: {e}\n{}", self.index, self.logs()));
        let ip: Ipv4Addr = st
            .ip
            .parse()
            .unwrap_or_else(|e| panic!("{key} ip {:?}: {e}", st.ip));
        self.pods.insert(key, ip);
        ip
    }

    fn exec(&self, key: &str, cmd: &[&str]) -> (i32, String, String) {
        self.kubelet
            .exec(key, "web", cmd, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("exec {cmd:?} in {key}: {e}"))
    }

    /// The addresses in ipamd's checkpoint (the node's `/var/run/aws-node/ipam.json`).
    fn checkpoint(&self) -> BTreeSet<Ipv4Addr> {
        let path = self.runtime.host_path("/var/run/aws-node/ipam.json");
        let v: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        )
        .expect("checkpoint JSON");
        v["allocations"]
            .as_array()
            .expect("allocations")
            .iter()
            .filter_map(|a| a["ipv4"].as_str())
            .map(|s| s.parse().expect("checkpoint address"))
            .collect()
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every workload pod's address is its sandbox's, unique, owned in EC2 by an ENI of its node,
/// and exactly the node's checkpoint; ipamd's `/v1/enis` lists the same pods.
fn assert_addresses(sim: &Sim, nodes: &[Node]) {
    let mut seen = BTreeSet::new();
    for n in nodes {
        for (key, ip) in &n.pods {
            let now = n.kubelet.pod(key).expect("pod").ip;
            assert_eq!(now, ip.to_string(), "{key} changed its address");
            assert!(seen.insert(*ip), "{ip} held twice ({key})");
            assert!(
                sim.eni_of(n.index, *ip).is_some(),
                "{key} ({ip}) is not assigned to an ENI of node {} in EC2",
                n.index
            );
        }
        let want: BTreeSet<Ipv4Addr> = n.pods.values().copied().collect();
        let ok = integration::sim::eventually(Duration::from_secs(20), || {
            if n.checkpoint() == want {
                Ok(())
            } else {
                Err(String::new())
            }
        });
        assert!(
            ok.is_ok(),
            "node {}: checkpoint {:?} != pods {want:?}",
            n.index,
            n.checkpoint()
        );
        let listed: BTreeSet<Ipv4Addr> = sim
            .assigned(n.index)
            .unwrap_or_else(|e| panic!("node {} /v1/enis: {e}", n.index))
            .into_keys()
            .collect();
        assert_eq!(listed, want, "node {}: /v1/enis", n.index);
    }
}

/// Pod↔pod on each node and across nodes (ping and HTTP, the answer naming the pod), and pod →
/// internet (ping, TCP echo through SNAT), from one pod of each node.
fn assert_traffic(nodes: &[Node]) {
    let all: Vec<(String, Ipv4Addr)> = nodes
        .iter()
        .flat_map(|n| n.pods.iter().map(|(k, ip)| (k.clone(), *ip)))
        .collect();
    for n in nodes {
        let (from, _) = n.pods.iter().next().expect("a pod");
        for (to_key, to_ip) in &all {
            let ip = to_ip.to_string();
            let (code, _, err) = n.exec(from, &["/bin/busybox", "ping", "-c", "1", "-W", "3", &ip]);
            assert_eq!(code, 0, "ping {from} -> {to_key} ({ip}): {err}");
            // HTTP by hand over busybox nc (static busybox's wget resolves through NSS, which a
            // scratch image lacks)
            let get = format!(
                "/bin/busybox printf 'GET /hostname HTTP/1.0\\r\\n\\r\\n' \
                 | /bin/busybox nc -w 5 {ip} {HTTP_PORT}"
            );
            let (code, out, err) = n.exec(from, &["/bin/busybox", "sh", "-c", &get]);
            let name = to_key.trim_start_matches("default/");
            assert!(
                code == 0 && out.starts_with("HTTP/1.1 200 OK") && out.trim_end().ends_with(name),
                "http {from} -> {to_key} ({ip}): exit {code}, {out:?} {err}"
            );
        }
        let inet = INTERNET_HOST.to_string();
        let (code, _, err) = n.exec(from, &["/bin/busybox", "ping", "-c", "1", "-W", "3", &inet]);
        assert_eq!(code, 0, "ping {from} -> internet: {err}");
        let echo = format!("echo through-snat | /bin/busybox nc -w 3 {inet} {INTERNET_ECHO_PORT}");
        let (code, out, err) = n.exec(from, &["/bin/busybox", "sh", "-c", &echo]);
        assert!(
            code == 0 && out.trim() == "through-snat",
            "tcp {from} -> internet: exit {code}, {out:?} {err}"
        );
    }
}

/// Every file the init container put in the node's `/opt/cni/bin` that is an ELF binary has no
/// interpreter and no NEEDED library (readelf), so any node's glibc runs it.
fn assert_installed_binaries_static(node: &Node) -> usize {
    let dir = node.runtime.host_path("/opt/cni/bin");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("bin dir").flatten() {
        let p = e.path();
        let head = std::fs::read(&p)
            .map(|b| b.get(..4) == Some(b"\x7fELF"))
            .unwrap_or(false);
        if !head {
            continue;
        }
        let out = std::process::Command::new("readelf")
            .args(["--program-headers", "--dynamic", "--wide"])
            .arg(&p)
            .output()
            .expect("readelf");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("INTERP") && !text.contains("(NEEDED)"),
            "{} is not static:\n{text}",
            p.display()
        );
        n += 1;
    }
    n
}

#[test]
fn the_chart_runs_on_kubelet_shaped_nodes() {
    if !can_run_kernel_tests() {
        return;
    }
    let started = Instant::now();
    let engine = Engine::new();
    let archive = engine.dir().join("images.tar");
    build_images(&engine, &archive);
    eprintln!("kubelet tier: images built in {:.0?}", started.elapsed());

    let sim = Sim::start(&SimConfig {
        nodes: 2,
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    let region = sim.world.config().region.clone();
    // The chart with default values; the AWS SDK pointed at the simulated EC2 (IMDS is at its
    // usual address on every node) with static credentials: chart values, not edits.
    let chart = RenderedChart::render(&serde_json::json!({
        "env": {
            "AWS_ENDPOINT_URL_EC2": vpcsim::fabric::names::ec2_endpoint_url(),
            "AWS_ACCESS_KEY_ID": vpcsim::fabric::names::ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": vpcsim::fabric::names::SECRET_ACCESS_KEY,
            "AWS_REGION": region,
        }
    }))
    .expect("chart");
    let kube = sim.kube().expect("kubesim");
    let token = kube.aws_node_token.clone();
    let ca = kube.api.ca_pem().to_owned();
    let work = integration::kubelet::containerd::nodes_dir().expect("nodes dir");
    let mut nodes = Vec::new();
    for i in 0..sim.nodes.len() {
        let dir = work.path().join(format!("node{i}"));
        let runtime = Arc::new(
            NodeRuntime::start(&sim.nodes[i].netns, &dir, Some(&sim.pid_list()))
                .unwrap_or_else(|e| panic!("node {i} containerd: {e}")),
        );
        runtime.import(&archive).expect("import images");
        let sa_dir = dir.join("service-account");
        std::fs::create_dir_all(&sa_dir).expect("sa dir");
        std::fs::write(sa_dir.join("token"), &token).expect("token");
        std::fs::write(sa_dir.join("ca.crt"), &ca).expect("ca");
        std::fs::write(sa_dir.join("namespace"), "kube-system").expect("namespace");
        let kube = sim.kube().expect("kubesim");
        nodes.push(Node {
            index: i,
            kubelet: Kubelet::new(runtime.clone()).expect("kubelet"),
            runtime,
            node_name: kube.node_name(i).to_owned(),
            host_ip: sim.nodes[i].primary_ip,
            sa_dir,
            aws_node: String::new(),
            pods: BTreeMap::new(),
            uid_seq: 0,
        });
    }
    let v1: BTreeMap<&str, String> = BTreeMap::from([
        ("aws-vpc-cni-init", INIT.to_owned()),
        ("aws-node", AWS_NODE.to_owned()),
        ("aws-eks-nodeagent", AGENT.to_owned()),
    ]);
    let spec = chart.pod_spec();
    assert_eq!(
        spec.containers
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["aws-node", "aws-eks-nodeagent"],
        "the chart's default containers"
    );
    let t = Instant::now();
    for n in &mut nodes {
        let pod = sim.kube().expect("kubesim").pod_name(n.index).to_owned();
        n.run_aws_node(&chart, &pod, &v1);
    }
    for n in &nodes {
        n.wait_aws_node_ready();
    }
    eprintln!(
        "kubelet tier: aws-node Ready on both nodes in {:.0?}",
        t.elapsed()
    );
    // ipamd gave start-up's code pages back inside aws-node as kubelet runs it (madvise under
    // the runtime's default seccomp profile, non-privileged; docs/performance.md, "Code
    // residency") and reads them on demand from then on (madvise MADV_RANDOM, posix_fadvise
    // on its binary through the image's overlay): their INFO lines, not the WARN of a refused
    // advice
    for n in &nodes {
        let log = n
            .runtime
            .dir()
            .join("host/var/log/aws-routed-eni/ipamd.log");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                !text.contains("cannot give code pages back")
                    && !text.contains("cannot read code pages on demand"),
                "node {}: madvise or fadvise refused\n{}",
                n.index,
                n.logs()
            );
            if text.contains("start-up over: its code pages given back")
                && text.contains("code pages read on demand from now on")
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: ipamd never gave its start-up code pages back, or never read them on demand\n{}",
                n.index,
                n.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // as kubelet runs it: not privileged, /proc/sys read-only inside aws-node
    let (code, _, err) = nodes[0]
        .kubelet
        .exec(
            &nodes[0].aws_node,
            "aws-node",
            &[
                "/bin/sh",
                "-c",
                "echo 2 > /proc/sys/net/ipv4/conf/lo/rp_filter",
            ],
            Duration::from_secs(5),
        )
        .expect("exec in aws-node");
    assert_ne!(code, 0, "aws-node could write /proc/sys");
    assert!(err.contains("Read-only file system"), "{err}");
    for n in &nodes {
        let count = assert_installed_binaries_static(n);
        assert!(count >= 7, "node {}: {count} binaries installed", n.index);
    }

    let t = Instant::now();
    for n in &mut nodes {
        for k in 0..PODS_PER_NODE {
            n.run_workload(&format!("web-n{}-{k}", n.index));
        }
    }
    for n in &mut nodes {
        for k in 0..PODS_PER_NODE {
            n.wait_workload(&format!("web-n{}-{k}", n.index));
        }
    }
    eprintln!(
        "kubelet tier: {} pods Ready in {:.0?}",
        2 * PODS_PER_NODE,
        t.elapsed()
    );
    assert_addresses(&sim, &nodes);
    assert_traffic(&nodes);

    // 1. The aws-node container killed: the runtime reports it exited, kubelet restarts it.
    let pid = nodes[0]
        .kubelet
        .container_pid(&nodes[0].aws_node, "aws-node")
        .expect("aws-node pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill aws-node");
    let restarted = integration::sim::eventually(Duration::from_secs(60), || {
        let st = nodes[0].kubelet.pod(&nodes[0].aws_node).ok_or("no pod")?;
        let c = st.containers.get("aws-node").ok_or("no container")?;
        if c.restarts >= 1 && c.running {
            Ok(())
        } else {
            Err(format!("{st:?}"))
        }
    });
    assert!(
        restarted.is_ok(),
        "aws-node was not restarted: {restarted:?}"
    );
    nodes[0].wait_aws_node_ready();
    assert_addresses(&sim, &nodes);
    assert_traffic(&nodes);

    // 2. Rolling update to a new image tag: the old pod stopped, the new one started.
    let mut v2 = v1.clone();
    v2.insert("aws-node", AWS_NODE_V2.to_owned());
    for n in &mut nodes {
        let old = n.aws_node.clone();
        n.kubelet.delete_pod(&old).expect("delete old aws-node");
        let name = old.trim_start_matches("kube-system/").to_owned();
        n.run_aws_node(&chart, &name, &v2);
        n.wait_aws_node_ready();
    }
    assert_addresses(&sim, &nodes);
    assert_traffic(&nodes);

    // 3. A StatefulSet pod deleted and re-created under its name (a new pod object).
    let name = "web-n0-3";
    let key = format!("default/{name}");
    nodes[0].kubelet.delete_pod(&key).expect("delete web-n0-3");
    nodes[0].pods.remove(&key);
    nodes[0].run_workload(name);
    nodes[0].wait_workload(name);
    assert_addresses(&sim, &nodes);
    assert_traffic(&nodes);

    // 4. aws-node swapped alone: the init container from an image that installs no aws-cni, on
    //    a node whose aws-cni is gone (a fresh node): aws-node installs its own.
    let n1 = &mut nodes[1];
    let old = n1.aws_node.clone();
    n1.kubelet.delete_pod(&old).expect("delete aws-node");
    for b in ["aws-cni", "egress-cni"] {
        std::fs::remove_file(n1.runtime.host_path("/opt/cni/bin").join(b)).expect("remove plugin");
    }
    let mut swapped = v2.clone();
    swapped.insert("aws-vpc-cni-init", INIT_WITHOUT_PLUGIN.to_owned());
    let name = old.trim_start_matches("kube-system/").to_owned();
    n1.run_aws_node(&chart, &name, &swapped);
    n1.wait_aws_node_ready();
    assert!(
        n1.runtime.host_path("/opt/cni/bin/aws-cni").exists(),
        "aws-node did not install aws-cni"
    );
    n1.run_workload("swap-0");
    n1.wait_workload("swap-0");
    assert_addresses(&sim, &nodes);
    assert_traffic(&nodes);

    for n in &mut nodes {
        n.kubelet.stop_all();
    }
    drop(nodes);
    eprintln!("kubelet tier: done in {:.0?}", started.elapsed());
}
