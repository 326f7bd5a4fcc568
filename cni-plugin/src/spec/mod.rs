//! The CNI specification as this plugin speaks it: environment, network configuration,
//! results and errors. Nothing else in the crate parses `CNI_*` variables or shapes JSON for
//! stdout. Must not: talk to ipamd, the kernel or the filesystem.

pub mod env;
pub mod error;
pub mod netconf;
pub mod result;

pub use env::{CniEnv, Command, EnvError, K8sArgs};
pub use error::{ErrorCode, SpecError};
pub use netconf::{CniVersion, NetConf, NetConfError};
pub use result::{CniResult, Interface, IpConfig, RouteEntry};
