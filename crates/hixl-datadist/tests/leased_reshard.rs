//! Leased pulls across tensor-parallel sizes: each prefill rank leases its blocks, and the
//! decode ranks of another TP size pull their heads under those leases. Every byte of every
//! head slice is checked in the decode layout; a prefill rank's lease ends done only once every
//! decode rank that reads it said done; a refused lease moves nothing.
//!
//! The prefill and decode ranks are instances of this process, linked over loopback, so the
//! test sees the owners' lease events.

use std::collections::HashMap;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use hixl_datadist::tp::readers;
use hixl_datadist::{
    BlocksCacheKey, Cache, ClusterInfo, EndedLease, KvCacheExtParam, KvLayout, KvShard, LeaseEnd,
    LeaseEvents, LeaseGrant, LlmDataDist, LlmRole, LlmStatus,
};

mod kv_shards;
use kv_shards::{check_pulled, desc, fill, key, shard, started};

const T: Duration = Duration::from_secs(10);
const REQUEST: u64 = 7;

struct Prefill {
    dd: LlmDataDist,
    events: LeaseEvents,
    grant: LeaseGrant,
}

struct Decode {
    dd: LlmDataDist,
    cache: Cache,
    shard: KvShard,
}

/// `ptp` prefill ranks (cluster `10 + rank`), each leasing `blocks` of its cache for one
/// request, and `dtp` decode ranks (cluster `100 + rank`) linked to all of them.
async fn group(
    ptp: u32,
    dtp: u32,
    heads: u32,
    layout: KvLayout,
    blocks: &[u64],
) -> (Vec<Prefill>, Vec<Decode>) {
    let mut prefill = Vec::new();
    for p in 0..ptp {
        let cluster = 10 + u64::from(p);
        let dd = started(cluster, LlmRole::Prompt, "tcp").await;
        let s = shard(p, ptp, heads, layout);
        let c = dd
            .allocate_kv_cache(desc(&s), Some(key(cluster)))
            .await
            .unwrap();
        dd.set_kv_shard(c.cache_id, s).await.unwrap();
        fill(&c, &s);
        let events = dd.lease_events().unwrap();
        let grant = dd
            .lease_blocks(REQUEST, &[&c], blocks, Duration::from_secs(60))
            .unwrap();
        prefill.push(Prefill { dd, events, grant });
    }
    let clusters: Vec<ClusterInfo> = prefill
        .iter()
        .enumerate()
        .map(|(p, r)| ClusterInfo {
            remote_cluster_id: 10 + p as u64,
            remote_addr: r.dd.listen_addr().unwrap(),
        })
        .collect();
    let mut decode = Vec::new();
    for d in 0..dtp {
        let dd = started(100 + u64::from(d), LlmRole::Decoder, "tcp").await;
        for r in dd.link_clusters(&clusters, T).await.unwrap() {
            r.unwrap();
        }
        let s = shard(d, dtp, heads, layout);
        let cache = dd.allocate_kv_cache(desc(&s), None).await.unwrap();
        dd.set_kv_shard(cache.cache_id, s).await.unwrap();
        decode.push(Decode {
            dd,
            cache,
            shard: s,
        });
    }
    (prefill, decode)
}

/// The next ended lease of an owner, within `T`.
async fn next_end(events: &mut LeaseEvents) -> EndedLease {
    tokio::time::timeout(T, events.next())
        .await
        .expect("no lease ended in time")
        .expect("lease stream ended")
}

/// No lease of the owner has ended (its events are emitted before the frame that ends a lease
/// is answered: after an answered frame, an end would be in the stream).
fn none_ended(p: &mut Prefill, what: &str) {
    assert!(
        p.events.next().now_or_never().is_none(),
        "{what}: cluster {}'s lease ended",
        p.grant.owner
    );
    assert_eq!(p.dd.live_leases().unwrap(), 1, "{what}");
}

