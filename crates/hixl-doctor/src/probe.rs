//! The short probe of `hixl doctor`: WRITE throughput and small-WRITE latency through hixl,
//! then the same through a raw TCP stream to the peer's side endpoint (the `hixl serve
//! --baseline` protocol), between the same two hosts in the same run.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hixl_async::Peer;
use hixl_core::{OpDesc, TransferOp};

/// The bytes of one small call (the latency probe).
pub const SMALL: u64 = 4096;

/// What the probe moves.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Bytes per call.
    pub per_call: u64,
    /// Bytes per descriptor (and per raw TCP write).
    pub block: u64,
    /// How long each measurement runs (at least 3 calls).
    pub dur: Duration,
}

/// Throughput (GB/s) and small-call latency (p50 µs) of one path.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    /// GB/s of `per_call`-byte calls.
    pub gbps: f64,
    /// p50 of `SMALL`-byte calls, µs.
    pub p50_us: f64,
}

/// The `p` quantile (0..=1) of ascending `sorted`, by nearest rank; 0 for no samples (the
/// one the command's benchmarks use too).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Times `call` for `dur` (after a few warm-up calls): (calls per second, p50 µs).
async fn timed<F, Fut, E>(dur: Duration, mut call: F) -> Result<(f64, f64), E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
{
    for _ in 0..3 {
        call().await?;
    }
    let mut lat = Vec::new();
    let start = Instant::now();
    while start.elapsed() < dur || lat.len() < 3 {
        let t = Instant::now();
        call().await?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok((lat.len() as f64 / secs, percentile(&lat, 0.5)))
}

/// hixl WRITEs from `local` (at least `per_call` bytes registered) to `remote` (as large).
///
/// # Errors
/// The transfer's failure, in words.
pub async fn hixl(peer: &Peer, local: u64, remote: u64, p: Plan) -> Result<Figures, String> {
    let n = (p.per_call / p.block).max(1);
    let descs: Vec<OpDesc> = (0..n)
        .map(|i| {
            let off = i * p.block;
            // The peer's table says where `remote` is: never trusted to be in range.
            OpDesc::new(local + off, remote.wrapping_add(off), p.block)
        })
        .collect();
    let (rate, _) = timed(p.dur, || peer.transfer(TransferOp::Write, &descs))
        .await
        .map_err(|e| e.to_string())?;
    let small = [OpDesc::new(local, remote, SMALL)];
    let (_, p50) = timed(p.dur / 4, || peer.transfer(TransferOp::Write, &small))
        .await
        .map_err(|e| e.to_string())?;
    Ok(Figures {
        gbps: rate * (n * p.block) as f64 / 1e9,
        p50_us: p50,
    })
}

/// A raw TCP stream to the side endpoint's sink, `per_call` bytes a call, acked.
fn sink(side: SocketAddr, per_call: u64, block: u64) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&side, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut h = [0u8; 17];
    h[0] = b'W';
    h[1..9].copy_from_slice(&per_call.to_le_bytes());
    h[9..17].copy_from_slice(&block.to_le_bytes());
    s.write_all(&h)?;
    Ok(s)
}

/// One raw call: the bytes in block-sized writes, then the one-byte ack.
fn raw_call(s: &mut TcpStream, buf: &[u8], block: usize) -> std::io::Result<()> {
    for c in buf.chunks(block.max(1)) {
        s.write_all(c)?;
    }
    let mut one = [0u8; 1];
    s.read_exact(&mut one)
}

/// The same through raw TCP to the side endpoint at `side` (blocking: on its own thread).
///
/// # Errors
/// The connection's failure, in words.
pub async fn raw_tcp(side: SocketAddr, p: Plan) -> Result<Figures, String> {
    tokio::task::spawn_blocking(move || -> std::io::Result<Figures> {
        let rt = tokio::runtime::Builder::new_current_thread().build()?;
        let mut big = sink(side, p.per_call, p.block)?;
        let buf = vec![7u8; p.per_call as usize];
        let block = p.block as usize;
        let (rate, _) = rt.block_on(timed(p.dur, || {
            std::future::ready(raw_call(&mut big, &buf, block))
        }))?;
        let mut small = sink(side, SMALL, SMALL)?;
        let one = vec![7u8; SMALL as usize];
        let (_, p50) = rt.block_on(timed(p.dur / 4, || {
            std::future::ready(raw_call(&mut small, &one, SMALL as usize))
        }))?;
        Ok(Figures {
            gbps: rate * p.per_call as f64 / 1e9,
            p50_us: p50,
        })
    })
    .await
    .map_err(|e| format!("raw TCP probe thread: {e}"))?
    .map_err(|e| format!("raw TCP to {side}: {e}"))
}
