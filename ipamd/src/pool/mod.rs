//! The warm pool's executor: the pool manager, the reconciler and their loop, the host port for
//! ENIs, custom networking's placement of new ENIs. The pure decisions and the EC2-shaped port
//! they execute live in the `ipam-core` crate (re-exported here as `policy`, `reconcile_plan`,
//! `ec2_port`; the EC2 adapter, `aws`, implements the port). Executed by
//! `crate::pool::run`. Must not: know gRPC/HTTP or an adapter, do I/O (but through the
//! provider port). `tests` drives the manager and reconciler against the fake EC2.

pub use ipam_core::pool::{ec2_port, policy, reconcile_plan};

pub mod host_port;
pub mod manager;
pub mod placement;
pub mod reconciler;
pub mod run;
#[cfg(test)]
mod tests;
