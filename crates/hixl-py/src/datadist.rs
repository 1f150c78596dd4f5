//! `hixl._hixl.DataDist`: LLM-DataDist for `hixl.llm_datadist`.

use pyo3::prelude::*;

pub(crate) fn add(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
