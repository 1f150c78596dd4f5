//! Local block copies (fan-out copy, swap), `switch_role` and caches registered after link,
//! each with its documented errors, on real engines.

use std::time::Duration;

use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, ClusterInfo, DataType, KvCacheExtParam, LlmDataDist, LlmRole,
    LlmStatus,
};

const BLOCKS: i64 = 16;

async fn started(cluster: u64, role: LlmRole) -> LlmDataDist {
    let mut dd = LlmDataDist::new(cluster, role);
    dd.initialize(&[("llm.ListenIpInfo", "127.0.0.1:0")])
        .await
        .unwrap();
    dd
}

fn desc(tensors: u32, block_elems: i64) -> CacheDesc {
    CacheDesc::host(tensors, DataType::Float16, vec![BLOCKS, block_elems])
}

fn byte(t: usize, b: u64) -> u8 {
    (t as u8).wrapping_mul(37) ^ (b as u8).wrapping_mul(11) | 1
}

fn fill(c: &Cache) {
    let stride = c.desc.stride().unwrap();
    for t in 0..c.tensor_addrs.len() {
        for b in 0..BLOCKS as u64 {
            let v = vec![byte(t, b); stride as usize];
            c.tensor(t).unwrap().write_at(b * stride, &v).unwrap();
        }
    }
}

