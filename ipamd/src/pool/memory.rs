//! TEST/DEMO ONLY: a stateful in-memory EC2 stand-in implementing [`EniProvider`]. Enforces the
//! instance ENI limit, the per-ENI address limit and subnet exhaustion; allocates addresses
//! from one subnet (skipping AWS's 4 reserved + broadcast); optionally keeps its state in a JSON
//! file so "EC2" survives ipamd restarts (the SIGKILL tests need that). Must not be used on a
//! real node: it invents addresses.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::provider::{
    AttachedEni, EniProvider, InstanceLimits, NewEni, NodeNetwork, ProviderError,
};
use crate::config::MemoryProviderSpec;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    enis: Vec<AttachedEni>,
    next_eni: u32,
    /// Injected failure for the next mutating call.
    #[serde(skip)]
    fail_next: Option<ProviderError>,
    #[serde(skip)]
    calls: u64,
}

/// The in-memory provider. Clones share state.
#[derive(Debug, Clone)]
pub struct MemoryProvider {
    spec: MemoryProviderSpec,
    state: Arc<Mutex<State>>,
}

impl MemoryProvider {
    /// A node with only its primary ENI (primary IP = first usable subnet address), or the
    /// state from `spec.state_file` if it exists.
    #[must_use]
    pub fn new(spec: MemoryProviderSpec) -> Self {
        let loaded = spec
            .state_file
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<State>(&b).ok());
        let state = loaded.unwrap_or_else(|| {
            let primary_ip = Ipv4Addr::from(u32::from(spec.subnet.network()) + 4);
            State {
                enis: vec![AttachedEni {
                    id: "eni-00000000".into(),
                    device_number: 0,
                    network_card: 0,
                    is_primary: true,
                    is_trunk: false,
                    is_efa: false,
                    is_excluded: false,
                    mac: mac(0),
                    subnet_id: "subnet-memory".into(),
                    subnet: spec.subnet,
                    primary_ip,
                    secondary_ips: Vec::new(),
                    prefixes: Vec::new(),
                }],
                next_eni: 1,
                fail_next: None,
                calls: 0,
            }
        });
        Self {
            spec,
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// Makes the next mutating call fail with `err`.
    pub fn fail_next(&self, err: ProviderError) {
        if let Ok(mut s) = self.state.lock() {
            s.fail_next = Some(err);
        }
    }

    /// Mutating calls so far.
    #[must_use]
    pub fn calls(&self) -> u64 {
        self.state.lock().map(|s| s.calls).unwrap_or(0)
    }

    fn mutate<T>(
        &self,
        f: impl FnOnce(&mut State, &MemoryProviderSpec) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| ProviderError::Other("provider state poisoned".into()))?;
        s.calls += 1;
        if let Some(e) = s.fail_next.take() {
            return Err(e);
        }
        let before = s.clone();
        let out = f(&mut s, &self.spec);
        if out.is_ok()
            && let Err(e) = self.persist(&s)
        {
            *s = before;
            return Err(e);
        }
        out
    }

    fn persist(&self, s: &State) -> Result<(), ProviderError> {
        let Some(path) = &self.spec.state_file else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(s).map_err(|e| ProviderError::Other(e.to_string()))?;
        let tmp: PathBuf = path.with_extension("tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| ProviderError::Other(format!("persist provider state: {e}")))
    }
}

fn mac(n: u32) -> String {
    let b = n.to_be_bytes();
    format!("02:00:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

fn used(s: &State) -> BTreeSet<u32> {
    let mut set = BTreeSet::new();
    for e in &s.enis {
        set.insert(u32::from(e.primary_ip));
        set.extend(e.secondary_ips.iter().map(|ip| u32::from(*ip)));
        for p in &e.prefixes {
            set.extend(u32::from(p.network())..=u32::from(p.broadcast()));
        }
    }
    set
}

/// AWS reserves the first 4 addresses and the last of every subnet.
fn usable(subnet: Ipv4Net) -> std::ops::RangeInclusive<u32> {
    (u32::from(subnet.network()) + 4)..=(u32::from(subnet.broadcast()).saturating_sub(1))
}

fn take_ips(
    s: &State,
    spec: &MemoryProviderSpec,
    count: u32,
) -> Result<Vec<Ipv4Addr>, ProviderError> {
    let used = used(s);
    let ips: Vec<Ipv4Addr> = usable(spec.subnet)
        .filter(|a| !used.contains(a))
        .take(count as usize)
        .map(Ipv4Addr::from)
        .collect();
    if ips.len() < count as usize {
        return Err(ProviderError::SubnetExhausted(spec.subnet.to_string()));
    }
    Ok(ips)
}

fn take_prefixes(
    s: &State,
    spec: &MemoryProviderSpec,
    count: u32,
) -> Result<Vec<Ipv4Net>, ProviderError> {
    let used = used(s);
    let range = usable(spec.subnet);
    let mut out = Vec::new();
    let mut base = u32::from(spec.subnet.network());
    while out.len() < count as usize && base + 15 <= u32::from(spec.subnet.broadcast()) {
        if range.contains(&base)
            && range.contains(&(base + 15))
            && !(base..=base + 15).any(|a| used.contains(&a))
        {
            out.push(
                Ipv4Net::new(Ipv4Addr::from(base), 28)
                    .map_err(|e| ProviderError::Other(e.to_string()))?,
            );
        }
        base += 16;
    }
    if out.len() < count as usize {
        return Err(ProviderError::SubnetExhausted(spec.subnet.to_string()));
    }
    Ok(out)
}

fn room(e: &AttachedEni, spec: &MemoryProviderSpec) -> u32 {
    let held = u32::try_from(e.secondary_ips.len() + e.prefixes.len()).unwrap_or(u32::MAX);
    (spec.ipv4_per_eni - 1).saturating_sub(held)
}

fn eni_mut<'a>(s: &'a mut State, id: &str) -> Result<&'a mut AttachedEni, ProviderError> {
    s.enis
        .iter_mut()
        .find(|e| e.id == id)
        .ok_or_else(|| ProviderError::NotFound(id.to_owned()))
}

impl EniProvider for MemoryProvider {
    async fn instance_limits(&self) -> Result<InstanceLimits, ProviderError> {
        Ok(InstanceLimits {
            max_enis: self.spec.max_enis,
            ipv4_per_eni: self.spec.ipv4_per_eni,
        })
    }

