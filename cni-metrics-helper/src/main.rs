//! `cni-metrics-helper` entry point: parse the Config, start logging, wire the adapters,
//! loop rounds every METRIC_UPDATE_INTERVAL. Decides nothing itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cni_metrics_helper::aggregate::CounterMemory;
use cni_metrics_helper::cloudwatch::{CloudWatch, CloudWatchSettings};
use cni_metrics_helper::config::Config;
use cni_metrics_helper::inventory::Inventory;
use cni_metrics_helper::inventory::ec2::Ec2Inventory;
use cni_metrics_helper::kube_pods::AwsNodePods;
use cni_metrics_helper::round::{
    inventory_document, publish_inventory_config_map, run_inventory, run_round,
};
use cni_metrics_helper::serve::Published;

fn init_logging(level: &str) {
    let level = match level.to_ascii_uppercase().as_str() {
        "DEBUG" => "debug",
        "WARN" => "warn",
        "ERROR" | "FATAL" => "error",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::new(format!("cni_metrics_helper={level},warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
        .event_format(logging::ZapJson)
        .with_writer(std::io::stdout)
        .try_init();
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = match Config::from_env(|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            init_logging("INFO");
            tracing::error!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    init_logging(&config.log_level);
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing::info!(
        "Starting CNIMetricsHelper. Sending metrics to CloudWatch: {}, Prometheus: {}, LogLevel {}, metricUpdateInterval {}",
        config.use_cloudwatch,
        config.use_prometheus,
        config.log_level,
        config.interval.as_secs()
    );
    let kube = match AwsNodePods::connect(
        std::env::var_os("KUBECONFIG")
            .map(std::path::PathBuf::from)
            .as_deref(),
    )
    .await
    {
        Ok(k) => k,
        Err(e) => {
            tracing::error!("Error Fetching Kubernetes Client: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let cloudwatch = if config.use_cloudwatch {
        // The region from IMDS when not given, the cluster id from the instance's tags when
        // AWS_CLUSTER_ID is not set
        let region = match &config.region {
            Some(r) => Some(r.clone()),
            None => cni_metrics_helper::cluster_id::region_from_imds().await,
        };
        let cluster_id = match &config.cluster_id {
            Some(id) => id.clone(),
            None => cni_metrics_helper::cluster_id::from_instance_tags(region.as_deref()).await,
        };
        tracing::info!(
            "Using REGION={} and CLUSTER_ID={cluster_id}",
            region.as_deref().unwrap_or("")
        );
        Some(
            CloudWatch::new(CloudWatchSettings {
                region,
                endpoint: config.cloudwatch_endpoint.clone(),
                cluster_id,
                max_attempts: 5,
                initial_backoff: Duration::from_millis(500),
                static_credentials: None,
            })
            .await,
        )
    } else {
        None
    };
    let latest = config
        .use_prometheus
        .then(|| Arc::new(Mutex::new(Published::default())));
    if let Some(latest) = &latest {
        match tokio::net::TcpListener::bind(&config.prometheus_bind).await {
            Ok(listener) => {
                tokio::spawn(cni_metrics_helper::serve::serve(listener, latest.clone()));
            }
            Err(e) => {
                tracing::error!("bind {}: {e}", config.prometheus_bind);
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let inventory_ec2 = if config.inventory {
        let region = match &config.region {
            Some(r) => Some(r.clone()),
            None => cni_metrics_helper::cluster_id::region_from_imds().await,
        };
        Some(Ec2Inventory::new(region, config.ec2_endpoint.clone()).await)
    } else {
        None
    };
    if config.inventory_config_map.is_some() && !config.inventory {
        tracing::warn!(
            "SUBNET_INVENTORY_CONFIGMAP is set but ENABLE_SUBNET_INVENTORY=false: no inventory is counted, the ConfigMap is not written"
        );
    }
    let mut inventory = Inventory::new(config.forecast_window.as_secs_f64());
    let started = std::time::Instant::now();
    let mut last_inventory: Option<std::time::Instant> = None;
    let mut memory = CounterMemory::default();
    let mut ticker = tokio::time::interval(config.interval);
    let mut done = 0u64;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tokio::signal::ctrl_c() => break,
        }
        tracing::info!("Collecting metrics ...");
        let report = run_round(&kube, cloudwatch.as_ref(), latest.as_ref(), &mut memory).await;
        tracing::info!(
            pods = report.pods,
            scraped = report.scraped,
            datums = report.datums.len(),
            published = report.published,
            "round done"
        );
        if let Some(ec2) = &inventory_ec2 {
            let due = last_inventory.is_none_or(|t| t.elapsed() >= config.inventory_interval);
            if due {
                last_inventory = Some(std::time::Instant::now());
                let report = run_inventory(
                    &kube,
                    ec2,
                    &mut inventory,
                    started.elapsed().as_secs_f64(),
                    cloudwatch.as_ref(),
                    latest.as_ref(),
                )
                .await;
                // a failed round writes nothing: the ConfigMap ages and ipamd stops using it
                if let (Some((ns, name)), None) = (&config.inventory_config_map, &report.error) {
                    let doc = inventory_document(
                        &report.subnets,
                        std::time::SystemTime::now(),
                        config.inventory_interval,
                    );
                    let _ = publish_inventory_config_map(&kube, (ns, name), &doc).await;
                }
            }
        }
        done += 1;
        if config.rounds.is_some_and(|n| done >= n) {
            break;
        }
    }
    std::process::ExitCode::SUCCESS
}
