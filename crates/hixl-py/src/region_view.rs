//! `hixl._hixl.Mapping`: what keeps a pooled region's memory mapped while Python views of it
//! (a `memoryview`, a numpy array) live.
//!
//! A pooled region owns its memory (a fabric pool buffer, mapped in this process). The memory
//! goes when the region's last handle goes or when it is deregistered. A `Mapping` holds a
//! handle of its own, so closing the engine (which forgets the Python region's handle) leaves
//! the views valid; the Python side refuses to deregister a region while views of it live
//! (deregistration frees the memory whoever holds a handle).

use hixl_async::Region as RsRegion;
use pyo3::prelude::*;

use crate::engine::Region;
use crate::py_result;

/// `hixl._hixl.Mapping`: a handle on a region that keeps its memory where it is.
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct Mapping {
    region: RsRegion,
}

#[pymethods]
impl Mapping {
    /// The region's start address in this process.
    #[getter]
    fn addr(&self) -> u64 {
        self.region.addr()
    }

    /// The region's length in bytes.
    #[getter]
    fn len(&self) -> u64 {
        self.region.len()
    }
}

#[pymethods]
impl Region {
    /// A `Mapping` of the region (raises if it was deregistered or its engine closed).
    fn _pin(&self) -> PyResult<Mapping> {
        let region = self.get()?;
        // A region deregistered already is refused (its memory may be gone): an empty read
        // checks that without touching any byte.
        py_result(region.read_at(0, &mut []))?;
        Ok(Mapping { region })
    }
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Mapping>()
}
