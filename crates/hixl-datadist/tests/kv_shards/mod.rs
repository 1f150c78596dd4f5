//! What the resharding tests share: KV shards of a small model, caches that hold them, a byte
//! pattern that names (tensor, block, token, head, byte), and the check that a decode rank's
//! cache holds exactly the blocks it pulled.
#![allow(dead_code)]

use std::collections::HashMap;

use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, DataType, KvLayout, KvShard, LlmDataDist, LlmRole,
};

pub const HEAD_DIM: u32 = 16;
pub const TOKENS: i64 = 4;
pub const BLOCKS: i64 = 16;
/// 2 layers × K, V.
pub const TENSORS: u32 = 4;

pub fn shard(rank: u32, tp: u32, heads: u32, layout: KvLayout) -> KvShard {
    KvShard {
        tp_rank: rank,
        tp_size: tp,
        total_heads: heads,
        head_dim: HEAD_DIM,
        layout,
        mla: false,
    }
}

pub fn desc(s: &KvShard) -> CacheDesc {
    let h = s.heads().unwrap();
    let n = i64::from(h.end - h.start);
    let shape = match s.layout {
        KvLayout::Nhd => vec![BLOCKS, TOKENS, n, i64::from(HEAD_DIM)],
        KvLayout::Hnd | KvLayout::HndKv => vec![BLOCKS, n, TOKENS, i64::from(HEAD_DIM)],
    };
    CacheDesc::host(TENSORS, DataType::BFloat16, shape)
}

/// The byte at (tensor, block, token, global head, byte of the head).
fn byte(t: usize, b: u64, tok: u64, g: u32, e: u64) -> u8 {
    ((t as u64) * 131 + b * 37 + tok * 11 + u64::from(g) * 5 + e) as u8 | 0x80
}

/// Block `b` of tensor `t` of a cache holding `s`'s heads, as the layout lays it out, with
/// the pattern of source block `src`.
pub fn block_bytes(s: &KvShard, t: usize, src: u64) -> Vec<u8> {
    let h = s.heads().unwrap();
    let hb = u64::from(HEAD_DIM) * 2;
    let mut v = Vec::new();
    match s.layout {
        KvLayout::Nhd => {
            for tok in 0..TOKENS as u64 {
                for g in h.clone() {
                    v.extend((0..hb).map(|e| byte(t, src, tok, g, e)));
                }
            }
        }
        KvLayout::Hnd | KvLayout::HndKv => {
            for g in h.clone() {
                for tok in 0..TOKENS as u64 {
                    v.extend((0..hb).map(|e| byte(t, src, tok, g, e)));
                }
            }
        }
    }
    v
}

/// Writes every block of every tensor of `c` (a prefill rank's cache of shard `s`).
pub fn fill(c: &Cache, s: &KvShard) {
    let stride = c.desc.stride().unwrap();
    for t in 0..TENSORS as usize {
        for b in 0..BLOCKS as u64 {
            c.tensor(t)
                .unwrap()
                .write_at(b * stride, &block_bytes(s, t, b))
                .unwrap();
        }
    }
}

/// Checks a decode rank's cache `c` of shard `s`: each destination block of `pulled` (dst →
/// src) holds its source block's heads, every other block is untouched (zero).
pub fn check_pulled(c: &Cache, s: &KvShard, pulled: &HashMap<u64, u64>, what: &str) {
    let stride = c.desc.stride().unwrap() as usize;
    let mut got = vec![0u8; stride];
    for t in 0..TENSORS as usize {
        for b in 0..BLOCKS as u64 {
            c.tensor(t)
                .unwrap()
                .read_at(b * stride as u64, &mut got)
                .unwrap();
            match pulled.get(&b) {
                Some(&from) => assert!(
                    got == block_bytes(s, t, from),
                    "{what}: decode rank {} tensor {t} block {b} (from {from}) differs",
                    s.tp_rank
                ),
                None => assert!(
                    got.iter().all(|&x| x == 0),
                    "{what}: block {b} was not pulled but written"
                ),
            }
        }
    }
}

pub fn key(cluster: u64) -> BlocksCacheKey {
    BlocksCacheKey {
        cluster_id: cluster,
        model_id: 0,
    }
}

pub async fn started(cluster: u64, role: LlmRole, transport: &str) -> LlmDataDist {
    let mut dd = LlmDataDist::new(cluster, role);
    dd.initialize(&[
        ("llm.ListenIpInfo", "127.0.0.1:0"),
        ("hixl.Transport", transport),
    ])
    .await
    .unwrap();
    dd
}
