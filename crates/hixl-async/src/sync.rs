//! The project's one lock-poisoning policy (the KV layer and the Python binding lock through
//! it too).
//!
//! A `std` lock is poisoned when a thread panics while holding it. Every critical section in
//! hixl-async is short, synchronous (no `.await` inside) and leaves its data consistent after
//! each step: it inserts, removes or takes whole values (a part into a queue, an op into the
//! op table, a link into the map), so a panic between two steps leaves a state that an
//! earlier step could also have produced. Recovering the guard is therefore sound, and it is
//! what keeps the promise that no completion is ever dropped: a poisoned op table, completion
//! queue or in-flight queue still hands every part its result. The KV layer's sections hold
//! to the same rule (a lease is validated whole before the table takes it; a cache or link is
//! inserted or removed as a whole value), and refusing there would let one failed call
//! disable an instance for good: every later lease, pull and link call, the reaper and the
//! lease service.
//!
//! So every `Mutex::lock`, `RwLock::read` and `RwLock::write` in the crate goes through
//! [`lock`], [`read`] or [`write`]: they recover the guard
//! ([`PoisonError::into_inner`]) and log the first poisoning at `warn` (the panic itself was
//! already reported by the panic hook). A section for which recovering would not be sound must
//! say so in a comment and return [`hixl_core::Error::Internal`] instead; there is none today.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static WARNED: AtomicBool = AtomicBool::new(false);

#[cold]
#[inline(never)]
fn recovered<G>(e: PoisonError<G>, what: &'static str) -> G {
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "a {what} was poisoned by a panic in another thread; recovering it (the data is \
             consistent between steps); later poisonings are not logged"
        );
    }
    e.into_inner()
}

/// The guard of a poisoned lock, for callers that get the [`PoisonError`] themselves
/// (`try_lock`): logged as [`lock`] does.
pub fn recover<G>(e: PoisonError<G>) -> G {
    recovered(e, "lock")
}

/// Locks `m`, recovering it if a panic poisoned it (see the module's policy).
#[inline]
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| recovered(e, "mutex"))
}

/// Read-locks `l`, recovering it if a panic poisoned it (see the module's policy).
#[inline]
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| recovered(e, "rwlock"))
}

/// Write-locks `l`, recovering it if a panic poisoned it (see the module's policy).
#[inline]
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| recovered(e, "rwlock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_recovered_with_its_data() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let l = std::sync::Arc::new(RwLock::new(7));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            let _w = l2.write();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        lock(&m).push(2);
        assert_eq!(*lock(&m), [1, 2]);
        assert_eq!(*read(&l), 7);
        *write(&l) = 8;
        assert_eq!(*read(&l), 8);
    }
}
