//! Issue 28: a deterministic whole-daemon simulation that searches for address-safety bugs.
//! The real ipamd core (restore, checkpoint, gRPC backend, pool manager, reconciler,
//! reclaim's decision) on an eventually consistent in-memory EC2/IMDS, with crashes, rolling
//! updates, host perturbations and another node on the subnet, every step checked against
//! the harness's ground truth. docs/testing.md ("Whole-daemon simulation") says how to run
//! more seeds and replay one.
#![allow(clippy::tests_outside_test_module)]

#[path = "simulation/mod.rs"]
mod sim;

use std::time::Duration;

use sim::{Profile, env_u64};

/// Default CI budget: seeds from 1 on for this long (at least `MIN_SEEDS`).
const CI_SECONDS: u64 = 15;
const MIN_SEEDS: u64 = 4;

/// `SIM_PROFILE` (default `all`); `SIM_LOCK=0|1` turns the node lock off or on in it.
fn profile() -> Profile {
    let mut p = std::env::var("SIM_PROFILE")
        .ok()
        .map(|p| Profile::named(&p).unwrap_or_else(|| panic!("unknown SIM_PROFILE {p}")))
        .unwrap_or(Profile::ALL);
    if let Some(lock) = env_u64("SIM_LOCK") {
        p.lock = lock != 0;
    }
    p
}

/// Runs the budget (or `SIM_SEED` alone, or `SIM_SEEDS`) of `profile`; a failure panics with
/// the seed and its shrunk trace.
fn check(profile: Profile) {
    let shrink_secs = env_u64("SIM_SHRINK_SECS").unwrap_or(60);
    if std::env::var_os("SIM_LIST").is_some() {
        // Every failing seed of the range, one line each (no shrinking): a survey.
        let first = env_u64("SIM_FIRST_SEED").unwrap_or(1);
        let n = env_u64("SIM_SEEDS").unwrap_or(100);
        let mut failed = 0;
        for seed in first..first + n {
            let (cfg, out) = sim::run_seed(seed, profile);
            if let Some(v) = out.violation {
                failed += 1;
                eprintln!(
                    "seed {seed} ({:?}, {} steps): {}: {}",
                    cfg.daemon.mode, out.steps, v.kind, v.detail
                );
            }
        }
        assert_eq!(failed, 0, "{failed} of {n} seeds failed");
        return;
    }
    let result = if let Some(seed) = env_u64("SIM_SEED") {
        if std::env::var_os("SIM_TRACE").is_some() {
            let (cfg, out) = sim::run_seed(seed, profile);
            eprintln!("{}", cfg.describe());
            for l in &out.trace {
                eprintln!("  {l}");
            }
            eprintln!("=> {:?} after {} steps", out.violation, out.steps);
        }
        sim::search(profile, seed, 1, 1, None)
    } else if let Some(n) = env_u64("SIM_SEEDS") {
        sim::search(profile, env_u64("SIM_FIRST_SEED").unwrap_or(1), n, n, None)
    } else {
        let secs = env_u64("SIM_SECS").unwrap_or(CI_SECONDS);
        sim::search(
            profile,
            1,
            u64::MAX / 2,
            MIN_SEEDS,
            Some(Duration::from_secs(secs)),
        )
    };
    eprintln!(
        "simulation {}: {} seed(s) in {:.1}s",
        profile.name,
        result.seeds_run,
        result.elapsed.as_secs_f64()
    );
    if let Some((cfg, out)) = result.failure {
        let shrunk = sim::shrink(&cfg, &out, Duration::from_secs(shrink_secs));
        panic!("{}", sim::report(&cfg, &out, &shrunk));
    }
}

#[test]
fn simulation_keeps_the_invariant() {
    check(profile());
}

/// The node lock is what keeps two instances of a `maxSurge` rollout (or a restarted old
/// container beside the new pod) from managing one node at once: with the harness's lock knob
/// off (the behaviour before issue 28 finding 3's fix: a new instance waits only until the
/// old one stops accepting), the search finds an address a live pod uses that the serving
/// instance does not hold or EC2 no longer assigns. Seed 120 is the first of 300 that did when
/// this test was written (4 of 300 did); the search goes on if a change moves it.
#[test]
fn without_the_node_lock_overlapping_instances_break_the_invariant() {
    let result = sim::search(Profile::NO_LOCK, 120, 400, 1, None);
    let (cfg, out) = result
        .failure
        .expect("without the node lock the simulation finds a violation");
    let v = out.violation.expect("violation");
    eprintln!(
        "no node lock: seed {} ({} seeds searched): {}: {}",
        cfg.seed, result.seeds_run, v.kind, v.detail
    );
}

/// A seed is a run: the same seed gives the same trace, choice for choice (what makes a
/// failing seed replayable and a tape shrinkable).
#[test]
fn a_seed_replays_the_same_run() {
    for seed in [3, 8] {
        let (_, a) = sim::run_seed(seed, Profile::ALL);
        let (_, b) = sim::run_seed(seed, Profile::ALL);
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.tape, b.tape, "seed {seed}");
        assert_eq!(a.violation, b.violation, "seed {seed}");
    }
}

