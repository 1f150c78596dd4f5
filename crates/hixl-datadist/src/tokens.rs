//! Different block sizes on the two sides: a request's tokens, wherever each side's blocks put
//! them. The prefill holds token `t` in its block at position `t / Bs`, at row `t % Bs`; the
//! decode wants it in its block at position `t / Bd`, row `t % Bd`. [`plan_tokens`] cuts the
//! request into segments that lie in one block on each side; [`seg_descs`] turns a segment and
//! a head slice into strided descriptors straight into the decode's layout (no staging copy),
//! and [`merge`] joins the descriptors that continue each other (consecutive blocks of an NHD
//! cache become one piece again). Pure: no I/O, tested against a direct byte model.

use std::collections::HashMap;

use hixl_core::StridedDesc;

use crate::cache::Run;
use crate::status::{DataDistError, Result};
use crate::tp::{HeadSlice, KvLayout, ShardSide};

/// A request's blocks on both sides, by position.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenMap {
    /// The source's block at each of its positions (position `i` holds tokens
    /// `[i·Bs, (i+1)·Bs)`); `None` where it holds none (a sliding window's dropped position).
    pub src: Vec<Option<u64>>,
    /// The destination's block to fill at each of its positions (`[j·Bd, (j+1)·Bd)`); `None`
    /// where nothing is to land (a local prefix hit, a dropped position).
    pub dst: Vec<Option<u64>>,
    /// The request's tokens: rows at or past it are never moved (a last block's tail).
    pub tokens: u64,
}

/// Tokens that lie in one block on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seg {
    /// Source block.
    pub src_block: u64,
    /// First row in it.
    pub src_row: u64,
    /// Destination block.
    pub dst_block: u64,
    /// First row in it.
    pub dst_row: u64,
    /// Rows (tokens).
    pub rows: u64,
}

/// What moves for a [`TokenMap`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenPlan {
    /// The segments, in destination order.
    pub segs: Vec<Seg>,
    /// Destination blocks that land whole (every row of theirs below `tokens`).
    pub landing: Vec<u64>,
    /// Destination blocks that cannot land: a row of theirs below `tokens` that the source
    /// holds no block for (past its blocks, or a dropped position). Nothing of them moves.
    pub missing: Vec<u64>,
}

impl TokenPlan {
    /// One run per landing block (source: its first segment's block), for naming the
    /// (layer, block) pairs of a failed layer.
    pub fn runs(&self) -> Vec<Run> {
        let mut out: Vec<Run> = Vec::with_capacity(self.landing.len());
        for s in &self.segs {
            if out.last().map(|r| r.dst) != Some(s.dst_block) {
                out.push(Run {
                    src: s.src_block,
                    dst: s.dst_block,
                    count: 1,
                });
            }
        }
        out
    }

    /// The source blocks read, each once, in order of first use.
    pub fn src_blocks(&self) -> Vec<u64> {
        let mut seen = std::collections::HashSet::new();
        self.segs
            .iter()
            .filter(|s| seen.insert(s.src_block))
            .map(|s| s.src_block)
            .collect()
    }
}

