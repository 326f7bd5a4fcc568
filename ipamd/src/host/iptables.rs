//! The iptables layer of host networking: rule values in iptables-save's canonical text, parsing
//! of `iptables-save`, the pure diff from installed to desired rules (add missing, delete stale,
//! drop chains of older layouts), rendering that diff as one atomic `iptables-restore --noflush`
//! batch, and choosing the legacy or nf_tables backend. Must not: decide which rules are desired
//! (see [`super::snat`]) or touch routes and ip rules.

use std::collections::BTreeMap;
use std::fmt;

use super::command::{CommandError, CommandRunner};

/// An iptables table this module manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// `nat`.
    Nat,
    /// `mangle`.
    Mangle,
}

impl Table {
    /// All managed tables, in the order they are written.
    pub const ALL: [Self; 2] = [Self::Nat, Self::Mangle];

    /// The table's name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Nat => "nat",
            Self::Mangle => "mangle",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        match name {
            "nat" => Some(Self::Nat),
            "mangle" => Some(Self::Mangle),
            _ => None,
        }
    }
}

/// One rule: table, chain and the rule spec exactly as `iptables-save` prints it after
/// `-A <chain> ` (so desired and installed rules compare as text).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IptablesRule {
    /// Table.
    pub table: Table,
    /// Chain.
    pub chain: String,
    /// Canonical spec, e.g. `-d 10.0.0.0/16 -m comment --comment "AWS SNAT CHAIN" -j RETURN`.
    pub spec: String,
}

impl IptablesRule {
    /// A rule in `table`/`chain`.
    #[must_use]
    pub fn new(table: Table, chain: &str, spec: impl Into<String>) -> Self {
        Self {
            table,
            chain: chain.to_owned(),
            spec: spec.into(),
        }
    }
}

impl fmt::Display for IptablesRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "-t {} -A {} {}",
            self.table.name(),
            self.chain,
            self.spec
        )
    }
}

/// Prefixes of the chains this module owns. Every chain with one of these prefixes that the
/// desired rules do not mention (e.g. `AWS-SNAT-CHAIN-1..N` of the chain-per-CIDR layout) is
/// stale and removed.
pub const OWNED_CHAIN_PREFIXES: [&str; 2] = ["AWS-SNAT-CHAIN-", "AWS-CONNMARK-CHAIN-"];

/// Comments that mark a rule in a built-in chain as ours (the exact strings existing nodes carry,
/// so rules a previous aws-node left behind are recognised and converged).
pub const OWNED_COMMENTS: [&str; 4] = [
    "\"AWS SNAT CHAIN\"",
    "\"AWS, CONNMARK\"",
    "\"AWS, outbound connections\"",
    "\"AWS, primary ENI\"",
];

fn is_owned_chain(chain: &str) -> bool {
    OWNED_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// Whether a rule in a built-in chain belongs to us: one of our comments, or a jump into one of
/// our chains.
fn is_owned_builtin_rule(spec: &str) -> bool {
    OWNED_COMMENTS
        .iter()
        .any(|c| spec.contains(&format!("--comment {c}")))
        || spec
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .any(|w| w[0] == "-j" && is_owned_chain(w[1]))
}

/// The managed tables as `iptables-save` printed them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Per table: chain name -> rule specs in order. Declared-but-empty chains are present with
    /// no rules.
    pub tables: BTreeMap<Table, BTreeMap<String, Vec<String>>>,
}

impl Ruleset {
    /// Parses `iptables-save` output, keeping only the managed tables.
    #[must_use]
    pub fn parse(save: &str) -> Self {
        let mut out = Self::default();
        let mut current: Option<Table> = None;
        for line in save.lines() {
            let line = line.trim_end();
            if let Some(name) = line.strip_prefix('*') {
                current = Table::from_name(name.trim());
                if let Some(t) = current {
                    out.tables.entry(t).or_default();
                }
                continue;
            }
            let Some(table) = current else { continue };
            let chains = out.tables.entry(table).or_default();
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    chains.entry(name.to_owned()).or_default();
                }
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
                chains
                    .entry(chain.to_owned())
                    .or_default()
                    .push(spec.to_owned());
            }
        }
        out
    }

    /// Rules of `table`/`chain` (empty if absent).
    #[must_use]
    pub fn chain(&self, table: Table, chain: &str) -> &[String] {
        self.tables
            .get(&table)
            .and_then(|c| c.get(chain))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether `table` declares `chain`.
    #[must_use]
    pub fn has_chain(&self, table: Table, chain: &str) -> bool {
        self.tables
            .get(&table)
            .is_some_and(|c| c.contains_key(chain))
    }

    /// Whether any of our chains or rules is present.
    #[must_use]
    pub fn has_owned_state(&self) -> bool {
        self.tables.values().any(|chains| {
            chains.iter().any(|(name, rules)| {
                is_owned_chain(name) || rules.iter().any(|r| is_owned_builtin_rule(r))
            })
        })
    }
}

