//! What is left in one subnet: free addresses and free aligned `/28` blocks, counted from the
//! subnet's CIDR, AWS's five reserved addresses, its CIDR reservations and every address and
//! prefix its ENIs hold. Pure; must not know EC2 or time.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// EC2 delegates IPv4 prefixes of this length.
pub const PREFIX_LEN: u8 = 28;

/// `GetSubnetCidrReservations` `ReservationType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationKind {
    /// Only prefixes may be delegated from it (no automatic secondary address).
    Prefix,
    /// Only explicitly requested addresses (no automatic address, no prefix).
    Explicit,
}

/// Everything known about one subnet's occupancy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Primary and secondary private addresses of every ENI in the subnet.
    pub addresses: Vec<Ipv4Addr>,
    /// IPv4 prefixes delegated to ENIs in the subnet.
    pub prefixes: Vec<Ipv4Net>,
    /// CIDR reservations of the subnet.
    pub reservations: Vec<(Ipv4Net, ReservationKind)>,
}

/// The figures of one subnet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Addresses EC2 can still hand out as secondary addresses on its own: not reserved by
    /// AWS, not held by an ENI (as an address or inside a prefix), not in a CIDR reservation.
    pub free_addresses: u32,
    /// Aligned `/28` blocks EC2 can still delegate as prefixes: no address of the block held,
    /// none of AWS's reserved addresses inside, no overlap with an explicit reservation.
    pub free_prefix_blocks: u32,
}

/// Counts `occupancy` of `cidr`. One bit per address: a `/16` costs 8 KiB.
#[must_use]
pub fn count(cidr: Ipv4Net, occupancy: &Occupancy) -> Figures {
    let base = u32::from(cidr.network());
    let size = 1u64 << (32 - u32::from(cidr.prefix_len()));
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    // held by an ENI; reserved (AWS's five, or a CIDR reservation) for what it forbids
    let mut held = vec![false; size];
    let mut no_address = vec![false; size];
    let mut no_prefix = vec![false; size];
    let index = |ip: Ipv4Addr| -> Option<usize> {
        cidr.contains(&ip)
            .then(|| usize::try_from(u32::from(ip) - base).ok())
            .flatten()
    };
    let mark = |set: &mut Vec<bool>, net: Ipv4Net| {
        let (lo, hi) = (u32::from(net.network()), u32::from(net.broadcast()));
        for a in lo..=hi {
            if let Some(i) = index(Ipv4Addr::from(a)) {
                set[i] = true;
            }
        }
    };
    for ip in &occupancy.addresses {
        if let Some(i) = index(*ip) {
            held[i] = true;
        }
    }
    for p in &occupancy.prefixes {
        mark(&mut held, *p);
    }
    for (net, kind) in &occupancy.reservations {
        mark(&mut no_address, *net);
        if *kind == ReservationKind::Explicit {
            mark(&mut no_prefix, *net);
        }
    }
    let aws_reserved = |i: usize| i < 4 || i + 1 == size;
    let free_addresses = (0..size)
        .filter(|&i| !aws_reserved(i) && !held[i] && !no_address[i])
        .count();
    let block = 1usize << (32 - u32::from(PREFIX_LEN));
    let free_prefix_blocks = if cidr.prefix_len() > PREFIX_LEN {
        0
    } else {
        (0..size / block)
            .filter(|b| {
                (b * block..(b + 1) * block).all(|i| !aws_reserved(i) && !held[i] && !no_prefix[i])
            })
            .count()
    };
    Figures {
        free_addresses: u32::try_from(free_addresses).unwrap_or(u32::MAX),
        free_prefix_blocks: u32::try_from(free_prefix_blocks).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn an_empty_subnet_loses_only_the_aws_reserved_addresses_and_their_blocks() {
        let f = count(net("198.18.0.0/24"), &Occupancy::default());
        assert_eq!(f.free_addresses, 256 - 5);
        // the first block holds .0-.3, the last the broadcast
        assert_eq!(f.free_prefix_blocks, 16 - 2);
    }

    #[test]
    fn one_address_in_every_block_leaves_no_prefix_but_many_addresses() {
        let addresses = (0..16u32)
            .map(|b| Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + b * 16 + 8))
            .collect();
        let f = count(
            net("198.18.0.0/24"),
            &Occupancy {
                addresses,
                ..Occupancy::default()
            },
        );
        assert_eq!(f.free_addresses, 256 - 5 - 16);
        assert_eq!(f.free_prefix_blocks, 0, "fragmented: no whole /28 is free");
    }

    #[test]
    fn prefixes_take_their_block_and_reservations_forbid_what_their_kind_says() {
        let f = count(
            net("198.18.0.0/24"),
            &Occupancy {
                addresses: vec![Ipv4Addr::new(198, 18, 0, 4)],
                prefixes: vec![net("198.18.0.16/28")],
                reservations: vec![
                    // no automatic address, prefixes still fine
                    (net("198.18.0.32/28"), ReservationKind::Prefix),
                    // neither
                    (net("198.18.0.48/28"), ReservationKind::Explicit),
                ],
            },
        );
        assert_eq!(f.free_addresses, 256 - 5 - 1 - 16 - 16 - 16);
        // blocks: 0 reserved (.0-.3), 1 delegated, 3 explicit, 15 broadcast
        assert_eq!(f.free_prefix_blocks, 16 - 4);
    }

    #[test]
    fn a_subnet_smaller_than_a_prefix_has_no_blocks() {
        let f = count(net("198.18.0.0/29"), &Occupancy::default());
        assert_eq!((f.free_addresses, f.free_prefix_blocks), (3, 0));
    }

    #[test]
    fn addresses_outside_the_subnet_are_ignored() {
        let f = count(
            net("198.18.0.0/28"),
            &Occupancy {
                addresses: vec![Ipv4Addr::new(10, 0, 0, 1)],
                prefixes: vec![net("10.0.0.0/28")],
                reservations: vec![(net("10.0.0.0/24"), ReservationKind::Explicit)],
            },
        );
        assert_eq!((f.free_addresses, f.free_prefix_blocks), (11, 0));
    }
}
