//! `LlmDataDist`: a cluster's KV caches, its links to other clusters, and pull/push of caches
//! and blocks between them, over a hixl engine.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_async::{Engine, HostBuffer, Peer, Region};
use hixl_core::{Access, MemDesc, MemKind, OpDesc, TransferOp};

use crate::cache::{
    block_descs, coalesce, layer_tensors, BlocksCacheKey, CacheDesc, CacheIndex, KvCacheExtParam,
    Placement, Run, Side,
};
use crate::options::DataDistOptions;
use crate::status::{DataDistError, LlmStatus, Result};
use crate::table::{CacheEntry, CacheTable, TABLE_REGION};

/// At most this many clusters per link or unlink call.
pub const MAX_CLUSTERS_PER_CALL: usize = 16;

/// A cluster's role. As in LLM-DataDist it is a label only: it does not change transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LlmRole {
    /// Prefill (`kPrompt = 1`).
    Prompt = 1,
    /// Decode (`kDecoder = 2`).
    Decoder = 2,
    /// Both (`kMix = 3`).
    Mix = 3,
}

/// A remote cluster to link with (LLM-DataDist `ClusterInfo`, one address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The remote cluster's id.
    pub remote_cluster_id: u64,
    /// Its `llm.ListenIpInfo`.
    pub remote_addr: String,
}

/// A registered cache: its id, geometry and tensor addresses (LLM-DataDist `Cache`).
#[derive(Debug, Clone)]
pub struct Cache {
    /// The id other clusters address it by.
    pub cache_id: i64,
    /// Geometry.
    pub desc: CacheDesc,
    /// Tensor base addresses.
    pub tensor_addrs: Vec<u64>,
    regions: Vec<Region>,
}

impl Cache {
    /// Tensor `t`'s registered memory, to fill or read it.
    pub fn tensor(&self, t: usize) -> Option<&Region> {
        self.regions.get(t)
    }
}

struct Local {
    entry: CacheEntry,
    regions: Vec<Region>,
}

struct Linked {
    peer: Peer,
    table: CacheTable,
}

#[derive(Default)]
struct State {
    next_id: i64,
    caches: BTreeMap<i64, Local>,
    table_region: Option<Region>,
    links: HashMap<u64, Linked>,
}

struct Inner {
    engine: Engine,
    opts: DataDistOptions,
    state: Mutex<State>,
}

/// One cluster's LLM-DataDist instance (prefill or decode side of disaggregated inference).
///
/// An inference server creates one at start, registers its KV caches, links to a peer cluster
/// on the first request that needs it, pulls or pushes blocks per request, and unlinks and
/// finalizes on shutdown.
pub struct LlmDataDist {
    cluster_id: u64,
    role: LlmRole,
    inner: Option<Arc<Inner>>,
}

fn not_init() -> DataDistError {
    DataDistError::new(LlmStatus::Failed, "LlmDataDist is not initialized")
}

fn poisoned() -> DataDistError {
    DataDistError::new(LlmStatus::Failed, "LlmDataDist state lock poisoned")
}

impl LlmDataDist {
    /// A new, uninitialized instance for `cluster_id` with `role`.
    pub fn new(cluster_id: u64, role: LlmRole) -> LlmDataDist {
        LlmDataDist {
            cluster_id,
            role,
            inner: None,
        }
    }

    /// This cluster's id.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// This cluster's role label.
    pub fn role(&self) -> LlmRole {
        self.role
    }

    fn inner(&self) -> Result<&Arc<Inner>> {
        self.inner.as_ref().ok_or_else(not_init)
    }

