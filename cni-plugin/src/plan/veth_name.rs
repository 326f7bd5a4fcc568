//! The host veth names a sandbox's interfaces get (the prefix and a hash of the pod identity, or of
//! the container id and interface name without one) and which other pod interface may compute the
//! same name. Must not: look at links (whether a name is taken is `apply`'s question) or decide
//! what a found link means (DEL's proof is `teardown.rs`'s).

use dataplane::conventions::{
    STRICT_BRANCH_VETH_PREFIX, host_veth_name, host_veth_name_at, host_veth_name_for_container,
};

use crate::spec::netconf::SgEnforcingMode;
use crate::spec::{CniEnv, NetConf};

/// The most interfaces a multi-card pod may have beyond its first: one per network card after card
/// 0 (32 cards on `p5.48xlarge`).
pub const MAX_EXTRA_INTERFACES: u32 = 31;

/// The host veth name for this invocation: from the K8S pod identity when present,
/// otherwise from the container id and interface name.
#[must_use]
pub fn host_veth_for(conf: &NetConf, env: &CniEnv) -> String {
    if env.k8s.has_pod() {
        host_veth_name(&conf.veth_prefix, &env.k8s.pod_namespace, &env.k8s.pod_name)
    } else {
        host_veth_name_for_container(&conf.veth_prefix, &env.container_id, &env.ifname)
    }
}

/// The other pod interface whose host veth name is the same as this pod's interface `index`'s, if
/// one can exist: the name hashes `<namespace>.<pod>` for a first interface and
/// `<namespace>.<pod>.<index>` for a multi-card pod's further one, so pod `x`'s interface 1 and pod
/// `x.1`'s interface 0 share a name (and, without a pod identity, interface `eth0.1` and `eth0`'s
/// interface 1 of one container).
#[must_use]
pub fn veth_name_shared_with(env: &CniEnv, index: u32) -> Option<String> {
    let (what, key) = if env.k8s.has_pod() {
        (
            format!("pod {}/", env.k8s.pod_namespace),
            env.k8s.pod_name.as_str(),
        )
    } else {
        (
            format!("container {} interface ", env.container_id),
            env.ifname.as_str(),
        )
    };
    if index > 0 {
        return Some(format!("{what}{key}.{index}'s first interface"));
    }
    let (base, suffix) = key.rsplit_once('.')?;
    let n: u32 = suffix.parse().ok()?;
    // Only the decimal spelling `host_veth_at` writes (`x.01` is no interface of `x`).
    (!base.is_empty() && (1..=MAX_EXTRA_INTERFACES).contains(&n) && n.to_string() == suffix)
        .then(|| format!("{what}{base}'s interface {n}"))
}

/// The host veth of a multi-card pod's interface `index` (0: [`host_veth_for`]).
#[must_use]
pub fn host_veth_at(conf: &NetConf, env: &CniEnv, index: u32) -> String {
    if index == 0 {
        host_veth_for(conf, env)
    } else if env.k8s.has_pod() {
        host_veth_name_at(
            &conf.veth_prefix,
            &env.k8s.pod_namespace,
            &env.k8s.pod_name,
            index,
        )
    } else {
        host_veth_name_for_container(
            &conf.veth_prefix,
            &env.container_id,
            &format!("{}.{index}", env.ifname),
        )
    }
}

/// The host veth name of a branch-ENI pod: `vlan<hash>` in strict mode, the configured prefix in
/// standard mode.
#[must_use]
pub fn branch_host_veth(conf: &NetConf, env: &CniEnv) -> String {
    let prefix = match conf.pod_sg_enforcing_mode {
        SgEnforcingMode::Strict => STRICT_BRANCH_VETH_PREFIX,
        SgEnforcingMode::Standard => conf.veth_prefix.as_str(),
    };
    if env.k8s.has_pod() {
        host_veth_name(prefix, &env.k8s.pod_namespace, &env.k8s.pod_name)
    } else {
        host_veth_name_for_container(prefix, &env.container_id, &env.ifname)
    }
}

/// The host veth name a strict-mode branch-ENI pod of this identity has (`vlan<hash>`).
pub(super) fn strict_branch_veth(env: &CniEnv) -> String {
    if env.k8s.has_pod() {
        host_veth_name(
            STRICT_BRANCH_VETH_PREFIX,
            &env.k8s.pod_namespace,
            &env.k8s.pod_name,
        )
    } else {
        host_veth_name_for_container(STRICT_BRANCH_VETH_PREFIX, &env.container_id, &env.ifname)
    }
}
