//! Shared pieces of the hardware tests: device selection by `HIXL_VERBS_DEVICE`, a connected
//! pair of QPs, patterns and checksums, and waiting for completions.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::time::Duration;

use hixl_core::{Access, PartResult, Token};
use hixl_verbs::{Context, Cq, ProtectionDomain, QpConfig, QueuePair, RegisteredBuffer};

/// The env var naming the device the hardware tests use.
pub const DEVICE_VAR: &str = "HIXL_VERBS_DEVICE";

/// The device to test on, or `None` after saying (once per test binary) that the hardware
/// tests skip. The note goes straight to stderr so that libtest's capture does not hide it.
pub fn device(test: &str) -> Option<String> {
    static SAID: std::sync::Once = std::sync::Once::new();
    match std::env::var(DEVICE_VAR) {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "hixl-verbs: hardware tests skipped (first: {test}): set {DEVICE_VAR}=<device>, \
                     e.g. rxe0 inside the Soft-RoCE guest (tools/verbs-tests.sh does this)"
                );
            });
            None
        }
    }
}

/// Opens the device or skips the test.
#[macro_export]
macro_rules! require_device {
    ($name:expr) => {
        match common::device($name) {
            Some(d) => d,
            None => return,
        }
    };
}

/// One side: device, PD and CQ.
pub struct Side {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: Cq,
}

impl Side {
    pub fn open(dev: &str, cq_entries: u32) -> Side {
        let ctx = Context::open(dev).expect("open device");
        let pd = ProtectionDomain::new(&ctx).expect("alloc pd");
        let cq = Cq::new(&ctx, cq_entries).expect("create cq");
        Side { ctx, pd, cq }
    }

    pub fn buffer(&self, len: usize) -> RegisteredBuffer {
        RegisteredBuffer::new(&self.pd, len, Access::REMOTE_RW).expect("register buffer")
    }

    pub fn qp(&self, cfg: QpConfig) -> QueuePair {
        QueuePair::new(&self.pd, &self.cq, cfg).expect("create qp")
    }
}

/// The local ACK timeout exponent the tests give the emulated device at the least: 18,
/// about 1.07 s per try. The default 14 (67 ms) suits hardware, but Soft-RoCE in a TCG guest
/// moves about 40 MB/s, so one 2 MiB READ takes 50 ms alone and longer while the host is
/// busy; its requester then retransmits, and rdma_rxe (kernel 6.1) has been seen to leave
/// such a READ without a completion for a minute. Slow emulation is not a lost packet.
pub const EMULATED_TIMEOUT: u8 = 18;

/// Two RC QPs of one process connected to each other (each on its own CQ), with at least
/// [`EMULATED_TIMEOUT`].
pub fn connected_pair(
    dev: &str,
    a_cfg: QpConfig,
    b_cfg: QpConfig,
) -> (Side, QueuePair, Side, QueuePair) {
    let slow = |c: QpConfig| QpConfig {
        timeout: c.timeout.max(EMULATED_TIMEOUT),
        ..c
    };
    let a = Side::open(dev, 8192);
    let b = Side::open(dev, 8192);
    let mut qa = a.qp(slow(a_cfg));
    let mut qb = b.qp(slow(b_cfg));
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    qa.connect(&eb).expect("connect a");
    qb.connect(&ea).expect("connect b");
    (a, qa, b, qb)
}

/// Deterministic bytes for `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// FNV-1a over 8-byte words (fast enough under TCG).
/// `len` bytes of `fill`'s pattern for `seed`.
pub fn filled(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seed);
    v
}

pub fn checksum(buf: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in buf.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Waits for `n` completions on `cq` (panics after `timeout`, naming what is missing).
pub fn wait(cq: &Cq, n: usize, timeout: Duration) -> Vec<PartResult> {
    let mut out = Vec::with_capacity(n);
    cq.wait_for(&mut out, n, timeout);
    assert!(
        out.len() >= n,
        "only {} of {n} completions within {timeout:?}",
        out.len()
    );
    out
}

/// Asserts every token in `0..n` completed exactly once, successfully.
pub fn assert_all_ok(out: &[PartResult], tokens: impl IntoIterator<Item = u64>) {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (t, r) in out {
        if let Err(e) = r {
            panic!("op {:#x} failed: {e}", t.0);
        }
        *seen.entry(t.0).or_default() += 1;
    }
    let mut want = 0;
    for t in tokens {
        want += 1;
        assert_eq!(
            seen.get(&t),
            Some(&1),
            "token {t:#x} must complete exactly once"
        );
    }
    assert_eq!(out.len(), want, "no completions beyond the posted ops");
}

/// A token for op `i`.
pub fn tok(i: u64) -> Token {
    Token(i)
}
