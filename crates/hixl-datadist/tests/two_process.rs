//! Two real processes: a peer cluster (this test binary re-run as a child) and this one pull
//! and push a few hundred blocks of real model geometries, verified block by block.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use hixl_datadist::models::by_name;
use hixl_datadist::{
    BlocksCacheKey, Cache, CacheKey, ClusterInfo, KvCacheExtParam, LayerTarget, LlmDataDist,
    LlmRole, LlmStatus,
};

const T: Duration = Duration::from_secs(10);
const BLOCKS: u64 = 256;
const BLOCK_TOKENS: u64 = 4;

/// The byte every position of block `b` of tensor `t` holds for `seed`.
fn fill_byte(seed: u64, t: usize, b: u64) -> u8 {
    (seed.wrapping_mul(131) ^ (t as u64).wrapping_mul(31) ^ b.wrapping_mul(7)) as u8 | 1
}

fn fill(cache: &Cache, seed: u64, blocks: impl Iterator<Item = u64> + Clone) {
    let stride = cache.desc.stride().unwrap();
    for t in 0..cache.tensor_addrs.len() {
        for b in blocks.clone() {
            let v = vec![fill_byte(seed, t, b); stride as usize];
            cache.tensor(t).unwrap().write_at(b * stride, &v).unwrap();
        }
    }
}

/// Blocks `blocks` of `cache` hold `seed`'s pattern as block `src_of(b)` would.
fn holds(cache: &Cache, seed: u64, pairs: &[(u64, u64)]) -> Result<(), String> {
    let stride = cache.desc.stride().unwrap() as usize;
    let mut buf = vec![0u8; stride];
    for t in 0..cache.tensor_addrs.len() {
        for &(src, dst) in pairs {
            cache
                .tensor(t)
                .unwrap()
                .read_at(dst * stride as u64, &mut buf)
                .unwrap();
            let want = vec![fill_byte(seed, t, src); stride];
            if buf != want {
                return Err(format!("tensor {t} block {dst} (from {src}) differs"));
            }
        }
    }
    Ok(())
}

fn pairs() -> Vec<(u64, u64)> {
    // scattered, with contiguous runs on both sides and reversed stretches
    let mut v: Vec<(u64, u64)> = (0..100).map(|i| (i, 100 + i)).collect();
    v.extend((0..60).map(|i| (190 + i, 60 - i)));
    v.extend((0..40).map(|i| (100 + 2 * i, 200 + i)));
    v
}

fn contiguous_desc() -> hixl_datadist::CacheDesc {
    hixl_datadist::CacheDesc::host(4, hixl_datadist::DataType::BFloat16, vec![8, 64, 32])
}

async fn caches(dd: &LlmDataDist, model: &str, cluster: u64) -> Vec<(Cache, u32)> {
    let m = by_name(model).unwrap();
    let mut out = Vec::new();
    for (i, (desc, per_layer)) in m.caches(BLOCKS, BLOCK_TOKENS).into_iter().enumerate() {
        let key = BlocksCacheKey {
            cluster_id: cluster,
            model_id: i as u64,
        };
        out.push((
            dd.allocate_kv_cache(desc, Some(key)).await.unwrap(),
            per_layer,
        ));
    }
    out
}

