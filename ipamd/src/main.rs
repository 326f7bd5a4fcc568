//! `ipamd` entry point: parse config once, initialise logging, run; or `ipamd status [--raw]`,
//! which prints the local ipamd's state as a table (or `/v1/enis` as JSON).

use std::process::ExitCode;

fn main() -> ExitCode {
    let config = match ipamd::config::Config::from_env_map(&ipamd::config::Config::process_env()) {
        Ok(c) => c,
        Err(e) => {
            // A refused environment is exit status 1 (what the aws-node start-up and operators'
            // tooling expect).
            eprintln!("ipamd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => {}
        ["status"] => return status(&config, false),
        ["status", "--raw"] => return status(&config, true),
        _ => {
            eprintln!(
                "usage: ipamd            run the daemon (configured by environment)\n       ipamd status [--raw]   the local ipamd's ENIs, pool, checkpoint, failed ADDs and subnets (--raw: /v1/enis JSON)"
            );
            return ExitCode::from(2);
        }
    }
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

fn status(config: &ipamd::config::Config, raw: bool) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ipamd status: start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let snapshot = runtime.block_on(ipamd::status::fetch(config));
    if raw {
        return match snapshot.enis {
            Ok(v) => {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ipamd status: {e}");
                ExitCode::FAILURE
            }
        };
    }
    print!("{}", ipamd::status::render(&snapshot, config));
    if snapshot.enis.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
