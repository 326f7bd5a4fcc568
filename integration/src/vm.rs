//! Tests on a real kernel with what this machine's kernel lacks (802.1Q vlan, dummy, ipvlan,
//! ipip): [`in_vm`] re-runs the calling test inside a throwaway VM on Debian's cloud kernel
//! through `integration/vm/run.sh` (qemu with TCG, this machine's root shared read-only under a
//! RAM overlay, no NIC), and [`Vm`] runs any command there. Must not: touch this machine's
//! network or files (the VM's writes stay in its RAM), or skip silently in CI.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set (to `1`) in the environment of a command the VM runs.
pub const IN_VM_ENV: &str = "AWS_VPC_CNI_IN_VM";

/// Exit status of `run.sh` when qemu, virtiofsd or the kernel is missing.
const UNAVAILABLE: i32 = 77;

/// The harness script.
#[must_use]
pub fn script() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/vm/run.sh"))
}

/// Whether this process runs inside the test VM.
#[must_use]
pub fn inside() -> bool {
    std::env::var_os(IN_VM_ENV).is_some_and(|v| v == "1")
}

/// What a command in the VM did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmOutcome {
    /// The command's exit status (124: the VM timed out; 125: the VM did not run it).
    pub exit_code: i32,
    /// Its stdout and stderr (one stream), then the harness's own messages.
    pub output: String,
    /// Wall time from the start of the harness to the VM's stop.
    pub elapsed: Duration,
}

/// Why a command could not be run in a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// qemu, virtiofsd, a static busybox or the kernel is missing (the message names them).
    #[error("vm unavailable: {0}")]
    Unavailable(String),
    /// The harness itself could not be started.
    #[error("start {script}")]
    Spawn {
        /// The script's path.
        script: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A VM run: the modules to load, its size and the command's environment.
#[derive(Debug, Clone)]
pub struct Vm {
    modules: Vec<String>,
    mem_mib: u32,
    cpus: u32,
    timeout: Duration,
    env: Vec<(String, String)>,
}

impl Default for Vm {
    fn default() -> Self {
        Self {
            modules: Vec::new(),
            mem_mib: 1024,
            cpus: 2,
            timeout: Duration::from_secs(600),
            env: Vec::new(),
        }
    }
}

impl Vm {
    /// A VM with 1 GiB, 2 vCPUs, a 10-minute limit and no extra module.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Kernel modules loaded (with their dependencies) before the command runs.
    #[must_use]
    pub fn modules(mut self, modules: &[&str]) -> Self {
        self.modules.extend(modules.iter().map(|m| (*m).to_owned()));
        self
    }

    /// An environment variable of the command.
    #[must_use]
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The VM's time limit (the harness stops it after that).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs `program args` in a fresh VM (working directory: this process's) and waits.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<VmOutcome, VmError> {
        let script = script();
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .args(["--mem", &self.mem_mib.to_string()])
            .args(["--cpus", &self.cpus.to_string()])
            .args(["--timeout", &self.timeout.as_secs().to_string()])
            .args(["--modules", &self.modules.join(",")])
            .args(["--env", &format!("{IN_VM_ENV}=1")]);
        for (k, v) in &self.env {
            cmd.args(["--env", &format!("{k}={v}")]);
        }
        cmd.arg("--").arg(program).args(args);
        let start = Instant::now();
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|source| VmError::Spawn {
                script: script.clone(),
                source,
            })?;
        let exit_code = out.status.code().unwrap_or(-1);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if exit_code == UNAVAILABLE {
            return Err(VmError::Unavailable(stderr.trim().to_owned()));
        }
        let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
        output.push_str(&stderr);
        Ok(VmOutcome {
            exit_code,
            output,
            elapsed: start.elapsed(),
        })
    }
}

/// Runs every test under `module` (its path in this test binary, ending in `::`, e.g.
/// `"sgp_branch_vm::vm::inside::"`) one after the other in one fresh VM that loaded `modules`,
/// and panics when one failed. The tests there are `#[ignore]`d, so the host's own run lists
/// but skips them, and each begins with [`assert_inside`]; this host-side test runs them with
/// `--ignored`. One boot and one load of the test binary serve them all (each VM start costs
/// ~7 CPU-seconds under TCG before a test runs). `prepare` runs outside first (e.g.
/// [`crate::binaries::built_binary`] lookups, which may build); `timeout` bounds the whole VM.
/// Without qemu or the kernel the test prints why and returns, except in CI (`CI` set), where
/// it fails: CI installs them (`integration/test.sh`).
pub fn in_one_vm(module: &str, modules: &[&str], timeout: Duration, prepare: impl FnOnce()) {
    assert!(
        !inside(),
        "{module}: the host-side test of a VM group ran inside the VM"
    );
    if !crate::can_run_kernel_tests() {
        return;
    }
    prepare();
    let exe = std::env::current_exe().expect("current test binary");
    let listed = Command::new(&exe)
        .args([module, "--ignored", "--list", "--format", "terse"])
        .stdin(Stdio::null())
        .output()
        .expect("list the group's tests");
    let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .filter(|n| n.starts_with(module))
        .map(str::to_owned)
        .collect();
    assert!(
        !names.is_empty(),
        "{module}: no ignored test to run in the VM ({})",
        String::from_utf8_lossy(&listed.stderr)
    );
    let exe = exe.to_string_lossy().into_owned();
    let mut vm = Vm::new()
        .modules(modules)
        .timeout(timeout)
        .env("RUST_BACKTRACE", "1")
        .env("TMPDIR", "/tmp");
    // The tools the test finds here (e.g. the python with the chart renderer the Kubernetes
    // simulator needs), found there too.
    if let Ok(path) = std::env::var("PATH") {
        vm = vm.env("PATH", &path);
    }
    match vm.run(
        &exe,
        &[module, "--ignored", "--nocapture", "--test-threads=1"],
    ) {
        Err(VmError::Unavailable(why)) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIP {module}: needs the test VM ({why}); integration/test.sh installs it");
        }
        Err(e) => panic!("{module}: {e}"),
        Ok(out) => {
            eprintln!(
                "--- {module} ({} tests) in the VM ({:.1} s) ---\n{}--- end of VM output ---",
                names.len(),
                out.elapsed.as_secs_f64(),
                out.output
            );
            assert_eq!(out.exit_code, 0, "{module} failed in the VM (output above)");
            let passed = format!("test result: ok. {} passed", names.len());
            assert!(
                out.output.contains(&passed),
                "{module}: not all of {names:?} passed in the VM (output above)"
            );
        }
    }
}

/// Panics unless this process runs inside the test VM: the first line of every test
/// [`in_one_vm`] runs (`--ignored` on the host would otherwise run it without the kernel
/// modules it needs).
pub fn assert_inside() {
    assert!(
        inside(),
        "this test runs inside the test VM only: run its module's host-side test (integration::vm::in_one_vm)"
    );
}