/// Plans `map` between a source of `src_rows` tokens per block (`src_units` blocks) and a
/// destination of `dst_rows` (`dst_units` blocks).
///
/// # Errors
/// `LLM_PARAM_INVALID` for a block size of 0, a block past its cache, a destination block
/// given at two positions, or positions whose tokens overflow.
pub fn plan_tokens(
    map: &TokenMap,
    src_rows: u64,
    dst_rows: u64,
    src_units: u64,
    dst_units: u64,
) -> Result<TokenPlan> {
    if src_rows == 0 || dst_rows == 0 {
        return Err(DataDistError::param(format!(
            "block sizes {src_rows} (source) and {dst_rows} (destination): a block holds at \
             least one token"
        )));
    }
    for (i, b) in map.src.iter().enumerate() {
        if let Some(b) = b.filter(|&b| b >= src_units) {
            return Err(DataDistError::param(format!(
                "source block {b} (position {i}) is past the source cache's {src_units} blocks"
            )));
        }
    }
    let mut at: HashMap<u64, usize> = HashMap::with_capacity(map.dst.len());
    let mut plan = TokenPlan::default();
    for (j, b) in map.dst.iter().enumerate() {
        let Some(b) = *b else { continue };
        if b >= dst_units {
            return Err(DataDistError::param(format!(
                "destination block {b} (position {j}) is past the destination cache's \
                 {dst_units} blocks"
            )));
        }
        if let Some(k) = at.insert(b, j) {
            return Err(DataDistError::param(format!(
                "destination block {b} is given at positions {k} and {j}: it would be \
                 written twice"
            )));
        }
        let overflow = || DataDistError::param(format!("position {j} overflows the tokens"));
        let first = (j as u64).checked_mul(dst_rows).ok_or_else(overflow)?;
        let end = first
            .checked_add(dst_rows)
            .ok_or_else(overflow)?
            .min(map.tokens);
        if first >= end {
            plan.missing.push(b);
            continue;
        }
        let mark = plan.segs.len();
        let mut t = first;
        while t < end {
            let i = t / src_rows;
            let stop = (i + 1).saturating_mul(src_rows).min(end);
            match usize::try_from(i)
                .ok()
                .and_then(|i| map.src.get(i))
                .copied()
                .flatten()
            {
                Some(sb) => plan.segs.push(Seg {
                    src_block: sb,
                    src_row: t - i * src_rows,
                    dst_block: b,
                    dst_row: t - first,
                    rows: stop - t,
                }),
                None => break,
            }
            t = stop;
        }
        if t < end {
            plan.segs.truncate(mark);
            plan.missing.push(b);
        } else {
            plan.landing.push(b);
        }
    }
    Ok(plan)
}

/// The strided descriptors that move `slice`'s heads of `segs` from a source tensor (`src`,
/// remote) to a destination tensor (`dst`, local), the two of any tokens per block, then
/// [`merge`]d.
///
/// # Errors
/// `LLM_PARAM_INVALID` when the two differ in head size, layout or MLA, or the slice's heads
/// are not held by both.
pub fn seg_descs(
    src: &ShardSide,
    dst: &ShardSide,
    slice: &HeadSlice,
    segs: &[Seg],
) -> Result<Vec<StridedDesc>> {
    if src.head_bytes() != dst.head_bytes()
        || src.shard.layout != dst.shard.layout
        || src.shard.mla != dst.shard.mla
    {
        return Err(DataDistError::param(format!(
            "prefill rank {} ({:?}{}, {} B per head) and decode rank {} ({:?}{}, {} B per \
             head) differ in head size or layout",
            src.shard.tp_rank,
            src.shard.layout,
            if src.shard.mla { ", MLA" } else { "" },
            src.head_bytes(),
            dst.shard.tp_rank,
            dst.shard.layout,
            if dst.shard.mla { ", MLA" } else { "" },
            dst.head_bytes()
        )));
    }
    let (sb, db) = (src.block_bytes()?, dst.block_bytes()?);
    let hb = src.head_bytes();
    let (sh, dh) = (src.heads_here()?, dst.heads_here()?);
    let (s_row, d_row) = (src.heads_n()? * hb, dst.heads_n()? * hb);
    let (whole, s_off, d_off, n) = if src.shard.mla {
        (true, 0, 0, 1)
    } else {
        let h = &slice.heads;
        if h.start < sh.start || h.end > sh.end || h.start < dh.start || h.end > dh.end {
            return Err(DataDistError::param(format!(
                "heads {h:?} are not held by both prefill rank {} ({sh:?}) and decode rank {} \
                 ({dh:?})",
                src.shard.tp_rank, dst.shard.tp_rank
            )));
        }
        let n = u64::from(h.end - h.start);
        let whole = n * hb == s_row && n * hb == d_row;
        (
            whole,
            u64::from(h.start - sh.start),
            u64::from(h.start - dh.start),
            n,
        )
    };
    let mut out = Vec::with_capacity(segs.len());
    for s in segs {
        let (sblk, dblk) = (src.addr + s.src_block * sb, dst.addr + s.dst_block * db);
        let d = match (src.shard.layout, whole) {
            // Whole token rows on both sides (MLA, or every head): one piece.
            (KvLayout::Nhd, true) => StridedDesc {
                local_addr: dblk + s.dst_row * d_row,
                remote_addr: sblk + s.src_row * s_row,
                len: s.rows * s_row,
                local_stride: s.rows * s_row,
                remote_stride: s.rows * s_row,
                count: 1,
            },
            // A piece per token, a token row apart.
            (KvLayout::Nhd, false) => StridedDesc {
                local_addr: dblk + s.dst_row * d_row + d_off * hb,
                remote_addr: sblk + s.src_row * s_row + s_off * hb,
                len: n * hb,
                local_stride: d_row,
                remote_stride: s_row,
                count: s.rows,
            },
            // A piece per head, a head apart (each side its own tokens per block).
            (KvLayout::Hnd, _) => StridedDesc {
                local_addr: dblk + (d_off * dst.tokens + s.dst_row) * hb,
                remote_addr: sblk + (s_off * src.tokens + s.src_row) * hb,
                len: s.rows * hb,
                local_stride: dst.tokens * hb,
                remote_stride: src.tokens * hb,
                count: n,
            },
            // Per head: its K plane's element rows (a token apart within a row), its V rows.
            (KvLayout::HndKv, _) => {
                let (e, half) = (src.elem, hb / 2);
                for i in 0..n {
                    let sh = sblk + (s_off + i) * src.tokens * hb;
                    let dh = dblk + (d_off + i) * dst.tokens * hb;
                    out.push(
                        StridedDesc {
                            local_addr: dh + s.dst_row * e,
                            remote_addr: sh + s.src_row * e,
                            len: s.rows * e,
                            local_stride: dst.tokens * e,
                            remote_stride: src.tokens * e,
                            count: half / e,
                        }
                        .merged(),
                    );
                }
                for i in 0..n {
                    let sh = sblk + (s_off + i) * src.tokens * hb + src.tokens * half;
                    let dh = dblk + (d_off + i) * dst.tokens * hb + dst.tokens * half;
                    out.push(StridedDesc {
                        local_addr: dh + s.dst_row * half,
                        remote_addr: sh + s.src_row * half,
                        len: s.rows * half,
                        local_stride: s.rows * half,
                        remote_stride: s.rows * half,
                        count: 1,
                    });
                }
                continue;
            }
        };
        // Pieces back to back on both sides (every row of a head plane): one piece.
        let d = if d.count > 1 && d.local_stride == d.len && d.remote_stride == d.len {
            d.merged()
        } else {
            d
        };
        out.push(if d.count == 1 {
            StridedDesc {
                local_stride: d.len,
                remote_stride: d.len,
                ..d
            }
        } else {
            d
        });
    }
    Ok(merge(out))
}

