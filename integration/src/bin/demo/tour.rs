//! The demo's default walk-through: two nodes, pods, connectivity to each other and the
//! internet host, `/v1/enis`, how to explore, and the wait for Ctrl-C. Must not touch the root
//! network namespace.

use super::*;

pub(super) fn tour(args: &Args, cancel: Arc<AtomicBool>) -> Result<(), String> {
    println!("== ipamd + aws-cni on a simulated VPC ==");
    let mut sim = start_tour_sim(args, cancel)?;
    let control = sim.serve_control().map_err(|e| e.to_string())?;
    let cn_env = [
        ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true"),
        ("ENI_CONFIG_LABEL_DEF", "topology.kubernetes.io/zone"),
    ];
    start_ipamds(&mut sim, if args.custom_networking { &cn_env } else { &[] })?;
    add_pods(&mut sim, args.pods_per_node)?;

    println!("\n== pods ==");
    println!(
        "  {:<10} {:<15} {:<38} netns",
        "pod", "address", "node / ENI / device"
    );
    for p in sim.pods() {
        println!(
            "  {:<10} {:<15} {:<38} {}",
            p.name,
            p.ip,
            eni_label(&sim, p),
            p.netns
        );
    }

    println!("\n== connectivity (busybox ping, TCP echo) ==");
    let pods = sim.pods().to_vec();
    let on_dev = |p: &Pod, primary: bool| {
        let eni = sim.eni_of(p.node, p.ip).unwrap_or_default();
        sim.ec2_enis(p.node)
            .get(&eni)
            .is_some_and(|(d, _)| (*d == 0) == primary)
    };
    let pick = |node: usize, primary: bool, not: Option<&Pod>| {
        pods.iter()
            .find(|p| p.node == node && on_dev(p, primary) && not.is_none_or(|n| n.name != p.name))
            .cloned()
    };
    let a = pick(0, true, None);
    let b = a.as_ref().and_then(|a| pick(0, true, Some(a)));
    let c = pick(0, false, None);
    let d = pick(1, false, None).or_else(|| pick(1, true, None));
    let mut servers = Vec::new();
    for p in [&a, &b, &c, &d].into_iter().flatten() {
        servers.push(EchoServer::start(&p.netns, 8080)?);
    }
    let pairs = [
        ("same node, same ENI", &a, &b),
        ("same node, across ENIs", &a, &c),
        ("across nodes", &a, &d),
        ("across nodes, secondary ENIs", &c, &d),
    ];
    let mut failures = 0;
    for (what, from, to) in pairs {
        let (Some(from), Some(to)) = (from, to) else {
            println!("  {what:<30} (not enough pods for this pair)");
            continue;
        };
        let p = ping(&from.netns, to.ip);
        let t = tcp_echo(&from.netns, SocketAddr::from((to.ip, 8080)));
        failures += usize::from(p.is_err()) + usize::from(t.is_err());
        println!(
            "  {what:<30} {} ({}) -> {} ({}): ping {}, tcp {}",
            from.name,
            from.ip,
            to.name,
            to.ip,
            mark(&p),
            mark(&t)
        );
    }
    for p in [&a, &c].into_iter().flatten() {
        let pi = ping(&p.netns, INTERNET_HOST);
        let t = tcp_echo(
            &p.netns,
            SocketAddr::from((INTERNET_HOST, INTERNET_ECHO_PORT)),
        );
        failures += usize::from(pi.is_err()) + usize::from(t.is_err());
        println!(
            "  {:<30} {} ({}) -> {INTERNET_HOST} (SNAT to {}): ping {}, tcp {}",
            "pod to internet",
            p.name,
            p.ip,
            sim.nodes[p.node].primary_ip,
            mark(&pi),
            mark(&t)
        );
    }
    drop(servers);

    for i in 0..sim.nodes.len() {
        println!("\n== ipamd status, node {i} (raw JSON: ipamd status --raw, or /v1/enis) ==");
        match ipamd_status(&sim, i) {
            Ok(table) => print!("{table}"),
            Err(e) => println!("  {e}"),
        }
    }

    print_explore(&sim, control);
    if failures > 0 {
        println!(
            "\n{failures} connectivity check(s) FAILED; logs: {}",
            sim.dir().display()
        );
    }
    if !args.no_hold {
        println!("\nThe VPC stays up for exploring. Press Ctrl-C to tear everything down.");
        while !stopped() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let left_pods = sim.pods().to_vec();
    run_step(
        "tear down: DEL pods, stop ipamds, remove namespaces",
        move || {
            let mut sim = sim;
            for p in &left_pods {
                let _ = sim.del_pod(p);
            }
            let errors = sim.shutdown();
            if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.join("; "))
            }
        },
    )?;
    if failures > 0 {
        return Err(format!("{failures} connectivity check(s) failed"));
    }
    Ok(())
}

