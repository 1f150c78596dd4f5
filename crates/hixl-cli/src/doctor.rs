//! `hixl doctor`: a preflight of the path to a peer. Run `hixl doctor --serve` on one host
//! and `hixl doctor --peer ADDR|NAME` on another: it says which transport the peer gets and
//! why, checks the advertised addresses against the interfaces that reach the peer, compares
//! the MTUs of both ends, probes hixl against raw TCP between the same hosts, and names what
//! is wrong. Exit status: 0 nothing wrong (warnings allowed), 1 doctor could not run (or was
//! stopped), 2 bad arguments, 3 something wrong was found.

mod serve;

use std::net::IpAddr;
use std::time::Duration;

use hixl_doctor::{probe, Facts, Report, Settings, Severity, ROUNDS};

use crate::info::peer_builder;
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
    let settings = Settings {
        expect: a.expect.clone().or_else(|| {
            a.options
                .iter()
                .find(|(k, _)| k == "hixl.Transport")
                .map(|(_, v)| v.clone())
                .filter(|v| v != "auto")
        }),
        probe: !a.no_probe,
        size: a.size,
        block: a.block,
        duration: a.duration,
    };
    let expect = if a.expect.is_some() {
        "--expect"
    } else {
        "--option hixl.Transport"
    };
    match settings.check([expect, "--size", "--block", "--duration"]) {
        Err(hixl::Error::InvalidParam { what }) => return Err(hixl_cli::fail!("{what}")),
        r => r?,
    }
    let mut stop = crate::stop::Stop::install()?;
    let mut facts = Facts {
        peer: peer.clone(),
        expect: settings.expect.clone(),
        ..Facts::default()
    };
    facts.peer_addrs = addresses(&peer, &a).await?;
    facts.directory_route_src = a.directory.as_deref().and_then(|url| {
        let first = url.strip_prefix("etcd://")?.split(',').next()?;
        hixl_doctor::directory_route_src(&[first.to_string()])
    });
    facts.local = hixl_doctor::local_end(&facts.peer_addrs, a.local);
    let ip = facts
        .local
        .advertised
        .or(facts.local.route_src)
        .map_or_else(|| "0.0.0.0".to_string(), |i| i.to_string());
    let engine = peer_builder(&ip, a.directory.as_deref(), &a.options)
        .build()
        .await?;
    let diagnose = hixl_doctor::diagnose(&engine, &settings, &mut facts, |f| {
        eprintln!(
            "hixl doctor: probing {} over {} ({ROUNDS} rounds of hixl and raw TCP, {} s each)",
            f.peer,
            f.transport.as_deref().unwrap_or("?"),
            a.duration
        );
    });
    let outcome = tokio::select! {
        () = diagnose => None,
        sig = stop.recv() => Some(sig),
    };
    engine.shutdown(Duration::from_secs(1)).await;
    if let Some(sig) = outcome {
        return Err(hixl_cli::fail!("doctor stopped by {sig}"));
    }
    let r = hixl_doctor::conclude(facts);
    report(&r, a.json)?;
    Ok(if r.ok { 0 } else { EXIT_FOUND })
}

/// The addresses the peer is reached at: itself, or its directory entry's.
async fn addresses(peer: &str, a: &Args) -> CliResult<Vec<String>> {
    if hixl_doctor::netif::ip_of(peer).is_some() {
        return Ok(hixl_doctor::peer_addresses(peer, None, "").await?);
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
    Ok(hixl_doctor::peer_addresses(peer, Some(&d), "--directory URL").await?)
}

/// Prints the report, as text or one JSON object.
fn report(r: &Report, json: bool) -> CliResult {
    if json {
        println!("{}", crate::util::json_line(r)?);
        return Ok(());
    }
    let (f, found) = (&r.facts, &r.findings);
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
