//! `hixl._hixl.DataDist`'s pulls between different block sizes (a hixl extension): a
//! request's tokens by position on both sides, each landing at its place whatever each side's
//! tokens per block, across TP sizes, under the prefill ranks' leases or not; and the plan's
//! pure answer (which decode blocks land, which cannot).

use hixl_datadist::tokens::{plan_tokens, TokenMap};
use pyo3::prelude::*;

use super::convert::{bkeys, dd_result, ext_of, grants_of, Ext};
use super::{run, DataDist};

/// The decode blocks of a request that land whole, and those that cannot (the prefill holds
/// no block for one of their tokens): `(landing, missing)`.
#[pyfunction]
pub(super) fn plan_token_blocks(
    src: Vec<Option<u64>>,
    dst: Vec<Option<u64>>,
    tokens: u64,
    src_block_tokens: u64,
    dst_block_tokens: u64,
) -> PyResult<(Vec<u64>, Vec<u64>)> {
    let map = TokenMap { src, dst, tokens };
    let p = dd_result(plan_tokens(
        &map,
        src_block_tokens,
        dst_block_tokens,
        u64::MAX,
        u64::MAX,
    ))?;
    Ok((p.landing, p.missing))
}

#[pymethods]
impl DataDist {
    /// Pulls a request's tokens into `dst` from the prefill ranks' blocks caches `keys`.
    #[allow(clippy::too_many_arguments)]
    fn pull_tokens(
        &self,
        py: Python<'_>,
        keys: Vec<(u64, u64)>,
        dst: i64,
        src_blocks: Vec<Option<u64>>,
        dst_blocks: Vec<Option<u64>>,
        tokens: u64,
        ext: Ext,
    ) -> PyResult<()> {
        let (dst, keys) = (self.shared.cache(dst)?, bkeys(keys));
        let map = TokenMap {
            src: src_blocks,
            dst: dst_blocks,
            tokens,
        };
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_kv_tokens(&keys, &dst, &map, &ext)
                .await
        }))
    }

    /// As `pull_tokens`, under the prefill ranks' leases (`grants[i]`, JSON, is the lease of
    /// `keys[i]`).
    #[allow(clippy::too_many_arguments)]
    fn pull_leased_tokens(
        &self,
        py: Python<'_>,
        grants: Vec<String>,
        keys: Vec<(u64, u64)>,
        dst: i64,
        src_blocks: Vec<Option<u64>>,
        dst_blocks: Vec<Option<u64>>,
        tokens: u64,
        ext: Ext,
        done: bool,
    ) -> PyResult<()> {
        let grants = grants_of(&grants)?;
        let (dst, keys) = (self.shared.cache(dst)?, bkeys(keys));
        let map = TokenMap {
            src: src_blocks,
            dst: dst_blocks,
            tokens,
        };
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_leased_tokens(&grants, &keys, &dst, &map, &ext, done)
                .await
        }))
    }
}
