//! cni-metrics-helper: scrape every aws-node's `/metrics` through the API server's pod proxy,
//! aggregate them across nodes, publish to CloudWatch and/or serve the aggregate as Prometheus
//! text. Pure decisions live in `exposition` and `aggregate`; `kube_pods`, `cloudwatch` and `serve`
//! are thin adapters; `main` only wires them.

pub mod aggregate;
pub mod cloudwatch;
pub mod cluster_id;
pub mod config;
pub mod exposition;
pub mod inventory;
pub mod kube_pods;
pub mod round;
pub mod serve;