/// Joins descriptors that continue each other: back-to-back single pieces become one piece;
/// a descriptor whose pieces continue the previous one's stride on both sides extends it.
/// The bytes moved, and where, are unchanged.
pub fn merge(descs: Vec<StridedDesc>) -> Vec<StridedDesc> {
    let mut out: Vec<StridedDesc> = Vec::with_capacity(descs.len());
    for d in descs {
        if !out.last_mut().is_some_and(|a| extend(a, &d)) {
            out.push(d);
        }
    }
    out
}

/// Extends `a` by `b` when `b` continues it; false (and `a` unchanged) otherwise.
fn extend(a: &mut StridedDesc, b: &StridedDesc) -> bool {
    let single = |d: &StridedDesc| d.count == 1;
    if single(a)
        && single(b)
        && a.local_addr.checked_add(a.len) == Some(b.local_addr)
        && a.remote_addr.checked_add(a.len) == Some(b.remote_addr)
    {
        let Some(len) = a.len.checked_add(b.len) else {
            return false;
        };
        *a = StridedDesc {
            len,
            local_stride: len,
            remote_stride: len,
            ..*a
        };
        return true;
    }
    if a.len != b.len {
        return false;
    }
    let strides = if single(a) {
        match (
            b.local_addr.checked_sub(a.local_addr),
            b.remote_addr.checked_sub(a.remote_addr),
        ) {
            (Some(l), Some(r)) => (l, r),
            _ => return false,
        }
    } else {
        (a.local_stride, a.remote_stride)
    };
    if strides.0 < a.len || strides.1 < a.len {
        return false;
    }
    if !single(b) && (b.local_stride, b.remote_stride) != strides {
        return false;
    }
    let next = |base: u64, stride: u64| a.count.checked_mul(stride)?.checked_add(base);
    if next(a.local_addr, strides.0) != Some(b.local_addr)
        || next(a.remote_addr, strides.1) != Some(b.remote_addr)
    {
        return false;
    }
    let Some(count) = a.count.checked_add(b.count) else {
        return false;
    };
    a.local_stride = strides.0;
    a.remote_stride = strides.1;
    a.count = count;
    true
}

#[cfg(test)]
#[path = "tokens_tests.rs"]
mod tests;
