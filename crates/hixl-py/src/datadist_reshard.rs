//! `hixl._hixl.DataDist`'s heterogeneous tensor parallelism (a hixl extension): declaring
//! the KV heads a cache holds, pulling a decode rank's heads from the prefill ranks (under
//! their leases or not), and the plan's pure answers (which prefill ranks a decode rank reads,
//! how many decode ranks read each prefill rank).

use hixl_datadist::{tp, KvLayout, KvShard};
use pyo3::prelude::*;

use super::convert::{bkeys, dd_result, ext_of, grants_of, param, Ext};
use super::{run, DataDist};

/// Rank `rank` of a TP group of `tp_size` over `total_heads` heads: a shard for planning only
/// (its head size and layout do not change a plan).
fn planning_shard(rank: u32, tp_size: u32, total_heads: u32, mla: bool) -> KvShard {
    KvShard {
        tp_rank: rank,
        tp_size,
        total_heads,
        head_dim: 1,
        layout: KvLayout::Nhd,
        mla,
    }
}

/// How many ranks of a decode group of `decode_tp` read each of `prefill_tp` prefill ranks.
#[pyfunction]
pub(super) fn kv_shard_readers(
    decode_tp: u32,
    prefill_tp: u32,
    total_heads: u32,
    mla: bool,
) -> PyResult<Vec<u32>> {
    dd_result(tp::readers(
        &planning_shard(0, decode_tp, total_heads, mla),
        prefill_tp,
    ))
}

/// The prefill ranks decode rank `decode_rank` of `decode_tp` reads, in plan order.
#[pyfunction]
pub(super) fn kv_shard_sources(
    decode_rank: u32,
    decode_tp: u32,
    prefill_tp: u32,
    total_heads: u32,
    mla: bool,
) -> PyResult<Vec<u32>> {
    dd_result(tp::sources(
        &planning_shard(decode_rank, decode_tp, total_heads, mla),
        prefill_tp,
    ))
}

#[pymethods]
impl DataDist {
    /// Declares the KV heads cache `cache_id` holds.
    #[allow(clippy::too_many_arguments)]
    fn set_kv_shard(
        &self,
        py: Python<'_>,
        cache_id: i64,
        tp_rank: u32,
        tp_size: u32,
        total_heads: u32,
        head_dim: u32,
        layout: &str,
        mla: bool,
    ) -> PyResult<()> {
        let layout = match layout {
            "NHD" => KvLayout::Nhd,
            "HND" => KvLayout::Hnd,
            "HND_KV" => KvLayout::HndKv,
            l => {
                return Err(param(format!(
                    "KV layout {l:?}: it is \"NHD\" ([tokens, heads, head_dim] per block), \
                     \"HND\" ([heads, tokens, head_dim]) or \"HND_KV\" ([heads, 2, tokens, \
                     head_dim / 2]: per head its tokens' K rows, then their V rows)"
                )))
            }
        };
        let shard = KvShard {
            tp_rank,
            tp_size,
            total_heads,
            head_dim,
            layout,
            mla,
        };
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move {
            dd.read().await.set_kv_shard(cache_id, shard).await
        }))
    }

    /// Pulls blocks into `dst` from the prefill ranks' blocks caches `keys`, resharding heads.
    fn pull_resharded(
        &self,
        py: Python<'_>,
        keys: Vec<(u64, u64)>,
        dst: i64,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
        ext: Ext,
    ) -> PyResult<()> {
        let (dst, keys) = (self.shared.cache(dst)?, bkeys(keys));
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_kv_blocks_resharded(&keys, &dst, &src_blocks, &dst_blocks, &ext)
                .await
        }))
    }

    /// Pulls blocks into `dst` from the prefill ranks' blocks caches `keys`, resharding heads,
    /// under the prefill ranks' leases (`grants[i]`, JSON, is the lease of `keys[i]`).
    #[allow(clippy::too_many_arguments)]
    fn pull_leased_resharded(
        &self,
        py: Python<'_>,
        grants: Vec<String>,
        keys: Vec<(u64, u64)>,
        dst: i64,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
        ext: Ext,
        done: bool,
    ) -> PyResult<()> {
        let grants = grants_of(&grants)?;
        let (dst, keys) = (self.shared.cache(dst)?, bkeys(keys));
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_leased_blocks_resharded(
                    &grants,
                    &keys,
                    &dst,
                    &src_blocks,
                    &dst_blocks,
                    &ext,
                    done,
                )
                .await
        }))
    }
}
