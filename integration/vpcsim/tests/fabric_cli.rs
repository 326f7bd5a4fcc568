//! The `vpcsim` binary end to end: `up` in the background, then `env`, `dump`, `knobs`,
//! reaching IMDS from inside the node with the printed environment, and `down` removing every
//! namespace. Needs root. A drop guard kills `up` (by pid) and removes its namespaces if the
//! test fails half-way.
#![allow(clippy::tests_outside_test_module)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_vpcsim");

struct Up {
    child: Child,
    dir: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = i32::try_from(self.child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // whatever a killed run left is stale now
        vpcsim::fabric::netns::remove_stale_runs();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn vpcsim(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .arg("--state-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn up_env_dump_knobs_down() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "fabric tests need root (network namespaces)"
    );
    let dir = std::env::temp_dir().join(format!("vpcsim-cli-{}", std::process::id()));
    let child = Command::new(BIN)
        .arg("--state-dir")
        .arg(&dir)
        .args([
            "up",
            "--nodes",
            "2",
            "--instance-type",
            "m5.large",
            "--ipv6",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut up = Up {
        child,
        dir: dir.clone(),
    };
    let state_file = dir.join("vpcsim.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !state_file.exists() {
        assert!(
            matches!(up.child.try_wait(), Ok(None)),
            "vpcsim up exited early"
        );
        assert!(
            Instant::now() < deadline,
            "vpcsim up did not publish its state"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_file).unwrap()).unwrap();
    let node_ns = state["nodes"][1]["netns"].as_str().unwrap().to_owned();
    let instance = state["nodes"][1]["instance_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // --ipv6: each node's eth0 has its primary ENI's IPv6 (in the state file) and reaches the
    // IPv6 internet host through the egress-only gateway
    let v6 = state["nodes"][1]["primary_ipv6"]
        .as_str()
        .unwrap()
        .to_owned();
    let host6 = state["internet_host6"].as_str().unwrap().to_owned();
    let addrs = Command::new("ip")
        .args(["-n", &node_ns, "-6", "addr", "show", "dev", "eth0"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&addrs.stdout).contains(&format!("{v6}/128")),
        "{}",
        String::from_utf8_lossy(&addrs.stdout)
    );
    let pinged = (0..3).any(|_| {
        Command::new("ip")
            .args([
                "netns", "exec", &node_ns, "busybox", "ping", "-6", "-c", "1", "-W", "1",
            ])
            .arg(&host6)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(pinged, "node 1 cannot ping6 the internet host {host6}");

    // env: export lines, and an exec prefix that works
    let (ok, env, err) = vpcsim(&dir, &["env", "1"]);
    assert!(ok, "{err}");
    assert!(
        env.contains("export AWS_ENDPOINT_URL_EC2=http://169.254.169.200:80"),
        "{env}"
    );
    assert!(
        env.contains("export AWS_EC2_METADATA_SERVICE_ENDPOINT=http://169.254.169.254:80"),
        "{env}"
    );
    assert!(
        env.contains(&format!("export VPCSIM_NETNS={node_ns}")),
        "{env}"
    );
    let (ok, prefix, err) = vpcsim(&dir, &["env", "--exec", &instance]);
    assert!(ok, "{err}");
    let mut words: Vec<String> = prefix.split_whitespace().map(str::to_owned).collect();
    words.extend(
        ["sh", "-c", "curl -sS -m 5 --fail -X PUT -H 'x-aws-ec2-metadata-token-ttl-seconds: 60' $AWS_EC2_METADATA_SERVICE_ENDPOINT/latest/api/token > /tmp/.t$$ && curl -sS -m 5 --fail -H \"x-aws-ec2-metadata-token: $(cat /tmp/.t$$)\" $AWS_EC2_METADATA_SERVICE_ENDPOINT/latest/meta-data/instance-id; rm -f /tmp/.t$$"]
            .map(str::to_owned),
    );
    let out = Command::new(&words[0]).args(&words[1..]).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        instance,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // dump: the EC2 state holds both instances
    let (ok, dump, err) = vpcsim(&dir, &["dump"]);
    assert!(ok, "{err}");
    assert!(dump.contains(&instance));

    // knobs: set, read back
    let (ok, _, err) = vpcsim(
        &dir,
        &[
            "knobs",
            "set",
            "attach_delay_ms=750",
            "throttle.enabled=true",
        ],
    );
    assert!(ok, "{err}");
    let (ok, knobs, err) = vpcsim(&dir, &["knobs", "get"]);
    assert!(ok, "{err}");
    let knobs: serde_json::Value = serde_json::from_str(&knobs).unwrap();
    assert_eq!(knobs["attach_delay_ms"], 750);
    assert_eq!(knobs["throttle"]["enabled"], true);
    let (ok, _, _) = vpcsim(&dir, &["knobs", "set", "nonsense"]);
    assert!(!ok);

    // down: the process ends and every namespace of the run is gone
    let (ok, _, err) = vpcsim(&dir, &["down"]);
    assert!(ok, "{err}");
    let status = up.child.wait().unwrap();
    assert!(status.success(), "vpcsim up exited with {status}");
    let prefix = format!("vsim{}-", state["run_id"].as_str().unwrap());
    let left: Vec<String> = vpcsim::fabric::observe::list_netns()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!state_file.exists());
    let (ok, _, err) = vpcsim(&dir, &["env", "0"]);
    assert!(!ok && err.contains("no vpcsim running"), "{err}");
}
