//! A preflight of the path to a hixl peer: which transport the peer gets and why, the
//! advertised addresses against the interfaces that reach the peer, the MTUs of both ends, a
//! short probe of hixl against raw TCP between the same hosts, and what is wrong.
//!
//! The `hixl doctor` command (crate `hixl-cli`) and `hixl.Engine.doctor()` (the Python
//! bindings) both run [`diagnose`] and [`conclude`]; the peer's end runs [`serve::start`]
//! (`hixl doctor --serve`). [`doctor`] is the whole check on an engine the caller already has.
#![warn(missing_docs)]

pub mod findings;
pub mod netif;
pub mod probe;
pub mod serve;
pub mod side;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hixl_async::{Engine, HostBuffer, Peer, Region};
use hixl_core::{Access, Error, RemoteRegion, Result};
use hixl_directory::Directory;
use serde::Serialize;

pub use findings::{Facts, Finding, LocalEnd, Probe, RailFact, RemoteEnd, Severity};

/// Rounds of the probe (hixl and raw TCP alternating, the better of each counts).
pub const ROUNDS: usize = 2;

/// The transports a doctor can be told to expect.
pub const TRANSPORTS: [&str; 3] = ["tcp", "fabric", "verbs"];

/// What a doctor checks besides the path itself.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The transport the peer should get (`tcp`, `fabric`, `verbs`); anything else is named.
    pub expect: Option<String>,
    /// Whether to probe throughput and latency.
    pub probe: bool,
    /// Bytes of each probe call (at least `block`, at most 1 GiB).
    pub size: u64,
    /// Bytes of each descriptor of a probe call (at least [`probe::SMALL`]).
    pub block: u64,
    /// Seconds of each throughput measurement, in (0, 60].
    pub duration: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            expect: None,
            probe: true,
            size: 8 << 20,
            block: 1 << 20,
            duration: 0.5,
        }
    }
}

fn invalid(what: String) -> Error {
    Error::InvalidParam { what }
}

impl Settings {
    /// Checks the settings; the error names the bad value (`names` gives each setting's name
    /// as the caller spells it: `["expect", "size", "block", "duration"]`).
    ///
    /// # Errors
    /// `InvalidParam` naming the setting and its value.
    pub fn check(&self, names: [&str; 4]) -> Result<()> {
        let [expect, size, block, duration] = names;
        if !(self.duration.is_finite() && self.duration > 0.0 && self.duration <= 60.0) {
            return Err(invalid(format!(
                "{duration} must be in (0, 60] seconds, got {}",
                self.duration
            )));
        }
        if self.block < probe::SMALL {
            return Err(invalid(format!(
                "{block} must be at least {} bytes, got {}",
                probe::SMALL,
                self.block
            )));
        }
        if self.size < self.block || self.size > (1 << 30) {
            return Err(invalid(format!(
                "{size} must be at least {block} ({}) and at most 1G, got {}",
                self.block, self.size
            )));
        }
        if let Some(e) = self
            .expect
            .as_deref()
            .filter(|e| !TRANSPORTS.contains(&e.to_ascii_lowercase().as_str()))
        {
            return Err(invalid(format!(
                "{expect} {e:?}: the transports are tcp, fabric and verbs"
            )));
        }
        Ok(())
    }
}

/// What a doctor reports: `hixl doctor --json`'s object.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Nothing wrong (warnings allowed).
    pub ok: bool,
    /// What it learnt about the path.
    pub facts: Facts,
    /// What is wrong or worth a look, most basic first.
    pub findings: Vec<Finding>,
}

/// The findings of `facts`, as a report.
pub fn conclude(facts: Facts) -> Report {
    let findings = findings::check(&facts);
    Report {
        ok: !findings.iter().any(|x| x.severity == Severity::Error),
        facts,
        findings,
    }
}

/// The addresses `peer` is reached at: itself when it is an `ip:port`, else its entry in
/// `directory`.
///
/// # Errors
/// A name without a directory (`InvalidParam`, naming `directory_hint`), or the lookup's
/// failure.
pub async fn peer_addresses(
    peer: &str,
    directory: Option<&Directory>,
    directory_hint: &str,
) -> Result<Vec<String>> {
    if netif::ip_of(peer).is_some() {
        return Ok(vec![peer.to_string()]);
    }
    let Some(d) = directory else {
        return Err(invalid(format!(
            "peer {peer:?}: not an ip:port; a name needs {directory_hint}"
        )));
    };
    Ok(d.resolve(peer).await?.addrs)
}

/// The local address the kernel routes to the first etcd member (`host:port`) from.
pub fn directory_route_src(endpoints: &[String]) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    let addr = endpoints.first()?.to_socket_addrs().ok()?.next()?;
    netif::route_source(addr.ip())
}

