//! Pulls across tensor-parallel sizes: a decode rank's heads from the prefill ranks that hold
//! them, each head slice moved by strided descriptors straight into the decode layout.

use std::collections::HashMap;

use hixl_async::Peer;
use hixl_core::{StridedDesc, TransferOp};

use super::bound::Bound;
use super::{Cache, LlmDataDist};
use crate::cache::{coalesce, layer_tensors, BlocksCacheKey, KvCacheExtParam, Run};
use crate::status::{DataDistError, LlmStatus, Result};
use crate::table::CacheEntry;
use crate::tokens::{plan_tokens, seg_descs, TokenMap};
use crate::tp::{plan_heads, slice_descs, sources, KvGeometry, KvShard, ShardSide};
use hixl_async::sync::lock;

impl LlmDataDist {
    /// Declares which KV heads cache `cache_id` holds: rank `shard.tp_rank` of a group of
    /// `shard.tp_size` (its shape is checked against it). Peers see it in the cache table, and
    /// [`LlmDataDist::pull_kv_blocks_resharded`] plans with it.
    ///
    /// # Errors
    /// `LLM_KV_CACHE_NOT_EXIST` for an unknown cache; `LLM_PARAM_INVALID` when the shard or
    /// the cache's shape does not fit.
    pub async fn set_kv_shard(&self, cache_id: i64, shard: KvShard) -> Result<()> {
        let inner = self.inner()?;
        {
            let mut st = lock(&inner.state);
            let l = st.caches.get_mut(&cache_id).ok_or_else(|| {
                DataDistError::new(
                    LlmStatus::KvCacheNotExist,
                    format!("cache {cache_id} is not registered here"),
                )
            })?;
            shard.check(&l.entry.desc)?;
            l.entry.shard = Some(shard);
        }
        self.publish().await
    }

    /// Pulls `src_blocks` into `dst_blocks` of `dst` (a decode rank's cache with a shard) from
    /// the prefill ranks' blocks caches `prefill` (one key per prefill rank, each with a shard
    /// of the same group, all linked): each of `dst`'s heads comes from a prefill rank that
    /// holds it, as strided descriptors per (layer, prefill rank), all in flight at once. NHD
    /// and HND layouts, MHA and GQA (replicated heads when the group is larger than the heads),
    /// and MLA (the latent from one rank, unsplit). On failure the error lists the (layer,
    /// block) pairs that did not land.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` when a cache has no shard, the prefill shards are not one whole
    /// group, or the layouts differ; otherwise as [`LlmDataDist::pull_kv_blocks`].
    pub async fn pull_kv_blocks_resharded(
        &self,
        prefill: &[BlocksCacheKey],
        dst: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let timeout = self.inner()?.opts.sync_wait;
        let moves = Moves::Blocks {
            src: src_blocks,
            dst: dst_blocks,
        };
        self.plan_resharded(prefill, dst, moves, ext)
            .await?
            .run(Bound::after(timeout))
            .await
    }

