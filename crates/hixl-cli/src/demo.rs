//! `hixl demo`: a target process and this initiator on loopback move one request's KV cache
//! both ways, verify it, and show a notify arriving after the data. The first call of each
//! direction is cold (pages touched for the first time, a fresh mapping), and is shown apart
//! from the warm calls that follow it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hixl::{Engine, HostBuffer, OpDesc};
use hixl_cli::child::Target;

use crate::util::{checksum, fill_pattern, human, CliError, CliResult};

/// Arguments of `hixl demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tokens of llama-3.1-8b KV cache to move (32 layers x 2 x 8 heads x 128 dims x bf16 =
    /// 128 KiB per token).
    #[arg(long, default_value_t = 1024)]
    pub tokens: u64,
    /// Warm calls of each direction after the cold one (the figure is their median).
    #[arg(long, default_value_t = 5)]
    pub warm: u32,
    /// One JSON object on stdout instead of the text (which then goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// llama-3.1-8b: 32 layers, K and V of 8 heads x 128 dims in bf16 (2048 B each per token).
const LAYERS: u64 = 32;
const BYTES_PER_TOKEN_PER_LAYER: u64 = 2 * 2048;

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

/// Prints a line of the text: to stdout, or to stderr when stdout carries the JSON.
struct Say {
    json: bool,
}

impl Say {
    fn line(&self, s: impl std::fmt::Display) {
        if self.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    }
}

/// One direction's calls: the cold one, then the warm ones.
struct Calls {
    cold: Duration,
    warm: Vec<Duration>,
}

impl Calls {
    fn median(&self) -> Duration {
        let mut w = self.warm.clone();
        w.sort();
        w.get(w.len() / 2).copied().unwrap_or(self.cold)
    }

    fn text(&self, op: &str, total: u64) -> String {
        let m = self.median();
        format!(
            "  {op:<5} {}: cold {:.1} ms ({:.2} GB/s, the first call), warm {:.1} ms ({:.2} GB/s, median of {})",
            human(total),
            self.cold.as_secs_f64() * 1e3,
            gbps(total, self.cold),
            m.as_secs_f64() * 1e3,
            gbps(total, m),
            self.warm.len()
        )
    }

    fn json(&self, total: u64) -> serde_json::Value {
        let m = self.median();
        serde_json::json!({
            "cold_ms": self.cold.as_secs_f64() * 1e3,
            "cold_gbps": gbps(total, self.cold),
            "warm_ms": m.as_secs_f64() * 1e3,
            "warm_gbps": gbps(total, m),
            "warm_calls": self.warm.len(),
        })
    }
}

/// Runs the demo.
pub async fn run(a: Args) -> CliResult {
    if a.tokens == 0 || a.tokens > 65536 {
        return Err(CliError(format!(
            "--tokens must be 1..=65536, got {}",
            a.tokens
        )));
    }
    if a.warm == 0 || a.warm > 1000 {
        return Err(CliError(format!("--warm must be 1..=1000, got {}", a.warm)));
    }
    let say = Say { json: a.json };
    let layer = a.tokens * BYTES_PER_TOKEN_PER_LAYER;
    let total = LAYERS * layer;
    say.line(format!(
        "hixl demo: llama-3.1-8b KV cache for {} tokens = {LAYERS} layers x {} = {}",
        a.tokens,
        human(layer),
        human(total)
    ));
    let exe: PathBuf = std::env::current_exe()?;
    let mut target = Target::spawn(&exe, total, &["--pool"])?;
    say.line(format!(
        "  target process {} serving at {} (its KV region is fabric-pool memory)",
        target.pid, target.engine
    ));
    let mut rounds = Vec::new();
    for (i, transport) in ["tcp", "fabric"].into_iter().enumerate() {
        let r = Round {
            transport,
            total,
            layer,
            seed: 0x5eed + i as u64,
            warm: a.warm,
        };
        rounds.push(r.run(&mut target, &say).await?);
    }
    target.stop();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": "llama-3.1-8b",
                "tokens": a.tokens,
                "bytes": total,
                "descriptors": LAYERS,
                "transports": rounds,
                "verified": true,
            })
        );
        return Ok(());
    }
    say.line(
        "demo ok. Next: `hixl bench comm --op both` (tcp) and `hixl bench comm --transport fabric` measure GB/s and latency against same-run baselines;\n\
         the KV-cache layer: `cargo run --release -p hixl-examples --example prefill_decode` (decode pulls each request under a lease, checks every block, and prefill frees blocks when leases end)\n\
         and `hixl bench kv --model llama-3.1-8b --tokens 4096 [--layerwise]`."
    );
    Ok(())
}

