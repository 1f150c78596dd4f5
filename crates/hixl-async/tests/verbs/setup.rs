//! The device, engines over it, test patterns and checksums, connecting, the runtime.

use hixl_async::{Engine, Peer, Region};

use crate::{DEVICE_VAR, T};

pub(crate) fn device(test: &str) -> Option<String> {
    match std::env::var(DEVICE_VAR) {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            eprintln!("{test}: skipped ({DEVICE_VAR} is not set; tools/verbs-tests.sh runs it in the Soft-RoCE guest)");
            None
        }
    }
}

/// An engine on the device. `hixl.VerbsTimeout` 18 (about 1.07 s per try, 67 ms by default):
/// Soft-RoCE in a TCG guest is slow enough that a large READ outlasts the default and is
/// retransmitted, which rdma_rxe does not always survive.
pub(crate) async fn engine(dev: &str) -> Engine {
    Engine::builder("127.0.0.1")
        .ephemeral_port()
        .option("hixl.Transport", "verbs")
        .option("hixl.VerbsDevice", dev)
        .option("hixl.VerbsTimeout", "18")
        .build()
        .await
        .expect("engine with the verbs backend")
}

/// Fills `out` with the bytes at positions `off..` of pattern `seed`: the little-endian bytes
/// of one word per 8 positions (word-wise, so that 64 MiB is quick in a debug build in a TCG
/// guest).
pub(crate) fn pattern(seed: u64, off: u64, out: &mut [u8]) {
    let word = |w: u64| (w.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed).to_le_bytes();
    let mut at = 0usize;
    while at < out.len() {
        let p = off + at as u64;
        let (w, skip) = (p / 8, (p % 8) as usize);
        let n = (8 - skip).min(out.len() - at);
        out[at..at + n].copy_from_slice(&word(w)[skip..skip + n]);
        at += n;
    }
}

/// FNV-1a over 8-byte words (and the tail bytes).
pub(crate) fn checksum(b: &[u8]) -> u64 {
    let mut it = b.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for c in &mut it {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x100_0000_01b3);
    }
    it.remainder()
        .iter()
        .fold(h, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

pub(crate) fn region_bytes(r: &Region, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    r.read_at(off, &mut v).expect("read region");
    v
}

pub(crate) async fn connect(e: &Engine, addr: &str) -> Peer {
    let p = e.connect(addr, T).await.expect("connect");
    assert!(
        p.transport().starts_with("verbs"),
        "transport: {}",
        p.transport()
    );
    println!("transport: {}", p.transport());
    p
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}
