//! `hixl bench links`: what links cost at scale. One process holds a target engine and N
//! client engines; all N connect at once, each writes and reads 64 KiB, then the links sit
//! idle. Reports connect latency (p50/p99/max), file descriptors and resident memory per link
//! (both ends, as both live in this process), and the process's CPU while the links are idle.

use std::time::{Duration, Instant};

use hixl::{Engine, HostBuffer, OpDesc};
use serde::Serialize;

use crate::util::{current_rss, percentile, CliError, CliResult};

/// Bytes each link writes, then reads back.
const BLOCK: u64 = 64 << 10;

/// Arguments of `hixl bench links`.
#[derive(clap::Args, Debug, Clone)]
pub struct LinksArgs {
    /// Client engines (one link each), comma-separated counts measured in turn.
    #[arg(long, default_value = "16,256")]
    pub peers: String,
    /// `tcp`, `fabric` or `auto` (both ends).
    #[arg(long, default_value = "tcp")]
    pub transport: String,
    /// Seconds the open links stay idle while the process's CPU time is measured.
    #[arg(long, default_value_t = 5.0)]
    pub idle: f64,
    /// Seconds between the last transfer and the idle window, measured as `hold cpu`: a
    /// link probes as a busy one for interval × miss limit after its last op. Default: that
    /// hold (the engines' 5 misses) plus one interval, so that every link has turned idle.
    #[arg(long)]
    pub settle: Option<f64>,
    /// `hixl.HeartbeatIntervalMs` of every engine (the engines' default when unset): what
    /// an idle link costs is mostly its heartbeats.
    #[arg(long)]
    pub heartbeat_interval_ms: Option<u64>,
    /// Connect timeout of each link, in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub timeout: f64,
    /// One JSON object per count on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One count's figures.
#[derive(Serialize, Debug)]
struct LinksResult {
    bench: &'static str,
    peers: usize,
    transport: String,
    connected: usize,
    failed: usize,
    first_error: Option<String>,
    connect_p50_ms: f64,
    connect_p99_ms: f64,
    connect_max_ms: f64,
    /// Links whose 64 KiB write and read both completed with the right bytes.
    transfers_ok: usize,
    /// File descriptors the connected links added, per link (both ends).
    fds_per_link: f64,
    /// Resident memory the connected links added, per link (both ends), KiB.
    rss_kib_per_link: f64,
    /// CPU time of the whole process between the last transfer and the idle window (the
    /// links' hold), in % of one core.
    hold_cpu_percent: f64,
    hold_seconds: f64,
    /// CPU time of the whole process while every link was idle, in % of one core.
    idle_cpu_percent: f64,
    idle_seconds: f64,
}

/// Runs `hixl bench links`.
///
/// # Errors
/// Bad arguments, an engine that cannot start.
pub async fn run(a: LinksArgs) -> CliResult {
    let counts: Vec<usize> = a
        .peers
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=100_000).contains(&n))
                .ok_or_else(|| CliError(format!("--peers: {s:?} is not a count in 1..=100000")))
        })
        .collect::<CliResult<_>>()?;
    if !matches!(a.transport.as_str(), "tcp" | "fabric" | "auto") {
        return Err(CliError(format!(
            "--transport: {:?} is not tcp, fabric or auto",
            a.transport
        )));
    }
    if a.settle.is_some_and(|s| !(s.is_finite() && s >= 0.0)) {
        return Err(CliError(format!(
            "--settle {:?}: need settle >= 0 seconds",
            a.settle
        )));
    }
    if !(a.idle.is_finite() && a.idle >= 0.0 && a.timeout.is_finite() && a.timeout > 0.0) {
        return Err(CliError(format!(
            "--idle {} / --timeout {}: need idle >= 0 and timeout > 0 seconds",
            a.idle, a.timeout
        )));
    }
    raise_fd_limit();
    if !a.json {
        println!(
            "{:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9} {:>6}",
            "peers",
            "connected",
            "p50 ms",
            "p99 ms",
            "max ms",
            "fds/link",
            "KiB/link",
            "hold cpu",
            "idle cpu",
            "ok"
        );
    }
    for n in counts {
        let progress = crate::progress::Progress::spinner(
            format!("{n} peers: connecting, then holding and idling"),
            a.json,
        );
        let r = measure(&a, n).await?;
        drop(progress);
        if a.json {
            println!("{}", crate::util::json_line(&r)?);
        } else {
            println!(
                "{:>6} {:>9} {:>9.2} {:>9.2} {:>9.2} {:>8.1} {:>9.1} {:>8.2}% {:>8.2}% {:>6}",
                r.peers,
                r.connected,
                r.connect_p50_ms,
                r.connect_p99_ms,
                r.connect_max_ms,
                r.fds_per_link,
                r.rss_kib_per_link,
                r.hold_cpu_percent,
                r.idle_cpu_percent,
                r.transfers_ok
            );
            if let Some(e) = &r.first_error {
                println!("        first failure: {e}");
            }
        }
    }
    Ok(())
}

/// An engine builder with the transport and heartbeat settings of the run.
fn builder(a: &LinksArgs) -> hixl::EngineBuilder {
    let b = Engine::builder("127.0.0.1").option("hixl.Transport", &a.transport);
    match a.heartbeat_interval_ms {
        Some(ms) => b.option("hixl.HeartbeatIntervalMs", ms.to_string()),
        None => b,
    }
}

