//! A prefill server and a decode server as two processes, for llama-3.1-8b's real KV geometry.
//!
//! Prefill computes the KV cache layer by layer (simulated: a configurable time per layer,
//! then the layer's tensors are written) and pushes each layer to decode as soon as it is
//! ready. Decode verifies every block it received and reports time-to-first-token components:
//! compute, transfer, and how much of the transfer was hidden under compute.
//!
//! ```text
//! cargo run --release -p hixl-examples --example prefill_decode -- [TOKENS] [LAYER_MS] [MODEL]
//! ```
//! defaults: 2048 tokens, 3 ms per layer, llama-3.1-8b (any model of the shipped table works).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hixl::datadist::models::{by_name, ModelGeometry};
use hixl::datadist::{BlocksCacheKey, Cache, ClusterInfo, LayerTarget, LlmDataDist, LlmRole};

const PREFILL: u64 = 1;
const DECODE: u64 = 2;

/// The value every byte of block `b` of tensor `t` holds for request `req`.
fn kv_byte(req: u64, t: usize, b: u64) -> u8 {
    (req.wrapping_mul(97) ^ (t as u64).wrapping_mul(13) ^ b.wrapping_mul(5)) as u8 | 1
}

async fn caches(
    dd: &LlmDataDist,
    m: &ModelGeometry,
    cluster: u64,
    blocks: u64,
) -> Vec<(Cache, u32)> {
    let mut out = Vec::new();
    for (i, (desc, per_layer)) in m.caches(blocks, m.block_tokens).into_iter().enumerate() {
        let key = BlocksCacheKey {
            cluster_id: cluster,
            model_id: i as u64,
        };
        out.push((
            dd.allocate_kv_cache(desc, Some(key))
                .await
                .expect("allocate cache"),
            per_layer,
        ));
    }
    out
}

fn args() -> (u64, f64, String) {
    let a: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let tokens = a.first().and_then(|s| s.parse().ok()).unwrap_or(2048);
    let layer_ms = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let model = a.get(2).cloned().unwrap_or_else(|| "llama-3.1-8b".into());
    (tokens, layer_ms, model)
}

/// Decode: holds the caches, verifies what prefill pushed, reports TTFT components.
async fn decode(m: ModelGeometry, blocks: u64) {
    let mut dd = LlmDataDist::new(DECODE, LlmRole::Decoder);
    dd.initialize(&[("llm.ListenIpInfo", "127.0.0.1:0")])
        .await
        .expect("initialize decode");
    let cs = caches(&dd, &m, DECODE, blocks).await;
    println!("READY {}", dd.listen_addr().expect("address"));
    std::io::stdout().flush().ok();
    let mut notes = dd.engine().expect("engine").notifications();
    // Prefill notifies after its last layer landed: "req compute_ms exposed_ms alone_ms".
    let n = notes.next().await.expect("prefill's notify");
    let msg = String::from_utf8_lossy(&n.msg).to_string();
    let f: Vec<f64> = msg
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let (req, compute, exposed, alone) = (f[0] as u64, f[1], f[2], f[3]);
    let t = Instant::now();
    let mut bad = 0u64;
    for (cache, _) in &cs {
        let stride = cache.desc.stride().expect("stride") as usize;
        let mut buf = vec![0u8; stride];
        for t in 0..cache.tensor_addrs.len() {
            for b in 0..blocks {
                cache
                    .tensor(t)
                    .expect("tensor")
                    .read_at(b * stride as u64, &mut buf)
                    .expect("read");
                if buf.iter().any(|&x| x != kv_byte(req, t, b)) {
                    bad += 1;
                }
            }
        }
    }
    let blocks_checked: u64 = cs
        .iter()
        .map(|(c, _)| c.tensor_addrs.len() as u64 * blocks)
        .sum();
    println!(
        "decode: request {req}: {blocks_checked} blocks verified in {:.1} ms, {bad} wrong",
        t.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "decode: time to first token = prefill compute {compute:.1} ms + exposed KV transfer {exposed:.1} ms \
         (the transfer alone takes {alone:.1} ms; {:.0}% of it was hidden under compute)",
        (1.0 - exposed / alone).clamp(0.0, 1.0) * 100.0
    );
    println!("DONE {}", if bad == 0 { "ok" } else { "corrupt" });
    std::io::stdout().flush().ok();
    dd.finalize().await;
}

