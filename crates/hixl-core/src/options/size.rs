//! Integers and byte sizes as option values.

/// A non-empty run of ASCII digits as a `u64` (no sign, no whitespace); `None` on overflow.
pub(super) fn parse_uint(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses a byte size: digits with an optional `K`, `M` or `G` suffix (powers of 1024; `Ki`,
/// `KiB`, `KB` and a bare `B` are accepted too, case-insensitively), e.g. `"512K"`, `"2MiB"`,
/// `"1048576"`. Returns `None` for anything else, or if the size overflows `u64`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at_checked(end)?;
    let mult: u64 = match suffix.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kb" | "kib" => 1 << 10,
        "m" | "mi" | "mb" | "mib" => 1 << 20,
        "g" | "gi" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    parse_uint(num)?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{GIB, MIB};

    #[test]
    fn sizes() {
        #[rustfmt::skip]
        let good = [("1048576", MIB), ("512K", 512 << 10), ("2M", 2 * MIB), ("2mib", 2 * MIB),
            ("1 GiB", GIB), ("4KB", 4096), ("4096b", 4096), (" 3Mi ", 3 * MIB)];
        for (s, n) in good {
            assert_eq!(parse_size(s), Some(n), "{s}");
        }
        #[rustfmt::skip]
        let bad = ["", "M", "-1", "1.5M", "1T", "4 K B", "1MM", "99999999999999999999",
            "18014398509481984K"];
        for s in bad {
            assert_eq!(parse_size(s), None, "{s}");
        }
    }
}
