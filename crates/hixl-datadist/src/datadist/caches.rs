//! The caches of a cluster: registering caller-owned tensors, allocating owned ones, and
//! unregistering them; each change republishes the cache table.

use hixl_async::{HostBuffer, Region};
use hixl_core::{Access, MemDesc, MemKind};

use super::{poisoned, Cache, LlmDataDist, Local};
use crate::cache::{BlocksCacheKey, CacheDesc, Placement};
use crate::status::{DataDistError, LlmStatus, Result};
use crate::table::CacheEntry;

impl LlmDataDist {
    fn add_cache(
        &self,
        desc: CacheDesc,
        regions: Vec<Region>,
        key: Option<BlocksCacheKey>,
    ) -> Result<Cache> {
        let inner = self.inner()?;
        let mut st = inner.state.lock().map_err(|_| poisoned())?;
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

    /// Registers a cache whose tensors the caller owns (HIXL `RegisterKvCache`, or
    /// `register_blocks_cache` with a key). At most 240 addresses.
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
        let inner = self.inner()?;
        desc.check(addrs)?;
        self.check_key(key)?;
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
                inner.engine.register_raw(
                    MemDesc::new(a, size),
                    MemKind::Host,
                    Access::REMOTE_RW,
                    None,
                )
            };
            match r {
                Ok(r) => regions.push(r),
                Err(e) => {
                    for r in &regions {
                        let _ = inner.engine.deregister(r).await;
                    }
                    return Err(e.into());
                }
            }
        }
        let cache = self.add_cache(desc, regions, key)?;
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
        let inner = self.inner()?;
        desc.check(&vec![1; desc.num_tensors as usize])?;
        self.check_key(key)?;
        let size = desc.tensor_size()?;
        let mut regions = Vec::with_capacity(desc.num_tensors as usize);
        for _ in 0..desc.num_tensors {
            let r = match inner.engine.register_pooled(size, Access::REMOTE_RW, None) {
                Ok(r) => r,
                Err(_) => inner.engine.register(HostBuffer::zeroed(size as usize)?)?,
            };
            regions.push(r);
        }
        let cache = self.add_cache(desc, regions, key)?;
        self.publish().await?;
        Ok(cache)
    }

    /// Unregisters a cache (HIXL: an unknown id is SUCCESS). Waits for transfers touching it.
    ///
    /// # Errors
    /// Engine errors only.
    pub async fn unregister_kv_cache(&self, cache_id: i64) -> Result<()> {
        let inner = self.inner()?;
        let local = inner
            .state
            .lock()
            .map_err(|_| poisoned())?
            .caches
            .remove(&cache_id);
        let Some(local) = local else { return Ok(()) };
        self.publish().await?;
        for r in &local.regions {
            inner.engine.deregister(r).await?;
        }
        Ok(())
    }
}
