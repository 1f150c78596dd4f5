//! The directory on `hixl._hixl.Engine`: connecting by name, the live entries, this engine's
//! publication.

use hixl_async::Peer as RsPeer;
use hixl_directory::Entry;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::engine::{Engine, Peer};
use crate::op::{ErrOut, Op, OutFn};

fn entry_dict<'py>(py: Python<'py>, e: &Entry) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &e.name)?;
    d.set_item("incarnation", &e.incarnation)?;
    d.set_item("addrs", e.addrs.clone())?;
    d.set_item("transports", e.transports.clone())?;
    d.set_item("table_digest", &e.table_digest)?;
    d.set_item("wire", e.wire)?;
    Ok(d)
}

#[pymethods]
impl Engine {
    /// Connects to the engine published as `name` in the directory; the op yields a `Peer`.
    fn connect_named(&self, name: String, timeout: f64) -> PyResult<Op> {
        let e = self.get()?;
        let d = crate::seconds(timeout)?;
        Ok(Op::other(async move {
            match e.connect_named(&name, d).await {
                Ok(p) => {
                    let out: OutFn = Box::new(move |py| Ok(Py::new(py, peer(p))?.into_any()));
                    Ok(out)
                }
                Err(err) => Err(ErrOut::Hixl(err)),
            }
        }))
    }

    /// The directory's live entries (from its watched cache), as dicts; empty without one.
    fn directory_entries<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let e = self.get()?;
        let entries = e.directory().map(|d| d.entries()).unwrap_or_default();
        entries.iter().map(|x| entry_dict(py, x)).collect()
    }

    /// This engine's published entry with its `state` (`live`, `retrying: ...`, `lost: ...`),
    /// or `None`.
    fn publication<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let e = self.get()?;
        let Some(p) = e.directory().and_then(|d| d.publication()) else {
            return Ok(None);
        };
        let d = entry_dict(py, &p.entry)?;
        let state = match p.state {
            hixl_directory::PublishState::Live => "live".to_owned(),
            hixl_directory::PublishState::Retrying(why) => format!("retrying: {why}"),
            hixl_directory::PublishState::Lost(holder) => format!("lost: held by {holder}"),
        };
        d.set_item("state", state)?;
        Ok(Some(d))
    }
}

#[pymethods]
impl Peer {
    /// The peer engine's incarnation (the random id it drew at start; the directory's entry
    /// carries it as 16 hex digits).
    #[getter]
    fn incarnation(&self) -> u64 {
        self.peer.incarnation()
    }
}

fn peer(p: RsPeer) -> Peer {
    Peer { peer: p }
}
