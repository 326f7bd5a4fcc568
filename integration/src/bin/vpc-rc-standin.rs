//! `vpc-rc-standin`: the VPC Resource Controller stand-in (`integration::vpc_rc`) as a process,
//! for `vpcsim up --kube` sessions and manual runs: reconciles every `--period-ms` against the
//! Kubernetes API of `--kubeconfig` (its own ServiceAccount, `vpc_rc::RBAC_YAML`) and the EC2
//! API at `--ec2-endpoint` until SIGTERM/SIGINT. Test-only. Must not: touch any network
//! namespace, or ENIs it did not create.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use integration::vpc_rc::Controller;

#[derive(Parser, Debug)]
#[command(about = "A VPC Resource Controller stand-in for security groups for pods (tests only)")]
struct Args {
    /// Kubeconfig of the controller's ServiceAccount.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// EC2 endpoint (the simulated VPC's), e.g. http://127.0.0.1:4566.
    #[arg(long)]
    ec2_endpoint: String,
    /// Region.
    #[arg(long, default_value = "us-west-2")]
    region: String,
    /// Reconcile period in milliseconds.
    #[arg(long, default_value_t = 500)]
    period_ms: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "tokio runtime");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let controller =
            match Controller::connect(&args.kubeconfig, &args.ec2_endpoint, &args.region).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "vpc-rc-standin failed to start");
                    return ExitCode::FAILURE;
                }
            };
        let stop = async {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        controller
            .run(Duration::from_millis(args.period_ms), stop)
            .await;
        ExitCode::SUCCESS
    })
}
