//! `hixl._hixl.doctor`: `hixl doctor --peer PEER --json` on the calling engine (crate
//! `hixl-doctor`), for `hixl.Engine.doctor()`.

use hixl_core::Error;
use pyo3::prelude::*;

use crate::engine::Engine;
use crate::{hixl_err, py_result, runtime};

/// A byte count given as a Python int: not negative, else PARAM_INVALID naming it.
fn bytes(name: &str, v: i64) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| {
        hixl_err(Error::InvalidParam {
            what: format!("{name} must be a number of bytes (not negative), got {v}"),
        })
    })
}

/// The path from `engine` to `peer` (`ip:port`, or a name in the engine's directory) checked,
/// as the JSON text of `hixl doctor --json`. Runs with the GIL released.
#[pyfunction]
#[pyo3(signature = (engine, peer, expect=None, probe=true, size=8 << 20, block=1 << 20, duration=0.5))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn doctor(
    py: Python<'_>,
    engine: &Engine,
    peer: &str,
    expect: Option<String>,
    probe: bool,
    size: i64,
    block: i64,
    duration: f64,
) -> PyResult<String> {
    let s = hixl_doctor::Settings {
        expect,
        probe,
        size: bytes("size", size)?,
        block: bytes("block", block)?,
        duration,
    };
    let e = engine.get()?;
    let r = py.detach(|| runtime().block_on(hixl_doctor::doctor(&e, peer, &s)));
    let r = py_result(r)?;
    serde_json::to_string(&r).map_err(|e| {
        hixl_err(Error::InvalidParam {
            what: format!("the doctor's report is not JSON: {e}"),
        })
    })
}

/// Adds the function to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(doctor, m)?)
}
