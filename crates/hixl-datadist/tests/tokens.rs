//! Pulls between different block sizes, under leases, across TP sizes: every token of every
//! head lands at its place in the decode's blocks (checked byte by byte against a pattern that
//! names the token, not the block), rows past the request and blocks not asked for stay
//! untouched, and a prefill rank's lease ends done once its readers said done.
//!
//! The prefill and decode ranks are instances of this process, linked over loopback.

use std::time::Duration;

use futures::StreamExt;
use hixl_datadist::tokens::{plan_tokens, TokenMap};
use hixl_datadist::tp::readers;
use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, ClusterInfo, DataType, KvCacheExtParam, KvLayout, KvShard,
    LeaseEnd, LlmDataDist, LlmRole, LlmStatus,
};

mod kv_shards;
use kv_shards::{key, shard, started, HEAD_DIM};

const T: Duration = Duration::from_secs(10);
const BLOCKS: u64 = 24;
/// 2 layers × K, V.
const TENSORS: u32 = 4;

fn desc(s: &KvShard, rows: u64) -> CacheDesc {
    let h = s.heads().unwrap();
    let n = i64::from(h.end - h.start);
    let (r, d) = (rows as i64, i64::from(s.head_dim));
    let shape = match s.layout {
        KvLayout::Nhd => vec![BLOCKS as i64, r, n, d],
        KvLayout::Hnd | KvLayout::HndKv => vec![BLOCKS as i64, n, r, d],
    };
    CacheDesc::host(TENSORS, DataType::BFloat16, shape)
}

/// The byte at (tensor, token of the request, global head, byte of the head).
fn byte(t: usize, tok: u64, g: u32, e: u64) -> u8 {
    ((t as u64) * 131 + tok * 11 + u64::from(g) * 5 + e) as u8 | 0x80
}

/// A block of `rows` tokens starting at token `first` (`None`: rows past `tokens` are 0).
fn block(s: &KvShard, t: usize, rows: u64, first: u64, tokens: u64) -> Vec<u8> {
    let h = s.heads().unwrap();
    let hb = u64::from(HEAD_DIM) * 2;
    let cell = |tok: u64, g: u32| -> Vec<u8> {
        let tok = first + tok;
        (0..hb)
            .map(|e| if tok < tokens { byte(t, tok, g, e) } else { 0 })
            .collect()
    };
    let mut v = Vec::new();
    match s.layout {
        KvLayout::Nhd => (0..rows).for_each(|r| h.clone().for_each(|g| v.extend(cell(r, g)))),
        KvLayout::Hnd => h
            .clone()
            .for_each(|g| (0..rows).for_each(|r| v.extend(cell(r, g)))),
        // Per head, its K plane [element, token], then its V plane [token, element].
        KvLayout::HndKv => {
            let half = hb as usize / 2;
            for g in h.clone() {
                for k in (0..half).step_by(2) {
                    (0..rows).for_each(|r| v.extend(&cell(r, g)[k..k + 2]));
                }
                (0..rows).for_each(|r| v.extend(&cell(r, g)[half..]));
            }
        }
    }
    v
}

/// The request's blocks: the prefill's at positions 0.. (position 0 dropped when `hole`),
/// the decode's at positions 0.. with position 1 a local prefix hit (not pulled).
fn request(bs: u64, bd: u64, hole: bool) -> TokenMap {
    let tokens = 2 * bs.max(bd) + bs.min(bd) / 2 + 1;
    let src = (0..tokens.div_ceil(bs))
        .map(|i| (!(hole && i == 0)).then_some(BLOCKS - 1 - i))
        .collect();
    let dst = (0..tokens.div_ceil(bd))
        .map(|j| (j != 1).then_some((3 + 5 * j) % BLOCKS))
        .collect();
    TokenMap { src, dst, tokens }
}

