//! The `vpcsim` command line: `up` (world + fabric + servers in the foreground), `down`, `env`,
//! `dump`, `knobs`. Parses arguments once and talks to a running `up` through its state file and
//! control API. Must not touch namespaces except through `fabric`.

pub mod client;
pub mod knobs;
pub mod state;
pub mod up;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use state::{DEFAULT_STATE_DIR, RunState, StateFileError, node_env};

/// A simulated VPC on one machine: EC2 API, IMDSv2 and a namespace network fabric.
#[derive(Debug, Parser)]
#[command(name = "vpcsim", version)]
pub struct Cli {
    /// Directory of the state file of the run to use.
    #[arg(long, global = true, env = "VPCSIM_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Bring a VPC up with N nodes and run it in the foreground until Ctrl-C / SIGTERM.
    Up(up::UpArgs),
    /// Stop the run of the state directory (SIGTERM, wait), and remove leftovers of crashed runs.
    Down,
    /// Print the environment to run ipamd inside a node (index, instance id or netns name).
    Env {
        /// node: `0`, `i-...` or the namespace name
        node: String,
        /// Print one `ip netns exec <ns> env K=V ...` prefix instead of `export` lines.
        #[arg(long)]
        exec: bool,
    },
    /// Print the simulated EC2 state as JSON.
    Dump,
    /// Read or change behaviour knobs at run time.
    Knobs {
        /// get or set
        #[command(subcommand)]
        action: KnobsAction,
    },
}

/// `knobs` actions.
#[derive(Debug, Subcommand)]
pub enum KnobsAction {
    /// Print the knobs as JSON.
    Get,
    /// Set knobs: `key=value`, nested keys dotted (`throttle.enabled=true`), values JSON or text.
    Set {
        /// `key=value` pairs
        #[arg(required = true)]
        settings: Vec<String>,
    },
}

/// A subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// State file.
    #[error(transparent)]
    State(#[from] StateFileError),
    /// Control API.
    #[error(transparent)]
    Client(#[from] client::ClientError),
    /// Bringing the VPC up.
    #[error(transparent)]
    Up(#[from] up::UpError),
    /// A bad `key=value`.
    #[error(transparent)]
    Knob(#[from] knobs::KnobError),
    /// Unknown node.
    #[error("no node {0} (use an index, an instance id or a namespace name)")]
    NoNode(String),
    /// `down` could not stop the run.
    #[error("run {run_id} (pid {pid}) did not stop")]
    StillRunning {
        /// run
        run_id: String,
        /// pid
        pid: u32,
    },
}

/// Run the parsed command; prints its results on stdout.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let dir = cli.state_dir;
    match cli.command {
        Command::Up(args) => up::up(args, &dir).await.map_err(CliError::from),
        Command::Down => tokio::task::spawn_blocking(move || down(&dir))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())),
        Command::Env { node, exec } => {
            let st = RunState::read(&dir)?;
            let n = st
                .node(&node)
                .ok_or_else(|| CliError::NoNode(node.clone()))?;
            let env = node_env(&st, n);
            if exec {
                let pairs: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!("ip netns exec {} env {}", n.netns, pairs.join(" "));
            } else {
                for (k, v) in env {
                    println!("export {k}={v}");
                }
                println!("# run inside the node: ip netns exec {} <command>", n.netns);
            }
            Ok(())
        }
        Command::Dump => {
            let st = RunState::read(&dir)?;
            let body =
                blocking(move || client::call(st.control_api, "GET", "/state", None)).await?;
            println!("{}", knobs::pretty(&body));
            Ok(())
        }
        Command::Knobs { action } => {
            let st = RunState::read(&dir)?;
            let body = match action {
                KnobsAction::Get => {
                    blocking(move || client::call(st.control_api, "GET", "/knobs", None)).await?
                }
                KnobsAction::Set { settings } => {
                    let patch = knobs::patch(&settings)?.to_string();
                    blocking(move || client::call(st.control_api, "PUT", "/knobs", Some(&patch)))
                        .await?
                }
            };
            println!("{}", knobs::pretty(&body));
            Ok(())
        }
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

fn down(dir: &std::path::Path) -> Result<(), CliError> {
    match RunState::read(dir) {
        Ok(st) => {
            if crate::fabric::netns::run_is_live(&st.run_id) {
                if let Ok(pid) = i32::try_from(st.pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
                let deadline = Instant::now() + Duration::from_secs(20);
                while crate::fabric::netns::run_is_live(&st.run_id) {
                    if Instant::now() > deadline {
                        return Err(CliError::StillRunning {
                            run_id: st.run_id,
                            pid: st.pid,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            let _ = std::fs::remove_file(state::path_in(dir));
        }
        Err(StateFileError::Missing(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let removed = crate::fabric::netns::remove_stale_runs();
    for ns in removed {
        println!("removed leftover namespace {ns}");
    }
    Ok(())
}
