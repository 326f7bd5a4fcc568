//! The warm pool's decisions and port: the pure policy, the pure reconcile plan, the EC2-shaped
//! provider port (plus its in-memory stand-in, `Ec2Provider` over `FakeCloud`, compiled only
//! with the test-only feature `memory-provider`). Executed by `crate::pool_loop`. Must not: know
//! `Ipam`, gRPC/HTTP, do I/O (but through the provider port).

#[cfg(feature = "memory-provider")]
pub mod memory;
pub mod policy;
pub mod provider;
pub mod reconcile;
