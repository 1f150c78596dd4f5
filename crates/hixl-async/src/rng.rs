//! The engine's randomness: rkeys and other ids drawn from the OS CSPRNG (the sans-io core
//! takes them through `RkeySource`, never from the OS itself).

use std::sync::atomic::{AtomicU64, Ordering};

use hixl_core::region::RkeySource;

/// The last value drawn, stirred by every draw: what a draw continues from in the one case
/// the OS refuses (it never does on a Linux that booted past its entropy pool's first fill).
static STREAM: AtomicU64 = AtomicU64::new(0);

/// SplitMix64's output function: a bijection that spreads every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Checks that the OS gives randomness, once, when an engine is built: an engine never runs
/// on keys the OS did not seed.
///
/// # Errors
/// The OS's error when it gives none.
pub(crate) fn probe() -> std::io::Result<()> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b)
        .map_err(|e| std::io::Error::other(format!("the OS gives no randomness: {e}")))?;
    STREAM.fetch_xor(u64::from_ne_bytes(b), Ordering::Relaxed);
    Ok(())
}

/// A random u64 from the OS CSPRNG; should the OS refuse after [`probe`] succeeded, the next
/// value of a stream seeded by every earlier draw.
pub(crate) fn random_u64() -> u64 {
    const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut b = [0u8; 8];
    match getrandom::getrandom(&mut b) {
        Ok(()) => {
            let v = u64::from_ne_bytes(b);
            STREAM.fetch_xor(v.rotate_left(23), Ordering::Relaxed);
            v
        }
        Err(e) => {
            tracing::warn!("the OS refused randomness ({e}); continuing the seeded stream");
            mix(STREAM
                .fetch_add(GOLDEN, Ordering::Relaxed)
                .wrapping_add(GOLDEN))
        }
    }
}

/// Rkeys from [`random_u64`].
#[derive(Debug, Default)]
pub(crate) struct OsRkeys;

impl RkeySource for OsRkeys {
    fn next_rkey(&mut self) -> u64 {
        random_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ_and_the_mix_is_a_bijection_on_samples() {
        probe().unwrap();
        let a: std::collections::HashSet<u64> = (0..1000).map(|_| random_u64()).collect();
        assert_eq!(a.len(), 1000);
        let m: std::collections::HashSet<u64> = (0..1000u64).map(mix).collect();
        assert_eq!(m.len(), 1000);
    }
}
