//! `hixl bench kv` and its peer `hixl kv-serve`: one request's KV cache of a real model moved
//! between two LLM-DataDist clusters, plain or layer by layer.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hixl::datadist::models::{by_name, ModelGeometry};
use hixl::datadist::{
    BlocksCacheKey, Cache, ClusterInfo, KvCacheExtParam, LayerTarget, LlmDataDist, LlmRole,
};
use hixl::Peer;
use hixl_cli::child::Target;
use serde::Serialize;

use crate::util::{human, CliError, CliResult};

/// Arguments of `hixl kv-serve` (the peer cluster `bench kv` starts).
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Model whose caches to allocate.
    #[arg(long)]
    pub model: String,
    /// Blocks per cache.
    #[arg(long)]
    pub blocks: u64,
    /// `tcp`, `fabric` or `auto`.
    #[arg(long, default_value = "auto")]
    pub transport: String,
    /// Tokens per block (default: the model's).
    #[arg(long)]
    pub block_tokens: Option<u64>,
    /// Serve a prefill TP group of this many ranks (clusters `cluster_base + rank`, NHD caches
    /// holding each rank's heads) instead of one unsharded cluster.
    #[arg(long)]
    pub tp: Option<u32>,
    /// First cluster id of the TP group.
    #[arg(long, default_value_t = 10)]
    pub cluster_base: u64,
    /// Block layout of the TP group's caches: `nhd` or `hnd`.
    #[arg(long, default_value = "nhd")]
    pub layout: String,
}

/// Arguments of `hixl bench kv`.
#[derive(clap::Args, Debug)]
pub struct KvArgs {
    /// Model (from the shipped geometry table: llama-3.1-8b, deepseek-r1, ...).
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// Tokens of one request.
    #[arg(long, default_value_t = 4096)]
    pub tokens: u64,
    /// `tcp` or `fabric`.
    #[arg(long, default_value = "tcp")]
    pub transport: String,
    /// Push layer by layer, each as soon as its simulated compute is done.
    #[arg(long)]
    pub layerwise: bool,
    /// Simulated compute per layer, in ms (with --layerwise).
    #[arg(long, default_value_t = 2.0)]
    pub layer_ms: f64,
    /// Seconds to measure.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Tokens per block (default: the model's; 16 is vLLM's, 1 SGLang's page size).
    #[arg(long)]
    pub block_tokens: Option<u64>,
    /// Which peer blocks a request's blocks are: `contiguous` (0..n) or `every-other`
    /// (0, 2, 4, ...: runs that strided descriptors group, one per tensor).
    #[arg(long, default_value = "contiguous")]
    pub pattern: String,
    /// Prefill TP size: pull as decode rank 0 of `--decode-tp` from a prefill group of this
    /// size (heads resharded), alternating with a pull from a group of the decode's own TP size.
    #[arg(long, requires = "decode_tp")]
    pub prefill_tp: Option<u32>,
    /// Decode TP size (with `--prefill-tp`).
    #[arg(long, requires = "prefill_tp")]
    pub decode_tp: Option<u32>,
    /// Block layout with `--prefill-tp`: `nhd` (a head slice is a piece per token) or `hnd`
    /// (a piece per block).
    #[arg(long, default_value = "nhd")]
    pub layout: String,
    /// Also pull each request under a lease (granted by the peer, released with done) and
    /// report its cost: requests alternate between plain and leased pulls.
    #[arg(long)]
    pub leases: bool,
    /// One JSON object per case.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct KvResult {
    bench: &'static str,
    model: String,
    transport: String,
    tokens: u64,
    mode: &'static str,
    bytes_per_request: u64,
    block_tokens: u64,
    blocks: u64,
    pattern: String,
    /// Strided descriptors the KV layer posts per request.
    descriptors_per_request: usize,
    /// The same request as plain descriptors (one per piece).
    pieces_per_request: usize,
    /// The engine alone posting the plain pieces: GB/s and submit time per request.
    engine_plain_gbps: Option<f64>,
    /// Why the plain pieces could not be posted, if they could not.
    engine_plain_error: Option<String>,
    submit_plain_us: Option<f64>,
    /// ... and the strided descriptors.
    submit_strided_us: Option<f64>,
    requests: u64,
    gbps: f64,
    p50_ms: f64,
    engine_same_descs_gbps: Option<f64>,
    ratio_to_engine: Option<f64>,
    leased_gbps: Option<f64>,
    leased_p50_ms: Option<f64>,
    lease_ratio: Option<f64>,
    compute_ms: Option<f64>,
    transfer_ms: Option<f64>,
    exposed_ms: Option<f64>,
    hidden_fraction: Option<f64>,
}

