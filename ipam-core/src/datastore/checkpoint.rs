//! The checkpoint: the `vpc-cni-ipam/1` JSON format existing nodes keep (so a node can change CNI
//! in either direction with pods running) and the [`Checkpoint`] port with an atomic-file and an
//! in-memory implementation. Must not: decide what to restore (the datastore does), touch the
//! network.
//!
//! Format: `{"version":"vpc-cni-ipam/1",
//! "allocations":[{"networkName","containerID","ifName","ipv4"|"ipv6","allocationTimestamp"
//! (Unix ns),"metadata":{"k8sPodNamespace","k8sPodName","interfacesCount"}}]}`.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
#[cfg(any(test, feature = "fake"))]
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::{IpamKey, PodMetadata};

/// The only version we read and write.
pub const CHECKPOINT_VERSION: &str = "vpc-cni-ipam/1";

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointData {
    /// Always [`CHECKPOINT_VERSION`] when written by us.
    pub version: String,
    /// One entry per assigned address.
    pub allocations: Vec<CheckpointEntry>,
}

impl CheckpointData {
    /// A current-version checkpoint.
    #[must_use]
    pub fn new(allocations: Vec<CheckpointEntry>) -> Self {
        Self {
            version: CHECKPOINT_VERSION.to_owned(),
            allocations,
        }
    }
}

/// One assignment ("row"). The IPAM key is inlined, as Go's embedded struct is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointEntry {
    /// `networkName`, `containerID`, `ifName`.
    #[serde(flatten)]
    pub key: IpamKey,
    /// `ipv4` (omitted when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    /// `ipv6` (omitted when empty): an IPv6 pod address (IPv6 mode; the second record of a
    /// dual-stack pod).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
    /// `allocationTimestamp`: Unix nanoseconds.
    #[serde(rename = "allocationTimestamp", default)]
    pub allocation_timestamp: i64,
    /// `metadata`.
    #[serde(default)]
    pub metadata: PodMetadata,
}

impl CheckpointEntry {
    /// An IPv4 entry.
    #[must_use]
    pub fn new(key: IpamKey, ip: Ipv4Addr, metadata: PodMetadata, at: SystemTime) -> Self {
        let ns = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        Self {
            key,
            ipv4: ip.to_string(),
            ipv6: String::new(),
            allocation_timestamp: ns,
            metadata,
        }
    }

    /// An IPv6 entry (`ipv6` set, no `ipv4`).
    #[must_use]
    pub fn new_v6(key: IpamKey, ip: Ipv6Addr, metadata: PodMetadata, at: SystemTime) -> Self {
        let mut e = Self::new(key, Ipv4Addr::UNSPECIFIED, metadata, at);
        e.ipv4 = String::new();
        e.ipv6 = ip.to_string();
        e
    }

    /// The IPv6 address, if valid.
    #[must_use]
    pub fn ipv6(&self) -> Option<Ipv6Addr> {
        self.ipv6.parse().ok()
    }

    /// The IPv4 address, if valid.
    #[must_use]
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.ipv4.parse().ok()
    }

    /// The entry's address, either family (`ipv4` when both are set).
    #[must_use]
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        self.ipv4()
            .map(std::net::IpAddr::V4)
            .or_else(|| self.ipv6().map(std::net::IpAddr::V6))
    }

    /// `allocationTimestamp` as a time.
    #[must_use]
    pub fn allocated_at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(self.allocation_timestamp).unwrap_or(0))
    }
}

/// Why a checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File I/O.
    #[error("{op} {path}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// Which file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Not JSON of the expected shape.
    #[error("corrupt checkpoint {path}")]
    Corrupt {
        /// Which file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// A version we do not understand.
    #[error("checkpoint {path} has version {found:?}, expected {CHECKPOINT_VERSION:?}")]
    Version {
        /// Which file.
        path: PathBuf,
        /// What it said.
        found: String,
    },
    /// Injected failure (in-memory implementation).
    #[error("checkpoint write refused (injected)")]
    Injected,
}

