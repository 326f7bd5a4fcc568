//! `vpcsim up`: create the world, launch the nodes, start the fabric and the loopback EC2 /
//! control servers, publish the state file, and run until SIGINT/SIGTERM, then take it all
//! down. Must not leave anything behind on any exit path it controls.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};

use super::state::{NodeState, RunState, StateFileError};
use crate::fabric::{Fabric, FabricConfig, FabricError, FabricWorld, names};
use crate::{Layout, World, WorldConfig};

/// `vpcsim up` arguments.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Number of nodes (instances) to launch.
    #[arg(long, default_value_t = 2)]
    pub nodes: u32,
    /// Instance type of the nodes.
    #[arg(long, default_value = "m5.large")]
    pub instance_type: String,
    /// Loopback port of the EC2 Query API (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub ec2_port: u16,
    /// Loopback port of the control API (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub control_port: u16,
    /// Attach delay in milliseconds (knob `attach_delay_ms`; can be changed later).
    #[arg(long)]
    pub attach_delay_ms: Option<u64>,
    /// Availability zones (`<region>a`, `<region>b`, ...); node i goes to zone i mod N.
    #[arg(long, default_value_t = 1)]
    pub azs: u32,
    /// Primary-block subnets per zone.
    #[arg(long, default_value_t = 2)]
    pub subnets_per_az: u32,
    /// A secondary VPC CIDR block (e.g. 100.64.0.0/16); one subnet per zone is cut from it.
    #[arg(long)]
    pub secondary_cidr: Option<ipnet::Ipv4Net>,
    /// Start the simulated Kubernetes API (kubesim) too: CRDs, the chart's rendered RBAC
    /// (needs helm-python-sdk; skipped with a warning otherwise), a Node and aws-node Pod per
    /// instance, admin and per-node kubeconfigs in the state dir, and a relay to it at
    /// 169.254.169.201:443 in every node.
    #[arg(long)]
    pub kube: bool,
    /// Launch the nodes as IPv6 EKS nodes: each primary ENI gets one IPv6 address from its
    /// subnet's /64 (on the node's `eth0`); the VPC's /56 and subnet /64s exist either way.
    #[arg(long)]
    pub ipv6: bool,
}

