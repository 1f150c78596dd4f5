//! The lease race, reproduced between two real processes: a decode (this binary re-run as a
//! child) pulls a prefill's leased blocks while the lease ends under it (its window passes,
//! its short TTL runs out, the prefill revokes it, or the pull reports done), and the prefill
//! (this process) overwrites the blocks with the next request's bytes the instant the end
//! event arrives. The window is swept across the pull's measured duration, many rounds.
//!
//! Pass means: every pull that returned `Ok` holds exactly its request's bytes; every failed
//! pull's unlisted pairs hold exactly them (or, when it lists none, nothing moved); and no
//! destination byte changes after the pull returned, once the owner's reuse is complete.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, ClusterInfo, DataType, KvCacheExtParam, LeaseGrant,
    LlmDataDist, LlmRole,
};

const T: Duration = Duration::from_secs(30);
const OWNER: u64 = 1;
const PULLER: u64 = 2;
const GUARD: u64 = 0xEE;
/// The puller's window when the window is not what a round sweeps.
const LONG_WINDOW_MS: u64 = 20_000;

fn key() -> BlocksCacheKey {
    BlocksCacheKey {
        cluster_id: OWNER,
        model_id: 0,
    }
}

/// `tensors` tensors (two per layer) of `blocks` blocks of `block` bytes.
#[derive(Clone, Copy)]
struct Geometry {
    tensors: u32,
    blocks: u64,
    block: u64,
}

impl Geometry {
    fn desc(self) -> CacheDesc {
        CacheDesc::host(
            self.tensors,
            DataType::UInt8,
            vec![self.blocks as i64, self.block as i64],
        )
    }

    fn encode(self) -> String {
        format!("{},{},{}", self.tensors, self.blocks, self.block)
    }

    fn decode(s: &str) -> Geometry {
        let v: Vec<u64> = s.split(',').map(|x| x.parse().unwrap()).collect();
        Geometry {
            tensors: v[0] as u32,
            blocks: v[1],
            block: v[2],
        }
    }
}

/// Block `b` of tensor `t` under `seed`: every byte the same, different for every seed.
fn byte(seed: u64, t: usize, b: u64) -> u8 {
    (seed.wrapping_mul(131) ^ (t as u64).wrapping_mul(31) ^ b.wrapping_mul(7)) as u8 | 1
}

fn fill(c: &Cache, seed: u64, blocks: &[u64]) {
    let stride = c.desc.stride().unwrap();
    for t in 0..c.tensor_addrs.len() {
        for &b in blocks {
            let v = vec![byte(seed, t, b); stride as usize];
            c.tensor(t).unwrap().write_at(b * stride, &v).unwrap();
        }
    }
}

/// Every tensor of the cache, read out into `into` (one buffer per tensor, kept between
/// calls).
fn snapshot(c: &Cache, into: &mut Vec<Vec<u8>>) {
    let size = c.desc.tensor_size().unwrap() as usize;
    into.resize_with(c.tensor_addrs.len(), || vec![0u8; size]);
    for (t, v) in into.iter_mut().enumerate() {
        c.tensor(t).unwrap().read_at(0, v).unwrap();
    }
}

/// Whether block `b` of tensor `t` of `snap` holds `seed`'s bytes.
fn holds(snap: &[Vec<u8>], stride: usize, seed: u64, t: usize, b: u64) -> bool {
    // one comparison of slices (a memcmp even unoptimized), not a loop over bytes
    let want = vec![byte(seed, t, b); stride];
    snap[t][b as usize * stride..(b as usize + 1) * stride] == want[..]
}

