//! File descriptors: the leak check.

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Tracks the process's fd count at the periodic checks: after a warm-up it must not keep
/// growing (a leak of one fd per input would pass the bound within a few hundred inputs).
#[derive(Default)]
pub struct FdWatch {
    baseline: Option<usize>,
    checks: u32,
}

/// How many fds above the baseline are tolerated (sockets still closing, runtime growth).
pub const FD_SLACK: usize = 256;

impl FdWatch {
    /// Checks the fd count; the baseline is taken at the third call (after warm-up).
    ///
    /// # Panics
    /// When the count exceeds the baseline by more than [`FD_SLACK`].
    pub fn check(&mut self) {
        self.checks += 1;
        let n = open_fds();
        match self.baseline {
            None if self.checks >= 3 => self.baseline = Some(n),
            Some(b) => assert!(
                n <= b + FD_SLACK,
                "invariant violated: file descriptors leak: {n} open now, {b} after warm-up"
            ),
            None => {}
        }
    }
}
