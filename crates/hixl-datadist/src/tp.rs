//! Heterogeneous tensor parallelism: a decode rank's KV heads come from prefill ranks of
//! another TP size. A cache registered with a [`KvShard`] says which heads it holds and how a
//! block lays them out; [`plan_heads`] says which head slice comes from which prefill rank, and
//! [`slice_descs`] turns a slice and a run of blocks into strided descriptors (no staging copy:
//! the pieces land where the decode rank's layout wants them).
//!
//! Heads are assigned as serving engines do: with `tp_size ≤ total_heads`, rank `r` holds heads
//! `[r·H/tp, (r+1)·H/tp)` (`H` divisible by `tp`); with more ranks than heads, each rank holds
//! one head, `r·H/tp`, replicated over `tp/H` ranks. MLA caches hold the shared latent on every
//! rank: nothing is split.

use std::ops::Range;

use hixl_core::StridedDesc;
use serde::{Deserialize, Serialize};

use crate::cache::{CacheDesc, DataType, Run};
use crate::status::{DataDistError, Result};

/// How a block of one tensor lays out its tokens and heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvLayout {
    /// `[block_tokens, heads, head_dim]`: a head slice is a piece per token.
    Nhd,
    /// `[heads, block_tokens, head_dim]`: a head slice is one piece per block.
    Hnd,
    /// `[heads, block_tokens, head_dim]` as vLLM's CPU attention (its `vec` kernels) fills
    /// it: per head, a K plane `[head_dim / 2, block_tokens]` (transposed: a K element's
    /// tokens side by side), then a V plane `[block_tokens, head_dim / 2]`. A head is one
    /// piece per block, as [`KvLayout::Hnd`]; between different block sizes each K element
    /// row and each V plane move apart. `head_dim` counts K and V (it is even).
    HndKv,
}

/// The part of a model's KV heads a cache holds: its rank in a tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvShard {
    /// This rank.
    pub tp_rank: u32,
    /// Ranks in the group.
    pub tp_size: u32,
    /// KV heads of the model (GQA: `num_key_value_heads`).
    pub total_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Block layout.
    pub layout: KvLayout,
    /// An MLA cache (one latent shared by all heads, the same on every rank): never split.
    pub mla: bool,
}

impl KvShard {
    /// The heads this rank holds.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for a rank past the group, an empty group or model, or heads not
    /// divisible over the group.
    pub fn heads(&self) -> Result<Range<u32>> {
        let (r, tp, h) = (self.tp_rank, self.tp_size, self.total_heads);
        if tp == 0 || h == 0 || self.head_dim == 0 || r >= tp {
            return Err(DataDistError::param(format!(
                "TP rank {r} of {tp} over {h} heads of {} elements is not a shard",
                self.head_dim
            )));
        }
        if tp <= h {
            if h % tp != 0 {
                return Err(DataDistError::param(format!(
                    "{h} KV heads do not divide over TP size {tp}"
                )));
            }
            let per = h / tp;
            Ok(r * per..(r + 1) * per)
        } else {
            if tp % h != 0 {
                return Err(DataDistError::param(format!(
                    "TP size {tp} is not a multiple of the {h} KV heads it replicates"
                )));
            }
            let head = r * h / tp;
            Ok(head..head + 1)
        }
    }

    /// Checks a cache's geometry against the shard: `shape` is `[blocks, tokens, heads,
    /// head_dim]` (NHD), `[blocks, heads, tokens, head_dim]` (HND) or, for MLA, `[blocks,
    /// tokens, latent]`. Returns the block's tokens.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` naming the mismatch.
    pub fn check(&self, desc: &CacheDesc) -> Result<u64> {
        let heads = self.heads()?;
        let s = &desc.shape;
        if self.mla {
            return match s.as_slice() {
                [_, t, _] if *t > 0 => Ok(*t as u64),
                _ => Err(DataDistError::param(format!(
                    "an MLA shard wants a shape [blocks, tokens, latent], got {s:?}"
                ))),
            };
        }
        let n = i64::from(heads.end - heads.start);
        let d = i64::from(self.head_dim);
        let tokens = match (self.layout, s.as_slice()) {
            (KvLayout::Nhd, [_, t, h, e]) if *h == n && *e == d => *t,
            (KvLayout::Hnd, [_, h, t, e]) if *h == n && *e == d => *t,
            (KvLayout::HndKv, [_, h, t, e]) if *h == n && *e == d && d % 2 == 0 => *t,
            _ => {
                return Err(DataDistError::param(format!(
                "shard of rank {} of {} ({n} heads of {d}, {:?}) does not match the shape {s:?}",
                self.tp_rank, self.tp_size, self.layout
            )))
            }
        };
        if tokens <= 0 {
            return Err(DataDistError::param(format!("shape {s:?} has no tokens")));
        }
        Ok(tokens as u64)
    }
}