    async fn node_network(&self) -> Result<NodeNetwork, ProviderError> {
        let s = self
            .state
            .lock()
            .map_err(|_| ProviderError::Other("provider state poisoned".into()))?;
        Ok(NodeNetwork {
            vpc_v4_cidrs: vec![self.spec.vpc_cidr],
            primary_ip: s.enis.first().map(|e| e.primary_ip),
            instance_id: String::new(),
            region: String::new(),
        })
    }

    async fn list_enis(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        let s = self
            .state
            .lock()
            .map_err(|_| ProviderError::Other("provider state poisoned".into()))?;
        Ok(s.enis.clone())
    }

    async fn assign_ips(&self, eni_id: &str, count: u32) -> Result<Vec<Ipv4Addr>, ProviderError> {
        self.mutate(|s, spec| {
            let e = s
                .enis
                .iter()
                .find(|e| e.id == eni_id)
                .ok_or_else(|| ProviderError::NotFound(eni_id.to_owned()))?;
            if room(e, spec) < count {
                return Err(ProviderError::InstanceLimit(format!(
                    "{eni_id} holds at most {} addresses",
                    spec.ipv4_per_eni
                )));
            }
            let ips = take_ips(s, spec, count)?;
            eni_mut(s, eni_id)?.secondary_ips.extend(&ips);
            Ok(ips)
        })
    }

    async fn assign_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<Ipv4Net>, ProviderError> {
        self.mutate(|s, spec| {
            let e = s
                .enis
                .iter()
                .find(|e| e.id == eni_id)
                .ok_or_else(|| ProviderError::NotFound(eni_id.to_owned()))?;
            if room(e, spec) < count {
                return Err(ProviderError::InstanceLimit(format!(
                    "{eni_id} holds at most {} prefixes",
                    spec.ipv4_per_eni - 1
                )));
            }
            let p = take_prefixes(s, spec, count)?;
            eni_mut(s, eni_id)?.prefixes.extend(&p);
            Ok(p)
        })
    }

    async fn create_eni(&self, req: NewEni) -> Result<AttachedEni, ProviderError> {
        self.mutate(|s, spec| {
            if u32::try_from(s.enis.len()).unwrap_or(u32::MAX) >= spec.max_enis {
                return Err(ProviderError::InstanceLimit(format!(
                    "at most {} ENIs",
                    spec.max_enis
                )));
            }
            if req.secondary_ips + req.prefixes > spec.ipv4_per_eni - 1 {
                return Err(ProviderError::InstanceLimit(format!(
                    "an ENI holds at most {} addresses",
                    spec.ipv4_per_eni
                )));
            }
            let device_number = (0..)
                .find(|d| !s.enis.iter().any(|e| e.device_number == *d))
                .unwrap_or(0);
            let primary = take_ips(s, spec, 1)?[0];
            let n = s.next_eni;
            let mut eni = AttachedEni {
                id: format!("eni-{n:08x}"),
                device_number,
                network_card: 0,
                is_primary: false,
                is_trunk: false,
                is_efa: false,
                is_excluded: false,
                mac: mac(n),
                subnet_id: "subnet-memory".into(),
                subnet: spec.subnet,
                primary_ip: primary,
                secondary_ips: Vec::new(),
                prefixes: Vec::new(),
            };
            s.enis.push(eni.clone());
            let ips = take_ips(s, spec, req.secondary_ips);
            let prefixes =
                ips.and_then(|ips| take_prefixes(s, spec, req.prefixes).map(|p| (ips, p)));
            s.enis.pop();
            let (ips, prefixes) = prefixes?;
            eni.secondary_ips = ips;
            eni.prefixes = prefixes;
            s.next_eni += 1;
            s.enis.push(eni.clone());
            Ok(eni)
        })
    }