/// This end: what it advertises (`given`, else the route's source) and where the kernel
/// routes the peer from.
pub fn local_end(peer_addrs: &[String], given: Option<IpAddr>) -> LocalEnd {
    let all = netif::interfaces();
    let target = peer_addrs.iter().filter_map(|a| netif::ip_of(a)).next();
    let route_src = target.and_then(netif::route_source);
    let iface = route_src.and_then(|s| netif::iface_of(s, &all));
    let advertised = given.or(route_src);
    LocalEnd {
        advertised,
        route_src,
        route_if: iface.map(|i| i.name.clone()),
        mtu: iface.and_then(|i| i.mtu),
        advertised_on_host: advertised.is_some_and(|ad| netif::iface_of(ad, &all).is_some()),
    }
}

/// The whole check of the path to `peer` from `engine`, which stays up: the peer's addresses
/// (a name is looked up in the engine's directory), this end (the address `engine`
/// advertises, unless it listens on every address), then [`diagnose`] and [`conclude`].
/// Without `s.expect`, an engine whose `hixl.Transport` is not `auto` expects that transport.
///
/// # Errors
/// Bad settings, or a name that cannot be looked up; a peer that cannot be reached is a
/// finding, not an error.
pub async fn doctor(engine: &Engine, peer: &str, s: &Settings) -> Result<Report> {
    s.check(["expect", "size", "block", "duration"])?;
    // An engine made for one transport expects it, as `--option hixl.Transport=T` does.
    let made_for = match engine.options().transport {
        hixl_core::options::TransportChoice::Auto => None,
        t => Some(t.as_str().to_string()),
    };
    let mut f = Facts {
        peer: peer.to_string(),
        expect: s.expect.clone().or(made_for),
        ..Facts::default()
    };
    f.peer_addrs =
        peer_addresses(peer, engine.directory(), "an engine with hixl.Directory").await?;
    if engine.directory().is_some() {
        f.directory_route_src = directory_route_src(&engine.options().directory.endpoints);
    }
    let own = netif::ip_of(engine.local_engine())
        .or_else(|| engine.local_engine().parse::<IpAddr>().ok())
        .filter(|i| !i.is_unspecified());
    f.local = local_end(&f.peer_addrs, own);
    diagnose(engine, s, &mut f, |_| ()).await;
    Ok(conclude(f))
}

/// Connects, asks the peer's side endpoint for its end, probes; fills `f` (whose `peer`,
/// `peer_addrs` and `local` are set). Failures become facts (`connect_error`, ...).
/// `before_probe` is called with the facts so far just before the probe starts. A link to the
/// peer already up is used and left up; one this opens is closed before it returns.
pub async fn diagnose(
    engine: &Engine,
    s: &Settings,
    f: &mut Facts,
    before_probe: impl FnOnce(&Facts),
) {
    // A link already up (an application's engine) is used and left up; one opened here is
    // closed at the end.
    let (peer, opened) = match engine.connect(&f.peer, Duration::from_secs(5)).await {
        Ok(p) => (p, true),
        Err(Error::AlreadyConnected { .. }) => match engine.peer(&f.peer) {
            Ok(p) => (p, false),
            Err(e) => {
                f.connect_error = Some(e.to_string());
                return;
            }
        },
        Err(e) => {
            f.connect_error = Some(e.to_string());
            return;
        }
    };
    f.transport = Some(peer.transport().to_string());
    let regions = peer.regions();
    let names: Vec<String> = regions.iter().filter_map(|r| r.name.clone()).collect();
    let side = side::side_of(&names);
    match side {
        Some(s) => {
            match tokio::task::spawn_blocking(move || side::fetch(s, Duration::from_secs(5))).await
            {
                Ok(Ok(r)) => f.remote = Some(r),
                Ok(Err(e)) => f.remote_error = Some(e),
                Err(e) => f.remote_error = Some(e.to_string()),
            }
        }
        None => f.remote_error = Some("it exports no doctor region".into()),
    }
    if s.probe {
        let n = (s.size / s.block).max(1);
        let plan = probe::Plan {
            per_call: n * s.block,
            block: s.block,
            dur: Duration::from_secs_f64(s.duration),
        };
        before_probe(f);
        match run_probe(engine, &peer, side, plan, &regions).await {
            Ok(p) => f.probe = Some(p),
            Err(e) => f.probe_error = Some(e),
        }
    }
    f.rails = peer
        .rails()
        .iter()
        .map(|r| RailFact {
            name: format!("rail {} {} -> {}", r.index, r.local, r.remote),
            up: r.up,
            state: r.state.clone(),
            ops: r.ops,
            bytes: r.bytes,
            mtu: r.mtu,
        })
        .collect();
    if opened {
        let _ = engine.disconnect(&f.peer).await;
    }
}

