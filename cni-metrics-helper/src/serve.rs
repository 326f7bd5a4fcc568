//! USE_PROMETHEUS: serves the last round's aggregate as Prometheus text on :61681, under
//! the awscni_* family names (upstream `producePrometheusMetrics` sets gauges only). Owns
//! the rendering and the tiny HTTP server; nothing else.

use std::sync::{Arc, Mutex};

use crate::aggregate::Datum;

/// The last published round, shared with the HTTP handler (std lock, never held across await).
pub type Latest = Arc<Mutex<Vec<Datum>>>;

/// Renders gauges only, as upstream, one `# TYPE` line each.
pub fn render(latest: &[Datum]) -> String {
    let mut out = String::new();
    for d in latest {
        if d.gauge {
            out.push_str(&format!(
                "# TYPE {} gauge\n{} {}\n",
                d.prometheus, d.prometheus, d.value
            ));
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
        let text = render(&[
            d("awscni_eni_max", 7.0, true),
            d("awscni_add_ip_req_count", 3.0, false),
        ]);
        assert_eq!(text, "# TYPE awscni_eni_max gauge\nawscni_eni_max 7\n");
    }
}
