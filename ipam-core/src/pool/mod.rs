//! The warm pool's pure decisions and its port: the policy (how many addresses and ENIs), the
//! node's address capacity (`capacity`, with cni-metrics-helper's subnet inventory:
//! `subnet_inventory`), per-node warm targets (`warm_override`), the
//! reconcile plan (the datastore against EC2's description) and the EC2-shaped port the daemon's
//! pool loop executes them through (`ipamd::pool`, implemented by `ipamd::aws`). Must not: do
//! I/O, know the daemon.

pub mod capacity;
pub mod ec2_port;
pub mod policy;
pub mod reconcile_plan;
pub mod subnet_inventory;
pub mod warm_override;
