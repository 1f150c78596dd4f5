//! `hixl doctor`: a preflight of the path to a peer. Run `hixl doctor --serve` on one host
//! and `hixl doctor --peer ADDR|NAME` on another: it says which transport the peer gets and
//! why, checks the advertised addresses against the interfaces that reach the peer, compares
//! the MTUs of both ends, probes hixl against raw TCP between the same hosts, and names what
//! is wrong. Exit status: 0 nothing wrong (warnings allowed), 1 doctor could not run (or was
//! stopped), 2 bad arguments, 3 something wrong was found.

mod findings;
mod netif;
mod probe;
mod serve;
mod side;

use std::net::IpAddr;
use std::time::Duration;

use hixl::{Engine, HostBuffer};

use self::findings::{Facts, Finding, LocalEnd, Probe, RailFact, Severity};
use crate::info::{peer_builder, PeerPath};
use crate::util::{parse_kv, parse_size, CliResult};

/// Exit status when doctor found something wrong.
pub const EXIT_FOUND: i32 = 3;

/// Arguments of `hixl doctor`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Be the peer end: an engine and its side endpoint, until SIGINT or SIGTERM.
    #[arg(long, conflicts_with_all = ["peer", "expect", "local"])]
    pub serve: bool,
    /// With `--serve`: the engine's `ip:port` (port 0 picks one; the line `LISTENING
    /// engine=... side=...` says which).
    #[arg(long, value_name = "IP:PORT", requires = "serve")]
    pub listen: Option<String>,
    /// With `--serve`: bytes the probe may write.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub mem: u64,
    /// With `--serve`: publish the engine under NAME in the directory.
    #[arg(long, value_name = "NAME", requires_all = ["serve", "directory"])]
    pub name: Option<String>,
    /// The peer to check: `ip:port`, or a name with `--directory`.
    #[arg(long, value_name = "ADDR|NAME")]
    pub peer: Option<String>,
    /// The etcd directory, `etcd://host:port[,host:port...]` (`hixl.Directory`).
    #[arg(long, value_name = "URL")]
    pub directory: Option<String>,
    /// The address this host advertises to its peers (what its connector is configured
    /// with); default: the one the kernel routes to the peer from.
    #[arg(long, value_name = "IP")]
    pub local: Option<IpAddr>,
    /// The transport the peer should get (`tcp`, `fabric`, `verbs`); anything else is named
    /// as wrong. `--option hixl.Transport=T` expects T too.
    #[arg(long, value_name = "TRANSPORT")]
    pub expect: Option<String>,
    /// Bytes of each probe call.
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    pub size: u64,
    /// Bytes of each descriptor of a probe call.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub block: u64,
    /// Seconds of each throughput measurement (hixl, then raw TCP; two rounds of each, the
    /// better counts).
    #[arg(long, default_value_t = 0.5)]
    pub duration: f64,
    /// Skip the probe.
    #[arg(long)]
    pub no_probe: bool,
    /// An engine option `KEY=VALUE` (repeatable).
    #[arg(long = "option", value_parser = parse_kv)]
    pub options: Vec<(String, String)>,
    /// One JSON object on stdout instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Runs doctor; returns the exit status.