/// What both sides of a resharded transfer must agree on: the model's KV geometry as one
/// cache declares it (its shard and its description).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    /// KV heads of the model.
    pub total_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Layers the transfer covers on this side.
    pub layers: u64,
    /// Element type.
    pub data_type: DataType,
    /// Block layout.
    pub layout: KvLayout,
    /// An MLA cache.
    pub mla: bool,
}

impl KvGeometry {
    /// The geometry of `shard` over `layers` layers of `data_type`.
    pub fn of(shard: &KvShard, layers: u64, data_type: DataType) -> KvGeometry {
        KvGeometry {
            total_heads: shard.total_heads,
            head_dim: shard.head_dim,
            layers,
            data_type,
            layout: shard.layout,
            mla: shard.mla,
        }
    }

    /// Refuses a prefill rank whose geometry is not the decode rank's: shards of different
    /// models (a head count, head size, element type, layout or layer count that differs)
    /// never exchange a byte, whichever rank asks.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` naming both geometries.
    pub fn check_same_model(&self, prefill_rank: u32, decode: &KvGeometry) -> Result<()> {
        if self == decode {
            return Ok(());
        }
        Err(DataDistError::param(format!(
            "prefill rank {prefill_rank} holds a shard of another model: {self} at prefill, {decode} at decode"
        )))
    }
}

impl std::fmt::Display for KvGeometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} KV heads of {} elements, {} layers of {:?}, {:?}{}",
            self.total_heads,
            self.head_dim,
            self.layers,
            self.data_type,
            self.layout,
            if self.mla { ", MLA" } else { "" }
        )
    }
}

/// Heads `heads` of a decode rank come from prefill rank `prefill_rank`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadSlice {
    /// The prefill rank.
    pub prefill_rank: u32,
    /// Global head indices.
    pub heads: Range<u32>,
}

/// Which prefill rank each of the decode rank's heads comes from, as contiguous slices. With
/// more prefill ranks than heads (replicas), decode ranks spread over the replicas. The
/// prefill group is taken to be of the decode shard's model: check each prefill shard with
/// [`KvGeometry::check_same_model`] first.
///
/// # Errors
/// `LLM_PARAM_INVALID` for invalid shards, or heads that do not divide over `prefill_tp`.
pub fn plan_heads(decode: &KvShard, prefill_tp: u32) -> Result<Vec<HeadSlice>> {
    let prefill = KvShard {
        tp_rank: 0,
        tp_size: prefill_tp,
        ..*decode
    };
    prefill.heads()?;
    let want = decode.heads()?;
    if decode.mla {
        // The latent is on every prefill rank: take it from one, spreading decode ranks.
        return Ok(vec![HeadSlice {
            prefill_rank: decode.tp_rank % prefill_tp,
            heads: want,
        }]);
    }
    let h = decode.total_heads;
    let mut out: Vec<HeadSlice> = Vec::new();
    for head in want {
        let p = if prefill_tp <= h {
            head / (h / prefill_tp)
        } else {
            let replicas = prefill_tp / h;
            head * replicas + decode.tp_rank % replicas
        };
        match out.last_mut() {
            Some(s) if s.prefill_rank == p && s.heads.end == head => s.heads.end += 1,
            _ => out.push(HeadSlice {
                prefill_rank: p,
                heads: head..head + 1,
            }),
        }
    }
    Ok(out)
}

/// The prefill ranks `decode`'s rank reads, in [`plan_heads`] order, each once.
///
/// # Errors
/// As [`plan_heads`].
pub fn sources(decode: &KvShard, prefill_tp: u32) -> Result<Vec<u32>> {
    let mut out: Vec<u32> = plan_heads(decode, prefill_tp)?
        .into_iter()
        .map(|s| s.prefill_rank)
        .collect();
    out.dedup();
    Ok(out)
}

