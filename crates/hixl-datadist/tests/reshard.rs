//! Heterogeneous TP between two real processes: a prefill group of P_TP ranks (the child: P
//! clusters in one process) and decode ranks of D_TP (this process). Each decode rank pulls
//! its heads of scattered blocks from the prefill ranks that hold them; every byte of every
//! head slice is checked in the decode layout, and blocks not pulled stay untouched.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, ClusterInfo, DataType, KvCacheExtParam, KvLayout, KvShard,
    LlmDataDist, LlmRole,
};

mod kv_shards;
use kv_shards::{check_pulled, desc, fill, key, started, BLOCKS, TENSORS};

const T: Duration = Duration::from_secs(10);
const HEADS: u32 = 8;

fn shard(rank: u32, tp: u32, layout: KvLayout) -> KvShard {
    kv_shards::shard(rank, tp, HEADS, layout)
}

fn layout_of(s: &str) -> KvLayout {
    if s == "hnd" {
        KvLayout::Hnd
    } else {
        KvLayout::Nhd
    }
}

/// The prefill group (ignored as a test: `spawn` runs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the prefill group of the reshard tests; spawn runs it"]
async fn prefill_group_entry() {
    let Ok(spec) = std::env::var("HIXL_RESHARD_PREFILL") else {
        return;
    };
    let mut w = spec.split(',');
    let (ptp, layout, transport) = (
        w.next().unwrap().parse::<u32>().unwrap(),
        layout_of(w.next().unwrap()),
        w.next().unwrap().to_string(),
    );
    let mut ranks = Vec::new();
    let mut addrs = Vec::new();
    for p in 0..ptp {
        let dd = started(10 + u64::from(p), LlmRole::Prompt, &transport).await;
        let s = shard(p, ptp, layout);
        let c = dd
            .allocate_kv_cache(desc(&s), Some(key(10 + u64::from(p))))
            .await
            .unwrap();
        dd.set_kv_shard(c.cache_id, s).await.unwrap();
        fill(&c, &s);
        addrs.push(dd.listen_addr().unwrap());
        ranks.push((dd, c));
    }
    println!("READY {}", addrs.join(" "));
    // Until the parent closes our stdin.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().lines().count()).await;
}

