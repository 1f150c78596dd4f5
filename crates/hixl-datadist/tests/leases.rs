//! Request-scoped leases and per-block failure status, between two real processes: this test
//! binary re-run as a child plays the puller (decode) or the owner (prefill), driven by
//! commands on its stdin.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, ClusterInfo, DataType, KvCacheExtParam, LeaseEnd, LeaseGrant,
    LlmDataDist, LlmRole, LlmStatus,
};

const T: Duration = Duration::from_secs(10);
const OWNER: u64 = 1;
const PULLER: u64 = 2;
const GUARD: u64 = 0xEE;

fn key() -> BlocksCacheKey {
    BlocksCacheKey {
        cluster_id: OWNER,
        model_id: 0,
    }
}

/// `tensors` tensors of `blocks` blocks of `block` bytes.
fn desc(tensors: u32, blocks: i64, block: i64) -> CacheDesc {
    CacheDesc::host(tensors, DataType::UInt8, vec![blocks, block])
}

fn byte(seed: u64, t: usize, b: u64) -> u8 {
    (seed.wrapping_mul(131) ^ (t as u64).wrapping_mul(31) ^ b.wrapping_mul(7)) as u8 | 1
}

fn fill(c: &Cache, seed: u64, blocks: impl Iterator<Item = u64> + Clone) {
    let stride = c.desc.stride().unwrap();
    for t in 0..c.tensor_addrs.len() {
        for b in blocks.clone() {
            let v = vec![byte(seed, t, b); stride as usize];
            c.tensor(t).unwrap().write_at(b * stride, &v).unwrap();
        }
    }
}

/// Whether block `dst` of tensor `t` holds `seed`'s pattern of source block `src`.
fn holds(c: &Cache, seed: u64, t: usize, src: u64, dst: u64) -> bool {
    let stride = c.desc.stride().unwrap() as usize;
    let mut buf = vec![0u8; stride];
    c.tensor(t)
        .unwrap()
        .read_at(dst * stride as u64, &mut buf)
        .unwrap();
    buf.iter().all(|&x| x == byte(seed, t, src))
}

async fn started(cluster: u64, role: LlmRole, transport: &str) -> LlmDataDist {
    let mut dd = LlmDataDist::new(cluster, role);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("llm.SyncKvCacheWaitTime", "10000"),
        ("hixl.Transport", transport),
    ])
    .await
    .unwrap();
    dd
}