/// The peer's cache `i` (cluster 1 is always the peer) and the layout of a whole-request move.
fn peer_cache(i: usize, per_layer: u32) -> (BlocksCacheKey, KvCacheExtParam) {
    let key = BlocksCacheKey {
        cluster_id: 1,
        model_id: i as u64,
    };
    let ext = KvCacheExtParam {
        tensor_num_per_layer: per_layer,
        ..Default::default()
    };
    (key, ext)
}

fn cli(e: impl std::fmt::Display) -> CliError {
    CliError(e.to_string())
}

async fn allocate(
    dd: &LlmDataDist,
    m: &ModelGeometry,
    cluster: u64,
    blocks: u64,
    block_tokens: u64,
) -> CliResult<Vec<(Cache, u32)>> {
    let mut out = Vec::new();
    for (i, (desc, per_layer)) in m.caches(blocks, block_tokens).into_iter().enumerate() {
        let key = BlocksCacheKey {
            cluster_id: cluster,
            model_id: i as u64,
        };
        out.push((
            dd.allocate_kv_cache(desc, Some(key)).await.map_err(cli)?,
            per_layer,
        ));
    }
    Ok(out)
}

/// Runs the peer cluster until its standard input closes.
pub async fn serve(a: ServeArgs) -> CliResult {
    let m = by_name(&a.model).map_err(cli)?;
    if let Some(tp) = a.tp {
        return serve_group(&a, &m, tp).await;
    }
    let mut dd = LlmDataDist::new(1, LlmRole::Decoder);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", &a.transport),
    ])
    .await
    .map_err(cli)?;
    let caches = allocate(
        &dd,
        &m,
        1,
        a.blocks,
        a.block_tokens.unwrap_or(m.block_tokens),
    )
    .await?;
    // Ended leases are only drained here: the bench's puller reports done.
    let mut ended = dd.lease_events().map_err(cli)?;
    tokio::spawn(async move { while futures::StreamExt::next(&mut ended).await.is_some() {} });
    println!(
        "READY engine={} pid={}",
        dd.listen_addr().map_err(cli)?,
        std::process::id()
    );
    std::io::stdout().flush()?;
    // Commands on stdin, one per line, until it closes: `lease <request> <ttl_ms>` leases
    // every block of every cache and answers `GRANT <json>`.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::stdin().lock()) {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let all: Vec<u64> = (0..a.blocks).collect();
    let refs: Vec<&Cache> = caches.iter().map(|(c, _)| c).collect();
    while let Some(l) = rx.recv().await {
        let mut w = l.split_whitespace();
        let answer = match (
            w.next(),
            w.next().map(str::parse::<u64>),
            w.next().map(str::parse::<u64>),
        ) {
            (Some("lease"), Some(Ok(req)), Some(Ok(ttl))) => {
                match dd.lease_blocks(req, &refs, &all, Duration::from_millis(ttl)) {
                    Ok(g) => format!("GRANT {}", serde_json::to_string(&g).map_err(cli)?),
                    Err(e) => format!("ERROR {e}"),
                }
            }
            _ => format!("ERROR unknown command {l:?}"),
        };
        println!("{answer}");
        std::io::stdout().flush()?;
    }
    dd.finalize().await;
    Ok(())
}

fn layout(s: &str) -> CliResult<hixl::datadist::KvLayout> {
    match s {
        "nhd" => Ok(hixl::datadist::KvLayout::Nhd),
        "hnd" => Ok(hixl::datadist::KvLayout::Hnd),
        _ => Err(CliError(format!("--layout must be nhd or hnd, not {s:?}"))),
    }
}

