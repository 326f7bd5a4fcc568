//! Shared kernel-networking vocabulary of `aws-cni` and `ipamd`: the conventions both must agree
//! on (names, table ids, rule priorities, gateway addresses) and the netlink operations that
//! program them. Must not: depend on tokio runtimes it does not own, tonic, kube or AWS crates,
//! read the environment, initialise logging, or decide policy (which routes a pod gets).

#![warn(missing_docs)]

pub mod conntrack;
pub mod conventions;
pub mod host_state;
pub mod link_events;
pub mod model;
pub mod netlink;
pub mod netns;

pub use link_events::LinkEvents;
pub use model::{Address, Family, Link, MacAddr, Neighbour, Route, Rule, Scope};
pub use netlink::{Netlink, NetlinkError, VethSpec};
pub use netns::{NetNs, NetNsError, SysctlError};