fn say(line: String) {
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

async fn started(cluster: u64, role: LlmRole, transport: &str, window_ms: u64) -> LlmDataDist {
    let window = window_ms.to_string();
    let mut opts = vec![
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("llm.SyncKvCacheWaitTime", window.as_str()),
        ("hixl.Transport", transport),
    ];
    let device = std::env::var("HIXL_VERBS_DEVICE").unwrap_or_default();
    if transport == "verbs" {
        // Soft-RoCE in a TCG guest: a large READ outlasts the default retry timeout.
        opts.extend([
            ("hixl.VerbsDevice", device.as_str()),
            ("hixl.VerbsTimeout", "18"),
        ]);
    }
    let mut dd = LlmDataDist::new(cluster, role);
    dd.initialize(&opts).await.unwrap();
    dd
}

/// The puller's entry (ignored as a test: `Puller::spawn` runs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the puller role of the lease race; Puller::spawn runs it"]
async fn puller_entry() {
    let Ok(transport) = std::env::var("HIXL_RACE_TRANSPORT") else {
        return;
    };
    let g = Geometry::decode(&std::env::var("HIXL_RACE_GEOMETRY").unwrap());
    let window: u64 = std::env::var("HIXL_RACE_WINDOW_MS")
        .unwrap()
        .parse()
        .unwrap();
    let dd = started(PULLER, LlmRole::Decoder, &transport, window).await;
    let c = dd.allocate_kv_cache(g.desc(), None).await.unwrap();
    let stride = c.desc.stride().unwrap() as usize;
    let all: Vec<u64> = (0..g.blocks).collect();
    let layers = c.tensor_addrs.len() / 2;
    let ext = KvCacheExtParam {
        tensor_num_per_layer: 2,
        ..Default::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    say("READY -".into());
    let (mut returned, mut now) = (Vec::new(), Vec::new());
    while let Some(l) = rx.recv().await {
        let mut w = l.splitn(3, ' ');
        match (w.next(), w.next(), w.next()) {
            (Some("link"), Some(addr), _) => {
                let ci = ClusterInfo {
                    remote_cluster_id: OWNER,
                    remote_addr: addr.to_string(),
                };
                let r = dd.link_clusters(&[ci], T).await.unwrap();
                say(format!("LINKED {}", r[0].is_ok()));
            }
            (Some("guard"), _, _) => {
                fill(&c, GUARD, &all);
                say("GUARDED".into());
            }
            // pull <seed> <grant json>: done with the pull, so a success ends the lease
            (Some("pull"), Some(seed), Some(grant)) => {
                let seed: u64 = seed.parse().unwrap();
                let grant: LeaseGrant = serde_json::from_str(grant).unwrap();
                let t0 = Instant::now();
                let r = dd
                    .pull_leased_blocks(&grant, key(), &c, &all, &all, &ext, true)
                    .await;
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                snapshot(&c, &mut returned);
                let failed: &[hixl_datadist::BlockFailure] = match &r {
                    Ok(()) => &[],
                    Err(e) => &e.failed,
                };
                // What each (layer, block) pair must hold: the request's bytes unless the
                // error lists it; the guard when the error lists nothing (nothing moved).
                let mut bad = Vec::new();
                for layer in 0..layers {
                    for &b in &all {
                        let listed = failed
                            .iter()
                            .any(|f| f.dst_layer == layer as u32 && f.dst_block == b);
                        let want = match (&r, listed) {
                            (_, true) => continue,
                            (Err(_), false) if failed.is_empty() => GUARD,
                            _ => seed,
                        };
                        if ![2 * layer, 2 * layer + 1]
                            .into_iter()
                            .all(|t| holds(&returned, stride, want, t, b))
                        {
                            bad.push(format!("({layer},{b})"));
                        }
                    }
                }
                let status = match &r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.status.name().to_string(),
                };
                say(format!(
                    "PULLED {status} {ms:.1} {} {} {}",
                    failed.len(),
                    bad.len(),
                    bad.iter().take(8).cloned().collect::<Vec<_>>().join(",")
                ));
            }
            // recheck: whether any byte changed since the last pull returned
            (Some("recheck"), _, _) => {
                snapshot(&c, &mut now);
                let changed = (0..now.len())
                    .flat_map(|t| all.iter().map(move |&b| (t, b as usize)))
                    .filter(|&(t, b)| {
                        now[t][b * stride..(b + 1) * stride]
                            != returned[t][b * stride..(b + 1) * stride]
                    })
                    .count();
                say(format!("RECHECKED {changed}"));
            }
            _ => say(format!("UNKNOWN {l}")),
        }
    }
}

struct Puller {
    proc: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Puller {
    async fn spawn(transport: &str, g: Geometry, window_ms: u64, owner: &str) -> Puller {
        let mut proc = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "puller_entry",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("HIXL_RACE_TRANSPORT", transport)
            .env("HIXL_RACE_GEOMETRY", g.encode())
            .env("HIXL_RACE_WINDOW_MS", window_ms.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = proc.stdin.take().unwrap();
        let out = BufReader::new(proc.stdout.take().unwrap());
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut p = Puller { proc, stdin, lines };
        p.expect("READY ").await;
        assert_eq!(p.ask(&format!("link {owner}"), "LINKED ").await, "true");
        p
    }

    /// Sends `line`; the rest of the next output line that contains `tag`.
    async fn ask(&mut self, line: &str, tag: &str) -> String {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        self.expect(tag).await
    }

    async fn expect(&mut self, tag: &str) -> String {
        loop {
            let l = tokio::time::timeout(T, self.lines.recv())
                .await
                .unwrap_or_else(|_| panic!("the puller said no {tag:?} in {T:?}"))
                .unwrap_or_else(|| panic!("the puller exited before {tag:?}"));
            if let Some(i) = l.find(tag) {
                return l[i + tag.len()..].trim().to_string();
            }
        }
    }
}

impl Drop for Puller {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// What a pull returned, as the puller saw it.
struct Pulled {
    status: String,
    ms: f64,
    listed: usize,
    bad: usize,
    line: String,
}

fn parse(line: String) -> Pulled {
    let w: Vec<&str> = line.split(' ').collect();
    Pulled {
        status: w[0].to_string(),
        ms: w[1].parse().unwrap(),
        listed: w[2].parse().unwrap(),
        bad: w[3].parse().unwrap(),
        line: line.clone(),
    }
}

/// How a round's lease ends while (or after) the pull runs.
#[derive(Clone, Copy, Debug)]
enum End {
    /// A TTL that runs out as soon as no pull holds a ticket.
    ShortTtl,
    /// The owner revokes the lease this long after handing the grant out.
    Revoke(Duration),
    /// The pull's own done (or, for a failed pull, the TTL after it).
    Done,
}

/// The prefill's side: its cache, and a task that overwrites a lease's blocks with the next
/// request's bytes the instant the lease's end event arrives, then reports the request.
struct Owner {
    dd: LlmDataDist,
    cache: Cache,
    reused: tokio::sync::mpsc::UnboundedReceiver<u64>,
}

/// The bytes a request's blocks are reused for once its lease ends.
fn reuse_seed(request: u64) -> u64 {
    2 * request + 2
}

fn request_seed(request: u64) -> u64 {
    2 * request + 1
}

impl Owner {
    async fn start(transport: &str, g: Geometry) -> Owner {
        let dd = started(OWNER, LlmRole::Prompt, transport, LONG_WINDOW_MS).await;
        let cache = dd.allocate_kv_cache(g.desc(), Some(key())).await.unwrap();
        let mut events = dd.lease_events().unwrap();
        let (tx, reused) = tokio::sync::mpsc::unbounded_channel();
        let writer = cache.clone();
        tokio::spawn(async move {
            while let Some(e) = events.next().await {
                fill(&writer, reuse_seed(e.request_id), &e.blocks);
                if tx.send(e.request_id).is_err() {
                    break;
                }
            }
        });
        Owner { dd, cache, reused }
    }

    /// One round: request `request`'s bytes leased to `puller`, the lease ended by `end`,
    /// the blocks reused at its end event. Returns what the pull returned.
    async fn round(&mut self, puller: &mut Puller, request: u64, end: End, g: Geometry) -> Pulled {
        let all: Vec<u64> = (0..g.blocks).collect();
        puller.ask("guard", "GUARDED").await;
        fill(&self.cache, request_seed(request), &all);
        let ttl = match end {
            End::ShortTtl => Duration::from_millis(20),
            _ => Duration::from_secs(60),
        };
        let grant = self
            .dd
            .lease_blocks(request, &[&self.cache], &all, ttl)
            .unwrap();
        let json = serde_json::to_string(&grant).unwrap();
        let line = format!("pull {} {json}", request_seed(request));
        let pulled = match end {
            End::Revoke(after) => {
                let pull = puller.ask(&line, "PULLED ");
                let revoke = async {
                    tokio::time::sleep(after).await;
                    let _ = self.dd.end_lease(grant.lease_id);
                };
                tokio::join!(pull, revoke).0
            }
            _ => puller.ask(&line, "PULLED ").await,
        };
        let p = parse(pulled);
        if p.status != "ok" && matches!(end, End::Done) {
            // a failed pull sent no done: the prefill gives up on the request
            let _ = self.dd.end_lease(grant.lease_id);
        }
        let got = tokio::time::timeout(T, self.reused.recv())
            .await
            .expect("the lease did not end")
            .expect("the event stream ended");
        assert_eq!(got, request, "leases end in order, one per round");
        p
    }
}

/// The sweep over one transport: the window at fractions of the pull's duration, each with
/// every way of ending the lease, `rounds` rounds each.
async fn sweep(transport: &str, g: Geometry, rounds: u64, factors: &[f64]) {
    let mut owner = Owner::start(transport, g).await;
    let addr = owner.dd.listen_addr().unwrap();
    let mut request = 0u64;
    // The pull's duration, under a long window and a lease that ends by its done.
    let mut long = Puller::spawn(transport, g, LONG_WINDOW_MS, &addr).await;
    let mut took = Vec::new();
    for _ in 0..3 {
        request += 1;
        let p = owner.round(&mut long, request, End::Done, g).await;
        assert_eq!((p.status.as_str(), p.bad), ("ok", 0), "{}", p.line);
        took.push(p.ms);
    }
    took.sort_by(f64::total_cmp);
    let d = took[1];
    eprintln!("lease race over {transport}: a pull of the whole cache takes {d:.1} ms");
    let (mut oks, mut fails, mut listed) = (0, 0, 0);
    for &factor in factors {
        let window = ((d * factor) as u64).max(1);
        let mut p = Puller::spawn(transport, g, window, &addr).await;
        for r in 0..rounds {
            let revoke_at = Duration::from_secs_f64(d * 1e-3 * (r % 4) as f64 / 3.0);
            for end in [End::ShortTtl, End::Revoke(revoke_at), End::Done] {
                request += 1;
                let pulled = owner.round(&mut p, request, end, g).await;
                let what = format!(
                    "{transport}, window {window} ms ({factor}× {d:.1} ms), {end:?}: {}",
                    pulled.line
                );
                assert_eq!(pulled.bad, 0, "a pair reported landed is not exact: {what}");
                let changed = p.ask("recheck", "RECHECKED ").await;
                assert_eq!(
                    changed, "0",
                    "blocks changed after the pull returned: {what}"
                );
                match pulled.status.as_str() {
                    "ok" => oks += 1,
                    _ => {
                        fails += 1;
                        listed += usize::from(pulled.listed > 0);
                    }
                }
            }
        }
    }
    eprintln!("lease race over {transport}: {oks} pulls ok, {fails} failed ({listed} partly)");
    // The sweep crossed the boundary: some pulls ran out of window part-way, some finished.
    assert!(oks > 0 && listed > 0, "{oks} ok, {listed} failed part-way");
}

/// tcp and the fabric, one after the other (each calibrates against its own pull; run side
/// by side they would skew each other's timings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_never_lands_bytes_of_a_reused_lease_tcp_and_fabric() {
    // 8 layers × 64 blocks × 2 × 64 KiB: 64 MiB a pull.
    let g = Geometry {
        tensors: 16,
        blocks: 64,
        block: 64 << 10,
    };
    let factors = [0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.1, 1.2, 3.0];
    sweep("tcp", g, 2, &factors).await;
    sweep("fabric", g, 2, &factors).await;
}

/// Over verbs, in the Soft-RoCE guest (`tools/verbs-tests.sh`); skipped without a device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_never_lands_bytes_of_a_reused_lease_verbs() {
    if std::env::var("HIXL_VERBS_DEVICE").map_or(true, |d| d.is_empty()) {
        eprintln!("skipped: HIXL_VERBS_DEVICE is not set (tools/verbs-tests.sh sets it)");
        return;
    }
    let g = Geometry {
        tensors: 8,
        blocks: 32,
        block: 64 << 10,
    };
    sweep("verbs", g, 1, &[0.2, 0.5, 0.8, 1.0, 1.2, 3.0]).await;
}