/// hixl into the peer's writable region (its doctor region, else its largest), then raw TCP
/// to its side endpoint when it has one.
async fn run_probe(
    engine: &Engine,
    peer: &Peer,
    side: Option<SocketAddr>,
    plan: probe::Plan,
    regions: &[RemoteRegion],
) -> std::result::Result<Probe, String> {
    let writable: Vec<&RemoteRegion> = regions
        .iter()
        .filter(|r| r.access.contains(Access::REMOTE_WRITE))
        .collect();
    let target = writable
        .iter()
        .find(|r| {
            r.name
                .as_deref()
                .is_some_and(|n| n.starts_with(side::REGION_PREFIX))
        })
        .or_else(|| writable.iter().max_by_key(|r| r.len))
        .ok_or("the peer exports no writable region to probe")?;
    let per_call = plan.per_call.min(target.len / plan.block * plan.block);
    if per_call < probe::SMALL {
        return Err(format!(
            "the peer's region of {} bytes is too small for the probe",
            target.len
        ));
    }
    let plan = probe::Plan { per_call, ..plan };
    let local = HostBuffer::zeroed(per_call as usize)
        .and_then(|b| engine.register(b))
        .map_err(|e| e.to_string())?;
    let p = rounds(peer, &local, side, target.addr, plan).await;
    // The engine may stay up (`Engine.doctor()` in Python): its probe buffer goes.
    let _ = engine.deregister(&local).await;
    p
}

/// The probe's rounds from `local` into `remote` (and raw TCP to `side`).
async fn rounds(
    peer: &Peer,
    local: &Region,
    side: Option<SocketAddr>,
    remote: u64,
    plan: probe::Plan,
) -> std::result::Result<Probe, String> {
    // Two rounds, hixl and raw TCP alternating, the better of each: a burst of load from
    // elsewhere on either host during one measurement does not decide the comparison.
    let mut p = Probe::default();
    for _ in 0..ROUNDS {
        let h = probe::hixl(peer, local.addr(), remote, plan).await?;
        p.hixl_gbps = p.hixl_gbps.max(h.gbps);
        p.hixl_p50_us = best(p.hixl_p50_us, h.p50_us);
        if let Some(s) = side {
            let t = probe::raw_tcp(s, plan).await?;
            p.tcp_gbps = Some(p.tcp_gbps.unwrap_or(0.0).max(t.gbps));
            p.tcp_p50_us = Some(best(p.tcp_p50_us.unwrap_or(0.0), t.p50_us));
        }
    }
    Ok(p)
}

/// The lower of two latencies, 0 being none yet.
fn best(a: f64, b: f64) -> f64 {
    if a > 0.0 {
        a.min(b)
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> Settings {
        Settings {
            size: 256 << 10,
            block: 64 << 10,
            duration: 0.05,
            ..Settings::default()
        }
    }

    #[test]
    fn settings_name_the_bad_value() {
        let names = ["expect", "size", "block", "duration"];
        assert!(Settings::default().check(names).is_ok());
        let bad = |s: Settings, named: &str| match s.check(names) {
            Err(Error::InvalidParam { what }) => assert!(what.contains(named), "{what}"),
            r => panic!("{r:?}"),
        };
        bad(
            Settings {
                expect: Some("rdma".into()),
                ..quick()
            },
            "\"rdma\"",
        );
        bad(
            Settings {
                duration: f64::NAN,
                ..quick()
            },
            "NaN",
        );
        bad(
            Settings {
                block: 100,
                ..quick()
            },
            "block",
        );
        bad(
            Settings {
                size: 2 << 30,
                ..quick()
            },
            "size",
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_doctor_against_a_serving_end_over_loopback() {
        let ip: IpAddr = [127, 0, 0, 1].into();
        let b = Engine::builder("127.0.0.1").ephemeral_port();
        let served = serve::start(b, ip, 1 << 20)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = served.engine.local_engine().to_string();
        let e = Engine::builder("127.0.0.1")
            .build()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let r = doctor(&e, &addr, &quick())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // A debug build's hixl over TCP in one process can be under a quarter of raw TCP
        // (`slow-path`); nothing else may be named.
        let wrong = r
            .findings
            .iter()
            .filter(|f| !(cfg!(debug_assertions) && f.code == "slow-path"));
        assert_eq!(wrong.count(), 0, "{r:?}");
        assert!(r.facts.remote.is_some() && r.facts.probe.is_some(), "{r:?}");
        assert!(e.peer(&addr).is_err(), "the link it opened is closed");
        let s = Settings {
            expect: Some("verbs".into()),
            probe: false,
            ..quick()
        };
        let r = doctor(&e, &addr, &s)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let codes: Vec<&str> = r.findings.iter().map(|f| f.code).collect();
        assert_eq!(codes, ["unexpected-transport"], "{r:?}");
        assert!(!r.ok);
        assert!(matches!(
            doctor(&e, "prefill-0", &quick()).await,
            Err(Error::InvalidParam { .. })
        ));
        e.shutdown(Duration::from_secs(1)).await;
        served.engine.shutdown(Duration::from_secs(1)).await;
    }
}
