//! Small shared pieces of the CLI: sizes, checksums, errors, peak RSS.

use std::fmt;

/// The benchmarks' quantile: the doctor's probe's, one implementation.
pub use hixl_doctor::probe::percentile;

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

/// The peak resident memory of some processes over a benchmark's phase, from the kernel's
/// own high-water mark: reset when the phase starts (`5` written to `/proc/PID/clear_refs`,
/// which resets `VmHWM` to the current resident set and clears nothing else) and read when it
/// ends. Nothing runs in between, where a sampling thread would wake on the benchmark's own
/// vCPUs every few milliseconds (and could miss a peak between two samples). Where the reset
/// is refused, the peak is the process's lifetime peak.
pub struct PeakRss {
    pids: Vec<u32>,
}

impl PeakRss {
    /// Starts the phase for `pids`.
    pub fn start(pids: Vec<u32>) -> PeakRss {
        for p in &pids {
            let _ = std::fs::write(format!("/proc/{p}/clear_refs"), "5");
        }
        PeakRss { pids }
    }

    /// Ends the phase: the peak of each process since [`PeakRss::start`], in the order given
    /// (0 for one that cannot be read).
    pub fn finish(self) -> Vec<u64> {
        self.pids
            .iter()
            .map(|&p| peak_rss(p).unwrap_or(0))
            .collect()
    }
}

/// This machine's physical memory in bytes, when the system says.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (p, s) = (u64::try_from(pages).ok()?, u64::try_from(size).ok()?);
    p.checked_mul(s)
}

/// `KEY=VALUE` of an `--option` argument.
///
/// # Errors
/// Without `=`, naming what was given.
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// `v` as one line of JSON (the `--json` output of the commands).
///
/// # Errors
/// If `v` cannot be serialized (a map with non-string keys, say).
pub fn json_line<T: serde::Serialize>(v: &T) -> CliResult<String> {
    serde_json::to_string(v).map_err(|e| CliError(e.to_string()))
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
