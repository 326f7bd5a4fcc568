//! The warm pool's decisions and port: the pure policy, the pure reconcile plan, the EC2-shaped
//! provider port (implemented by the EC2 adapter, the `aws` module, which depends on this one
//! and never the reverse), custom networking's placement of new ENIs. Executed by
//! `crate::pool::run`. Must not: know gRPC/HTTP or an adapter, do I/O (but through the
//! provider port). `tests` drives the manager and reconciler against the fake EC2.

pub mod ec2_port;
pub mod host_port;
pub mod manager;
pub mod placement;
pub mod policy;
pub mod reconcile_plan;
pub mod reconciler;
pub mod run;
#[cfg(test)]
mod tests;