/// Where assignments are persisted. `store` must be durable when it returns `Ok`.
pub trait Checkpoint: Send + std::fmt::Debug {
    /// Reads the last stored state; `Ok(None)` when there is none (fresh node).
    fn load(&self) -> Result<Option<CheckpointData>, CheckpointError>;
    /// Replaces the stored state durably.
    fn store(&mut self, data: &CheckpointData) -> Result<(), CheckpointError>;
    /// Keeps an unreadable checkpoint aside for humans before it is replaced; returns where.
    fn set_aside(&mut self) -> Result<Option<PathBuf>, CheckpointError> {
        Ok(None)
    }
    /// Replaces the side file beside the checkpoint (never inside it: the `vpc-cni-ipam/1` file
    /// keeps its shared format) with `side`: both families' cooldowns and the recent releases
    /// (reconcile rule 4 across a restart). `durable`: fsynced before it returns (a release
    /// recorded before the EC2 call it guards); otherwise it survives an ipamd crash but maybe not
    /// a power loss (cooldowns are advisory).
    fn store_side(&mut self, _side: &SideRecords, _durable: bool) -> Result<(), CheckpointError> {
        Ok(())
    }
    /// The side file as last recorded (empty when none; an unreadable part is empty, the
    /// other part kept). Read once, at start.
    fn load_side(&self) -> SideRecords {
        SideRecords::default()
    }
    /// The cooldowns last recorded ([`Self::load_side`]).
    fn load_cooling(&self) -> Vec<(IpAddr, SystemTime)> {
        self.load_side().cooling
    }
    /// The releases last recorded ([`Self::load_side`]).
    fn load_freed(&self) -> Vec<FreedRecord> {
        self.load_side().freed
    }
}

/// What the side file beside a checkpoint keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideRecords {
    /// Addresses in cooldown, both families, with their release time.
    pub cooling: Vec<(IpAddr, SystemTime)>,
    /// The pool manager's recent releases.
    pub freed: Vec<FreedRecord>,
    /// Read only (never written): the side file is there but its release log cannot be read
    /// (garbage, a torn write, an I/O error). ipamd then does not know what it released before the
    /// restart. A missing side file is an empty log: it is written only once something was
    /// released, and a node taken over has none.
    pub lost: bool,
    /// Releases before this moment are not known (a release log was lost then): until the
    /// reconcile cooldown has passed since, nothing the pool does not hold is taken back from
    /// a view (key `releasesUnknownBefore`, Unix ns, absent when none).
    pub unknown_before: Option<SystemTime>,
}

/// A CIDR, or a whole ENI, the pool manager released, as the side file keeps it: for the
/// reconcile cooldown (a Describe or IMDS view that still lists it does not put it back) to
/// outlive a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreedRecord {
    /// The ENI it was released from (or the ENI freed).
    pub eni_id: String,
    /// The CIDR (a secondary `/32` or a prefix); `None`: the ENI itself was freed.
    pub cidr: Option<Ipv4Net>,
    /// When it was released.
    pub released_at: SystemTime,
}

/// The cooldown side file (`<checkpoint>.cooldown`):
/// `{"cooling":[{"ip":"198.18.0.5","releasedAt":<unix ns>}],"coolingV6":[{"ip":"2001:db8::1",
/// "releasedAt":<unix ns>}]}`. IPv6 cooldowns have their own key, written only when there are
/// some, so both directions of a version change keep working: a file of a version that knew
/// only IPv4 cooldowns (no `coolingV6`) loads here, and a version that knows only `cooling`
/// (IPv4 addresses) still loads this file, ignoring `coolingV6` (serde skips unknown fields)
/// instead of failing on an IPv6 address in `cooling` and losing every cooldown.
#[derive(Debug, Default, Serialize, Deserialize)]
struct CoolingFile {
    cooling: Vec<CoolingEntry<Ipv4Addr>>,
    #[serde(rename = "coolingV6", default, skip_serializing_if = "Vec::is_empty")]
    cooling_v6: Vec<CoolingEntry<Ipv6Addr>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct CoolingEntry<A> {
    ip: A,
    #[serde(rename = "releasedAt")]
    released_at: u64,
}

impl CoolingFile {
    /// The side file of `cooling` (both families, each into its own key).
    fn of(cooling: &[(IpAddr, SystemTime)]) -> Self {
        let mut file = Self::default();
        for (ip, t) in cooling {
            let released_at = unix_ns(*t);
            match *ip {
                IpAddr::V4(ip) => file.cooling.push(CoolingEntry { ip, released_at }),
                IpAddr::V6(ip) => file.cooling_v6.push(CoolingEntry { ip, released_at }),
            }
        }
        file
    }