    /// Pulls a request's tokens into `dst` from the prefill ranks' blocks caches `prefill`,
    /// whatever each side's tokens per block: `map` gives the prefill's blocks and this
    /// rank's blocks by position ([`crate::tokens`]). Each token of each head lands at its
    /// place, moved by strided descriptors straight into this rank's layout, across TP sizes
    /// as [`LlmDataDist::pull_kv_blocks_resharded`]. Destination blocks the prefill holds no
    /// tokens for ([`crate::tokens::TokenPlan::missing`]) are not touched.
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks_resharded`]; `LLM_PARAM_INVALID` for a map that does
    /// not fit the caches, or prefill ranks of different block sizes.
    pub async fn pull_kv_tokens(
        &self,
        prefill: &[BlocksCacheKey],
        dst: &Cache,
        map: &TokenMap,
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let timeout = self.inner()?.opts.sync_wait;
        self.plan_resharded(prefill, dst, Moves::Tokens(map), ext)
            .await?
            .run(Bound::after(timeout))
            .await
    }

    /// Plans a resharded pull (every check of [`LlmDataDist::pull_kv_blocks_resharded`], the
    /// descriptors of each (layer, prefill rank)); moves nothing.
    pub(super) async fn plan_resharded(
        &self,
        prefill: &[BlocksCacheKey],
        dst: &Cache,
        moves: Moves<'_>,
        ext: &KvCacheExtParam,
    ) -> Result<Resharded> {
        let inner = self.inner()?;
        let timeout = inner.opts.sync_wait;
        let dshard = {
            let st = lock(&inner.state);
            st.caches
                .get(&dst.cache_id)
                .and_then(|l| l.entry.shard)
                .ok_or_else(|| {
                    DataDistError::param(format!(
                        "cache {} has no KV shard (set_kv_shard)",
                        dst.cache_id
                    ))
                })?
        };
        let tokens = dshard.check(&dst.desc)?;
        let mut ranks: HashMap<u32, (Peer, CacheEntry, KvShard)> = HashMap::new();
        let mut keys = Vec::with_capacity(prefill.len());
        let mut ptp = None;
        for &key in prefill {
            let (peer, e) = self.remote_for(key).await?;
            let s = e.shard.ok_or_else(|| {
                DataDistError::param(format!("prefill cache {key:?} has no KV shard"))
            })?;
            if *ptp.get_or_insert(s.tp_size) != s.tp_size {
                return Err(DataDistError::param(format!(
                    "prefill cache {key:?} is of TP size {}, another of {}",
                    s.tp_size,
                    ptp.unwrap_or(0)
                )));
            }
            keys.push((s.tp_rank, e.cache_id));
            if ranks.insert(s.tp_rank, (peer, e, s)).is_some() {
                return Err(DataDistError::param(format!(
                    "two prefill caches are TP rank {}",
                    s.tp_rank
                )));
            }
        }
        let ptp = ptp.ok_or_else(|| DataDistError::param("no prefill caches"))?;
        let n = ext.tensor_num_per_layer;
        let dst_t = layer_tensors(ext.dst_layer_range.as_ref(), n, dst.desc.num_tensors)?;
        // Every prefill rank given is of the decode rank's model, checked before a byte moves
        // (not only the ranks this decode rank's heads come from: whether a mismatch is caught
        // must not depend on the rank).
        let layers = |t: &std::ops::Range<u32>| u64::from((t.end - t.start) / n);
        let dgeo = KvGeometry::of(&dshard, layers(&dst_t), dst.desc.data_type);
        let mut given: Vec<_> = ranks.iter().collect();
        given.sort_unstable_by_key(|(r, _)| **r);
        for (&r, (_, e, s)) in given {
            let src_t = layer_tensors(ext.src_layer_range.as_ref(), n, e.desc.num_tensors)?;
            KvGeometry::of(s, layers(&src_t), e.desc.data_type).check_same_model(r, &dgeo)?;
        }
        let plan = plan_heads(&dshard, ptp)?;
        let mut src_shape = None;
        for (&r, (_, e, s)) in &ranks {
            let shape = (e.desc.units()?, s.check(&e.desc)?);
            if *src_shape.get_or_insert(shape) != shape {
                return Err(DataDistError::param(format!(
                    "prefill rank {r} has {} blocks of {} tokens, another {:?}",
                    shape.0, shape.1, src_shape
                )));
            }
        }
        let (src_units, src_rows) = src_shape.unwrap_or((0, tokens));
        let (runs, segs) = match moves {
            Moves::Blocks { src, dst: d } => {
                (coalesce(src, d, src_units, dst.desc.units()?)?, None)
            }
            Moves::Tokens(map) => {
                let p = plan_tokens(map, src_rows, tokens, src_units, dst.desc.units()?)?;
                (p.runs(), Some(p.segs))
            }
        };
        // (layers, prefill rank) → descriptors.
        let mut missing = String::new();
        let mut jobs = Vec::new();
        for slice in &plan {
            let (peer, e, s) = ranks.get(&slice.prefill_rank).ok_or_else(|| {
                DataDistError::param(format!(
                    "heads {:?} are on prefill rank {}, which is not among the caches given",
                    slice.heads, slice.prefill_rank
                ))
            })?;
            let src_tokens = s.check(&e.desc)?;
            let src_t = layer_tensors(ext.src_layer_range.as_ref(), n, e.desc.num_tensors)?;
            if let Some(note) = super::links::announced(peer, e, src_t.clone(), timeout).await? {
                missing.push_str(&note);
            }
            if src_t.len() != dst_t.len() || e.desc.data_type != dst.desc.data_type {
                return Err(DataDistError::param(format!(
                    "prefill rank {} covers {} tensors of {:?}, decode {} of {:?}",
                    slice.prefill_rank,
                    src_t.len(),
                    e.desc.data_type,
                    dst_t.len(),
                    dst.desc.data_type
                )));
            }
            for (sl, dl) in (src_t.start / n..src_t.end / n).zip(dst_t.start / n..dst_t.end / n) {
                let mut descs = Vec::new();
                for k in 0..n {
                    let (ts, td) = ((sl * n + k) as usize, (dl * n + k) as usize);
                    let (Some(&sa), Some(&da)) = (e.addrs.get(ts), dst.tensor_addrs.get(td)) else {
                        return Err(DataDistError::param(format!(
                            "tensor {ts} or {td} does not exist"
                        )));
                    };
                    let elem = dst.desc.data_type.size();
                    let src = ShardSide {
                        addr: sa,
                        shard: *s,
                        tokens: src_tokens,
                        elem,
                    };
                    let dside = ShardSide {
                        addr: da,
                        shard: dshard,
                        tokens,
                        elem,
                    };
                    descs.extend(match &segs {
                        None => slice_descs(&src, &dside, slice, &runs)?,
                        Some(segs) => seg_descs(&src, &dside, slice, segs)?,
                    });
                }
                if !descs.is_empty() {
                    jobs.push(((sl, dl), peer.clone(), descs));
                }
            }
        }
        let sources = sources(&dshard, ptp)?;
        Ok(Resharded {
            dshard,
            prefill_tp: ptp,
            keys,
            sources,
            jobs,
            runs,
            missing,
        })
    }
}

/// Pieces a resharded pull keeps in flight at most (beyond one layer's own).
const PIECES_IN_FLIGHT: u64 = 16 * 1024;

/// What a resharded pull moves.
pub(super) enum Moves<'a> {
    /// Block pairs of the same tokens per block on both sides.
    Blocks {
        /// Prefill blocks.
        src: &'a [u64],
        /// Decode blocks, one per prefill block.
        dst: &'a [u64],
    },
    /// A request's tokens by position, of any tokens per block on each side.
    Tokens(&'a TokenMap),
}

impl Moves<'_> {
    /// The prefill blocks read (a lease must cover each).
    pub(super) fn src_blocks(&self) -> Vec<u64> {
        match self {
            Moves::Blocks { src, .. } => src.to_vec(),
            Moves::Tokens(map) => map.src.iter().flatten().copied().collect(),
        }
    }
}

/// A resharded pull, planned: every check passed and every descriptor built; nothing moved.
pub(super) struct Resharded {
    /// The decode rank's shard.
    pub dshard: KvShard,
    /// The prefill group's TP size.
    pub prefill_tp: u32,
    /// Per prefill key given, in order: its TP rank and its cache id at the prefill rank.
    pub keys: Vec<(u32, i64)>,
    /// The prefill ranks the decode rank reads, in plan order.
    pub sources: Vec<u32>,
    /// `((src layer, dst layer), prefill rank's peer, descriptors)`.
    jobs: Vec<((u32, u32), Peer, Vec<StridedDesc>)>,
    runs: Vec<Run>,
    /// The note for an error when a prefill rank's tensor is missing from its memory table.
    missing: String,
}

impl Resharded {
    /// Moves every descriptor at once, each transfer bounded by `bound`. On failure the
    /// error lists the (layer, block) pairs that did not land.
    /// Layers go out together while their pieces fit [`PIECES_IN_FLIGHT`] (a converted pull
    /// of small pieces would overflow a transport's submission ring), then wave by wave.
    pub(super) async fn run(self, bound: Bound) -> Result<()> {
        let mut results = Vec::with_capacity(self.jobs.len());
        let mut rest = &self.jobs[..];
        while !rest.is_empty() {
            let (mut n, mut pieces) = (0, 0u64);
            for (_, _, d) in rest {
                let p: u64 = d.iter().map(|x| x.count).sum();
                if n > 0 && pieces + p > PIECES_IN_FLIGHT {
                    break;
                }
                n += 1;
                pieces += p;
            }
            let (wave, next) = rest.split_at(n);
            rest = next;
            results.extend(
                futures::future::join_all(
                    wave.iter().map(|(_, peer, d)| {
                        bound.apply(peer.transfer_strided(TransferOp::Read, d))
                    }),
                )
                .await,
            );
        }
        let layers: Vec<(u32, u32)> = self.jobs.iter().map(|(l, _, _)| *l).collect();
        super::transfers::layer_outcome(&layers, results, &self.runs).map_err(|mut e| {
            e.message.push_str(&self.missing);
            e
        })
    }
}
