//! The warm pool: the pure policy, the EC2-shaped provider port (plus its in-memory stand-in,
//! `Ec2Provider` over `FakeCloud`, compiled only with the test-only feature `memory-provider`) and the manager loop executing
//! decisions. Must not: know gRPC/HTTP.

pub mod manager;
#[cfg(feature = "memory-provider")]
pub mod memory;
pub mod policy;
pub mod provider;
pub mod reconcile;