    /// Starts the transfer engine with LLM-DataDist's option keys (`llm.ListenIpInfo` is
    /// required; `llm.SyncKvCacheWaitTime`, `llm.TransferBackend`, `llm.GlobalResourceConfig`,
    /// ... are optional). A second call is a no-op.
    ///
    /// # Errors
    /// `LLM_PARAM_INVALID` naming a bad key or value; the engine's own errors.
    pub async fn initialize(&mut self, options: &[(&str, &str)]) -> Result<()> {
        if self.inner.is_some() {
            return Ok(());
        }
        let opts = DataDistOptions::parse(options)?;
        let mut b = match opts.listen.strip_suffix(":0") {
            Some(ip) => Engine::builder(ip).ephemeral_port(),
            None => Engine::builder(opts.listen.clone()),
        };
        for (k, v) in &opts.engine {
            b = b.option(k, v);
        }
        let engine = b.build().await?;
        let inner = Arc::new(Inner {
            engine,
            opts,
            state: Mutex::new(State {
                next_id: 1,
                ..State::default()
            }),
        });
        self.inner = Some(inner);
        self.publish().await
    }

    /// The address peers link to (`ip:port`, with the real port).
    ///
    /// # Errors
    /// `LLM_FAILED` before [`LlmDataDist::initialize`].
    pub fn listen_addr(&self) -> Result<String> {
        Ok(self.inner()?.engine.local_engine().to_string())
    }

    /// The transfer engine underneath.
    ///
    /// # Errors
    /// `LLM_FAILED` before [`LlmDataDist::initialize`].
    pub fn engine(&self) -> Result<Engine> {
        Ok(self.inner()?.engine.clone())
    }

    /// Closes every link and stops the engine.
    pub async fn finalize(&mut self) {
        if let Some(inner) = self.inner.take() {
            inner.engine.shutdown(Duration::from_secs(1)).await;
        }
    }

    /// Republishes the cache table region.
    async fn publish(&self) -> Result<()> {
        let inner = self.inner()?;
        let table = {
            let st = inner.state.lock().map_err(|_| poisoned())?;
            CacheTable {
                cluster_id: self.cluster_id,
                caches: st.caches.values().map(|l| l.entry.clone()).collect(),
            }
        };
        let bytes = table.encode();
        let mut buf = HostBuffer::zeroed(bytes.len().max(64))?;
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
        let region = inner
            .engine
            .register_with(buf, Access::REMOTE_READ, Some(TABLE_REGION))?;
        let old = inner
            .state
            .lock()
            .map_err(|_| poisoned())?
            .table_region
            .replace(region);
        if let Some(old) = old {
            inner.engine.deregister(&old).await?;
        }
        Ok(())
    }

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

    /// Links to clusters: connects and fetches each one's cache table (at most 16 per call).
    /// Returns a result per cluster, in order.
    ///
    /// # Errors
    /// `LLM_CLUSTER_NUM_EXCEED_LIMIT` for more than 16 clusters, `LLM_PARAM_INVALID` for a
    /// timeout of zero; per-cluster: `LLM_ALREADY_LINK`, `LLM_LINK_FAILED`, `LLM_TIMEOUT`.
    pub async fn link_clusters(
        &self,
        clusters: &[ClusterInfo],
        timeout: Duration,
    ) -> Result<Vec<Result<()>>> {
        let inner = self.inner()?.clone();
        if clusters.len() > MAX_CLUSTERS_PER_CALL {
            return Err(DataDistError::new(
                LlmStatus::ClusterNumExceedLimit,
                format!(
                    "{} clusters in one call, the limit is {MAX_CLUSTERS_PER_CALL}",
                    clusters.len()
                ),
            ));
        }
        if timeout.is_zero() {
            return Err(DataDistError::param("link timeout must be > 0"));
        }
        let futs = clusters.iter().map(|c| self.link_one(&inner, c, timeout));
        Ok(futures::future::join_all(futs).await)
    }

