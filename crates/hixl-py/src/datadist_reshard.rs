//! `hixl._hixl.DataDist`'s heterogeneous tensor parallelism (a hixl extension): declaring
//! the KV heads a cache holds, and pulling a decode rank's heads from the prefill ranks.

use hixl_datadist::{BlocksCacheKey, KvLayout, KvShard};
use pyo3::prelude::*;

use super::convert::{bkey, dd_result, ext_of, param, Ext};
use super::{run, DataDist};

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
            l => {
                return Err(param(format!(
                    "KV layout {l:?}: it is \"NHD\" ([tokens, heads, head_dim] per block) or \
                     \"HND\" ([heads, tokens, head_dim])"
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
        let dst = self.shared.cache(dst)?;
        let keys: Vec<BlocksCacheKey> = keys.into_iter().map(bkey).collect();
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_kv_blocks_resharded(&keys, &dst, &src_blocks, &dst_blocks, &ext)
                .await
        }))
    }
}
