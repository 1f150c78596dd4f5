//! What the lanes of the initiator side share: the violations found, the counters of each
//! lane, and the failures counted by kind.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use hixl::Error;

use super::report::Latency;
use super::KEEP_VIOLATIONS;

#[derive(Default)]
pub(super) struct Violations {
    pub(super) list: Mutex<Vec<String>>,
    pub(super) count: AtomicU64,
}

impl Violations {
    pub(super) fn add(&self, what: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        eprintln!("hixl soak: VIOLATION: {what}");
        let mut l = lock(&self.list);
        if l.len() < KEEP_VIOLATIONS {
            l.push(what);
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn inc(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

pub(super) fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

#[derive(Default)]
pub(super) struct Stats {
    pub(super) submitted: AtomicU64,
    pub(super) completed: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) writes: AtomicU64,
    pub(super) reads: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) verified_bytes: AtomicU64,
    pub(super) descriptors: AtomicU64,
    pub(super) tiny_timeouts: AtomicU64,
    pub(super) tiny_expired: AtomicU64,
    pub(super) notifies_sent: AtomicU64,
    pub(super) notifies_acked: AtomicU64,
    pub(super) notifies_failed: AtomicU64,
    pub(super) cut_abrupt: AtomicU64,
    pub(super) cut_abrupt_fast: AtomicU64,
    pub(super) cut_graceful: AtomicU64,
    pub(super) connects: AtomicU64,
    pub(super) connect_retries: AtomicU64,
    pub(super) max_drain_us: AtomicU64,
    pub(super) starved: AtomicU64,
    pub(super) reclaims: AtomicU64,
    pub(super) latency: Latency,
    pub(super) max_in_flight: AtomicU64,
    pub(super) target_checks: AtomicU64,
    pub(super) target_seq_received: AtomicU64,
    pub(super) target_seq_out_of_order: AtomicU64,
    pub(super) target_bad: AtomicU64,
    pub(super) target_verified: AtomicU64,
    pub(super) target_verified_bytes: AtomicU64,
    pub(super) failed_by_kind: Mutex<BTreeMap<String, u64>>,
    pub(super) notify_failed_by_kind: Mutex<BTreeMap<String, u64>>,
    pub(super) examples: Mutex<BTreeMap<String, String>>,
}

pub(super) fn kind(e: &Error) -> String {
    let d = format!("{e:?}");
    d.split(|c: char| !c.is_alphanumeric())
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("Error")
        .to_string()
}

pub(super) fn count_kind(m: &Mutex<BTreeMap<String, u64>>, k: String) {
    *lock(m).entry(k).or_insert(0) += 1;
}

/// Keeps the first message of each kind of failure, with where it happened.
pub(super) fn example(
    m: &Mutex<BTreeMap<String, String>>,
    k: String,
    what: impl FnOnce() -> String,
) {
    lock(m).entry(k).or_insert_with(what);
}