/// `kv-serve --tp N`: the N ranks of a prefill group in this process, until stdin closes.
async fn serve_group(a: &ServeArgs, m: &ModelGeometry, tp: u32) -> CliResult {
    let bt = a.block_tokens.unwrap_or(m.block_tokens);
    let mut ranks = Vec::new();
    let mut addrs = Vec::new();
    for r in 0..tp {
        let cluster = a.cluster_base + u64::from(r);
        let mut dd = LlmDataDist::new(cluster, LlmRole::Prompt);
        dd.initialize(&[
            ("llm.ListenIpInfo", "127.0.0.1:0"),
            ("hixl.Transport", &a.transport),
        ])
        .await
        .map_err(cli)?;
        let (desc, shard) = m
            .sharded_cache(a.blocks, bt, r, tp, layout(&a.layout)?)
            .map_err(cli)?;
        let key = BlocksCacheKey {
            cluster_id: cluster,
            model_id: 0,
        };
        let c = dd.allocate_kv_cache(desc, Some(key)).await.map_err(cli)?;
        dd.set_kv_shard(c.cache_id, shard).await.map_err(cli)?;
        addrs.push(dd.listen_addr().map_err(cli)?);
        ranks.push((dd, c));
    }
    println!("READY engine={} pid={}", addrs[0], std::process::id());
    println!("RANKS {}", addrs.join(" "));
    std::io::stdout().flush()?;
    tokio::task::spawn_blocking(|| std::io::stdin().lines().count())
        .await
        .map_err(cli)?;
    for (mut dd, _) in ranks {
        dd.finalize().await;
    }
    Ok(())
}

