//! The caches of a cluster: registering caller-owned tensors, allocating owned ones, and
//! unregistering them; each change republishes the cache table.

use hixl_async::{HostBuffer, Region};
use hixl_core::{Access, MemDesc, MemKind};

use super::{Cache, LlmDataDist, Local};
use crate::cache::{BlocksCacheKey, CacheDesc, CacheKey, Placement};
use crate::status::{DataDistError, LlmStatus, Result};
use crate::table::CacheEntry;
use hixl_async::sync::lock;

impl LlmDataDist {
    fn add_cache(
        &self,
        desc: CacheDesc,
        regions: Vec<Region>,
        key: Option<BlocksCacheKey>,
        keys: &[CacheKey],
    ) -> Result<Cache> {
        let inner = self.inner()?;
        let mut st = lock(&inner.state);
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].contains(k) {
                return Err(DataDistError::param(format!(
                    "cache key {k:?} is given twice"
                )));
            }
            if let Some(l) = st
                .caches
                .values()
                .find(|l| l.entry.keys.iter().any(|(x, _)| x == k))
            {
                return Err(DataDistError::param(format!(
                    "cache key {k:?} is already used by cache {}",
                    l.entry.cache_id
                )));
            }
        }
        if let Some(k) = key {
            if let Some(l) = st.caches.values().find(|l| l.entry.key == Some(k)) {
                // LLM-DataDist silently re-points the key to the newer cache; refusing it keeps
                // peers from pulling a cache they did not mean to.
                return Err(DataDistError::param(format!(
                    "blocks cache key {k:?} is already used by cache {}; use a distinct model_id",
                    l.entry.cache_id
                )));
            }
        }
        let cache_id = st.next_id;
        st.next_id += 1;
        let addrs: Vec<u64> = regions.iter().map(Region::addr).collect();
        st.caches.insert(
            cache_id,
            Local {
                entry: CacheEntry {
                    cache_id,
                    key,
                    desc: desc.clone(),
                    addrs: addrs.clone(),
                    keys: keys.iter().zip(0u32..).map(|(&k, b)| (k, b)).collect(),
                    shard: None,
                },
                regions: regions.clone(),
            },
        );
        Ok(Cache {
            cache_id,
            desc,
            tensor_addrs: addrs,
            regions,
        })
    }

    fn check_key(&self, key: Option<BlocksCacheKey>) -> Result<()> {
        match key {
            Some(k) if k.cluster_id != self.cluster_id => Err(DataDistError::param(format!(
                "blocks cache key {k:?} names cluster {}, this is cluster {}",
                k.cluster_id, self.cluster_id
            ))),
            _ => Ok(()),
        }
    }

    fn check_cache_keys(&self, desc: &CacheDesc, keys: &[CacheKey]) -> Result<()> {
        if let Some(k) = keys.iter().find(|k| k.cluster_id != self.cluster_id) {
            return Err(DataDistError::param(format!(
                "cache key {k:?} names cluster {}, this is cluster {}",
                k.cluster_id, self.cluster_id
            )));
        }
        let units = desc.units()?;
        if keys.len() as u64 > units {
            return Err(DataDistError::param(format!(
                "{} cache keys for a cache of {units} batch entries",
                keys.len()
            )));
        }
        Ok(())
    }

    /// Registers a cache whose tensors the caller owns (HIXL `RegisterKvCache`, or
    /// `register_blocks_cache` with a key). At most 240 addresses.
    ///
    /// Before or after peers link (HIXL asks for before): once this returns, a linked peer's
    /// pull or push of the cache waits, up to `llm.SyncKvCacheWaitTime`, for the memory table
    /// that reaches it over the link, instead of being refused.
    ///
    /// # Safety
    /// Each `addrs[i]` must point to `desc.tensor_size()` bytes valid for reads and writes by
    /// peers until [`LlmDataDist::unregister_kv_cache`] returned for this cache or the instance
    /// was finalized. Meanwhile hold no Rust reference (`&[u8]`, `&mut [u8]`) to that memory:
    /// peers may write it at any time.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` for bad geometry, a null or overlapping address, a key already in use
    /// or naming another cluster; `LLM_FEATURE_NOT_ENABLED` for device placement.
    pub async unsafe fn register_kv_cache(
        &self,
        desc: CacheDesc,
        addrs: &[u64],
        key: Option<BlocksCacheKey>,
    ) -> Result<Cache> {
        // SAFETY: this fn's contract is register_raw_cache's.
        unsafe { self.register_raw_cache(desc, addrs, key, &[]) }.await
    }

    /// Registers a contiguous (prompt) cache whose tensors the caller owns, with request keys:
    /// `keys[i]` names batch entry `i`, and peers pull or push it by that key
    /// ([`LlmDataDist::pull_kv_cache_by_key`]) until [`LlmDataDist::remove_cache_key`]
    /// (LLM-DataDist `register_cache(desc, addrs, cache_keys)`).
    ///
    /// # Safety
    /// As for [`LlmDataDist::register_kv_cache`].
    ///
    /// # Errors
    /// As [`LlmDataDist::register_kv_cache`], and `LLM_PARAM_INVALID` for a key naming another
    /// cluster, given twice or already used, or more keys than batch entries.
    pub async unsafe fn register_kv_cache_with_keys(
        &self,
        desc: CacheDesc,
        addrs: &[u64],
        keys: &[CacheKey],
    ) -> Result<Cache> {
        // SAFETY: this fn's contract is register_raw_cache's.
        unsafe { self.register_raw_cache(desc, addrs, None, keys) }.await
    }

    async unsafe fn register_raw_cache(
        &self,
        desc: CacheDesc,
        addrs: &[u64],
        key: Option<BlocksCacheKey>,
        keys: &[CacheKey],
    ) -> Result<Cache> {
        let inner = self.inner()?;
        desc.check(addrs)?;
        self.check_key(key)?;
        self.check_cache_keys(&desc, keys)?;
        if desc.placement == Placement::Device {
            return Err(DataDistError::new(
                LlmStatus::FeatureNotEnabled,
                "device caches need a device runtime; this build has none",
            ));
        }
        let size = desc.tensor_size()?;
        let mut regions = Vec::with_capacity(addrs.len());
        for &a in addrs {
            // SAFETY: the caller keeps each tensor valid until unregister (this fn's contract).
            let r = unsafe {
                inner.engine.register_raw_new(
                    MemDesc::new(a, size),
                    MemKind::Host,
                    Access::REMOTE_RW,
                    None,
                )
            };
            match r {
                Ok(r) => regions.push(r),
                Err(e) => {
                    release(inner, &regions).await;
                    return Err(e.into());
                }
            }
        }
        let cache = match self.add_cache(desc, regions.clone(), key, keys) {
            Ok(c) => c,
            Err(e) => {
                release(inner, &regions).await;
                return Err(e);
            }
        };
        self.publish().await?;
        Ok(cache)
    }

    /// Allocates and registers a cache this instance owns (zeroed; fabric-pool memory when
    /// the engine has a fabric backend, so same-host peers map it).
    ///
    /// # Errors
    /// As [`LlmDataDist::register_kv_cache`], and `LLM_OUT_OF_MEMORY`.
    pub async fn allocate_kv_cache(
        &self,
        desc: CacheDesc,
        key: Option<BlocksCacheKey>,
    ) -> Result<Cache> {
        self.allocate_cache(desc, key, &[]).await
    }

    /// Allocates a contiguous (prompt) cache with request keys, as
    /// [`LlmDataDist::register_kv_cache_with_keys`] registers one.
    ///
    /// # Errors
    /// As [`LlmDataDist::register_kv_cache_with_keys`], and `LLM_OUT_OF_MEMORY`.
    pub async fn allocate_kv_cache_with_keys(
        &self,
        desc: CacheDesc,
        keys: &[CacheKey],
    ) -> Result<Cache> {
        self.allocate_cache(desc, None, keys).await
    }

    async fn allocate_cache(
        &self,
        desc: CacheDesc,
        key: Option<BlocksCacheKey>,
        keys: &[CacheKey],
    ) -> Result<Cache> {
        let inner = self.inner()?;
        desc.check(&vec![1; desc.num_tensors as usize])?;
        self.check_key(key)?;
        self.check_cache_keys(&desc, keys)?;
        let size = desc.tensor_size()?;
        let mut regions = Vec::with_capacity(desc.num_tensors as usize);
        for _ in 0..desc.num_tensors {
            let r = match inner.engine.register_pooled(size, Access::REMOTE_RW, None) {
                Ok(r) => Ok(r),
                Err(_) => HostBuffer::zeroed(size as usize).and_then(|b| inner.engine.register(b)),
            };
            match r {
                Ok(r) => regions.push(r),
                Err(e) => {
                    // The tensors allocated so far go back.
                    release(inner, &regions).await;
                    return Err(e.into());
                }
            }
        }
        let cache = match self.add_cache(desc, regions.clone(), key, keys) {
            Ok(c) => c,
            Err(e) => {
                release(inner, &regions).await;
                return Err(e);
            }
        };
        self.publish().await?;
        Ok(cache)
    }

    /// Unregisters a cache (HIXL: an unknown id is SUCCESS). Waits for transfers touching it.
    ///
    /// # Errors
    /// `LLM_LEASE_HELD` while a live lease covers the cache; engine errors.
    pub async fn unregister_kv_cache(&self, cache_id: i64) -> Result<()> {
        let inner = self.inner()?;
        self.check_cache_not_leased(cache_id)?;
        let local = lock(&inner.state).caches.remove(&cache_id);
        let Some(local) = local else { return Ok(()) };
        self.publish().await?;
        for r in &local.regions {
            inner.engine.deregister(r).await?;
        }
        Ok(())
    }

    /// Removes a request key of one of this cluster's contiguous caches (LLM-DataDist
    /// `remove_cache_key`): from the moment this returns, peers pulling or pushing by the key
    /// get `LLM_KV_CACHE_NOT_EXIST` (they re-read the cache table for each keyed transfer).
    /// The batch entry itself stays registered.
    ///
    /// # Errors
    /// `LLM_KV_CACHE_NOT_EXIST` naming a key this cluster does not hold.
    pub async fn remove_cache_key(&self, key: CacheKey) -> Result<()> {
        let inner = self.inner()?;
        let removed = {
            let mut st = lock(&inner.state);
            st.caches.values_mut().any(|l| {
                let before = l.entry.keys.len();
                l.entry.keys.retain(|(k, _)| *k != key);
                l.entry.keys.len() != before
            })
        };
        if !removed {
            return Err(DataDistError::new(
                LlmStatus::KvCacheNotExist,
                format!(
                    "cache key {key:?} is not held by cluster {}",
                    self.cluster_id
                ),
            ));
        }
        self.publish().await
    }
}

/// Deregisters regions of a registration that failed part-way.
async fn release(inner: &super::Inner, regions: &[Region]) {
    for r in regions {
        let _ = inner.engine.deregister(r).await;
    }
}
