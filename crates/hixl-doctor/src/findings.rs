//! What `hixl doctor` concludes, without I/O: the facts it gathered about both ends of a path
//! and the probe's figures in, the findings (what is wrong, naming the addresses and numbers
//! involved) out.

use std::net::IpAddr;

use serde::Serialize;

/// How bad a finding is: an error makes the exit status nonzero, a warning does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something is wrong with the path.
    Error,
    /// Worth a look; the path works.
    Warning,
}

/// One thing doctor found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// A stable name for scripts: `loopback-advertised`, `mtu-mismatch`, ...
    pub code: &'static str,
    /// What is wrong, in words, naming addresses and figures.
    pub what: String,
}

/// This end: the address it advertises, and where the kernel routes the peer from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LocalEnd {
    /// The address this host's engine advertises (`--local`).
    pub advertised: Option<IpAddr>,
    /// The local address the kernel routes to the peer from.
    pub route_src: Option<IpAddr>,
    /// That address's interface.
    pub route_if: Option<String>,
    /// That interface's MTU.
    pub mtu: Option<u32>,
    /// Whether the advertised address is one of this host's interfaces'.
    pub advertised_on_host: bool,
}

/// The peer's end, as its `hixl doctor --serve` told it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RemoteEnd {
    /// The engine address it advertises.
    pub advertised: Option<String>,
    /// Its local address of our side connection: where its kernel routes us from.
    pub route_src: Option<IpAddr>,
    /// That address's interface.
    pub route_if: Option<String>,
    /// That interface's MTU.
    pub mtu: Option<u32>,
}

/// One rail of a verbs link, after the probe.
#[derive(Clone, Debug, Serialize)]
pub struct RailFact {
    /// Its description (`rail 0 mlx5_0 -> mlx5_1`).
    pub name: String,
    /// Whether it takes slices now.
    pub up: bool,
    /// `up`, or why it is paused.
    pub state: String,
    /// Slices that landed on it.
    pub ops: u64,
    /// Bytes of those slices.
    pub bytes: u64,
    /// The MTU both ends of it agreed on.
    pub mtu: u32,
}

/// The probe's figures: hixl and raw TCP between the same two hosts, in the same run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Probe {
    /// hixl WRITE throughput, GB/s.
    pub hixl_gbps: f64,
    /// hixl small-WRITE latency (p50, µs).
    pub hixl_p50_us: f64,
    /// Raw TCP to the peer's sink, GB/s (none without a `doctor --serve` peer).
    pub tcp_gbps: Option<f64>,
    /// Raw TCP small-call latency (p50, µs).
    pub tcp_p50_us: Option<f64>,
}

/// Everything doctor learnt about one path.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Facts {
    /// The peer as given (`ip:port` or a directory name).
    pub peer: String,
    /// The addresses the peer is reached at (given, or its directory entry's).
    pub peer_addrs: Vec<String>,
    /// With a directory: the local address the kernel routes to the directory from (the
    /// fleet's view of where engines are).
    pub directory_route_src: Option<IpAddr>,
    /// Why the engine could not connect, if it could not.
    pub connect_error: Option<String>,
    /// Which transport serves the peer and why.
    pub transport: Option<String>,
    /// The transport asked for or expected (`--expect`, or `hixl.Transport`).
    pub expect: Option<String>,
    /// This end.
    pub local: LocalEnd,
    /// The peer's end, when it runs `hixl doctor --serve`.
    pub remote: Option<RemoteEnd>,
    /// Why the peer's end is unknown, when it is.
    pub remote_error: Option<String>,
    /// The link's rails (verbs only).
    pub rails: Vec<RailFact>,
    /// The probe, when it ran.
    pub probe: Option<Probe>,
    /// Why the probe did not run or failed.
    pub probe_error: Option<String>,
}

/// hixl below this fraction of raw TCP through the same path is a slow path.
pub const SLOW_RATIO: f64 = 0.25;