/// `bench kv --prefill-tp P --decode-tp D`: decode rank 0 of D pulls its heads of a request
/// from a prefill group of P ranks (resharded), alternating with the same request from a group
/// of D ranks (its own heads whole, from one rank: the unsharded pull).
async fn reshard_bench(a: &KvArgs, m: &ModelGeometry, ptp: u32, dtp: u32) -> CliResult {
    let bt = a.block_tokens.unwrap_or(m.block_tokens);
    let blocks = a.tokens.div_ceil(bt);
    let exe: PathBuf = std::env::current_exe()?;
    let group = |tp: u32, base: u64| -> CliResult<(Target, Vec<String>)> {
        let (b, t, tp_s, base_s) = (
            blocks.to_string(),
            bt.to_string(),
            tp.to_string(),
            base.to_string(),
        );
        let mut g = Target::spawn_with(
            &exe,
            &[
                "kv-serve",
                "--model",
                &a.model,
                "--blocks",
                &b,
                "--block-tokens",
                &t,
                "--transport",
                &a.transport,
                "--tp",
                &tp_s,
                "--layout",
                &a.layout,
                "--cluster-base",
                &base_s,
            ],
        )?;
        let line = g.wait_line("RANKS ", Duration::from_secs(30))?;
        let addrs = line["RANKS ".len()..]
            .split_whitespace()
            .map(String::from)
            .collect();
        Ok((g, addrs))
    };
    let (pg, paddrs) = group(ptp, 10)?;
    let (dg, daddrs) = group(dtp, 50)?;
    let mut dd = LlmDataDist::new(2, LlmRole::Decoder);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", &a.transport),
        ("llm.SyncKvCacheWaitTime", "60000"),
    ])
    .await
    .map_err(cli)?;
    let (desc, shard) = m
        .sharded_cache(blocks, bt, 0, dtp, layout(&a.layout)?)
        .map_err(cli)?;
    let c = dd.allocate_kv_cache(desc, None).await.map_err(cli)?;
    dd.set_kv_shard(c.cache_id, shard).await.map_err(cli)?;
    let mut clusters = Vec::new();
    for (base, addrs) in [(10u64, &paddrs), (50, &daddrs)] {
        for (i, addr) in addrs.iter().enumerate() {
            clusters.push(ClusterInfo {
                remote_cluster_id: base + i as u64,
                remote_addr: addr.clone(),
            });
        }
    }
    for chunk in clusters.chunks(hixl::datadist::MAX_CLUSTERS_PER_CALL) {
        for r in dd
            .link_clusters(chunk, Duration::from_secs(10))
            .await
            .map_err(cli)?
        {
            r.map_err(cli)?;
        }
    }
    let pkeys: Vec<BlocksCacheKey> = (0..ptp)
        .map(|r| BlocksCacheKey {
            cluster_id: 10 + u64::from(r),
            model_id: 0,
        })
        .collect();
    let same = BlocksCacheKey {
        cluster_id: 50,
        model_id: 0,
    };
    let ids: Vec<u64> = (0..blocks).collect();
    let ext = KvCacheExtParam::default();
    let heads = shard.heads().map_err(cli)?;
    let bytes = m.bytes_for(blocks * bt) * u64::from(heads.end - heads.start)
        / u64::from(m.kv_heads.unwrap_or(1));
    // Warm both.
    dd.pull_kv_blocks_resharded(&pkeys, &c, &ids, &ids, &ext)
        .await
        .map_err(cli)?;
    dd.pull_kv_blocks(same, &c, &ids, &ids, &ext)
        .await
        .map_err(cli)?;
    let (mut rs, mut ss) = (Vec::new(), Vec::new());
    let (mut rt, mut st) = (0.0f64, 0.0f64);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < a.duration || n < 3 {
        let t = Instant::now();
        dd.pull_kv_blocks_resharded(&pkeys, &c, &ids, &ids, &ext)
            .await
            .map_err(cli)?;
        let x = t.elapsed().as_secs_f64();
        rt += x;
        rs.push(x * 1e3);
        let t = Instant::now();
        dd.pull_kv_blocks(same, &c, &ids, &ids, &ext)
            .await
            .map_err(cli)?;
        let x = t.elapsed().as_secs_f64();
        st += x;
        ss.push(x * 1e3);
        n += 1;
    }
    let (rg, sg) = ((n * bytes) as f64 / rt / 1e9, (n * bytes) as f64 / st / 1e9);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "kv-reshard", "model": m.name, "transport": a.transport,
                "tokens": a.tokens, "block_tokens": bt, "prefill_tp": ptp, "decode_tp": dtp,
                "layout": a.layout,
                "decode_rank_bytes": bytes, "requests": n,
                "resharded_gbps": rg, "resharded_p50_ms": p50(rs),
                "same_tp_gbps": sg, "same_tp_p50_ms": p50(ss), "ratio": rg / sg,
            })
        );
    } else {
        println!(
            "{}: decode rank 0 of {dtp} pulls heads {heads:?} ({}) of {} tokens per request, {} blocks",
            m.name,
            human(bytes),
            a.tokens,
            a.layout
        );
        println!(
            "from a prefill group of {ptp} (resharded): {rg:.2} GB/s, p50 {:.2} ms; from a group of {dtp} (same TP, whole blocks): {sg:.2} GB/s, p50 {:.2} ms; ratio {:.2}",
            p50(rs),
            p50(ss),
            rg / sg
        );
    }
    dd.finalize().await;
    pg.stop();
    dg.stop();
    Ok(())
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Checks the arguments of `hixl bench kv`.
fn check(a: &KvArgs) -> CliResult {
    if !matches!(a.transport.as_str(), "tcp" | "fabric") {
        return Err(CliError(format!(
            "--transport must be tcp or fabric, not {:?}",
            a.transport
        )));
    }
    if !matches!(a.pattern.as_str(), "contiguous" | "every-other") {
        return Err(CliError(format!(
            "--pattern must be contiguous or every-other, not {:?}",
            a.pattern
        )));
    }
    if a.layerwise && a.pattern != "contiguous" {
        return Err(CliError("--layerwise moves contiguous blocks only".into()));
    }
    if a.block_tokens == Some(0) {
        return Err(CliError("--block-tokens must be > 0".into()));
    }
    if a.tokens == 0
        || a.duration.is_nan()
        || a.duration <= 0.0
        || a.layer_ms.is_nan()
        || a.layer_ms < 0.0
    {
        return Err(CliError(
            "--tokens and --duration must be > 0, --layer-ms ≥ 0".into(),
        ));
    }
    Ok(())
}