async fn measure(a: &LinksArgs, n: usize) -> CliResult<LinksResult> {
    let err = |what: &str, e: hixl::Error| CliError(format!("{what}: {e}"));
    let target = builder(a)
        .ephemeral_port()
        .build()
        .await
        .map_err(|e| err("target engine", e))?;
    let addr = target.local_engine().to_string();
    let len = BLOCK * n as u64;
    let region = target
        .register(HostBuffer::zeroed(len as usize).map_err(|e| err("target memory", e))?)
        .map_err(|e| err("registering the target's memory", e))?;
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let c = builder(a)
            .build()
            .await
            .map_err(|e| err("client engine", e))?;
        let buf = c
            .register(HostBuffer::zeroed(BLOCK as usize).map_err(|e| err("client memory", e))?)
            .map_err(|e| err("registering a client's memory", e))?;
        buf.write_at(0, &vec![(i % 251) as u8 + 1; BLOCK as usize])
            .map_err(|e| err("filling a client's memory", e))?;
        clients.push((c, buf));
    }
    let (fds0, rss0) = (open_fds(), current_rss(std::process::id()).unwrap_or(0));
    let timeout = Duration::from_secs_f64(a.timeout);
    let tasks: Vec<_> = clients
        .iter()
        .map(|(c, _)| {
            let (c, addr) = (c.clone(), addr.clone());
            tokio::spawn(async move {
                let t0 = Instant::now();
                let r = c.connect(&addr, timeout).await;
                (t0.elapsed(), r)
            })
        })
        .collect();
    let mut took = Vec::with_capacity(n);
    let mut peers = Vec::with_capacity(n);
    let mut first_error = None;
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok((d, Ok(p))) => {
                took.push(d.as_secs_f64() * 1e3);
                peers.push((i, p));
            }
            Ok((_, Err(e))) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
            Err(e) => {
                first_error.get_or_insert_with(|| format!("connect task: {e}"));
            }
        }
    }
    took.sort_by(f64::total_cmp);
    let (fds1, rss1) = (open_fds(), current_rss(std::process::id()).unwrap_or(0));
    // Each link writes its block into its own slice of the target's region and reads it back.
    let mut transfers_ok = 0;
    let round_trips: Vec<_> = peers
        .iter()
        .map(|(i, p)| {
            let (p, local, remote) = (p.clone(), clients[*i].1.addr(), region.addr());
            let off = *i as u64 * BLOCK;
            tokio::spawn(async move {
                p.write(&[OpDesc::new(local, remote + off, BLOCK)]).await?;
                p.read(&[OpDesc::new(local, remote + off, BLOCK)]).await
            })
        })
        .collect();
    for (k, t) in round_trips.into_iter().enumerate() {
        let i = peers[k].0;
        let expect = (i % 251) as u8 + 1;
        match t.await {
            Ok(Ok(())) => {
                let mut got = vec![0u8; BLOCK as usize];
                if clients[i].1.read_at(0, &mut got).is_ok() && got.iter().all(|&b| b == expect) {
                    transfers_ok += 1;
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert_with(|| format!("transfer: {e}"));
            }
            Err(e) => {
                first_error.get_or_insert_with(|| format!("transfer task: {e}"));
            }
        }
    }
    // The hold: nothing in flight, the links still probe as busy ones.
    let interval_s = a.heartbeat_interval_ms.unwrap_or(1000) as f64 / 1000.0;
    let settle = Duration::from_secs_f64(a.settle.unwrap_or(interval_s * 6.0));
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    tokio::time::sleep(settle).await;
    let (hold_cpu, hold_wall) = (cpu_time() - cpu0, wall0.elapsed());
    // Idle: every link open, nothing in flight.
    let idle = Duration::from_secs_f64(a.idle);
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    tokio::time::sleep(idle).await;
    let (cpu, wall) = (cpu_time() - cpu0, wall0.elapsed());
    let percent = |cpu: Duration, wall: Duration| {
        if wall.is_zero() {
            0.0
        } else {
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
        }
    };
    let connected = peers.len();
    let per = |x: f64| {
        if connected == 0 {
            0.0
        } else {
            x / connected as f64
        }
    };
    let r = LinksResult {
        bench: "links",
        peers: n,
        transport: a.transport.clone(),
        connected,
        failed: n - connected,
        first_error,
        connect_p50_ms: percentile(&took, 0.50),
        connect_p99_ms: percentile(&took, 0.99),
        connect_max_ms: took.last().copied().unwrap_or(0.0),
        transfers_ok,
        fds_per_link: per(fds1 as f64 - fds0 as f64),
        rss_kib_per_link: per((rss1 as f64 - rss0 as f64) / 1024.0),
        hold_cpu_percent: percent(hold_cpu, hold_wall),
        hold_seconds: hold_wall.as_secs_f64(),
        idle_cpu_percent: percent(cpu, wall),
        idle_seconds: wall.as_secs_f64(),
    };
    drop(peers);
    for (c, _) in &clients {
        c.shutdown(Duration::from_millis(100)).await;
    }
    target.shutdown(Duration::from_millis(100)).await;
    Ok(r)
}

/// File descriptors this process has open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// User plus system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Raises the soft limit on open files to the hard one: a thousand links hold thousands.
fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}