fn say(line: String) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// The child's entry (ignored as a test: `spawn` runs it with its role in the environment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child role of the lease tests; spawn runs it"]
async fn child_entry() {
    let Ok(role) = std::env::var("HIXL_LEASE_CHILD") else {
        return;
    };
    let transport = std::env::var("HIXL_LEASE_TRANSPORT").unwrap_or_else(|_| "tcp".into());
    let geometry: Vec<i64> = std::env::var("HIXL_LEASE_GEOMETRY")
        .unwrap()
        .split(',')
        .map(|x| x.parse().unwrap())
        .collect();
    let d = desc(geometry[0] as u32, geometry[1], geometry[2]);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    if role == "owner" {
        let dd = started(OWNER, LlmRole::Prompt, &transport).await;
        let c = dd.allocate_kv_cache(d, Some(key())).await.unwrap();
        fill(&c, 11, 0..geometry[1] as u64);
        say(format!("READY {}", dd.listen_addr().unwrap()));
        while let Some(l) = rx.recv().await {
            if let Some(t) = l.strip_prefix("dereg ") {
                let t: usize = t.parse().unwrap();
                let r = dd.engine().unwrap().deregister(c.tensor(t).unwrap()).await;
                say(format!("DEREG {}", r.is_ok()));
            }
        }
        return;
    }
    let dd = started(PULLER, LlmRole::Decoder, &transport).await;
    let c = dd.allocate_kv_cache(d, None).await.unwrap();
    fill(&c, GUARD, 0..geometry[1] as u64);
    say("READY -".to_string());
    while let Some(l) = rx.recv().await {
        let mut w = l.splitn(4, ' ');
        match (w.next(), w.next(), w.next(), w.next()) {
            (Some("link"), Some(addr), _, _) => {
                let ci = ClusterInfo {
                    remote_cluster_id: OWNER,
                    remote_addr: addr.to_string(),
                };
                let r = dd.link_clusters(&[ci], T).await.unwrap();
                say(format!("LINKED {}", r[0].is_ok()));
            }
            // pull <done> <dst offset> <grant json>
            (Some("pull"), Some(done), Some(off), Some(grant)) => {
                let g: LeaseGrant = serde_json::from_str(grant).unwrap();
                let off: u64 = off.parse().unwrap();
                let dst: Vec<u64> = g.blocks.iter().map(|b| b + off).collect();
                say("PULLING".to_string());
                let r = dd
                    .pull_leased_blocks(
                        &g,
                        key(),
                        &c,
                        &g.blocks,
                        &dst,
                        &KvCacheExtParam {
                            tensor_num_per_layer: 1,
                            ..Default::default()
                        },
                        done == "1",
                    )
                    .await;
                // Which seed each destination block holds now (11: the owner's first
                // pattern, 23: its reuse, GUARD: untouched).
                let held: Vec<String> = g
                    .blocks
                    .iter()
                    .zip(&dst)
                    .map(|(&s, &d)| {
                        let seed = [11, 23, GUARD].into_iter().find(|&seed| {
                            (0..c.tensor_addrs.len()).all(|t| {
                                let src = if seed == GUARD { d } else { s };
                                holds(&c, seed, t, src, d)
                            })
                        });
                        seed.map_or("mixed".to_string(), |s| s.to_string())
                    })
                    .collect();
                let status = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.status.name().to_string(),
                };
                say(format!("PULLED {status} {}", held.join(",")));
            }
            (Some("done"), Some(grant), _, _) => {
                let g: LeaseGrant = serde_json::from_str(grant).unwrap();
                let r = dd.lease_done(&g).await;
                say(format!(
                    "DONE {}",
                    r.map_or_else(|e| e.status.name().to_string(), |()| "ok".into())
                ));
            }
            _ => say(format!("UNKNOWN {l}")),
        }
    }
}

struct Child {
    proc: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    addr: String,
}

