//! LLM-DataDist clusters linked by engine name through a real etcd directory: the decode
//! names the prefill (`ClusterInfo::remote_addr` = its `hixl.Name`) instead of its address.
//! Skipped without `etcd` unless HIXL_REQUIRE_ETCD=1.

use std::time::Duration;

use hixl_datadist::{
    BlocksCacheKey, CacheDesc, ClusterInfo, DataType, KvCacheExtParam, LlmDataDist, LlmRole,
};
use hixl_directory::testing::{available, Etcd};

const BLOCKS: i64 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_links_a_prefill_by_name_and_pulls_its_blocks() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let url = etcd.url();
    let mut prefill = LlmDataDist::new(1, LlmRole::Prompt);
    prefill
        .initialize(&[
            ("llm.ListenIpInfo", "127.0.0.1:0"),
            ("hixl.Directory", &url),
            ("hixl.Name", "prefill-a"),
        ])
        .await
        .unwrap();
    let mut decode = LlmDataDist::new(2, LlmRole::Decoder);
    decode
        .initialize(&[
            ("llm.ListenIpInfo", "127.0.0.1:0"),
            ("hixl.Directory", &url),
        ])
        .await
        .unwrap();
    let key = BlocksCacheKey {
        cluster_id: 1,
        model_id: 0,
    };
    let desc = CacheDesc::host(2, DataType::Float16, vec![BLOCKS, 256]);
    let src = prefill
        .allocate_kv_cache(desc.clone(), Some(key))
        .await
        .unwrap();
    let stride = src.desc.stride().unwrap();
    for t in 0..2 {
        for b in 0..BLOCKS as u64 {
            let v = vec![(t as u8) * 16 + b as u8 + 1; stride as usize];
            src.tensor(t).unwrap().write_at(b * stride, &v).unwrap();
        }
    }
    let dst = decode.allocate_kv_cache(desc, None).await.unwrap();
    let by_name = ClusterInfo {
        remote_cluster_id: 1,
        remote_addr: "prefill-a".into(),
    };
    let r = decode
        .link_clusters(&[by_name], Duration::from_secs(10))
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    let all: Vec<u64> = (0..BLOCKS as u64).collect();
    let rev: Vec<u64> = all.iter().rev().copied().collect();
    decode
        .pull_kv_blocks(key, &dst, &all, &rev, &KvCacheExtParam::default())
        .await
        .unwrap();
    let mut buf = vec![0u8; stride as usize];
    for t in 0..2 {
        for b in 0..BLOCKS as u64 {
            dst.tensor(t)
                .unwrap()
                .read_at((BLOCKS as u64 - 1 - b) * stride, &mut buf)
                .unwrap();
            assert!(
                buf.iter().all(|&x| x == (t as u8) * 16 + b as u8 + 1),
                "tensor {t} block {b}"
            );
        }
    }
    // A name nobody holds is a link failure naming it.
    let nobody = ClusterInfo {
        remote_cluster_id: 3,
        remote_addr: "prefill-z".into(),
    };
    let r = decode
        .link_clusters(&[nobody], Duration::from_secs(5))
        .await
        .unwrap();
    let e = r[0].as_ref().unwrap_err();
    assert!(e.message.contains("prefill-z"), "{e}");
}