/// The block index whose pattern block `b` of every tensor holds (or `None` for mixed bytes).
fn origin(c: &Cache, b: u64) -> Option<u64> {
    let stride = c.desc.stride().unwrap();
    let mut buf = vec![0u8; stride as usize];
    let mut found = None;
    for t in 0..c.tensor_addrs.len() {
        c.tensor(t).unwrap().read_at(b * stride, &mut buf).unwrap();
        let o = (0..BLOCKS as u64).find(|&o| buf.iter().all(|&x| x == byte(t, o)))?;
        if *found.get_or_insert(o) != o {
            return None;
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_copy_within_and_between_caches() {
    let dd = started(1, LlmRole::Prompt).await;
    let a = dd.allocate_kv_cache(desc(4, 512), None).await.unwrap();
    let b = dd.allocate_kv_cache(desc(4, 512), None).await.unwrap();
    fill(&a);
    fill(&b);
    // Prefix sharing within one cache: block 0 seeds 5, 6, 7; block 1 seeds 9.
    dd.copy_kv_blocks(&a, &a, &[0, 1], &[vec![5, 6, 7], vec![9]])
        .await
        .unwrap();
    for (blk, from) in [
        (5, 0),
        (6, 0),
        (7, 0),
        (9, 1),
        (0, 0),
        (1, 1),
        (8, 8),
        (10, 10),
    ] {
        assert_eq!(origin(&a, blk), Some(from), "cache a block {blk}");
    }
    // Between caches, with a run contiguous on both sides (2,3 → 12,13).
    dd.copy_kv_blocks(&a, &b, &[2, 3, 4], &[vec![12], vec![13], vec![0, 15]])
        .await
        .unwrap();
    for (blk, from) in [(12, 2), (13, 3), (0, 4), (15, 4), (1, 1), (14, 14)] {
        assert_eq!(origin(&b, blk), Some(from), "cache b block {blk}");
    }
    // Large enough to run on a blocking thread: every block of a bigger cache.
    let big = desc(8, 64 * 1024);
    let (c, d) = (
        dd.allocate_kv_cache(big.clone(), None).await.unwrap(),
        dd.allocate_kv_cache(big, None).await.unwrap(),
    );
    fill(&c);
    let all: Vec<u64> = (0..BLOCKS as u64).collect();
    let rev: Vec<Vec<u64>> = all.iter().rev().map(|&x| vec![x]).collect();
    dd.copy_kv_blocks(&c, &d, &all, &rev).await.unwrap();
    for blk in 0..BLOCKS as u64 {
        assert_eq!(origin(&d, blk), Some(BLOCKS as u64 - 1 - blk));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swap_blocks_copies_in_the_given_direction() {
    let dd = started(1, LlmRole::Decoder).await;
    let device_like = dd.allocate_kv_cache(desc(2, 256), None).await.unwrap();
    let host = dd.allocate_kv_cache(desc(2, 256), None).await.unwrap();
    fill(&device_like);
    // swap out: blocks 3, 4 → host 10, 11
    dd.swap_blocks(&device_like, &host, &[(3, 10), (4, 11)])
        .await
        .unwrap();
    assert_eq!(origin(&host, 10), Some(3));
    assert_eq!(origin(&host, 11), Some(4));
    // the source is unchanged (a copy, not an exchange)
    assert_eq!(origin(&device_like, 3), Some(3));
    // swap back in elsewhere
    dd.swap_blocks(&host, &device_like, &[(10, 0)])
        .await
        .unwrap();
    assert_eq!(origin(&device_like, 0), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_copy_errors_name_the_value_and_move_nothing() {
    let dd = started(1, LlmRole::Prompt).await;
    let a = dd.allocate_kv_cache(desc(4, 512), None).await.unwrap();
    let b = dd.allocate_kv_cache(desc(4, 512), None).await.unwrap();
    let three = dd.allocate_kv_cache(desc(2, 512), None).await.unwrap();
    let wide = dd.allocate_kv_cache(desc(4, 1024), None).await.unwrap();
    fill(&a);
    fill(&b);
    let cases: Vec<(Result<(), hixl_datadist::DataDistError>, LlmStatus, &str)> = vec![
        (
            dd.copy_kv_blocks(&a, &b, &[1, 2], &[vec![3]]).await,
            LlmStatus::ParamInvalid,
            "2 source blocks but 1",
        ),
        (
            dd.copy_kv_blocks(&a, &b, &[1], &[vec![]]).await,
            LlmStatus::ParamInvalid,
            "source block 1 has an empty",
        ),
        (
            dd.copy_kv_blocks(&a, &b, &[16], &[vec![3]]).await,
            LlmStatus::ParamInvalid,
            "(16, 3)",
        ),
        (
            dd.swap_blocks(&a, &b, &[(1, 99)]).await,
            LlmStatus::ParamInvalid,
            "(1, 99)",
        ),
        (
            dd.copy_kv_blocks(&a, &b, &[1, 2], &[vec![3], vec![3]])
                .await,
            LlmStatus::ParamInvalid,
            "destination block 3 is written twice",
        ),
        (
            dd.copy_kv_blocks(&a, &a, &[1, 2], &[vec![2], vec![5]])
                .await,
            LlmStatus::ParamInvalid,
            "block 2 of cache",
        ),
        (
            dd.swap_blocks(&a, &three, &[(1, 1)]).await,
            LlmStatus::ParamInvalid,
            "has 4 tensors",
        ),
        (
            dd.swap_blocks(&a, &wide, &[(1, 1)]).await,
            LlmStatus::ParamInvalid,
            "block sizes differ: 1024 bytes",
        ),
    ];
    for (i, (r, status, text)) in cases.into_iter().enumerate() {
        let e = r.expect_err(&format!("case {i} must fail"));
        assert_eq!(e.status, status, "case {i}: {e}");
        assert!(e.message.contains(text), "case {i}: {e}");
    }
    // nothing moved
    for blk in 0..BLOCKS as u64 {
        assert_eq!(origin(&b, blk), Some(blk));
        assert_eq!(origin(&a, blk), Some(blk));
    }
    // a cache unregistered (or of another instance) does not exist here
    dd.unregister_kv_cache(b.cache_id).await.unwrap();
    let e = dd.swap_blocks(&a, &b, &[(1, 1)]).await.unwrap_err();
    assert_eq!(e.status, LlmStatus::KvCacheNotExist, "{e}");
    assert!(e.message.contains(&format!("cache {}", b.cache_id)), "{e}");
    let other = started(3, LlmRole::Prompt).await;
    let e = other.swap_blocks(&a, &a, &[(1, 2)]).await.unwrap_err();
    assert_eq!(e.status, LlmStatus::KvCacheNotExist, "{e}");
    // before initialize
    let fresh = LlmDataDist::new(4, LlmRole::Prompt);
    assert_eq!(
        fresh
            .swap_blocks(&a, &a, &[(1, 2)])
            .await
            .unwrap_err()
            .status,
        LlmStatus::Failed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_role_is_refused_while_links_remain() {
    let prompt = started(1, LlmRole::Prompt).await;
    let mut dd = started(2, LlmRole::Decoder).await;
    dd.switch_role(LlmRole::Mix).unwrap();
    assert_eq!(dd.role(), LlmRole::Mix);
    let c = ClusterInfo {
        remote_cluster_id: 1,
        remote_addr: prompt.listen_addr().unwrap(),
    };
    let t = Duration::from_secs(10);
    // A link timeout past any instant is no bound (it panicked in the table read's retry).
    let r = dd
        .link_clusters(std::slice::from_ref(&c), Duration::MAX)
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    let e = dd.switch_role(LlmRole::Prompt).unwrap_err();
    assert_eq!(e.status, LlmStatus::ExistLink);
    assert!(e.message.contains("[1]"), "{e}");
    assert_eq!(dd.role(), LlmRole::Mix, "a refused switch changes nothing");
    let r = dd
        .unlink_clusters(std::slice::from_ref(&c), t, false)
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    dd.switch_role(LlmRole::Prompt).unwrap();
    assert_eq!(dd.role(), LlmRole::Prompt);
    // before initialize it is a plain label change
    let mut fresh = LlmDataDist::new(5, LlmRole::Prompt);
    fresh.switch_role(LlmRole::Decoder).unwrap();
    assert_eq!(fresh.role(), LlmRole::Decoder);
}

/// A registration refused for any reason gives back only the regions it made: a tensor of a
/// cache registered before (the same address again) is refused, never shared, and the first
/// cache stays registered and usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_leaves_other_caches_registered() {
    use hixl_datadist::BlocksCacheKey;
    let mut dd = started(1, LlmRole::Prompt).await;
    let d = desc(2, 256);
    let size = d.tensor_size().unwrap() as usize;
    // Four caller-owned tensors: a and b for the first cache, c and e fresh.
    let mut mem: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; size]).collect();
    let addr: Vec<u64> = mem.iter_mut().map(|m| m.as_mut_ptr() as u64).collect();
    let key = BlocksCacheKey {
        cluster_id: 1,
        model_id: 7,
    };
    // SAFETY: `mem` outlives every registration below (it is dropped at the end of the test,
    // after `finalize`), and no reference to it is held while the engine may touch it.
    let first = unsafe { dd.register_kv_cache(d.clone(), &addr[..2], Some(key)) }
        .await
        .unwrap();
    let usable = |c: &Cache| {
        for t in 0..2 {
            c.tensor(t).unwrap().write_at(0, &[9]).unwrap();
        }
    };
    usable(&first);
    // The same tensors again, alone or after a fresh one: refused, naming the address.
    for (addrs, named) in [
        (vec![addr[0], addr[1]], addr[0]),
        (vec![addr[2], addr[1]], addr[1]),
    ] {
        // SAFETY: as above.
        let e = unsafe { dd.register_kv_cache(d.clone(), &addrs, None) }
            .await
            .unwrap_err();
        assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
        assert!(e.message.contains(&format!("{named:#x}")), "{e}");
        usable(&first);
    }
    // A key already in use, on fresh tensors: refused after the tensors registered.
    // SAFETY: as above.
    let e = unsafe { dd.register_kv_cache(d.clone(), &addr[2..], Some(key)) }
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
    usable(&first);
    // The fresh tensors were given back each time: they register now.
    // SAFETY: as above.
    let second = unsafe { dd.register_kv_cache(d.clone(), &addr[2..], None) }
        .await
        .unwrap();
    usable(&second);
    usable(&first);
    // After unregistering, the first cache's tensors may be registered again.
    dd.unregister_kv_cache(first.cache_id).await.unwrap();
    // SAFETY: as above.
    let again = unsafe { dd.register_kv_cache(d, &addr[..2], Some(key)) }
        .await
        .unwrap();
    usable(&again);
    usable(&second);
    dd.finalize().await;
    drop(mem);
}

/// A cache the owner registers after the link is pullable as soon as its register call
/// returns: the decode's pull waits for the owner's memory table (on its way over the control
/// connection) instead of refusing the tensors its cache table names. A cache whose tensors
/// are gone keeps a clear error that says what it waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_registered_after_link_is_pullable_when_its_registration_returns() {
    let owner = started(1, LlmRole::Prompt).await;
    let mut dd = LlmDataDist::new(2, LlmRole::Decoder);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", "tcp"),
    ])
    .await
    .unwrap();
    let c = ClusterInfo {
        remote_cluster_id: 1,
        remote_addr: owner.listen_addr().unwrap(),
    };
    let r = dd
        .link_clusters(std::slice::from_ref(&c), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    let dst = dd.allocate_kv_cache(desc(64, 512), None).await.unwrap();
    let all: Vec<u64> = (0..BLOCKS as u64).collect();
    let mut last = None;
    // A server growing its pool (each pool tensor is a memfd: 512 of them stay within the
    // default descriptor limit; the decode links over tcp, so it maps none).
    for model in 0..8u64 {
        let key = BlocksCacheKey {
            cluster_id: 1,
            model_id: model,
        };
        let src = owner
            .allocate_kv_cache(desc(64, 512), Some(key))
            .await
            .unwrap();
        fill(&src);
        dd.pull_kv_blocks(key, &dst, &all, &all, &KvCacheExtParam::default())
            .await
            .unwrap_or_else(|e| panic!("model {model}, pulled right after it was registered: {e}"));
        for b in 0..BLOCKS as u64 {
            assert_eq!(origin(&dst, b), Some(b), "model {model} block {b}");
        }
        last = Some((key, src));
    }
    // The owner unregisters the last cache; this side's cache table still names it, and the
    // pull, after syncing the memory table, says that no update was in flight.
    let (key, src) = last.unwrap();
    let gone = src.tensor_addrs[0];
    owner.unregister_kv_cache(src.cache_id).await.unwrap();
    // Once this side's memory table has dropped the tensors (observed, not slept for).
    let peer = dd.engine().unwrap().peer(&c.remote_addr).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while peer.regions().iter().any(|r| r.contains(gone, 1)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the table never dropped the cache"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let e = dd
        .pull_kv_blocks(key, &dst, &[0], &[0], &KvCacheExtParam::default())
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
    assert!(
        e.message.contains("is outside the regions")
            && e.message.contains(&format!(
                "tensor 0 of cache {} of {} is named by its cache table but is in no region of \
                 its memory table, synced before this transfer (no table update was in flight",
                src.cache_id, c.remote_addr
            )),
        "{e}"
    );
}
