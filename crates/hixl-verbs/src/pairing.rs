//! Which of our devices talks to which of the peer's: the rails of a link.
//!
//! A device is paired with a peer device on the same subnet, each peer device taken once
//! before any is taken twice (two of our NICs on one subnet with two of the peer's make two
//! rails, not one shared). A device with no peer device on its subnet gets no rail, and says
//! why. Only when no device shares a subnet with any of the peer's (hosts whose devices are
//! routed to each other, or one host whose devices all reach each other) are they paired by
//! position. Pure: tested without devices.

use crate::attr::Mtu;
use crate::nic::NicInfo;

/// One rail: our device `local` to the peer's device `remote` (indexes into the two lists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailPlan {
    /// Index of our device.
    pub local: usize,
    /// Index of the peer's device.
    pub remote: usize,
    /// The connection's MTU: the smaller of both ports' active MTUs.
    pub mtu: Mtu,
    /// Why these two, for `hixl info --peer` and the logs.
    pub why: String,
}

/// The rails of a link, and our devices left without one (with the reason).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairing {
    /// The rails, in the order of our devices.
    pub rails: Vec<RailPlan>,
    /// Our devices that got no rail: `(index, why)`.
    pub unpaired: Vec<(usize, String)>,
}

/// Pairs our devices with the peer's.
pub fn pair(local: &[NicInfo], remote: &[NicInfo]) -> Pairing {
    let mut out = Pairing::default();
    if local.is_empty() || remote.is_empty() {
        return out;
    }
    let mut uses = vec![0usize; remote.len()];
    let any_shared = local
        .iter()
        .any(|l| remote.iter().any(|r| l.same_subnet(r)));
    for (i, l) in local.iter().enumerate() {
        let (j, why) = if any_shared {
            let Some(j) = (0..remote.len())
                .filter(|&j| l.same_subnet(&remote[j]))
                .min_by_key(|&j| (uses[j], j))
            else {
                out.unpaired
                    .push((i, format!("no device of the peer is on {}", l.subnet())));
                continue;
            };
            (j, format!("same subnet {}", l.subnet()))
        } else {
            let j = i % remote.len();
            (
                j,
                "no device of the peer shares a subnet with ours: paired by position".to_owned(),
            )
        };
        uses[j] += 1;
        let r = &remote[j];
        let mtu = l.mtu.min(r.mtu);
        let why = if l.mtu == r.mtu {
            why
        } else {
            format!("{why}; mtu {mtu}, the smaller of {} and {}", l.mtu, r.mtu)
        };
        out.rails.push(RailPlan {
            local: i,
            remote: j,
            mtu,
            why,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn nic(name: &str, v4: [u8; 4], mtu: Mtu) -> NicInfo {
        NicInfo {
            name: name.into(),
            gid: Ipv4Addr::from(v4).to_ipv6_mapped().octets(),
            prefix: 120,
            mtu,
            numa: None,
        }
    }

    fn pairs(p: &Pairing) -> Vec<(usize, usize)> {
        p.rails.iter().map(|r| (r.local, r.remote)).collect()
    }

    #[test]
    fn devices_pair_within_their_subnet_whatever_the_order() {
        let a = [
            nic("a0", [10, 0, 0, 1], Mtu::M4096),
            nic("a1", [10, 0, 1, 1], Mtu::M4096),
        ];
        // The peer lists its devices the other way round (a wrong pairing by position).
        let b = [
            nic("b1", [10, 0, 1, 2], Mtu::M4096),
            nic("b0", [10, 0, 0, 2], Mtu::M4096),
        ];
        let p = pair(&a, &b);
        assert_eq!(pairs(&p), [(0, 1), (1, 0)]);
        assert!(p.rails[0].why.contains("same subnet 10.0.0.0/24"), "{p:?}");
        assert!(p.unpaired.is_empty());
    }

    #[test]
    fn a_device_without_a_peer_on_its_subnet_is_left_out_and_says_why() {
        let a = [
            nic("a0", [10, 0, 0, 1], Mtu::M4096),
            nic("a1", [10, 0, 9, 1], Mtu::M4096),
        ];
        let b = [nic("b0", [10, 0, 0, 2], Mtu::M4096)];
        let p = pair(&a, &b);
        assert_eq!(pairs(&p), [(0, 0)]);
        assert_eq!(p.unpaired.len(), 1);
        assert!(p.unpaired[0].1.contains("10.0.9.0/24"), "{p:?}");
    }

    #[test]
    fn peer_devices_are_shared_only_once_all_are_taken() {
        let a: Vec<_> = (1..=4)
            .map(|k| nic("a", [10, 0, 0, k], Mtu::M1024))
            .collect();
        let b: Vec<_> = (5..=6)
            .map(|k| nic("b", [10, 0, 0, k], Mtu::M1024))
            .collect();
        assert_eq!(pairs(&pair(&a, &b)), [(0, 0), (1, 1), (2, 0), (3, 1)]);
    }

    #[test]
    fn without_a_shared_subnet_devices_pair_by_position_at_the_smaller_mtu() {
        let a = [
            nic("a0", [192, 0, 2, 1], Mtu::M4096),
            nic("a1", [198, 51, 100, 1], Mtu::M1024),
        ];
        let b = [nic("b0", [203, 0, 113, 1], Mtu::M1024)];
        let p = pair(&a, &b);
        assert_eq!(pairs(&p), [(0, 0), (1, 0)]);
        assert_eq!(p.rails[0].mtu, Mtu::M1024);
        assert!(p.rails[0].why.contains("by position"), "{p:?}");
        assert!(p.rails[0].why.contains("smaller of 4096 and 1024"), "{p:?}");
        assert_eq!(pair(&a, &[]), Pairing::default());
    }
}
