//! The simulation's only source of choices: a tape of `u64`s. A run from a seed fills the tape
//! lazily from SplitMix64; a replay reads a given tape and answers 0 past its end. Every choice
//! is phrased so that 0 is the quiet one (the first event kind, no fault, no lag), so a tape
//! shrunk by deleting or zeroing entries still describes a run, only a calmer one.

use std::sync::{Arc, Mutex};

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, good enough for choices.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Recorded choices (see the module doc).
#[derive(Debug)]
pub struct Tape {
    data: Vec<u64>,
    pos: usize,
    source: Option<SplitMix64>,
}

impl Tape {
    /// A fresh run: choices drawn from `seed`, recorded.
    pub fn from_seed(seed: u64) -> Self {
        Self {
            data: Vec::new(),
            pos: 0,
            source: Some(SplitMix64::new(seed)),
        }
    }

    /// A replay of `data`; 0 past its end.
    pub fn replay(data: Vec<u64>) -> Self {
        Self {
            data,
            pos: 0,
            source: None,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let v = if let Some(v) = self.data.get(self.pos) {
            *v
        } else if let Some(s) = &mut self.source {
            let v = s.next_u64();
            self.data.push(v);
            v
        } else {
            0
        };
        self.pos += 1;
        v
    }

    /// How many choices were consumed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The choices consumed so far.
    pub fn used(&self) -> Vec<u64> {
        self.data[..self.pos.min(self.data.len())].to_vec()
    }
}

/// The tape, shared by the harness and the fakes it hands to ipamd (they draw in a
/// deterministic order: one thread, one scheduler).
#[derive(Debug, Clone)]
pub struct Rng(Arc<Mutex<Tape>>);

impl Rng {
    pub fn new(tape: Tape) -> Self {
        Self(Arc::new(Mutex::new(tape)))
    }

    fn tape(&self) -> std::sync::MutexGuard<'_, Tape> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.tape().next_u64() % n
    }

    /// An index into a slice of `len` (0 on a quiet tape; `len` must not be 0).
    pub fn index(&self, len: usize) -> usize {
        let n = u64::try_from(len).unwrap_or(u64::MAX);
        usize::try_from(self.below(n)).unwrap_or(0)
    }

    /// Uniform in `lo..=hi`; `lo` on a quiet tape.
    pub fn range(&self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability `per_mille`/1000; false on a quiet tape.
    pub fn chance(&self, per_mille: u64) -> bool {
        per_mille > 0 && self.below(1000) >= 1000 - per_mille.min(1000)
    }

    /// An index into `weights`, chosen in proportion (the first on a quiet tape).
    pub fn weighted(&self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut v = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if v < *w {
                return i;
            }
            v -= w;
        }
        0
    }

    pub fn used(&self) -> Vec<u64> {
        self.tape().used()
    }

    pub fn pos(&self) -> usize {
        self.tape().pos()
    }
}
