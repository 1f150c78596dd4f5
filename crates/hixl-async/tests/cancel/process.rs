//! The process under test: one test at a time, the runtime, and RSS and fd measures.

use std::sync::{Mutex, MutexGuard};

/// The tests of this file measure process-wide RSS and fds: they run one at a time.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Large blocks straight from mmap, always: glibc otherwise raises its mmap threshold after
/// the first large free and serves later MiB-sized buffers from per-thread heaps, whose free
/// space lingers in RSS and blurs the leak check.
pub(crate) fn steady_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only tunes glibc's allocator; any threshold value is valid.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10) };
    }
}

/// Resident set size, after glibc hands its free lists back to the OS (so that it measures
/// live memory rather than the allocator's caches).
pub(crate) fn rss_kib() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases memory that is free in glibc's own heaps.
        unsafe { libc::malloc_trim(0) };
    }
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

pub(crate) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}
