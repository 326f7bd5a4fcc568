//! The native nftables connmark of a node whose iptables is the nf_tables backend: the table
//! `ip aws-cni` with the base chain `nat-prerouting` (type nat, hook prerouting, priority -90 =
//! dstnat + 10, so it runs after kube-proxy's nftables DNAT) and the regular chain `snat-mark`;
//! names, priority and rule bytecode are what existing nodes carry, so a node taken over keeps its
//! table (docs/compatibility.md, "Code cross-references"). Owns: the desired table as a pure
//! function of [`SnatConfig`], parsing `nft -j list table ip aws-cni`, the pure plan from observed
//! to desired, rendering it as one atomic `nft -f -` transaction, and running `nft` through a
//! [`CommandRunner`]. Must not: touch any other nftables table (kube-proxy's, iptables-nft's
//! `ip nat`/`ip mangle`), iptables rules (see [`super::iptables`]), or decide the backend (the
//! iptables backend decides it, [`ConnmarkBackend::for_iptables`]).

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde_json::Value;

use super::command::{CommandError, CommandRunner};
use super::iptables::Backend;
use super::snat::SnatConfig;

/// The connmark table's name (family `ip`).
pub const TABLE: &str = "aws-cni";
/// The base chain hooked at prerouting.
pub const BASE_CHAIN: &str = "nat-prerouting";
/// The chain that marks connections to non-exempt destinations.
pub const MARK_CHAIN: &str = "snat-mark";
/// The base chain's priority: dstnat (-100) + 10.
pub const BASE_PRIORITY: i64 = -90;
/// The `nft` program.
pub const NFT: &str = "nft";

/// Where the pod connmark (nat PREROUTING) lives on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnmarkBackend {
    /// `AWS-CONNMARK-CHAIN-0` in iptables' nat table (a legacy-iptables node).
    Iptables,
    /// The table `ip aws-cni` (a node whose iptables is nf_tables).
    Nftables,
}

impl ConnmarkBackend {
    /// The native nft table exactly when iptables is the nf_tables backend; the backend decision
    /// itself is made once, by [`super::iptables::Iptables::detect`].
    #[must_use]
    pub fn for_iptables(backend: Backend) -> Self {
        match backend {
            Backend::Legacy => Self::Iptables,
            Backend::Nft => Self::Nftables,
        }
    }

    /// The `backend` label of `awscni_connmark_backend` (`nftables` or `iptables`).
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
        }
    }
}

/// One rule of the table, recognised from `nft -j` output (or desired).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum NftRule {
    /// `fib daddr type local return`.
    FibLocalReturn,
    /// `iifname "<prefix>*" counter jump snat-mark`.
    JumpFromVeths {
        /// The veth prefix (`AWS_VPC_K8S_CNI_VETHPREFIX`).
        prefix: String,
    },
    /// `counter meta mark set ct mark & <mark>`.
    RestoreMark {
        /// `AWS_VPC_K8S_CNI_CONNMARK`.
        mark: u32,
    },
    /// `counter ip daddr <cidr> return`.
    ReturnTo(Ipv4Net),
    /// `counter ct mark set ct mark | <mark>`.
    SetMark {
        /// `AWS_VPC_K8S_CNI_CONNMARK`.
        mark: u32,
    },
    /// Anything else (observed only): the rule's expressions as JSON.
    Other(String),
}

impl NftRule {
    /// The statement in `nft` syntax that produces the bytecode existing tables carry (e.g. the
    /// CIDR match as `ip daddr & <mask> == <net>`: a 4-byte load, a bitwise mask and a compare;
    /// `ip daddr 10.0.0.0/8` would compile to a 1-byte load and never compare equal). `None` for
    /// [`NftRule::Other`].
    #[must_use]
    pub fn statement(&self) -> Option<String> {
        Some(match self {
            Self::FibLocalReturn => "fib daddr type local return".to_owned(),
            Self::JumpFromVeths { prefix } => {
                format!("iifname \"{prefix}*\" counter jump {MARK_CHAIN}")
            }
            Self::RestoreMark { mark } => format!("counter meta mark set ct mark & {mark:#010x}"),
            Self::ReturnTo(cidr) => format!(
                "counter ip daddr & {} == {} return",
                cidr.netmask(),
                cidr.network()
            ),
            Self::SetMark { mark } => format!("counter ct mark set ct mark | {mark:#010x}"),
            Self::Other(_) => return None,
        })
    }
}

impl fmt::Display for NftRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(json) => write!(f, "{json}"),
            other => write!(f, "{}", other.statement().unwrap_or_default()),
        }
    }
}

