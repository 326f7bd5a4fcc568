//! `grpc-health-probe`: the DaemonSet's liveness/readiness probe. Asks ipamd's `grpc.health.v1`
//! service (name `grpc.health.v1.aws-node`) over its unix socket whether it is SERVING.
//!
//! Flag-compatible with the `grpc-health-probe` the chart calls:
//! `-addr=unix:///var/run/aws-node/ipamd.sock -connect-timeout=5s -rpc-timeout=5s`, with its exit
//! codes: 0 serving, 1 invalid arguments, 2 connection failure, 3 RPC failure, 4 not serving. Owns
//! the flags and the exit codes; must not: call anything but the health service, or write stdout
//! except the `status: SERVING` line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use aws_cni::ipam::Ipamd;

const EXIT_INVALID_ARGS: u8 = 1;
const EXIT_CONNECT: u8 = 2;
const EXIT_RPC: u8 = 3;
const EXIT_UNHEALTHY: u8 = 4;

#[derive(Debug)]
struct Args {
    socket: PathBuf,
    connect_timeout: Duration,
    rpc_timeout: Duration,
}

fn parse_duration(v: &str) -> Option<Duration> {
    if let Some(ms) = v.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    v.strip_suffix('s')
        .unwrap_or(v)
        .parse()
        .ok()
        .map(Duration::from_secs)
}

/// Why the command line is refused (exit code [`EXIT_INVALID_ARGS`]); the texts are what the
/// probe has always printed.
#[derive(Debug, thiserror::Error)]
enum ArgsError {
    /// An argument without `=`.
    #[error("expected -flag=value, got {0:?}")]
    NotFlagValue(String),
    /// `-addr` that is not a unix socket URL.
    #[error("addr {0:?} must be unix:///<path>")]
    AddrNotUnix(String),
    /// `-connect-timeout` that is no duration.
    #[error("bad connect-timeout {0:?}")]
    ConnectTimeout(String),
    /// `-rpc-timeout` that is no duration.
    #[error("bad rpc-timeout {0:?}")]
    RpcTimeout(String),
    /// A flag the probe does not know.
    #[error("unknown flag -{0}")]
    UnknownFlag(String),
}

fn parse(args: impl Iterator<Item = String>) -> Result<Args, ArgsError> {
    let mut out = Args {
        socket: PathBuf::from(ipamd_proto::DEFAULT_SOCKET_PATH),
        connect_timeout: Duration::from_secs(1),
        rpc_timeout: Duration::from_secs(1),
    };
    for arg in args {
        let arg = arg.trim_start_matches('-');
        let (key, value) = arg
            .split_once('=')
            .ok_or_else(|| ArgsError::NotFlagValue(arg.to_owned()))?;
        match key {
            "addr" => {
                let path = value
                    .strip_prefix("unix://")
                    .ok_or_else(|| ArgsError::AddrNotUnix(value.to_owned()))?;
                out.socket = PathBuf::from(path);
            }
            "connect-timeout" => {
                out.connect_timeout = parse_duration(value)
                    .ok_or_else(|| ArgsError::ConnectTimeout(value.to_owned()))?
            }
            "rpc-timeout" => {
                out.rpc_timeout =
                    parse_duration(value).ok_or_else(|| ArgsError::RpcTimeout(value.to_owned()))?
            }
            // Accepted for compatibility; the probe always asks for ipamd's service name.
            "service" => {}
            other => return Err(ArgsError::UnknownFlag(other.to_owned())),
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("grpc-health-probe: {e}");
            return ExitCode::from(EXIT_INVALID_ARGS);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("grpc-health-probe: start runtime: {e}");
            return ExitCode::from(EXIT_RPC);
        }
    };
    runtime.block_on(async {
        let connect =
            tokio::time::timeout(args.connect_timeout, Ipamd::connect(&args.socket)).await;
        let ipamd = match connect {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                eprintln!(
                    "grpc-health-probe: {e}: {}",
                    std::error::Error::source(&e)
                        .map(ToString::to_string)
                        .unwrap_or_default()
                );
                return ExitCode::from(EXIT_CONNECT);
            }
            Err(_) => {
                eprintln!(
                    "grpc-health-probe: timeout connecting to {}",
                    args.socket.display()
                );
                return ExitCode::from(EXIT_CONNECT);
            }
        };
        match tokio::time::timeout(args.rpc_timeout, ipamd.serving()).await {
            Ok(Ok(true)) => {
                println!("status: SERVING");
                ExitCode::SUCCESS
            }
            Ok(Ok(false)) => {
                eprintln!("grpc-health-probe: service unhealthy");
                ExitCode::from(EXIT_UNHEALTHY)
            }
            Ok(Err(e)) => {
                eprintln!("grpc-health-probe: {e}");
                ExitCode::from(EXIT_RPC)
            }
            Err(_) => {
                eprintln!("grpc-health-probe: health rpc timed out");
                ExitCode::from(EXIT_RPC)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Args, ArgsError> {
        parse(v.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn upstream_chart_flags_parse() {
        let a = args(&[
            "-addr=unix:///var/run/aws-node/ipamd.sock",
            "-connect-timeout=5s",
            "-rpc-timeout=500ms",
        ])
        .unwrap();
        assert_eq!(a.socket, PathBuf::from("/var/run/aws-node/ipamd.sock"));
        assert_eq!(a.connect_timeout, Duration::from_secs(5));
        assert_eq!(a.rpc_timeout, Duration::from_millis(500));
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(args(&["-addr=127.0.0.1:50051"]).is_err());
        assert!(args(&["-rpc-timeout=soon"]).is_err());
        assert!(args(&["-bogus=1"]).is_err());
        assert!(args(&["addr"]).is_err());
    }

    /// What the probe prints after `grpc-health-probe: ` for a refused command line.
    #[test]
    fn refusals_keep_their_texts() {
        let text = |v: &[&str]| args(v).unwrap_err().to_string();
        assert_eq!(text(&["addr"]), "expected -flag=value, got \"addr\"");
        assert_eq!(
            text(&["-addr=127.0.0.1:50051"]),
            "addr \"127.0.0.1:50051\" must be unix:///<path>"
        );
        assert_eq!(text(&["-connect-timeout=x"]), "bad connect-timeout \"x\"");
        assert_eq!(text(&["-rpc-timeout=soon"]), "bad rpc-timeout \"soon\"");
        assert_eq!(text(&["--bogus=1"]), "unknown flag -bogus");
    }
}