///
/// # Errors
/// When doctor cannot run at all (bad arguments, no engine), or was stopped.
pub async fn run(a: Args) -> CliResult<i32> {
    if a.serve {
        let Some(listen) = &a.listen else {
            return Err(hixl_cli::fail!(
                "doctor --serve needs --listen IP:PORT (the address peers reach)"
            ));
        };
        if a.mem < probe::SMALL {
            return Err(hixl_cli::fail!("--mem must be at least {}", probe::SMALL));
        }
        serve::run(serve::ServeArgs {
            listen,
            mem: a.mem,
            name: a.name.as_deref(),
            directory: a.directory.as_deref(),
            options: &a.options,
        })
        .await?;
        return Ok(0);
    }
    let Some(peer) = a.peer.clone() else {
        return Err(hixl_cli::fail!(
            "doctor needs --peer ADDR|NAME (or --serve on the peer's host)"
        ));
    };
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 60.0) {
        return Err(hixl_cli::fail!(
            "--duration must be in (0, 60] seconds, got {}",
            a.duration
        ));
    }
    if a.block < probe::SMALL || a.size < a.block || a.size > (1 << 30) {
        return Err(hixl_cli::fail!(
            "--block must be at least {} and --size at least --block and at most 1G",
            probe::SMALL
        ));
    }
    if let Some(e) = a
        .expect
        .as_deref()
        .filter(|e| !["tcp", "fabric", "verbs"].contains(&e.to_ascii_lowercase().as_str()))
    {
        return Err(hixl_cli::fail!(
            "--expect {e:?}: the transports are tcp, fabric and verbs"
        ));
    }
    let mut stop = crate::stop::Stop::install()?;
    let mut facts = Facts {
        peer: peer.clone(),
        expect: a.expect.clone().or_else(|| {
            a.options
                .iter()
                .find(|(k, _)| k == "hixl.Transport")
                .map(|(_, v)| v.clone())
                .filter(|v| v != "auto")
        }),
        ..Facts::default()
    };
    facts.peer_addrs = addresses(&peer, &a).await?;
    facts.directory_route_src = a.directory.as_deref().and_then(directory_host);
    facts.local = local_end(&facts.peer_addrs, a.local);
    let ip = facts
        .local
        .advertised
        .or(facts.local.route_src)
        .map_or_else(|| "0.0.0.0".to_string(), |i| i.to_string());
    let engine = peer_builder(&ip, a.directory.as_deref(), &a.options)
        .build()
        .await?;
    let outcome = tokio::select! {
        () = diagnose(&engine, &a, &mut facts) => None,
        sig = stop.recv() => Some(sig),
    };
    engine.shutdown(Duration::from_secs(1)).await;
    if let Some(sig) = outcome {
        return Err(hixl_cli::fail!("doctor stopped by {sig}"));
    }
    let found = findings::check(&facts);
    report(&facts, &found, a.json)?;
    Ok(if found.iter().any(|f| f.severity == Severity::Error) {
        EXIT_FOUND
    } else {
        0
    })
}

/// The addresses the peer is reached at: itself, or its directory entry's.
async fn addresses(peer: &str, a: &Args) -> CliResult<Vec<String>> {
    if netif::ip_of(peer).is_some() {
        return Ok(vec![peer.to_string()]);
    }
    let Some(url) = &a.directory else {
        return Err(hixl_cli::fail!(
            "--peer {peer}: not an ip:port; a name needs --directory URL"
        ));
    };
    let mut o = hixl::Options::default();
    o.set("hixl.Directory", url)?;
    for (k, v) in a
        .options
        .iter()
        .filter(|(k, _)| k.starts_with("hixl.Directory"))
    {
        o.set(k, v)?;
    }
    let d = hixl::directory::Directory::open(&o.directory).await?;
    let entry = d.resolve(peer).await?;
    Ok(entry.addrs)
}

/// The first etcd endpoint of a directory URL (`etcd://host:port[,...]`), and the local
/// address the kernel routes to it from.
fn directory_host(url: &str) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    let first = url.strip_prefix("etcd://")?.split(',').next()?;
    let addr = first.to_socket_addrs().ok()?.next()?;
    netif::route_source(addr.ip())
}

