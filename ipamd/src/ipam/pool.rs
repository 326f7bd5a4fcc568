//! One network card's pool, the unit of IPAM state: its datastore (IPv4), its IPv6 index
//! (card 0 only serves IPv6), its checkpoint file, and its release log (the CIDRs and ENIs the
//! pool manager released recently, reconcile rule 4), all changed together under the
//! service's one lock. Card 0 is `pools[0]` and has the same rules as every other card:
//! restore from its file and from host evidence, set aside a corrupt file, record releases
//! durably before EC2 is asked, persist cooldowns. Must not: call EC2 or the host, read the
//! clock (times come in), know which card serves which pod.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::datastore::V6Store;
use crate::datastore::checkpoint::{Checkpoint, CheckpointError, SideRecords};
use crate::datastore::{DataStore, IpamKey};
use crate::metrics::Metrics;
use ipam_core::pool::reconcile_plan::{RecentlyFreed, Release};

/// The checkpoint file of network card `card` beside `default` (card 0 keeps `ipam.json`, card N
/// writes `ipam-nic-N.json`).
#[must_use]
pub fn pool_checkpoint_path(default: &Path, card: u32) -> PathBuf {
    if card == 0 {
        return default.to_path_buf();
    }
    let s = default.to_string_lossy();
    let base = s.strip_suffix(".json").unwrap_or(&s);
    PathBuf::from(format!("{base}-nic-{card}.json"))
}

/// One card's pool state.
#[derive(Debug)]
pub(super) struct Pool {
    /// The network card.
    pub(super) card: u32,
    /// IPv4 addresses of the card's ENIs and the pods holding them.
    pub(super) ds: DataStore,
    /// IPv6 pod addresses (IPv6 mode, dual-stack pods: card 0 only); empty elsewhere.
    pub(super) v6: V6Store,
    pub(super) checkpoint: Box<dyn Checkpoint>,
    /// The release log: loaded once at start, kept here, written beside the checkpoint
    /// (durably) before the EC2 call each release guards; expired entries dropped on write.
    pub(super) released: RecentlyFreed,
    /// Counts failed writes (`awscni_checkpoint_write_failures_total`).
    pub(super) metrics: std::sync::Arc<Metrics>,
}

impl Pool {
    /// Writes both indexes' assignments durably: IPv4 records, then IPv6 records (a dual-stack pod
    /// has one of each: a reader expects one family per record).
    pub(super) fn persist(&mut self) -> Result<(), CheckpointError> {
        let mut data = self.ds.checkpoint_data();
        data.allocations.extend(self.v6.checkpoint_entries());
        let r = self.checkpoint.store(&data);
        if r.is_err() {
            self.metrics.checkpoint_write_failures.inc();
        }
        r
    }

    /// True when `key` holds an IPv4 address here (placed or pending).
    pub(super) fn holds_v4(&self, key: &IpamKey) -> bool {
        self.ds.lookup(key).is_some() || self.ds.pending().iter().any(|p| &p.key == key)
    }

    /// The side file's records as this pool has them now: both families' cooldowns and the
    /// release log.
    fn side(&self, now: SystemTime) -> SideRecords {
        let cooling = self
            .ds
            .cooling_entries(now)
            .into_iter()
            .map(|(ip, t)| (IpAddr::V4(ip), t))
            .chain(
                self.v6
                    .cooling_entries(now)
                    .into_iter()
                    .map(|(ip, t)| (IpAddr::V6(ip), t)),
            )
            .collect();
        SideRecords {
            cooling,
            freed: self.released.records(),
            lost: false,
            unknown_before: self.released.unknown_before(),
        }
    }

    /// Writes the side file durably from memory.
    pub(super) fn write_side(&mut self, now: SystemTime) -> Result<(), CheckpointError> {
        let side = self.side(now);
        self.checkpoint.store_side(&side, true)
    }

    /// Writes the cooldowns after a release, best effort (advisory: a just-released address is not
    /// the first one handed out after ipamd restarts). From memory: the side file is not re-read.
    pub(super) fn record_cooling(&mut self, now: SystemTime) {
        let side = self.side(now);
        if let Err(e) = self.checkpoint.store_side(&side, false) {
            tracing::warn!(card = self.card, error = %e, "cooldowns not recorded");
        }
    }

    /// Adds `release` to the release log and writes it durably (fsync) before the EC2 call
    /// it guards; on a failed write the log is as before and the release must not be asked of
    /// EC2 (a restart would not know it, and a lagging Describe would put it back).
    pub(super) fn record_release(
        &mut self,
        release: &Release,
        now: SystemTime,
    ) -> Result<(), CheckpointError> {
        let before = self.released.clone();
        self.released.record(release);
        self.released.expire(now);
        let side = self.side(now);
        let r = self.checkpoint.store_side(&side, true);
        if r.is_err() {
            self.released = before;
        }
        r
    }

    /// Ends the cooldown of `cidrs` released before `at` (EC2 gave them to this node again:
    /// reconcile rule 7), written best effort: a lost supersede only keeps them out until the
    /// release's cooldown ends, then the reconciler adds what EC2 lists.
    pub(super) fn supersede(&mut self, cidrs: &[ipnet::Ipv4Net], at: SystemTime) {
        if !cidrs.iter().any(|c| self.released.cidrs().contains(c)) {
            return;
        }
        self.released.supersede(cidrs, at);
        let side = self.side(at);
        if let Err(e) = self.checkpoint.store_side(&side, false) {
            tracing::warn!(card = self.card, error = %e, "superseded release not cleared beside the checkpoint");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `datastore.InitializeDataStores`: card 0 keeps the default path, card N > 0
    /// writes `strings.TrimSuffix(path, ".json") + "-nic-N.json"`.
    #[test]
    fn card_files_are_named_as_upstream() {
        let p = Path::new("/var/run/aws-node/ipam.json");
        assert_eq!(pool_checkpoint_path(p, 0), p);
        assert_eq!(
            pool_checkpoint_path(p, 1),
            Path::new("/var/run/aws-node/ipam-nic-1.json")
        );
        assert_eq!(
            pool_checkpoint_path(p, 31),
            Path::new("/var/run/aws-node/ipam-nic-31.json")
        );
        assert_eq!(
            pool_checkpoint_path(Path::new("/tmp/state"), 2),
            Path::new("/tmp/state-nic-2.json")
        );
    }
}
