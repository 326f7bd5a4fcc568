//! The node's checkpoint files, one per network card (`ipam.json`, `ipam-nic-N.json`:
//! `ipamd::ipam::pool_checkpoint_path`), each with its side file, in memory: what outlives an
//! ipamd process. A file can be lost (deleted: `load` answers "none") or replaced by garbage
//! (`load` fails as a corrupt file does; `set_aside` moves it away, as `FileCheckpoint` renames
//! it to `<file>.corrupt`). The side file (cooldowns, the release log) can be lost on its own
//! (`load_side` then reads nothing, as from a deleted file). Must not: decide anything for
//! ipamd.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ipamd::datastore::CheckpointData;
use ipamd::datastore::checkpoint::{Checkpoint, CheckpointError, SideRecords};

#[derive(Debug, Default)]
struct File {
    data: Option<CheckpointData>,
    side: SideRecords,
    /// The file holds bytes that are not a checkpoint.
    garbage: bool,
    /// Unreadable files ipamd set aside.
    set_aside: u32,
    /// The side file is missing while the checkpoint is there (until ipamd writes it again).
    side_lost: bool,
}

/// One card's checkpoint file and side file (clones share them).
#[derive(Debug, Clone)]
pub struct SimCheckpoint {
    name: String,
    file: Arc<Mutex<File>>,
}

impl SimCheckpoint {
    pub fn new(card: u32) -> Self {
        let name = ipamd::ipam::pool_checkpoint_path(std::path::Path::new("ipam.json"), card)
            .display()
            .to_string();
        Self {
            name,
            file: Arc::new(Mutex::new(File::default())),
        }
    }

    fn f(&self) -> std::sync::MutexGuard<'_, File> {
        self.file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The file's name (`ipam.json`, `ipam-nic-1.json`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What a reader would get: the stored state (None when missing or garbage).
    pub fn snapshot(&self) -> Option<CheckpointData> {
        let f = self.f();
        if f.garbage { None } else { f.data.clone() }
    }

    /// What the file holds, for the trace.
    pub fn describe(&self) -> String {
        let f = self.f();
        match (&f.data, f.garbage) {
            (_, true) => format!("{}: garbage", self.name),
            (None, false) => format!("{}: missing", self.name),
            (Some(d), false) => format!("{}: {} entries", self.name, d.allocations.len()),
        }
    }

    /// The file is deleted (a wiped host path, a reinstalled node image keeping the pods).
    pub fn lose(&self) {
        let mut f = self.f();
        f.data = None;
        f.garbage = false;
    }

    /// The file's bytes are replaced by garbage (a torn write on a filesystem without
    /// ordering, a disk error, a human).
    pub fn corrupt(&self) {
        self.f().garbage = true;
    }

    /// Whether the side file records anything.
    pub fn has_side(&self) -> bool {
        let f = self.f();
        !(f.side.cooling.is_empty() && f.side.freed.is_empty())
    }

    /// The side file's bytes become garbage (the checkpoint stays): it reads as lost.
    pub fn lose_side(&self) {
        self.f().side = SideRecords::default();
        self.f().side_lost = true;
    }

    /// How many unreadable files ipamd set aside.
    pub fn set_aside_count(&self) -> u32 {
        self.f().set_aside
    }
}

impl Checkpoint for SimCheckpoint {
    fn load(&self) -> Result<Option<CheckpointData>, CheckpointError> {
        let f = self.f();
        if f.garbage {
            let source = serde_json::from_slice::<serde_json::Value>(b"\x00\x17garbage")
                .expect_err("garbage is not JSON");
            return Err(CheckpointError::Corrupt {
                path: PathBuf::from(&self.name),
                source,
            });
        }
        Ok(f.data.clone())
    }

    fn store(&mut self, data: &CheckpointData) -> Result<(), CheckpointError> {
        let mut f = self.f();
        f.data = Some(data.clone());
        f.garbage = false;
        Ok(())
    }

    fn set_aside(&mut self) -> Result<Option<PathBuf>, CheckpointError> {
        let mut f = self.f();
        if !f.garbage {
            return Ok(None);
        }
        f.garbage = false;
        f.data = None;
        f.set_aside += 1;
        Ok(Some(PathBuf::from(format!("{}.corrupt", self.name))))
    }

    fn store_side(&mut self, side: &SideRecords, _durable: bool) -> Result<(), CheckpointError> {
        let mut f = self.f();
        f.side = side.clone();
        f.side_lost = false;
        Ok(())
    }

    /// A lost side file reads as an unreadable one (`lost`: FileCheckpoint's garbage).
    fn load_side(&self) -> SideRecords {
        let f = self.f();
        SideRecords {
            lost: f.side_lost,
            ..f.side.clone()
        }
    }
}

/// Checkpoint loss or corruption at a start (issue 38): with `per_mille` chance per file that
/// holds something, just before an ipamd reads the files and the host, a file is lost or made
/// garbage (half each). The host evidence that then recovers the pods is routes only here: the
/// pod rules the plugin installs are not modelled, and on a real host they outlive a deleted
/// route (`host_pod_evidence` reads both). So a file is struck only while every live pod's
/// address of its card is routed, what the real rules would show otherwise. Under the node
/// lock no other ipamd writes the files then (profile `no-lock` does not draw this).
#[derive(Debug, Clone)]
pub struct DiskFaults {
    per_mille: u64,
    /// Per-mille chance, per start and card, that the side file (if it records anything) is
    /// lost.
    side_per_mille: u64,
    /// Every live pod's (card, address): the harness's ground truth, kept current by its
    /// invariant check.
    live: Arc<Mutex<Vec<(u32, std::net::IpAddr)>>>,
}

impl DiskFaults {
    pub fn new(per_mille: u64, side_per_mille: u64) -> Self {
        Self {
            per_mille,
            side_per_mille,
            live: Arc::default(),
        }
    }

    pub fn set_live(&self, live: Vec<(u32, std::net::IpAddr)>) {
        if self.per_mille > 0 {
            *self
                .live
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = live;
        }
    }

    /// Maybe loses or corrupts `file` (card `card`'s) now.
    pub fn strike(
        &self,
        file: &SimCheckpoint,
        card: u32,
        host: &super::host::SimHost,
        rng: &super::rng::Rng,
        trace: &super::trace::Trace,
    ) {
        if self.side_per_mille > 0 && file.has_side() && rng.chance(self.side_per_mille) {
            file.lose_side();
            trace.log(format!(
                "    the side file of {} is GARBAGE (its release log unreadable)",
                file.name()
            ));
        }
        if self.per_mille == 0 || file.snapshot().is_none() || !rng.chance(self.per_mille) {
            return;
        }
        let unrouted = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .any(|(c, ip)| *c == card && !host.routed(*ip));
        if unrouted {
            trace.log(format!(
                "    ({} would be lost, but a live pod of card {card} is unrouted: its rules, \
                 not modelled, would be the evidence)",
                file.name()
            ));
            return;
        }
        if rng.chance(500) {
            file.corrupt();
            trace.log(format!(
                "    {} is GARBAGE ({} set aside before)",
                file.name(),
                file.set_aside_count()
            ));
        } else {
            file.lose();
            trace.log(format!("    {} is LOST (deleted)", file.name()));
        }
    }
}
