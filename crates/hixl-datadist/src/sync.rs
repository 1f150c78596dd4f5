//! The crate's one lock-poisoning policy, the engine's (`hixl-async`'s `sync`): a lock a
//! panic poisoned is recovered, not refused. Every critical section here is short and
//! synchronous and checks before it changes anything (a lease is validated whole before the
//! table takes it; a cache or link is inserted or removed as a whole value), so the data is
//! consistent between steps. Refusing instead would let one failed call disable the instance
//! for good: every later lease, pull and link call, the reaper and the lease service.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

static WARNED: AtomicBool = AtomicBool::new(false);

/// Locks `m`, recovering it if a panic poisoned it (logged once at `warn`).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "an LlmDataDist lock was poisoned by a panic in another thread; recovering it \
                 (the data is consistent between steps); later poisonings are not logged"
            );
        }
        e.into_inner()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_recovered_with_its_data() {
        let m = std::sync::Arc::new(Mutex::new(7));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 8);
    }
}
