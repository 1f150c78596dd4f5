//! A prefill server and a decode server as two processes, with a real model's KV geometry,
//! moving requests the way a disaggregated server does: prefill computes a request's KV into
//! blocks from its allocator, leases them to decode and hands decode the grant (here over a
//! pipe; in a server, in the request's transfer parameters through the router). Decode pulls
//! under the lease into blocks of its own allocator, checks the per-block status, and reports
//! done. Prefill frees a request's blocks only when its lease ends, from the stream of ended
//! leases, and reuses them for later requests.
//!
//! One request's done report is withheld, as if lost: its lease expires after its TTL and
//! only then are its blocks freed. Prefill's pool holds three requests, so later requests wait
//! for leases to end and reuse blocks.
//!
//! ```text
//! cargo run --release -p hixl-examples --example prefill_decode -- [TOKENS] [REQUESTS] [MODEL] [TRANSPORT]
//! ```
//! defaults: 1024 tokens, 8 requests, llama-3.1-8b, auto (the fabric on one host; tcp forces
//! sockets).

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hixl::datadist::models::{by_name, ModelGeometry};
use hixl::datadist::{
    BlocksCacheKey, Cache, ClusterInfo, KvCacheExtParam, LeaseEnd, LeaseGrant, LlmDataDist, LlmRole,
};

const PREFILL: u64 = 1;
const DECODE: u64 = 2;
/// The request whose done report decode withholds (a lost notify).
const LOST_DONE: u64 = 3;
/// A lease's TTL without progress. Decode renews the leases of the requests it has queued
/// (its heartbeat) every third of it.
const TTL: Duration = Duration::from_millis(1000);

/// The value every byte of block `b` of tensor `t` holds for request `req`.
fn kv_byte(req: u64, t: usize, b: u64) -> u8 {
    (req.wrapping_mul(97) ^ (t as u64).wrapping_mul(13) ^ b.wrapping_mul(5)) as u8 | 1
}

struct Args {
    tokens: u64,
    requests: u64,
    model: String,
    transport: String,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    Args {
        tokens: a.first().and_then(|s| s.parse().ok()).unwrap_or(1024),
        requests: a.get(1).and_then(|s| s.parse().ok()).unwrap_or(8),
        model: a.get(2).cloned().unwrap_or_else(|| "llama-3.1-8b".into()),
        transport: a.get(3).cloned().unwrap_or_else(|| "auto".into()),
    }
}

async fn start(cluster: u64, role: LlmRole, transport: &str) -> LlmDataDist {
    let mut dd = LlmDataDist::new(cluster, role);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("llm.SyncKvCacheWaitTime", "10000"),
        ("hixl.Transport", transport),
    ])
    .await
    .expect("initialize");
    dd
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
        let c = dd.allocate_kv_cache(desc, Some(key)).await.expect("cache");
        out.push((c, per_layer));
    }
    out
}

