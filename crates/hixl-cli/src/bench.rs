//! `hixl bench`: HIXL's comm benchmark (each call moves `--total` split into `--blocks`), with
//! a plain-TCP baseline measured between the same two processes in the same run.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hixl::{Engine, HostBuffer, OpDesc, Peer, TransferOp};
use hixl_cli::child::Target;

mod table;

pub use self::table::CaseResult;
use self::table::{print_case, print_header, print_peaks, FEW};
use crate::util::{human, parse_kv, parse_size, percentile, CliError, CliResult, PeakRss};

/// `hixl bench ...`
#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// Bandwidth and latency of READ/WRITE calls (HIXL's comm benchmark method).
    Comm(CommArgs),
    /// One request's KV cache of a real model between two LLM-DataDist clusters.
    Kv(crate::kv::KvArgs),
    /// What links cost at scale: N client engines connect at once to one target (connect
    /// p50/p99, fds and memory per link, idle CPU).
    Links(crate::links::LinksArgs),
    /// The etcd directory at fleet size: N engines publish and resolve each other's names
    /// (publish p99, convergence, cached and cold lookups, etcd requests per idle engine).
    Directory(crate::dirbench::DirArgs),
}

/// Arguments of `hixl bench comm`.
#[derive(clap::Args, Debug, Clone)]
pub struct CommArgs {
    /// `write`, `read` or `both`.
    #[arg(long, default_value = "write")]
    pub op: String,
    /// Block sizes, comma-separated (e.g. 16K,128K,2M).
    #[arg(long, default_value = "16K,128K,2M", value_delimiter = ',', value_parser = parse_size)]
    pub blocks: Vec<u64>,
    /// Bytes each call moves, split into blocks (HIXL uses 128M).
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    pub total: u64,
    /// Instead of --total: N descriptors of one block per call, at fixed offsets.
    #[arg(long)]
    pub batch: Option<u64>,
    /// Seconds to measure each case (and again its baseline).
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Transport: `tcp`, `fabric` (same host: shared memory and copy engines), `verbs` (RDMA;
    /// builds with the `verbs` feature) or `auto` (what the engine picks for the peer).
    /// Measured against a baseline of the same run: a plain TCP stream between the same
    /// processes for tcp and verbs, a single-thread memcpy of the same footprint for the fabric.
    #[arg(long, default_value = "tcp")]
    pub transport: String,
    /// With `--transport fabric`: the target registers heap memory (reached by cross-memory
    /// attach) instead of fabric-pool memory (mapped).
    #[arg(long)]
    pub heap: bool,
    /// With `--transport fabric`: copy streams spin this long (µs) for work before sleeping.
    #[arg(long, default_value_t = 0)]
    pub busy_poll: u64,
    /// `hixl.SpinUs` of both engines: how long (µs) a waiting transfer and a TCP target
    /// connection spin after their last progress before they park (engine default if unset;
    /// a large value is the busy-poll mode).
    #[arg(long)]
    pub spin_us: Option<u64>,
    /// `hixl.TcpIo` of the initiator: how its TCP data connections move bytes (`epoll` or
    /// `uring`; engine default if unset).
    #[arg(long)]
    pub tcp_io: Option<String>,
    /// An existing target (`ip:port`, or a name with `--directory`) instead of starting one;
    /// no baseline then.
    #[arg(long)]
    pub target: Option<String>,
    /// The etcd directory (`etcd://host:port[,host:port...]`) that `--target NAME` is looked
    /// up in (`hixl.Directory`).
    #[arg(long, value_name = "URL", requires = "target")]
    pub directory: Option<String>,
    /// Data connections per peer (hixl.TcpStreams), or copy streams with `--transport fabric`
    /// (fabric_memory.task_stream_num).
    #[arg(long)]
    pub streams: Option<usize>,
    /// Largest piece one request carries (hixl.TcpChunkBytes).
    #[arg(long, value_parser = parse_size)]
    pub chunk: Option<u64>,
    /// An engine option for both engines, `KEY=VALUE` (repeatable), e.g.
    /// `--option hixl.VerbsDevices=mlx5_0,mlx5_1 --option hixl.VerbsQpsPerRail=4`.
    #[arg(long = "option", value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub options: Vec<(String, String)>,
    /// Skip the baseline measurement.
    #[arg(long)]
    pub no_baseline: bool,
    /// One JSON object per case instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs a benchmark.
pub async fn run(b: Bench) -> CliResult {
    match b {
        Bench::Comm(a) => comm(a).await.map(|_| ()),
        Bench::Kv(a) => crate::kv::bench(a).await,
        Bench::Links(a) => crate::links::run(a).await,
        Bench::Directory(a) => crate::dirbench::run(a).await,
    }
}

/// What `hixl bench comm` runs, from valid arguments.
struct Plan {
    /// The fabric transport (its baseline is a memcpy).
    fabric: bool,
    /// The verbs transport (the target must serve it too).
    verbs: bool,
    /// The ops measured, each over every block size.
    ops: Vec<TransferOp>,
}

/// Checks the arguments.
fn plan(a: &CommArgs) -> CliResult<Plan> {
    let transport = a.transport.to_ascii_lowercase();
    let fabric =
        match transport.as_str() {
            "tcp" | "auto" => false,
            "fabric" => true,
            "verbs" if cfg!(feature = "verbs") => false,
            "verbs" => return Err(CliError(
                "--transport verbs: this build has no verbs (build hixl-cli with --features verbs)"
                    .into(),
            )),
            t => {
                return Err(CliError(format!(
                    "--transport {t:?} is not a transport: use tcp, fabric, verbs or auto"
                )))
            }
        };
    let verbs = transport == "verbs";
    let ops: Vec<TransferOp> = match a.op.to_ascii_lowercase().as_str() {
        "write" => vec![TransferOp::Write],
        "read" => vec![TransferOp::Read],
        "both" => vec![TransferOp::Write, TransferOp::Read],
        o => {
            return Err(CliError(format!(
                "--op must be write, read or both, not {o:?}"
            )))
        }
    };
    let zero = |what: &str| CliError(format!("{what} 0: it must be at least 1 (e.g. 16K)"));
    if a.blocks.contains(&0) {
        return Err(zero("--blocks"));
    }
    if a.total == 0 {
        return Err(zero("--total"));
    }
    if a.batch == Some(0) {
        return Err(zero("--batch"));
    }
    // Each side registers the largest call's bytes: more than the machine has fails late.
    let need = a
        .blocks
        .iter()
        .map(|&b| per_call(a, b))
        .max()
        .unwrap_or(a.total);
    let have = crate::util::physical_memory();
    if have.is_some_and(|m| need > m / 2) {
        return Err(CliError(format!(
            "the cases need {} registered on each side (the largest of --blocks {} with --total {}{}), but this machine has {} of memory",
            human(need),
            a.blocks.iter().map(|&b| human(b)).collect::<Vec<_>>().join(","),
            human(a.total),
            a.batch.map(|n| format!(", --batch {n}")).unwrap_or_default(),
            have.map_or("?".into(), human)
        )));
    }
    if a.duration.is_nan() || a.duration <= 0.0 {
        return Err(CliError(format!(
            "--duration must be > 0, got {}",
            a.duration
        )));
    }
    Ok(Plan { fabric, verbs, ops })
}

/// Bytes one call moves with blocks of `block` bytes.
fn per_call(a: &CommArgs, block: u64) -> u64 {
    match a.batch {
        Some(n) => n.saturating_mul(block),
        None => (a.total / block).max(1).saturating_mul(block),
    }
}

/// Starts the target with a `mem`-byte region, unless `--target` names one.
fn spawn_target(a: &CommArgs, plan: &Plan, mem: u64) -> CliResult<Option<Target>> {
    let exe: PathBuf = std::env::current_exe()?;
    let spin = a.spin_us.map(|us| format!("hixl.SpinUs={us}"));
    let given: Vec<String> = a.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut args = vec!["--baseline"];
    if let Some(s) = &spin {
        args.extend(["--option", s]);
    }
    for o in &given {
        args.extend(["--option", o.as_str()]);
    }
    Ok(match &a.target {
        Some(_) => None,
        None if plan.fabric && !a.heap => {
            args.push("--pool");
            Some(Target::spawn(&exe, mem, &args)?)
        }
        // The target must serve verbs too (the two processes share a host, where `auto`
        // would pick the fabric).
        None if plan.verbs => {
            args.extend(["--option", "hixl.Transport=verbs"]);
            Some(Target::spawn(&exe, mem, &args)?)
        }
        None => Some(Target::spawn(&exe, mem, &args)?),
    })
}

/// The initiator engine, with the transport options of the arguments.
async fn initiator(a: &CommArgs, fabric: bool) -> CliResult<Engine> {
    let mut builder =
        Engine::builder("127.0.0.1").option("hixl.Transport", a.transport.to_ascii_lowercase());
    match (a.streams, fabric) {
        (Some(s), false) => builder = builder.option("hixl.TcpStreams", s.to_string()),
        (Some(s), true) => {
            builder = builder.option(
                "GlobalResourceConfig",
                format!(r#"{{"fabric_memory.task_stream_num": {s}, "fabric_memory.enable_aicpu_unfold": false}}"#),
            )
        }
        (None, _) => {}
    }
    if fabric {
        builder = builder.option("hixl.FabricBusyPollUs", a.busy_poll.to_string());
    }
    if let Some(c) = a.chunk {
        builder = builder.option("hixl.TcpChunkBytes", c.to_string());
    }
    if let Some(us) = a.spin_us {
        builder = builder.option("hixl.SpinUs", us.to_string());
    }
    if let Some(io) = &a.tcp_io {
        builder = builder.option("hixl.TcpIo", io);
    }
    if let Some(d) = &a.directory {
        builder = builder.option("hixl.Directory", d);
    }
    for (k, v) in &a.options {
        builder = builder.option(k, v);
    }
    let e = builder.build().await?;
    if let (Some(_), (_, Some(why))) = (&a.tcp_io, e.tcp_io()) {
        eprintln!("hixl.TcpIo: {why}; the initiator uses epoll");
    }
    Ok(e)
}

/// Runs `hixl bench comm` and returns its cases (also printed).
pub async fn comm(a: CommArgs) -> CliResult<Vec<CaseResult>> {
    let plan = plan(&a)?;
    let mem = a
        .blocks
        .iter()
        .map(|&b| per_call(&a, b))
        .max()
        .unwrap_or(a.total);
    let mut target = spawn_target(&a, &plan, mem)?;
    let remote = match (&a.target, &target) {
        (Some(t), _) => t.clone(),
        (None, t) => t.as_ref().map(|t| t.engine.clone()).unwrap_or_default(),
    };
    let engine = initiator(&a, plan.fabric).await?;
    let local = engine.register(HostBuffer::zeroed(mem as usize)?)?;
    let peer = engine.connect(&remote, Duration::from_secs(5)).await?;
    if !a.json {
        println!("peer {remote}: {}", peer.transport());
    }
    let rr = peer
        .regions()
        .into_iter()
        .max_by_key(|r| r.len)
        .ok_or_else(|| CliError(format!("{remote} exported no region")))?;
    if rr.len < mem {
        return Err(CliError(format!(
            "{remote} exported {} but the cases need {}",
            human(rr.len),
            human(mem)
        )));
    }
    let run = Run {
        a: &a,
        fabric: plan.fabric,
        peer: &peer,
        local: local.addr(),
        remote: rr.addr,
        target: target.as_ref(),
        dur: Duration::from_secs_f64(a.duration),
        mem,
    };
    let mut results = Vec::new();
    if !a.json {
        print_header();
    }
    for &op in &plan.ops {
        for &block in &a.blocks {
            let progress =
                crate::progress::Progress::spinner(format!("{op} {} blocks", human(block)), a.json);
            let r = run.case(op, block).await?;
            drop(progress);
            print_case(&r, a.json)?;
            results.push(r);
        }
    }
    if !a.json {
        if results.iter().any(|r| r.calls < FEW) {
            println!("* fewer than {FEW} calls: p99 is the slowest call (use a longer --duration)");
        }
        print_peaks(&results, mem);
        // A verbs link's rails: how the bytes spread, and any pause.
        for r in peer.rails() {
            println!("{r}");
        }
    }
    engine.shutdown(Duration::from_secs(1)).await;
    if let Some(t) = target.take() {
        t.stop();
    }
    Ok(results)
}

/// What every case of a run shares.
struct Run<'a> {
    a: &'a CommArgs,
    fabric: bool,
    peer: &'a Peer,
    /// Start of the local region.
    local: u64,
    /// Start of the target's region.
    remote: u64,
    target: Option<&'a Target>,
    /// How long each case (and again its baseline) is measured.
    dur: Duration,
    /// Bytes registered on each side.
    mem: u64,
}

/// The warm-up before a case or its baseline is measured: calls for a fifth of the
/// duration, and at least [`Warmup::CALLS`]. The peer harness warms NIXL and Mooncake with
/// 20 iterations; hixl and its baselines are warmed at least alike. A process's first
/// milliseconds of calls are slower than its steady state (a fresh TCP connection's buffers
/// grow over its first calls, both processes still fault in and settle): measured here,
/// 20 calls left the first case of a run with a p99 of 9-10x its p50 where the same case
/// measured again had 2-3x, both ops alike.
struct Warmup {
    until: Instant,
    left: usize,
}

impl Warmup {
    const CALLS: usize = 20;

    fn new(dur: Duration) -> Warmup {
        Warmup {
            until: Instant::now() + dur / 5,
            left: Self::CALLS,
        }
    }

    /// After one warm-up call: whether the warm-up is over.
    fn done(&mut self) -> bool {
        self.left = self.left.saturating_sub(1);
        self.left == 0 && Instant::now() >= self.until
    }
}

impl Run<'_> {
    /// Measures `op` with blocks of `block` bytes: the [`Warmup`], then calls for the duration
    /// (at least 3) with both processes' memory sampled, then the baseline.
    async fn case(&self, op: TransferOp, block: u64) -> CliResult<CaseResult> {
        let (a, peer, dur) = (self.a, self.peer, self.dur);
        let pc = per_call(a, block);
        let n = pc / block;
        let descs: Vec<OpDesc> = (0..n)
            .map(|i| OpDesc::new(self.local + i * block, self.remote + i * block, block))
            .collect();
        let mut warm = Warmup::new(dur);
        loop {
            peer.transfer(op, &descs).await?;
            if warm.done() {
                break;
            }
        }
        let mut pids = vec![std::process::id()];
        pids.extend(self.target.map(|t| t.pid));
        let sampler = PeakRss::start(pids);
        let mut lat = Vec::new();
        let start = Instant::now();
        while start.elapsed() < dur || lat.len() < 3 {
            let t = Instant::now();
            peer.transfer(op, &descs).await?;
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let secs = start.elapsed().as_secs_f64();
        let rss = sampler.finish();
        let mib = |i: usize| {
            rss.get(i)
                .filter(|&&b| b > 0)
                .map(|&b| b as f64 / 1048576.0)
        };
        let calls = lat.len() as u64;
        lat.sort_by(f64::total_cmp);
        let gbps = (calls * pc) as f64 / secs / 1e9;
        let baseline_gbps = match (self.target, a.no_baseline, self.fabric) {
            (_, false, true) => Some(memcpy_baseline(pc, block, dur).await?),
            (Some(t), false, false) => match &t.baseline {
                Some(addr) => Some(baseline(addr, op, pc, block, dur).await?),
                None => None,
            },
            _ => None,
        };
        Ok(CaseResult {
            bench: "comm",
            transport: a.transport.to_ascii_lowercase(),
            op: op.to_string(),
            block_bytes: block,
            batch: n,
            bytes_per_call: pc,
            calls,
            gbps,
            p50_us: percentile(&lat, 0.5),
            p99_us: percentile(&lat, 0.99),
            baseline: if self.fabric {
                "memcpy of the same bytes per call in the same blocks, one thread, distinct buffers"
            } else {
                "plain TCP stream, same processes, blocking sockets, ack per call"
            },
            baseline_gbps,
            ratio_to_baseline: baseline_gbps.map(|b| gbps / b),
            initiator_peak_rss_mib: mib(0),
            target_peak_rss_mib: mib(1),
            registered_mib_each_side: self.mem as f64 / 1048576.0,
        })
    }
}

/// memcpy of the same footprint: `per_call` bytes in `block`-sized copies between two distinct
/// buffers, on one thread (what one copy stream does, minus hixl).
async fn memcpy_baseline(per_call: u64, block: u64, dur: Duration) -> CliResult<f64> {
    tokio::task::spawn_blocking(move || {
        let src = vec![1u8; per_call as usize];
        let mut dst = vec![0u8; per_call as usize];
        let block = block as usize;
        let mut call = || {
            for (d, s) in dst.chunks_mut(block).zip(src.chunks(block)) {
                d.copy_from_slice(s);
            }
            std::hint::black_box(&mut dst);
        };
        let mut warm = Warmup::new(dur);
        loop {
            call();
            if warm.done() {
                break;
            }
        }
        let start = Instant::now();
        let mut calls = 0u64;
        while start.elapsed() < dur || calls < 3 {
            call();
            calls += 1;
        }
        (calls * per_call) as f64 / start.elapsed().as_secs_f64() / 1e9
    })
    .await
    .map_err(|e| CliError(format!("baseline thread failed: {e}")))
}

/// Plain TCP between the same two processes: the same bytes per call, in block-sized writes,
/// one byte of ack (write) or request (read) per call.
async fn baseline(
    addr: &str,
    op: TransferOp,
    per_call: u64,
    block: u64,
    dur: Duration,
) -> CliResult<f64> {
    let addr = addr.to_string();
    tokio::task::spawn_blocking(move || -> CliResult<f64> {
        let mut s = TcpStream::connect(&addr)?;
        s.set_nodelay(true)?;
        let mut h = [0u8; 17];
        h[0] = if op == TransferOp::Write { b'W' } else { b'R' };
        h[1..9].copy_from_slice(&per_call.to_le_bytes());
        h[9..17].copy_from_slice(&block.to_le_bytes());
        s.write_all(&h)?;
        // The same footprint as a hixl call: per_call bytes of distinct memory, in blocks.
        let mut buf = vec![0u8; per_call as usize];
        crate::util::fill_pattern(&mut buf, 1);
        let mut one = [0u8; 1];
        let block = block as usize;
        let mut call = |s: &mut TcpStream| -> std::io::Result<()> {
            if op == TransferOp::Write {
                for c in buf.chunks(block) {
                    s.write_all(c)?;
                }
                s.read_exact(&mut one)
            } else {
                s.write_all(&[1])?;
                for c in buf.chunks_mut(block) {
                    s.read_exact(c)?;
                }
                Ok(())
            }
        };
        let mut warm = Warmup::new(dur);
        loop {
            call(&mut s)?;
            if warm.done() {
                break;
            }
        }
        let start = Instant::now();
        let mut calls = 0u64;
        while start.elapsed() < dur || calls < 3 {
            call(&mut s)?;
            calls += 1;
        }
        Ok((calls * per_call) as f64 / start.elapsed().as_secs_f64() / 1e9)
    })
    .await
    .map_err(|e| CliError(format!("baseline thread failed: {e}")))?
}