    async fn link_one(&self, inner: &Arc<Inner>, c: &ClusterInfo, timeout: Duration) -> Result<()> {
        if inner
            .state
            .lock()
            .map_err(|_| poisoned())?
            .links
            .contains_key(&c.remote_cluster_id)
        {
            return Err(DataDistError::new(
                LlmStatus::AlreadyLink,
                format!("cluster {} is already linked", c.remote_cluster_id),
            ));
        }
        let peer = inner
            .engine
            .connect(&c.remote_addr, timeout)
            .await
            .map_err(|e| {
                let mut d = DataDistError::from(e);
                if d.status != LlmStatus::AlreadyLink {
                    d.status = if d.status == LlmStatus::Timeout {
                        LlmStatus::Timeout
                    } else {
                        LlmStatus::LinkFailed
                    };
                }
                d
            })?;
        let table = match read_table(&inner.engine, &peer, timeout).await {
            Ok(t) if t.cluster_id == c.remote_cluster_id => t,
            Ok(t) => {
                let _ = inner.engine.disconnect(&c.remote_addr).await;
                return Err(DataDistError::new(
                    LlmStatus::LinkFailed,
                    format!(
                        "{} is cluster {}, not {}",
                        c.remote_addr, t.cluster_id, c.remote_cluster_id
                    ),
                ));
            }
            Err(e) => {
                let _ = inner.engine.disconnect(&c.remote_addr).await;
                return Err(e);
            }
        };
        inner
            .state
            .lock()
            .map_err(|_| poisoned())?
            .links
            .insert(c.remote_cluster_id, Linked { peer, table });
        Ok(())
    }

    /// Unlinks clusters; a result per cluster. With `force` an unreachable peer is not waited
    /// for (only this side is torn down, as in LLM-DataDist).
    ///
    /// # Errors
    /// `LLM_CLUSTER_NUM_EXCEED_LIMIT`; per-cluster `LLM_NOT_YET_LINK`.
    pub async fn unlink_clusters(
        &self,
        clusters: &[ClusterInfo],
        _timeout: Duration,
        force: bool,
    ) -> Result<Vec<Result<()>>> {
        let inner = self.inner()?;
        if clusters.len() > MAX_CLUSTERS_PER_CALL {
            return Err(DataDistError::new(
                LlmStatus::ClusterNumExceedLimit,
                format!(
                    "{} clusters in one call, the limit is {MAX_CLUSTERS_PER_CALL}",
                    clusters.len()
                ),
            ));
        }
        let mut out = Vec::with_capacity(clusters.len());
        for c in clusters {
            let linked = inner
                .state
                .lock()
                .map_err(|_| poisoned())?
                .links
                .remove(&c.remote_cluster_id);
            out.push(match linked {
                None => Err(DataDistError::new(
                    LlmStatus::NotYetLink,
                    format!("cluster {} is not linked", c.remote_cluster_id),
                )),
                Some(l) => match inner.engine.disconnect(l.peer.name()).await {
                    Ok(()) => Ok(()),
                    Err(_) if force => Ok(()),
                    Err(e) => Err(DataDistError::new(LlmStatus::UnlinkFailed, e.to_string())),
                },
            });
        }
        Ok(out)
    }

    /// The linked peer and the remote cache `pick` selects (re-reading the peer's table once
    /// if the cache is not in it yet).
    async fn remote(
        &self,
        cluster_id: u64,
        pick: impl Fn(&CacheTable) -> Option<CacheEntry>,
        what: String,
    ) -> Result<(Peer, CacheEntry)> {
        let inner = self.inner()?;
        let (peer, found) = {
            let st = inner.state.lock().map_err(|_| poisoned())?;
            let l = st.links.get(&cluster_id).ok_or_else(|| {
                DataDistError::new(
                    LlmStatus::NotYetLink,
                    format!("cluster {cluster_id} is not linked"),
                )
            })?;
            (l.peer.clone(), pick(&l.table))
        };
        if let Some(e) = found {
            return Ok((peer, e));
        }
        let table = read_table(&inner.engine, &peer, inner.opts.sync_wait).await?;
        let found = pick(&table);
        if let Some(l) = inner
            .state
            .lock()
            .map_err(|_| poisoned())?
            .links
            .get_mut(&cluster_id)
        {
            l.table = table;
        }
        found.map(|e| (peer, e)).ok_or_else(|| {
            DataDistError::new(LlmStatus::KvCacheNotExist, format!("{what} does not exist"))
        })
    }