/// One change to the installed rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IptablesOp {
    /// Create an owned chain, or flush it if it exists (restore's chain declaration).
    ResetChain {
        /// Table.
        table: Table,
        /// Chain.
        chain: String,
    },
    /// Append a rule.
    Append(IptablesRule),
    /// Delete the rule at 1-based `position` of a built-in chain (positions of the snapshot;
    /// deletions are ordered from the highest position down so they stay valid).
    DeleteAt {
        /// Table.
        table: Table,
        /// Chain.
        chain: String,
        /// 1-based position.
        position: usize,
        /// The rule's spec, for logs.
        spec: String,
    },
    /// Flush a stale owned chain.
    FlushChain {
        /// Table.
        table: Table,
        /// Chain.
        chain: String,
    },
    /// Delete a (flushed, unreferenced) stale owned chain.
    DeleteChain {
        /// Table.
        table: Table,
        /// Chain.
        chain: String,
    },
}

impl IptablesOp {
    fn table(&self) -> Table {
        match self {
            Self::Append(r) => r.table,
            Self::ResetChain { table, .. }
            | Self::DeleteAt { table, .. }
            | Self::FlushChain { table, .. }
            | Self::DeleteChain { table, .. } => *table,
        }
    }

    fn restore_line(&self) -> String {
        match self {
            Self::ResetChain { chain, .. } => format!(":{chain} - [0:0]"),
            Self::Append(r) => format!("-A {} {}", r.chain, r.spec),
            Self::DeleteAt {
                chain, position, ..
            } => format!("-D {chain} {position}"),
            Self::FlushChain { chain, .. } => format!("-F {chain}"),
            Self::DeleteChain { chain, .. } => format!("-X {chain}"),
        }
    }
}

impl fmt::Display for IptablesOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeleteAt { chain, spec, .. } => {
                write!(f, "-t {} -D {chain} {spec}", self.table().name())
            }
            other => write!(f, "-t {} {}", other.table().name(), other.restore_line()),
        }
    }
}

/// The changes that turn `installed` into `desired` (pure).
///
/// - An owned chain whose rules differ from the desired list (content or order) is reset and
///   refilled, atomically within the batch.
/// - In a built-in chain, our rules (see [`OWNED_COMMENTS`]) must equal the desired ones in
///   order: the longest matching prefix stays, the rest of ours is deleted and the missing tail
///   appended. Other software's rules are never touched.
/// - Owned chains not in `desired` are flushed and deleted after all references are gone.
///
/// An empty result means the host already matches.
#[must_use]
pub fn diff(installed: &Ruleset, desired: &[IptablesRule]) -> Vec<IptablesOp> {
    let mut resets = Vec::new();
    let mut deletes = Vec::new();
    let mut appends = Vec::new();
    let mut flushes = Vec::new();
    let mut removals = Vec::new();

    for table in Table::ALL {
        // Desired rules per chain, in order of first appearance.
        let mut wanted: Vec<(String, Vec<&IptablesRule>)> = Vec::new();
        for rule in desired.iter().filter(|r| r.table == table) {
            match wanted.iter_mut().find(|(c, _)| *c == rule.chain) {
                Some((_, rules)) => rules.push(rule),
                None => wanted.push((rule.chain.clone(), vec![rule])),
            }
        }

        for (chain, rules) in &wanted {
            let present = installed.chain(table, chain);
            if is_owned_chain(chain) {
                let same = installed.has_chain(table, chain)
                    && present.len() == rules.len()
                    && present.iter().zip(rules).all(|(p, r)| *p == r.spec);
                if !same {
                    resets.push(IptablesOp::ResetChain {
                        table,
                        chain: chain.clone(),
                    });
                    appends.extend(rules.iter().map(|r| IptablesOp::Append((*r).clone())));
                }
            } else {
                let ours: Vec<(usize, &String)> = present
                    .iter()
                    .enumerate()
                    .filter(|(_, spec)| is_owned_builtin_rule(spec))
                    .map(|(i, spec)| (i + 1, spec))
                    .collect();
                let keep = ours
                    .iter()
                    .zip(rules.iter())
                    .take_while(|((_, have), want)| **have == want.spec)
                    .count();
                for (position, spec) in ours[keep..].iter().rev() {
                    deletes.push(IptablesOp::DeleteAt {
                        table,
                        chain: chain.clone(),
                        position: *position,
                        spec: (*spec).clone(),
                    });
                }
                appends.extend(
                    rules[keep..]
                        .iter()
                        .map(|r| IptablesOp::Append((*r).clone())),
                );
            }
        }

        // Built-in chains with none of our rules desired: delete all of ours.
        if let Some(chains) = installed.tables.get(&table) {
            for (chain, present) in chains {
                if wanted.iter().any(|(c, _)| c == chain) {
                    continue;
                }
                if is_owned_chain(chain) {
                    flushes.push(IptablesOp::FlushChain {
                        table,
                        chain: chain.clone(),
                    });
                    removals.push(IptablesOp::DeleteChain {
                        table,
                        chain: chain.clone(),
                    });
                    continue;
                }
                for (i, spec) in present.iter().enumerate().rev() {
                    if is_owned_builtin_rule(spec) {
                        deletes.push(IptablesOp::DeleteAt {
                            table,
                            chain: chain.clone(),
                            position: i + 1,
                            spec: spec.clone(),
                        });
                    }
                }
            }
        }
    }

    // Order matters inside the batch: create/reset chains before jumping to them, delete by
    // position before appending, drop references before deleting chains.
    let mut ops = resets;
    ops.extend(deletes);
    ops.extend(flushes);
    ops.extend(appends);
    ops.extend(removals);
    ops
}

