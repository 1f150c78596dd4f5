//! `hixl bench kv` and its peer `hixl kv-serve`: one request's KV cache of a real model moved
//! between two LLM-DataDist clusters, plain or layer by layer.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hixl::datadist::models::{by_name, ModelGeometry};
use hixl::datadist::{Cache, ClusterInfo, LlmDataDist, LlmRole};
use hixl::Peer;
use hixl_cli::child::Target;

use crate::util::{human, CliError, CliResult};

mod common;
mod layerwise;
mod reshard;
mod serve;

use common::{allocate, bench_cluster, cli, p50, peer_cache, KvResult};
pub use common::{KvArgs, ServeArgs};
use layerwise::{engine_alone, layerwise};
use reshard::reshard_bench;
pub use serve::serve;

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
        return Err(CliError(
            "--block-tokens 0: a block holds at least 1 token".into(),
        ));
    }
    if a.tokens == 0 {
        return Err(CliError("--tokens 0: it must be at least 1".into()));
    }
    if a.duration.is_nan() || a.duration <= 0.0 {
        return Err(CliError(format!(
            "--duration {}: it must be > 0 s",
            a.duration
        )));
    }
    if a.layer_ms.is_nan() || a.layer_ms < 0.0 {
        return Err(CliError(format!(
            "--layer-ms {}: it must be ≥ 0",
            a.layer_ms
        )));
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
    let dd = bench_cluster(LlmRole::Prompt, &a.transport).await?;
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
    let progress = crate::progress::Progress::timed(
        format!("{} requests", m.name),
        std::time::Duration::from_secs_f64(a.duration),
        a.json,
    );
    let result = if a.layerwise {
        layerwise(&a, &dd, &m, &local, &ids, bytes).await?
    } else {
        pull(&a, &dd, &m, &local, (&src, &ids), bytes, &hpeer, &mut peer).await?
    };
    drop(progress);
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
