//! A mutex lock that survives poisoning (a panicked holder leaves plain data behind).

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data of a poisoned lock as it is.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