/// One transport's round: writes a pattern, has the target verify it on a notify, reads it
/// back and checks it, the cold call and `warm` more of each direction.
struct Round {
    transport: &'static str,
    total: u64,
    layer: u64,
    seed: u64,
    warm: u32,
}

impl Round {
    async fn run(&self, target: &mut Target, say: &Say) -> CliResult<serde_json::Value> {
        let (transport, total, layer) = (self.transport, self.total, self.layer);
        let engine = Engine::builder("127.0.0.1")
            .option("hixl.Transport", transport)
            .build()
            .await?;
        let mut buf = HostBuffer::zeroed(total as usize)?;
        fill_pattern(buf.as_mut_slice(), self.seed);
        let sum = checksum(buf.as_slice());
        let local = engine.register(buf)?;
        let peer = engine
            .connect(&target.engine, Duration::from_secs(5))
            .await?;
        let path = peer.transport().to_string();
        say.line(format!("\n  [{transport}] {path}"));
        let kv = peer
            .region("kv")
            .ok_or_else(|| CliError("target exported no region named kv".into()))?;
        say.line(format!(
            "  initiator connected; the target exported region \"kv\" at {:#x} ({})",
            kv.addr,
            human(kv.len)
        ));
        // one descriptor per layer, as a KV layer-wise transfer would post
        let descs: Vec<OpDesc> = (0..LAYERS)
            .map(|l| OpDesc::new(local.addr() + l * layer, kv.addr + l * layer, layer))
            .collect();

        let mut writes = Calls {
            cold: Duration::ZERO,
            warm: Vec::new(),
        };
        for i in 0..=self.warm {
            let t = Instant::now();
            peer.write(&descs).timeout(Duration::from_secs(60)).await?;
            let wt = t.elapsed();
            if i == 0 {
                writes.cold = wt;
            } else {
                writes.warm.push(wt);
            }
        }
        say.line(writes.text("WRITE", total));

        peer.notify("hixl.verify", format!("0 {total} {sum}"))
            .await?;
        let n = target.wait_line("NOTIFY", Duration::from_secs(10))?;
        say.line(format!(
            "  target received notify: {}",
            n.trim_start_matches("NOTIFY ")
        ));
        let v = target.wait_line("VERIFY", Duration::from_secs(30))?;
        say.line(format!(
            "  target checked its memory on that notify: {}",
            v.trim_start_matches("VERIFY ")
        ));
        if !v.starts_with("VERIFY ok") {
            return Err(CliError(format!(
                "target memory does not match what was written: {v}"
            )));
        }

        let mut reads = Calls {
            cold: Duration::ZERO,
            warm: Vec::new(),
        };
        let zeros = vec![0u8; total as usize];
        let mut back = vec![0u8; total as usize];
        for i in 0..=self.warm {
            // Every read lands on zeros and is checked: each call moved all of it.
            local.write_at(0, &zeros)?;
            let t = Instant::now();
            peer.read(&descs).timeout(Duration::from_secs(60)).await?;
            let rt = t.elapsed();
            local.read_at(0, &mut back)?;
            if checksum(&back) != sum {
                return Err(CliError(format!(
                    "data read back differs from what was written (read {i} over {transport})"
                )));
            }
            if i == 0 {
                reads.cold = rt;
            } else {
                reads.warm.push(rt);
            }
        }
        say.line(format!(
            "{}, every call's data checked",
            reads.text("READ", total)
        ));
        engine.disconnect(&target.engine).await?;
        engine.shutdown(Duration::from_secs(1)).await;
        Ok(serde_json::json!({
            "transport": transport,
            "path": path,
            "write": writes.json(total),
            "read": reads.json(total),
        }))
    }
}