/// The connmark table a node must have (desired).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnmarkTable {
    /// `AWS_VPC_K8S_CNI_VETHPREFIX`.
    pub veth_prefix: String,
    /// `AWS_VPC_K8S_CNI_CONNMARK`.
    pub mark: u32,
    /// VPC CIDRs then `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS`, network-truncated, de-duplicated.
    pub exempt: Vec<Ipv4Net>,
}

impl ConnmarkTable {
    /// The base chain's rules, in order.
    #[must_use]
    pub fn base_rules(&self) -> Vec<NftRule> {
        vec![
            NftRule::FibLocalReturn,
            NftRule::JumpFromVeths {
                prefix: self.veth_prefix.clone(),
            },
            NftRule::RestoreMark { mark: self.mark },
        ]
    }

    /// The mark chain's rules: one return per exempt CIDR in reverse order (what insert-at-top
    /// leaves in the iptables chain; the order of the returns does not matter), then the set-mark
    /// rule.
    #[must_use]
    pub fn mark_rules(&self) -> Vec<NftRule> {
        let mut rules: Vec<NftRule> = self
            .exempt
            .iter()
            .rev()
            .map(|c| NftRule::ReturnTo(*c))
            .collect();
        rules.push(NftRule::SetMark { mark: self.mark });
        rules
    }

    /// The whole table as one `nft -f` block.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = format!("table ip {TABLE} {{\n\tchain {BASE_CHAIN} {{\n");
        out.push_str(&format!(
            "\t\ttype nat hook prerouting priority {BASE_PRIORITY}; policy accept;\n"
        ));
        for r in self.base_rules() {
            out.push_str(&format!("\t\t{r}\n"));
        }
        out.push_str(&format!("\t}}\n\tchain {MARK_CHAIN} {{\n"));
        for r in self.mark_rules() {
            out.push_str(&format!("\t\t{r}\n"));
        }
        out.push_str("\t}\n}\n");
        out
    }
}

/// The desired table (pure): absent under `AWS_VPC_K8S_CNI_EXTERNALSNAT`, otherwise exempting the
/// VPC CIDRs and `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS`.
#[must_use]
pub fn desired_table(cfg: &SnatConfig) -> Option<ConnmarkTable> {
    if cfg.external_snat {
        return None;
    }
    let mut exempt: Vec<Ipv4Net> = Vec::new();
    for c in cfg.vpc_cidrs.iter().chain(&cfg.exclude_cidrs) {
        let c = c.trunc();
        if !exempt.contains(&c) {
            exempt.push(c);
        }
    }
    Some(ConnmarkTable {
        veth_prefix: cfg.veth_prefix.clone(),
        mark: cfg.connmark,
        exempt,
    })
}

/// A base chain's hook settings as `nft -j` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChainSpec {
    /// `type` (`nat`).
    pub kind: String,
    /// `hook` (`prerouting`).
    pub hook: String,
    /// `prio` (-90).
    pub priority: i64,
    /// `policy` (`accept`).
    pub policy: String,
}

impl BaseChainSpec {
    /// The `nat-prerouting` settings a converged table has (type nat, hook prerouting,
    /// [`BASE_PRIORITY`]).
    #[must_use]
    pub fn upstream() -> Self {
        Self {
            kind: "nat".into(),
            hook: "prerouting".into(),
            priority: BASE_PRIORITY,
            policy: "accept".into(),
        }
    }
}

/// One chain of the observed table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedChain {
    /// Hook settings of a base chain; `None` for a regular chain.
    pub base: Option<BaseChainSpec>,
    /// Rules in order.
    pub rules: Vec<NftRule>,
}

/// The table `ip aws-cni` as `nft -j list table ip aws-cni` printed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedTable {
    /// Chains by name, in listing order.
    pub chains: Vec<(String, ObservedChain)>,
}

