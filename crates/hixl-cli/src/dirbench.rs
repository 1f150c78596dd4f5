//! `hixl bench directory`: the directory at fleet size. One process holds N directory handles
//! (what each engine with `hixl.Directory` runs: a client, a watch, a kept-alive lease); all
//! publish at once, then every handle must see every name. Reports publish latency, how long
//! until all N caches hold all N names, cached and cold lookup latency, and the etcd requests
//! an idle engine costs (counted by etcd itself, from its `/metrics`).

use std::time::{Duration, Instant};

use hixl::directory::{incarnation_hex, table_digest, Directory, Entry, ENTRY_VERSION};
use hixl::Options;
use serde::Serialize;

use crate::util::{current_rss, percentile, CliError, CliResult};

/// Arguments of `hixl bench directory`.
#[derive(clap::Args, Debug, Clone)]
pub struct DirArgs {
    /// The etcd directory (`etcd://host:port,...`); without it, starts one local etcd member
    /// (`etcd` on PATH) in a temp dir for the run.
    #[arg(long, value_name = "URL")]
    pub directory: Option<String>,
    /// Engines (directory handles), comma-separated counts measured in turn.
    #[arg(long, default_value = "100,1000")]
    pub engines: String,
    /// Lease TTL of each entry, seconds (`hixl.DirectoryTtlSec`).
    #[arg(long, default_value_t = 10)]
    pub ttl: u64,
    /// Seconds the published engines sit idle while etcd counts their requests.
    #[arg(long, default_value_t = 10.0)]
    pub idle: f64,
    /// Engines that open and publish together (a fleet's start, in waves of this size).
    #[arg(long, default_value_t = 64)]
    pub wave: usize,
    /// Cold lookups (each a round trip to etcd) to time.
    #[arg(long, default_value_t = 1000)]
    pub cold: usize,
    /// One JSON object per count instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug)]
struct DirResult {
    bench: &'static str,
    engines: usize,
    open_p50_ms: f64,
    open_p99_ms: f64,
    publish_p50_ms: f64,
    publish_p99_ms: f64,
    publish_max_ms: f64,
    /// From the first publish until every handle's cache holds every name.
    converge_ms: f64,
    cached_lookup_p50_us: f64,
    cached_lookup_p99_us: f64,
    cold_lookup_p50_ms: f64,
    cold_lookup_p99_ms: f64,
    /// gRPC messages etcd received per idle engine per second (keep-alives).
    etcd_msgs_per_idle_engine_s: f64,
    /// The same, counted by the handles themselves.
    client_requests_per_idle_engine_s: f64,
    /// Resident memory per handle in this process.
    rss_per_engine_kib: f64,
    close_ms: f64,
}

/// Runs the benchmark.
pub async fn run(a: DirArgs) -> CliResult {
    let counts: Vec<usize> = a
        .engines
        .split(',')
        .map(|s| s.trim().parse().ok().filter(|n| *n > 0 && *n <= 100_000))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            CliError(format!(
                "--engines {:?}: expected counts in 1..=100000",
                a.engines
            ))
        })?;
    let local = match &a.directory {
        Some(_) => None,
        None => {
            if !hixl_directory::testing::available() {
                return Err(CliError(
                    "no --directory given and `etcd` is not installed".into(),
                ));
            }
            Some(hixl_directory::testing::Etcd::start(1))
        }
    };
    let url = a
        .directory
        .clone()
        .or_else(|| local.as_ref().map(|e| e.url()))
        .unwrap_or_default();
    if !a.json {
        println!(
            "directory {url}, TTL {} s, idle window {} s, waves of {}",
            a.ttl, a.idle, a.wave
        );
        println!(
            "{:>7} {:>15} {:>19} {:>11} {:>17} {:>15} {:>16} {:>11}",
            "engines",
            "open p50/p99",
            "publish p50/p99/max",
            "converge",
            "lookup p50/p99",
            "cold p50/p99",
            "idle msgs/eng/s",
            "KiB/engine"
        );
    }
    for (round, n) in counts.into_iter().enumerate() {
        let r = one(&a, &url, n, round).await?;
        if a.json {
            println!("{}", crate::util::json_line(&r)?);
        } else {
            println!(
                "{:>7} {:>6.1}/{:>6.1}ms {:>5.1}/{:>5.1}/{:>5.1}ms {:>9.0}ms {:>6.2}/{:>6.2}us {:>5.2}/{:>5.2}ms {:>16.3} {:>11.0}",
                r.engines, r.open_p50_ms, r.open_p99_ms, r.publish_p50_ms, r.publish_p99_ms, r.publish_max_ms,
                r.converge_ms, r.cached_lookup_p50_us, r.cached_lookup_p99_us, r.cold_lookup_p50_ms,
                r.cold_lookup_p99_ms, r.etcd_msgs_per_idle_engine_s, r.rss_per_engine_kib
            );
        }
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn p(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(v, q)
}

async fn one(a: &DirArgs, url: &str, n: usize, round: usize) -> CliResult<DirResult> {
    let mut o = Options::default();
    o.set("hixl.Directory", url)?;
    o.set("hixl.DirectoryTtlSec", &a.ttl.to_string())?;
    o.set(
        "hixl.DirectoryPrefix",
        &format!("/hixl-bench/{}-{round}/", std::process::id()),
    )?;
    let rss0 = current_rss(std::process::id()).unwrap_or(0);
    // Open and publish in waves (a fleet starting does not start at one instant either).
    let wave_len = a.wave.max(1);
    let mut dirs = Vec::with_capacity(n);
    let mut open = Vec::with_capacity(n);
    for wave in (0..n).collect::<Vec<_>>().chunks(wave_len) {
        let opened = futures::future::join_all(wave.iter().map(|_| async {
            let t = Instant::now();
            Directory::open(&o.directory)
                .await
                .map(|d| (d, ms(t.elapsed())))
        }))
        .await;
        for r in opened {
            let (d, t) = r?;
            dirs.push(d);
            open.push(t);
        }
    }
    let t0 = Instant::now();
    let mut publish = Vec::with_capacity(n);
    for (w, wave) in dirs.chunks(wave_len).enumerate() {
        let base = w * wave_len;
        let published =
            futures::future::join_all(wave.iter().enumerate().map(|(j, d)| async move {
                let i = base + j;
                let e = Entry {
                    v: ENTRY_VERSION,
                    name: format!("engine-{i}"),
                    incarnation: incarnation_hex(0x1000 + i as u64),
                    addrs: vec![format!(
                        "10.{}.{}.{}:26000",
                        i >> 16 & 255,
                        i >> 8 & 255,
                        i & 255
                    )],
                    transports: vec!["tcp".into()],
                    table_digest: table_digest([]),
                    wire: 3,
                };
                let t = Instant::now();
                d.publish(e).await.map(|()| ms(t.elapsed()))
            }))
            .await;
        for r in published {
            publish.push(r?);
        }
    }
    loop {
        if dirs.iter().all(|d| d.len() == n) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            return Err(CliError(format!(
                "caches did not converge on {n} names in 120 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let converge = ms(t0.elapsed());
    let rss = current_rss(std::process::id())
        .unwrap_or(0)
        .saturating_sub(rss0);
    // Cached lookups: any handle, any name.
    let mut cached = Vec::with_capacity(10_000);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..10_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (d, name) = (
            &dirs[x as usize % n],
            format!("engine-{}", (x >> 32) as usize % n),
        );
        let t = Instant::now();
        let hit = d.lookup(&name).is_some();
        cached.push(t.elapsed().as_secs_f64() * 1e6);
        if !hit {
            return Err(CliError(format!("{name} missing from a converged cache")));
        }
    }
    let mut cold = Vec::with_capacity(a.cold);
    for i in 0..a.cold {
        let t = Instant::now();
        dirs[i % n]
            .resolve_cold(&format!("engine-{}", (i * 7919) % n))
            .await?;
        cold.push(ms(t.elapsed()));
    }
    // Idle: what etcd receives, and what the handles sent, over the window.
    let metrics0 = etcd_msgs(url).await;
    let req0: u64 = dirs.iter().map(Directory::requests).sum();
    tokio::time::sleep(Duration::from_secs_f64(a.idle)).await;
    let metrics1 = etcd_msgs(url).await;
    let req1: u64 = dirs.iter().map(Directory::requests).sum();
    let per = |d: f64| d / a.idle / n as f64;
    let etcd_rate = match (metrics0, metrics1) {
        (Some(m0), Some(m1)) => per(m1 - m0),
        _ => f64::NAN,
    };
    let t = Instant::now();
    futures::future::join_all(dirs.iter().map(Directory::close)).await;
    let close = ms(t.elapsed());
    Ok(DirResult {
        bench: "directory",
        engines: n,
        open_p50_ms: p(&mut open, 0.5),
        open_p99_ms: p(&mut open, 0.99),
        publish_p50_ms: p(&mut publish, 0.5),
        publish_p99_ms: p(&mut publish, 0.99),
        publish_max_ms: p(&mut publish, 1.0),
        converge_ms: converge,
        cached_lookup_p50_us: p(&mut cached, 0.5),
        cached_lookup_p99_us: p(&mut cached, 0.99),
        cold_lookup_p50_ms: p(&mut cold, 0.5),
        cold_lookup_p99_ms: p(&mut cold, 0.99),
        etcd_msgs_per_idle_engine_s: etcd_rate,
        client_requests_per_idle_engine_s: per((req1 - req0) as f64),
        rss_per_engine_kib: rss as f64 / 1024.0 / n as f64,
        close_ms: close,
    })
}

/// The sum of `grpc_server_msg_received_total` over every member of `url`'s `/metrics`.
async fn etcd_msgs(url: &str) -> Option<f64> {
    let eps: Vec<String> = url
        .strip_prefix("etcd://")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let mut total = 0.0;
    for ep in eps {
        let body =
            tokio::task::spawn_blocking(move || hixl_directory::testing::http_get(&ep, "/metrics"))
                .await
                .ok()??;
        total += body
            .lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Some(total)
}
