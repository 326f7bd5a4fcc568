//! End to end (root only): a CIDR block associated with the VPC while ipamd runs. Upstream
//! (v1.23.1 `pkg/ipamd/ipamd.go` `nodeInit` → `updateCIDRsRulesOnChange`, every 30 s) reads the
//! VPC's IPv4 blocks again and updates the host rules: traffic from pods to the new block is
//! no longer SNATed (a `RETURN` for it in `AWS-SNAT-CHAIN-0`) and the connmark treats it as
//! inside the VPC. Here the real ipamd on the simulated VPC, with the check every second
//! (`IPAMD_VPC_CIDR_CHECK_SECONDS=1`), must do the same.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{Sim, SimConfig, eventually, exec_in};

const READY: Duration = Duration::from_secs(60);
const NEW_BLOCK: &str = "100.64.0.0/16";

/// The node's nat table as `iptables-save` shows it.
fn nat_rules(sim: &Sim) -> String {
    let out = exec_in(&sim.nodes[0].netns, &["iptables-save", "-t", "nat"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the SNAT chain exempts `block`.
fn snat_exempts(sim: &Sim, block: &str) -> bool {
    nat_rules(sim).lines().any(|l| {
        l.starts_with("-A AWS-SNAT-CHAIN-0")
            && l.contains(&format!("-d {block}"))
            && l.contains("RETURN")
    })
}

#[test]
fn a_block_associated_with_the_vpc_while_ipamd_runs_is_exempt_from_snat() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    sim.start_ipamd(0, &[("IPAMD_VPC_CIDR_CHECK_SECONDS", "1")], READY)
        .expect("ipamd ready");
    eventually(Duration::from_secs(10), || {
        nat_rules(&sim)
            .contains("AWS-SNAT-CHAIN-0")
            .then_some(())
            .ok_or_else(|| nat_rules(&sim))
    })
    .expect("the SNAT chain");
    assert!(!snat_exempts(&sim, NEW_BLOCK), "{}", nat_rules(&sim));
    let block: ipnet::Ipv4Net = NEW_BLOCK.parse().unwrap();
    sim.world
        .mutate(|s, _| {
            s.vpc.secondary_cidrs.push(block);
            Ok(())
        })
        .expect("block associated");
    eventually(Duration::from_secs(20), || {
        snat_exempts(&sim, NEW_BLOCK)
            .then_some(())
            .ok_or_else(|| format!("{}\n{}", nat_rules(&sim), sim.ipamd_log_tail(0, 10)))
    })
    .expect("the new block is exempt from SNAT");
    // (the log line may reach the file a moment after the rules: the writer is asynchronous)
    eventually(Duration::from_secs(5), || {
        sim.ipamd_log_tail(0, 200)
            .contains("VPC CIDRs changed")
            .then_some(())
            .ok_or_else(|| sim.ipamd_log_tail(0, 20))
    })
    .expect("the change is logged");
    // The connmark on an nf_tables node (table ip aws-cni) treats it as inside the VPC too.
    let nft = exec_in(
        &sim.nodes[0].netns,
        &["nft", "list", "table", "ip", "aws-cni"],
    );
    if nft.status.success() {
        let text = String::from_utf8_lossy(&nft.stdout);
        assert!(text.contains("100.64.0.0"), "{text}");
    }
}
