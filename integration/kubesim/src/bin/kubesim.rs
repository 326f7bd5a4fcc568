//! `kubesim`: runs the Kubernetes API simulator until SIGTERM/SIGINT and prints one JSON line
//! with its URL, CA and kubeconfig paths. Thin: parsing and printing only.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use kubesim::{Config, Knobs, KubeSim};

#[derive(Debug, Parser)]
#[command(
    name = "kubesim",
    about = "A Kubernetes API server simulator for tests"
)]
struct Args {
    /// Directory for ca.crt and kubeconfigs.
    #[arg(long, env = "KUBESIM_DIR")]
    dir: PathBuf,
    /// HTTPS listen address.
    #[arg(long, env = "KUBESIM_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Optional plain-HTTP listen address.
    #[arg(long, env = "KUBESIM_HTTP_LISTEN")]
    http_listen: Option<SocketAddr>,
    /// Manifests (multi-document YAML) to apply at start: CRDs, RBAC, nodes...
    #[arg(long = "apply")]
    apply: Vec<PathBuf>,
    /// Also serve the CNINode CRD.
    #[arg(long)]
    cninode_crd: bool,
    /// ServiceAccounts (`ns/name`) to issue tokens and kubeconfigs for.
    #[arg(long = "service-account")]
    service_accounts: Vec<String>,
    #[arg(long, env = "KUBESIM_LATENCY_MS", default_value_t = 0)]
    latency_ms: u64,
    #[arg(long, env = "KUBESIM_HISTORY", default_value_t = 1000)]
    history: usize,
    #[arg(long, env = "KUBESIM_BOOKMARK_MS", default_value_t = 60_000)]
    bookmark_ms: u64,
    #[arg(long, env = "KUBESIM_ADMIN_TOKEN")]
    admin_token: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    let mut cfg = Config::new(a.dir);
    cfg.https_addr = a.listen;
    cfg.http_addr = a.http_listen;
    cfg.admin_token = a.admin_token;
    cfg.knobs = Knobs {
        latency_ms: a.latency_ms,
        history_capacity: a.history,
        bookmark_interval_ms: a.bookmark_ms,
        ..Knobs::default()
    };
    let sim = KubeSim::start(cfg).await?;
    if a.cninode_crd {
        sim.apply_yaml(kubesim::CNINODE_CRD)?;
    }
    for p in &a.apply {
        sim.apply_file(p)?;
    }
    let mut sas = serde_json::Map::new();
    for s in &a.service_accounts {
        let (ns, name) = s.split_once('/').ok_or("--service-account takes ns/name")?;
        let c = sim.service_account(ns, name)?;
        sas.insert(
            s.clone(),
            serde_json::json!({"user": c.user, "kubeconfig": c.kubeconfig, "token": c.token}),
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "url": sim.url(), "http_url": sim.http_url(), "ca": sim.ca_path(),
            "admin_kubeconfig": sim.admin().kubeconfig, "admin_token": sim.admin().token,
            "service_accounts": sas,
        })
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    sim.shutdown();
    Ok(())
}
