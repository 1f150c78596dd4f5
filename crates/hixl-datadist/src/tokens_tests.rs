use std::ops::Range;

use super::*;
use crate::tp::{plan_heads, KvShard};

fn shard(r: u32, tp: u32, h: u32, layout: KvLayout, mla: bool) -> KvShard {
    KvShard {
        tp_rank: r,
        tp_size: tp,
        total_heads: h,
        head_dim: 4,
        layout,
        mla,
    }
}

#[test]
fn segments_follow_each_token() {
    // Bs 2 → Bd 4, 7 tokens: decode block 9 (pos 0) from 5 and 6, block 3 (pos 1) from 7, 8.
    let map = TokenMap {
        src: vec![Some(5), Some(6), Some(7), Some(8)],
        dst: vec![Some(9), Some(3)],
        tokens: 7,
    };
    let p = plan_tokens(&map, 2, 4, 10, 10).unwrap();
    assert_eq!(p.landing, [9, 3]);
    assert!(p.missing.is_empty());
    let rows: Vec<_> = p
        .segs
        .iter()
        .map(|s| (s.src_block, s.src_row, s.dst_block, s.dst_row, s.rows))
        .collect();
    assert_eq!(
        rows,
        [
            (5, 0, 9, 0, 2),
            (6, 0, 9, 2, 2),
            (7, 0, 3, 0, 2),
            (8, 0, 3, 2, 1)
        ]
    );
    assert_eq!(p.src_blocks(), [5, 6, 7, 8]);
    // Bs 4 → Bd 2: each source block feeds two destination blocks.
    let map = TokenMap {
        src: vec![Some(1), Some(2)],
        dst: vec![None, Some(4), Some(5), Some(6), Some(7)],
        tokens: 7,
    };
    let p = plan_tokens(&map, 4, 2, 3, 8).unwrap();
    assert_eq!(p.landing, [4, 5, 6]);
    // Position 4 holds tokens 8..10, past the request's 7.
    assert_eq!(p.missing, [7]);
    assert_eq!(
        p.segs[0],
        Seg {
            src_block: 1,
            src_row: 2,
            dst_block: 4,
            dst_row: 0,
            rows: 2
        }
    );
    // A dropped source position fails the destination blocks that need it, only them.
    let map = TokenMap {
        src: vec![None, Some(2), Some(3)],
        dst: vec![Some(1), Some(4), Some(5)],
        tokens: 9,
    };
    let p = plan_tokens(&map, 3, 4, 4, 6).unwrap();
    assert_eq!((p.landing, p.missing), (vec![4, 5], vec![1]));
}

#[test]
fn bad_maps_are_refused_by_name() {
    let map = |src: Vec<Option<u64>>, dst: Vec<Option<u64>>| TokenMap {
        src,
        dst,
        tokens: 8,
    };
    let e = plan_tokens(&map(vec![Some(9)], vec![Some(0)]), 4, 4, 4, 4).unwrap_err();
    assert!(e.message.contains("source block 9"), "{e}");
    let e = plan_tokens(&map(vec![Some(0)], vec![Some(4)]), 4, 4, 4, 4).unwrap_err();
    assert!(e.message.contains("destination block 4"), "{e}");
    let e = plan_tokens(&map(vec![Some(0)], vec![Some(1), Some(1)]), 4, 4, 4, 4).unwrap_err();
    assert!(e.message.contains("positions 0 and 1"), "{e}");
    assert!(plan_tokens(&map(vec![], vec![]), 0, 4, 4, 4).is_err());
    let huge = TokenMap {
        src: vec![Some(0)],
        dst: vec![Some(0), Some(1)],
        tokens: u64::MAX,
    };
    assert!(plan_tokens(&huge, 1, u64::MAX, 1, 2).is_err());
}

#[test]
fn merge_joins_only_what_continues() {
    let one = |l: u64, r: u64, len: u64| StridedDesc {
        local_addr: l,
        remote_addr: r,
        len,
        local_stride: len,
        remote_stride: len,
        count: 1,
    };
    // Back to back on both sides: one piece.
    assert_eq!(
        merge(vec![one(0, 100, 8), one(8, 108, 8)]),
        [one(0, 100, 16)]
    );
    // Back to back on one side only: two pieces become one strided descriptor.
    let m = merge(vec![one(0, 100, 8), one(8, 200, 8), one(16, 300, 8)]);
    assert_eq!(m.len(), 1);
    assert_eq!(
        (m[0].count, m[0].local_stride, m[0].remote_stride),
        (3, 8, 100)
    );
    // Overlap or going backwards: untouched.
    assert_eq!(merge(vec![one(0, 100, 8), one(4, 104, 8)]).len(), 2);
    assert_eq!(merge(vec![one(64, 100, 8), one(0, 108, 8)]).len(), 2);
}