    /// The cache table of a linked cluster, as last read.
    ///
    /// # Errors
    /// `LLM_NOT_YET_LINK`.
    pub async fn peer_table(&self, cluster_id: u64) -> Result<CacheTable> {
        let inner = self.inner()?;
        let st = inner.state.lock().map_err(|_| poisoned())?;
        st.links
            .get(&cluster_id)
            .map(|l| l.table.clone())
            .ok_or_else(|| {
                DataDistError::new(
                    LlmStatus::NotYetLink,
                    format!("cluster {cluster_id} is not linked"),
                )
            })
    }

    /// The linked peer and its blocks cache under `key`.
    pub(crate) async fn remote_for(&self, key: BlocksCacheKey) -> Result<(Peer, CacheEntry)> {
        self.remote(
            key.cluster_id,
            |t| t.by_key(key).cloned(),
            format!("blocks cache {key:?}"),
        )
        .await
    }

    /// Pushes `runs` of `local` into `remote` with `ext`'s layers.
    pub(crate) async fn move_runs_pub(
        &self,
        peer: &Peer,
        remote: &CacheEntry,
        local: &Cache,
        runs: &[Run],
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        self.move_runs(peer, remote, local, runs, ext, false).await
    }

    async fn move_runs(
        &self,
        peer: &Peer,
        remote: &CacheEntry,
        local: &Cache,
        runs: &[Run],
        ext: &KvCacheExtParam,
        pull: bool,
    ) -> Result<()> {
        let inner = self.inner()?;
        let (src_desc, src_addrs, dst_desc, dst_addrs) = if pull {
            (
                &remote.desc,
                &remote.addrs,
                &local.desc,
                &local.tensor_addrs,
            )
        } else {
            (
                &local.desc,
                &local.tensor_addrs,
                &remote.desc,
                &remote.addrs,
            )
        };
        let n = ext.tensor_num_per_layer;
        let src_t = layer_tensors(ext.src_layer_range.as_ref(), n, src_desc.num_tensors)?;
        let dst_t = layer_tensors(ext.dst_layer_range.as_ref(), n, dst_desc.num_tensors)?;
        let descs = block_descs(
            Side {
                addrs: src_addrs,
                stride: src_desc.stride()?,
            },
            Side {
                addrs: dst_addrs,
                stride: dst_desc.stride()?,
            },
            src_t,
            dst_t,
            runs,
            pull,
        )?;
        let op = if pull {
            TransferOp::Read
        } else {
            TransferOp::Write
        };
        peer.transfer(op, &descs)
            .timeout(inner.opts.sync_wait)
            .await?;
        Ok(())
    }

    /// Moves `src_blocks` to `dst_blocks` between `local` and the peer cache `pick` selects:
    /// pull (remote → local) or push (local → remote).
    #[allow(clippy::too_many_arguments)]
    async fn transfer(
        &self,
        cluster_id: u64,
        pick: impl Fn(&CacheTable) -> Option<CacheEntry>,
        what: String,
        local: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
        pull: bool,
    ) -> Result<()> {
        let (peer, remote) = self.remote(cluster_id, pick, what).await?;
        let (src_units, dst_units) = if pull {
            (remote.desc.units()?, local.desc.units()?)
        } else {
            (local.desc.units()?, remote.desc.units()?)
        };
        let runs = coalesce(src_blocks, dst_blocks, src_units, dst_units)?;
        self.move_runs(&peer, &remote, local, &runs, ext, pull)
            .await
    }

    /// Pulls blocks of a peer's blocks cache into `dst` (HIXL `PullKvBlocks`). Block lists are
    /// coalesced into runs contiguous on both sides.
    ///
    /// # Errors
    /// `LLM_NOT_YET_LINK`, `LLM_KV_CACHE_NOT_EXIST`, `LLM_PARAM_INVALID` (blocks, layers,
    /// geometry), `LLM_TIMEOUT` past `llm.SyncKvCacheWaitTime`.
    pub async fn pull_kv_blocks(
        &self,
        src: BlocksCacheKey,
        dst: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let what = format!("blocks cache {src:?}");
        let pick = move |t: &CacheTable| t.by_key(src).cloned();
        self.transfer(
            src.cluster_id,
            pick,
            what,
            dst,
            src_blocks,
            dst_blocks,
            ext,
            true,
        )
        .await
    }

