//! The side endpoint of `hixl doctor --serve`: a plain TCP port beside the engine that tells
//! a doctor its end of the path (one JSON object) and sinks or sources raw TCP for the
//! baseline (the protocol of `hixl serve --baseline`). Its address travels in the name of the
//! region the doctor's engine exports, so a doctor that reached the engine (by address or by
//! directory name) finds it.
//!
//! A connection's first byte picks: `F` for the facts, `W`/`R` for the baseline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::findings::RemoteEnd;
use crate::netif;

/// The exported region's name: this prefix, then the side endpoint's `ip:port`.
pub const REGION_PREFIX: &str = "hixl.doctor@";

/// The most bytes of facts a doctor reads.
const MAX_FACTS: u64 = 64 << 10;

/// Serves doctors on `l` (a thread per connection) until the process ends; a raw TCP call
/// moves at most `max_per_call` bytes (the doctor's region: no more memory than that per
/// connection, whatever a peer asks).
pub fn serve(l: TcpListener, engine: String, max_per_call: usize) {
    for s in l.incoming().flatten() {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let _ = conn(s, &engine, max_per_call);
        });
    }
}

fn conn(mut s: TcpStream, engine: &str, max_per_call: usize) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut first = [0u8; 1];
    if s.peek(&mut first)? == 0 {
        return Ok(());
    }
    if first[0] != b'F' {
        s.set_read_timeout(None)?;
        return baseline_conn(s, max_per_call);
    }
    let local = s.local_addr()?.ip();
    let all = netif::interfaces();
    let iface = netif::iface_of(local, &all);
    let facts = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "engine": engine,
        "route_src": local,
        "route_if": iface.map(|i| i.name.clone()),
        "mtu": iface.and_then(|i| i.mtu),
        "interfaces": all,
    });
    s.write_all(facts.to_string().as_bytes())?;
    s.shutdown(std::net::Shutdown::Write)
}

/// One baseline connection (`hixl serve --baseline`, and the raw TCP sink of a doctor's side endpoint): the header, then calls
/// until the peer closes. A header asking for more than `max_per_call` bytes a call ends it.
///
/// # Errors
/// The connection's failure.
pub fn baseline_conn(mut s: TcpStream, max_per_call: usize) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let mut h = [0u8; 17];
    s.read_exact(&mut h)?;
    let op = h[0];
    let per_call = u64::from_le_bytes(h[1..9].try_into().unwrap_or_default()) as usize;
    let block = (u64::from_le_bytes(h[9..17].try_into().unwrap_or_default()) as usize).max(1);
    if per_call == 0 || per_call > max_per_call {
        return Ok(());
    }
    // The same footprint as a hixl call (per_call bytes of distinct memory), so both move
    // bytes between the socket and equally cold memory. Freed when the connection ends.
    let mut buf = vec![0u8; per_call];
    let mut one = [0u8; 1];
    loop {
        if op == b'W' {
            for c in buf.chunks_mut(block) {
                s.read_exact(c)?;
            }
            s.write_all(&[1])?;
        } else {
            if s.read(&mut one)? == 0 {
                return Ok(());
            }
            for c in buf.chunks(block) {
                s.write_all(c)?;
            }
        }
    }
}

/// The side endpoint named by a region of the peer's, if one is.
pub fn side_of(region_names: &[String]) -> Option<SocketAddr> {
    region_names
        .iter()
        .find_map(|n| n.strip_prefix(REGION_PREFIX)?.parse().ok())
}

/// Asks the side endpoint at `side` for the peer's end of the path.
///
/// # Errors
/// A message naming what failed: the connection, or facts that are not the expected JSON.
pub fn fetch(side: SocketAddr, timeout: Duration) -> Result<RemoteEnd, String> {
    let mut s = TcpStream::connect_timeout(&side, timeout)
        .map_err(|e| format!("side endpoint {side}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.write_all(b"F"))
        .map_err(|e| format!("side endpoint {side}: {e}"))?;
    let mut text = Vec::new();
    (&mut s)
        .take(MAX_FACTS)
        .read_to_end(&mut text)
        .map_err(|e| format!("side endpoint {side}: {e}"))?;
    parse(&text).ok_or_else(|| format!("side endpoint {side} answered no doctor facts"))
}

/// The peer's end from its facts (fields it left out stay unknown).
fn parse(text: &[u8]) -> Option<RemoteEnd> {
    let v: serde_json::Value = serde_json::from_slice(text).ok()?;
    let o = v.as_object()?;
    let s = |k: &str| o.get(k).and_then(|x| x.as_str()).map(str::to_string);
    Some(RemoteEnd {
        advertised: s("engine"),
        route_src: s("route_src").and_then(|x| x.parse().ok()),
        route_if: s("route_if"),
        mtu: o
            .get("mtu")
            .and_then(|x| x.as_u64())
            .and_then(|m| u32::try_from(m).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_from_any_bytes_never_panic() {
        assert!(parse(b"").is_none());
        assert!(parse(b"[1,2]").is_none());
        assert!(parse(&[0xff, 0xfe]).is_none());
        let r = parse(br#"{"engine":"192.0.2.1:1","route_src":"x","mtu":99999999999}"#);
        let r = r.unwrap_or_default();
        assert_eq!(r.advertised.as_deref(), Some("192.0.2.1:1"));
        assert_eq!((r.route_src, r.mtu), (None, None));
    }

    #[test]
    fn the_side_endpoint_travels_in_a_region_name() {
        let names = vec!["kv".to_string(), format!("{REGION_PREFIX}192.0.2.1:4000")];
        assert_eq!(side_of(&names), "192.0.2.1:4000".parse().ok());
        assert_eq!(side_of(&[format!("{REGION_PREFIX}nonsense")]), None);
    }

    #[test]
    fn a_doctor_reads_the_facts_over_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        std::thread::spawn(move || serve(l, "127.0.0.1:9".into(), 1 << 20));
        let r = fetch(addr, Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.advertised.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(r.route_src, "127.0.0.1".parse().ok());
        assert_eq!(r.route_if.as_deref(), Some("lo"));
    }
}