/// Entry point of the peer cluster when this binary is re-run as a child (ignored otherwise:
/// it is a role, not a test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the peer role of the two-process tests; spawn_child runs it"]
async fn child_process_entry() {
    let Ok(model) = std::env::var("HIXL_DD_CHILD_MODEL") else {
        return;
    };
    let transport = std::env::var("HIXL_DD_TRANSPORT").unwrap_or_else(|_| "tcp".into());
    let mut dd = LlmDataDist::new(1, LlmRole::Prompt);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", &transport),
    ])
    .await
    .unwrap();
    let cs = caches(&dd, &model, 1).await;
    for (c, _) in &cs {
        fill(c, 11, 0..BLOCKS);
    }
    // a contiguous (prompt) cache of 8 batch entries, entries 0..6 keyed by requests 100..106
    let keys: Vec<CacheKey> = (100..106).map(|r| CacheKey::new(1, r)).collect();
    let contiguous = dd
        .allocate_kv_cache_with_keys(contiguous_desc(), &keys)
        .await
        .unwrap();
    fill(&contiguous, 11, 0..8);
    println!("READY {}", dd.listen_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let mut notes = dd.engine().unwrap().notifications();
    while let Some(n) = notes.next().await {
        if n.name == b"remove_key" {
            let req: u64 = String::from_utf8_lossy(&n.msg).parse().unwrap_or(0);
            let r = dd.remove_cache_key(CacheKey::new(1, req)).await;
            println!("VERIFY removed {}", r.is_ok());
            std::io::stdout().flush().unwrap();
        }
        if n.name == b"verify" {
            let seed: u64 = String::from_utf8_lossy(&n.msg).parse().unwrap_or(0);
            let swapped: Vec<(u64, u64)> = pairs().into_iter().map(|(s, d)| (d, s)).collect();
            let verdict = cs
                .iter()
                .map(|(c, _)| holds(c, seed, &swapped))
                .collect::<Result<Vec<_>, _>>();
            println!(
                "VERIFY {}",
                match verdict {
                    Ok(_) => "ok".to_string(),
                    Err(e) => e,
                }
            );
            std::io::stdout().flush().unwrap();
        }
    }
}

struct Child {
    proc: std::process::Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    addr: String,
}

fn spawn_child(model: &str, transport: &str) -> Child {
    let mut proc = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HIXL_DD_CHILD_MODEL", model)
        .env("HIXL_DD_TRANSPORT", transport)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(proc.stdout.take().unwrap()).lines();
    let addr = loop {
        let l = lines.next().expect("child exited before READY").unwrap();
        if let Some(i) = l.find("READY ") {
            break l[i + 6..].trim().to_string();
        }
    };
    Child { proc, lines, addr }
}

impl Child {
    /// Sends the child a notify and returns its VERIFY answer.
    async fn ask(&mut self, dd: &LlmDataDist, name: &str, msg: &str) -> String {
        let engine = dd.engine().unwrap();
        engine
            .peer(&self.addr)
            .unwrap()
            .notify(name, msg)
            .await
            .unwrap();
        self.wait_verify()
    }

