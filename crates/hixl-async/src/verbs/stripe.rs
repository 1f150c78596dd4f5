//! How an op is spread over a link's rails: long descriptors are cut into slices, each slice
//! goes to the queue pair with the fewest bytes outstanding among the rails that may take it.
//! Pure: tested without devices.

/// Most slices one descriptor is cut into: beyond it the slices grow instead.
pub(crate) const MAX_SLICES: u64 = 1024;

/// The slices of a descriptor of `len` bytes, as `(offset, len)`: slices of `slice` bytes
/// (the last one shorter), or larger ones when there would be more than [`MAX_SLICES`]; a
/// descriptor no longer than `slice` is one slice.
pub(crate) fn cut(len: u64, slice: u64) -> impl Iterator<Item = (u64, u64)> {
    let size = slice.max(len.div_ceil(MAX_SLICES)).max(1);
    let n = len.div_ceil(size).max(1);
    (0..n).map(move |i| {
        let off = i * size;
        (off, size.min(len - off.min(len)))
    })
}

/// How many slices [`cut`] makes.
pub(crate) fn count(len: u64, slice: u64) -> u64 {
    let size = slice.max(len.div_ceil(MAX_SLICES)).max(1);
    len.div_ceil(size).max(1)
}

/// The candidate with the least load (ties: the first), or `None` when there is none.
pub(crate) fn least_loaded<K: Copy>(candidates: impl Iterator<Item = (K, u64)>) -> Option<K> {
    let mut best: Option<(K, u64)> = None;
    for (k, load) in candidates {
        if best.map_or(true, |(_, b)| load < b) {
            best = Some((k, load));
        }
    }
    best.map(|(k, _)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_descriptor_exactly_once() {
        for (len, slice) in [
            (1u64, 4096u64),
            (4096, 4096),
            (4097, 4096),
            (1 << 20, 256 << 10),
            (3 << 20 | 17, 256 << 10),
            (1 << 40, 4096),
        ] {
            let v: Vec<_> = cut(len, slice).collect();
            assert_eq!(v.len() as u64, count(len, slice), "{len} {slice}");
            assert!(v.len() as u64 <= MAX_SLICES);
            let mut at = 0;
            for (off, l) in v {
                assert_eq!(off, at);
                assert!(l > 0);
                at += l;
            }
            assert_eq!(at, len);
        }
        assert_eq!(cut(1 << 20, 256 << 10).count(), 4);
        assert_eq!(
            cut(64 << 10, 256 << 10).collect::<Vec<_>>(),
            [(0, 64 << 10)]
        );
    }

    #[test]
    fn the_least_loaded_candidate_wins_and_ties_go_to_the_first() {
        assert_eq!(
            least_loaded([(0, 5u64), (1, 3), (2, 3)].into_iter()),
            Some(1)
        );
        assert_eq!(least_loaded(std::iter::empty::<(u8, u64)>()), None);
        // Slices placed one by one, each adding its bytes, spread evenly over four queues.
        let mut load = [0u64; 4];
        for _ in 0..8 {
            let k = least_loaded(load.iter().copied().enumerate()).unwrap();
            load[k] += 100;
        }
        assert_eq!(load, [200; 4]);
    }
}