fn spawn(role: &str, transport: &str, geometry: (u32, i64, i64)) -> Child {
    let mut proc = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HIXL_LEASE_CHILD", role)
        .env("HIXL_LEASE_TRANSPORT", transport)
        .env(
            "HIXL_LEASE_GEOMETRY",
            format!("{},{},{}", geometry.0, geometry.1, geometry.2),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = proc.stdin.take().unwrap();
    let out = BufReader::new(proc.stdout.take().unwrap());
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut c = Child {
        proc,
        stdin,
        lines,
        addr: String::new(),
    };
    c.addr = c.expect("READY ");
    c
}

impl Child {
    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The rest of the next line that contains `tag`.
    fn expect(&mut self, tag: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("child said no {tag:?}"));
            if let Some(i) = l.find(tag) {
                return l[i + tag.len()..].trim().to_string();
            }
        }
    }

    fn pull(&mut self, g: &LeaseGrant, done: bool, dst_offset: u64) -> String {
        let json = serde_json::to_string(g).unwrap();
        self.send(&format!("pull {} {dst_offset} {json}", u8::from(done)));
        self.expect("PULLED ")
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

async fn next_end(
    events: &mut hixl_datadist::LeaseEvents,
    within: Duration,
) -> hixl_datadist::EndedLease {
    tokio::time::timeout(within, events.next())
        .await
        .expect("no lease ended in time")
        .expect("lease stream ended")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_end_by_done_expiry_and_revocation_and_refuse_late_pulls() {
    let geometry = (2, 64, 4096);
    let owner = started(OWNER, LlmRole::Prompt, "tcp").await;
    let cache = owner
        .allocate_kv_cache(desc(geometry.0, geometry.1, geometry.2), Some(key()))
        .await
        .unwrap();
    fill(&cache, 11, 0..64);
    let mut events = owner.lease_events().unwrap();
    assert!(owner.lease_events().is_err(), "one stream per instance");
    let mut puller = spawn("decode", "tcp", geometry);
    puller.send(&format!("link {}", owner.listen_addr().unwrap()));
    assert_eq!(puller.expect("LINKED "), "true");

    // 0. A TTL that does not fit an instant (`Duration::MAX`, which panicked with the lease
    // lock held and so disabled every later lease call, the reaper and the lease service) is
    // refused naming it; the instance goes on (every step below uses it).
    let a: Vec<u64> = (0..8).collect();
    for ttl in [Duration::MAX, Duration::from_millis(u64::MAX)] {
        let e = owner.lease_blocks(1, &[&cache], &a, ttl).unwrap_err();
        assert_eq!(e.status, LlmStatus::ParamInvalid, "{e}");
        assert!(e.message.contains("lease TTL of request 1"), "{e}");
        assert_eq!(owner.live_leases().unwrap(), 0);
    }

    // 1. A pull with done: the lease ends Done; the bytes are the request's.
    let g1 = owner
        .lease_blocks(1, &[&cache], &a, Duration::from_secs(5))
        .unwrap();
    assert_eq!(puller.pull(&g1, true, 0), "ok 11,11,11,11,11,11,11,11");
    let e = next_end(&mut events, T).await;
    assert_eq!((e.request_id, e.why), (1, LeaseEnd::Done));
    assert_eq!(e.blocks, a);
    assert_eq!(owner.live_leases().unwrap(), 0);

    // 2. A lost done-notify: the lease expires after its TTL without progress.
    let b: Vec<u64> = (8..16).collect();
    let ttl = Duration::from_millis(300);
    let g2 = owner.lease_blocks(2, &[&cache], &b, ttl).unwrap();
    assert_eq!(puller.pull(&g2, false, 0), "ok 11,11,11,11,11,11,11,11");
    let pulled = Instant::now();
    let e = next_end(&mut events, T).await;
    assert_eq!((e.request_id, e.why), (2, LeaseEnd::Expired));
    assert!(pulled.elapsed() >= ttl / 2, "expired before its TTL");

    // 3. The blocks are reused for request 3 with other bytes; a late pull with request 2's
    // grant is refused and moves nothing: its destination blocks keep the guard pattern.
    fill(&cache, 23, b.iter().copied());
    let g3 = owner
        .lease_blocks(3, &[&cache], &b, Duration::from_secs(30))
        .unwrap();
    assert_ne!(g3.generation, g2.generation);
    let late = puller.pull(&g2, true, 40);
    assert_eq!(late, "LLM_LEASE_ENDED 238,238,238,238,238,238,238,238");
    // the live lease's holder gets the new bytes
    assert_eq!(puller.pull(&g3, false, 24), "ok 23,23,23,23,23,23,23,23");

    // 4. While request 3's lease lives its blocks cannot be leased again, overwritten by a
    // local copy, or their cache unregistered.
    let e = owner
        .lease_blocks(4, &[&cache], &[15, 16], Duration::from_secs(1))
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::LeaseHeld);
    assert!(
        e.message.contains("block 15") && e.message.contains("request 3"),
        "{e}"
    );
    let e = owner
        .swap_blocks(&cache, &cache, &[(0, 9)])
        .await
        .unwrap_err();
    assert_eq!(e.status, LlmStatus::LeaseHeld, "{e}");
    let e = owner.unregister_kv_cache(cache.cache_id).await.unwrap_err();
    assert_eq!(e.status, LlmStatus::LeaseHeld, "{e}");
    // the owner checks the grant presented is the one it made: a grant widened to a block of
    // no lease is refused, and nothing moves
    let mut wider = g3.clone();
    wider.blocks.push(63);
    assert!(puller
        .pull(&wider, false, 0)
        .starts_with("LLM_LEASE_ENDED 11,11,11,11,11,11,11,11,238"));

    // 5. The owner revokes request 3 (aborted): reported Revoked, and pulls are refused.
    owner.end_lease(g3.lease_id).unwrap();
    let e = next_end(&mut events, T).await;
    assert_eq!((e.request_id, e.why), (3, LeaseEnd::Revoked));
    assert!(puller
        .pull(&g3, false, 48)
        .starts_with("LLM_LEASE_ENDED 238"));
    assert_eq!(
        owner.end_lease(g3.lease_id).unwrap_err().status,
        LlmStatus::LeaseEnded
    );
    // a done for an ended lease says so
    puller.send(&format!("done {}", serde_json::to_string(&g1).unwrap()));
    assert_eq!(puller.expect("DONE "), "LLM_LEASE_ENDED");
    // the blocks are free again
    owner
        .lease_blocks(5, &[&cache], &b, Duration::from_secs(1))
        .unwrap();

    // The metrics count them: four granted before this one, ended done, expired, revoked.
    let m = owner.metrics_text().unwrap();
    let has = |series: &str, tail: &str| {
        m.lines()
            .any(|l| l.starts_with(series) && l.ends_with(tail))
    };
    assert!(has("hixl_leases_live{", "} 1"), "{m}");
    assert!(has("hixl_leases_granted_total{", "} 4"), "{m}");
    for (reason, n) in [
        ("done", 1),
        ("expired", 1),
        ("revoked", 1),
        ("link_down", 0),
    ] {
        let tail = format!("reason=\"{reason}\"}} {n}");
        assert!(has("hixl_leases_ended_total{", &tail), "{tail}\n{m}");
    }
}

/// A decode peer killed while it pulls: the lease ends (LinkDown) within the liveness bound.
async fn killed_puller_ends_its_lease(transport: &str) {
    // 2 tensors × 64 blocks × 1 MiB: a pull of 128 MiB, in flight when the puller dies.
    let geometry = (2, 64, 1 << 20);
    let owner = started(OWNER, LlmRole::Prompt, transport).await;
    let cache = owner
        .allocate_kv_cache(desc(geometry.0, geometry.1, geometry.2), Some(key()))
        .await
        .unwrap();
    let mut events = owner.lease_events().unwrap();
    let mut puller = spawn("decode", transport, geometry);
    puller.send(&format!("link {}", owner.listen_addr().unwrap()));
    assert_eq!(puller.expect("LINKED "), "true");
    let all: Vec<u64> = (0..64).collect();
    let g = owner
        .lease_blocks(7, &[&cache], &all, Duration::from_secs(60))
        .unwrap();
    puller.send(&format!("pull 0 0 {}", serde_json::to_string(&g).unwrap()));
    puller.expect("PULLING");
    tokio::time::sleep(Duration::from_millis(5)).await;
    puller.proc.kill().unwrap();
    let killed = Instant::now();
    let e = next_end(&mut events, T).await;
    assert_eq!((e.request_id, e.why), (7, LeaseEnd::LinkDown));
    // A killed process's sockets close at once: far inside the heartbeat bound.
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(owner.live_leases().unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_puller_ends_its_lease_tcp() {
    killed_puller_ends_its_lease("tcp").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_puller_ends_its_lease_fabric() {
    killed_puller_ends_its_lease("fabric").await
}

/// Links to an owner child; returns the puller, its cache and the child.
async fn link_to_owner(transport: &str, geometry: (u32, i64, i64)) -> (LlmDataDist, Cache, Child) {
    let owner = spawn("owner", transport, geometry);
    let dd = started(PULLER, LlmRole::Decoder, transport).await;
    let c = dd
        .allocate_kv_cache(desc(geometry.0, geometry.1, geometry.2), None)
        .await
        .unwrap();
    fill(&c, GUARD, 0..geometry.1 as u64);
    let ci = ClusterInfo {
        remote_cluster_id: OWNER,
        remote_addr: owner.addr.clone(),
    };
    let r = dd.link_clusters(&[ci], T).await.unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    (dd, c, owner)
}

/// Every pair the error does not list holds the owner's bytes; listed pairs are of whole
/// layers (tensor_num_per_layer 2).
fn check_landed(c: &Cache, failed: &[hixl_datadist::BlockFailure], blocks: u64) -> usize {
    let layers = c.tensor_addrs.len() / 2;
    let mut landed = 0;
    for layer in 0..layers {
        for b in 0..blocks {
            let listed = failed
                .iter()
                .any(|f| f.dst_layer == layer as u32 && f.dst_block == b);
            if !listed {
                for t in [2 * layer, 2 * layer + 1] {
                    assert!(
                        holds(c, 11, t, b, b),
                        "layer {layer} block {b} unlisted but not landed"
                    );
                }
                landed += 1;
            }
        }
    }
    landed
}

/// The owner deregisters one tensor (layer 2's K) of its cache: the pull fails exactly layer
/// 2's pairs, and every other layer lands.
async fn partly_deregistered_cache_fails_exactly_its_layer(transport: &str) {
    let geometry = (8, 32, 8192);
    let (dd, c, mut owner) = link_to_owner(transport, geometry).await;
    owner.send("dereg 4");
    assert_eq!(owner.expect("DEREG "), "true");
    let all: Vec<u64> = (0..32).collect();
    let e = dd
        .pull_kv_blocks(key(), &c, &all, &all, &KvCacheExtParam::default())
        .await
        .unwrap_err();
    let want: Vec<hixl_datadist::BlockFailure> = all
        .iter()
        .map(|&b| hixl_datadist::BlockFailure {
            src_layer: 2,
            dst_layer: 2,
            src_block: b,
            dst_block: b,
        })
        .collect();
    assert_eq!(*e.failed, want[..], "{e}");
    assert!(e.message.contains("1 of 4 layers did not land"), "{e}");
    assert_eq!(check_landed(&c, &e.failed, 32), 3 * 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_deregistered_cache_fails_exactly_its_layer_tcp() {
    partly_deregistered_cache_fails_exactly_its_layer("tcp").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_deregistered_cache_fails_exactly_its_layer_fabric() {
    partly_deregistered_cache_fails_exactly_its_layer("fabric").await
}

/// The owner dies while a pull of 16 layers is in flight: the error lists what did not land,
/// and every pair it does not list holds the owner's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_mid_pull_fails_only_what_did_not_land() {
    // 32 tensors (16 layers) × 64 blocks × 128 KiB: 256 MiB.
    let geometry = (32, 64, 128 << 10);
    let (dd, c, mut owner) = link_to_owner("tcp", geometry).await;
    let all: Vec<u64> = (0..64).collect();
    let ext = KvCacheExtParam::default();
    let pull = dd.pull_kv_blocks(key(), &c, &all, &all, &ext);
    let kill = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        owner.proc.kill().unwrap();
    };
    let (r, ()) = tokio::join!(pull, kill);
    match r {
        Ok(()) => {
            // Finished before the kill: everything landed.
            assert_eq!(check_landed(&c, &[], 64), 16 * 64);
        }
        Err(e) => {
            assert!(!e.failed.is_empty(), "a failure names its pairs: {e}");
            let landed = check_landed(&c, &e.failed, 64);
            assert_eq!(landed + e.failed.len(), 16 * 64, "{e}");
            assert_eq!(e.failed.len() % 64, 0, "whole layers: {e}");
        }
    }
}