/// Decode: pulls each granted request into its own blocks, checks every block, reports done.
async fn decode(a: Args, m: ModelGeometry, per_request: u64) {
    let dd = start(DECODE, LlmRole::Decoder, &a.transport).await;
    // Decode's pool: every request keeps its blocks here (a real server frees them when the
    // request finishes decoding).
    let blocks = per_request * a.requests;
    let cs = caches(&dd, &m, DECODE, blocks).await;
    println!("READY -");
    std::io::stdout().flush().ok();
    let mut lines = BufReader::new(std::io::stdin()).lines();
    let link = lines
        .next()
        .and_then(Result::ok)
        .expect("prefill's address");
    let ci = ClusterInfo {
        remote_cluster_id: PREFILL,
        remote_addr: link,
    };
    let r = dd
        .link_clusters(&[ci], Duration::from_secs(5))
        .await
        .expect("link");
    r.into_iter()
        .next()
        .expect("one")
        .expect("linked to prefill");
    // Grants arrive while decode is busy pulling earlier requests: they wait in a queue whose
    // leases a task renews, so a queued request's lease does not expire.
    let dd = std::sync::Arc::new(dd);
    let queued = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::<
        LeaseGrant,
    >::new()));
    let (tx, mut grants) = tokio::sync::mpsc::unbounded_channel::<LeaseGrant>();
    let q = queued.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let g: LeaseGrant = serde_json::from_str(&line).expect("a grant");
            q.lock().expect("queue").push_back(g.clone());
            if tx.send(g).is_err() {
                break;
            }
        }
    });
    let (rdd, rq) = (dd.clone(), queued.clone());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(TTL / 3).await;
            let waiting: Vec<LeaseGrant> = rq.lock().expect("queue").iter().cloned().collect();
            for g in &waiting {
                let _ = rdd.renew_lease(g).await;
            }
        }
    });
    let mut next_free = 0u64;
    while let Some(g) = grants.recv().await {
        queued
            .lock()
            .expect("queue")
            .retain(|q| q.lease_id != g.lease_id);
        let mine: Vec<u64> = (next_free..next_free + g.blocks.len() as u64).collect();
        next_free += g.blocks.len() as u64;
        let t = Instant::now();
        let mut not_landed = BTreeSet::new();
        for (i, (cache, per_layer)) in cs.iter().enumerate() {
            let key = BlocksCacheKey {
                cluster_id: PREFILL,
                model_id: i as u64,
            };
            let ext = KvCacheExtParam {
                tensor_num_per_layer: *per_layer,
                ..Default::default()
            };
            // The last cache's pull reports done, unless this is the request whose done is lost.
            let done = i + 1 == cs.len() && g.request_id != LOST_DONE;
            if let Err(e) = dd
                .pull_leased_blocks(&g, key, cache, &g.blocks, &mine, &ext, done)
                .await
            {
                // Only the listed (layer, block) pairs are missing; everything else landed.
                eprintln!("decode: request {}: {e}", g.request_id);
                not_landed.extend(e.failed.iter().map(|f| f.dst_block));
                if e.failed.is_empty() {
                    not_landed.extend(mine.iter().copied());
                }
            }
        }
        let pulled = t.elapsed();
        // Check every block that landed; recompute the others (here: count them).
        let mut wrong = 0u64;
        for (cache, _) in &cs {
            let stride = cache.desc.stride().expect("stride") as usize;
            let mut buf = vec![0u8; stride];
            for tensor in 0..cache.tensor_addrs.len() {
                for (&src, &dst) in g.blocks.iter().zip(&mine) {
                    if not_landed.contains(&dst) {
                        continue;
                    }
                    let r = cache.tensor(tensor).expect("tensor");
                    r.read_at(dst * stride as u64, &mut buf).expect("read");
                    if buf.iter().any(|&x| x != kv_byte(g.request_id, tensor, src)) {
                        wrong += 1;
                    }
                }
            }
        }
        println!(
            "RESULT {} {} {} {:.2}",
            g.request_id,
            not_landed.len(),
            wrong,
            pulled.as_secs_f64() * 1e3
        );
        std::io::stdout().flush().ok();
    }
}

