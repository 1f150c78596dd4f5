//! Pull and push of blocks and of whole batch entries between a local cache and a linked
//! peer's cache.

use hixl_async::Peer;
use hixl_core::{StridedDesc, TransferOp};

use super::bound::Bound;
use super::{Cache, LlmDataDist};
use crate::cache::{
    block_descs, coalesce, layer_tensors, BlocksCacheKey, CacheDesc, CacheIndex, CacheKey,
    KvCacheExtParam, Run, Side,
};
use crate::status::{BlockFailure, DataDistError, Result};
use crate::table::{CacheEntry, CacheTable};

impl LlmDataDist {
    /// Pushes `runs` of `local` into `remote` with `ext`'s layers.
    pub(crate) async fn move_runs_pub(
        &self,
        peer: &Peer,
        remote: &CacheEntry,
        local: &Cache,
        runs: &[Run],
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let t = self.inner()?.opts.sync_wait;
        self.move_runs(peer, remote, local, runs, ext, false, Bound::after(t))
            .await
    }

    /// Moves `runs` of every layer of `ext` between `local` and `remote`: one transfer per
    /// layer, all in flight at once, so that a failure names the layers (and so the
    /// (layer, block) pairs) that did not land while the others are known to have landed.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn move_runs(
        &self,
        peer: &Peer,
        remote: &CacheEntry,
        local: &Cache,
        runs: &[Run],
        ext: &KvCacheExtParam,
        pull: bool,
        bound: Bound,
    ) -> Result<()> {
        let (src_desc, src_addrs, dst_desc, dst_addrs) = if pull {
            (
                &remote.desc,
                &remote.addrs,
                &local.desc,
                &local.tensor_addrs,
            )
        } else {
            (
                &local.desc,
                &local.tensor_addrs,
                &remote.desc,
                &remote.addrs,
            )
        };
        let n = ext.tensor_num_per_layer;
        let src_t = layer_tensors(ext.src_layer_range.as_ref(), n, src_desc.num_tensors)?;
        let dst_t = layer_tensors(ext.dst_layer_range.as_ref(), n, dst_desc.num_tensors)?;
        if src_t.len() != dst_t.len() {
            return Err(DataDistError::param(format!(
                "source layers cover {} tensors, destination layers {}",
                src_t.len(),
                dst_t.len()
            )));
        }
        // The remote tensors this moves: in the peer's memory table, or on their way to it.
        let remote_t = if pull { src_t.clone() } else { dst_t.clone() };
        let missing = super::links::announced(peer, remote, remote_t, bound.left()).await?;
        let src = Side {
            addrs: src_addrs,
            stride: src_desc.stride()?,
        };
        let dst = Side {
            addrs: dst_addrs,
            stride: dst_desc.stride()?,
        };
        let layers: Vec<(u32, u32)> = (src_t.start / n..src_t.end / n)
            .zip(dst_t.start / n..dst_t.end / n)
            .collect();
        let mut plans = Vec::with_capacity(layers.len());
        for &(sl, dl) in &layers {
            plans.push(block_descs(
                src,
                dst,
                sl * n..sl * n + n,
                dl * n..dl * n + n,
                runs,
                pull,
            )?);
        }
        let op = if pull {
            TransferOp::Read
        } else {
            TransferOp::Write
        };
        let results = futures::future::join_all(
            plans
                .iter()
                .map(|d| bound.apply(peer.transfer_strided(op, d))),
        )
        .await;
        layer_outcome(&layers, results, runs).map_err(|mut e| {
            if let Some(note) = missing {
                e.message.push_str(&note);
            }
            e
        })
    }

    /// Moves `src_blocks` to `dst_blocks` between `local` and the peer cache `pick` selects:
    /// pull (remote → local) or push (local → remote).
    #[allow(clippy::too_many_arguments)]
    async fn transfer(
        &self,
        cluster_id: u64,
        pick: impl Fn(&CacheTable) -> Option<CacheEntry>,
        what: String,
        local: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
        pull: bool,
    ) -> Result<()> {
        let (peer, remote) = self.remote(cluster_id, pick, what).await?;
        let (src_units, dst_units) = if pull {
            (remote.desc.units()?, local.desc.units()?)
        } else {
            (local.desc.units()?, remote.desc.units()?)
        };
        let runs = coalesce(src_blocks, dst_blocks, src_units, dst_units)?;
        let t = self.inner()?.opts.sync_wait;
        self.move_runs(&peer, &remote, local, &runs, ext, pull, Bound::after(t))
            .await
    }

    /// Pulls blocks of a peer's blocks cache into `dst` (HIXL `PullKvBlocks`). Block lists are
    /// coalesced into runs contiguous on both sides.
    ///
    /// # Errors
    /// `LLM_NOT_YET_LINK`, `LLM_KV_CACHE_NOT_EXIST`, `LLM_PARAM_INVALID` (blocks, layers,
    /// geometry), `LLM_TIMEOUT` past `llm.SyncKvCacheWaitTime`.
    pub async fn pull_kv_blocks(
        &self,
        src: BlocksCacheKey,
        dst: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let what = format!("blocks cache {src:?}");
        let pick = move |t: &CacheTable| t.by_key(src).cloned();
        self.transfer(
            src.cluster_id,
            pick,
            what,
            dst,
            src_blocks,
            dst_blocks,
            ext,
            true,
        )
        .await
    }

    /// Pushes blocks of `src` into a peer's blocks cache (HIXL `PushKvBlocks`); the source and
    /// destination layer ranges must be equal.
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub async fn push_kv_blocks(
        &self,
        dst: BlocksCacheKey,
        src: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        if ext.src_layer_range != ext.dst_layer_range {
            return Err(DataDistError::param(format!(
                "push needs equal layer ranges, got {:?} and {:?}",
                ext.src_layer_range, ext.dst_layer_range
            )));
        }
        let what = format!("blocks cache {dst:?}");
        let pick = move |t: &CacheTable| t.by_key(dst).cloned();
        self.transfer(
            dst.cluster_id,
            pick,
            what,
            src,
            src_blocks,
            dst_blocks,
            ext,
            false,
        )
        .await
    }

    /// Pulls batch entry `src.batch_index` of a peer's contiguous cache into entry
    /// `batch_index` of `dst` (HIXL `PullKvCache`, `size = -1`).
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub async fn pull_kv_cache(
        &self,
        src: CacheIndex,
        dst: &Cache,
        batch_index: u32,
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let what = format!("cache {}", src.cache_id);
        let pick = move |t: &CacheTable| t.by_id(src.cache_id).cloned();
        let (s, d) = (u64::from(src.batch_index), u64::from(batch_index));
        self.transfer(src.cluster_id, pick, what, dst, &[s], &[d], ext, true)
            .await
    }

    /// Pushes batch entry `src_batch_index` of `src` into a peer's contiguous cache at
    /// `dst.batch_index` (HIXL `PushKvCache`, `size = -1`).
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub async fn push_kv_cache(
        &self,
        src: &Cache,
        dst: CacheIndex,
        src_batch_index: u32,
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let what = format!("cache {}", dst.cache_id);
        let pick = move |t: &CacheTable| t.by_id(dst.cache_id).cloned();
        let (s, d) = (u64::from(src_batch_index), u64::from(dst.batch_index));
        self.transfer(dst.cluster_id, pick, what, src, &[s], &[d], ext, false)
            .await
    }

    /// Pulls the batch entry a peer's contiguous cache holds under `key` into entry
    /// `batch_index` of `dst` (LLM-DataDist `pull_cache(CacheKey, ...)`, `size = -1`). The
    /// peer's cache table is re-read first, so a key it removed is never pulled.
    ///
    /// # Errors
    /// `LLM_KV_CACHE_NOT_EXIST` naming a key the peer does not hold (or removed); otherwise as
    /// [`LlmDataDist::pull_kv_blocks`].
    pub async fn pull_kv_cache_by_key(
        &self,
        key: CacheKey,
        dst: &Cache,
        batch_index: u32,
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let (peer, remote, src_batch) = self.keyed(key).await?;
        self.move_batch(&peer, &remote, dst, batch_index, src_batch, ext, true)
            .await
    }

    /// Pushes batch entry `src_batch_index` of `src` into the entry a peer's contiguous cache
    /// holds under `key` (the push form of [`LlmDataDist::pull_kv_cache_by_key`]).
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_cache_by_key`].
    pub async fn push_kv_cache_by_key(
        &self,
        src: &Cache,
        key: CacheKey,
        src_batch_index: u32,
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let (peer, remote, dst_batch) = self.keyed(key).await?;
        self.move_batch(&peer, &remote, src, src_batch_index, dst_batch, ext, false)
            .await
    }

    async fn keyed(&self, key: CacheKey) -> Result<(Peer, CacheEntry, u32)> {
        let pick = move |t: &CacheTable| t.by_cache_key(key).map(|(e, b)| (e.clone(), b));
        let what = format!("cache key {key:?}");
        let (peer, (entry, batch)) = self.remote_table(key.cluster_id, pick, what, true).await?;
        Ok((peer, entry, batch))
    }

    /// Moves one batch entry between `local` and `remote`: `remote_batch` and `local_batch`.
    #[allow(clippy::too_many_arguments)]
    async fn move_batch(
        &self,
        peer: &Peer,
        remote: &CacheEntry,
        local: &Cache,
        local_batch: u32,
        remote_batch: u32,
        ext: &KvCacheExtParam,
        pull: bool,
    ) -> Result<()> {
        let (l, r) = (u64::from(local_batch), u64::from(remote_batch));
        let runs = if pull {
            coalesce(&[r], &[l], remote.desc.units()?, local.desc.units()?)?
        } else {
            coalesce(&[l], &[r], local.desc.units()?, remote.desc.units()?)?
        };
        let t = self.inner()?.opts.sync_wait;
        self.move_runs(peer, remote, local, &runs, ext, pull, Bound::after(t))
            .await
    }

    /// The descriptors a block transfer would post (for benchmarks and tests): strided, one
    /// per tensor and group of runs.
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub fn plan_blocks(
        src: (&CacheDesc, &[u64]),
        dst: (&CacheDesc, &[u64]),
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
        local_is_dst: bool,
    ) -> Result<Vec<StridedDesc>> {
        let runs = coalesce(src_blocks, dst_blocks, src.0.units()?, dst.0.units()?)?;
        let n = ext.tensor_num_per_layer;
        block_descs(
            Side {
                addrs: src.1,
                stride: src.0.stride()?,
            },
            Side {
                addrs: dst.1,
                stride: dst.0.stride()?,
            },
            layer_tensors(ext.src_layer_range.as_ref(), n, src.0.num_tensors)?,
            layer_tensors(ext.dst_layer_range.as_ref(), n, dst.0.num_tensors)?,
            &runs,
            local_is_dst,
        )
    }
}

/// The outcome of a block transfer made of one transfer per `(src_layer, dst_layer)` (a layer
/// may have several, one per peer): `Ok` when all landed, else the first failure's error with
/// every (layer, block) pair of the failed layers in `failed`, sorted; the other pairs landed.
pub(super) fn layer_outcome(
    layers: &[(u32, u32)],
    results: Vec<hixl_core::Result<()>>,
    runs: &[Run],
) -> Result<()> {
    let mut first: Option<hixl_core::Error> = None;
    let mut failed_layers: Vec<(u32, u32)> = Vec::new();
    for (&layer, r) in layers.iter().zip(results) {
        if let Err(e) = r {
            first.get_or_insert(e);
            failed_layers.push(layer);
        }
    }
    let Some(cause) = first else { return Ok(()) };
    failed_layers.sort_unstable();
    failed_layers.dedup();
    let mut all: Vec<(u32, u32)> = layers.to_vec();
    all.sort_unstable();
    all.dedup();
    let mut failed = Vec::new();
    for &(src_layer, dst_layer) in &failed_layers {
        for r in runs {
            failed.extend((0..r.count).map(|i| BlockFailure {
                src_layer,
                dst_layer,
                src_block: r.src + i,
                dst_block: r.dst + i,
            }));
        }
    }
    failed.sort_unstable();
    let mut e = DataDistError::from(cause);
    e.message = format!(
        "{} of {} layers did not land ({} (layer, block) pairs; the others landed): {}",
        failed_layers.len(),
        all.len(),
        failed.len(),
        e.message
    );
    e.failed = failed.into_boxed_slice();
    Err(e)
}
