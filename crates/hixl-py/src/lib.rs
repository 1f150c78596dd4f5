//! `hixl._hixl`: the native half of the `hixl` Python package.
//!
//! The Python package (`python/hixl`) is the API users see; this module gives it what needs
//! Rust: the engine ([`engine`]), awaitable ops completed through a per-loop eventfd
//! ([`op`], [`waker`]), and LLM-DataDist ([`datadist`]).
//!
//! Threads: one tokio runtime per process ([`runtime`]) runs every engine's tasks. No thread of
//! it ever takes the GIL: a finished op is pushed onto its waker's queue and the waker's eventfd
//! is written; the event loop's thread (which watches the eventfd with `add_reader`) resolves
//! the asyncio futures. Blocking calls release the GIL while Rust waits or copies. Log records
//! are handed to Python by a thread of their own ([`logging`]).

use std::sync::OnceLock;

use pyo3::prelude::*;

mod connect_retry;
mod datadist;
mod descs;
mod directory;
mod dlpack;
mod doctor;
mod engine;
mod errors;
mod logging;
mod metrics;
mod op;
mod region_view;
mod waker;

pub(crate) use errors::{hixl_err, py_result};

/// A timeout given in seconds: `> 0` and finite, else HIXL's PARAM_INVALID naming it. One
/// too long for a `Duration` (past 2^64 s) is `Duration::MAX`, which the engine takes as no
/// bound.
pub(crate) fn seconds(t: f64) -> PyResult<std::time::Duration> {
    if t > 0.0 && t.is_finite() {
        Ok(std::time::Duration::try_from_secs_f64(t).unwrap_or(std::time::Duration::MAX))
    } else {
        Err(hixl_err(hixl_core::Error::InvalidTimeout {
            millis: if t.is_finite() {
                (t * 1000.0) as i64
            } else {
                -1
            },
        }))
    }
}

/// The process's runtime: two workers (the engines' connection tasks), started on first use.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hixl-py")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            // Without a runtime nothing can run; there is no error path from here.
            Err(e) => {
                eprintln!("hixl: cannot start the tokio runtime: {e}");
                std::process::abort()
            }
        }
    })
}

/// The native module.
#[pymodule]
fn _hixl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The engine-to-engine protocol's version (peers of another version refuse each other).
    m.add("WIRE_VERSION", hixl_core::wire::VERSION)?;
    logging::init(m)?;
    engine::add(m)?;
    op::add(m)?;
    region_view::add(m)?;
    waker::add(m)?;
    datadist::add(m)?;
    metrics::add(m)?;
    doctor::add(m)?;
    m.add_function(wrap_pyfunction!(dlpack::dlpack_span, m)?)?;
    Ok(())
}
