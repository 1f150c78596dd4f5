//! Real models' KV-cache geometry (from their public config.json; see data/kv-models.json),
//! and the cache descriptors a paged KV cache of such a model uses.

use serde::Deserialize;

use crate::cache::{CacheDesc, DataType};
use crate::status::{DataDistError, Result};

const MODELS: &str = include_str!("../data/kv-models.json");

/// One cache tensor kind per layer (K, V, or MLA's latent and rope).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CacheKind {
    /// Name (`k`, `v`, `latent`, `rope`).
    pub name: String,
    /// Bytes per token per layer (bf16).
    pub bytes_per_token: u64,
}

/// A model's KV geometry.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ModelGeometry {
    /// Name (`llama-3.1-8b`, `deepseek-r1`, ...).
    pub name: String,
    /// Transformer layers.
    pub layers: u32,
    /// Tokens per paged block in the usual benchmarks.
    pub block_tokens: u64,
    /// Cache tensors per layer.
    pub caches_per_layer: Vec<CacheKind>,
    /// KV heads (MHA/GQA models; `None` for MLA).
    #[serde(default)]
    pub kv_heads: Option<u32>,
    /// Elements per head (MHA/GQA models).
    #[serde(default)]
    pub head_dim: Option<u32>,
    /// Where the figures come from.
    pub config: String,
}

#[derive(Deserialize)]
struct File {
    models: Vec<ModelGeometry>,
}

/// Every known model.
pub fn all() -> Vec<ModelGeometry> {
    serde_json::from_str::<File>(MODELS)
        .map(|f| f.models)
        .unwrap_or_default()
}

/// The model called `name`.
///
/// # Errors
/// `LLM_PARAM_INVALID` naming the model and the known ones.
pub fn by_name(name: &str) -> Result<ModelGeometry> {
    let all = all();
    all.iter().find(|m| m.name == name).cloned().ok_or_else(|| {
        let names: Vec<_> = all.iter().map(|m| m.name.as_str()).collect();
        DataDistError::param(format!(
            "unknown model {name:?}; known: {}",
            names.join(", ")
        ))
    })
}

impl ModelGeometry {
    /// The paged cache of TP rank `rank` of `tp` (NHD: `[blocks, block_tokens, heads/tp,
    /// head_dim]`; HND: `[blocks, heads/tp, block_tokens, head_dim]`; K,V,K,V… tensors) and
    /// its shard, for an MHA/GQA model.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for an MLA model or a TP size the heads do not divide over.
    pub fn sharded_cache(
        &self,
        blocks: u64,
        block_tokens: u64,
        rank: u32,
        tp: u32,
        layout: crate::tp::KvLayout,
    ) -> Result<(CacheDesc, crate::tp::KvShard)> {
        let (Some(h), Some(d)) = (self.kv_heads, self.head_dim) else {
            return Err(DataDistError::param(format!(
                "{} has no KV heads to shard (MLA)",
                self.name
            )));
        };
        let shard = crate::tp::KvShard {
            tp_rank: rank,
            tp_size: tp,
            total_heads: h,
            head_dim: d,
            layout,
            mla: false,
        };
        let heads = shard.heads()?;
        let n_heads = i64::from(heads.end - heads.start);
        let n = self.caches_per_layer.len() as u32;
        let desc = CacheDesc::host(
            self.layers * n,
            DataType::BFloat16,
            match layout {
                crate::tp::KvLayout::Nhd => {
                    vec![blocks as i64, block_tokens as i64, n_heads, i64::from(d)]
                }
                crate::tp::KvLayout::Hnd | crate::tp::KvLayout::HndKv => {
                    vec![blocks as i64, n_heads, block_tokens as i64, i64::from(d)]
                }
            },
        );
        shard.check(&desc)?;
        Ok((desc, shard))
    }

    /// KV bytes of `tokens` tokens over all layers.
    pub fn bytes_for(&self, tokens: u64) -> u64 {
        let per_token: u64 = self
            .caches_per_layer
            .iter()
            .map(|c| c.bytes_per_token)
            .sum();
        per_token * u64::from(self.layers) * tokens
    }

    /// The paged caches a server registers for this model, `blocks` blocks of `block_tokens`
    /// each: one cache with K,V,K,V… tensors when all kinds are the same size (MHA/GQA), else
    /// one cache per kind with one tensor per layer (MLA), as vllm-ascend registers them.
    /// Returns `(descriptor, tensor_num_per_layer)` pairs.
    pub fn caches(&self, blocks: u64, block_tokens: u64) -> Vec<(CacheDesc, u32)> {
        let same = self
            .caches_per_layer
            .windows(2)
            .all(|w| w[0].bytes_per_token == w[1].bytes_per_token);
        let shape = |bytes_per_token: u64| {
            vec![
                blocks as i64,
                block_tokens as i64,
                (bytes_per_token / 2) as i64,
            ]
        };
        if same {
            let n = self.caches_per_layer.len() as u32;
            let bpt = self
                .caches_per_layer
                .first()
                .map(|c| c.bytes_per_token)
                .unwrap_or(2);
            vec![(
                CacheDesc::host(self.layers * n, DataType::BFloat16, shape(bpt)),
                n,
            )]
        } else {
            self.caches_per_layer
                .iter()
                .map(|c| {
                    (
                        CacheDesc::host(self.layers, DataType::BFloat16, shape(c.bytes_per_token)),
                        1,
                    )
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_models_parse_and_lay_out() {
        let l = by_name("llama-3.1-8b").unwrap();
        assert_eq!(l.bytes_for(1), 32 * 4096);
        let c = l.caches(10, 128);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0.num_tensors, 64);
        assert_eq!(c[0].0.stride().unwrap(), 128 * 2048);
        let d = by_name("deepseek-r1").unwrap();
        let c = d.caches(10, 128);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].0.stride().unwrap(), 128 * 1024);
        assert_eq!(c[1].0.stride().unwrap(), 128 * 128);
        assert!(by_name("gpt-9").is_err());
    }
}
