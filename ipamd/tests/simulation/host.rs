//! The node's host network as ipamd and the plugin see it, in memory: host veths (each with
//! the sandbox that created it) and the pods' `/32` and `/128` host routes through them. The
//! plugin's ADD wires a sandbox (replacing a veth of the same name, as the plugin does for a
//! re-created pod), its DEL removes only what is its own sandbox's; perturbations remove a
//! route (an agent flushing a table) or a veth (the sandbox died). ipamd reads it at start
//! (`HostPodRoutes`) and in `reclaim` (`Wiring`). Also the pool loop's host port for ENIs.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use ipamd::ipam::HostPodRoutes;
use ipamd::pool::ec2_port::AttachedEni;
use ipamd::pool::host_port::{EniHost, EniHostError};
use ipamd::reclaim::Wiring;

use super::rng::Rng;
use super::trace::Trace;

#[derive(Debug, Default)]
struct State {
    /// veth name → the sandbox (container id) whose ADD created it.
    links: BTreeMap<String, String>,
    /// Pod address → the device its host route goes through.
    routes: BTreeMap<IpAddr, String>,
}

/// The host netns (clones share it).
#[derive(Debug, Clone, Default)]
pub struct SimHost(Arc<Mutex<State>>);

impl SimHost {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The plugin's ADD of `sandbox`: its veth (an older one of the same name goes, with its
    /// routes) and a host route per address.
    pub fn wire(&self, sandbox: &str, veth: &str, ips: &[IpAddr]) {
        let mut st = self.st();
        st.routes.retain(|_, dev| dev != veth);
        st.links.insert(veth.to_owned(), sandbox.to_owned());
        for ip in ips {
            st.routes.insert(*ip, veth.to_owned());
        }
    }

    /// The plugin's DEL of `sandbox` (phase 1): its own veth and what routes through it;
    /// another sandbox's veth of the same name is left alone. True when it removed a veth.
    pub fn teardown(&self, sandbox: &str, veth: &str) -> bool {
        let mut st = self.st();
        if st.links.get(veth).is_some_and(|s| s == sandbox) {
            st.links.remove(veth);
            st.routes.retain(|_, dev| dev != veth);
            return true;
        }
        false
    }

    /// The sandbox died (its netns and veth pair are gone) without a DEL.
    pub fn kill(&self, sandbox: &str, veth: &str) {
        self.teardown(sandbox, veth);
    }

    /// `ip route del <ip>`; true when there was one.
    pub fn del_route(&self, ip: IpAddr) -> bool {
        self.st().routes.remove(&ip).is_some()
    }

    /// Every IPv4 pod route flushed (an agent rewriting the main table); how many.
    pub fn flush_v4(&self) -> usize {
        let mut st = self.st();
        let before = st.routes.len();
        st.routes.retain(|ip, _| ip.is_ipv6());
        before - st.routes.len()
    }

    /// What ipamd reads at start: every pod route with its device.
    pub fn evidence(&self) -> HostPodRoutes {
        self.st()
            .routes
            .iter()
            .map(|(ip, dev)| (*ip, dev.clone()))
            .collect()
    }

    /// What `reclaim` reads.
    pub fn wiring(&self) -> Wiring {
        let st = self.st();
        let mut routes_by_link: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        for (ip, dev) in &st.routes {
            routes_by_link.entry(dev.clone()).or_default().insert(*ip);
        }
        let mut links: BTreeSet<String> = st.links.keys().cloned().collect();
        links.insert("eth0".to_owned());
        links.insert("lo".to_owned());
        Wiring {
            routed: st.routes.keys().copied().collect(),
            links,
            routes_by_link,
        }
    }

    pub fn routed(&self, ip: IpAddr) -> bool {
        self.st().routes.contains_key(&ip)
    }

    pub fn has_link(&self, veth: &str) -> bool {
        self.st().links.contains_key(veth)
    }
}

/// The pool loop's host port: an ENI's host set-up fails now and then (the retry path).
#[derive(Debug, Clone)]
pub struct SimEniHost {
    pub rng: Rng,
    pub trace: Trace,
    pub fail_per_mille: u64,
}

impl EniHost for SimEniHost {
    async fn setup(&self, eni: &AttachedEni) -> Result<Option<u32>, EniHostError> {
        if self.rng.chance(self.fail_per_mille) {
            self.trace.log(format!(
                "host set-up of {} FAILED (link not there yet)",
                eni.id
            ));
            return Err(EniHostError::NoLink(eni.id.clone()));
        }
        Ok(None)
    }

    async fn teardown(&self, _eni: &AttachedEni) -> Result<(), EniHostError> {
        Ok(())
    }
}
