//! Blocking facade with HIXL's method set, for callers without a tokio runtime.