    /// Its cooldowns, IPv4 first.
    fn entries(self) -> Vec<(IpAddr, SystemTime)> {
        let at = |ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns);
        self.cooling
            .into_iter()
            .map(|e| (IpAddr::V4(e.ip), at(e.released_at)))
            .chain(
                self.cooling_v6
                    .into_iter()
                    .map(|e| (IpAddr::V6(e.ip), at(e.released_at))),
            )
            .collect()
    }
}

/// Reads cooldown side-file bytes; anything unreadable is no cooldown (advisory).
fn parse_cooling(bytes: &[u8]) -> Vec<(IpAddr, SystemTime)> {
    serde_json::from_slice::<CoolingFile>(bytes)
        .map(CoolingFile::entries)
        .unwrap_or_default()
}

/// The side file's recent releases, under their own key `freed`:
/// `{"freed":[{"eni":"eni-1","cidr":"198.18.0.6/32","releasedAt":<unix ns>},{"eni":"eni-2",
/// "releasedAt":<unix ns>}]}` (no `cidr`: the ENI was freed). Read apart from the cooldowns, so
/// an unreadable part loses only itself; left out when empty, so a node that released nothing
/// recently writes exactly the bytes it wrote before, and a version that knows only the
/// cooldowns reads the file (serde skips the unknown key).
#[derive(Debug, Default, Serialize, Deserialize)]
struct FreedFile {
    #[serde(default)]
    freed: Vec<FreedEntry>,
    #[serde(rename = "releasesUnknownBefore", default)]
    unknown_before: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct FreedEntry {
    eni: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cidr: Option<Ipv4Net>,
    #[serde(rename = "releasedAt")]
    released_at: u64,
}

impl FreedEntry {
    fn of(r: &FreedRecord) -> Self {
        Self {
            eni: r.eni_id.clone(),
            cidr: r.cidr,
            released_at: unix_ns(r.released_at),
        }
    }

    fn record(self) -> FreedRecord {
        FreedRecord {
            eni_id: self.eni,
            cidr: self.cidr,
            released_at: SystemTime::UNIX_EPOCH + Duration::from_nanos(self.released_at),
        }
    }
}

/// The whole side file as written: the cooldowns (always `cooling`, as every version wrote it),
/// then the recent releases when there are some.
#[derive(Debug, Serialize)]
struct SideFile {
    #[serde(flatten)]
    cooling: CoolingFile,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    freed: Vec<FreedEntry>,
    #[serde(
        rename = "releasesUnknownBefore",
        skip_serializing_if = "Option::is_none"
    )]
    unknown_before: Option<u64>,
}

/// Reads the recent releases of side-file bytes; anything unreadable is none.
fn parse_freed(bytes: &[u8]) -> Vec<FreedRecord> {
    serde_json::from_slice::<FreedFile>(bytes)
        .map(|f| f.freed.into_iter().map(FreedEntry::record).collect())
        .unwrap_or_default()
}

/// The side file's bytes: the cooldowns (always `cooling`, as every version wrote them), then
/// the recent releases when there are some.
fn side_bytes(side: &SideRecords) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec(&SideFile {
        cooling: CoolingFile::of(&side.cooling),
        freed: side.freed.iter().map(FreedEntry::of).collect(),
        unknown_before: side.unknown_before.map(unix_ns),
    })
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The checkpoint file: written to a temp file in the same directory, fsynced, renamed over the
/// target, then the directory is fsynced, so a crash leaves either the old or the new file.
#[derive(Debug, Clone)]
pub struct FileCheckpoint {
    path: PathBuf,
}

impl FileCheckpoint {
    /// A checkpoint at `path` (the directory is created on first store).
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cooldown side file: `<checkpoint>.cooldown` (e.g. `ipam.json.cooldown`).
    #[must_use]
    pub fn cooling_path(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".cooldown");
        PathBuf::from(name)
    }

    fn io(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
        move |source| CheckpointError::Io {
            op,
            path: self.path.clone(),
            source,
        }
    }
}

