//! Address arithmetic inside one subnet: AWS's five reserved addresses, lowest-free /32
//! allocation, aligned /28 (and IPv6 /80) prefix allocation. Pure functions over a "used" set;
//! they must not know ENIs or instances.

use super::{State, StateError};
use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};

/// IPv4 prefix length EC2 delegates.
pub const IPV4_PREFIX_LEN: u8 = 28;
/// IPv6 prefix length EC2 delegates.
pub const IPV6_PREFIX_LEN: u8 = 80;

/// AWS reserves the network address, +1 (router), +2 (DNS), +3 (future) and the broadcast.
pub fn is_reserved(cidr: Ipv4Net, ip: Ipv4Addr) -> bool {
    let base = u32::from(cidr.network());
    let ip = u32::from(ip);
    ip < base + 4 || ip == u32::from(cidr.broadcast())
}

/// Addresses of the subnet that can ever be handed out.
pub fn usable_count(cidr: Ipv4Net) -> u64 {
    (1u64 << (32 - u32::from(cidr.prefix_len()))).saturating_sub(5)
}

/// The lowest `count` free, non-reserved addresses of `cidr`.
pub fn alloc_ipv4(cidr: Ipv4Net, used: &BTreeSet<u32>, count: usize) -> Option<Vec<Ipv4Addr>> {
    let first = u32::from(cidr.network()) + 4;
    let last = u32::from(cidr.broadcast()).checked_sub(1)?;
    let out: Vec<Ipv4Addr> = (first..=last)
        .filter(|a| !used.contains(a))
        .take(count)
        .map(Ipv4Addr::from)
        .collect();
    (out.len() == count).then_some(out)
}

/// `count` free, non-reserved addresses of `cidr` picked uniformly at random (EC2's way).
pub fn alloc_ipv4_random(
    cidr: Ipv4Net,
    used: &BTreeSet<u32>,
    count: usize,
    rng: &Rng,
) -> Option<Vec<Ipv4Addr>> {
    let first = u32::from(cidr.network()) + 4;
    let last = u32::from(cidr.broadcast()).checked_sub(1)?;
    let mut free: Vec<u32> = (first..=last).filter(|a| !used.contains(a)).collect();
    if free.len() < count {
        return None;
    }
    // partial Fisher-Yates: the first `count` slots become a uniform sample
    for i in 0..count {
        let span = (free.len() - i) as u64;
        let j = i + usize::try_from(rng.next() % span).unwrap_or(0);
        free.swap(i, j);
    }
    Some(free[..count].iter().map(|a| Ipv4Addr::from(*a)).collect())
}

/// A small seeded PRNG (xorshift64*) shared by clones of the state; atomic so the state stays
/// `Sync` (snapshots are shared across threads).
#[derive(Debug)]
pub struct Rng(std::sync::atomic::AtomicU64);

impl Rng {
    /// A generator from `seed` (0 is replaced, xorshift needs a non-zero state).
    pub fn new(seed: u64) -> Self {
        Self(std::sync::atomic::AtomicU64::new(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        }))
    }

    /// The next pseudo-random number.
    pub fn next(&self) -> u64 {
        use std::sync::atomic::Ordering;
        let step = |mut x: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x
        };
        let prev = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(step(x)))
            .unwrap_or(1);
        step(prev).wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl Clone for Rng {
    fn clone(&self) -> Self {
        Self(std::sync::atomic::AtomicU64::new(
            self.0.load(std::sync::atomic::Ordering::Relaxed),
        ))
    }
}

/// The lowest `count` aligned /28 blocks of `cidr` whose 16 addresses are all free and not
/// reserved. A subnet with free /32s scattered over every /28 yields none.
#[cfg(test)]
pub fn alloc_ipv4_prefixes(
    cidr: Ipv4Net,
    used: &BTreeSet<u32>,
    count: usize,
) -> Option<Vec<Ipv4Net>> {
    alloc_ipv4_prefixes_preferring(cidr, used, count, std::iter::empty())
}

