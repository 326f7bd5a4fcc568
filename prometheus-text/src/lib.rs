//! The metric types of Prometheus' text exposition format (0.0.4) and their `# TYPE`
//! keywords: the one table that ipamd's `/metrics` writes with and cni-metrics-helper reads
//! scrapes back with. Owns no I/O and no rendering or parsing of whole texts.

/// A metric family's declared type. `untyped` is the absence of one (a reader's `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic.
    Counter,
    /// Up and down.
    Gauge,
    /// Sum and count (and quantiles, when the writer has them).
    Summary,
    /// Sum, count and cumulative buckets.
    Histogram,
}

impl Kind {
    /// Every type.
    pub const ALL: [Kind; 4] = [Kind::Counter, Kind::Gauge, Kind::Summary, Kind::Histogram];

    /// The word a `# TYPE` line spells this type with.
    #[must_use]
    pub fn keyword(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Summary => "summary",
            Kind::Histogram => "histogram",
        }
    }

    /// The type a `# TYPE` line's word names; `None` for `untyped` and unknown words.
    #[must_use]
    pub fn from_keyword(word: &str) -> Option<Self> {
        Kind::ALL.into_iter().find(|k| k.keyword() == word)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_round_trip_and_untyped_is_no_kind() {
        let words: Vec<&str> = Kind::ALL.iter().map(|k| k.keyword()).collect();
        assert_eq!(words, ["counter", "gauge", "summary", "histogram"]);
        for kind in Kind::ALL {
            assert_eq!(Kind::from_keyword(kind.keyword()), Some(kind));
        }
        assert_eq!(Kind::from_keyword("untyped"), None);
        assert_eq!(Kind::from_keyword("Counter"), None);
    }
}