/// Prefill: computes layer by layer and pushes each layer as soon as it is ready.
async fn prefill(m: ModelGeometry, blocks: u64, layer_ms: f64, decode_addr: String) {
    let mut dd = LlmDataDist::new(PREFILL, LlmRole::Prompt);
    dd.initialize(&[("llm.ListenIpInfo", "127.0.0.1:0")])
        .await
        .expect("initialize prefill");
    let cs = caches(&dd, &m, PREFILL, blocks).await;
    let peer = ClusterInfo {
        remote_cluster_id: DECODE,
        remote_addr: decode_addr.clone(),
    };
    let linked = dd
        .link_clusters(&[peer], Duration::from_secs(5))
        .await
        .expect("link");
    linked
        .into_iter()
        .next()
        .expect("one result")
        .expect("linked to decode");
    let ids: Vec<u64> = (0..blocks).collect();
    let targets: Vec<Vec<LayerTarget>> = cs
        .iter()
        .enumerate()
        .map(|(i, (_, per_layer))| {
            vec![LayerTarget {
                dst: BlocksCacheKey {
                    cluster_id: DECODE,
                    model_id: i as u64,
                },
                src_blocks: ids.clone(),
                dst_blocks: ids.clone(),
                tensor_num_per_layer: *per_layer,
            }]
        })
        .collect();
    // How long the push takes by itself, after compute (warm-up first).
    let push_all = || async {
        for (i, (c, per_layer)) in cs.iter().enumerate() {
            let ext = hixl::datadist::KvCacheExtParam {
                tensor_num_per_layer: *per_layer,
                ..Default::default()
            };
            let key = BlocksCacheKey {
                cluster_id: DECODE,
                model_id: i as u64,
            };
            dd.push_kv_blocks(key, c, &ids, &ids, &ext)
                .await
                .expect("push");
        }
    };
    push_all().await;
    let t = Instant::now();
    push_all().await;
    let alone = t.elapsed().as_secs_f64() * 1e3;

    let req = 7;
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for ((cache, _), target) in cs.iter().zip(&targets) {
        let (tx, rx) = futures::channel::mpsc::unbounded::<u32>();
        senders.push(tx);
        tasks.push(dd.transfer_layerwise(cache, rx, target));
    }
    let start = Instant::now();
    let compute = async {
        for l in 0..m.layers {
            tokio::time::sleep(Duration::from_secs_f64(layer_ms / 1e3)).await; // the layer's math
            for (cache, per_layer) in &cs {
                let stride = cache.desc.stride().expect("stride");
                let n = *per_layer as usize;
                for t in l as usize * n..(l as usize + 1) * n {
                    for b in 0..blocks {
                        let v = vec![kv_byte(req, t, b); stride as usize];
                        cache
                            .tensor(t)
                            .expect("tensor")
                            .write_at(b * stride, &v)
                            .expect("write");
                    }
                }
            }
            for tx in &senders {
                tx.unbounded_send(l).expect("layer signal");
            }
        }
        drop(senders);
        start.elapsed()
    };
    let (reports, compute_time) = tokio::join!(futures::future::join_all(tasks), compute);
    let done = start.elapsed();
    for r in &reports {
        for res in &r.results {
            res.as_ref().expect("layer-wise push");
        }
    }
    let compute_ms = compute_time.as_secs_f64() * 1e3;
    let exposed = done.saturating_sub(compute_time).as_secs_f64() * 1e3;
    println!(
        "prefill: {} layers computed in {compute_ms:.1} ms, every layer pushed as it became ready; last byte landed {exposed:.1} ms after the last layer",
        m.layers
    );
    let peer = dd
        .engine()
        .expect("engine")
        .peer(&decode_addr)
        .expect("linked");
    peer.notify("kv_done", format!("{req} {compute_ms} {exposed} {alone}"))
        .await
        .expect("notify");
    dd.finalize().await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (tokens, layer_ms, model) = args();
    let m = by_name(&model).expect("known model");
    let blocks = tokens.div_ceil(m.block_tokens);
    if std::env::var("HIXL_EXAMPLE_ROLE").as_deref() == Ok("decode") {
        return decode(m, blocks).await;
    }
    println!(
        "{}: {} tokens in {} blocks of {}; {:.1} MiB of KV per request; {layer_ms} ms of compute per layer",
        m.name,
        blocks * m.block_tokens,
        blocks,
        m.block_tokens,
        m.bytes_for(blocks * m.block_tokens) as f64 / 1048576.0
    );
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(std::env::args().skip(1))
        .env("HIXL_EXAMPLE_ROLE", "decode")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the decode process");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = loop {
        let l = lines.next().expect("decode exited").expect("decode output");
        if let Some(a) = l.strip_prefix("READY ") {
            break a.to_string();
        }
    };
    println!("decode process {} listening at {addr}", child.id());
    prefill(m, blocks, layer_ms, addr).await;
    let mut ok = false;
    for l in lines.map_while(Result::ok) {
        if let Some(v) = l.strip_prefix("DONE ") {
            ok = v == "ok";
            break;
        }
        println!("{l}");
    }
    let _ = child.wait();
    if !ok {
        eprintln!("decode found corrupt blocks");
        std::process::exit(1);
    }
}
