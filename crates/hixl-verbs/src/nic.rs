//! What a peer needs to know of one device to pair it with its own: the device's name, the GID
//! its queue pairs send from, the subnet of that GID, the port's active MTU and the NUMA node
//! the host places the device on; and the compact form a connect offer carries (decoded
//! without panicking on any input).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::attr::Mtu;
use crate::error::{Result, VerbsError};

/// Most devices one offer may list.
pub const MAX_NICS: usize = 32;
/// Longest device name an offer may carry.
const MAX_NAME: usize = 64;
/// `numa` on the wire when the host does not say.
const NO_NUMA: u16 = u16::MAX;

/// One device as its engine offers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicInfo {
    /// The device's name (`mlx5_0`, `rxe1`).
    pub name: String,
    /// The GID its queue pairs send from (an IPv4-mapped address on RoCE v2).
    pub gid: [u8; 16],
    /// Leading bits of `gid` that name its subnet (96 + the IPv4 prefix for an IPv4-mapped
    /// GID; 64, the subnet prefix, otherwise).
    pub prefix: u8,
    /// The port's active MTU.
    pub mtu: Mtu,
    /// The device's NUMA node (sysfs `numa_node`), when the host says.
    pub numa: Option<u16>,
}

impl NicInfo {
    /// The device `name` sending from `gid` with active MTU `mtu`: its subnet prefix from the
    /// host's interface addresses, its NUMA node from sysfs.
    pub fn probe(name: &str, gid: [u8; 16], mtu: Mtu) -> NicInfo {
        let prefix = match Ipv6Addr::from(gid).to_ipv4_mapped() {
            Some(v4) => ipv4_prefix(v4).map_or(120, |p| 96 + p),
            None => 64,
        };
        NicInfo {
            name: name.to_owned(),
            gid,
            prefix,
            mtu,
            numa: numa_node(name),
        }
    }

    /// The subnet of the GID, e.g. `192.0.2.0/24` or `fe80::/64`.
    pub fn subnet(&self) -> String {
        let masked = mask(&self.gid, self.prefix);
        match Ipv6Addr::from(masked).to_ipv4_mapped() {
            Some(v4) if self.prefix >= 96 => format!("{v4}/{}", self.prefix - 96),
            _ => format!("{}/{}", Ipv6Addr::from(masked), self.prefix),
        }
    }

    /// Whether both GIDs lie in one subnet (the same prefix length and the same leading bits).
    pub fn same_subnet(&self, other: &NicInfo) -> bool {
        self.prefix == other.prefix
            && mask(&self.gid, self.prefix) == mask(&other.gid, other.prefix)
    }

    /// The compact form of a device list: a count, then per device its name (length-prefixed),
    /// GID, prefix, MTU code and NUMA node (big-endian u16, `0xffff` for none).
    pub fn encode_list(nics: &[NicInfo]) -> Vec<u8> {
        let mut b = Vec::with_capacity(1 + nics.len() * 40);
        let n = nics.len().min(MAX_NICS);
        b.push(n as u8);
        for d in &nics[..n] {
            let name = &d.name.as_bytes()[..d.name.len().min(MAX_NAME)];
            b.push(name.len() as u8);
            b.extend_from_slice(name);
            b.extend_from_slice(&d.gid);
            b.push(d.prefix);
            b.push(d.mtu.code() as u8);
            b.extend_from_slice(&d.numa.unwrap_or(NO_NUMA).to_be_bytes());
        }
        b
    }

    /// Parses [`NicInfo::encode_list`].
    ///
    /// # Errors
    /// [`VerbsError::BadEndpoint`] naming what is wrong: no devices, more than [`MAX_NICS`],
    /// a truncated entry, a name that is not UTF-8, a prefix over 128, an unknown MTU code, or
    /// bytes left over.
    pub fn decode_list(b: &[u8]) -> Result<Vec<NicInfo>> {
        let bad = |reason: String| VerbsError::BadEndpoint {
            reason: format!("device list: {reason}"),
        };
        let (&n, mut rest) = b.split_first().ok_or_else(|| bad("empty".into()))?;
        let n = usize::from(n);
        if n == 0 || n > MAX_NICS {
            return Err(bad(format!("{n} devices (1 to {MAX_NICS})")));
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut take = |k: usize| -> Result<&[u8]> {
                if rest.len() < k {
                    return Err(bad(format!("device {i} is cut short")));
                }
                let (a, b) = rest.split_at(k);
                rest = b;
                Ok(a)
            };
            let len = usize::from(take(1)?[0]);
            if len == 0 || len > MAX_NAME {
                return Err(bad(format!("device {i}: a name of {len} bytes")));
            }
            let name = std::str::from_utf8(take(len)?)
                .map_err(|_| bad(format!("device {i}: the name is not UTF-8")))?
                .to_owned();
            let mut gid = [0u8; 16];
            gid.copy_from_slice(take(16)?);
            let t = take(4)?;
            let (prefix, mtu, numa) = (t[0], t[1], u16::from_be_bytes([t[2], t[3]]));
            if prefix > 128 {
                return Err(bad(format!("{name}: subnet prefix {prefix} over 128")));
            }
            let mtu = Mtu::from_code(u32::from(mtu))
                .ok_or_else(|| bad(format!("{name}: mtu code {mtu}")))?;
            out.push(NicInfo {
                name,
                gid,
                prefix,
                mtu,
                numa: (numa != NO_NUMA).then_some(numa),
            });
        }
        if !rest.is_empty() {
            return Err(bad(format!("{} bytes after the last device", rest.len())));
        }
        Ok(out)
    }
}