/// The largest TP group [`readers`] plans for (its answer has an entry per prefill rank).
pub const MAX_TP: u32 = 1 << 16;

/// How many ranks of `decode`'s group (`decode.tp_size` ranks, each planned with
/// [`plan_heads`]) read each prefill rank: one count per prefill rank, 0 for a replica no
/// decode rank reads. It is the reader count a leased resharded pull declares for the lease of
/// each prefill rank, so that every decode rank reading one declares the same.
///
/// # Errors
/// As [`plan_heads`]; `LLM_PARAM_INVALID` for a group larger than [`MAX_TP`].
pub fn readers(decode: &KvShard, prefill_tp: u32) -> Result<Vec<u32>> {
    if decode.tp_size > MAX_TP || prefill_tp > MAX_TP {
        return Err(DataDistError::param(format!(
            "TP sizes {} (decode) and {prefill_tp} (prefill): the largest planned is {MAX_TP}",
            decode.tp_size
        )));
    }
    plan_heads(decode, prefill_tp)?;
    let mut out = vec![0u32; prefill_tp as usize];
    for rank in 0..decode.tp_size {
        let d = KvShard {
            tp_rank: rank,
            ..*decode
        };
        for p in sources(&d, prefill_tp)? {
            if let Some(n) = out.get_mut(p as usize) {
                *n += 1;
            }
        }
    }
    Ok(out)
}

/// One tensor of one side of a resharded transfer: its base address and shard.
#[derive(Clone, Copy, Debug)]
pub struct ShardSide {
    /// Tensor base address.
    pub addr: u64,
    /// The shard.
    pub shard: KvShard,
    /// Tokens per block.
    pub tokens: u64,
    /// Bytes per element.
    pub elem: u64,
}

impl ShardSide {
    pub(crate) fn heads_here(&self) -> Result<Range<u32>> {
        self.shard.heads()
    }

    /// Bytes of one head of one token.
    pub(crate) fn head_bytes(&self) -> u64 {
        u64::from(self.shard.head_dim) * self.elem
    }

    pub(crate) fn heads_n(&self) -> Result<u64> {
        let h = self.heads_here()?;
        Ok(u64::from(h.end - h.start))
    }

    /// Bytes of a block.
    pub(crate) fn block_bytes(&self) -> Result<u64> {
        Ok(self.tokens * self.heads_n()? * self.head_bytes())
    }
}

