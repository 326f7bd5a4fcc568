//! The `vpcsim` binary: parse arguments, set up logging, run the command, map the result to an
//! exit code. Everything else lives in `vpcsim::cli`.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = vpcsim::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vpcsim: runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(vpcsim::cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vpcsim: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
