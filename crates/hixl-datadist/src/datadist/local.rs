//! Local block copies between (or within) this cluster's caches: fan-out copy
//! (`copy_kv_blocks`) and `swap_blocks`. No peer is involved; bytes move on this host.

use std::collections::HashSet;

use hixl_async::Region;

use super::{Cache, LlmDataDist};
use crate::cache::{coalesce, Run};
use crate::status::{DataDistError, LlmStatus, Result};
use hixl_async::sync::lock;

/// Calls moving more than this run on a blocking thread, so a large copy never stalls the
/// runtime's worker.
const INLINE_COPY_BYTES: u64 = 1 << 20;

impl LlmDataDist {
    /// Copies blocks within or between this cluster's caches with fan-out (HIXL
    /// `CopyKvBlocks`): block `src_blocks[i]` of every tensor of `src` goes to each block of
    /// `dst_blocks[i]` of the same tensor of `dst`. Used for prefix sharing (one computed block
    /// seeding several requests) and copy-on-write.
    ///
    /// # Errors
    /// `LLM_KV_CACHE_NOT_EXIST` for a cache not registered here; `LLM_PARAM_INVALID` for lists
    /// of different lengths, a block past a cache's end, caches of different tensor counts or
    /// block sizes, a destination block named twice, or (within one cache) a block both copied
    /// from and written; `LLM_LEASE_HELD` for a destination block a live lease holds.
    pub async fn copy_kv_blocks(
        &self,
        src: &Cache,
        dst: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[Vec<u64>],
    ) -> Result<()> {
        if src_blocks.len() != dst_blocks.len() {
            return Err(DataDistError::param(format!(
                "{} source blocks but {} destination lists",
                src_blocks.len(),
                dst_blocks.len()
            )));
        }
        let mut pairs = Vec::new();
        for (&s, ds) in src_blocks.iter().zip(dst_blocks) {
            if ds.is_empty() {
                return Err(DataDistError::param(format!(
                    "source block {s} has an empty destination list"
                )));
            }
            pairs.extend(ds.iter().map(|&d| (s, d)));
        }
        self.copy_pairs(src, dst, &pairs).await
    }

    /// Copies blocks from `src` to `dst` by `(src_block, dst_block)` pairs (LLM-DataDist
    /// `swap_blocks`, as serving engines swap blocks between a device cache and a host cache:
    /// a copy in the given direction, not an exchange).
    ///
    /// # Errors
    /// As [`LlmDataDist::copy_kv_blocks`].
    pub async fn swap_blocks(&self, src: &Cache, dst: &Cache, pairs: &[(u64, u64)]) -> Result<()> {
        self.copy_pairs(src, dst, pairs).await
    }

    async fn copy_pairs(&self, src: &Cache, dst: &Cache, pairs: &[(u64, u64)]) -> Result<()> {
        let inner = self.inner()?;
        {
            let st = lock(&inner.state);
            for c in [src, dst] {
                if !st.caches.contains_key(&c.cache_id) {
                    return Err(DataDistError::new(
                        LlmStatus::KvCacheNotExist,
                        format!("cache {} is not registered here", c.cache_id),
                    ));
                }
            }
        }
        if src.desc.num_tensors != dst.desc.num_tensors {
            return Err(DataDistError::param(format!(
                "cache {} has {} tensors, cache {} has {}",
                src.cache_id, src.desc.num_tensors, dst.cache_id, dst.desc.num_tensors
            )));
        }
        let stride = src.desc.stride()?;
        if stride != dst.desc.stride()? {
            return Err(DataDistError::param(format!(
                "block sizes differ: {stride} bytes in cache {}, {} in cache {}",
                src.cache_id,
                dst.desc.stride()?,
                dst.cache_id
            )));
        }
        let mut written = HashSet::with_capacity(pairs.len());
        for &(_, d) in pairs {
            if !written.insert(d) {
                return Err(DataDistError::param(format!(
                    "destination block {d} is written twice"
                )));
            }
        }
        if src.cache_id == dst.cache_id {
            if let Some(&(s, _)) = pairs.iter().find(|(s, _)| written.contains(s)) {
                return Err(DataDistError::param(format!(
                    "block {s} of cache {} is both copied from and written",
                    src.cache_id
                )));
            }
        }
        let (s, d): (Vec<u64>, Vec<u64>) = pairs.iter().copied().unzip();
        self.check_not_leased(dst.cache_id, &d)?;
        let runs = coalesce(&s, &d, src.desc.units()?, dst.desc.units()?)?;
        let tensors: Vec<(Region, Region)> = (0..src.desc.num_tensors as usize)
            .filter_map(|t| Some((src.tensor(t)?.clone(), dst.tensor(t)?.clone())))
            .collect();
        let total = stride
            .saturating_mul(pairs.len() as u64)
            .saturating_mul(tensors.len() as u64);
        let what = (src.cache_id, dst.cache_id);
        if total <= INLINE_COPY_BYTES {
            return copy_runs(&tensors, &runs, stride, what);
        }
        tokio::task::spawn_blocking(move || copy_runs(&tensors, &runs, stride, what))
            .await
            .map_err(|e| DataDistError::new(LlmStatus::Failed, format!("copy thread: {e}")))?
    }
}

/// Copies every run of every tensor pair.
fn copy_runs(
    tensors: &[(Region, Region)],
    runs: &[Run],
    stride: u64,
    (src_id, dst_id): (i64, i64),
) -> Result<()> {
    for (s, d) in tensors {
        for r in runs {
            s.copy_to(r.src * stride, d, r.dst * stride, r.count * stride)
                .map_err(|e| {
                    DataDistError::new(
                        LlmStatus::KvCacheNotExist,
                        format!("copy from cache {src_id} to cache {dst_id}: {e}"),
                    )
                })?;
        }
    }
    Ok(())
}
