//! The data pattern of `hixl soak`: byte `pos` of a region as written by generation `gen`,
//! so that a byte's value says which WRITE put it there; and the workload's random numbers.

pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of generation `gen` in region `region`; word `w` of it is `mix(key ^ w)`.
fn key(gen: u64, region: u8) -> u64 {
    gen.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ (u64::from(region) << 62)
}

/// Fills `buf` with what generation `gen` puts at region offsets `pos..`.
pub(super) fn fill(buf: &mut [u8], gen: u64, region: u8, pos: u64) {
    let k = key(gen, region);
    let head = (((8 - pos % 8) % 8) as usize).min(buf.len());
    let (h, body) = buf.split_at_mut(head);
    if head > 0 {
        let w = mix(k ^ (pos / 8)).to_le_bytes();
        let from = (pos % 8) as usize;
        h.copy_from_slice(&w[from..from + head]);
    }
    let first = (pos + head as u64) / 8;
    let mut chunks = body.chunks_exact_mut(8);
    let mut w = first;
    for c in &mut chunks {
        c.copy_from_slice(&mix(k ^ w).to_le_bytes());
        w += 1;
    }
    let tail = chunks.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&mix(k ^ w).to_le_bytes()[..n]);
}

/// The first index where `buf` differs from generation `gen` at region offsets `pos..`.
pub(super) fn check(buf: &[u8], gen: u64, region: u8, pos: u64) -> Option<usize> {
    let k = key(gen, region);
    let head = (((8 - pos % 8) % 8) as usize).min(buf.len());
    let mut want = [0u8; 8];
    let first_diff = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
    if head > 0 {
        let w = mix(k ^ (pos / 8)).to_le_bytes();
        let from = (pos % 8) as usize;
        want[..head].copy_from_slice(&w[from..from + head]);
        if let Some(i) = first_diff(&buf[..head], &want[..head]) {
            return Some(i);
        }
    }
    let mut w = (pos + head as u64) / 8;
    let mut i = head;
    let mut chunks = buf[head..].chunks_exact(8);
    for c in &mut chunks {
        let e = mix(k ^ w);
        if u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) != e {
            return first_diff(c, &e.to_le_bytes()).map(|j| i + j);
        }
        w += 1;
        i += 8;
    }
    let tail = chunks.remainder();
    first_diff(tail, &mix(k ^ w).to_le_bytes()[..tail.len()]).map(|j| i + j)
}

pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(mix(seed))
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n.max(1))) >> 64) as u64
    }
    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
    /// Log-uniform from 1 to `max`: a power-of-two band, then any size inside it.
    pub(super) fn size(&mut self, max: u64) -> u64 {
        let bands = 64 - u64::from(max.leading_zeros());
        let e = self.below(bands);
        let lo = 1u64 << e;
        (lo + self.below(lo)).clamp(1, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_position_dependent_and_checkable_at_any_offset() {
        let mut a = vec![0u8; 1000];
        fill(&mut a, 7, 1, 13);
        assert_eq!(check(&a, 7, 1, 13), None);
        // A sub-range starting anywhere matches the same pattern at its own offset.
        assert_eq!(check(&a[5..900], 7, 1, 18), None);
        assert_eq!(check(&a, 8, 1, 13), Some(0));
        assert_eq!(check(&a, 7, 0, 13), Some(0));
        let mut b = a.clone();
        b[777] ^= 0x40;
        assert_eq!(check(&b, 7, 1, 13), Some(777));
        assert_eq!(check(&a[1..], 7, 1, 13).map(|_| ()), Some(()));
    }

    #[test]
    pub(super) fn sizes_span_bytes_to_the_maximum() {
        let mut rng = Rng::new(1);
        let sizes: Vec<u64> = (0..10_000).map(|_| rng.size(4 << 20)).collect();
        assert!(sizes.iter().all(|&s| (1..=4 << 20).contains(&s)));
        assert!(sizes.iter().any(|&s| s < 16));
        assert!(sizes.iter().any(|&s| s > 2 << 20));
        assert!(sizes.iter().any(|&s| s % 8 != 0));
    }
}
