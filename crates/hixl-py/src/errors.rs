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

/// Which typed exception `e` becomes (a subclass of the one its status picks), with the peer
/// and the cause it names; `None` for an error that names no peer.
fn kind(e: &Error) -> Option<(&'static str, &str, String)> {
    Some(match e {
        Error::Cancelled { .. } => ("cancelled", "", String::new()),
        Error::HeartbeatLost { peer, .. } => ("heartbeat_lost", peer, lost_cause(e, peer)),
        Error::PeerLost { peer, .. }
        | Error::ConnectionLost { peer, .. }
        | Error::Transport { peer, .. }
        | Error::Evicted { peer }
        | Error::RevokeUnacknowledged { peer, .. } => ("peer_lost", peer, lost_cause(e, peer)),
        Error::AuthFailed { peer, reason } => ("auth", peer, reason.clone()),
        Error::Timeout { what, peer, after } => {
            ("timeout", peer, format!("{what} timed out after {after:?}"))
        }
        Error::Remote { peer, message, .. } => ("refused", peer, message.clone()),
        _ => return None,
    })
}

/// Why a link was lost: the message without its `link to PEER lost: ` head, which every
/// link-lost variant's message starts with.
fn lost_cause(e: &Error, peer: &str) -> String {
    let msg = e.to_string();
    match msg.strip_prefix(&format!("link to {peer} lost: ")) {
        Some(cause) => cause.to_owned(),
        None => msg,
    }
}

/// A `hixl.HixlError` subclass for `e` (by its HIXL status).
pub(crate) fn hixl_err(e: Error) -> PyErr {
    Python::attach(|py| match make(py, &e) {
        Ok(err) => err,
        Err(fallback) => fallback,
    })
}

/// [`hixl_err`] with `note` before the error's message (what was being done, how often).
pub(crate) fn hixl_err_noted(e: Error, note: &str) -> PyErr {
    Python::attach(|py| match make_noted(py, &e, Some(note)) {
        Ok(err) => err,
        Err(fallback) => fallback,
    })
}

fn make(py: Python<'_>, e: &Error) -> PyResult<PyErr> {
    make_noted(py, e, None)
}

fn make_noted(py: Python<'_>, e: &Error, note: Option<&str>) -> PyResult<PyErr> {
    let status = e.status();
    let value = offending(py, e)?;
    let (kind, peer, cause) = match kind(e) {
        Some((k, p, c)) => (Some(k), Some(p), Some(c)),
        None => (None, None, None),
    };
    let errors = py.import("hixl._errors")?;
    let exc = errors.getattr("_make")?.call1((
        status.code(),
        status.name(),
        match note {
            Some(n) => format!("{n}: {e}"),
            None => e.to_string(),
        },
        value,
        kind,
        peer,
        cause,
    ))?;
    Ok(PyErr::from_value(exc))
}

/// `Result<T, Error>` into a `PyResult`.
pub(crate) fn py_result<T>(r: Result<T, Error>) -> PyResult<T> {
    r.map_err(hixl_err)
}