impl ObservedTable {
    fn chain(&self, name: &str) -> Option<&ObservedChain> {
        self.chains.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// Whether the table is exactly `desired` (pure). The base chain must hold its three rules in
    /// order; the mark chain its returns in any order (a set) followed by the set-mark rule; no
    /// other chain or rule.
    #[must_use]
    pub fn matches(&self, desired: &ConnmarkTable) -> bool {
        if self.chains.len() != 2 {
            return false;
        }
        let (Some(base), Some(mark)) = (self.chain(BASE_CHAIN), self.chain(MARK_CHAIN)) else {
            return false;
        };
        if base.base.as_ref() != Some(&BaseChainSpec::upstream())
            || base.rules != desired.base_rules()
            || mark.base.is_some()
        {
            return false;
        }
        let want = desired.mark_rules();
        let (Some(last), Some(want_last)) = (mark.rules.last(), want.last()) else {
            return false;
        };
        let have: BTreeSet<&NftRule> = mark.rules[..mark.rules.len() - 1].iter().collect();
        let wanted: BTreeSet<&NftRule> = want[..want.len() - 1].iter().collect();
        last == want_last && have.len() == mark.rules.len() - 1 && have == wanted
    }
}

/// Why reading or programming the table failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// `nft` could not list the tables (missing program, no nf_tables in the kernel).
    #[error("list nftables")]
    List(#[source] CommandError),
    /// `nft -j` printed something that is not its JSON.
    #[error("parse nft -j output")]
    Parse(#[source] serde_json::Error),
    /// The transaction was refused; nothing of it was applied.
    #[error("apply nftables connmark")]
    Apply(#[source] CommandError),
}

/// Whether `nft -j list tables` lists `ip aws-cni`.
pub fn lists_table(json: &str) -> Result<bool, NftError> {
    let doc: Value = serde_json::from_str(json).map_err(NftError::Parse)?;
    Ok(objects(&doc, "table").any(|t| {
        t.get("family").and_then(Value::as_str) == Some("ip")
            && t.get("name").and_then(Value::as_str) == Some(TABLE)
    }))
}

fn objects<'a>(doc: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    doc.get("nftables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(move |o| o.get(kind))
}

/// Parses `nft -j list table ip aws-cni` (pure).
pub fn parse_table(json: &str) -> Result<ObservedTable, NftError> {
    let doc: Value = serde_json::from_str(json).map_err(NftError::Parse)?;
    let mut table = ObservedTable::default();
    for c in objects(&doc, "chain") {
        let Some(name) = c.get("name").and_then(Value::as_str) else {
            continue;
        };
        let base = c.get("hook").map(|hook| BaseChainSpec {
            kind: str_of(c.get("type")),
            hook: str_of(Some(hook)),
            priority: c.get("prio").and_then(Value::as_i64).unwrap_or(i64::MIN),
            policy: str_of(c.get("policy")),
        });
        table.chains.push((
            name.to_owned(),
            ObservedChain {
                base,
                rules: Vec::new(),
            },
        ));
    }
    for r in objects(&doc, "rule") {
        let Some(chain) = r.get("chain").and_then(Value::as_str) else {
            continue;
        };
        let exprs = r
            .get("expr")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        let rule = classify(exprs);
        match table.chains.iter_mut().find(|(n, _)| n == chain) {
            Some((_, c)) => c.rules.push(rule),
            None => table.chains.push((
                chain.to_owned(),
                ObservedChain {
                    base: None,
                    rules: vec![rule],
                },
            )),
        }
    }
    Ok(table)
}

fn str_of(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn is_counter(v: &Value) -> bool {
    v.get("counter").is_some()
}

/// `{"match": {"op": "==", "left": <left>, "right": <right>}}` → (left, right).
fn eq_match(v: &Value) -> Option<(&Value, &Value)> {
    let m = v.get("match")?;
    if m.get("op").and_then(Value::as_str).unwrap_or("==") != "==" {
        return None;
    }
    Some((m.get("left")?, m.get("right")?))
}

fn key_of<'a>(v: &'a Value, kind: &str) -> Option<&'a str> {
    v.get(kind)?.get("key")?.as_str()
}

/// `{"mangle": {"key": {<target>: {"key": "mark"}}, "value": {<op>: [{"ct": {"key": "mark"}}, N]}}}`.
fn mark_mangle(v: &Value, target: &str, op: &str) -> Option<u32> {
    let m = v.get("mangle")?;
    if key_of(m.get("key")?, target)? != "mark" {
        return None;
    }
    let args = m.get("value")?.get(op)?.as_array()?;
    let [lhs, rhs] = args.as_slice() else {
        return None;
    };
    if key_of(lhs, "ct")? != "mark" {
        return None;
    }
    u32::try_from(rhs.as_u64()?).ok()
}

fn daddr_cidr(left: &Value, right: &Value) -> Option<Ipv4Net> {
    let p = left.get("payload")?;
    if p.get("protocol")?.as_str()? != "ip" || p.get("field")?.as_str()? != "daddr" {
        return None;
    }
    if let Some(addr) = right.as_str() {
        return Ipv4Net::new(addr.parse::<Ipv4Addr>().ok()?, 32).ok();
    }
    let prefix = right.get("prefix")?;
    let addr: Ipv4Addr = prefix.get("addr")?.as_str()?.parse().ok()?;
    let len = u8::try_from(prefix.get("len")?.as_u64()?).ok()?;
    Ipv4Net::new(addr, len).ok()
}

/// Recognises the five rule shapes of [`NftRule`] (counter included where the rule has one, so
/// another rule never passes for one of ours); anything else is [`NftRule::Other`].
fn classify(exprs: &[Value]) -> NftRule {
    let shape = match exprs {
        [m, ret] if ret.get("return").is_some() => eq_match(m).and_then(|(l, r)| {
            let fib = l.get("fib")?;
            let daddr_type = fib.get("result")?.as_str()? == "type"
                && fib.get("flags")?.as_array()?.as_slice() == [Value::from("daddr")];
            (daddr_type && r.as_str()? == "local").then_some(NftRule::FibLocalReturn)
        }),
        [m, c, jump] if is_counter(c) => eq_match(m).and_then(|(l, r)| {
            let target = jump.get("jump")?.get("target")?.as_str()?;
            let prefix = r.as_str()?.strip_suffix('*')?;
            (key_of(l, "meta")? == "iifname" && target == MARK_CHAIN).then(|| {
                NftRule::JumpFromVeths {
                    prefix: prefix.to_owned(),
                }
            })
        }),
        [c, mangle] if is_counter(c) => mark_mangle(mangle, "meta", "&")
            .map(|mark| NftRule::RestoreMark { mark })
            .or_else(|| mark_mangle(mangle, "ct", "|").map(|mark| NftRule::SetMark { mark })),
        [c, m, ret] if is_counter(c) && ret.get("return").is_some() => eq_match(m)
            .and_then(|(l, r)| daddr_cidr(l, r))
            .map(NftRule::ReturnTo),
        _ => None,
    };
    shape.unwrap_or_else(|| NftRule::Other(Value::from(exprs.to_vec()).to_string()))
}

/// One change to the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftOp {
    /// Create the table, or replace it whole (one transaction: no moment without it).
    Replace(ConnmarkTable),
    /// Delete the table (external SNAT, or a node whose iptables is legacy).
    Delete,
}

