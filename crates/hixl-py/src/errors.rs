//! Errors into Python exceptions: `hixl.HixlError` subclasses (defined in `hixl/_errors.py`)
//! carrying HIXL's numeric status and the offending value.

use hixl_core::Error;
use pyo3::prelude::*;

/// The offending value of an error, where the error names one.
fn offending(py: Python<'_>, e: &Error) -> PyResult<Py<PyAny>> {
    let v = match e {
        Error::UnknownOption { key } => key.clone().into_pyobject(py)?.into_any(),
        Error::InvalidOption { value, .. } => value.clone().into_pyobject(py)?.into_any(),
        Error::InvalidAddress { addr, .. } => addr.clone().into_pyobject(py)?.into_any(),
        Error::InvalidTimeout { millis } => millis.into_pyobject(py)?.into_any(),
        Error::RangeOverflow { addr, .. }
        | Error::Overlap { addr, .. }
        | Error::LocalUnregistered { addr, .. }
        | Error::RemoteOutOfBounds { addr, .. }
        | Error::AccessDenied { addr, .. }
        | Error::OutsideRegion { addr, .. }
        | Error::Deregistered { addr } => addr.into_pyobject(py)?.into_any(),
        Error::NullAddress { index, .. } | Error::ZeroLength { index } => {
            index.into_pyobject(py)?.into_any()
        }
        Error::OffsetOutOfBounds { offset, .. } => offset.into_pyobject(py)?.into_any(),
        Error::NotConnected { peer }
        | Error::AlreadyConnected { peer }
        | Error::Timeout { peer, .. } => peer.clone().into_pyobject(py)?.into_any(),
        Error::ConnectToSelf { engine } => engine.clone().into_pyobject(py)?.into_any(),
        Error::WireVersion { theirs, .. } => theirs.into_pyobject(py)?.into_any(),
        _ => py.None().into_bound(py),
    };
    Ok(v.unbind())
}

/// A `hixl.HixlError` subclass for `e` (by its HIXL status).
pub(crate) fn hixl_err(e: Error) -> PyErr {
    Python::attach(|py| match make(py, &e) {
        Ok(err) => err,
        Err(fallback) => fallback,
    })
}

fn make(py: Python<'_>, e: &Error) -> PyResult<PyErr> {
    let status = e.status();
    let cancelled = matches!(e, Error::Cancelled { .. });
    let value = offending(py, e)?;
    let errors = py.import("hixl._errors")?;
    let exc = errors.getattr("_make")?.call1((
        status.code(),
        status.name(),
        e.to_string(),
        value,
        cancelled,
    ))?;
    Ok(PyErr::from_value(exc))
}

/// `Result<T, Error>` into a `PyResult`.
pub(crate) fn py_result<T>(r: Result<T, Error>) -> PyResult<T> {
    r.map_err(hixl_err)
}
