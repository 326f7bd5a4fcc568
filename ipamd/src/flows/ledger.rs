//! Which addresses no conntrack entry of the node names, as far as ipamd can prove it: the
//! addresses a table walk asked about and found no entry left for, minus every address a new
//! entry has named since (the kernel's events). Pure state: the flows task feeds it and asks
//! it. Must not: read the kernel, decide which addresses are free.
//!
//! Why it is sound: an entry that can steer packets to an address is either older than the
//! walk that last asked about it (the walk deleted it) or newer (its event names the address,
//! which leaves the clean set). A lost event (overflow) or a subscription that ends forgets
//! every address; a walk's result counts only when no event naming its addresses, and none
//! lost, came while it ran.

use std::collections::HashSet;
use std::net::IpAddr;

/// The clean addresses and the walk in progress.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Events are read: without them nothing is ever clean.
    watching: bool,
    /// Addresses no entry names.
    clean: HashSet<IpAddr>,
    /// The walk in progress: what it asked about, what events named meanwhile.
    walk: Option<Walk>,
}

#[derive(Debug, Default)]
struct Walk {
    asked: HashSet<IpAddr>,
    named: HashSet<IpAddr>,
    lost: bool,
}

impl Ledger {
    /// A ledger that proves nothing until [`Self::watching`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The subscription to new entries is open: walks from now on can prove addresses clean.
    pub fn watching(&mut self) {
        self.watching = true;
    }

    /// The subscription ended (or the kernel stopped sending events): nothing is clean.
    pub fn unwatched(&mut self) {
        self.watching = false;
        self.lost();
    }

    /// Whether events are read.
    #[must_use]
    pub fn is_watching(&self) -> bool {
        self.watching
    }

    /// A new entry names `addresses`.
    pub fn named(&mut self, addresses: &[IpAddr]) {
        for a in addresses {
            self.clean.remove(a);
            if let Some(w) = &mut self.walk
                && w.asked.contains(a)
            {
                w.named.insert(*a);
            }
        }
    }

    /// Events were lost: any address may be named.
    pub fn lost(&mut self) {
        self.clean.clear();
        if let Some(w) = &mut self.walk {
            w.lost = true;
        }
    }

    /// Whether no entry names any of `addresses`.
    #[must_use]
    pub fn all_clean(&self, addresses: &[IpAddr]) -> bool {
        self.watching && addresses.iter().all(|a| self.clean.contains(a))
    }

    /// Whether `address` is clean.
    #[must_use]
    pub fn is_clean(&self, address: &IpAddr) -> bool {
        self.watching && self.clean.contains(address)
    }

    /// A walk deleting the entries naming `asked` begins: they are not clean while it runs.
    pub fn walk_begins(&mut self, asked: impl IntoIterator<Item = IpAddr>) {
        let asked: HashSet<IpAddr> = asked.into_iter().collect();
        for a in &asked {
            self.clean.remove(a);
        }
        self.walk = Some(Walk {
            asked,
            ..Walk::default()
        });
    }

    /// The walk ended (`deleted_all`: every entry naming its addresses is gone): its addresses
    /// are clean unless an event named one, or events were lost, while it ran.
    pub fn walk_ends(&mut self, deleted_all: bool) {
        let Some(w) = self.walk.take() else {
            return;
        };
        if !deleted_all || w.lost || !self.watching {
            return;
        }
        self.clean
            .extend(w.asked.into_iter().filter(|a| !w.named.contains(a)));
    }

    /// How many addresses are clean (for logs and tests).
    #[must_use]
    pub fn clean_count(&self) -> usize {
        if self.watching { self.clean.len() } else { 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn walked(l: &mut Ledger, asked: &[&str]) {
        l.walk_begins(asked.iter().map(|a| ip(a)));
        l.walk_ends(true);
    }

    #[test]
    fn nothing_is_clean_without_events() {
        let mut l = Ledger::new();
        walked(&mut l, &["10.0.0.1"]);
        assert!(
            !l.is_clean(&ip("10.0.0.1")),
            "a walk before the subscription proves nothing"
        );
        l.watching();
        walked(&mut l, &["10.0.0.1"]);
        assert!(l.is_clean(&ip("10.0.0.1")));
        l.unwatched();
        assert!(!l.is_clean(&ip("10.0.0.1")));
        l.watching();
        assert!(
            !l.is_clean(&ip("10.0.0.1")),
            "events missed while unwatched: clean again only after a walk"
        );
    }

    #[test]
    fn a_walk_makes_its_addresses_clean_and_an_event_makes_one_dirty() {
        let mut l = Ledger::new();
        l.watching();
        walked(&mut l, &["10.0.0.1", "10.0.0.2"]);
        assert!(l.all_clean(&[ip("10.0.0.1"), ip("10.0.0.2")]));
        assert!(
            !l.all_clean(&[ip("10.0.0.1"), ip("10.0.0.3")]),
            "never asked about"
        );
        l.named(&[ip("192.0.2.7"), ip("10.0.0.2")]);
        assert!(l.is_clean(&ip("10.0.0.1")));
        assert!(!l.is_clean(&ip("10.0.0.2")));
    }

    #[test]
    fn an_event_or_a_loss_during_the_walk_keeps_its_addresses_dirty() {
        let mut l = Ledger::new();
        l.watching();
        l.walk_begins([ip("10.0.0.1"), ip("10.0.0.2")]);
        l.named(&[ip("10.0.0.2")]);
        l.walk_ends(true);
        assert!(l.is_clean(&ip("10.0.0.1")));
        assert!(!l.is_clean(&ip("10.0.0.2")), "named while the walk ran");

        l.walk_begins([ip("10.0.0.3")]);
        l.lost();
        l.walk_ends(true);
        assert!(
            !l.is_clean(&ip("10.0.0.3")),
            "events lost while the walk ran"
        );
        assert!(!l.is_clean(&ip("10.0.0.1")), "a loss forgets every address");
    }

    #[test]
    fn a_failed_walk_proves_nothing_and_a_walked_address_is_not_clean_while_it_runs() {
        let mut l = Ledger::new();
        l.watching();
        walked(&mut l, &["10.0.0.1"]);
        l.walk_begins([ip("10.0.0.1")]);
        assert!(!l.is_clean(&ip("10.0.0.1")), "being walked");
        l.walk_ends(false);
        assert!(!l.is_clean(&ip("10.0.0.1")));
        assert_eq!(l.clean_count(), 0);
    }
}