/// This end: what it advertises and where the kernel routes the peer from.
fn local_end(peer_addrs: &[String], given: Option<IpAddr>) -> LocalEnd {
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

/// Connects, asks the peer's side endpoint for its end, probes; fills `f`.
async fn diagnose(engine: &Engine, a: &Args, f: &mut Facts) {
    let peer = match engine.connect(&f.peer, Duration::from_secs(5)).await {
        Ok(p) => p,
        Err(e) => {
            f.connect_error = Some(e.to_string());
            return;
        }
    };
    f.transport = Some(PeerPath::of(&peer).transport);
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
    if !a.no_probe {
        let n = (a.size / a.block).max(1);
        let plan = probe::Plan {
            per_call: n * a.block,
            block: a.block,
            dur: Duration::from_secs_f64(a.duration),
        };
        eprintln!(
            "hixl doctor: probing {} over {} ({ROUNDS} rounds of hixl and raw TCP, {} s each)",
            f.peer,
            f.transport.as_deref().unwrap_or("?"),
            a.duration
        );
        match run_probe(engine, &peer, side, plan, &regions).await {
            Ok(p) => f.probe = Some(p),
            Err(e) => f.probe_error = Some(e),
        }
    }
    f.rails = PeerPath::of(&peer)
        .rails
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
}

/// hixl into the peer's writable region (its doctor region, else its largest), then raw TCP
/// to its side endpoint when it has one.
async fn run_probe(
    engine: &Engine,
    peer: &hixl::Peer,
    side: Option<std::net::SocketAddr>,
    plan: probe::Plan,
    regions: &[hixl::RemoteRegion],
) -> Result<Probe, String> {
    let writable: Vec<&hixl::RemoteRegion> = regions
        .iter()
        .filter(|r| r.access.contains(hixl::Access::REMOTE_WRITE))
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
    // Two rounds, hixl and raw TCP alternating, the better of each: a burst of load from
    // elsewhere on either host during one measurement does not decide the comparison.
    let mut p = Probe::default();
    for _ in 0..ROUNDS {
        let h = probe::hixl(peer, local.addr(), target.addr, plan).await?;
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

/// Rounds of the probe.
const ROUNDS: usize = 2;

/// The lower of two latencies, 0 being none yet.
fn best(a: f64, b: f64) -> f64 {
    if a > 0.0 {
        a.min(b)
    } else {
        b
    }
}

/// Prints the facts and findings, as text or one JSON object.
fn report(f: &Facts, found: &[Finding], json: bool) -> CliResult {
    if json {
        let v = serde_json::json!({
            "ok": !found.iter().any(|x| x.severity == Severity::Error),
            "facts": f,
            "findings": found,
        });
        println!("{}", crate::util::json_line(&v)?);
        return Ok(());
    }
    let show = |i: Option<IpAddr>| i.map_or_else(|| "?".into(), |i| i.to_string());
    println!("peer {} at {}", f.peer, f.peer_addrs.join(","));
    match &f.transport {
        Some(t) => println!("  transport: {t}"),
        None => println!("  transport: none (not connected)"),
    }
    let l = &f.local;
    println!(
        "  this host: advertises {}, routes to the peer from {} ({}, mtu {})",
        show(l.advertised),
        show(l.route_src),
        l.route_if.as_deref().unwrap_or("?"),
        l.mtu.map_or_else(|| "?".into(), |m| m.to_string())
    );
    if let Some(r) = &f.remote {
        println!(
            "  the peer: advertises {}, routes to this host from {} ({}, mtu {})",
            r.advertised.as_deref().unwrap_or("?"),
            show(r.route_src),
            r.route_if.as_deref().unwrap_or("?"),
            r.mtu.map_or_else(|| "?".into(), |m| m.to_string())
        );
    }
    for r in &f.rails {
        println!(
            "  {}: {}, mtu {}; {} bytes in {} slices",
            r.name, r.state, r.mtu, r.bytes, r.ops
        );
    }
    if let Some(p) = &f.probe {
        println!(
            "  probe: hixl {:.3} GB/s, p50 {:.0} us ({} B); raw TCP {} GB/s, p50 {} us",
            p.hixl_gbps,
            p.hixl_p50_us,
            probe::SMALL,
            p.tcp_gbps.map_or_else(|| "?".into(), |g| format!("{g:.3}")),
            p.tcp_p50_us
                .map_or_else(|| "?".into(), |u| format!("{u:.0}")),
        );
    }
    if found.is_empty() {
        println!("nothing wrong");
    }
    for x in found {
        let tag = match x.severity {
            Severity::Error => "WRONG",
            Severity::Warning => "note",
        };
        println!("{tag} [{}] {}", x.code, x.what);
    }
    Ok(())
}