fn err(code: &'static str, what: String) -> Finding {
    Finding {
        severity: Severity::Error,
        code,
        what,
    }
}

fn warn(code: &'static str, what: String) -> Finding {
    Finding {
        severity: Severity::Warning,
        code,
        what,
    }
}

fn show(ip: Option<IpAddr>) -> String {
    ip.map_or_else(|| "?".into(), |i| i.to_string())
}

/// The findings of `f`, most basic first.
pub fn check(f: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    let peer_ips: Vec<IpAddr> = f
        .peer_addrs
        .iter()
        .filter_map(|a| crate::netif::ip_of(a))
        .collect();
    let peer_remote = peer_ips.iter().any(|i| !i.is_loopback());
    check_local(f, peer_remote, &mut out);
    // The peer advertising loopback to us, who are not on loopback.
    let not_lo = |i: &Option<IpAddr>| i.filter(|i| !i.is_loopback());
    let reached = not_lo(&f.local.advertised)
        .or(not_lo(&f.local.route_src))
        .or(not_lo(&f.directory_route_src));
    for a in &f.peer_addrs {
        if crate::netif::ip_of(a).is_some_and(|i| i.is_loopback()) && !peer_remote {
            if let Some(reached) = reached {
                out.push(err("loopback-advertised", format!(
                    "peer {} advertises {a}, a loopback address, to this host at {reached}: another host cannot reach it there (advertise the address of the interface that routes to its peers)",
                    f.peer
                )));
            }
        }
    }
    if let Some(r) = &f.remote {
        if let (Some(adv), Some(rs)) = (&r.advertised, r.route_src) {
            let adv_ip = crate::netif::ip_of(adv);
            if adv_ip.is_some_and(|i| i.is_loopback()) && !rs.is_loopback() {
                out.push(err("loopback-advertised", format!(
                    "peer {} advertises {adv}, a loopback address, though its kernel routes to this host from {rs}",
                    f.peer
                )));
            }
        }
    }
    if let Some(e) = &f.connect_error {
        out.push(err(
            "unreachable",
            format!("cannot connect to peer {}: {e}", f.peer),
        ));
    }
    check_transport(f, &mut out);
    check_mtu(f, &mut out);
    check_rails(f, &mut out);
    check_probe(f, &mut out);
    if let Some(e) = &f.remote_error {
        out.push(warn("no-peer-facts", format!(
            "the peer's end is unknown ({e}): run `hixl doctor --serve` there for its MTU and a raw TCP baseline"
        )));
    }
    out
}

/// The advertised address against the interface that routes to the peer.
fn check_local(f: &Facts, peer_remote: bool, out: &mut Vec<Finding>) {
    let l = &f.local;
    let Some(adv) = l.advertised else { return };
    let src = l.route_src;
    if adv.is_loopback() && peer_remote && src.is_some_and(|s| !s.is_loopback()) {
        out.push(err("loopback-advertised", format!(
            "this host advertises {adv}, a loopback address, to peer {} ({}) which it reaches from {} ({}): the peer cannot connect back to {adv}",
            f.peer,
            f.peer_addrs.join(","),
            show(src),
            l.route_if.as_deref().unwrap_or("?")
        )));
        return;
    }
    if !adv.is_unspecified() && !l.advertised_on_host {
        out.push(err(
            "address-not-local",
            format!("this host advertises {adv}, which no interface of it holds"),
        ));
    } else if src.is_some_and(|s| s != adv) && !adv.is_unspecified() {
        out.push(warn("other-interface", format!(
            "this host advertises {adv} but reaches peer {} from {} ({}): traffic back to {adv} takes another interface",
            f.peer,
            show(src),
            l.route_if.as_deref().unwrap_or("?")
        )));
    }
}