/// Parses checkpoint bytes.
pub fn parse(bytes: &[u8], path: &Path) -> Result<CheckpointData, CheckpointError> {
    let data: CheckpointData =
        serde_json::from_slice(bytes).map_err(|source| CheckpointError::Corrupt {
            path: path.to_owned(),
            source,
        })?;
    if data.version != CHECKPOINT_VERSION {
        return Err(CheckpointError::Version {
            path: path.to_owned(),
            found: data.version,
        });
    }
    Ok(data)
}

impl Checkpoint for FileCheckpoint {
    fn set_aside(&mut self) -> Result<Option<PathBuf>, CheckpointError> {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".corrupt");
        let aside = PathBuf::from(name);
        fs::rename(&self.path, &aside).map_err(self.io("set aside"))?;
        Ok(Some(aside))
    }

    fn load(&self) -> Result<Option<CheckpointData>, CheckpointError> {
        match fs::read(&self.path) {
            Ok(bytes) => parse(&bytes, &self.path).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read")(e)),
        }
    }

    fn store(&mut self, data: &CheckpointData) -> Result<(), CheckpointError> {
        let dir = self
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(self.io("create directory of"))?;
        let bytes = serde_json::to_vec(data).map_err(|source| CheckpointError::Corrupt {
            path: self.path.clone(),
            source,
        })?;
        let file_name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{file_name}.tmp"));
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(self.io("create temp for"))?;
            f.write_all(&bytes).map_err(self.io("write temp for"))?;
            f.sync_all().map_err(self.io("fsync temp for"))?;
        }
        fs::rename(&tmp, &self.path).map_err(self.io("rename temp over"))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(self.io("fsync directory of"))?;
        Ok(())
    }

    fn store_side(&mut self, side: &SideRecords, durable: bool) -> Result<(), CheckpointError> {
        let bytes = side_bytes(side).map_err(|source| CheckpointError::Corrupt {
            path: self.cooling_path(),
            source,
        })?;
        self.rewrite_side_file(&bytes, durable)
    }

    fn load_side(&self) -> SideRecords {
        match fs::read(self.cooling_path()) {
            Ok(bytes) => {
                let releases = serde_json::from_slice::<FreedFile>(&bytes);
                SideRecords {
                    cooling: parse_cooling(&bytes),
                    freed: parse_freed(&bytes),
                    lost: releases.is_err(),
                    unknown_before: releases
                        .ok()
                        .and_then(|f| f.unknown_before)
                        .map(|ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => SideRecords::default(),
            Err(_) => SideRecords {
                lost: true,
                ..SideRecords::default()
            },
        }
    }
}

impl FileCheckpoint {
    /// Replaces the side file with `bytes` (temp file, then rename; with `durable`, the temp
    /// file and the directory are fsynced as the checkpoint's are).
    fn rewrite_side_file(&self, bytes: &[u8], durable: bool) -> Result<(), CheckpointError> {
        let path = self.cooling_path();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(self.io("write cooldowns beside"))?;
            f.write_all(bytes)
                .map_err(self.io("write cooldowns beside"))?;
            if durable {
                f.sync_all().map_err(self.io("fsync cooldowns beside"))?;
            }
        }
        fs::rename(&tmp, &path).map_err(self.io("rename cooldowns beside"))?;
        if durable && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(self.io("fsync directory of"))?;
        }
        Ok(())
    }
}

/// In-memory checkpoint for tests: shares its state through an `Arc` so a test can "restart"
/// a datastore from it, and can be told to fail writes. Test builds only (the `fake` feature,
/// which only dev-dependencies turn on).
#[cfg(any(test, feature = "fake"))]
#[derive(Debug, Clone, Default)]
pub struct MemoryCheckpoint {
    inner: Arc<Mutex<MemoryState>>,
}

#[cfg(any(test, feature = "fake"))]
#[derive(Debug, Default)]
struct MemoryState {
    data: Option<CheckpointData>,
    side: SideRecords,
    fail_writes: bool,
    writes: u64,
}

#[cfg(any(test, feature = "fake"))]
impl MemoryCheckpoint {
    /// Empty (fresh node).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Make every following `store` fail (or succeed again).
    pub fn fail_writes(&self, fail: bool) {
        if let Ok(mut s) = self.inner.lock() {
            s.fail_writes = fail;
        }
    }

