//! `hixl._hixl.serve_metrics`: an engine's Prometheus text served over HTTP, as
//! `Engine::serve_metrics` does in Rust, for Python programs outside vLLM.

use pyo3::prelude::*;

use crate::engine::Engine;
use crate::{py_result, runtime};

/// A running metrics endpoint; dropping or closing it stops it.
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct MetricsServer {
    server: std::sync::Mutex<Option<hixl_async::telemetry::MetricsServer>>,
    addr: String,
}

#[pymethods]
impl MetricsServer {
    /// `ip:port` it listens on.
    #[getter]
    fn local_addr(&self) -> String {
        self.addr.clone()
    }

    /// Stops serving.
    fn close(&self) {
        let s = hixl_async::sync::lock(&self.server).take();
        drop(s);
    }
}

/// Serves `engine`'s metrics at `GET /metrics` on `listen` (`ip:port`; port 0 picks one).
#[pyfunction]
pub(crate) fn serve_metrics(
    py: Python<'_>,
    engine: &Engine,
    listen: &str,
) -> PyResult<MetricsServer> {
    let e = engine.get()?;
    let s = py.detach(|| runtime().block_on(e.serve_metrics(listen)));
    let s = py_result(s)?;
    Ok(MetricsServer {
        addr: s.local_addr().to_string(),
        server: std::sync::Mutex::new(Some(s)),
    })
}

/// Adds the function and its class to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MetricsServer>()?;
    m.add_function(wrap_pyfunction!(serve_metrics, m)?)
}