/// Starts the peer cluster (cluster 1, in its own process) with `blocks` blocks per cache,
/// and this one (cluster 2) with its caches, linked to the peer.
async fn clusters(
    a: &KvArgs,
    m: &ModelGeometry,
    blocks: u64,
) -> CliResult<(Target, LlmDataDist, Vec<(Cache, u32)>)> {
    let exe: PathBuf = std::env::current_exe()?;
    let bt = a.block_tokens.unwrap_or(m.block_tokens);
    let peer_blocks = if a.pattern == "every-other" {
        2 * blocks
    } else {
        blocks
    };
    let (blocks_s, bt_s) = (peer_blocks.to_string(), bt.to_string());
    let peer = Target::spawn_with(
        &exe,
        &[
            "kv-serve",
            "--model",
            &a.model,
            "--blocks",
            &blocks_s,
            "--block-tokens",
            &bt_s,
            "--transport",
            &a.transport,
        ],
    )?;
    let mut dd = LlmDataDist::new(2, LlmRole::Prompt);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", &a.transport),
        ("llm.SyncKvCacheWaitTime", "60000"),
    ])
    .await
    .map_err(cli)?;
    let local = allocate(&dd, m, 2, blocks, bt).await?;
    let cluster = ClusterInfo {
        remote_cluster_id: 1,
        remote_addr: peer.engine.clone(),
    };
    if let Some(Err(e)) = dd
        .link_clusters(std::slice::from_ref(&cluster), Duration::from_secs(5))
        .await
        .map_err(cli)?
        .pop()
    {
        return Err(cli(e));
    }
    Ok((peer, dd, local))
}

/// Runs `hixl bench kv`.
pub async fn bench(a: KvArgs) -> CliResult {
    check(&a)?;
    let m = by_name(&a.model).map_err(cli)?;
    if let (Some(p), Some(d)) = (a.prefill_tp, a.decode_tp) {
        if a.layerwise || a.leases || a.pattern != "contiguous" {
            return Err(CliError(
                "--prefill-tp/--decode-tp pull contiguous blocks, without --layerwise or --leases"
                    .into(),
            ));
        }
        return reshard_bench(&a, &m, p, d).await;
    }
    let bt = a.block_tokens.unwrap_or(m.block_tokens);
    let blocks = a.tokens.div_ceil(bt);
    let (peer, mut dd, local) = clusters(&a, &m, blocks).await?;
    let ids: Vec<u64> = (0..blocks).collect();
    let src: Vec<u64> = if a.pattern == "every-other" {
        ids.iter().map(|b| 2 * b).collect()
    } else {
        ids.clone()
    };
    let bytes = m.bytes_for(blocks * bt);
    let engine = dd.engine().map_err(cli)?;
    let hpeer = engine.peer(&peer.engine).map_err(cli)?;
    if !a.json {
        println!(
            "{}: {} tokens = {} blocks of {} tokens ({} peer blocks); {} of KV per request; peer {}",
            m.name,
            a.tokens,
            blocks,
            bt,
            a.pattern,
            human(bytes),
            hpeer.transport()
        );
    }
    let mut peer = peer;
    let result = if a.layerwise {
        layerwise(&a, &dd, &m, &local, &ids, bytes).await?
    } else {
        pull(&a, &dd, &m, &local, (&src, &ids), bytes, &hpeer, &mut peer).await?
    };
    if a.json {
        println!("{}", serde_json::to_string(&result).map_err(cli)?);
    } else {
        print_result(&result);
    }
    dd.finalize().await;
    peer.stop();
    Ok(())
}

