//! Seeds and randomness: the seeded generator, run parameters from the environment.

use crate::ROUNDS;

/// xorshift64*, seeded through splitmix64.
#[derive(Debug, Clone)]
pub(crate) struct Rng(pub(crate) u64);

pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(splitmix(seed) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub(crate) fn env_u64(key: &str) -> Option<u64> {
    let v = std::env::var(key).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// The run's seed: `HIXL_CANCEL_SEED`, else the clock.
pub(crate) fn seed(test: &str) -> u64 {
    let s = env_u64("HIXL_CANCEL_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        splitmix(t ^ u64::from(std::process::id()))
    });
    eprintln!("{test}: seed {s:#x} (replay with HIXL_CANCEL_SEED={s:#x})");
    s
}

pub(crate) fn rounds() -> usize {
    env_u64("HIXL_CANCEL_ROUNDS").map_or(ROUNDS, |r| r.max(1) as usize)
}

/// Fills `buf` with bytes drawn from `seed`.
pub(crate) fn fill(buf: &mut [u8], seed: u64) {
    let mut r = Rng::new(seed);
    let mut words = buf.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&r.next().to_le_bytes());
    }
    let last = r.next().to_le_bytes();
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}