/// Every decode rank pulls under the leases with done, one after another; each prefill
/// rank's lease ends done right after the last decode rank reading it, not before.
async fn leased(ptp: u32, dtp: u32, heads: u32, layout: KvLayout) {
    let what = format!("{layout:?} P_TP={ptp} D_TP={dtp} H={heads}");
    let src = [1u64, 2, 3, 7, 9, 10, 15];
    let dst = [0u64, 1, 2, 5, 6, 7, 12];
    let pulled: HashMap<u64, u64> = dst.iter().copied().zip(src).collect();
    let (mut prefill, decode) = group(ptp, dtp, heads, layout, &src).await;
    let keys: Vec<BlocksCacheKey> = (0..ptp).map(|p| key(10 + u64::from(p))).collect();
    let grants: Vec<LeaseGrant> = prefill.iter().map(|p| p.grant.clone()).collect();
    let counts = readers(&decode[0].shard, ptp).unwrap();
    let ext = KvCacheExtParam::default();

    // A decode rank presenting a wrong generation for one lease moves nothing, and gives the
    // leases it took back undone (it pulls again below, on the same link).
    let mut stale = grants.clone();
    let read_by_0 = hixl_datadist::tp::sources(&decode[0].shard, ptp).unwrap();
    let last = *read_by_0.last().unwrap() as usize;
    stale[last].generation ^= 1;
    let d0 = &decode[0];
    let e = d0
        .dd
        .pull_leased_blocks_resharded(&stale, &keys, &d0.cache, &src, &dst, &ext, true)
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::LeaseEnded, "{what}: {e}");
    check_pulled(&d0.cache, &d0.shard, &HashMap::new(), &what);

    let mut said_done = vec![0u32; ptp as usize];
    for d in &decode {
        d.dd.pull_leased_blocks_resharded(&grants, &keys, &d.cache, &src, &dst, &ext, true)
            .await
            .unwrap();
        check_pulled(&d.cache, &d.shard, &pulled, &what);
        for p in hixl_datadist::tp::sources(&d.shard, ptp).unwrap() {
            let p = p as usize;
            said_done[p] += 1;
            if said_done[p] < counts[p] {
                // The pull's release is not waited for; a done answered by the owner is.
                d.dd.lease_done(&grants[p]).await.unwrap();
                none_ended(&mut prefill[p], &what);
            } else {
                let e = next_end(&mut prefill[p].events).await;
                assert_eq!((e.request_id, e.why), (REQUEST, LeaseEnd::Done), "{what}");
                assert_eq!(prefill[p].dd.live_leases().unwrap(), 0, "{what}");
            }
        }
    }
    // Replicas no decode rank reads: `readers` says 0, and their leases were never touched.
    for (p, n) in counts.iter().enumerate() {
        assert_eq!(said_done[p], *n, "{what}: prefill rank {p}");
        if *n == 0 {
            none_ended(&mut prefill[p], &what);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_prefill_tp2_to_decode_tp1_and_tp1_to_tp2() {
    for layout in [KvLayout::Nhd, KvLayout::Hnd] {
        leased(2, 1, 8, layout).await;
        leased(1, 2, 8, layout).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_prefill_tp4_to_decode_tp2_over_replicated_heads() {
    let d = shard(0, 2, 2, KvLayout::Nhd);
    assert_eq!(readers(&d, 4).unwrap(), [1, 0, 0, 1]);
    leased(4, 2, 2, KvLayout::Nhd).await;
}

/// With P_TP=1 and D_TP=2 the one lease is read by two links: a third decode link (a rank
/// that declared the same count) is refused and moves nothing; grants that do not match their
/// keys are refused by name before anything is asked of an owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_lease_admits_its_readers_only_and_grants_must_match_their_keys() {
    let src = [1u64, 2];
    let (prefill, decode) = group(1, 2, 8, KvLayout::Nhd, &src).await;
    let extra = started(200, LlmRole::Decoder, "tcp").await;
    let ci = ClusterInfo {
        remote_cluster_id: 10,
        remote_addr: prefill[0].dd.listen_addr().unwrap(),
    };
    for r in extra.link_clusters(&[ci], T).await.unwrap() {
        r.unwrap();
    }
    let s = decode[0].shard;
    let c = extra.allocate_kv_cache(desc(&s), None).await.unwrap();
    extra.set_kv_shard(c.cache_id, s).await.unwrap();
    let grants = [prefill[0].grant.clone()];
    let keys = [key(10)];
    let ext = KvCacheExtParam::default();
    for d in &decode {
        d.dd.pull_leased_blocks_resharded(&grants, &keys, &d.cache, &src, &src, &ext, false)
            .await
            .unwrap();
    }
    let e = extra
        .pull_leased_blocks_resharded(&grants, &keys, &c, &src, &src, &ext, false)
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::LeaseEnded, "{e}");
    check_pulled(&c, &s, &HashMap::new(), "a third reader");

    let (d, keys, ext) = (&decode[0], &keys, &ext);
    let pull = |g: Vec<LeaseGrant>, b: Vec<u64>| async move {
        let e =
            d.dd.pull_leased_blocks_resharded(&g, keys, &d.cache, &b, &b, ext, false)
                .await
                .unwrap_err();
        assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
        e
    };
    let e = pull(vec![], src.to_vec()).await;
    assert!(
        e.message.contains("0 lease grants for 1 prefill caches"),
        "{e}"
    );
    let e = pull(grants.to_vec(), vec![1, 5]).await;
    assert!(e.message.contains("block 5 is not in lease"), "{e}");
    let other = LeaseGrant {
        owner: 11,
        ..grants[0].clone()
    };
    let e = pull(vec![other], src.to_vec()).await;
    assert!(e.message.contains("from cluster 11"), "{e}");
    let wrong_cache = LeaseGrant {
        caches: vec![999],
        ..grants[0].clone()
    };
    let e = pull(vec![wrong_cache], src.to_vec()).await;
    assert!(e.message.contains("is not covered by lease"), "{e}");
}