/// Whole requests pulled through the KV layer for the duration, compared with the engine
/// alone posting the same descriptors; with `--leases`, requests alternate between plain
/// pulls and pulls under a lease the peer grants.
#[allow(clippy::too_many_arguments)]
async fn pull(
    a: &KvArgs,
    dd: &LlmDataDist,
    m: &ModelGeometry,
    local: &[(Cache, u32)],
    (src, ids): (&[u64], &[u64]),
    bytes: u64,
    hpeer: &Peer,
    peer: &mut Target,
) -> CliResult<KvResult> {
    let dur = Duration::from_secs_f64(a.duration);
    // The KV layer: one pull per cache per request (after one to warm both sides' pages).
    let pull_all = || async {
        for (i, (cache, per_layer)) in local.iter().enumerate() {
            let (key, ext) = peer_cache(i, *per_layer);
            dd.pull_kv_blocks(key, cache, src, ids, &ext)
                .await
                .map_err(cli)?;
        }
        CliResult::Ok(())
    };
    pull_all().await?;
    let mut lat = Vec::new();
    let mut leased_lat = Vec::new();
    let (mut plain_s, mut leased_s) = (0.0f64, 0.0f64);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur || n < 3 {
        let t = Instant::now();
        pull_all().await?;
        let s = t.elapsed().as_secs_f64();
        plain_s += s;
        lat.push(s * 1e3);
        n += 1;
        if a.leases {
            let t = Instant::now();
            leased_pull(dd, local, (src, ids), peer, n).await?;
            let s = t.elapsed().as_secs_f64();
            leased_s += s;
            leased_lat.push(s * 1e3);
        }
    }
    let gbps = (n * bytes) as f64 / plain_s / 1e9;
    let leased_gbps = a.leases.then(|| (n * bytes) as f64 / leased_s / 1e9);
    let eng = engine_alone(dd, local, (src, ids), bytes, hpeer, dur).await?;
    Ok(KvResult {
        bench: "kv",
        model: m.name.clone(),
        transport: a.transport.clone(),
        tokens: a.tokens,
        mode: "pull",
        bytes_per_request: bytes,
        block_tokens: a.block_tokens.unwrap_or(m.block_tokens),
        blocks: ids.len() as u64,
        pattern: a.pattern.clone(),
        descriptors_per_request: eng.descs,
        pieces_per_request: eng.pieces,
        engine_plain_gbps: eng.plain_gbps.as_ref().ok().copied(),
        engine_plain_error: eng.plain_gbps.err(),
        submit_plain_us: Some(eng.submit_plain_us),
        submit_strided_us: Some(eng.submit_strided_us),
        requests: n,
        gbps,
        p50_ms: p50(lat),
        engine_same_descs_gbps: Some(eng.strided_gbps),
        ratio_to_engine: Some(gbps / eng.strided_gbps),
        leased_gbps,
        leased_p50_ms: a.leases.then(|| p50(leased_lat)),
        lease_ratio: leased_gbps.map(|l| l / gbps),
        compute_ms: None,
        transfer_ms: None,
        exposed_ms: None,
        hidden_fraction: None,
    })
}

/// One request as a server would move it under a lease: the peer (prefill) leases the
/// request's blocks of every cache and hands the grant over; this side (decode) pulls each
/// cache under it, the last pull reporting done.
async fn leased_pull(
    dd: &LlmDataDist,
    local: &[(Cache, u32)],
    (src, ids): (&[u64], &[u64]),
    peer: &mut Target,
    request: u64,
) -> CliResult {
    peer.send_line(&format!("lease {request} 30000"))?;
    // kv-serve answers each command with one line: GRANT or ERROR.
    let line = peer.wait_line("", Duration::from_secs(10))?;
    let json = line
        .strip_prefix("GRANT ")
        .ok_or_else(|| CliError(format!("peer refused the lease: {line}")))?;
    let grant: hixl::datadist::LeaseGrant = serde_json::from_str(json.trim()).map_err(cli)?;
    for (i, (cache, per_layer)) in local.iter().enumerate() {
        let (key, ext) = peer_cache(i, *per_layer);
        let last = i + 1 == local.len();
        dd.pull_leased_blocks(&grant, key, cache, src, ids, &ext, last)
            .await
            .map_err(cli)?;
    }
    Ok(())
}

/// What the engine alone does with a request's descriptors.
struct EngineAlone {
    descs: usize,
    pieces: usize,
    strided_gbps: f64,
    plain_gbps: Result<f64, String>,
    submit_strided_us: f64,
    submit_plain_us: f64,
}