    async fn unassign_ips(&self, eni_id: &str, ips: &[Ipv4Addr]) -> Result<(), ProviderError> {
        self.mutate(|s, _| {
            let e = eni_mut(s, eni_id)?;
            if let Some(ip) = ips.iter().find(|ip| !e.secondary_ips.contains(ip)) {
                return Err(ProviderError::NotFound(ip.to_string()));
            }
            e.secondary_ips.retain(|ip| !ips.contains(ip));
            Ok(())
        })
    }

    async fn unassign_prefixes(
        &self,
        eni_id: &str,
        prefixes: &[Ipv4Net],
    ) -> Result<(), ProviderError> {
        self.mutate(|s, _| {
            let e = eni_mut(s, eni_id)?;
            if let Some(p) = prefixes.iter().find(|p| !e.prefixes.contains(p)) {
                return Err(ProviderError::NotFound(p.to_string()));
            }
            e.prefixes.retain(|p| !prefixes.contains(p));
            Ok(())
        })
    }

    async fn free_eni(&self, eni_id: &str) -> Result<(), ProviderError> {
        self.mutate(|s, _| {
            let e = eni_mut(s, eni_id)?;
            if e.is_primary {
                return Err(ProviderError::InUse(eni_id.to_owned()));
            }
            s.enis.retain(|e| e.id != eni_id);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(max_enis: u32, per_eni: u32, subnet: &str) -> MemoryProvider {
        MemoryProvider::new(MemoryProviderSpec {
            subnet: subnet.parse().unwrap(),
            max_enis,
            ipv4_per_eni: per_eni,
            ..MemoryProviderSpec::default()
        })
    }

    #[tokio::test]
    async fn enforces_instance_limits() {
        let p = provider(2, 3, "198.18.0.0/24");
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        assert_eq!(p.assign_ips(&primary, 2).await.unwrap().len(), 2);
        assert!(matches!(
            p.assign_ips(&primary, 1).await,
            Err(ProviderError::InstanceLimit(_))
        ));
        let e = p
            .create_eni(NewEni {
                secondary_ips: 2,
                prefixes: 0,
            })
            .await
            .unwrap();
        assert_eq!((e.device_number, e.secondary_ips.len()), (1, 2));
        assert!(matches!(
            p.create_eni(NewEni::default()).await,
            Err(ProviderError::InstanceLimit(_))
        ));
        assert!(matches!(
            p.free_eni(&primary).await,
            Err(ProviderError::InUse(_))
        ));
        p.free_eni(&e.id).await.unwrap();
        assert_eq!(p.list_enis().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn subnet_exhaustion_and_unique_addresses() {
        // /28: 16 addresses, 4 reserved + broadcast, primary takes 1 -> 10 left.
        let p = provider(5, 50, "198.18.0.0/28");
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        let ips = p.assign_ips(&primary, 10).await.unwrap();
        let unique: BTreeSet<_> = ips.iter().collect();
        assert_eq!(unique.len(), 10);
        assert!(matches!(
            p.assign_ips(&primary, 1).await,
            Err(ProviderError::SubnetExhausted(_))
        ));
        p.unassign_ips(&primary, &ips[..1]).await.unwrap();
        assert_eq!(p.assign_ips(&primary, 1).await.unwrap(), ips[..1].to_vec());
    }

    #[tokio::test]
    async fn prefixes_are_aligned_and_disjoint() {
        let p = provider(3, 4, "198.18.0.0/24");
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        let ps = p.assign_prefixes(&primary, 3).await.unwrap();
        assert_eq!(ps[0].to_string(), "198.18.0.16/28");
        assert_eq!(ps[1].to_string(), "198.18.0.32/28");
    }

    #[tokio::test]
    async fn state_file_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let spec = MemoryProviderSpec {
            state_file: Some(dir.path().join("ec2.json")),
            ..MemoryProviderSpec::default()
        };
        let p = MemoryProvider::new(spec.clone());
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        let ips = p.assign_ips(&primary, 3).await.unwrap();
        let again = MemoryProvider::new(spec);
        assert_eq!(again.list_enis().await.unwrap()[0].secondary_ips, ips);
    }
}