/// Renders ops as one `iptables-restore --noflush` input (one `*table ... COMMIT` per table).
#[must_use]
pub fn restore_script(ops: &[IptablesOp]) -> String {
    let mut out = String::new();
    for table in Table::ALL {
        let lines: Vec<String> = ops
            .iter()
            .filter(|op| op.table() == table)
            .map(IptablesOp::restore_line)
            .collect();
        if lines.is_empty() {
            continue;
        }
        out.push('*');
        out.push_str(table.name());
        out.push('\n');
        // Chain declarations first, as iptables-save writes them.
        for line in lines.iter().filter(|l| l.starts_with(':')) {
            out.push_str(line);
            out.push('\n');
        }
        for line in lines.iter().filter(|l| !l.starts_with(':')) {
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Which iptables implementation programs the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-legacy` (x_tables).
    Legacy,
    /// `iptables-nft` (nf_tables with the xtables compatibility layer).
    Nft,
}

impl Backend {
    /// The `*-save` program.
    #[must_use]
    pub fn save_program(self) -> &'static str {
        match self {
            Self::Legacy => "iptables-legacy-save",
            Self::Nft => "iptables-nft-save",
        }
    }

    /// The `*-restore` program.
    #[must_use]
    pub fn restore_program(self) -> &'static str {
        match self {
            Self::Legacy => "iptables-legacy-restore",
            Self::Nft => "iptables-nft-restore",
        }
    }

    /// The other backend.
    #[must_use]
    pub fn other(self) -> Self {
        match self {
            Self::Legacy => Self::Nft,
            Self::Nft => Self::Legacy,
        }
    }
}

/// What the operator asked for (config); `Auto` detects like Kubernetes' iptables-wrapper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Detect (the default).
    #[default]
    Auto,
    /// Force one backend.
    Fixed(Backend),
}

/// Facts used to pick a backend (pure input of [`choose_backend`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendEvidence {
    /// `iptables-legacy-save` output, if it ran.
    pub legacy_save: Option<String>,
    /// `iptables-nft-save` output, if it ran.
    pub nft_save: Option<String>,
    /// `iptables --version` output, if it ran (`iptables v1.8.9 (nf_tables)`).
    pub version: Option<String>,
}

/// Chains kubelet creates in the backend it uses; their presence is decisive.
const KUBELET_HINT_CHAINS: [&str; 2] = [":KUBE-IPTABLES-HINT", ":KUBE-KUBELET-CANARY"];

fn rule_count(save: Option<&str>) -> usize {
    save.map_or(0, |s| s.lines().filter(|l| l.starts_with("-A ")).count())
}

fn has_kubelet_hint(save: Option<&str>) -> bool {
    save.is_some_and(|s| {
        s.lines()
            .any(|l| KUBELET_HINT_CHAINS.iter().any(|h| l.starts_with(h)))
    })
}

/// Picks the backend as iptables-wrapper does: the backend kubelet's hint chains live in; else
/// the one with more rules; on a tie the mode `iptables --version` reports; else nf_tables.
#[must_use]
pub fn choose_backend(evidence: &BackendEvidence) -> Backend {
    let legacy = evidence.legacy_save.as_deref();
    let nft = evidence.nft_save.as_deref();
    match (has_kubelet_hint(legacy), has_kubelet_hint(nft)) {
        (true, false) => return Backend::Legacy,
        (false, true) => return Backend::Nft,
        _ => {}
    }
    let (l, n) = (rule_count(legacy), rule_count(nft));
    if l != n {
        return if l > n { Backend::Legacy } else { Backend::Nft };
    }
    match evidence.version.as_deref() {
        Some(v) if v.contains("(legacy)") => Backend::Legacy,
        _ => Backend::Nft,
    }
}

/// Whether the iptables version supports `--random-fully` (1.6.2+); unknown means yes.
#[must_use]
pub fn supports_random_fully(version: Option<&str>) -> bool {
    let Some(v) = version else { return true };
    let Some(num) = v
        .split_whitespace()
        .find_map(|w| w.strip_prefix('v'))
        .map(|n| {
            n.split('.')
                .map(|p| p.parse::<u32>().unwrap_or(0))
                .collect::<Vec<_>>()
        })
    else {
        return true;
    };
    let part = |i: usize| num.get(i).copied().unwrap_or(0);
    (part(0), part(1), part(2)) >= (1, 6, 2)
}

/// Why installing rules failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// Reading the installed rules failed.
    #[error("read iptables rules")]
    Save(#[source] CommandError),
    /// The restore batch was refused; nothing of it was applied.
    #[error("apply iptables rules")]
    Restore(#[source] CommandError),
    /// Inserting a single rule (the FORWARD reject of the egress range) failed.
    #[error("insert iptables rule")]
    Insert(#[source] CommandError),
}

/// The iptables programs of one namespace, with the chosen backend.
#[derive(Debug)]
pub struct Iptables<'a> {
    runner: &'a dyn CommandRunner,
    backend: Backend,
    random_fully: bool,
}

impl<'a> Iptables<'a> {
    /// Detects the backend (or takes the forced one) and the `--random-fully` capability.
    /// Blocking.
    pub fn detect(runner: &'a dyn CommandRunner, choice: BackendChoice) -> Self {
        let version = runner.run("iptables", &["--version"], None).ok();
        let backend = match choice {
            BackendChoice::Fixed(b) => b,
            BackendChoice::Auto => choose_backend(&BackendEvidence {
                legacy_save: runner.run(Backend::Legacy.save_program(), &[], None).ok(),
                nft_save: runner.run(Backend::Nft.save_program(), &[], None).ok(),
                version: version.clone(),
            }),
        };
        Self {
            runner,
            backend,
            random_fully: supports_random_fully(version.as_deref()),
        }
    }

    /// The backend in use.
    #[must_use]
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether `--random-fully` is available.
    #[must_use]
    pub fn random_fully(&self) -> bool {
        self.random_fully
    }

    /// Reads the managed tables of `backend`. Blocking.
    pub fn installed(&self, backend: Backend) -> Result<Ruleset, IptablesError> {
        // No `-t`: naming a table would instantiate it (legacy), listing only shows what exists.
        let save = self
            .runner
            .run(backend.save_program(), &[], None)
            .map_err(IptablesError::Save)?;
        Ok(Ruleset::parse(&save))
    }

    /// Converges the chosen backend to `desired`, and removes our rules from the other backend
    /// if an older install left them there. Returns the ops applied. Blocking.
    pub fn converge(&self, desired: &[IptablesRule]) -> Result<Vec<IptablesOp>, IptablesError> {
        let installed = self.installed(self.backend)?;
        let mut ops = diff(&installed, desired);
        self.apply(self.backend, &ops)?;
        // Cross-backend leftovers (e.g. legacy rules after the host moved to nf_tables). The
        // other backend may be unusable here; that is not an error.
        let other = self.backend.other();
        if let Ok(stale) = self.installed(other)
            && stale.has_owned_state()
        {
            let cleanup = diff(&stale, &[]);
            self.apply(other, &cleanup)?;
            ops.extend(cleanup);
        }
        Ok(ops)
    }

    fn apply(&self, backend: Backend, ops: &[IptablesOp]) -> Result<(), IptablesError> {
        if ops.is_empty() {
            return Ok(());
        }
        let script = restore_script(ops);
        self.runner
            .run(backend.restore_program(), &["--noflush"], Some(&script))
            .map(drop)
            .map_err(IptablesError::Restore)
    }
}

#[cfg(test)]
mod tests;