/// The engine alone, posting the descriptors of a whole-request pull for the duration (what
/// `bench comm` measures), as the KV layer's strided descriptors and as plain pieces, in
/// alternation: GB/s and the time to submit one request's descriptors.
async fn engine_alone(
    dd: &LlmDataDist,
    local: &[(Cache, u32)],
    (src, ids): (&[u64], &[u64]),
    bytes: u64,
    hpeer: &Peer,
    dur: Duration,
) -> CliResult<EngineAlone> {
    let mut plans = Vec::new();
    for (i, (cache, per_layer)) in local.iter().enumerate() {
        let (_, ext) = peer_cache(i, *per_layer);
        let (peer_desc, peer_addrs) = peer_cache_of(dd, i).await?;
        plans.push(
            LlmDataDist::plan_blocks(
                (&peer_desc, &peer_addrs),
                (&cache.desc, &cache.tensor_addrs),
                src,
                ids,
                &ext,
                true,
            )
            .map_err(cli)?,
        );
    }
    let flat: Vec<Vec<hixl::OpDesc>> = plans
        .iter()
        .map(|p| hixl::datadist::cache::pieces(p))
        .collect();
    let descs: usize = plans.iter().map(Vec::len).sum();
    let pieces: usize = flat.iter().map(Vec::len).sum();
    let (mut st, mut pt) = (0.0f64, 0.0f64);
    let (mut ss, mut ps) = (Vec::new(), Vec::new());
    let mut plain_error = None;
    let start = Instant::now();
    let mut k = 0u64;
    while start.elapsed() < dur * 2 || k < 3 {
        let t = Instant::now();
        let posted: Vec<_> = plans
            .iter()
            .map(|p| hpeer.transfer_strided(hixl::TransferOp::Read, p))
            .collect();
        ss.push(t.elapsed().as_secs_f64() * 1e6);
        for f in posted {
            f.await.map_err(cli)?;
        }
        st += t.elapsed().as_secs_f64();
        k += 1;
        if plain_error.is_some() {
            continue;
        }
        let t = Instant::now();
        let posted: Vec<_> = flat.iter().map(|p| hpeer.read(p)).collect();
        ps.push(t.elapsed().as_secs_f64() * 1e6);
        for f in posted {
            if let Err(e) = f.await {
                // E.g. more pieces than the fabric's submission ring holds: the plain path
                // cannot post this request at all.
                plain_error.get_or_insert(e.to_string());
            }
        }
        pt += t.elapsed().as_secs_f64();
    }
    Ok(EngineAlone {
        descs,
        pieces,
        strided_gbps: (k * bytes) as f64 / st / 1e9,
        plain_gbps: match plain_error {
            Some(e) => Err(e),
            None => Ok((k * bytes) as f64 / pt / 1e9),
        },
        submit_strided_us: p50(ss),
        submit_plain_us: p50(ps),
    })
}

/// The peer's cache `i`: its geometry and tensor addresses, from its published table.
async fn peer_cache_of(
    dd: &LlmDataDist,
    i: usize,
) -> CliResult<(hixl::datadist::CacheDesc, Vec<u64>)> {
    let t = dd.peer_table(1).await.map_err(cli)?;
    let (key, _) = peer_cache(i, 1);
    t.by_key(key)
        .map(|e| (e.desc.clone(), e.addrs.clone()))
        .ok_or_else(|| CliError(format!("peer has no cache {i}")))
}

