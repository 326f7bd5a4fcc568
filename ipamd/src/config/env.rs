//! Reading single environment values with Go's parsing rules (`strconv.ParseBool`, `strconv.Atoi`,
//! `strconv.ParseInt(s, 0, 64)`, comma-separated CIDR lists), recording a [`ConfigWarning`]
//! wherever a value is logged and replaced by its fallback. Why Go's rules: existing manifests were
//! written for them. Must not: know which variable means what (that is `config`'s), read the
//! process environment.

use std::collections::HashMap;

use ipnet::{IpNet, Ipv4Net};

use super::{ConfigError, ConfigWarning, WarningKind};

/// A value that is not an integer as Go's `strconv.Atoi` reads one; the caller decides what that
/// means (a fallback, or a refused knob).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not an integer")]
pub(super) struct NotAnInteger {
    /// The value as set (trimmed).
    pub(super) value: String,
}

pub(super) struct Env<'a> {
    pub(super) map: &'a HashMap<String, String>,
    pub(super) warnings: Vec<ConfigWarning>,
}

impl Env<'_> {
    /// A set, non-empty (after trim) value.
    pub(super) fn get(&self, var: &str) -> Option<&str> {
        self.map
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    pub(super) fn warn(
        &mut self,
        var: &'static str,
        value: &str,
        kind: WarningKind,
        effect: String,
    ) {
        self.warnings.push(ConfigWarning {
            var,
            value: value.to_owned(),
            effect,
            kind,
        });
    }

    pub(super) fn fallback(
        &mut self,
        var: &'static str,
        value: &str,
        effect: impl std::fmt::Display,
    ) {
        self.warn(var, value, WarningKind::Fallback, format!("using {effect}"));
    }

    /// `strconv.ParseBool`'s spellings; anything else falls back to the default.
    pub(super) fn bool(&mut self, var: &'static str, default: bool) -> bool {
        match self.get(var) {
            None => default,
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
            Some(v) => {
                let v = v.to_owned();
                self.fallback(var, &v, format!("the default {default}"));
                default
            }
        }
    }

    /// An integer as Go's `strconv.Atoi` reads it; [`NotAnInteger`] (with the value) when it is
    /// not one.
    pub(super) fn int(&self, var: &'static str) -> Option<Result<i64, NotAnInteger>> {
        self.get(var).map(|v| {
            v.parse::<i64>().map_err(|_| NotAnInteger {
                value: v.to_owned(),
            })
        })
    }

    /// A non-negative count; anything else falls back to `default`.
    pub(super) fn count(&mut self, var: &'static str, default: u32) -> u32 {
        match self.int(var) {
            None => default,
            Some(Ok(n)) if n >= 0 => u32::try_from(n).unwrap_or(u32::MAX),
            Some(Ok(n)) => {
                self.fallback(var, &n.to_string(), format!("the default {default}"));
                default
            }
            Some(Err(NotAnInteger { value })) => {
                self.fallback(var, &value, format!("the default {default}"));
                default
            }
        }
    }

    /// An integer our own knobs require: refused when it is not one.
    pub(super) fn strict_int(&self, var: &'static str) -> Result<Option<i64>, ConfigError> {
        self.int(var)
            .transpose()
            .map_err(|e| err(var, &e.value, "an integer"))
    }

    pub(super) fn string(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_owned()
    }
}

pub(super) fn err(var: &'static str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError {
        var,
        value: value.to_owned(),
        expected,
    }
}

/// Go's `strconv.ParseInt(s, 0, 64)`: optional sign, `0x`/`0o`/`0b` prefixes, a leading `0`
/// for octal, `_` between digits only with a prefix or leading zero.
pub(super) fn parse_go_int_base0(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, underscores_ok) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d.to_owned(), true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d.to_owned(), true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d.to_owned(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_owned(), true)
    } else {
        (10, lower.clone(), false)
    };
    if digits.is_empty()
        || !digits
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return None;
    }
    if digits.contains('_') {
        // Underscores only with base prefixes, never doubled or trailing.
        if !underscores_ok || digits.ends_with('_') || digits.contains("__") {
            return None;
        }
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    if clean.is_empty() {
        return None;
    }
    let magnitude = i64::from_str_radix(&clean, radix).ok()?;
    Some(if neg { -magnitude } else { magnitude })
}

/// A comma-separated CIDR list: IPv6 entries skipped (logged), invalid entries skipped with a
/// warning, host bits cleared.
pub(super) fn v4_cidrs(e: &mut Env<'_>, var: &'static str) -> Vec<Ipv4Net> {
    let raw = e.get(var).unwrap_or("").to_owned();
    let mut out = Vec::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<IpNet>() {
            Ok(IpNet::V4(n)) => out.push(n.trunc()),
            Ok(IpNet::V6(_)) => {}
            Err(_) => e.fallback(var, part, "the list without this entry"),
        }
    }
    out
}

/// Runs a section parser over `pairs` (tests only).
#[cfg(test)]
pub(super) fn test_env<T>(pairs: &[(&str, &str)], f: impl FnOnce(&mut Env<'_>) -> T) -> T {
    with_warnings(pairs, f).0
}

/// Runs a section parser over `pairs`, returning what it said too (tests only).
#[cfg(test)]
pub(super) fn with_warnings<T>(
    pairs: &[(&str, &str)],
    f: impl FnOnce(&mut Env<'_>) -> T,
) -> (T, Vec<ConfigWarning>) {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut e = Env {
        map: &map,
        warnings: Vec::new(),
    };
    let out = f(&mut e);
    (out, e.warnings)
}
