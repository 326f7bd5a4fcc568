//! `demo bench`: the e2e benchmarks (empty-pool ADD latency against EC2 latency, EC2 calls per
//! pod and per idle node-hour); prints figures, asserts nothing. Must not touch the root
//! network namespace.

use super::*;

fn percentile(sorted: &[f64], percent: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) * percent)
        .div_ceil(100)
        .min(sorted.len() - 1)]
}

fn fmt_calls(calls: &std::collections::BTreeMap<String, u64>) -> String {
    calls
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn bench(
    args: &Args,
    latencies: &[u64],
    adds: usize,
    pods: usize,
    idle_seconds: u64,
    cancel: Arc<AtomicBool>,
) -> Result<(), String> {
    println!("== e2e benchmarks (figures only; nothing asserted) ==");
    // 1. empty-pool ADD latency: no background refill (pool tick 1 h), warm target of 1 IP, so
    //    an ADD that finds no free address triggers the immediate allocation
    let mut sim = start_sim(&args.instance_type, cancel.clone())?;
    start_ipamds(
        &mut sim,
        &[
            ("IPAMD_POOL_TICK_SECONDS", "3600"),
            ("WARM_ENI_TARGET", "0"),
            ("WARM_IP_TARGET", "1"),
        ],
    )?;
    println!(
        "\n-- empty-pool ADD latency vs simulated EC2 latency (target: <= EC2 latency + 50 ms) --"
    );
    println!(
        "  {:>8} {:>6} {:>12} {:>12} {:>12} {:>8}  calls in empty-pool ADDs",
        "EC2 ms", "adds", "empty p50", "empty max", "warm p50", "new ENI"
    );
    for (k, &lat) in latencies.iter().enumerate() {
        let node = usize::from(k * 2 >= latencies.len());
        sim.set_knobs(|kn| kn.latency_ms = lat);
        let (mut empty, mut warm, mut new_eni) = (Vec::new(), Vec::new(), 0);
        let mut calls_total = std::collections::BTreeMap::new();
        for a in 0..adds {
            if stopped() {
                return Err("interrupted".into());
            }
            let before = sim.calls.snapshot();
            let t = Instant::now();
            sim.add_pod(node, &format!("lat{lat}-{a}"))
                .map_err(|e| e.to_string())?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let d = call_delta(&before, &sim.calls.snapshot());
            if d.keys().any(|k| is_mutating(k)) {
                if d.contains_key("CreateNetworkInterface") {
                    new_eni += 1;
                } else {
                    empty.push(ms);
                }
                for (k, v) in d {
                    *calls_total.entry(k).or_insert(0) += v;
                }
            } else {
                warm.push(ms);
            }
        }
        empty.sort_by(f64::total_cmp);
        warm.sort_by(f64::total_cmp);
        println!(
            "  {lat:>8} {adds:>6} {:>10.1}ms {:>10.1}ms {:>10.1}ms {new_eni:>8}  {}",
            percentile(&empty, 50),
            empty.last().copied().unwrap_or(f64::NAN),
            percentile(&warm, 50),
            fmt_calls(&calls_total)
        );
    }
    drop(sim);

    // 2. EC2 calls per pod created / deleted and per idle node-hour (upstream defaults)
    let mut sim = start_sim(&args.instance_type, cancel)?;
    start_ipamds(&mut sim, &[])?;
    let settle = |what: &str, secs: u64| {
        step(&format!("{what}: settle {secs}s"), || {
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                if stopped() {
                    return Err("interrupted".to_owned());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(())
        })
    };
    settle("after start", 15)?;
    let s0 = sim.calls.snapshot();
    add_pods(&mut sim, pods)?;
    settle("after ADDs", 15)?;
    let s1 = sim.calls.snapshot();
    settle("idle nodes", idle_seconds)?;
    let s2 = sim.calls.snapshot();
    let all = sim.pods().to_vec();
    step(&format!("DEL {} pods", all.len()), || {
        for p in &all {
            sim.del_pod(p).map_err(|e| e.to_string())?;
        }
        Ok(())
    })?;
    settle("after DELs (ENI free needs 60 s)", 90)?;
    let s3 = sim.calls.snapshot();
    let n_pods = (pods * sim.nodes.len()) as f64;
    let per = |d: &std::collections::BTreeMap<String, u64>, mutating: bool| -> u64 {
        d.iter()
            .filter(|(k, _)| is_mutating(k) == mutating)
            .map(|(_, v)| v)
            .sum()
    };
    let created = call_delta(&s0, &s1);
    let idle = call_delta(&s1, &s2);
    let deleted = call_delta(&s2, &s3);
    println!("\n-- EC2 calls (both nodes; WARM_ENI_TARGET=1 defaults) --");
    println!(
        "  per pod created:  {:.2} mutating, {:.2} describe   [{}]",
        per(&created, true) as f64 / n_pods,
        per(&created, false) as f64 / n_pods,
        fmt_calls(&created)
    );
    println!(
        "  per pod deleted:  {:.2} mutating, {:.2} describe   [{}]",
        per(&deleted, true) as f64 / n_pods,
        per(&deleted, false) as f64 / n_pods,
        fmt_calls(&deleted)
    );
    let hours = idle_seconds as f64 / 3600.0 * sim.nodes.len() as f64;
    println!(
        "  per idle node-hour ({idle_seconds} s window x {} nodes): {:.1} mutating, {:.1} describe   [{}]  (target: 0 mutating, <= 12 describe)",
        sim.nodes.len(),
        per(&idle, true) as f64 / hours,
        per(&idle, false) as f64 / hours,
        fmt_calls(&idle)
    );
    let errors = sim.shutdown();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}
