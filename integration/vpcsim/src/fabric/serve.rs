//! The servers the fabric runs inside its namespaces: IMDS, the EC2 endpoint and (when
//! configured) the Kubernetes API relay in every node namespace, the TCP echo host in the
//! internet namespace. Sockets are made by `netns::listen_in`
//! and served on the caller's tokio runtime. Must not bind anything in the root netns.

use std::collections::BTreeMap;
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

use super::FabricWorld;
use super::names::{
    EC2_ENDPOINT_ADDR, EC2_ENDPOINT_PORT, IMDS_ADDR, IMDS_PORT, INTERNET_ECHO_PORT,
    INTERNET_HOST_ADDR, INTERNET_HOST_ADDR6, KUBE_API_ADDR, KUBE_API_PORT, RunNames,
};
use super::netns::{NetnsError, listen_in};

/// Serve `router` on an already bound std listener; the task ends when aborted.
pub fn serve_router(
    rt: &Handle,
    listener: std::net::TcpListener,
    router: axum::Router,
) -> AbortHandle {
    rt.spawn(async move {
        match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => {
                if let Err(e) = axum::serve(l, router.into_make_service()).await {
                    tracing::warn!(error = %e, "server stopped");
                }
            }
            Err(e) => tracing::warn!(error = %e, "listener not usable"),
        }
    })
    .abort_handle()
}

/// TCP echo on the internet host (`203.0.113.10:7`, and with `ipv6` also
/// `[2001:db8:ffff::10]:7`).
pub fn serve_echo(rt: &Handle, names: &RunNames, ipv6: bool) -> Result<AbortHandle, NetnsError> {
    let mut listeners = vec![listen_in(
        &names.internet_ns(),
        SocketAddr::V4(SocketAddrV4::new(INTERNET_HOST_ADDR, INTERNET_ECHO_PORT)),
    )?];
    if ipv6 {
        listeners.push(listen_in(
            &names.internet_ns(),
            SocketAddr::V6(SocketAddrV6::new(
                INTERNET_HOST_ADDR6,
                INTERNET_ECHO_PORT,
                0,
                0,
            )),
        )?);
    }
    Ok(rt
        .spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for listener in listeners {
                tasks.spawn(echo(listener));
            }
            while tasks.join_next().await.is_some() {}
        })
        .abort_handle())
}

async fn echo(listener: std::net::TcpListener) {
    let Ok(l) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    while let Ok((mut conn, _)) = l.accept().await {
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = conn.read(&mut buf).await {
                if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// A TCP relay: every connection accepted on `listener` is joined byte for byte to a new
/// connection to `upstream` (the Kubernetes API relay; TLS passes through untouched).
pub fn serve_relay(
    rt: &Handle,
    listener: std::net::TcpListener,
    upstream: SocketAddr,
) -> AbortHandle {
    rt.spawn(async move {
        let Ok(l) = tokio::net::TcpListener::from_std(listener) else {
            return;
        };
        while let Ok((mut conn, _)) = l.accept().await {
            tokio::spawn(async move {
                match tokio::net::TcpStream::connect(upstream).await {
                    Ok(mut up) => {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
                    }
                    Err(e) => tracing::warn!(%upstream, error = %e, "relay upstream refused"),
                }
            });
        }
    })
    .abort_handle()
}

/// IMDS, EC2-endpoint and Kubernetes-relay servers per node namespace.
#[derive(Debug, Default)]
pub struct NodeServers {
    running: BTreeMap<String, Vec<AbortHandle>>,
    kube_upstream: Option<SocketAddr>,
}

impl NodeServers {
    /// No servers yet; nodes get a Kubernetes API relay to `kube_upstream` when set.
    pub fn new(kube_upstream: Option<SocketAddr>) -> Self {
        Self {
            running: BTreeMap::new(),
            kube_upstream,
        }
    }

    /// Start servers for nodes in `wanted` that have none, stop those of nodes no longer
    /// wanted. A node whose namespace is not there yet is retried on the next call.
    pub fn sync<'a>(
        &mut self,
        rt: &Handle,
        names: &RunNames,
        world: &dyn FabricWorld,
        wanted: impl Iterator<Item = &'a String> + Clone,
    ) {
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|id| !wanted.clone().any(|w| w == *id))
            .cloned()
            .collect();
        for id in gone {
            for h in self.running.remove(&id).unwrap_or_default() {
                h.abort();
            }
        }
        for id in wanted {
            if self.running.contains_key(id) {
                continue;
            }
            match Self::start(rt, names, world, id, self.kube_upstream) {
                Ok(handles) => {
                    self.running.insert(id.clone(), handles);
                }
                Err(e) => {
                    tracing::debug!(instance = %id, error = %e, "node servers not started yet")
                }
            }
        }
    }

    fn start(
        rt: &Handle,
        names: &RunNames,
        world: &dyn FabricWorld,
        instance_id: &str,
        kube_upstream: Option<SocketAddr>,
    ) -> Result<Vec<AbortHandle>, NetnsError> {
        let ns = names.node_ns(instance_id);
        let imds = listen_in(&ns, SocketAddr::V4(SocketAddrV4::new(IMDS_ADDR, IMDS_PORT)))?;
        let ec2 = listen_in(
            &ns,
            SocketAddr::V4(SocketAddrV4::new(EC2_ENDPOINT_ADDR, EC2_ENDPOINT_PORT)),
        )?;
        let mut handles = vec![
            serve_router(rt, imds, world.imds_router(instance_id)),
            serve_router(rt, ec2, world.ec2_router()),
        ];
        if let Some(up) = kube_upstream {
            let kube = listen_in(
                &ns,
                SocketAddr::V4(SocketAddrV4::new(KUBE_API_ADDR, KUBE_API_PORT)),
            )?;
            handles.push(serve_relay(rt, kube, up));
        }
        Ok(handles)
    }

    /// Stop every server.
    pub fn stop_all(&mut self) {
        for h in std::mem::take(&mut self.running).into_values().flatten() {
            h.abort();
        }
    }
}
