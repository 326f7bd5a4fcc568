//! Serving: the HTTPS (and optional plain HTTP) listeners on loopback, TLS handshakes, one
//! hyper HTTP/1.1 connection per client driving the API router, and the outage knob's
//! "connection refused" (listener closed, open connections cut). Owns sockets only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::cluster::{Cluster, Outage};

/// Runs an accept loop until `shutdown` turns true.
pub fn spawn(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    cluster: Arc<Cluster>,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(accept_loop(listener, tls, router, cluster, shutdown))
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    cluster: Arc<Cluster>,
    mut shutdown: watch::Receiver<bool>,
) {
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    let mut listener = Some(listener);
    let mut conn_gen = cluster.conn_generation.subscribe();
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Some((until, Outage::Refuse)) = cluster.outage() {
            // Connection refused: no listener until the outage ends.
            listener = None;
            tokio::select! {
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(until)) => {}
                _ = shutdown.changed() => return,
            }
            continue;
        }
        let l = match &listener {
            Some(l) => l,
            None => match rebind(addr).await {
                Some(l) => listener.insert(l),
                None => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        tokio::select! {
            r = l.accept() => {
                let Ok((stream, _)) = r else { continue };
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_conn(stream, tls.clone(), router.clone(), cluster.conn_generation.subscribe(), shutdown.clone()));
            }
            _ = conn_gen.changed() => {}
            _ = shutdown.changed() => return,
        }
    }
}

async fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .ok()?;
    sock.set_reuseaddr(true).ok()?;
    sock.bind(addr).ok()?;
    sock.listen(1024).ok()
}

async fn serve_conn(
    stream: tokio::net::TcpStream,
    tls: Option<TlsAcceptor>,
    router: Router,
    mut cut: watch::Receiver<u64>,
    mut shutdown: watch::Receiver<bool>,
) {
    cut.mark_unchanged();
    let svc = hyper_util::service::TowerToHyperService::new(router);
    let builder = hyper::server::conn::http1::Builder::new();
    match tls {
        Some(acc) => {
            let Ok(Ok(s)) =
                tokio::time::timeout(std::time::Duration::from_secs(10), acc.accept(stream)).await
            else {
                return;
            };
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(s), svc);
            tokio::select! {
                _ = conn => {}
                _ = cut.changed() => {}
                _ = shutdown.changed() => {}
            }
        }
        None => {
            let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = cut.changed() => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}