/// Found by this simulation (not one of issue 28's findings 1-3; liveness, not address
/// safety, hence the opt-in check `SIM_LIVENESS` it turns on): a reconcile round whose IMDS
/// hint and Describe both lagged behind the pool manager's own AssignPrivateIpAddresses of a
/// moment before dropped the addresses just assigned (free, and absent from the lagging view).
/// The pool then believed the ENI had free slots, asked EC2 for them again every pass, EC2
/// refused (`PrivateIpAddressLimitExceeded`), and waiting pods failed with INSTANCE_LIMIT
/// until a later round re-added the addresses. The same shape after a SIGKILL between EC2's
/// assign and its record, and across a restart (a release recorded beside the checkpoint kept
/// an address out of the pool although a later Assign gave it back). Seed 67 of profile
/// `all` (`SIM_LIVENESS=30 SIM_SEED=67`), before the fix:
///
/// ```text
/// #7  t=1s  ipamd#1 pool loop: EC2 Assign eni-primary Ips(9): applied
/// #7  t=1s  ipamd#1 pool loop: EC2 Describe answered from a view 1 change(s) old (before: Assign eni-primary Ips(9))
/// #7  t=1s  ipamd#1 reconcile: drop eni-primary:[198.18.0.7] … eni-primary:[198.18.0.15]
/// #7  t=2s  ipamd#1 pool loop: EC2 Assign eni-primary Ips(9): refused: eni address limit reached
/// #16 t=25s (the line above 22 more time(s), until now)
/// => liveness: EC2 refused the pool's address assignments 30 times in a row
/// ```
///
/// Fixed by reconcile rule 7 (what the manager added is not removed on a view's absence for
/// `ADDITION_SETTLE`; an assign ends an earlier release's cooldown, also in the side file) and
/// by the refusal recheck (EC2 refusing an assign the datastore thought had room asks EC2 at
/// once, past the hint, at most every `REFUSAL_RECHECK`).
#[test]
fn a_describe_lagging_behind_the_pools_own_assign_does_not_starve_the_pool() {
    let mut cfg = sim::RunConfig::from_seed(67, Profile::ALL);
    cfg.liveness_refusals = 30;
    // As it ran when found: the later draws off. (With them, seed 67 garbles a side file,
    // and the start that cannot read its release log holds every free address out of the
    // pool while EC2 still counts them: refusals for the cooldown, the price of safety.)
    cfg.daemon.pod_eni = false;
    cfg.branch_pod_per_mille = 0;
    cfg.side_loss_per_mille = 0;
    let out = sim::run_config(&cfg);
    if let Some(v) = &out.violation {
        let tail = out.trace[out.trace.len().saturating_sub(30)..].join("\n");
        panic!("{}: {}\n{tail}", v.kind, v.detail);
    }
}

/// Found by this simulation once it modelled two-card nodes (issue 38): seed 542 of profile
/// `all` (two cards, `IP_COOLDOWN_PERIOD=0`): a multi-NIC pod's card-1 address was restored
/// into card 0's pool as pending (card 1's file garbage, the start-up Describe one assign
/// behind, so the host evidence lay in no pool's CIDR); the reconciler then added the address
/// to card 1's pool as free and the pool loop unassigned it in EC2 while the pod used it. Fixed
/// by `Core::settle_pending` (a pending entry follows its address to the pool whose CIDRs
/// hold it, under the same lock). Seed 408 (prefixes): a multi-NIC pod whose card-0 entry was
/// recovered under its veth's key after `ipam.json` was lost, and whose card-1 route was gone,
/// was released by reclaim although its card-1 veth lived: reclaim now counts every
/// interface's host veth of a multi-NIC pod (`interfacesCount`).
#[test]
fn two_card_seeds_that_broke_the_invariant_keep_it() {
    for seed in [542, 408] {
        // As they ran when found: the draws added after them (security groups for pods, a
        // lost side file) off, so every earlier choice is the same.
        let mut cfg = sim::RunConfig::from_seed(seed, Profile::ALL);
        cfg.daemon.pod_eni = false;
        cfg.branch_pod_per_mille = 0;
        cfg.side_loss_per_mille = 0;
        let out = sim::run_config(&cfg);
        if let Some(v) = &out.violation {
            let tail = out.trace[out.trace.len().saturating_sub(30)..].join("\n");
            panic!("seed {seed}: {}: {}\n{tail}", v.kind, v.detail);
        }
    }
}

/// Found once the simulation could garble a side file at a start (issue 38): seeds 79 and 299
/// of profile `restarts`, 67 of `all`. ipamd released addresses (an Unassign EC2 applied
/// late), was killed, and the next instance could not read its release log; the start-up
/// Describe still listed them, so they went back into the pool and a pod got one EC2 had
/// released (seed 79: 198.18.0.13 "free in the subnet in EC2"). Fixed: a start whose release
/// log is unreadable takes every address and ENI no pod holds as released just now
/// (`RecentlyFreed::unknown_releases`), withdrawn before the socket serves and not put back by
/// a lagging view for the reconcile cooldown. That alone did not hold: seed 866 (the next
/// start's Describe was current, a later lagging one re-added an address the previous instance
/// had released) and 479 (a restart within the window whose start Describe lagged behind a
/// release two instances back). So the log also records that releases before the loss are
/// unknown (`releasesUnknownBefore`): for the cooldown after it every start withdraws what no
/// pod holds and the reconciler takes nothing the pool lacks from a view (`RecentChanges::blind`).
#[test]
fn seeds_with_an_unreadable_release_log_keep_the_invariant() {
    for (seed, profile) in [
        (79, Profile::RESTARTS),
        (299, Profile::RESTARTS),
        (67, Profile::ALL),
        (866, Profile::ALL),
        (479, Profile::ALL),
    ] {
        let out = sim::run_config(&sim::RunConfig::from_seed(seed, profile));
        if let Some(v) = &out.violation {
            let tail = out.trace[out.trace.len().saturating_sub(30)..].join("\n");
            panic!(
                "seed {seed} ({}): {}: {}\n{tail}",
                profile.name, v.kind, v.detail
            );
        }
    }
}