/// TCP (or anything else) where another transport was asked for or expected.
fn check_transport(f: &Facts, out: &mut Vec<Finding>) {
    let (Some(want), Some(got)) = (&f.expect, &f.transport) else {
        return;
    };
    let want = want.to_ascii_lowercase();
    let name = got.split_whitespace().next().unwrap_or("").to_string();
    if name != want {
        out.push(err(
            "unexpected-transport",
            format!(
                "{name} where {want} was expected: peer {} is served by {got}",
                f.peer
            ),
        ));
    }
}

fn check_mtu(f: &Facts, out: &mut Vec<Finding>) {
    let Some(r) = &f.remote else { return };
    if let (Some(a), Some(b)) = (f.local.mtu, r.mtu) {
        if a != b {
            out.push(err("mtu-mismatch", format!(
                "MTU mismatch: this host's {} ({}) has MTU {a}, the peer's {} ({}) has MTU {b}: packets over {} bytes are dropped or fragmented on the way",
                f.local.route_if.as_deref().unwrap_or("?"),
                show(f.local.route_src),
                r.route_if.as_deref().unwrap_or("?"),
                show(r.route_src),
                a.min(b)
            )));
        }
    }
}

fn check_rails(f: &Facts, out: &mut Vec<Finding>) {
    let carried: u64 = f.rails.iter().map(|r| r.ops).sum();
    for r in &f.rails {
        if !r.up {
            out.push(err("rail-down", format!("{} is down: {}", r.name, r.state)));
        } else if carried > 0 && r.ops == 0 {
            out.push(err(
                "rail-idle",
                format!(
                    "{} is up but carried nothing of the probe's {carried} slices",
                    r.name
                ),
            ));
        }
    }
}