/// [`alloc_ipv4_prefixes`], taking blocks inside `preferred` (prefix reservations) first.
pub fn alloc_ipv4_prefixes_preferring(
    cidr: Ipv4Net,
    used: &BTreeSet<u32>,
    count: usize,
    preferred: impl Iterator<Item = Ipv4Net>,
) -> Option<Vec<Ipv4Net>> {
    let preferred: Vec<Ipv4Net> = preferred.collect();
    let blocks: Vec<Ipv4Net> = cidr
        .subnets(IPV4_PREFIX_LEN)
        .ok()?
        .filter(|block| block_free(cidr, *block, used))
        .collect();
    let (inside, outside): (Vec<Ipv4Net>, Vec<Ipv4Net>) = blocks
        .into_iter()
        .partition(|b| preferred.iter().any(|p| p.contains(b)));
    let out: Vec<Ipv4Net> = inside.into_iter().chain(outside).take(count).collect();
    (out.len() == count).then_some(out)
}

/// True if every address of `block` is free and none is reserved.
pub fn block_free(cidr: Ipv4Net, block: Ipv4Net, used: &BTreeSet<u32>) -> bool {
    let lo = u32::from(block.network());
    let hi = u32::from(block.broadcast());
    !is_reserved(cidr, block.network())
        && !is_reserved(cidr, block.broadcast())
        && used.range(lo..=hi).next().is_none()
}

/// The lowest `count` free IPv6 addresses of `cidr` (from `::4`, mirroring IPv4's reserve).
pub fn alloc_ipv6(cidr: Ipv6Net, used: &BTreeSet<u128>, count: usize) -> Option<Vec<Ipv6Addr>> {
    let first = u128::from(cidr.network()) + 4;
    let last = u128::from(cidr.broadcast());
    let mut out = Vec::with_capacity(count);
    let mut a = first;
    while out.len() < count && a <= last {
        if !used.contains(&a) {
            out.push(Ipv6Addr::from(a));
        }
        a += 1;
    }
    (out.len() == count).then_some(out)
}

/// The lowest `count` free /80 blocks of `cidr`, skipping the first block (it holds the
/// reserved addresses and the /128s handed out lowest-first).
pub fn alloc_ipv6_prefixes(
    cidr: Ipv6Net,
    used: &BTreeSet<u128>,
    count: usize,
) -> Option<Vec<Ipv6Net>> {
    let size: u128 = 1 << (128 - u32::from(IPV6_PREFIX_LEN));
    let base = u128::from(cidr.network());
    let blocks: u128 = 1 << (u32::from(IPV6_PREFIX_LEN) - u32::from(cidr.prefix_len()));
    let mut out = Vec::with_capacity(count);
    let mut i: u128 = 1;
    while out.len() < count && i < blocks {
        let lo = base + i * size;
        if used.range(lo..lo + size).next().is_none() {
            out.push(Ipv6Net::new(Ipv6Addr::from(lo), IPV6_PREFIX_LEN).ok()?);
        }
        i += 1;
    }
    (out.len() == count).then_some(out)
}

impl State {
    /// Every IPv4 address of the subnet taken by an ENI (addresses and whole prefixes).
    pub(super) fn used_ipv4(&self, subnet_id: &str) -> BTreeSet<u32> {
        let mut used = BTreeSet::new();
        for eni in self.enis.values().filter(|e| e.subnet_id == subnet_id) {
            used.extend(eni.private_ips.iter().map(|ip| u32::from(*ip)));
            for p in &eni.ipv4_prefixes {
                used.extend(u32::from(p.network())..=u32::from(p.broadcast()));
            }
        }
        used
    }

    /// IPv6 addresses of the subnet taken (prefixes recorded as their first and last address
    /// plus every block start, enough for the range checks above).
    pub(super) fn used_ipv6(&self, subnet_id: &str) -> BTreeSet<u128> {
        let mut used = BTreeSet::new();
        for eni in self.enis.values().filter(|e| e.subnet_id == subnet_id) {
            used.extend(eni.ipv6_addresses.iter().map(|ip| u128::from(*ip)));
            for p in &eni.ipv6_prefixes {
                used.insert(u128::from(p.network()));
                used.insert(u128::from(p.broadcast()));
            }
        }
        used
    }

    /// Which ENI holds IPv4 `ip` (address or inside a prefix).
    pub(super) fn ipv4_owner(&self, ip: Ipv4Addr) -> Option<&str> {
        self.enis
            .values()
            .find(|e| {
                e.private_ips.contains(&ip) || e.ipv4_prefixes.iter().any(|p| p.contains(&ip))
            })
            .map(|e| e.id.as_str())
    }