/// Every byte of every head the decode rank holds, for every token of every landing block,
/// comes from where the prefill rank holding that head keeps that token, and nothing else
/// moves: NHD, HND and MLA, across TP sizes and block sizes.
#[test]
fn descriptors_match_a_direct_model() {
    let (elem, hd) = (2u64, 4u64);
    let cases = [(4, 2, 8), (1, 2, 8), (2, 4, 8), (4, 2, 2), (2, 2, 4)];
    for (layout, mla) in [
        (KvLayout::Nhd, false),
        (KvLayout::Hnd, false),
        (KvLayout::HndKv, false),
        (KvLayout::Nhd, true),
    ] {
        for (ptp, dtp, heads) in cases {
            let heads = if mla { 1 } else { heads };
            for (bs, bd) in [(2u64, 8u64), (8, 2), (4, 4), (3, 5), (5, 3)] {
                let map = TokenMap {
                    src: vec![Some(7), Some(2), None, Some(3), Some(4), Some(0), Some(1)],
                    dst: vec![Some(5), None, Some(1), Some(6), Some(0), Some(2)],
                    tokens: 7 * bs - 1,
                };
                let plan = plan_tokens(&map, bs, bd, 8, 8).unwrap();
                for d in 0..dtp {
                    let ds = shard(d, dtp, heads, layout, mla);
                    let side = |addr, s: KvShard, tokens| ShardSide {
                        addr,
                        shard: s,
                        tokens,
                        elem,
                    };
                    let mut got = Vec::new();
                    for sl in plan_heads(&ds, ptp).unwrap() {
                        let ps = shard(sl.prefill_rank, ptp, heads, layout, mla);
                        let descs = seg_descs(
                            &side(1 << 40, ps, bs),
                            &side(1 << 20, ds, bd),
                            &sl,
                            &plan.segs,
                        )
                        .unwrap();
                        for x in descs {
                            x.spans(0).unwrap();
                            for i in 0..x.count {
                                let p = x.piece(i);
                                for k in 0..p.len {
                                    got.push((
                                        sl.prefill_rank,
                                        p.remote_addr + k,
                                        p.local_addr + k,
                                    ));
                                }
                            }
                        }
                    }
                    // Byte (token row t, head g, element e) of block b of a rank holding
                    // `rh` with `rows` tokens per block.
                    let at = |rh: Range<u32>, rows: u64, b: u64, t: u64, g: u32, e: u64| {
                        let n = u64::from(rh.end - rh.start);
                        let gi = u64::from(g - rh.start);
                        b * rows * n * hd * elem
                            + match layout {
                                KvLayout::Nhd => (t * n + gi) * hd * elem + e,
                                KvLayout::Hnd => (gi * rows + t) * hd * elem + e,
                                // K plane [element, token], then V plane [token, element].
                                KvLayout::HndKv => {
                                    let half = hd * elem / 2;
                                    let head = gi * rows * hd * elem;
                                    if e < half {
                                        head + ((e / elem) * rows + t) * elem + e % elem
                                    } else {
                                        head + rows * half + t * half + (e - half)
                                    }
                                }
                            }
                    };
                    let mut want = Vec::new();
                    for (j, b) in map.dst.iter().enumerate() {
                        let Some(b) = *b else { continue };
                        if !plan.landing.contains(&b) {
                            continue;
                        }
                        let j = j as u64;
                        for t in j * bd..((j + 1) * bd).min(map.tokens) {
                            let sb = map.src[(t / bs) as usize].unwrap();
                            for g in ds.heads().unwrap() {
                                let p = plan_heads(&ds, ptp)
                                    .unwrap()
                                    .into_iter()
                                    .find(|s| s.heads.contains(&g))
                                    .unwrap()
                                    .prefill_rank;
                                let ph = shard(p, ptp, heads, layout, mla).heads().unwrap();
                                for e in 0..hd * elem {
                                    want.push((
                                        p,
                                        (1 << 40) + at(ph.clone(), bs, sb, t % bs, g, e),
                                        (1 << 20) + at(ds.heads().unwrap(), bd, b, t % bd, g, e),
                                    ));
                                }
                            }
                        }
                    }
                    got.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(
                        got, want,
                        "{layout:?} mla={mla} P_TP={ptp} D_TP={dtp} H={heads} Bs={bs} Bd={bd} rank {d}"
                    );
                }
            }
        }
    }
}

/// Consecutive blocks of an NHD cache with every head: a whole converted request is as few
/// pieces as the same-size one.
#[test]
fn consecutive_nhd_blocks_merge_back_into_runs() {
    let map = TokenMap {
        src: (0..8).map(Some).collect(),
        dst: vec![Some(0)],
        tokens: 128,
    };
    let plan = plan_tokens(&map, 16, 128, 8, 1).unwrap();
    let s = shard(0, 1, 2, KvLayout::Nhd, false);
    let side = |addr, tokens| ShardSide {
        addr,
        shard: s,
        tokens,
        elem: 2,
    };
    let sl = plan_heads(&s, 1).unwrap().remove(0);
    let d = seg_descs(&side(1 << 40, 16), &side(1 << 20, 128), &sl, &plan.segs).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].len, 128 * 2 * 4 * 2);
}