impl fmt::Display for NftOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Replace(t) => write!(
                f,
                "replace table ip {TABLE} (mark {:#x}, {} exempt CIDRs)",
                t.mark,
                t.exempt.len()
            ),
            Self::Delete => write!(f, "delete table ip {TABLE}"),
        }
    }
}

/// The change that turns `observed` (`None`: no table) into `desired` (`None`: no table).
/// Pure; `None` when the node already matches.
#[must_use]
pub fn plan(observed: Option<&ObservedTable>, desired: Option<&ConnmarkTable>) -> Option<NftOp> {
    match (observed, desired) {
        (None, None) => None,
        (Some(_), None) => Some(NftOp::Delete),
        (Some(o), Some(d)) if o.matches(d) => None,
        (_, Some(d)) => Some(NftOp::Replace(d.clone())),
    }
}

/// The `nft -f -` input of `op` (one transaction). A replace first declares the table (so the
/// delete cannot fail when it is absent), deletes it, and declares it anew.
#[must_use]
pub fn script(op: &NftOp) -> String {
    match op {
        NftOp::Replace(t) => format!(
            "add table ip {TABLE}\ndelete table ip {TABLE}\n{}",
            t.render()
        ),
        NftOp::Delete => format!("delete table ip {TABLE}\n"),
    }
}

/// `nft` in one namespace.
#[derive(Debug)]
pub struct Nft<'a> {
    runner: &'a dyn CommandRunner,
}

impl<'a> Nft<'a> {
    /// `nft` run by `runner`.
    #[must_use]
    pub fn new(runner: &'a dyn CommandRunner) -> Self {
        Self { runner }
    }

    /// Reads the table (`None`: absent). Blocking.
    pub fn observe(&self) -> Result<Option<ObservedTable>, NftError> {
        let tables = self
            .runner
            .run(NFT, &["-j", "list", "tables", "ip"], None)
            .map_err(NftError::List)?;
        if !lists_table(&tables)? {
            return Ok(None);
        }
        let json = self
            .runner
            .run(NFT, &["-j", "list", "table", "ip", TABLE], None)
            .map_err(NftError::List)?;
        parse_table(&json).map(Some)
    }

    /// Converges the table to `desired`; returns the op applied, if any. Blocking.
    pub fn converge(&self, desired: Option<&ConnmarkTable>) -> Result<Option<NftOp>, NftError> {
        let observed = self.observe()?;
        let op = plan(observed.as_ref(), desired);
        if let Some(op) = &op {
            self.runner
                .run(NFT, &["-f", "-"], Some(&script(op)))
                .map_err(NftError::Apply)?;
        }
        Ok(op)
    }
}

#[cfg(test)]
mod tests;
