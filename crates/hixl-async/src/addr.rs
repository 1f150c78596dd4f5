//! Engine addresses in HIXL's forms: `ip`, `ip:port`, `[ipv6]`, `[ipv6]:port`.

use std::net::{IpAddr, SocketAddr};

use hixl_core::{Error, Result};

/// A parsed engine address. A port of 0 (or none) means client-only, as in HIXL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EngineAddr {
    /// The IP.
    pub ip: IpAddr,
    /// The listening port, if the engine is a server.
    pub port: Option<u16>,
}

impl EngineAddr {
    /// Parses `ip`, `ip:port`, `[ipv6]` or `[ipv6]:port`.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] naming the input.
    pub fn parse(s: &str) -> Result<EngineAddr> {
        let bad = |reason: &str| Error::InvalidAddress {
            addr: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim();
        if t.is_empty() {
            return Err(bad("empty"));
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(EngineAddr { ip, port: None });
        }
        if let Some(rest) = t.strip_prefix('[') {
            let (ip, after) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            let ip: IpAddr = ip.parse().map_err(|_| bad("not an IPv6 address"))?;
            if after.is_empty() {
                return Ok(EngineAddr { ip, port: None });
            }
            let port = after
                .strip_prefix(':')
                .ok_or_else(|| bad("expected ':port' after ']'"))?;
            return Self::with_port(ip, port).ok_or_else(|| bad("port must be 0-65535"));
        }
        let (ip, port) = t.rsplit_once(':').ok_or_else(|| bad("not an IP address"))?;
        let ip: IpAddr = ip.parse().map_err(|_| bad("not an IP address"))?;
        if ip.is_ipv6() {
            return Err(bad("write IPv6 with a port as [ip]:port"));
        }
        Self::with_port(ip, port).ok_or_else(|| bad("port must be 0-65535"))
    }

    fn with_port(ip: IpAddr, port: &str) -> Option<EngineAddr> {
        let p: u16 = port.parse().ok()?;
        Some(EngineAddr {
            ip,
            port: (p > 0).then_some(p),
        })
    }

    /// The socket address to listen on or connect to.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.port.map(|p| SocketAddr::new(self.ip, p))
    }
}

/// Formats a socket address the way HIXL names engines.
pub fn engine_name(sa: SocketAddr) -> String {
    match sa {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(EngineAddr::parse("127.0.0.1").unwrap().port, None);
        assert_eq!(EngineAddr::parse("127.0.0.1:80").unwrap().port, Some(80));
        assert_eq!(EngineAddr::parse("127.0.0.1:0").unwrap().port, None);
        assert_eq!(EngineAddr::parse("[::1]:9").unwrap().port, Some(9));
        assert_eq!(EngineAddr::parse("[::1]").unwrap().port, None);
        assert_eq!(EngineAddr::parse("::1").unwrap().port, None);
        // a bare IPv6 address whose last group looks like a port is still just an address
        assert_eq!(EngineAddr::parse("::1:80").unwrap().port, None);
        for bad in [
            "",
            "x",
            "1.2.3.4:99999",
            "1.2.3.4:-1",
            "[::1",
            "[::1]x",
            "host:80",
        ] {
            let e = EngineAddr::parse(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        let sa: SocketAddr = "[::1]:5".parse().unwrap();
        assert_eq!(engine_name(sa), "[::1]:5");
    }
}