/// Prefill: computes requests into pooled blocks, leases them, frees them when leases end.
async fn prefill(a: Args, m: ModelGeometry, per_request: u64) -> bool {
    let dd = start(PREFILL, LlmRole::Prompt, &a.transport).await;
    let pool = per_request * 3;
    let cs = caches(&dd, &m, PREFILL, pool).await;
    let refs: Vec<&Cache> = cs.iter().map(|(c, _)| c).collect();
    let mut ended = dd.lease_events().expect("lease events");
    let mut free: BTreeSet<u64> = (0..pool).collect();
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(std::env::args().skip(1))
        .env("HIXL_EXAMPLE_ROLE", "decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the decode process");
    let mut to_decode = child.stdin.take().expect("stdin");
    let (tx, mut from_decode) = tokio::sync::mpsc::unbounded_channel::<String>();
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    while from_decode
        .recv()
        .await
        .is_some_and(|l| !l.starts_with("READY"))
    {}
    writeln!(to_decode, "{}", dd.listen_addr().expect("address")).expect("pipe");
    let started = Instant::now();
    let mut leased_at: HashMap<u64, Instant> = HashMap::new();
    let (mut received, mut results, mut ok) = (0u64, 0u64, true);
    let mut next = 1u64;
    while results < a.requests || !leased_at.is_empty() {
        // Admit the next request when the pool has room; otherwise wait for a lease to end.
        if next <= a.requests && free.len() as u64 >= per_request {
            let blocks: Vec<u64> = free.iter().copied().take(per_request as usize).collect();
            for b in &blocks {
                free.remove(b);
            }
            // "Compute" the request's KV into its blocks.
            for (cache, _) in &cs {
                let stride = cache.desc.stride().expect("stride");
                for t in 0..cache.tensor_addrs.len() {
                    for &b in &blocks {
                        let v = vec![kv_byte(next, t, b); stride as usize];
                        cache
                            .tensor(t)
                            .expect("tensor")
                            .write_at(b * stride, &v)
                            .expect("write");
                    }
                }
            }
            let g = dd.lease_blocks(next, &refs, &blocks, TTL).expect("lease");
            println!(
                "prefill: request {next}: {} blocks {:?}..: leased (lease {}), grant sent",
                blocks.len(),
                &blocks[..blocks.len().min(3)],
                g.lease_id
            );
            writeln!(to_decode, "{}", serde_json::to_string(&g).expect("json")).expect("pipe");
            leased_at.insert(next, Instant::now());
            next += 1;
            continue;
        }
        tokio::select! {
            e = ended.next() => {
                let e = e.expect("lease stream");
                let held = leased_at.remove(&e.request_id).map(|t| t.elapsed()).unwrap_or_default();
                println!(
                    "prefill: request {}: lease ended ({:?}) after {:.0} ms; {} blocks freed",
                    e.request_id, e.why, held.as_secs_f64() * 1e3, e.blocks.len()
                );
                ok &= (e.why == LeaseEnd::Expired) == (e.request_id == LOST_DONE);
                free.extend(e.blocks);
            }
            l = from_decode.recv() => {
                let Some(l) = l else { break };
                let Some(r) = l.strip_prefix("RESULT ") else { println!("{l}"); continue };
                let f: Vec<f64> = r.split_whitespace().filter_map(|x| x.parse().ok()).collect();
                println!(
                    "decode:  request {}: pulled in {:.2} ms; {} blocks to recompute, {} wrong",
                    f[0], f[3], f[1], f[2]
                );
                ok &= f[1] == 0.0 && f[2] == 0.0;
                received += 1;
                results += 1;
            }
        }
    }
    drop(to_decode);
    let _ = child.wait();
    println!(
        "{received} requests of {:.1} MiB each moved under leases in {:.0} ms; every block verified; \
         prefill freed each request's blocks only when its lease ended",
        m.bytes_for(per_request * m.block_tokens) as f64 / 1048576.0,
        started.elapsed().as_secs_f64() * 1e3
    );
    ok && dd.live_leases().expect("leases") == 0 && free.len() as u64 == pool
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let m = by_name(&a.model).expect("known model");
    let per_request = a.tokens.div_ceil(m.block_tokens);
    if std::env::var("HIXL_EXAMPLE_ROLE").as_deref() == Ok("decode") {
        return decode(a, m, per_request).await;
    }
    println!(
        "{}: {} requests of {} tokens = {per_request} blocks of {} tokens; prefill's pool holds 3 requests; \
         request {LOST_DONE}'s done is withheld; lease TTL {} ms",
        m.name,
        a.requests,
        per_request * m.block_tokens,
        m.block_tokens,
        TTL.as_millis()
    );
    if !prefill(a, m, per_request).await {
        eprintln!("prefill_decode: a request was lost, corrupt, or ended its lease the wrong way");
        std::process::exit(1);
    }
}
