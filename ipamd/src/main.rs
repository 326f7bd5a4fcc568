//! `ipamd` entry point: parse config once, initialise logging, run.

use std::process::ExitCode;

fn main() -> ExitCode {
    let config = match ipamd::config::Config::from_env_map(&ipamd::config::Config::process_env()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ipamd: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = ipamd::init_logging(&config) {
        eprintln!("ipamd: {e:#}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        // ipamd is I/O bound; few threads keep its memory small (target <= 16 MiB).
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ipamd: start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(ipamd::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "ipamd failed");
            eprintln!("ipamd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