    /// Checks an explicitly requested IPv4 address against the subnet.
    pub(super) fn check_in_subnet(&self, cidr: Ipv4Net, ip: Ipv4Addr) -> Result<(), StateError> {
        if !cidr.contains(&ip) {
            return Err(StateError::InvalidParameterValue(format!(
                "address {ip} does not fall within the subnet's address range"
            )));
        }
        if is_reserved(cidr, ip) {
            return Err(StateError::InvalidParameterValue(format!(
                "address {ip} is reserved by aws"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn five_reserved() {
        let c = net("198.18.0.0/24");
        for last in [0u8, 1, 2, 3, 255] {
            assert!(is_reserved(c, Ipv4Addr::new(198, 18, 0, last)));
        }
        assert!(!is_reserved(c, Ipv4Addr::new(198, 18, 0, 4)));
        assert_eq!(usable_count(c), 251);
        let got = alloc_ipv4(c, &BTreeSet::new(), 2).unwrap();
        assert_eq!(
            got,
            vec![Ipv4Addr::new(198, 18, 0, 4), Ipv4Addr::new(198, 18, 0, 5)]
        );
        assert!(alloc_ipv4(c, &BTreeSet::new(), 252).is_none());
        assert_eq!(alloc_ipv4(c, &BTreeSet::new(), 251).unwrap().len(), 251);
    }

    #[test]
    fn prefixes_are_aligned_and_skip_reserved_blocks() {
        let c = net("198.18.0.0/24");
        let got = alloc_ipv4_prefixes(c, &BTreeSet::new(), 2).unwrap();
        // block .0/28 holds .0-.3, block .240/28 holds the broadcast
        assert_eq!(got, vec![net("198.18.0.16/28"), net("198.18.0.32/28")]);
        assert_eq!(
            alloc_ipv4_prefixes(c, &BTreeSet::new(), 14).unwrap().len(),
            14
        );
        assert!(alloc_ipv4_prefixes(c, &BTreeSet::new(), 15).is_none());
    }

    #[test]
    fn fragmented_subnet_refuses_prefixes_but_fits_addresses() {
        let c = net("198.18.0.0/24");
        // one used address in each /28
        let used: BTreeSet<u32> = (0..16u32)
            .map(|b| u32::from(Ipv4Addr::new(198, 18, 0, 0)) + b * 16 + 8)
            .collect();
        assert!(alloc_ipv4_prefixes(c, &used, 1).is_none());
        assert_eq!(alloc_ipv4(c, &used, 100).unwrap().len(), 100);
    }

    #[test]
    fn random_picks_are_free_unique_and_fragment_the_subnet() {
        let c = net("198.18.0.0/24");
        let rng = Rng::new(7);
        let picked = alloc_ipv4_random(c, &BTreeSet::new(), 40, &rng).unwrap();
        let used: BTreeSet<u32> = picked.iter().map(|ip| u32::from(*ip)).collect();
        assert_eq!(used.len(), 40, "unique");
        assert!(picked.iter().all(|ip| !is_reserved(c, *ip)));
        assert_ne!(
            picked,
            alloc_ipv4(c, &BTreeSet::new(), 40).unwrap(),
            "not lowest-first"
        );
        let lowest: BTreeSet<u32> = alloc_ipv4(c, &BTreeSet::new(), 40)
            .unwrap()
            .iter()
            .map(|ip| u32::from(*ip))
            .collect();
        let free_blocks = |u: &BTreeSet<u32>| {
            c.subnets(28)
                .unwrap()
                .filter(|b| block_free(c, *b, u))
                .count()
        };
        assert!(
            free_blocks(&used) < free_blocks(&lowest),
            "{} vs {}",
            free_blocks(&used),
            free_blocks(&lowest)
        );
        // same seed, same picks
        assert_eq!(
            alloc_ipv4_random(c, &BTreeSet::new(), 40, &Rng::new(7)).unwrap(),
            picked
        );
        assert!(alloc_ipv4_random(c, &BTreeSet::new(), 252, &rng).is_none());
    }

    #[test]
    fn ipv6_prefix_blocks() {
        let c: Ipv6Net = "2001:db8::/64".parse().unwrap();
        let got = alloc_ipv6_prefixes(c, &BTreeSet::new(), 1).unwrap();
        assert_eq!(got[0], "2001:db8:0:0:1::/80".parse::<Ipv6Net>().unwrap());
        let a = alloc_ipv6(c, &BTreeSet::new(), 1).unwrap();
        assert_eq!(a[0], "2001:db8::4".parse::<Ipv6Addr>().unwrap());
    }
}