/// The strided descriptors that move `slice`'s heads of `runs` from a prefill tensor (`src`,
/// remote) to a decode tensor (`dst`, local). MLA (or a slice that is the whole block on both
/// sides) moves whole blocks.
///
/// # Errors
/// `LLM_PARAM_INVALID` when the slice's heads are not held by both sides or the two differ in
/// tokens per block, head size or layout.
pub fn slice_descs(
    src: &ShardSide,
    dst: &ShardSide,
    slice: &HeadSlice,
    runs: &[Run],
) -> Result<Vec<StridedDesc>> {
    if src.tokens != dst.tokens
        || src.head_bytes() != dst.head_bytes()
        || src.shard.layout != dst.shard.layout
        || src.shard.mla != dst.shard.mla
    {
        return Err(DataDistError::param(format!(
            "prefill rank {} and decode rank {} differ in tokens per block ({} / {}), head size or layout",
            src.shard.tp_rank, dst.shard.tp_rank, src.tokens, dst.tokens
        )));
    }
    let (sb, db) = (src.block_bytes()?, dst.block_bytes()?);
    if src.shard.mla {
        if sb != db {
            return Err(DataDistError::param(format!(
                "MLA blocks differ: {sb} bytes at prefill, {db} at decode"
            )));
        }
        return Ok(runs
            .iter()
            .map(|r| StridedDesc {
                local_addr: dst.addr + r.dst * db,
                remote_addr: src.addr + r.src * sb,
                len: r.count * sb,
                local_stride: r.count * sb,
                remote_stride: r.count * sb,
                count: 1,
            })
            .collect());
    }
    let (sh, dh) = (src.heads_here()?, dst.heads_here()?);
    let h = &slice.heads;
    if h.start < sh.start || h.end > sh.end || h.start < dh.start || h.end > dh.end {
        return Err(DataDistError::param(format!(
            "heads {h:?} are not held by both prefill rank {} ({sh:?}) and decode rank {} ({dh:?})",
            src.shard.tp_rank, dst.shard.tp_rank
        )));
    }
    let hb = src.head_bytes();
    let n = u64::from(h.end - h.start);
    // A token row's bytes on each side (NHD).
    let (s_row, d_row) = (src.heads_n()? * hb, dst.heads_n()? * hb);
    let (s_off, d_off) = (u64::from(h.start - sh.start), u64::from(h.start - dh.start));
    Ok(runs
        .iter()
        .map(|r| match src.shard.layout {
            // A head slice of a block is one piece; consecutive blocks are a block apart.
            KvLayout::Hnd | KvLayout::HndKv => StridedDesc {
                local_addr: dst.addr + r.dst * db + d_off * dst.tokens * hb,
                remote_addr: src.addr + r.src * sb + s_off * src.tokens * hb,
                len: n * src.tokens * hb,
                local_stride: db,
                remote_stride: sb,
                count: r.count,
            },
            // A piece per token, a token row apart, through every block of the run.
            KvLayout::Nhd => StridedDesc {
                local_addr: dst.addr + r.dst * db + d_off * hb,
                remote_addr: src.addr + r.src * sb + s_off * hb,
                len: n * hb,
                local_stride: d_row,
                remote_stride: s_row,
                count: r.count * src.tokens,
            },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(r: u32, tp: u32, h: u32, layout: KvLayout) -> KvShard {
        KvShard {
            tp_rank: r,
            tp_size: tp,
            total_heads: h,
            head_dim: 4,
            layout,
            mla: false,
        }
    }

    #[test]
    fn heads_and_plans() {
        assert_eq!(shard(1, 4, 8, KvLayout::Nhd).heads().unwrap(), 2..4);
        assert_eq!(shard(5, 16, 8, KvLayout::Nhd).heads().unwrap(), 2..3);
        assert!(shard(4, 4, 8, KvLayout::Nhd).heads().is_err());
        assert!(shard(0, 3, 8, KvLayout::Nhd).heads().is_err());
        assert!(shard(0, 12, 8, KvLayout::Nhd).heads().is_err());
        // D_TP=2 from P_TP=4: decode rank 1 holds heads 4..8 = prefill ranks 2 and 3.
        let p = plan_heads(&shard(1, 2, 8, KvLayout::Nhd), 4).unwrap();
        assert_eq!(
            p,
            vec![
                HeadSlice {
                    prefill_rank: 2,
                    heads: 4..6
                },
                HeadSlice {
                    prefill_rank: 3,
                    heads: 6..8
                }
            ]
        );
        // D_TP=2 from P_TP=1: everything from rank 0.
        let p = plan_heads(&shard(0, 2, 8, KvLayout::Hnd), 1).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].heads, 0..4);
        // Replicas: 2 heads over P_TP=4 (each head on 2 ranks); decode ranks spread.
        let a = plan_heads(&shard(0, 2, 2, KvLayout::Nhd), 4).unwrap();
        let b = plan_heads(&shard(1, 2, 2, KvLayout::Nhd), 4).unwrap();
        assert_eq!((a[0].prefill_rank, b[0].prefill_rank), (0, 3));
        // MLA: one rank, no split.
        let mla = KvShard {
            mla: true,
            ..shard(3, 4, 1, KvLayout::Nhd)
        };
        assert_eq!(plan_heads(&mla, 2).unwrap()[0].prefill_rank, 1);
    }

    #[test]
    fn readers_count_the_decode_ranks_of_each_prefill_rank() {
        let r = |ptp, dtp, h| readers(&shard(0, dtp, h, KvLayout::Nhd), ptp).unwrap();
        assert_eq!(r(4, 2, 8), [1, 1, 1, 1]);
        assert_eq!(r(1, 2, 8), [2]);
        assert_eq!(r(2, 4, 8), [2, 2]);
        // 2 heads over P_TP=8: each head on 4 ranks; decode rank 0 reads head 0 from rank 0,
        // decode rank 1 head 1 from rank 4 + 1 % 4 (decode ranks spread over the replicas).
        assert_eq!(r(8, 2, 2), [1, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(r(4, 2, 2), [1, 0, 0, 1]);
        let mla = KvShard {
            mla: true,
            ..shard(0, 4, 1, KvLayout::Nhd)
        };
        assert_eq!(readers(&mla, 2).unwrap(), [2, 2]);
        assert_eq!(readers(&mla, 8).unwrap(), [1, 1, 1, 1, 0, 0, 0, 0]);
        assert_eq!(sources(&shard(1, 2, 8, KvLayout::Nhd), 4).unwrap(), [2, 3]);
        assert_eq!(sources(&shard(1, 2, 2, KvLayout::Nhd), 8).unwrap(), [5]);
        assert!(readers(&shard(0, 2, 8, KvLayout::Nhd), 3).is_err());
        assert!(readers(&shard(0, 2, 8, KvLayout::Nhd), 0).is_err());
        assert!(readers(&shard(0, 1, 1, KvLayout::Nhd), MAX_TP + 1).is_err());
        // Every count agrees with the plans it sums.
        for (ptp, dtp, h) in [(4, 2, 8), (2, 8, 8), (16, 4, 4), (1, 1, 8)] {
            let n = r(ptp, dtp, h);
            let mut want = vec![0; ptp as usize];
            for d in 0..dtp {
                for p in sources(&shard(d, dtp, h, KvLayout::Hnd), ptp).unwrap() {
                    want[p as usize] += 1;
                }
            }
            assert_eq!(n, want, "P_TP={ptp} D_TP={dtp} H={h}");
        }
    }

    /// Against a direct model: every byte of every needed head lands where the decode layout
    /// wants it, from where the prefill layout holds it, and nothing else moves.
    #[test]
    fn descriptors_match_a_direct_model() {
        for layout in [KvLayout::Nhd, KvLayout::Hnd] {
            for (ptp, dtp, h) in [(4, 2, 8), (1, 2, 8), (2, 4, 8), (4, 2, 2), (2, 2, 4)] {
                for d in 0..dtp {
                    let ds = shard(d, dtp, h, layout);
                    let (tokens, elem, hd) = (3u64, 2u64, 4u64);
                    let runs = [
                        Run {
                            src: 1,
                            dst: 0,
                            count: 2,
                        },
                        Run {
                            src: 5,
                            dst: 3,
                            count: 1,
                        },
                    ];
                    let mut got = Vec::new();
                    for s in plan_heads(&ds, ptp).unwrap() {
                        let ps = shard(s.prefill_rank, ptp, h, layout);
                        let src = ShardSide {
                            addr: 1 << 40,
                            shard: ps,
                            tokens,
                            elem,
                        };
                        let dst = ShardSide {
                            addr: 1 << 20,
                            shard: ds,
                            tokens,
                            elem,
                        };
                        for x in slice_descs(&src, &dst, &s, &runs).unwrap() {
                            x.spans(0).unwrap();
                            for i in 0..x.count {
                                let p = x.piece(i);
                                for k in 0..p.len {
                                    got.push((s.prefill_rank, p.remote_addr + k, p.local_addr + k));
                                }
                            }
                        }
                    }
                    // The model: byte (token t, head g, element e) of block b.
                    let at = |rank_heads: Range<u32>, b: u64, t: u64, g: u32, e: u64| {
                        let n = u64::from(rank_heads.end - rank_heads.start);
                        let gi = u64::from(g - rank_heads.start);
                        let block = tokens * n * hd * elem;
                        b * block
                            + match layout {
                                KvLayout::Nhd => (t * n + gi) * hd * elem + e,
                                KvLayout::Hnd | KvLayout::HndKv => {
                                    (gi * tokens + t) * hd * elem + e
                                }
                            }
                    };
                    let mut want = Vec::new();
                    for r in &runs {
                        for k in 0..r.count {
                            for g in ds.heads().unwrap() {
                                let p = plan_heads(&ds, ptp)
                                    .unwrap()
                                    .into_iter()
                                    .find(|s| s.heads.contains(&g))
                                    .unwrap()
                                    .prefill_rank;
                                let ph = shard(p, ptp, h, layout).heads().unwrap();
                                for t in 0..tokens {
                                    for e in 0..hd * elem {
                                        want.push((
                                            p,
                                            (1 << 40) + at(ph.clone(), r.src + k, t, g, e),
                                            (1 << 20) + at(ds.heads().unwrap(), r.dst + k, t, g, e),
                                        ));
                                    }
                                }
                            }
                        }
                    }
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(got, want, "{layout:?} P_TP={ptp} D_TP={dtp} H={h} rank {d}");
                }
            }
        }
    }
}
