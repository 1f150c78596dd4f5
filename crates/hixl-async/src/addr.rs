//! Engine addresses in HIXL's forms: `ip`, `ip:port`, `[ipv6]`, `[ipv6]:port`; and, looked up
//! through the system's resolver, `host` and `host:port`.

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
        if !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_err()
        {
            return Err(bad(&format!("port {port} is out of range (0-65535)")));
        }
        let ip: IpAddr = ip.parse().map_err(|_| bad("not an IP address"))?;
        if ip.is_ipv6() {
            return Err(bad("write IPv6 with a port as [ip]:port"));
        }
        Self::with_port(ip, port).ok_or_else(|| bad("port must be 0-65535"))
    }

    /// As [`EngineAddr::parse`], and a host name (`localhost:26000`, `prefill-0.svc:26000`)
    /// is resolved through the system's resolver (its first IPv4 address, else its first).
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] naming the input: not an address nor a host name, or a name
    /// that does not resolve (with the resolver's reason).
    pub async fn lookup(s: &str) -> Result<EngineAddr> {
        let e = match EngineAddr::parse(s) {
            Ok(a) => return Ok(a),
            Err(e) => e,
        };
        let Some((host, port)) = host_port(s) else {
            return Err(e);
        };
        let found = tokio::net::lookup_host((host, port))
            .await
            .map(Iterator::collect::<Vec<_>>);
        pick(s, host, found)
    }

    /// [`EngineAddr::lookup`] on the calling thread (the resolver may block on the network:
    /// for callers that are not on a runtime's worker, or that name an engine already
    /// connected by that name).
    ///
    /// # Errors
    /// As [`EngineAddr::lookup`].
    pub fn lookup_blocking(s: &str) -> Result<EngineAddr> {
        use std::net::ToSocketAddrs;
        let e = match EngineAddr::parse(s) {
            Ok(a) => return Ok(a),
            Err(e) => e,
        };
        let Some((host, port)) = host_port(s) else {
            return Err(e);
        };
        let found = (host, port)
            .to_socket_addrs()
            .map(Iterator::collect::<Vec<_>>);
        pick(s, host, found)
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

/// `host` or `host:port` with a host name (letters, digits, `-`, `.`, `_`; not an IP form).
fn host_port(s: &str) -> Option<(&str, u16)> {
    let t = s.trim();
    let (host, port) = match t.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (t, 0),
    };
    let name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.chars().all(name)
        && host.chars().any(|c| c.is_ascii_alphabetic());
    ok.then_some((host, port))
}

/// The address `host` resolved to (its first IPv4 address, else its first), or why not.
fn pick(s: &str, host: &str, found: std::io::Result<Vec<SocketAddr>>) -> Result<EngineAddr> {
    let bad = |reason: String| Error::InvalidAddress {
        addr: s.to_string(),
        reason,
    };
    let v = found.map_err(|e| bad(format!("the host name {host:?} does not resolve: {e}")))?;
    let sa = v
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| v.first())
        .ok_or_else(|| bad(format!("the host name {host:?} resolves to no address")))?;
    Ok(EngineAddr {
        ip: sa.ip(),
        port: (sa.port() > 0).then_some(sa.port()),
    })
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

    #[test]
    fn host_names_are_looked_up_and_a_name_that_does_not_resolve_is_named() {
        assert_eq!(host_port("localhost:26000"), Some(("localhost", 26000)));
        assert_eq!(host_port("prefill-0.svc"), Some(("prefill-0.svc", 0)));
        for not_a_name in ["", "1.2.3.4:5", "host:99999", "a b:1", "[::1]:2", "::1"] {
            assert_eq!(host_port(not_a_name), None, "{not_a_name:?}");
        }
        let a = EngineAddr::lookup_blocking("localhost:26000").unwrap();
        assert!(a.ip.is_loopback() && a.port == Some(26000), "{a:?}");
        assert_eq!(EngineAddr::lookup_blocking("localhost").unwrap().port, None);
        let e = EngineAddr::lookup_blocking("no-such-host.invalid:26000").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("\"no-such-host.invalid\" does not resolve"),
            "{msg}"
        );
        let e = EngineAddr::lookup_blocking("not an address").unwrap_err();
        assert!(e.to_string().contains("not an IP address"), "{e}");
        for bad in ["localhost:99999", "127.0.0.1:65536"] {
            let e = EngineAddr::parse(bad).unwrap_err().to_string();
            assert!(e.contains("out of range") && e.contains(bad), "{e}");
        }
    }
}
