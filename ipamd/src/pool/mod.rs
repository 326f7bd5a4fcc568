//! The warm pool's decisions and port: the pure policy, the pure reconcile plan, the EC2-shaped
//! provider port (implemented by `crate::aws`). Executed by `crate::pool::run`. Must not: know
//! `Ipam`, gRPC/HTTP or an adapter, do I/O (but through the provider port).

pub mod ec2_port;
pub mod host_port;
pub mod manager;
pub mod policy;
pub mod reconcile_plan;
pub mod reconciler;
pub mod run;
