//! The chart's alert rules and Grafana dashboard (issue 29 item 3), checked by real tools:
//! `promtool check rules` and `promtool test rules` (every alert fires on trouble and stays
//! silent on its healthy neighbour), every dashboard query parsed by promtool (as recording
//! rules), the chart rendered by real Helm with the PrometheusRule and dashboard values, each
//! alert's runbook section present in docs/operations.md, and every metric the rules and the
//! dashboard name exported by ipamd's `/metrics` (or named as another exporter's). No root.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rules_file() -> PathBuf {
    repo().join("charts/aws-vpc-cni/files/prometheus-rules.yaml")
}

fn dashboard() -> Value {
    let text =
        std::fs::read_to_string(repo().join("charts/aws-vpc-cni/files/grafana-dashboard.json"))
            .expect("dashboard file");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs promtool (Debian's `prometheus` package; integration/test.sh installs it).
fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool must be installed (integration/test.sh installs Debian's prometheus)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn alerts(rules: &Value) -> Vec<(String, String)> {
    rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| {
            Some((
                r["alert"].as_str()?.to_owned(),
                r["expr"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

#[test]
fn alert_rules_pass_promtool_and_each_alert_is_tested_firing_and_silent() {
    let rules = rules_file();
    let (ok, out) = promtool(&["check", "rules", rules.to_str().unwrap()]);
    assert!(ok && out.contains("SUCCESS"), "{out}");
    let tests = repo().join("integration/chart/prometheus-rules-test.yaml");
    let (ok, out) = promtool(&["test", "rules", tests.to_str().unwrap()]);
    assert!(ok && out.contains("SUCCESS"), "promtool test rules:\n{out}");

    // Every alert has a case where it fires and one where it is silent.
    let names: BTreeSet<String> = alerts(&yaml_file(&rules))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names.len(), 9, "{names:?}");
    let cases = yaml_file(&tests);
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for t in cases["tests"].as_array().expect("tests") {
        for a in t["alert_rule_test"].as_array().into_iter().flatten() {
            let name = a["alertname"].as_str().unwrap_or_default().to_owned();
            if a["exp_alerts"].as_array().is_some_and(|v| !v.is_empty()) {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    assert_eq!(fires, names, "alerts without a firing case");
    assert_eq!(silent, names, "alerts without a silent case");

    // Each alert's runbook section exists in docs/operations.md.
    let ops =
        std::fs::read_to_string(repo().join("docs/operations.md")).expect("docs/operations.md");
    for n in &names {
        assert!(
            ops.contains(&format!("\n### {n}\n")),
            "docs/operations.md has no section for {n}"
        );
    }
}

#[test]
fn the_charts_prometheus_rule_carries_the_rules_with_the_configured_horizon() {
    let rendered = kubesim::chart::render_chart(&json!({
        "prometheusRule": {"create": true, "exhaustionHours": 2, "podSetupP99Seconds": 0.5, "labels": {"release": "prom"}},
    }))
    .expect("helm render");
    let rule = kubesim::chart::documents_of_kind(&rendered, "PrometheusRule")
        .pop()
        .expect("a PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "prom");
    let groups = json!({"groups": rule["spec"]["groups"]});
    let from_chart = alerts(&groups);
    let from_file = alerts(&yaml_file(&rules_file()));
    assert_eq!(from_chart.len(), from_file.len());
    for ((n1, e1), (n2, e2)) in from_chart.iter().zip(&from_file) {
        assert_eq!(n1, n2);
        assert_eq!(
            e1,
            &e2.replace("(6 * 3600)", "(2 * 3600)")
                .replace("(0.2 * 5)", "(0.5)"),
            "{n1}"
        );
    }
    assert!(from_chart.iter().any(|(_, e)| e.contains("(2 * 3600)")));
    assert!(from_chart.iter().any(|(_, e)| e.contains("> (0.5)")));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rendered-rules.yaml");
    std::fs::write(&path, serde_yaml::to_string(&groups).unwrap()).unwrap();
    let (ok, out) = promtool(&["check", "rules", path.to_str().unwrap()]);
    assert!(ok && out.contains("SUCCESS: 9 rules found"), "{out}");
    // off by default; a horizon below an hour is refused
    let default = kubesim::chart::render_chart(&json!({})).expect("helm render");
    assert!(kubesim::chart::documents_of_kind(&default, "PrometheusRule").is_empty());
    assert!(
        kubesim::chart::documents_of_kind(&default, "ConfigMap")
            .iter()
            .all(|c| c["data"].get("aws-vpc-cni.json").is_none())
    );
    let refused = kubesim::chart::render_chart(&json!({
        "prometheusRule": {"create": true, "exhaustionHours": 0},
    }));
    assert!(refused.is_err(), "exhaustionHours 0 rendered");
    for bad in [0.0, 150.0] {
        let refused = kubesim::chart::render_chart(&json!({
            "prometheusRule": {"create": true, "podSetupP99Seconds": bad},
        }));
        assert!(refused.is_err(), "podSetupP99Seconds {bad} rendered");
    }
}

fn dashboard_queries(d: &Value) -> Vec<String> {
    d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("expr").to_owned())
        .collect()
}

#[test]
fn every_dashboard_query_parses_and_the_chart_ships_the_dashboard() {
    let d = dashboard();
    let exprs = dashboard_queries(&d);
    assert!(exprs.len() >= 10, "{exprs:?}");
    // Panels the issue asks for, by what they query.
    for needle in [
        "awscni_assigned_ip_addresses",
        "awscni_add_failures_total",
        "awscni_ec2api_req_count",
        "awscni_subnet_available_ip_addresses",
        "awscni_subnet_free_prefix_blocks",
        "awscni_subnet_exhaustion_seconds",
        "awscni_subnet_prefix_exhaustion_seconds",
        "awscni_add_network_duration_seconds_bucket",
        "awscni_pod_network_setup_seconds_bucket{phase=~\"plugin_total|",
        "awscni_pod_network_setup_seconds_bucket{phase=~\"address_wait|ec2_call\"}",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(needle)),
            "no panel queries {needle}"
        );
    }
    // promtool parses each as a recording rule's expression.
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"record": format!("dashboard:query_{i}"), "expr": e}))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dashboard-queries.yaml");
    std::fs::write(
        &path,
        serde_yaml::to_string(&json!({"groups": [{"name": "dashboard", "rules": rules}]})).unwrap(),
    )
    .unwrap();
    let (ok, out) = promtool(&["check", "rules", path.to_str().unwrap()]);
    assert!(
        ok && out.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{out}"
    );
    // A broken query is caught (the check can fail).
    std::fs::write(
        &path,
        "groups: [{name: d, rules: [{record: 'x:y', expr: 'sum by (reason (rate(awscni_add_failures_total[5m]))'}]}]\n",
    )
    .unwrap();
    assert!(!promtool(&["check", "rules", path.to_str().unwrap()]).0);

    let rendered = kubesim::chart::render_chart(&json!({
        "dashboard": {"create": true, "namespace": "monitoring"},
    }))
    .expect("helm render");
    let cm = kubesim::chart::documents_of_kind(&rendered, "ConfigMap")
        .into_iter()
        .find(|c| c["data"].get("aws-vpc-cni.json").is_some())
        .expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value =
        serde_json::from_str(cm["data"]["aws-vpc-cni.json"].as_str().unwrap()).expect("JSON");
    assert_eq!(shipped, d);
}

/// PromQL words that are not metric names.
const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "topk",
    "bottomk",
    "quantile",
    "inf",
    "nan",
];

/// Metric names in a PromQL expression: identifiers outside strings, label matchers, ranges
/// and grouping clauses that are no function call (not followed by `(`) and no keyword.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut cleaned = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut in_str = false;
    for c in expr.chars() {
        match c {
            '"' => in_str = !in_str,
            _ if in_str => {}
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            _ => cleaned.push(c),
        }
        if matches!(c, '{' | '[' | '"') && !in_str {
            cleaned.push(' ');
        }
    }
    // grouping clauses: `by (a, b)`, `without (...)`, `on (...)`, `ignoring (...)`
    let mut out = BTreeSet::new();
    let chars: Vec<char> = cleaned.chars().collect();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() || c == '.' {
            // a number (1e-9, 0.99): not a name
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            if skip_group {
                continue;
            }
            if matches!(
                word.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            ) {
                skip_group = next == Some(&'(');
                continue;
            }
            if next == Some(&'(') || PROMQL_WORDS.contains(&word.as_str()) {
                continue;
            }
            out.insert(word);
        } else {
            if skip_group && c == ')' {
                skip_group = false;
            }
            i += 1;
        }
    }
    out
}

/// Metrics the rules use that no ipamd serves, with their exporter (docs/operations.md).
const OTHER_EXPORTERS: &[(&str, &str)] = &[
    ("up", "Prometheus (the scrape of aws-node's metrics port)"),
    ("kube_pod_container_status_ready", "kube-state-metrics"),
];

#[test]
fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    assert_eq!(
        metric_names(
            r#"sum by (reason) (increase(awscni_add_failures_total{reason!="x"}[10m])) >= 3 or up{a="b"} == 0"#
        ),
        ["awscni_add_failures_total", "up"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    // Every family ipamd declares (an empty one is not rendered, so the registry is asked),
    // with the series names its type adds, and the process families of its /metrics.
    let metrics = ipamd::metrics::Metrics::new();
    let mut exported = BTreeSet::new();
    for f in metrics.families() {
        let snap = f.snapshot();
        let name = snap.name.to_owned();
        let suffixes: &[&str] = match snap.kind {
            ipamd::metrics::Kind::Histogram => &["_bucket", "_sum", "_count"],
            ipamd::metrics::Kind::Summary => &["_sum", "_count"],
            _ => &[],
        };
        for s in suffixes {
            exported.insert(format!("{name}{s}"));
        }
        exported.insert(name);
    }
    let mut text = String::new();
    ipamd::http::process::render(&mut text);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            exported.insert(rest.split_whitespace().next().unwrap().to_owned());
        }
    }
    // cni-metrics-helper's subnet inventory families (the forecasts the rules alert on).
    let helper: BTreeSet<String> = cni_metrics_helper::serve::SUBNET_FAMILIES
        .iter()
        .map(|(name, _, _)| (*name).to_owned())
        .collect();
    assert!(
        helper.contains("awscni_subnet_exhaustion_seconds"),
        "{helper:?}"
    );
    assert!(
        exported.contains("process_resident_memory_bytes"),
        "{exported:?}"
    );
    let mut used = BTreeSet::new();
    for (_, e) in alerts(&yaml_file(&rules_file())) {
        used.extend(metric_names(&e));
    }
    for e in dashboard_queries(&dashboard()) {
        used.extend(metric_names(&e));
    }
    assert!(used.len() >= 10, "{used:?}");
    let unknown: Vec<&String> = used
        .iter()
        .filter(|m| {
            !exported.contains(*m)
                && !helper.contains(*m)
                && !OTHER_EXPORTERS.iter().any(|(n, _)| n == m)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "not exported by ipamd or cni-metrics-helper: {unknown:?}"
    );
    // The helper's families the rules and the dashboard use are documented with their exporter.
    let ops = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let from_helper: Vec<&String> = used.iter().filter(|m| helper.contains(*m)).collect();
    assert!(from_helper.len() >= 4, "{from_helper:?}");
    for m in from_helper {
        assert!(
            ops.contains(m.as_str()),
            "docs/operations.md does not name {m}"
        );
    }
    for (name, exporter) in OTHER_EXPORTERS {
        assert!(
            ops.contains(name) && ops.contains(exporter.split(' ').next().unwrap()),
            "{name}"
        );
    }
}
