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

/// This host's interface addresses (the doctor's getifaddrs walk, `hixl._netconf`'s source):
/// `(interface, address, mtu)` for every IPv4 and IPv6 address.
#[pyfunction]
pub(crate) fn interfaces() -> Vec<(String, String, Option<u32>)> {
    hixl_doctor::netif::interfaces()
        .into_iter()
        .map(|i| (i.name, i.addr.to_string(), i.mtu))
        .collect()
}

/// The local address the kernel routes `peer` (an IP address) from, or None without a route.
#[pyfunction]
pub(crate) fn route_source(peer: &str) -> PyResult<Option<String>> {
    let ip: std::net::IpAddr = peer.parse().map_err(|_| {
        hixl_err(Error::InvalidParam {
            what: format!("route_source: {peer:?} is not an IP address"),
        })
    })?;
    Ok(hixl_doctor::netif::route_source(ip).map(|a| a.to_string()))
}

/// Adds the functions to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(doctor, m)?)?;
    m.add_function(wrap_pyfunction!(interfaces, m)?)?;
    m.add_function(wrap_pyfunction!(route_source, m)?)
}