/// The prefill group of `ptp` ranks in a child, and its listen addresses.
fn prefill_group(ptp: u32, layout: &str, transport: &str) -> (std::process::Child, Vec<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "prefill_group_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "HIXL_RESHARD_PREFILL",
            format!("{ptp},{layout},{transport}"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addrs: Vec<String> = loop {
        let l = lines.next().expect("prefill group exited").unwrap();
        if let Some(i) = l.find("READY ") {
            break l[i + 6..].split_whitespace().map(String::from).collect();
        }
    };
    (child, addrs)
}

/// A decode rank (cluster `100 + rank`) linked to the prefill group at `addrs`.
async fn decode_rank(rank: u32, addrs: &[String], transport: &str) -> LlmDataDist {
    let dd = started(100 + u64::from(rank), LlmRole::Decoder, transport).await;
    let clusters: Vec<ClusterInfo> = addrs
        .iter()
        .enumerate()
        .map(|(p, a)| ClusterInfo {
            remote_cluster_id: 10 + p as u64,
            remote_addr: a.clone(),
        })
        .collect();
    for r in dd.link_clusters(&clusters, T).await.unwrap() {
        r.unwrap();
    }
    dd
}

async fn reshard(ptp: u32, dtp: u32, layout: &str, transport: &str) {
    let (mut child, addrs) = prefill_group(ptp, layout, transport);
    let lay = layout_of(layout);
    // Scattered blocks with runs on both sides.
    let src = [1u64, 2, 3, 7, 9, 10, 15];
    let dst = [0u64, 1, 2, 5, 6, 7, 12];
    let pulled: HashMap<u64, u64> = dst.iter().copied().zip(src).collect();
    for d in 0..dtp {
        let dd = decode_rank(d, &addrs, transport).await;
        let s = shard(d, dtp, lay);
        let c = dd.allocate_kv_cache(desc(&s), None).await.unwrap();
        dd.set_kv_shard(c.cache_id, s).await.unwrap();
        let keys: Vec<BlocksCacheKey> = (0..ptp).map(|p| key(10 + u64::from(p))).collect();
        dd.pull_kv_blocks_resharded(&keys, &c, &src, &dst, &KvCacheExtParam::default())
            .await
            .unwrap();
        check_pulled(
            &c,
            &s,
            &pulled,
            &format!("{transport} {layout} P_TP={ptp} D_TP={dtp}"),
        );
        // Every decode rank needs a prefill rank past the first when P_TP=4: given only the
        // first, the pull is refused by name.
        if ptp > 1 {
            let e = dd
                .pull_kv_blocks_resharded(&keys[..1], &c, &src, &dst, &KvCacheExtParam::default())
                .await
                .unwrap_err();
            assert!(e.message.contains("prefill rank"), "{e}");
        }
    }
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_tp4_to_decode_tp2_and_tp1_to_tp2_over_tcp() {
    for layout in ["nhd", "hnd"] {
        reshard(4, 2, layout, "tcp").await;
        reshard(1, 2, layout, "tcp").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_tp4_to_decode_tp2_and_tp1_to_tp2_over_the_fabric() {
    for layout in ["nhd", "hnd"] {
        reshard(4, 2, layout, "fabric").await;
        reshard(1, 2, layout, "fabric").await;
    }
}

/// Cache and shard that do not fit are refused, naming the shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_must_fit_its_cache() {
    let dd = started(1, LlmRole::Decoder, "tcp").await;
    let s = shard(0, 2, KvLayout::Nhd);
    let c: Cache = dd.allocate_kv_cache(desc(&s), None).await.unwrap();
    let wrong = shard(0, 4, KvLayout::Nhd);
    let e = dd.set_kv_shard(c.cache_id, wrong).await.unwrap_err();
    assert!(e.message.contains("does not match the shape"), "{e}");
    let e = dd
        .set_kv_shard(c.cache_id, shard(0, 3, KvLayout::Nhd))
        .await;
    assert!(e.unwrap_err().message.contains("do not divide"));
    let e = dd
        .pull_kv_blocks_resharded(&[key(9)], &c, &[0], &[0], &KvCacheExtParam::default())
        .await
        .unwrap_err();
    assert!(e.message.contains("no KV shard"), "{e}");
}

/// Shards of different models never exchange a byte, whichever decode rank asks: a prefill
/// group of 8 heads over TP 2 (4 per rank) and decode ranks of a 16-head model over TP 4
/// (also 4 per rank, the same block geometry: rank 0 was accepted and got heads 0..4 of the
/// other model), and a decode cache of another element type of the same size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_of_different_models_are_refused_on_every_rank() {
    let (mut child, addrs) = prefill_group(2, "nhd", "tcp");
    let keys = [key(10), key(11)];
    let wrong: Vec<(KvShard, DataType, &str)> = (0..4)
        .map(|r| {
            let s = KvShard {
                total_heads: 16,
                ..shard(r, 4, KvLayout::Nhd)
            };
            (s, DataType::BFloat16, "16 KV heads of 16 elements")
        })
        .chain([(shard(0, 2, KvLayout::Nhd), DataType::Float16, "of Float16")])
        .collect();
    for (rank, (s, dtype, decode_says)) in wrong.into_iter().enumerate() {
        let dd = decode_rank(rank as u32, &addrs, "tcp").await;
        let d = CacheDesc {
            data_type: dtype,
            ..desc(&s)
        };
        let c = dd.allocate_kv_cache(d, None).await.unwrap();
        dd.set_kv_shard(c.cache_id, s).await.unwrap();
        let e = dd
            .pull_kv_blocks_resharded(&keys, &c, &[1, 2], &[1, 2], &KvCacheExtParam::default())
            .await
            .unwrap_err();
        assert_eq!(e.status, hixl_datadist::LlmStatus::ParamInvalid, "{e}");
        assert!(
            e.message.contains("shard of another model"),
            "rank {rank}: {e}"
        );
        assert!(
            e.message
                .contains("8 KV heads of 16 elements, 2 layers of BFloat16, Nhd at prefill"),
            "rank {rank}: {e}"
        );
        assert!(e.message.contains(decode_says), "rank {rank}: {e}");
        let stride = c.desc.stride().unwrap() as usize;
        let mut got = vec![0u8; stride * BLOCKS as usize];
        for t in 0..TENSORS as usize {
            c.tensor(t).unwrap().read_at(0, &mut got).unwrap();
            assert!(got.iter().all(|&x| x == 0), "rank {rank}: a byte moved");
        }
    }
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
}
