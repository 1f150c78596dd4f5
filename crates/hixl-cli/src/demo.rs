//! `hixl demo`: a target process and this initiator on loopback move one request's KV cache
//! both ways, verify it, and show a notify arriving after the data.

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
}

/// llama-3.1-8b: 32 layers, K and V of 8 heads x 128 dims in bf16 (2048 B each per token).
const LAYERS: u64 = 32;
const BYTES_PER_TOKEN_PER_LAYER: u64 = 2 * 2048;

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

/// Runs the demo.
pub async fn run(a: Args) -> CliResult {
    if a.tokens == 0 || a.tokens > 65536 {
        return Err(CliError(format!(
            "--tokens must be 1..=65536, got {}",
            a.tokens
        )));
    }
    let layer = a.tokens * BYTES_PER_TOKEN_PER_LAYER;
    let total = LAYERS * layer;
    println!(
        "hixl demo: llama-3.1-8b KV cache for {} tokens = {LAYERS} layers x {} = {}",
        a.tokens,
        human(layer),
        human(total)
    );
    let exe: PathBuf = std::env::current_exe()?;
    let mut target = Target::spawn(&exe, total, &["--pool"])?;
    println!(
        "  target process {} serving at {} (its KV region is fabric-pool memory)",
        target.pid, target.engine
    );
    for (i, transport) in ["tcp", "fabric"].into_iter().enumerate() {
        one_round(&mut target, transport, total, layer, 0x5eed + i as u64).await?;
    }
    target.stop();
    println!(
        "demo ok. Next: `hixl bench comm --op both` (tcp) and `hixl bench comm --transport fabric` measure GB/s and latency against same-run baselines;\n\
         the KV-cache layer: `cargo run --release -p hixl-examples --example prefill_decode` (decode pulls each request under a lease, checks every block, and prefill frees blocks when leases end)\n\
         and `hixl bench kv --model llama-3.1-8b --tokens 4096 [--layerwise]`."
    );
    Ok(())
}

/// Writes a pattern over `transport`, has the target verify it on a notify, reads it back.
async fn one_round(
    target: &mut Target,
    transport: &str,
    total: u64,
    layer: u64,
    seed: u64,
) -> CliResult {
    let engine = Engine::builder("127.0.0.1")
        .option("hixl.Transport", transport)
        .build()
        .await?;
    let mut buf = HostBuffer::zeroed(total as usize)?;
    fill_pattern(buf.as_mut_slice(), seed);
    let sum = checksum(buf.as_slice());
    let local = engine.register(buf)?;
    let peer = engine
        .connect(&target.engine, Duration::from_secs(5))
        .await?;
    println!("\n  [{transport}] {}", peer.transport());
    let kv = peer
        .region("kv")
        .ok_or_else(|| CliError("target exported no region named kv".into()))?;
    println!(
        "  initiator connected; the target exported region \"kv\" at {:#x} ({})",
        kv.addr,
        human(kv.len)
    );
    // one descriptor per layer, as a KV layer-wise transfer would post
    let descs: Vec<OpDesc> = (0..LAYERS)
        .map(|l| OpDesc::new(local.addr() + l * layer, kv.addr + l * layer, layer))
        .collect();

    let t = Instant::now();
    peer.write(&descs).timeout(Duration::from_secs(60)).await?;
    let wt = t.elapsed();
    println!(
        "  WRITE {} in {:.1} ms: {:.2} GB/s",
        human(total),
        wt.as_secs_f64() * 1e3,
        gbps(total, wt)
    );

    peer.notify("hixl.verify", format!("0 {total} {sum}"))
        .await?;
    let n = target.wait_line("NOTIFY", Duration::from_secs(10))?;
    println!(
        "  target received notify: {}",
        n.trim_start_matches("NOTIFY ")
    );
    let v = target.wait_line("VERIFY", Duration::from_secs(30))?;
    println!(
        "  target checked its memory on that notify: {}",
        v.trim_start_matches("VERIFY ")
    );
    if !v.starts_with("VERIFY ok") {
        return Err(CliError(format!(
            "target memory does not match what was written: {v}"
        )));
    }

    local.write_at(0, &vec![0u8; total as usize])?;
    let t = Instant::now();
    peer.read(&descs).timeout(Duration::from_secs(60)).await?;
    let rt = t.elapsed();
    let mut back = vec![0u8; total as usize];
    local.read_at(0, &mut back)?;
    let ok = checksum(&back) == sum;
    println!(
        "  READ  {} in {:.1} ms: {:.2} GB/s, checksum {}",
        human(total),
        rt.as_secs_f64() * 1e3,
        gbps(total, rt),
        if ok { "matches" } else { "MISMATCH" }
    );
    if !ok {
        return Err(CliError(
            "data read back differs from what was written".into(),
        ));
    }
    engine.disconnect(&target.engine).await?;
    engine.shutdown(Duration::from_secs(1)).await;
    Ok(())
}
