//! This host's network facts for `hixl doctor`: its interfaces and their addresses (getifaddrs),
//! each interface's MTU and link speed (sysfs), and which local address the kernel routes a
//! peer from (a UDP socket connected to the peer: no packet is sent).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Iface {
    /// The interface's name (`eth0`).
    pub name: String,
    /// One of its addresses.
    pub addr: IpAddr,
    /// Its MTU in bytes, when sysfs says.
    pub mtu: Option<u32>,
    /// Its link speed in Mbit/s, when sysfs says (virtual links often do not).
    pub speed_mbps: Option<u64>,
}

/// Every IPv4 and IPv6 address of this host's interfaces (in this network namespace).
pub fn interfaces() -> Vec<Iface> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family says its type.
        let addr = unsafe { sockaddr_ip(ifa.ifa_addr) };
        let Some(addr) = addr else { continue };
        // SAFETY: ifa_name is a non-null NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .to_string();
        out.push(Iface {
            mtu: sys_number(&name, "mtu").and_then(|m| u32::try_from(m).ok()),
            speed_mbps: sys_number(&name, "speed").and_then(|s| u64::try_from(s).ok()),
            name,
            addr,
        });
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The IP of a sockaddr of family AF_INET or AF_INET6.
///
/// # Safety
/// `sa` points at a valid sockaddr, as large as its family says.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    // SAFETY: the caller's promise: sa is a valid sockaddr.
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: family AF_INET: a sockaddr_in.
            let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))))
        }
        libc::AF_INET6 => {
            // SAFETY: family AF_INET6: a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

/// `/sys/class/net/IF/FILE` as a number (negative or unreadable: none).
fn sys_number(iface: &str, file: &str) -> Option<i64> {
    if iface.contains('/') || iface.starts_with('.') {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{iface}/{file}"))
        .ok()?
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|&n| n > 0)
}

/// The local address the kernel sends to `peer` from (route lookup by a connected UDP socket).
pub fn route_source(peer: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = match peer {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any).ok()?;
    // Port 9 (discard): connect() on UDP only looks the route up.
    s.connect((peer, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// The interface that holds `addr`, if one does.
pub fn iface_of(addr: IpAddr, all: &[Iface]) -> Option<&Iface> {
    all.iter().find(|i| i.addr == addr)
}

/// The IP of an `ip:port` (or `[v6]:port`) engine address.
pub fn ip_of(engine: &str) -> Option<IpAddr> {
    engine.parse::<SocketAddr>().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_with_its_mtu_and_routes_to_itself() {
        let all = interfaces();
        let lo = iface_of(IpAddr::V4(Ipv4Addr::LOCALHOST), &all);
        assert!(lo.is_some(), "{all:?}");
        assert_eq!(
            route_source(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
    }

    #[test]
    fn engine_addresses_parse() {
        assert_eq!(ip_of("192.0.2.1:26000"), "192.0.2.1".parse().ok());
        assert_eq!(ip_of("[::1]:1"), "::1".parse().ok());
        assert_eq!(ip_of("name"), None);
        assert_eq!(sys_number("../x", "mtu"), None);
    }
}
