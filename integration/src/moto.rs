//! moto's server (PyPI `moto[server]`, installed by integration/test.sh) as a child process on a
//! free loopback port: the third-party EC2/CloudWatch implementation the tests cross-check
//! against, and the CloudWatch reader the metrics-helper suites read published metrics back
//! with ([`MotoServer::cloudwatch_reader`], [`metric_values`]). Owns only that child; kills it
//! (by its own handle) on drop, also on panic.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `moto_server` on `127.0.0.1`.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its port.
    pub port: u16,
}

impl MotoServer {
    /// Starts `moto_server` and waits (up to 30 s) until it accepts connections.
    ///
    /// # Errors
    /// When `moto_server` is not on PATH, exits, or does not listen in time.
    pub fn start() -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("moto_server could not be started ({e}); integration/test.sh installs moto[server]")
            })?;
        let mut moto = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(moto);
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!("moto_server exited before listening: {status}"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "moto_server did not listen on port {port} within 30 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl MotoServer {
    /// A CloudWatch client for this server (region us-west-2, moto's `testing` credentials)
    /// over `http` (the project's AWS HTTP client,
    /// `cni_metrics_helper::cloudwatch::http_client()`).
    pub async fn cloudwatch_reader(
        &self,
        http: aws_sdk_cloudwatch::config::SharedHttpClient,
    ) -> aws_sdk_cloudwatch::Client {
        let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http)
            .region(aws_config::Region::new("us-west-2"))
            .endpoint_url(&self.url)
            .credentials_provider(aws_sdk_cloudwatch::config::Credentials::new(
                "testing", "testing", None, None, "static",
            ))
            .load()
            .await;
        aws_sdk_cloudwatch::Client::new(&conf)
    }
}

/// One metric (`namespace`/`name`, dimension `CLUSTER_ID=cluster`) read back with
/// GetMetricData: statistic `stat` per 60 s period over the last and next ten minutes, one
/// value per period that has data (empty when none).
///
/// # Errors
/// The GetMetricData call failed.
pub async fn metric_values(
    cw: &aws_sdk_cloudwatch::Client,
    namespace: &str,
    cluster: &str,
    name: &str,
    stat: &str,
) -> Result<Vec<f64>, String> {
    use aws_sdk_cloudwatch::primitives::DateTime;
    use aws_sdk_cloudwatch::types::{Dimension, Metric, MetricDataQuery, MetricStat};
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
    )
    .unwrap_or(i64::MAX);
    let metric = Metric::builder()
        .namespace(namespace)
        .metric_name(name)
        .dimensions(
            Dimension::builder()
                .name("CLUSTER_ID")
                .value(cluster)
                .build(),
        )
        .build();
    let out = cw
        .get_metric_data()
        .metric_data_queries(
            MetricDataQuery::builder()
                .id("m0")
                .metric_stat(
                    MetricStat::builder()
                        .metric(metric)
                        .period(60)
                        .stat(stat)
                        .build(),
                )
                .build(),
        )
        .start_time(DateTime::from_secs(now - 600))
        .end_time(DateTime::from_secs(now + 600))
        .send()
        .await
        .map_err(|e| format!("GetMetricData {name}: {e:?}"))?;
    Ok(out
        .metric_data_results()
        .first()
        .map(|r| r.values().to_vec())
        .unwrap_or_default())
}