async fn case(ptp: u32, dtp: u32, heads: u32, layout: KvLayout, bs: u64, bd: u64, hole: bool) {
    let what = format!("{layout:?} P_TP={ptp} D_TP={dtp} H={heads} Bs={bs} Bd={bd} hole={hole}");
    let map = request(bs, bd, hole);
    let leased: Vec<u64> = map.src.iter().flatten().copied().collect();
    let mut prefill = Vec::new();
    for p in 0..ptp {
        let cluster = 10 + u64::from(p);
        let dd = started(cluster, LlmRole::Prompt, "tcp").await;
        let s = shard(p, ptp, heads, layout);
        let c = dd
            .allocate_kv_cache(desc(&s, bs), Some(key(cluster)))
            .await
            .unwrap();
        dd.set_kv_shard(c.cache_id, s).await.unwrap();
        let stride = c.desc.stride().unwrap();
        for (i, b) in map.src.iter().enumerate() {
            let Some(b) = b else { continue };
            for t in 0..TENSORS as usize {
                let bytes = block(&s, t, bs, i as u64 * bs, u64::MAX);
                c.tensor(t).unwrap().write_at(b * stride, &bytes).unwrap();
            }
        }
        let events = dd.lease_events().unwrap();
        let grant = dd
            .lease_blocks(7, &[&c], &leased, Duration::from_secs(60))
            .unwrap();
        prefill.push((dd, events, grant, c));
    }
    let clusters: Vec<ClusterInfo> = prefill
        .iter()
        .enumerate()
        .map(|(p, r)| ClusterInfo {
            remote_cluster_id: 10 + p as u64,
            remote_addr: r.0.listen_addr().unwrap(),
        })
        .collect();
    let keys: Vec<BlocksCacheKey> = (0..ptp).map(|p| key(10 + u64::from(p))).collect();
    let grants: Vec<_> = prefill.iter().map(|p| p.2.clone()).collect();
    let plan = plan_tokens(&map, bs, bd, BLOCKS, BLOCKS).unwrap();
    assert_eq!(!plan.missing.is_empty(), hole, "{what}: {plan:?}");
    let ext = KvCacheExtParam::default();
    let mut decodes: Vec<(LlmDataDist, Cache, KvShard)> = Vec::new();
    for d in 0..dtp {
        let dd = started(100 + u64::from(d), LlmRole::Decoder, "tcp").await;
        for r in dd.link_clusters(&clusters, T).await.unwrap() {
            r.unwrap();
        }
        let s = shard(d, dtp, heads, layout);
        let c = dd.allocate_kv_cache(desc(&s, bd), None).await.unwrap();
        dd.set_kv_shard(c.cache_id, s).await.unwrap();
        dd.pull_leased_tokens(&grants, &keys, &c, &map, &ext, true)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // Every block: landed ones hold their tokens (rows past the request untouched),
        // the others are zero.
        let stride = c.desc.stride().unwrap();
        let mut got = vec![0u8; stride as usize];
        for t in 0..TENSORS as usize {
            for b in 0..BLOCKS {
                c.tensor(t).unwrap().read_at(b * stride, &mut got).unwrap();
                let pos = map.dst.iter().position(|&x| x == Some(b));
                let want = match pos {
                    Some(j) if plan.landing.contains(&b) => {
                        block(&s, t, bd, j as u64 * bd, map.tokens)
                    }
                    _ => vec![0; stride as usize],
                };
                assert!(
                    got == want,
                    "{what}: decode rank {d} tensor {t} block {b} differs"
                );
            }
        }
        decodes.push((dd, c, s));
    }
    // Each prefill rank's lease ended done once every decode rank reading it pulled.
    let counts = readers(&decodes[0].2, ptp).unwrap();
    for (p, (_, events, _, _)) in prefill.iter_mut().enumerate() {
        if counts[p] == 0 {
            continue;
        }
        let e = tokio::time::timeout(T, events.next())
            .await
            .expect("no lease ended in time")
            .unwrap();
        assert_eq!(e.why, LeaseEnd::Done, "{what}: prefill rank {p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_16_to_128_and_128_to_16_in_both_layouts() {
    for layout in [KvLayout::Nhd, KvLayout::Hnd, KvLayout::HndKv] {
        case(1, 1, 4, layout, 16, 128, false).await;
        case(1, 1, 4, layout, 128, 16, false).await;
        case(1, 1, 4, layout, 4, 6, true).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_sizes_and_tp_sizes_differ_together() {
    for layout in [KvLayout::Nhd, KvLayout::Hnd, KvLayout::HndKv] {
        case(2, 1, 4, layout, 4, 16, false).await;
        case(1, 2, 4, layout, 16, 4, true).await;
        case(4, 2, 2, layout, 8, 4, false).await;
    }
}

/// A decode of another head size is refused before a byte moves, naming both; blocks the
/// lease does not cover are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_converted_is_refused_by_name() {
    let map = request(4, 8, false);
    let p = started(10, LlmRole::Prompt, "tcp").await;
    let s = shard(0, 1, 4, KvLayout::Nhd);
    let c = p
        .allocate_kv_cache(desc(&s, 4), Some(key(10)))
        .await
        .unwrap();
    p.set_kv_shard(c.cache_id, s).await.unwrap();
    let leased: Vec<u64> = map.src.iter().flatten().copied().collect();
    let grant = p
        .lease_blocks(7, &[&c], &leased[1..], Duration::from_secs(60))
        .unwrap();
    let d = started(100, LlmRole::Decoder, "tcp").await;
    let ci = ClusterInfo {
        remote_cluster_id: 10,
        remote_addr: p.listen_addr().unwrap(),
    };
    for r in d.link_clusters(&[ci], T).await.unwrap() {
        r.unwrap();
    }
    let other = KvShard {
        head_dim: HEAD_DIM * 2,
        ..s
    };
    let dc = d.allocate_kv_cache(desc(&other, 8), None).await.unwrap();
    d.set_kv_shard(dc.cache_id, other).await.unwrap();
    let ext = KvCacheExtParam::default();
    let e = d
        .pull_kv_tokens(&[key(10)], &dc, &map, &ext)
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
    assert!(
        e.message.contains("of 16 elements") && e.message.contains("of 32 elements"),
        "{e}"
    );
    let same = d.allocate_kv_cache(desc(&s, 8), None).await.unwrap();
    d.set_kv_shard(same.cache_id, s).await.unwrap();
    let e = d
        .pull_leased_tokens(&[grant], &[key(10)], &same, &map, &ext, true)
        .await
        .unwrap_err();
    assert!(e.message.contains("is not in lease"), "{e}");
}