    /// Pushes blocks of `src` into a peer's blocks cache (HIXL `PushKvBlocks`); the source and
    /// destination layer ranges must be equal.
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub async fn push_kv_blocks(
        &self,
        dst: BlocksCacheKey,
        src: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        if ext.src_layer_range != ext.dst_layer_range {
            return Err(DataDistError::param(format!(
                "push needs equal layer ranges, got {:?} and {:?}",
                ext.src_layer_range, ext.dst_layer_range
            )));
        }
        let what = format!("blocks cache {dst:?}");
        let pick = move |t: &CacheTable| t.by_key(dst).cloned();
        self.transfer(
            dst.cluster_id,
            pick,
            what,
            src,
            src_blocks,
            dst_blocks,
            ext,
            false,
        )
        .await
    }

    /// Pulls batch entry `src.batch_index` of a peer's contiguous cache into entry
    /// `batch_index` of `dst` (HIXL `PullKvCache`, `size = -1`).
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub async fn pull_kv_cache(
        &self,
        src: CacheIndex,
        dst: &Cache,
        batch_index: u32,
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let what = format!("cache {}", src.cache_id);
        let pick = move |t: &CacheTable| t.by_id(src.cache_id).cloned();
        let (s, d) = (u64::from(src.batch_index), u64::from(batch_index));
        self.transfer(src.cluster_id, pick, what, dst, &[s], &[d], ext, true)
            .await
    }

    /// Pushes batch entry `src_batch_index` of `src` into a peer's contiguous cache at
    /// `dst.batch_index` (HIXL `PushKvCache`, `size = -1`).
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub async fn push_kv_cache(
        &self,
        src: &Cache,
        dst: CacheIndex,
        src_batch_index: u32,
        ext: &KvCacheExtParam,
    ) -> Result<()> {
        let what = format!("cache {}", dst.cache_id);
        let pick = move |t: &CacheTable| t.by_id(dst.cache_id).cloned();
        let (s, d) = (u64::from(src_batch_index), u64::from(dst.batch_index));
        self.transfer(dst.cluster_id, pick, what, src, &[s], &[d], ext, false)
            .await
    }

    /// The descriptors a block transfer would post (for benchmarks and tests).
    ///
    /// # Errors
    /// As [`LlmDataDist::pull_kv_blocks`].
    pub fn plan_blocks(
        src: (&CacheDesc, &[u64]),
        dst: (&CacheDesc, &[u64]),
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
        local_is_dst: bool,
    ) -> Result<Vec<OpDesc>> {
        let runs = coalesce(src_blocks, dst_blocks, src.0.units()?, dst.0.units()?)?;
        let n = ext.tensor_num_per_layer;
        block_descs(
            Side {
                addrs: src.1,
                stride: src.0.stride()?,
            },
            Side {
                addrs: dst.1,
                stride: dst.0.stride()?,
            },
            layer_tensors(ext.src_layer_range.as_ref(), n, src.0.num_tensors)?,
            layer_tensors(ext.dst_layer_range.as_ref(), n, dst.0.num_tensors)?,
            &runs,
            local_is_dst,
        )
    }
}

/// READs a peer's cache table region.
async fn read_table(engine: &Engine, peer: &Peer, timeout: Duration) -> Result<CacheTable> {
    let r = peer.region(TABLE_REGION).ok_or_else(|| {
        DataDistError::new(
            LlmStatus::LinkFailed,
            format!("{} publishes no cache table", peer.name()),
        )
    })?;
    let local = engine.register(HostBuffer::zeroed(r.len as usize)?)?;
    let res = peer
        .read(&[OpDesc::new(local.addr(), r.addr, r.len)])
        .timeout(timeout)
        .await;
    let mut bytes = vec![0u8; r.len as usize];
    let read = local.read_at(0, &mut bytes);
    let _ = engine.deregister(&local).await;
    res?;
    read?;
    CacheTable::decode(&bytes)
}
