//! USE_PROMETHEUS: serves the last round's aggregate as Prometheus text on :61681, under the
//! awscni_* family names (gauges only), and ours, the last subnet inventory
//! (`awscni_subnet_*{subnet}`). Owns the rendering and the tiny HTTP server; nothing else.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use crate::aggregate::Datum;
use crate::inventory::SubnetReport;

/// What the HTTP handler serves: the last metrics round and the last inventory.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub datums: Vec<Datum>,
    pub subnets: Vec<SubnetReport>,
}

/// The last published round, shared with the HTTP handler (std lock, never held across await).
pub type Latest = Arc<Mutex<Published>>;

/// The inventory families: name, help, value of one subnet (`None`: no series).
type SubnetFamily = (&'static str, &'static str, fn(&SubnetReport) -> Option<f64>);

/// Ours: the subnet inventory's families (gauges, one series per subnet).
pub const SUBNET_FAMILIES: [SubnetFamily; 6] = [
    (
        "awscni_subnet_free_ip_addresses",
        "Ours (cni-metrics-helper inventory): addresses EC2 can still hand out as secondary addresses in the subnet, counted from its ENIs and CIDR reservations",
        |s| Some(f64::from(s.figures.free_addresses)),
    ),
    (
        "awscni_subnet_free_prefix_blocks",
        "Ours (cni-metrics-helper inventory): aligned /28 blocks EC2 can still delegate as prefixes in the subnet",
        |s| Some(f64::from(s.figures.free_prefix_blocks)),
    ),
    (
        "awscni_subnet_ip_consumption_rate",
        "Ours (cni-metrics-helper inventory): free addresses consumed per second, least-squares over the forecast window (negative: freed)",
        |s| s.addresses.map(|f| f.consumption_per_sec),
    ),
    (
        "awscni_subnet_exhaustion_seconds",
        "Ours (cni-metrics-helper inventory): seconds until the subnet has no free address at the current consumption rate; absent while not consumed",
        |s| s.addresses.and_then(|f| f.exhaustion_secs),
    ),
    (
        "awscni_subnet_prefix_consumption_rate",
        "Ours (cni-metrics-helper inventory): free /28 blocks consumed per second over the forecast window",
        |s| s.prefix_blocks.map(|f| f.consumption_per_sec),
    ),
    (
        "awscni_subnet_prefix_exhaustion_seconds",
        "Ours (cni-metrics-helper inventory): seconds until the subnet has no free /28 block at the current rate; absent while not consumed",
        |s| s.prefix_blocks.and_then(|f| f.exhaustion_secs),
    ),
];

/// Renders the aggregate's gauges only, one `# TYPE` line each; then the inventory's families with
/// `subnet`, `cidr` and `availability_zone` labels.
pub fn render(latest: &Published) -> String {
    let mut out = String::new();
    for d in &latest.datums {
        if d.gauge {
            let _ = writeln!(
                out,
                "# TYPE {} gauge\n{} {}",
                d.prometheus, d.prometheus, d.value
            );
        }
    }
    for (name, help, value) in SUBNET_FAMILIES {
        let series: Vec<(&SubnetReport, f64)> = latest
            .subnets
            .iter()
            .filter_map(|s| Some((s, value(s)?)))
            .collect();
        if series.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (s, v) in series {
            let _ = writeln!(
                out,
                "{name}{{availability_zone=\"{}\",cidr=\"{}\",subnet=\"{}\"}} {v}",
                s.availability_zone, s.cidr, s.subnet_id
            );
        }
    }
    out
}

pub async fn serve(listener: tokio::net::TcpListener, latest: Latest) -> std::io::Result<()> {
    use axum::{Router, routing::get};
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let text = render(&latest.lock().unwrap());
            async move {
                (
                    [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    text,
                )
            }
        }),
    );
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_gauges_only() {
        let d = |p, v, gauge| Datum {
            cloudwatch: "x",
            prometheus: p,
            value: v,
            gauge,
        };
        let text = render(&Published {
            datums: vec![
                d("awscni_eni_max", 7.0, true),
                d("awscni_add_ip_req_count", 3.0, false),
            ],
            subnets: vec![],
        });
        assert_eq!(text, "# TYPE awscni_eni_max gauge\nawscni_eni_max 7\n");
    }

    #[test]
    fn renders_the_inventory_with_subnet_labels_and_no_forecast_while_not_consumed() {
        use crate::inventory::{Figures, Forecast, SubnetReport};
        let report = |id: &str, forecast: Option<Forecast>| SubnetReport {
            subnet_id: id.into(),
            cidr: "198.18.0.0/24".parse().unwrap(),
            availability_zone: "az1".into(),
            sources: Default::default(),
            ec2_available: 10,
            figures: Figures {
                free_addresses: 10,
                free_prefix_blocks: 2,
            },
            addresses: forecast,
            prefix_blocks: None,
        };
        let text = render(&Published {
            datums: vec![],
            subnets: vec![
                report(
                    "subnet-a",
                    Some(Forecast {
                        consumption_per_sec: 0.5,
                        exhaustion_secs: Some(20.0),
                    }),
                ),
                report("subnet-b", None),
            ],
        });
        assert!(text.contains(
            "awscni_subnet_free_prefix_blocks{availability_zone=\"az1\",cidr=\"198.18.0.0/24\",subnet=\"subnet-b\"} 2"
        ));
        assert!(text.contains("awscni_subnet_exhaustion_seconds{availability_zone=\"az1\",cidr=\"198.18.0.0/24\",subnet=\"subnet-a\"} 20"));
        assert!(!text.contains("subnet_exhaustion_seconds{availability_zone=\"az1\",cidr=\"198.18.0.0/24\",subnet=\"subnet-b\"}"));
        assert!(!text.contains("awscni_subnet_prefix_exhaustion_seconds"));
        // parses as the exposition format
        crate::exposition::parse(&text).unwrap();
    }
}
