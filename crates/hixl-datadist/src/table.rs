//! The cache table a cluster publishes: which caches it registered, under which keys, with
//! what geometry and where. Peers READ it one-sidedly at link time from a region named
//! [`TABLE_REGION`].

use serde::{Deserialize, Serialize};

use crate::cache::{BlocksCacheKey, CacheDesc};
use crate::status::{DataDistError, Result};

/// Name of the exported region that holds the serialized table.
pub const TABLE_REGION: &str = "llm.cache_table";

/// One registered cache, as peers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheEntry {
    /// The id `register_kv_cache` returned.
    pub cache_id: i64,
    /// The blocks-cache key, if registered under one.
    pub key: Option<BlocksCacheKey>,
    /// Geometry.
    pub desc: CacheDesc,
    /// Tensor addresses in the owner's address space.
    pub addrs: Vec<u64>,
}

/// A cluster's published caches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheTable {
    /// The owner's cluster id.
    pub cluster_id: u64,
    /// Its caches.
    pub caches: Vec<CacheEntry>,
}

impl CacheTable {
    /// `u32` length, then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut out = Vec::with_capacity(4 + json.len());
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        out
    }

    /// Parses what [`CacheTable::encode`] wrote, from a peer: never panics.
    ///
    /// # Errors
    /// `LLM_LINK_FAILED` for a malformed table.
    pub fn decode(b: &[u8]) -> Result<CacheTable> {
        let bad = |why: String| {
            DataDistError::new(
                crate::LlmStatus::LinkFailed,
                format!("peer cache table: {why}"),
            )
        };
        let len = b
            .get(..4)
            .map(|l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize)
            .ok_or_else(|| bad("shorter than its length field".into()))?;
        let json = b.get(4..4 + len).ok_or_else(|| {
            bad(format!(
                "says {len} bytes, has {}",
                b.len().saturating_sub(4)
            ))
        })?;
        serde_json::from_slice(json).map_err(|e| bad(e.to_string()))
    }

    /// The cache registered under `key`.
    pub fn by_key(&self, key: BlocksCacheKey) -> Option<&CacheEntry> {
        self.caches.iter().find(|c| c.key == Some(key))
    }

    /// The cache with `cache_id`.
    pub fn by_id(&self, cache_id: i64) -> Option<&CacheEntry> {
        self.caches.iter().find(|c| c.cache_id == cache_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::DataType;

    #[test]
    fn round_trip_and_garbage() {
        let t = CacheTable {
            cluster_id: 7,
            caches: vec![CacheEntry {
                cache_id: 1,
                key: Some(BlocksCacheKey {
                    cluster_id: 7,
                    model_id: 0,
                }),
                desc: CacheDesc::host(2, DataType::BFloat16, vec![4, 16]),
                addrs: vec![0x1000, 0x2000],
            }],
        };
        assert_eq!(CacheTable::decode(&t.encode()).unwrap(), t);
        assert!(CacheTable::decode(&[]).is_err());
        assert!(CacheTable::decode(&[255, 255, 255, 255, b'{']).is_err());
        assert!(CacheTable::decode(&[1, 0, 0, 0, b'x']).is_err());
    }
}