    fn wait_verify(&mut self) -> String {
        loop {
            let l = self.lines.next().expect("child exited").unwrap();
            if let Some(i) = l.find("VERIFY ") {
                return l[i + 7..].to_string();
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

async fn pull_and_push(model: &str, transport: &str) {
    let mut child = spawn_child(model, transport);
    let mut dd = LlmDataDist::new(2, LlmRole::Decoder);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", transport),
    ])
    .await
    .unwrap();
    let local = caches(&dd, model, 2).await;
    let peer = ClusterInfo {
        remote_cluster_id: 1,
        remote_addr: child.addr.clone(),
    };
    let r = dd
        .link_clusters(std::slice::from_ref(&peer), T)
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    let again = dd
        .link_clusters(std::slice::from_ref(&peer), T)
        .await
        .unwrap();
    assert_eq!(
        again[0].as_ref().unwrap_err().status,
        LlmStatus::AlreadyLink
    );
    let (src, dst): (Vec<u64>, Vec<u64>) = pairs().into_iter().unzip();
    for (i, (cache, per_layer)) in local.iter().enumerate() {
        let key = BlocksCacheKey {
            cluster_id: 1,
            model_id: i as u64,
        };
        let ext = KvCacheExtParam {
            tensor_num_per_layer: *per_layer,
            ..Default::default()
        };
        dd.pull_kv_blocks(key, cache, &src, &dst, &ext)
            .await
            .unwrap();
        holds(cache, 11, &pairs()).unwrap();
    }
    // push back the other way with a new pattern, into the peer's blocks `src`
    for (i, (cache, per_layer)) in local.iter().enumerate() {
        fill(cache, 23, 0..BLOCKS);
        let key = BlocksCacheKey {
            cluster_id: 1,
            model_id: i as u64,
        };
        let ext = KvCacheExtParam {
            tensor_num_per_layer: *per_layer,
            ..Default::default()
        };
        dd.push_kv_blocks(key, cache, &dst, &src, &ext)
            .await
            .unwrap();
    }
    assert_eq!(child.ask(&dd, "verify", "23").await, "ok");
    // contiguous caches by index: pull entry 3 into local entry 5, push it to remote entry 6,
    // pull remote entry 6 back into local entry 1: both hold entry 3's bytes
    let table = dd.peer_table(1).await.unwrap();
    let id = table
        .caches
        .iter()
        .find(|c| c.key.is_none())
        .unwrap()
        .cache_id;
    let mine = dd.allocate_kv_cache(contiguous_desc(), None).await.unwrap();
    let idx = |batch_index| hixl_datadist::CacheIndex {
        cluster_id: 1,
        cache_id: id,
        batch_index,
    };
    let ext = KvCacheExtParam::default();
    dd.pull_kv_cache(idx(3), &mine, 5, &ext).await.unwrap();
    holds(&mine, 11, &[(3, 5)]).unwrap();
    dd.push_kv_cache(&mine, idx(6), 5, &ext).await.unwrap();
    dd.pull_kv_cache(idx(6), &mine, 1, &ext).await.unwrap();
    holds(&mine, 11, &[(3, 1)]).unwrap();
    assert_eq!(
        dd.pull_kv_cache(idx(8), &mine, 0, &ext)
            .await
            .unwrap_err()
            .status,
        LlmStatus::ParamInvalid
    );
    // contiguous caches by request key: pull request 103's entry (entry 3) into local entry
    // 2, push local entry 1 into request 104's entry and pull that back into local entry 7
    dd.pull_kv_cache_by_key(CacheKey::new(1, 103), &mine, 2, &ext)
        .await
        .unwrap();
    holds(&mine, 11, &[(3, 2)]).unwrap();
    dd.push_kv_cache_by_key(&mine, CacheKey::new(1, 104), 1, &ext)
        .await
        .unwrap();
    dd.pull_kv_cache_by_key(CacheKey::new(1, 104), &mine, 7, &ext)
        .await
        .unwrap();
    holds(&mine, 11, &[(3, 7)]).unwrap();
    // a key the peer never had, and one it removes after it was pulled once
    let e = dd
        .pull_kv_cache_by_key(CacheKey::new(1, 999), &mine, 0, &ext)
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::KvCacheNotExist, "{e}");
    assert!(e.message.contains("req_id: 999"), "{e}");
    assert_eq!(child.ask(&dd, "remove_key", "103").await, "removed true");
    let e = dd
        .pull_kv_cache_by_key(CacheKey::new(1, 103), &mine, 2, &ext)
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::KvCacheNotExist, "{e}");
    let e = dd
        .push_kv_cache_by_key(&mine, CacheKey::new(1, 103), 2, &ext)
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::KvCacheNotExist, "{e}");
    assert_eq!(child.ask(&dd, "remove_key", "103").await, "removed false");
    // errors name what is wrong
    let bad = dd
        .pull_kv_blocks(
            BlocksCacheKey {
                cluster_id: 1,
                model_id: 9,
            },
            &local[0].0,
            &[0],
            &[0],
            &Default::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(bad.status, LlmStatus::KvCacheNotExist);
    let bad = dd
        .pull_kv_blocks(
            BlocksCacheKey {
                cluster_id: 1,
                model_id: 0,
            },
            &local[0].0,
            &[BLOCKS],
            &[0],
            &Default::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(bad.status, LlmStatus::ParamInvalid);
    assert!(bad.message.contains(&BLOCKS.to_string()), "{bad}");
    let r = dd
        .unlink_clusters(std::slice::from_ref(&peer), T, false)
        .await
        .unwrap();
    assert!(r[0].is_ok());
    let r = dd.unlink_clusters(&[peer], T, false).await.unwrap();
    assert_eq!(r[0].as_ref().unwrap_err().status, LlmStatus::NotYetLink);
    dd.finalize().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_3_1_8b_pull_and_push_over_tcp() {
    pull_and_push("llama-3.1-8b", "tcp").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deepseek_r1_pull_and_push_over_fabric() {
    pull_and_push("deepseek-r1", "fabric").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layerwise_push_moves_each_layer_as_it_is_ready() {
    let mut child = spawn_child("llama-3.1-8b", "tcp");
    let mut dd = LlmDataDist::new(2, LlmRole::Prompt);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", "tcp"),
    ])
    .await
    .unwrap();
    let local = caches(&dd, "llama-3.1-8b", 2).await;
    fill(&local[0].0, 23, 0..BLOCKS);
    let peer = ClusterInfo {
        remote_cluster_id: 1,
        remote_addr: child.addr.clone(),
    };
    assert!(dd.link_clusters(&[peer], T).await.unwrap()[0].is_ok());
    let (src, dst): (Vec<u64>, Vec<u64>) = pairs().into_iter().unzip();
    let target = LayerTarget {
        dst: BlocksCacheKey {
            cluster_id: 1,
            model_id: 0,
        },
        src_blocks: dst,
        dst_blocks: src,
        tensor_num_per_layer: 2,
    };
    let (tx, rx) = futures::channel::mpsc::unbounded::<u32>();
    let targets = [target];
    let task = dd.transfer_layerwise(&local[0].0, rx, &targets);
    let compute = async move {
        for l in 0..32 {
            tokio::time::sleep(Duration::from_millis(5)).await; // "compute" layer l
            tx.unbounded_send(l).unwrap();
        }
    };
    let (report, ()) = tokio::join!(task, compute);
    assert_eq!(report.layers, 32);
    assert!(report.results[0].is_ok(), "{:?}", report.results[0]);
    dd.engine()
        .unwrap()
        .peer(&child.addr)
        .unwrap()
        .notify("verify", "23")
        .await
        .unwrap();
    assert_eq!(child.wait_verify(), "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_errors_and_cache_key_conflicts() {
    let mut dd = LlmDataDist::new(5, LlmRole::Mix);
    let desc = hixl_datadist::CacheDesc::host(2, hixl_datadist::DataType::BFloat16, vec![4, 8]);
    let key = BlocksCacheKey {
        cluster_id: 5,
        model_id: 0,
    };
    assert_eq!(
        dd.allocate_kv_cache(desc.clone(), Some(key))
            .await
            .unwrap_err()
            .status,
        LlmStatus::Failed,
        "before initialize"
    );
    dd.initialize(&[("llm.ListenIpInfo", "127.0.0.1:0")])
        .await
        .unwrap();
    dd.allocate_kv_cache(desc.clone(), Some(key)).await.unwrap();
    let e = dd
        .allocate_kv_cache(desc.clone(), Some(key))
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::ParamInvalid);
    assert!(e.message.contains("already used"), "{e}");
    let e = dd
        .allocate_kv_cache(
            desc.clone(),
            Some(BlocksCacheKey {
                cluster_id: 6,
                model_id: 0,
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::ParamInvalid);
    let many: Vec<ClusterInfo> = (0..17)
        .map(|i| ClusterInfo {
            remote_cluster_id: i,
            remote_addr: "127.0.0.1:1".into(),
        })
        .collect();
    assert_eq!(
        dd.link_clusters(&many, T).await.unwrap_err().status,
        LlmStatus::ClusterNumExceedLimit
    );
    assert_eq!(
        dd.unlink_clusters(&many, T, true).await.unwrap_err().status,
        LlmStatus::ClusterNumExceedLimit
    );
    let r = dd
        .link_clusters(&many[..1], Duration::from_millis(300))
        .await
        .unwrap();
    assert!(matches!(
        r[0].as_ref().unwrap_err().status,
        LlmStatus::LinkFailed | LlmStatus::Timeout
    ));
    let e = dd
        .pull_kv_blocks(
            BlocksCacheKey {
                cluster_id: 9,
                model_id: 0,
            },
            &dd.allocate_kv_cache(desc, None).await.unwrap(),
            &[0],
            &[0],
            &Default::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::NotYetLink);
    dd.finalize().await;
}
