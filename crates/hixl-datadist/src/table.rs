//! The cache table a cluster publishes: which caches it registered, under which keys, with
//! what geometry and where. Peers READ it one-sidedly at link time from a region named
//! [`TABLE_REGION`].

use serde::{Deserialize, Serialize};

use crate::cache::{BlocksCacheKey, CacheDesc, CacheKey};
use crate::status::{DataDistError, Result};

/// Name of the exported region that holds the serialized table.
pub const TABLE_REGION: &str = "llm.cache_table";

/// What [`CacheTable::decode`] says of a table whose checksum does not match.
pub(crate) const TORN: &str = "checksum mismatch (read while the owner rewrote it)";

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

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
    /// Request keys of a contiguous cache, each with the batch entry it names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<(CacheKey, u32)>,
    /// The KV heads the cache holds, when it is one rank of a tensor-parallel group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::tp::KvShard>,
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
    /// `u32` length, `u64` FNV-1a checksum of the JSON, then the JSON. The owner rewrites
    /// the table in place while peers may read it; the checksum catches a torn read.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut out = Vec::with_capacity(12 + json.len());
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&fnv1a(&json).to_le_bytes());
        out.extend_from_slice(&json);
        out
    }

    /// Parses what [`CacheTable::encode`] wrote, from a peer: never panics.
    ///
    /// # Errors
    /// `LLM_LINK_FAILED` for a malformed table or a checksum mismatch (a read that raced the
    /// owner's rewrite: read again).
    pub fn decode(b: &[u8]) -> Result<CacheTable> {
        let bad = |why: String| {
            DataDistError::new(
                crate::LlmStatus::LinkFailed,
                format!("peer cache table: {why}"),
            )
        };
        let head = b
            .get(..12)
            .ok_or_else(|| bad("shorter than its header".into()))?;
        let mut len = [0u8; 4];
        len.copy_from_slice(&head[..4]);
        let len = u32::from_le_bytes(len) as usize;
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&head[4..12]);
        let json = b.get(12..12 + len).ok_or_else(|| {
            bad(format!(
                "says {len} bytes, has {}",
                b.len().saturating_sub(12)
            ))
        })?;
        if fnv1a(json) != u64::from_le_bytes(sum) {
            return Err(bad(TORN.into()));
        }
        serde_json::from_slice(json).map_err(|e| bad(e.to_string()))
    }

    /// The cache registered under `key`.
    pub fn by_key(&self, key: BlocksCacheKey) -> Option<&CacheEntry> {
        self.caches.iter().find(|c| c.key == Some(key))
    }

    /// The cache holding `key`, and the batch entry the key names.
    pub fn by_cache_key(&self, key: CacheKey) -> Option<(&CacheEntry, u32)> {
        self.caches.iter().find_map(|c| {
            c.keys
                .iter()
                .find(|(k, _)| *k == key)
                .map(|&(_, batch)| (c, batch))
        })
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
                keys: vec![(CacheKey::new(7, 3), 1)],
                shard: None,
            }],
        };
        assert_eq!(CacheTable::decode(&t.encode()).unwrap(), t);
        assert_eq!(t.by_cache_key(CacheKey::new(7, 3)).map(|(_, b)| b), Some(1));
        assert!(t.by_cache_key(CacheKey::new(7, 4)).is_none());
        assert!(CacheTable::decode(&[]).is_err());
        let mut torn = t.encode();
        let n = torn.len();
        torn[n - 3] ^= 1;
        assert!(CacheTable::decode(&torn)
            .unwrap_err()
            .message
            .contains(TORN));
        let mut long = t.encode();
        long[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(CacheTable::decode(&long).is_err());
        assert!(CacheTable::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'x']).is_err());
    }
}
