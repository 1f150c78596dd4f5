//! Lease expiry on tokio's paused clock: an owner and a puller (two real `LlmDataDist`
//! instances over loopback TCP) on one current-thread runtime, where time moves only when
//! every task waits. A lease's TTL is asserted to the millisecond, and a pull's progress is
//! seen to restart it, without waiting minutes of wall time.

use std::time::Duration;

use futures::StreamExt;
use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, ClusterInfo, DataType, KvCacheExtParam, LeaseEnd,
    LlmDataDist, LlmRole,
};
use tokio::time::{sleep, Instant};

const OWNER: u64 = 1;
const PULLER: u64 = 2;
const BLOCKS: i64 = 8;
const STRIDE: u64 = 4096;
/// How far past its deadline a lease may end: the reaper's timer granularity.
const SLACK: Duration = Duration::from_millis(1);

async fn started(cluster: u64, role: LlmRole) -> LlmDataDist {
    let mut dd = LlmDataDist::new(cluster, role);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", "tcp"),
    ])
    .await
    .expect("initialize");
    dd
}

fn key() -> BlocksCacheKey {
    BlocksCacheKey {
        cluster_id: OWNER,
        model_id: 0,
    }
}

fn desc() -> CacheDesc {
    CacheDesc::host(2, DataType::UInt8, vec![BLOCKS, STRIDE as i64])
}

async fn linked() -> (LlmDataDist, Cache, LlmDataDist, Cache) {
    let owner = started(OWNER, LlmRole::Prompt).await;
    let src = owner
        .allocate_kv_cache(desc(), Some(key()))
        .await
        .expect("owner cache");
    for t in 0..2 {
        for b in 0..BLOCKS as u64 {
            let v = vec![b as u8 | 0x80; STRIDE as usize];
            let tensor = src.tensor(t).expect("tensor");
            tensor.write_at(b * STRIDE, &v).expect("fill");
        }
    }
    let puller = started(PULLER, LlmRole::Decoder).await;
    let ci = ClusterInfo {
        remote_cluster_id: OWNER,
        remote_addr: owner.listen_addr().expect("addr"),
    };
    let r = puller
        .link_clusters(&[ci], Duration::from_secs(5))
        .await
        .expect("link");
    assert!(r[0].is_ok(), "{:?}", r[0]);
    let dst = puller
        .allocate_kv_cache(desc(), None)
        .await
        .expect("puller cache");
    (owner, src, puller, dst)
}

#[track_caller]
fn assert_at(what: &str, took: Duration, bound: Duration) {
    assert!(
        took >= bound && took <= bound + SLACK,
        "{what} after {took:?}, bound {bound:?}"
    );
}

/// A lease nobody pulls ends `Expired` at its TTL, not a millisecond before.
#[tokio::test(start_paused = true)]
async fn an_unpulled_lease_expires_at_its_ttl() {
    let (owner, src, _puller, _dst) = linked().await;
    let mut events = owner.lease_events().expect("events");
    let ttl = Duration::from_secs(120);
    let t0 = Instant::now();
    let g = owner.lease_blocks(7, &[&src], &[1, 2], ttl).expect("lease");
    sleep(ttl - SLACK).await;
    assert_eq!(
        owner.live_leases().expect("live"),
        1,
        "ended before its TTL"
    );
    let e = events.next().await.expect("an ended lease");
    assert_at("the lease ended", t0.elapsed(), ttl);
    assert_eq!(
        (e.lease_id, e.request_id, e.why),
        (g.lease_id, 7, LeaseEnd::Expired)
    );
    assert_eq!(e.blocks, [1, 2]);
    assert_eq!(owner.live_leases().expect("live"), 0);
}

/// A pull that is not the last restarts the TTL from its release; the lease then expires a
/// TTL after that pull. The pulled bytes are the owner's.
#[tokio::test(start_paused = true)]
async fn a_pull_restarts_the_ttl() {
    let (owner, src, puller, dst) = linked().await;
    let mut events = owner.lease_events().expect("events");
    let ttl = Duration::from_secs(60);
    let t0 = Instant::now();
    let g = owner.lease_blocks(9, &[&src], &[3, 4], ttl).expect("lease");
    sleep(Duration::from_secs(45)).await;
    puller
        .pull_leased_blocks(
            &g,
            key(),
            &dst,
            &[3, 4],
            &[0, 1],
            &KvCacheExtParam::default(),
            false,
        )
        .await
        .expect("pull");
    let pulled = t0.elapsed();
    let mut got = vec![0u8; STRIDE as usize];
    for t in 0..2 {
        for (i, b) in [3u8, 4].into_iter().enumerate() {
            let tensor = dst.tensor(t).expect("tensor");
            tensor.read_at(i as u64 * STRIDE, &mut got).expect("read");
            assert!(got.iter().all(|&x| x == b | 0x80), "tensor {t} block {b}");
        }
    }
    // Past the first deadline the lease lives on.
    sleep(ttl - pulled + Duration::from_secs(1)).await;
    assert_eq!(
        owner.live_leases().expect("live"),
        1,
        "ended at its first deadline"
    );
    let e = events.next().await.expect("an ended lease");
    assert_eq!(e.why, LeaseEnd::Expired);
    // The release reached the owner in the same instant as the pull's end.
    assert_at("the lease ended", t0.elapsed(), pulled + ttl);
}
