//! Small shared pieces of the CLI: sizes, checksums, errors, peak RSS.

use std::fmt;

/// A CLI failure with a message for the user.
#[derive(Debug)]
pub struct CliError(pub String);

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<hixl::Error> for CliError {
    fn from(e: hixl::Error) -> Self {
        CliError(format!("{e} [{}]", e.status()))
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError(e.to_string())
    }
}

/// Shorthand for CLI results.
pub type CliResult<T = ()> = Result<T, CliError>;

/// Builds a [`CliError`] from a format string.
#[macro_export]
macro_rules! fail {
    ($($t:tt)*) => { $crate::util::CliError(format!($($t)*)) };
}

/// Parses `16K`, `2M`, `1G`, `4096` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    hixl::options::parse_size(s)
        .ok_or_else(|| format!("invalid size {s:?} (use e.g. 4096, 16K, 2M, 1G)"))
}

/// Formats a byte count with a binary unit.
pub fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// A fast 64-bit checksum of a byte range (multiply-rotate over 8-byte words).
pub fn checksum(b: &[u8]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ b.len() as u64;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x100_0000_01B3)
            .rotate_left(29);
    }
    for &x in chunks.remainder() {
        h = (h ^ u64::from(x)).wrapping_mul(0x100_0000_01B3);
    }
    h
}

/// Fills `b` with a position-dependent pattern derived from `seed`.
pub fn fill_pattern(b: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for c in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = x.to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// Peak resident set (VmHWM) of a process in bytes, from /proc.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident set (VmRSS) of a process in bytes, from /proc.
pub fn current_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Samples the resident memory of some processes every 2 ms on a thread and keeps the
/// largest value of each, so a benchmark can report the peak during its own phase only.
pub struct RssSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<u64>>>,
}

impl RssSampler {
    /// Starts sampling `pids`.
    pub fn start(pids: Vec<u32>) -> RssSampler {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut max = vec![0u64; pids.len()];
            loop {
                for (m, &p) in max.iter_mut().zip(&pids) {
                    *m = (*m).max(current_rss(p).unwrap_or(0));
                }
                if flag.load(Ordering::Relaxed) {
                    return max;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        });
        RssSampler {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops and returns the peak of each process, in the order given.
    pub fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// The `p` quantile (0..=1) of ascending `sorted`, by nearest rank; 0 for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_sees_every_byte() {
        let mut a = vec![0u8; 1001];
        fill_pattern(&mut a, 3);
        let h = checksum(&a);
        for i in [0, 7, 8, 500, 1000] {
            let mut b = a.clone();
            b[i] ^= 1;
            assert_ne!(checksum(&b), h, "byte {i}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16K"), Ok(16384));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert!(parse_size("x").is_err());
        assert_eq!(human(128 << 20), "128 MiB");
    }
}
