//! The per-offset patterns that fill both regions and every transfer.

pub(crate) fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The bytes of pattern `seed` at offsets `off..off + len`: byte `o` depends only on the seed
/// and `o`, so any sub-range can be checked on its own.
pub(crate) fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    let skip = (off % 8) as usize;
    let mut v = Vec::with_capacity(len + 16);
    let mut w = off / 8;
    while v.len() < skip + len {
        v.extend_from_slice(&splitmix(seed ^ w.wrapping_mul(0xD1B5_4A32_D192_ED03)).to_le_bytes());
        w += 1;
    }
    v.drain(..skip);
    v.truncate(len);
    v
}