    /// The stored state.
    #[must_use]
    pub fn snapshot(&self) -> Option<CheckpointData> {
        self.inner.lock().ok().and_then(|s| s.data.clone())
    }

    /// Successful writes so far.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.inner.lock().map(|s| s.writes).unwrap_or(0)
    }
}

#[cfg(any(test, feature = "fake"))]
impl Checkpoint for MemoryCheckpoint {
    fn load(&self) -> Result<Option<CheckpointData>, CheckpointError> {
        Ok(self.snapshot())
    }

    fn store(&mut self, data: &CheckpointData) -> Result<(), CheckpointError> {
        let mut s = self.inner.lock().map_err(|_| CheckpointError::Injected)?;
        if s.fail_writes {
            return Err(CheckpointError::Injected);
        }
        s.data = Some(data.clone());
        s.writes += 1;
        Ok(())
    }

    fn store_side(&mut self, side: &SideRecords, _durable: bool) -> Result<(), CheckpointError> {
        let mut s = self.inner.lock().map_err(|_| CheckpointError::Injected)?;
        if s.fail_writes {
            return Err(CheckpointError::Injected);
        }
        s.side = side.clone();
        Ok(())
    }

    fn load_side(&self) -> SideRecords {
        self.inner
            .lock()
            .map(|s| s.side.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built from upstream's documented format (reference §1.4 and upstream's json tags).
    const UPSTREAM_FIXTURE: &str = r#"{"version":"vpc-cni-ipam/1","allocations":[
      {"networkName":"aws-cni","containerID":"3b1c2a9f","ifName":"eth0","ipv4":"198.18.0.21",
       "allocationTimestamp":1700000000123456789,"metadata":{"k8sPodNamespace":"default","k8sPodName":"nginx"}},
      {"networkName":"_migrated-from-cri","containerID":"77aa","ifName":"unknown","ipv4":"198.18.0.22",
       "allocationTimestamp":1600000000000000000,"metadata":{}}]}"#;

    #[test]
    fn reads_upstream_format() {
        let d = parse(UPSTREAM_FIXTURE.as_bytes(), Path::new("x")).unwrap();
        assert_eq!(d.allocations.len(), 2);
        let e = &d.allocations[0];
        assert_eq!(e.key, IpamKey::new("aws-cni", "3b1c2a9f", "eth0"));
        assert_eq!(
            e.ipv4().unwrap(),
            "198.18.0.21".parse::<Ipv4Addr>().unwrap()
        );
        assert_eq!(e.metadata.name, "nginx");
        assert_eq!(
            e.allocated_at()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
            1_700_000_000_123_456_789
        );
    }

    #[test]
    fn writes_upstream_field_names() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(5);
        let d = CheckpointData::new(vec![CheckpointEntry::new(
            IpamKey::new("aws-cni", "c1", "eth0"),
            "198.18.0.5".parse().unwrap(),
            PodMetadata {
                namespace: "ns".into(),
                name: "p".into(),
                interfaces_count: 0,
            },
            at,
        )]);
        let v: serde_json::Value = serde_json::to_value(&d).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"version":"vpc-cni-ipam/1","allocations":[{"networkName":"aws-cni","containerID":"c1",
              "ifName":"eth0","ipv4":"198.18.0.5","allocationTimestamp":5,"metadata":{"k8sPodNamespace":"ns","k8sPodName":"p"}}]})
        );
    }

    /// The side file's reader before IPv6 cooldowns were kept (IPv4 `cooling` only).
    #[derive(Debug, Deserialize)]
    struct IPv4OnlyCoolingFile {
        cooling: Vec<CoolingEntry<Ipv4Addr>>,
    }

    /// Issue 38: an unreadable release log is reported (`lost`), never read as "nothing
    /// released"; a missing side file is an empty log (written only once something was
    /// released; upstream's checkpoint has none).
    #[test]
    fn an_unreadable_release_log_is_lost_and_a_missing_one_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let cp = FileCheckpoint::new(dir.path().join("ipam.json"));
        fs::write(dir.path().join("ipam.json"), b"{}").unwrap();
        assert!(!cp.load_side().lost, "missing side file: an empty log");
        fs::write(cp.cooling_path(), b"\x00\x17garbage").unwrap();
        assert!(cp.load_side().lost, "garbage side file");
        fs::write(cp.cooling_path(), br#"{"cooling":[],"freed":[{"eni":7}]}"#).unwrap();
        let side = cp.load_side();
        assert!(side.lost && side.freed.is_empty(), "releases unreadable");
        fs::write(cp.cooling_path(), br#"{"cooling":[]}"#).unwrap();
        assert!(!cp.load_side().lost, "a side file without releases");
    }

    #[test]
    fn cooldown_side_file_keeps_both_families_and_both_directions_of_a_version_change() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_000_000_005);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let both = [(ip("198.18.0.5"), t), (ip("2001:db8::1"), t)];
        // (bytes, what this version reads, what the IPv4-only version reads: None = fails)
        let written_both = serde_json::to_vec(&CoolingFile::of(&both)).unwrap();
        let written_v4 = serde_json::to_vec(&CoolingFile::of(&both[..1])).unwrap();
        let old_file = br#"{"cooling":[{"ip":"198.18.0.5","releasedAt":1700000000000000005}]}"#;
        type Row<'a> = (&'a [u8], Vec<(IpAddr, SystemTime)>, Option<usize>, &'a str);
        let table: &[Row<'_>] = &[
            (
                &written_both,
                both.to_vec(),
                Some(1),
                "both families; the old reader keeps IPv4",
            ),
            (&written_v4, both[..1].to_vec(), Some(1), "IPv4 only"),
            (
                old_file,
                both[..1].to_vec(),
                Some(1),
                "a file of the IPv4-only version",
            ),
            (
                b"{not json",
                Vec::new(),
                None,
                "unreadable: no cooldown (advisory)",
            ),
            (
                br#"{"cooling":[],"coolingV6":[{"ip":"198.18.0.5","releasedAt":1}]}"#,
                Vec::new(),
                Some(0),
                "a wrong family: unreadable",
            ),
        ];
        for (bytes, want, old_reads, why) in table {
            assert_eq!(&parse_cooling(bytes), want, "{why}");
            let old = serde_json::from_slice::<IPv4OnlyCoolingFile>(bytes).ok();
            assert_eq!(old.map(|f| f.cooling.len()), *old_reads, "{why}");
        }
        // An IPv4-only node writes exactly what the IPv4-only version wrote.
        assert_eq!(written_v4, old_file.to_vec());
        assert_eq!(
            String::from_utf8(written_both).unwrap(),
            r#"{"cooling":[{"ip":"198.18.0.5","releasedAt":1700000000000000005}],"coolingV6":[{"ip":"2001:db8::1","releasedAt":1700000000000000005}]}"#
        );
    }

    #[test]
    fn recent_releases_share_the_side_file_and_both_directions_of_a_version_change() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_000_000_005);
        let cooling = [("198.18.0.5".parse::<IpAddr>().unwrap(), t)];
        let freed = vec![
            FreedRecord {
                eni_id: "eni-1".into(),
                cidr: Some("198.18.0.6/32".parse().unwrap()),
                released_at: t,
            },
            FreedRecord {
                eni_id: "eni-2".into(),
                cidr: None,
                released_at: t,
            },
        ];
        let old_file = br#"{"cooling":[{"ip":"198.18.0.5","releasedAt":1700000000000000005}]}"#;
        // Nothing released: exactly the bytes the versions before wrote.
        let side = |cooling: &[(IpAddr, SystemTime)], freed: &[FreedRecord]| {
            side_bytes(&SideRecords {
                cooling: cooling.to_vec(),
                freed: freed.to_vec(),
                lost: false,
                unknown_before: None,
            })
            .unwrap()
        };
        assert_eq!(side(&cooling, &[]), old_file.to_vec());
        // A release recorded into a file of a version before: its cooldowns kept.
        let both = side(&parse_cooling(old_file), &freed);
        assert_eq!(
            String::from_utf8(both.clone()).unwrap(),
            r#"{"cooling":[{"ip":"198.18.0.5","releasedAt":1700000000000000005}],"freed":[{"eni":"eni-1","cidr":"198.18.0.6/32","releasedAt":1700000000000000005},{"eni":"eni-2","releasedAt":1700000000000000005}]}"#
        );
        assert_eq!(parse_cooling(&both), cooling.to_vec());
        assert_eq!(parse_freed(&both), freed);
        // The versions that know only the cooldowns (IPv4 only; both families) still read it.
        let v4_only = serde_json::from_slice::<IPv4OnlyCoolingFile>(&both).unwrap();
        assert_eq!(v4_only.cooling.len(), 1);
        assert_eq!(
            serde_json::from_slice::<CoolingFile>(&both)
                .unwrap()
                .entries(),
            cooling.to_vec()
        );
        // New cooldowns keep the releases; a file of a version before has none.
        let later = side(&[], &parse_freed(&both));
        assert_eq!(parse_freed(&later), freed);
        assert!(parse_cooling(&later).is_empty());
        assert!(parse_freed(old_file).is_empty());
        // An unreadable part loses only itself.
        let bad_freed = br#"{"cooling":[{"ip":"198.18.0.5","releasedAt":1700000000000000005}],"freed":[{"eni":1}]}"#;
        assert_eq!(parse_cooling(bad_freed), cooling.to_vec());
        assert!(parse_freed(bad_freed).is_empty());
        let bad_cooling = br#"{"cooling":[{"ip":"x"}],"freed":[{"eni":"eni-2","releasedAt":1700000000000000005}]}"#;
        assert!(parse_cooling(bad_cooling).is_empty());
        assert_eq!(parse_freed(bad_cooling), freed[1..].to_vec());
    }

    #[test]
    fn cooldowns_and_recent_releases_round_trip_beside_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut cp = FileCheckpoint::new(dir.path().join("ipam.json"));
        assert!(cp.load_freed().is_empty(), "no file: nothing released");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let freed = vec![FreedRecord {
            eni_id: "eni-1".into(),
            cidr: Some("198.18.0.32/28".parse().unwrap()),
            released_at: t,
        }];
        let cooling = vec![("198.18.0.5".parse().unwrap(), t)];
        let records = SideRecords {
            cooling: cooling.clone(),
            freed: freed.clone(),
            lost: false,
            unknown_before: None,
        };
        cp.store_side(&records, true).unwrap();
        assert_eq!(
            (cp.load_cooling(), cp.load_freed()),
            (cooling.clone(), freed)
        );
        cp.store_side(
            &SideRecords {
                cooling: cooling.clone(),
                freed: vec![],
                lost: false,
                unknown_before: None,
            },
            false,
        )
        .unwrap();
        assert_eq!((cp.load_cooling(), cp.load_freed()), (cooling, vec![]));
        assert!(cp.load().unwrap().is_none(), "ipam.json untouched");
    }

    #[test]
    fn cooldown_side_file_round_trip_beside_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut cp = FileCheckpoint::new(dir.path().join("ipam.json"));
        assert!(cp.load_cooling().is_empty(), "no file: no cooldown");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let cooling = vec![
            ("198.18.0.5".parse().unwrap(), t),
            ("2001:db8::1".parse().unwrap(), t),
        ];
        let only = |cooling: &[(IpAddr, SystemTime)]| SideRecords {
            cooling: cooling.to_vec(),
            freed: vec![],
            lost: false,
            unknown_before: None,
        };
        cp.store_side(&only(&cooling), false).unwrap();
        assert_eq!(cp.load_cooling(), cooling);
        assert!(cp.load().unwrap().is_none(), "ipam.json untouched");
        cp.store_side(&only(&[]), false).unwrap();
        assert!(cp.load_cooling().is_empty(), "replaced, not appended");
    }

    #[test]
    fn file_round_trip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ipam.json");
        let mut cp = FileCheckpoint::new(&path);
        assert!(cp.load().unwrap().is_none());
        let d = parse(UPSTREAM_FIXTURE.as_bytes(), &path).unwrap();
        cp.store(&d).unwrap();
        assert_eq!(cp.load().unwrap().unwrap(), d);
        assert!(!dir.path().join("sub/.ipam.json.tmp").exists());
        fs::write(&path, b"{not json").unwrap();
        assert!(matches!(cp.load(), Err(CheckpointError::Corrupt { .. })));
        fs::write(&path, br#"{"version":"vpc-cni-ipam/2","allocations":[]}"#).unwrap();
        assert!(matches!(cp.load(), Err(CheckpointError::Version { .. })));
    }
}