/// `ipamd status` run inside node `i`'s namespace with that node's ipamd environment, as an
/// operator runs it in the aws-node container.
/// The environment is also written to `node<i>/ipamd.env` for the explore hint.
fn ipamd_status(sim: &Sim, i: usize) -> Result<String, String> {
    let env: Vec<String> = sim
        .ipamd_env(i, &[])
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let _ = std::fs::write(
        sim.dir().join(format!("node{i}/ipamd.env")),
        env.join("\n") + "\n",
    );
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &sim.nodes[i].netns, "env", "-i"])
        .args(&env)
        .arg(integration::binaries::built_binary("ipamd"))
        .arg("status")
        .output()
        .map_err(|e| format!("ipamd status: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ipamd status failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn print_explore(sim: &Sim, control: SocketAddr) {
    let n0 = &sim.nodes[0];
    let pod = sim.pods().first();
    let pod_ns = pod.map_or("<pod netns>".to_owned(), |p| p.netns.clone());
    println!("\n== explore (in another terminal, as root) ==");
    for (i, n) in sim.nodes.iter().enumerate() {
        println!(
            "  node {i}: {} {} netns {}",
            n.instance_id, n.primary_ip, n.netns
        );
    }
    println!("  enter a node:         ip netns exec {} bash", n0.netns);
    if let Some(k) = sim.kube() {
        println!(
            "  Kubernetes API:       kubectl --kubeconfig {} get nodes -L topology.kubernetes.io/zone; ... get eniconfigs,events -A",
            k.api.admin().kubeconfig.display()
        );
        println!(
            "  node's ENIConfig:     ip netns exec {} curl -s 127.0.0.1:61679/v1/eni-configs",
            n0.netns
        );
    }
    println!(
        "  ipamd status:         ip netns exec {} env $(cat {}/node0/ipamd.env) {} status",
        n0.netns,
        sim.dir().display(),
        integration::binaries::built_binary("ipamd").display()
    );
    println!(
        "  ipamd introspection:  ip netns exec {} curl -s 127.0.0.1:61679/v1/enis | jq",
        n0.netns
    );
    println!(
        "  ipamd metrics:        ip netns exec {} curl -s 127.0.0.1:61678/metrics | grep ^awscni_",
        n0.netns
    );
    println!(
        "  list pods:            ip netns list | grep '^{}p'   (names: table above)",
        sim.prefix()
    );
    println!(
        "  inside a pod:         ip netns exec {pod_ns} ip addr; ip netns exec {pod_ns} busybox ping -c1 {INTERNET_HOST}"
    );
    println!(
        "  node routing / SNAT:  ip -n {0} rule; ip -n {0} route show table 2; ip netns exec {0} iptables -t nat -S",
        n0.netns
    );
    println!("  EC2 state:            curl -s {control}/state | jq");
    println!(
        "  knobs:                curl -s -X PUT {control}/knobs -H 'content-type: application/json' -d '{{\"latency_ms\":200}}'"
    );
    println!(
        "  logs:                 {}/node*/ipamd.log, plugin.log",
        sim.dir().display()
    );
}