impl std::fmt::Display for NicInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, mtu {}", self.name, self.subnet(), self.mtu)?;
        match self.numa {
            Some(n) => write!(f, ", numa {n})"),
            None => write!(f, ")"),
        }
    }
}

/// The first `prefix` bits of `gid`, the rest zero.
fn mask(gid: &[u8; 16], prefix: u8) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, (o, g)) in out.iter_mut().zip(gid).enumerate() {
        let bits = u32::from(prefix).saturating_sub(8 * i as u32).min(8);
        *o = if bits == 0 {
            0
        } else {
            g & (0xffu8 << (8 - bits))
        };
    }
    out
}

/// The prefix length of the interface that holds `addr`, from `getifaddrs`.
fn ipv4_prefix(addr: Ipv4Addr) -> Option<u8> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: list is a valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = list;
    while !p.is_null() {
        // SAFETY: p is an entry of the live list getifaddrs returned.
        let e = unsafe { &*p };
        p = e.ifa_next;
        if e.ifa_addr.is_null() || e.ifa_netmask.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr of the family it names.
        if i32::from(unsafe { (*e.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in, and so is its netmask.
        let (a, m) = unsafe {
            (
                *(e.ifa_addr as *const libc::sockaddr_in),
                *(e.ifa_netmask as *const libc::sockaddr_in),
            )
        };
        if Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)) == addr {
            found = Some(u32::from_be(m.sin_addr.s_addr).leading_ones() as u8);
            break;
        }
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// The device's NUMA node as sysfs gives it (`-1`, absent or unreadable: none).
fn numa_node(name: &str) -> Option<u16> {
    let s =
        std::fs::read_to_string(format!("/sys/class/infiniband/{name}/device/numa_node")).ok()?;
    s.trim()
        .parse::<i32>()
        .ok()
        .and_then(|n| u16::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(name: &str, v4: [u8; 4], prefix: u8) -> NicInfo {
        NicInfo {
            name: name.into(),
            gid: Ipv4Addr::from(v4).to_ipv6_mapped().octets(),
            prefix: 96 + prefix,
            mtu: Mtu::M1024,
            numa: None,
        }
    }

    #[test]
    fn subnets_compare_by_their_leading_bits() {
        let a = nic("a", [192, 0, 2, 1], 24);
        let b = nic("b", [192, 0, 2, 9], 24);
        let c = nic("c", [198, 51, 100, 1], 24);
        assert!(a.same_subnet(&b));
        assert!(!a.same_subnet(&c));
        assert_eq!(a.subnet(), "192.0.2.0/24");
        let mut ib = a.clone();
        ib.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        ib.prefix = 64;
        assert_eq!(ib.subnet(), "fe80::/64");
        assert!(!ib.same_subnet(&a));
        assert_eq!(mask(&[0xff; 16], 13)[..3], [0xff, 0xf8, 0]);
    }

    #[test]
    fn lists_round_trip() {
        let mut v = vec![
            nic("rxe0", [192, 0, 2, 1], 24),
            nic("mlx5_1", [10, 0, 0, 2], 16),
        ];
        v[1].numa = Some(1);
        v[1].mtu = Mtu::M4096;
        let b = NicInfo::encode_list(&v);
        assert_eq!(NicInfo::decode_list(&b).unwrap(), v);
        assert_eq!(v[1].to_string(), "mlx5_1 (10.0.0.0/16, mtu 4096, numa 1)");
    }

    #[test]
    fn malformed_lists_are_refused_without_panicking() {
        let good = NicInfo::encode_list(&[nic("rxe0", [192, 0, 2, 1], 24)]);
        for bad in [&[][..], &[0], &[33], &good[..good.len() - 1]] {
            assert!(NicInfo::decode_list(bad).is_err(), "{bad:?}");
        }
        let mut extra = good.clone();
        extra.push(0);
        let e = NicInfo::decode_list(&extra).unwrap_err().to_string();
        assert!(e.contains("after the last device"), "{e}");
        let mut mtu = good.clone();
        let at = good.len() - 3;
        mtu[at] = 9;
        assert!(NicInfo::decode_list(&mtu)
            .unwrap_err()
            .to_string()
            .contains("mtu code 9"));
        for i in 0..good.len() {
            for v in [0u8, 0x7f, 0xff] {
                let mut b = good.clone();
                b[i] = v;
                let _ = NicInfo::decode_list(&b);
            }
        }
    }
}