/// `up` failed.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// Another run owns the state directory.
    #[error("a vpcsim run (pid {pid}, run {run_id}) is already up in this state dir")]
    AlreadyUp {
        /// pid
        pid: u32,
        /// run
        run_id: String,
    },
    /// Launching the nodes.
    #[error("launch nodes: {0}")]
    Launch(String),
    /// The world layout.
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    /// The Kubernetes API.
    #[error(transparent)]
    Kube(#[from] crate::kube::KubeError),
    /// The fabric.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// A loopback listener or the signal handler.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The state file.
    #[error(transparent)]
    State(#[from] StateFileError),
}

/// Run `up` until a signal.
pub async fn up(args: UpArgs, dir: &Path) -> Result<(), UpError> {
    if let Ok(old) = RunState::read(dir)
        && crate::fabric::netns::run_is_live(&old.run_id)
    {
        return Err(UpError::AlreadyUp {
            pid: old.pid,
            run_id: old.run_id,
        });
    }
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;

    let config = WorldConfig::with_layout(&Layout {
        azs: args.azs,
        subnets_per_az: args.subnets_per_az,
        secondary_cidr: args.secondary_cidr,
    });
    config.validate()?;
    let world = World::new(config);
    if let Some(ms) = args.attach_delay_ms {
        let mut k = world.knobs();
        k.attach_delay_ms = ms;
        world.set_knobs(k);
    }
    let ids = launch(&world, &args)?;
    let kube = if args.kube {
        Some(start_kube(dir).await?)
    } else {
        None
    };

    let rt = tokio::runtime::Handle::current();
    let fw = world.clone();
    let fabric_config = FabricConfig {
        kube_upstream: kube.as_ref().map(|(k, _)| k.addr()),
        ..FabricConfig::default()
    };
    let fabric = tokio::task::spawn_blocking(move || Fabric::start_world(fw, rt, &fabric_config))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    // from here on `fabric`'s Drop removes the namespaces on every return path

    let ec2 = loopback(args.ec2_port).await?;
    let control = loopback(args.control_port).await?;
    let (ec2_addr, control_addr) = (ec2.local_addr()?, control.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let s1 = tokio::spawn(crate::serve(
        ec2,
        crate::ec2::router(world.clone()),
        stopped(stop_rx.clone()),
    ));
    let s2 = tokio::spawn(crate::serve(
        control,
        crate::control::router(world.clone()),
        stopped(stop_rx),
    ));

    let view = FabricWorld::fabric_view(&world);
    let names = fabric.names().clone();
    let mut registered = Vec::new();
    if let Some((k, token)) = &kube {
        for id in &ids {
            let Some(inst) = view.instance(id) else {
                continue;
            };
            let path = dir.join("kube").join(format!("{id}.kubeconfig"));
            registered.push(crate::kube::register_node(
                k,
                inst,
                &world.config().region,
                token,
                &path,
            )?);
        }
    }
    let state = RunState {
        pid: std::process::id(),
        run_id: names.run_id().to_owned(),
        region: world.config().region.clone(),
        ec2_api: ec2_addr,
        control_api: control_addr,
        router_netns: names.router_ns(),
        internet_netns: names.internet_ns(),
        internet_host: names::INTERNET_HOST_ADDR,
        internet_host6: view.vpc_ipv6_cidr.map(|_| names::INTERNET_HOST_ADDR6),
        node_ec2_endpoint: names::ec2_endpoint_url(),
        node_imds_endpoint: names::imds_url(),
        nodes: ids
            .iter()
            .enumerate()
            .map(|(i, id)| NodeState {
                instance_id: id.clone(),
                netns: names.node_ns(id),
                primary_ip: view
                    .instance(id)
                    .and_then(|i| i.primary())
                    .map(|e| e.primary_ip),
                primary_ipv6: view.instance(id).and_then(|i| i.primary_ipv6()),
                availability_zone: view.instance(id).map(|i| i.availability_zone.clone()),
                kube: registered.get(i).cloned().map(|r| super::state::NodeKube {
                    node_name: r.name,
                    pod_name: r.pod,
                    kubeconfig: r.kubeconfig,
                }),
            })
            .collect(),
        kube_admin_kubeconfig: kube.as_ref().map(|(k, _)| k.admin().kubeconfig.clone()),
    };
    state.write(dir)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&state).unwrap_or_default()
    );
    tracing::info!(run = %state.run_id, ec2 = %ec2_addr, control = %control_addr, "vpcsim up; Ctrl-C to stop");

    tokio::select! {
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {}
    }
    tracing::info!("stopping");
    let _ = stop_tx.send(true);
    let _ = std::fs::remove_file(super::state::path_in(dir));
    let errors = tokio::task::spawn_blocking(move || fabric.shutdown())
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    for e in errors {
        tracing::warn!(error = %e, "teardown");
    }
    let _ = tokio::join!(s1, s2);
    drop(kube);
    Ok(())
}

/// Launch the nodes, node `i` into the first primary-block subnet of zone `i mod azs`.
fn launch(world: &std::sync::Arc<World>, args: &UpArgs) -> Result<Vec<String>, UpError> {
    let region = world.config().region.clone();
    let mut ids = Vec::new();
    for i in 0..args.nodes {
        let zone = crate::config::az_name(&region, i % args.azs.max(1));
        let subnet = world
            .read(|s| {
                s.subnets
                    .values()
                    .find(|sn| sn.availability_zone == zone && s.vpc.cidr.contains(&sn.cidr))
                    .map(|sn| sn.id.clone())
            })
            .ok_or_else(|| UpError::Launch(format!("no primary-block subnet in zone {zone}")))?;
        let mut got = world
            .mutate(|s, now| {
                s.run_instances(
                    crate::state::RunInstances {
                        instance_type: args.instance_type.clone(),
                        subnet_id: Some(subnet.clone()),
                        count: 1,
                        ipv6_count: u32::from(args.ipv6),
                        ..crate::state::RunInstances::default()
                    },
                    now,
                )
            })
            .map_err(|e| UpError::Launch(e.to_string()))?;
        ids.append(&mut got);
    }
    Ok(ids)
}

/// kubesim with files in `<dir>/kube`, the chart's RBAC when Helm can render it, and the
/// aws-node token.
async fn start_kube(dir: &Path) -> Result<(kubesim::KubeSim, String), UpError> {
    let k = crate::kube::start(&dir.join("kube")).await?;
    match kubesim::chart::render_chart(&serde_json::json!({})) {
        Ok(yaml) => {
            if let Err(e) = k.apply_yaml(&yaml) {
                tracing::warn!(error = %e, "chart not applied; aws-node has no permissions");
            }
        }
        Err(e) => tracing::warn!(error = %e, "chart not rendered; aws-node has no permissions"),
    }
    let sa = k
        .service_account(crate::kube::KUBE_SYSTEM, "aws-node")
        .map_err(crate::kube::KubeError::from)?;
    Ok((k, sa.token))
}

async fn loopback(port: u16) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)))
        .await
}