async fn layerwise(
    a: &KvArgs,
    dd: &LlmDataDist,
    m: &ModelGeometry,
    local: &[(Cache, u32)],
    ids: &[u64],
    bytes: u64,
) -> CliResult<KvResult> {
    let push_all = || async {
        for (i, (cache, per_layer)) in local.iter().enumerate() {
            let (key, ext) = peer_cache(i, *per_layer);
            dd.push_kv_blocks(key, cache, ids, ids, &ext)
                .await
                .map_err(cli)?;
        }
        CliResult::Ok(())
    };
    // The same push after compute, whole: what layer-wise transfer has to hide.
    push_all().await?;
    let mut alone = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        push_all().await?;
        alone.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let alone_ms = p50(alone);
    let mut lat = Vec::new();
    let (mut compute, mut exposed) = (Vec::new(), Vec::new());
    let start = Instant::now();
    let dur = Duration::from_secs_f64(a.duration);
    let mut n = 0u64;
    while start.elapsed() < dur || n < 3 {
        let t = Instant::now();
        let mut senders = Vec::new();
        let mut tasks = Vec::new();
        for (i, (cache, per_layer)) in local.iter().enumerate() {
            let (tx, rx) = futures::channel::mpsc::unbounded::<u32>();
            senders.push(tx);
            let target = vec![LayerTarget {
                dst: peer_cache(i, *per_layer).0,
                src_blocks: ids.to_vec(),
                dst_blocks: ids.to_vec(),
                tensor_num_per_layer: *per_layer,
            }];
            tasks.push(async move { dd.transfer_layerwise(cache, rx, &target).await });
        }
        let (layers, per_layer_ms) = (m.layers, a.layer_ms);
        let sim = async move {
            for l in 0..layers {
                tokio::time::sleep(Duration::from_secs_f64(per_layer_ms / 1e3)).await; // layer l
                for tx in &senders {
                    let _ = tx.unbounded_send(l);
                }
            }
        };
        let (rs, ()) = tokio::join!(futures::future::join_all(tasks), sim);
        for r in &rs {
            if let Some(Err(e)) = r.results.iter().find(|r| r.is_err()) {
                return Err(cli(e));
            }
        }
        let last = rs.iter().map(|r| r.last_ready).max().unwrap_or_default();
        let done = rs.iter().map(|r| r.finished).max().unwrap_or_default();
        compute.push(last.as_secs_f64() * 1e3);
        exposed.push(done.saturating_sub(last).as_secs_f64() * 1e3);
        lat.push(t.elapsed().as_secs_f64() * 1e3);
        n += 1;
    }
    let exposed_ms = p50(exposed);
    Ok(KvResult {
        bench: "kv",
        model: m.name.clone(),
        transport: a.transport.clone(),
        tokens: a.tokens,
        mode: "layerwise-push",
        bytes_per_request: bytes,
        block_tokens: a.block_tokens.unwrap_or(m.block_tokens),
        blocks: ids.len() as u64,
        pattern: a.pattern.clone(),
        descriptors_per_request: 0,
        pieces_per_request: 0,
        engine_plain_gbps: None,
        engine_plain_error: None,
        submit_plain_us: None,
        submit_strided_us: None,
        requests: n,
        gbps: (n * bytes) as f64 / start.elapsed().as_secs_f64() / 1e9,
        p50_ms: p50(lat),
        engine_same_descs_gbps: None,
        ratio_to_engine: None,
        leased_gbps: None,
        leased_p50_ms: None,
        lease_ratio: None,
        compute_ms: Some(p50(compute)),
        transfer_ms: Some(alone_ms),
        exposed_ms: Some(exposed_ms),
        hidden_fraction: Some(if alone_ms > 0.0 {
            (1.0 - exposed_ms / alone_ms).clamp(0.0, 1.0)
        } else {
            1.0
        }),
    })
}

fn print_result(r: &KvResult) {
    match r.mode {
        "pull" => {
            println!(
                "pull one request: {:.2} GB/s, p50 {:.2} ms per request ({} strided descriptors = {} pieces); the engine alone with the same descriptors: {:.2} GB/s (submit {:.0} us); ratio {:.2}",
                r.gbps,
                r.p50_ms,
                r.descriptors_per_request,
                r.pieces_per_request,
                r.engine_same_descs_gbps.unwrap_or(0.0),
                r.submit_strided_us.unwrap_or(0.0),
                r.ratio_to_engine.unwrap_or(0.0)
            );
            match (&r.engine_plain_error, r.engine_plain_gbps) {
                (Some(e), _) => println!(
                    "the engine alone with the {} pieces as plain descriptors: refused ({e})",
                    r.pieces_per_request
                ),
                (None, g) => println!(
                    "the engine alone with the {} pieces as plain descriptors: {:.2} GB/s (submit {:.0} us)",
                    r.pieces_per_request,
                    g.unwrap_or(0.0),
                    r.submit_plain_us.unwrap_or(0.0)
                ),
            }
            if let (Some(g), Some(p), Some(x)) = (r.leased_gbps, r.leased_p50_ms, r.lease_ratio) {
                println!(
                    "under a lease (grant, acquire, pull, release with done): {g:.2} GB/s, p50 {p:.2} ms per request; {x:.3}x of the plain pull in the same run"
                );
            }
        }
        _ => println!(
            "layer-wise push: request {:.2} ms p50 = compute {:.2} ms + exposed transfer {:.2} ms; the same push alone takes {:.2} ms, so {:.0}% of it is hidden under compute",
            r.p50_ms,
            r.compute_ms.unwrap_or(0.0),
            r.exposed_ms.unwrap_or(0.0),
            r.transfer_ms.unwrap_or(0.0),
            r.hidden_fraction.unwrap_or(0.0) * 100.0
        ),
    }
}
