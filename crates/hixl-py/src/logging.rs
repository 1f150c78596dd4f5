//! Rust's log records into Python's `logging`.
//!
//! The wheel sets no tracing subscriber, so tracing's `log` feature turns each event into a
//! `log` record; pyo3-log passes those to the Python logger named after the record's target
//! under `hixl`: `hixl_async::server` logs to `hixl.hixl_async.server`, so configuring the
//! `hixl` logger covers them all. A logger's effective level is read when it first logs and
//! then cached; `hixl.reset_log_cache()` rereads it after a level change.

use std::sync::OnceLock;

use pyo3::prelude::*;
use pyo3_log::{Caching, Logger, ResetHandle};

static RESET: OnceLock<ResetHandle> = OnceLock::new();

/// Installs the bridge (once per process: `log` takes one global logger) and adds
/// `_reset_log_cache` to the module.
pub(crate) fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    if RESET.get().is_none() {
        let logger = Logger::new(m.py(), Caching::LoggersAndLevels)?
            .filter(log::LevelFilter::Debug)
            .set_prefix("hixl");
        // Another extension in the process may have installed its logger first; Rust's records
        // then go there, and ours is not needed.
        if let Ok(handle) = logger.install() {
            let _ = RESET.set(handle);
        }
    }
    m.add_function(wrap_pyfunction!(_reset_log_cache, m)?)
}

/// Forgets the cached Python loggers and levels (after `setLevel` on a `hixl` logger).
#[pyfunction]
fn _reset_log_cache() {
    if let Some(h) = RESET.get() {
        h.reset();
    }
}
