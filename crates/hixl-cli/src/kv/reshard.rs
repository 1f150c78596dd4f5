//! `bench kv --prefill-tp P --decode-tp D [--prefill-block-tokens B]`: decode ranks pulling
//! their heads from a prefill group of another TP size, or of another block size.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hixl::datadist::models::ModelGeometry;
use hixl::datadist::tokens::TokenMap;
use hixl::datadist::{BlocksCacheKey, Cache, ClusterInfo, KvCacheExtParam, LlmDataDist, LlmRole};
use hixl_cli::child::Target;

use super::common::{bench_cluster, cli, layout, p50, KvArgs};
use crate::util::{human, CliResult};

/// `bench kv --prefill-tp P --decode-tp D`: decode rank 0 of D pulls its heads of a request
/// from a prefill group of P ranks (resharded), alternating with the same request from a group
/// of D ranks (its own heads whole, from one rank: the unsharded pull).
pub(super) async fn reshard_bench(a: &KvArgs, m: &ModelGeometry, ptp: u32, dtp: u32) -> CliResult {
    let bt = a.block_tokens.unwrap_or(m.block_tokens);
    let blocks = a.tokens.div_ceil(bt);
    let pbt = a.prefill_block_tokens.unwrap_or(bt);
    let pblocks = a.tokens.div_ceil(pbt);
    let exe: PathBuf = std::env::current_exe()?;
    let group = |tp: u32, base: u64, blocks: u64, bt: u64| -> CliResult<(Target, Vec<String>)> {
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
    let (pg, paddrs) = group(ptp, 10, pblocks, pbt)?;
    let (dg, daddrs) = group(dtp, 50, blocks, bt)?;
    let mut dd = bench_cluster(LlmRole::Decoder, &a.transport).await?;
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
    let map = TokenMap {
        src: (0..pblocks).map(Some).collect(),
        dst: (0..blocks).map(Some).collect(),
        tokens: a.tokens,
    };
    let pull = Pull {
        dd: &dd,
        keys: &pkeys,
        c: &c,
        ids: &ids,
        map: (pbt != bt).then_some(&map),
        ext: &ext,
    };
    // Warm both.
    pull.run().await?;
    dd.pull_kv_blocks(same, &c, &ids, &ids, &ext)
        .await
        .map_err(cli)?;
    let (mut rs, mut ss) = (Vec::new(), Vec::new());
    let (mut rt, mut st) = (0.0f64, 0.0f64);
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < a.duration || n < 3 {
        let t = Instant::now();
        pull.run().await?;
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
                "tokens": a.tokens, "block_tokens": bt, "prefill_block_tokens": pbt,
                "prefill_tp": ptp, "decode_tp": dtp,
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
            "from a prefill group of {ptp} with blocks of {pbt} tokens ({}): {rg:.2} GB/s, p50 {:.2} ms; from a group of {dtp} with blocks of {bt} (the decode's geometry, whole blocks): {sg:.2} GB/s, p50 {:.2} ms; ratio {:.2}",
            if pbt != bt { "converted" } else { "resharded" },
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

/// The converted or resharded pull `bench kv` times.
struct Pull<'a> {
    dd: &'a LlmDataDist,
    keys: &'a [BlocksCacheKey],
    c: &'a Cache,
    ids: &'a [u64],
    /// Different block sizes: the request's tokens by position.
    map: Option<&'a TokenMap>,
    ext: &'a KvCacheExtParam,
}

impl Pull<'_> {
    async fn run(&self) -> CliResult {
        match self.map {
            Some(map) => {
                self.dd
                    .pull_kv_tokens(self.keys, self.c, map, self.ext)
                    .await
            }
            None => {
                self.dd
                    .pull_kv_blocks_resharded(self.keys, self.c, self.ids, self.ids, self.ext)
                    .await
            }
        }
        .map_err(cli)
    }
}
