//! The warm pool's decisions and port: the pure policy, the pure reconcile plan, the EC2-shaped
//! provider port (implemented by `crate::aws`). Executed by `crate::pool_loop`. Must not: know
//! `Ipam`, gRPC/HTTP or an adapter, do I/O (but through the provider port).

pub mod policy;
pub mod provider;
pub mod reconcile;