fn check_probe(f: &Facts, out: &mut Vec<Finding>) {
    if let Some(e) = &f.probe_error {
        out.push(err("probe-failed", format!("the probe failed: {e}")));
    }
    let Some(p) = &f.probe else { return };
    if let Some(tcp) = p.tcp_gbps.filter(|&t| t > 0.0 && t.is_finite()) {
        if p.hixl_gbps < tcp * SLOW_RATIO {
            out.push(err("slow-path", format!(
                "hixl moves {:.3} GB/s to peer {} where raw TCP between the same hosts moves {tcp:.3} GB/s ({:.0}%): the path is much slower than its link",
                p.hixl_gbps,
                f.peer,
                100.0 * p.hixl_gbps / tcp
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        s.parse().ok()
    }

    fn healthy() -> Facts {
        Facts {
            peer: "192.0.2.1:26000".into(),
            peer_addrs: vec!["192.0.2.1:26000".into()],
            transport: Some("tcp (the peer is on another host)".into()),
            local: LocalEnd {
                advertised: ip("192.0.2.2"),
                route_src: ip("192.0.2.2"),
                route_if: Some("eth0".into()),
                mtu: Some(1500),
                advertised_on_host: true,
            },
            remote: Some(RemoteEnd {
                advertised: Some("192.0.2.1:26000".into()),
                route_src: ip("192.0.2.1"),
                route_if: Some("eth0".into()),
                mtu: Some(1500),
            }),
            probe: Some(Probe {
                hixl_gbps: 1.0,
                hixl_p50_us: 50.0,
                tcp_gbps: Some(1.2),
                tcp_p50_us: Some(30.0),
            }),
            ..Facts::default()
        }
    }

    fn codes(f: &Facts) -> Vec<&'static str> {
        check(f).into_iter().map(|x| x.code).collect()
    }

    #[test]
    fn a_healthy_path_has_no_finding() {
        assert!(check(&healthy()).is_empty(), "{:?}", check(&healthy()));
    }

    #[test]
    fn loopback_advertised_here_names_both_addresses() {
        let mut f = healthy();
        f.local.advertised = ip("127.0.0.1");
        let got = check(&f);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].code, "loopback-advertised");
        assert!(got[0].what.contains("127.0.0.1") && got[0].what.contains("192.0.2.2"));
    }

    #[test]
    fn loopback_advertised_by_the_peer() {
        let mut f = healthy();
        f.peer = "prefill-0".into();
        f.peer_addrs = vec!["127.0.0.1:5000".into()];
        f.connect_error = Some("connection refused".into());
        f.remote = None;
        f.probe = None;
        // Looked up in a directory this host reaches over the network.
        f.local.advertised = ip("127.0.0.1");
        f.local.route_src = ip("127.0.0.1");
        f.directory_route_src = ip("192.0.2.2");
        assert_eq!(codes(&f), ["loopback-advertised", "unreachable"]);
        // A directory on loopback too: one host, loopback is its path.
        f.directory_route_src = ip("127.0.0.1");
        assert_eq!(codes(&f), ["unreachable"]);
        let mut g = healthy();
        if let Some(r) = g.remote.as_mut() {
            r.advertised = Some("127.0.0.1:26000".into());
        }
        assert_eq!(codes(&g), ["loopback-advertised"]);
    }

    #[test]
    fn an_address_not_on_the_host_and_another_interface() {
        let mut f = healthy();
        f.local.advertised = ip("198.51.100.7");
        f.local.advertised_on_host = false;
        assert_eq!(codes(&f), ["address-not-local"]);
        f.local.advertised_on_host = true;
        assert_eq!(codes(&f), ["other-interface"]);
        assert_eq!(check(&f)[0].severity, Severity::Warning);
    }

    #[test]
    fn mtu_mismatch_names_both_ends() {
        let mut f = healthy();
        if let Some(r) = f.remote.as_mut() {
            r.mtu = Some(1280);
        }
        let got = check(&f);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].code, "mtu-mismatch");
        assert!(got[0].what.contains("1500") && got[0].what.contains("1280"));
    }

    #[test]
    fn tcp_where_verbs_was_expected() {
        let mut f = healthy();
        f.expect = Some("verbs".into());
        assert_eq!(codes(&f), ["unexpected-transport"]);
        assert!(check(&f)[0].what.starts_with("tcp where verbs"));
        f.expect = Some("TCP".into());
        assert!(codes(&f).is_empty());
    }

    #[test]
    fn rails_down_and_idle() {
        let mut f = healthy();
        let rail = |name: &str, up: bool, ops: u64| RailFact {
            name: name.into(),
            up,
            state: if up {
                "up".into()
            } else {
                "paused: port down".into()
            },
            ops,
            bytes: ops * 4096,
            mtu: 4096,
        };
        f.rails = vec![rail("rail 0", true, 100), rail("rail 1", true, 0)];
        assert_eq!(codes(&f), ["rail-idle"]);
        f.rails = vec![rail("rail 0", true, 100), rail("rail 1", false, 0)];
        assert_eq!(codes(&f), ["rail-down"]);
        // Nothing carried at all: no rail is singled out as idle.
        f.rails = vec![rail("rail 0", true, 0), rail("rail 1", true, 0)];
        assert!(codes(&f).is_empty());
    }

    #[test]
    fn hixl_much_slower_than_raw_tcp_through_the_same_path() {
        let mut f = healthy();
        f.probe = Some(Probe {
            hixl_gbps: 0.1,
            tcp_gbps: Some(1.0),
            ..Probe::default()
        });
        assert_eq!(codes(&f), ["slow-path"]);
        // Both slow (a slow link): not hixl's fault.
        f.probe = Some(Probe {
            hixl_gbps: 0.005,
            tcp_gbps: Some(0.006),
            ..Probe::default()
        });
        assert!(codes(&f).is_empty());
        // No baseline, or a nonsense one: nothing to compare with.
        f.probe = Some(Probe {
            hixl_gbps: 0.1,
            tcp_gbps: Some(f64::NAN),
            ..Probe::default()
        });
        assert!(codes(&f).is_empty());
    }

    #[test]
    fn an_unknown_peer_end_is_a_warning() {
        let mut f = healthy();
        f.remote = None;
        f.remote_error = Some("no side endpoint".into());
        let got = check(&f);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].severity, Severity::Warning);
    }
}
