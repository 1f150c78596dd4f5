//! `bench kv --layerwise`: a request's KV moved layer by layer while the model computes, and
//! the engine alone posting the same descriptors (what the KV layer costs on top).

use std::time::{Duration, Instant};

use hixl::datadist::models::ModelGeometry;
use hixl::datadist::{Cache, LayerTarget, LlmDataDist};
use hixl::Peer;

use super::common::{cli, p50, peer_cache, KvArgs, KvResult};
use crate::util::{CliError, CliResult};

/// What the engine alone does with a request's descriptors.
pub(super) struct EngineAlone {
    pub(super) descs: usize,
    pub(super) pieces: usize,
    pub(super) strided_gbps: f64,
    pub(super) plain_gbps: Result<f64, String>,
    pub(super) submit_strided_us: f64,
    pub(super) submit_plain_us: f64,
}

/// The engine alone, posting the descriptors of a whole-request pull for the duration (what
/// `bench comm` measures), as the KV layer's strided descriptors and as plain pieces, in
/// alternation: GB/s and the time to submit one request's descriptors.
pub(super) async fn engine_alone(
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
pub(super) async fn peer_cache_of(
    dd: &LlmDataDist,
    i: usize,
) -> CliResult<(hixl::datadist::CacheDesc, Vec<u64>)> {
    let t = dd.peer_table(1).await.map_err(cli)?;
    let (key, _) = peer_cache(i, 1);
    t.by_key(key)
        .map(|e| (e.desc.clone(), e.addrs.clone()))
        .ok_or_else(|| CliError(format!("peer has no cache {i}")))
}

pub(super) async fn layerwise(
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
