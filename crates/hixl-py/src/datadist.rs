//! `hixl._hixl.DataDist`: one cluster's LLM-DataDist instance for `hixl.llm_datadist`.
//!
//! The Python package (`python/hixl/llm_datadist`) is the API users see (LLM-DataDist's
//! classes, argument checks, status codes); this class takes plain values (ids, address and
//! block lists, layer ranges as `(start, stop)`) and runs `hixl_datadist::LlmDataDist` on the
//! process's runtime with the GIL released. Every error becomes an
//! `hixl.llm_datadist.LLMException` carrying the `LLMStatusCode`, the message and, for block
//! transfers that failed part-way, the `(src_layer, dst_layer, src_block, dst_block)` pairs that
//! did not land.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hixl_datadist::{
    BlocksCacheKey, Cache, CacheDesc, CacheKey, ClusterInfo, DataDistError, LeaseEvents,
    LlmDataDist, LlmStatus, Placement,
};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::runtime;

#[path = "datadist_convert.rs"]
mod convert;
#[path = "datadist_layer.rs"]
mod layer;
#[path = "datadist_leases.rs"]
mod leases;
#[path = "datadist_reshard.rs"]
mod reshard;
#[path = "datadist_tokens.rs"]
mod tokens;

pub(crate) use convert::{bkey, cache_index, dd_err, dd_result, ext_of, lock, param, Ext};
use convert::{cache_key, check_mapped, dtype_of, millis, outcome, role_of, KeyTuple};

/// State shared with layer-wise tasks.
pub(crate) struct Shared {
    pub(crate) dd: Arc<tokio::sync::RwLock<LlmDataDist>>,
    /// The caches registered through this instance, by id (transfers need their regions).
    pub(crate) caches: Mutex<HashMap<i64, (Cache, Option<BlocksCacheKey>)>>,
    events: tokio::sync::Mutex<Option<LeaseEvents>>,
}

impl Shared {
    pub(crate) fn cache(&self, id: i64) -> PyResult<Cache> {
        lock(&self.caches)
            .get(&id)
            .map(|(c, _)| c.clone())
            .ok_or_else(|| {
                dd_err(DataDistError::new(
                    LlmStatus::KvCacheNotExist,
                    format!("cache {id} is not registered with this LLMDataDist"),
                ))
            })
    }
}

/// Blocks on `f` with the GIL released.
fn run<T: Send>(py: Python<'_>, f: impl std::future::Future<Output = T> + Send) -> T {
    py.detach(|| runtime().block_on(f))
}

/// `hixl._hixl.DataDist`: one LLM-DataDist instance (see the module docs).
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct DataDist {
    cluster_id: u64,
    pub(crate) shared: Arc<Shared>,
}

impl Drop for DataDist {
    /// Dropped without `finalize` (e.g. at interpreter exit): the instance is dropped inside the
    /// runtime's context, which its engine's tasks need to stop. (A layer-wise task still
    /// running keeps it alive; the task's own drop ends it.)
    fn drop(&mut self) {
        let _g = runtime().enter();
        lock(&self.shared.caches).clear();
        if let Ok(mut dd) = self.shared.dd.try_write() {
            let role = dd.role();
            drop(std::mem::replace(
                &mut *dd,
                LlmDataDist::new(self.cluster_id, role),
            ));
        }
    }
}

#[pymethods]
impl DataDist {
    /// A new, uninitialized instance of `cluster_id` with `role` (1, 2 or 3).
    #[new]
    fn new(cluster_id: u64, role: u8) -> PyResult<DataDist> {
        let dd = LlmDataDist::new(cluster_id, role_of(role)?);
        Ok(DataDist {
            cluster_id,
            shared: Arc::new(Shared {
                dd: Arc::new(tokio::sync::RwLock::new(dd)),
                caches: Mutex::new(HashMap::new()),
                events: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// The cluster id.
    #[getter]
    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// Starts the engine with LLM-DataDist option pairs; returns the listen address.
    fn init(&self, py: Python<'_>, options: Vec<(String, String)>) -> PyResult<String> {
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move {
            let mut g = dd.write().await;
            let pairs: Vec<(&str, &str)> = options
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            g.initialize(&pairs).await?;
            g.listen_addr()
        }))
    }

    /// Closes every link and stops the engine; the caches are forgotten.
    fn finalize(&self, py: Python<'_>) {
        let sh = self.shared.clone();
        run(py, async move {
            let mut g = sh.dd.write().await;
            g.finalize().await;
            sh.events.lock().await.take();
        });
        lock(&self.shared.caches).clear();
    }

    /// The address peers link to (`ip:port`).
    fn listen_addr(&self, py: Python<'_>) -> PyResult<String> {
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move { dd.read().await.listen_addr() }))
    }

    /// Changes the role label; refused (`LLM_EXIST_LINK`) while links remain.
    fn switch_role(&self, py: Python<'_>, role: u8) -> PyResult<()> {
        let role = role_of(role)?;
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move { dd.write().await.switch_role(role) }))
    }

    /// Links to `(cluster_id, "ip:port")` clusters; returns `(code, message)` per cluster.
    fn link_clusters(
        &self,
        py: Python<'_>,
        clusters: Vec<(u64, String)>,
        timeout_ms: u64,
    ) -> PyResult<Vec<(u32, String)>> {
        let timeout = millis(timeout_ms, "link timeout")?;
        let infos: Vec<ClusterInfo> = clusters
            .into_iter()
            .map(|(id, addr)| ClusterInfo {
                remote_cluster_id: id,
                remote_addr: addr,
            })
            .collect();
        let dd = self.shared.dd.clone();
        let rs = dd_result(run(py, async move {
            dd.read().await.link_clusters(&infos, timeout).await
        }))?;
        Ok(rs.into_iter().map(outcome).collect())
    }

    /// Unlinks clusters by id; `(code, message)` per cluster. With `force`, a cluster this side
    /// holds no link to has nothing local to tear down: success.
    fn unlink_clusters(
        &self,
        py: Python<'_>,
        clusters: Vec<u64>,
        timeout_ms: u64,
        force: bool,
    ) -> PyResult<Vec<(u32, String)>> {
        let timeout = millis(timeout_ms, "unlink timeout")?;
        let infos: Vec<ClusterInfo> = clusters
            .iter()
            .map(|&id| ClusterInfo {
                remote_cluster_id: id,
                remote_addr: String::new(),
            })
            .collect();
        let dd = self.shared.dd.clone();
        let rs = dd_result(run(py, async move {
            dd.read()
                .await
                .unlink_clusters(&infos, timeout, force)
                .await
        }))?;
        Ok(rs
            .into_iter()
            .map(|r| match r {
                Err(e) if force && e.status == LlmStatus::NotYetLink => Ok(()),
                r => r,
            })
            .map(outcome)
            .collect())
    }

    /// Registers caller-owned tensors as a cache; returns `(cache_id, tensor_addrs)`.
    ///
    /// `placement` is 0 (host) or 1 (device); `key` a blocks-cache key `(cluster_id,
    /// model_id)`; `cache_keys` request keys naming batch entries of a contiguous cache.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (placement, num_tensors, dtype, shape, addrs, key=None, cache_keys=Vec::new()))]
    fn register(
        &self,
        py: Python<'_>,
        placement: u8,
        num_tensors: u32,
        dtype: &str,
        shape: Vec<i64>,
        addrs: Vec<u64>,
        key: Option<(u64, u64)>,
        cache_keys: Vec<KeyTuple>,
    ) -> PyResult<(i64, Vec<u64>)> {
        let placement =
            match placement {
                0 => Placement::Host,
                1 => return Err(dd_err(DataDistError::new(
                    LlmStatus::FeatureNotEnabled,
                    "placement Placement.DEVICE: device caches need a device runtime (CANN/ACL \
                     device memory), which this build of hixl does not have; register host \
                     memory with Placement.HOST",
                ))),
                p => {
                    return Err(param(format!(
                        "placement {p}: Placement is HOST (0) or DEVICE (1)"
                    )))
                }
            };
        let desc = CacheDesc {
            placement,
            num_tensors,
            data_type: dtype_of(dtype)?,
            shape,
        };
        dd_result(desc.check(&addrs))?;
        let size = dd_result(desc.tensor_size())?;
        for (t, &a) in addrs.iter().enumerate() {
            check_mapped(a, size, t)?;
        }
        let key = key.map(|(cluster_id, model_id)| BlocksCacheKey {
            cluster_id,
            model_id,
        });
        let keys: Vec<CacheKey> = cache_keys.into_iter().map(cache_key).collect();
        let sh = self.shared.clone();
        let cache = py.detach(|| {
            runtime()
                .block_on(async {
                    let g = sh.dd.read().await;
                    if keys.is_empty() {
                        // SAFETY: the Python API's contract (documented on register_cache and
                        // register_blocks_cache): each address is memory of `tensor_size` bytes the
                        // caller keeps alive and does not free until unregister_cache or finalize,
                        // as LLM-DataDist requires of the addresses it is given. check_mapped above
                        // refused addresses that are not mapped at all.
                        unsafe { g.register_kv_cache(desc, &addrs, key) }.await
                    } else {
                        // SAFETY: as above.
                        unsafe { g.register_kv_cache_with_keys(desc, &addrs, &keys) }.await
                    }
                })
                .inspect(|cache| {
                    lock(&sh.caches).insert(cache.cache_id, (cache.clone(), key));
                })
        });
        let cache = dd_result(cache)?;
        Ok((cache.cache_id, cache.tensor_addrs.clone()))
    }

    /// Allocates a cache this instance owns (zeroed; fabric-pool memory with the fabric
    /// transport, so same-host peers map it); returns `(cache_id, tensor_addrs)`. The memory
    /// lives until `unregister` or `finalize`.
    #[pyo3(signature = (num_tensors, dtype, shape, key=None, cache_keys=Vec::new()))]
    fn allocate(
        &self,
        py: Python<'_>,
        num_tensors: u32,
        dtype: &str,
        shape: Vec<i64>,
        key: Option<(u64, u64)>,
        cache_keys: Vec<KeyTuple>,
    ) -> PyResult<(i64, Vec<u64>)> {
        let desc = CacheDesc {
            placement: Placement::Host,
            num_tensors,
            data_type: dtype_of(dtype)?,
            shape,
        };
        let key = key.map(bkey);
        let keys: Vec<CacheKey> = cache_keys.into_iter().map(cache_key).collect();
        let sh = self.shared.clone();
        let cache = py.detach(|| {
            runtime()
                .block_on(async {
                    let g = sh.dd.read().await;
                    if keys.is_empty() {
                        g.allocate_kv_cache(desc, key).await
                    } else {
                        g.allocate_kv_cache_with_keys(desc, &keys).await
                    }
                })
                .inspect(|cache| {
                    lock(&sh.caches).insert(cache.cache_id, (cache.clone(), key));
                })
        });
        let cache = dd_result(cache)?;
        Ok((cache.cache_id, cache.tensor_addrs.clone()))
    }

    /// Unregisters a cache (an unknown id is a no-op).
    fn unregister(&self, py: Python<'_>, cache_id: i64) -> PyResult<()> {
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move {
            dd.read().await.unregister_kv_cache(cache_id).await
        }))?;
        lock(&self.shared.caches).remove(&cache_id);
        Ok(())
    }

    /// Removes a request key of one of this cluster's contiguous caches.
    fn remove_cache_key(&self, py: Python<'_>, key: KeyTuple) -> PyResult<()> {
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move {
            dd.read().await.remove_cache_key(cache_key(key)).await
        }))
    }

    /// Pulls blocks of a peer's blocks cache `key` into cache `dst`.
    fn pull_blocks(
        &self,
        py: Python<'_>,
        key: (u64, u64),
        dst: i64,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
        ext: Ext,
    ) -> PyResult<()> {
        let dst = self.shared.cache(dst)?;
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_kv_blocks(bkey(key), &dst, &src_blocks, &dst_blocks, &ext)
                .await
        }))
    }

    /// Pushes blocks of cache `src` into a peer's blocks cache `key`.
    fn push_blocks(
        &self,
        py: Python<'_>,
        key: (u64, u64),
        src: i64,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
        ext: Ext,
    ) -> PyResult<()> {
        let src = self.shared.cache(src)?;
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .push_kv_blocks(bkey(key), &src, &src_blocks, &dst_blocks, &ext)
                .await
        }))
    }

    /// Pulls batch entry `index = (cluster_id, cache_id, batch_index)` of a peer's cache into
    /// entry `batch_index` of `dst`.
    fn pull_cache_index(
        &self,
        py: Python<'_>,
        index: (u64, i64, u32),
        dst: i64,
        batch_index: u32,
        ext: Ext,
    ) -> PyResult<()> {
        let dst = self.shared.cache(dst)?;
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_kv_cache(cache_index(index), &dst, batch_index, &ext)
                .await
        }))
    }

    /// Pulls the batch entry a peer holds under request key `key` into entry `batch_index`.
    fn pull_cache_key(
        &self,
        py: Python<'_>,
        key: KeyTuple,
        dst: i64,
        batch_index: u32,
        ext: Ext,
    ) -> PyResult<()> {
        let dst = self.shared.cache(dst)?;
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_kv_cache_by_key(cache_key(key), &dst, batch_index, &ext)
                .await
        }))
    }

    /// Pushes entry `src_batch_index` of `src` into a peer's batch entry `index`.
    fn push_cache_index(
        &self,
        py: Python<'_>,
        src: i64,
        index: (u64, i64, u32),
        src_batch_index: u32,
        ext: Ext,
    ) -> PyResult<()> {
        let src = self.shared.cache(src)?;
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .push_kv_cache(&src, cache_index(index), src_batch_index, &ext)
                .await
        }))
    }

    /// Pushes entry `src_batch_index` of `src` into the entry a peer holds under `key`.
    fn push_cache_key(
        &self,
        py: Python<'_>,
        src: i64,
        key: KeyTuple,
        src_batch_index: u32,
        ext: Ext,
    ) -> PyResult<()> {
        let src = self.shared.cache(src)?;
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .push_kv_cache_by_key(&src, cache_key(key), src_batch_index, &ext)
                .await
        }))
    }

    /// Local fan-out copy: block `src_blocks[i]` of `src` to every block of `dst_lists[i]`
    /// of `dst`.
    fn copy_blocks(
        &self,
        py: Python<'_>,
        src: i64,
        dst: i64,
        src_blocks: Vec<u64>,
        dst_lists: Vec<Vec<u64>>,
    ) -> PyResult<()> {
        let (s, d) = (self.shared.cache(src)?, self.shared.cache(dst)?);
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move {
            dd.read()
                .await
                .copy_kv_blocks(&s, &d, &src_blocks, &dst_lists)
                .await
        }))
    }

    /// Local copy of `(src_block, dst_block)` pairs from `src` to `dst`.
    fn swap_blocks(
        &self,
        py: Python<'_>,
        src: i64,
        dst: i64,
        pairs: Vec<(u64, u64)>,
    ) -> PyResult<()> {
        let (s, d) = (self.shared.cache(src)?, self.shared.cache(dst)?);
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move {
            dd.read().await.swap_blocks(&s, &d, &pairs).await
        }))
    }

    /// A linked peer's caches as last read: `(cache_id, key, num_tensors, units, stride,
    /// addrs)` each.
    #[allow(clippy::type_complexity)]
    fn peer_caches(
        &self,
        py: Python<'_>,
        cluster_id: u64,
    ) -> PyResult<Vec<(i64, Option<(u64, u64)>, u32, u64, u64, Vec<u64>)>> {
        let dd = self.shared.dd.clone();
        let table = dd_result(run(py, async move {
            dd.read().await.peer_table(cluster_id).await
        }))?;
        let mut out = Vec::with_capacity(table.caches.len());
        for e in table.caches {
            let units = dd_result(e.desc.units())?;
            let stride = dd_result(e.desc.stride())?;
            out.push((
                e.cache_id,
                e.key.map(|k| (k.cluster_id, k.model_id)),
                e.desc.num_tensors,
                units,
                stride,
                e.addrs,
            ));
        }
        Ok(out)
    }

    /// The transport of the link to `cluster_id`.
    fn link_transport(&self, py: Python<'_>, cluster_id: u64) -> PyResult<String> {
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move {
            dd.read().await.link_transport(cluster_id)
        }))
    }

    /// Starts a layer-wise push of cache `src` to `targets` (see `LayerTask`).
    fn layer_task(&self, src: i64, targets: Vec<layer::TargetSpec>) -> PyResult<layer::LayerTask> {
        let src = self.shared.cache(src)?;
        layer::LayerTask::new(self.shared.clone(), src, targets)
    }
}

/// Raises `LLM_PARAM_INVALID` unless `[addr, addr + len)` is mapped memory of this process
/// (the host tensors of an unregistered cache, before Python copies them).
#[pyfunction]
fn dd_check_mapped(addr: u64, len: u64, tensor: usize) -> PyResult<()> {
    check_mapped(addr, len, tensor)
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dd_check_mapped, m)?)?;
    m.add_function(wrap_pyfunction!(reshard::kv_shard_readers, m)?)?;
    m.add_function(wrap_pyfunction!(reshard::kv_shard_sources, m)?)?;
    m.add_function(wrap_pyfunction!(tokens::plan_token_blocks, m)?)?;
    m.add_class::<DataDist>()?;
    m.add_class::<layer::LayerTask>()?;
    let codes = PyList::empty(m.py());
    for s in [
        LlmStatus::Success,
        LlmStatus::WaitProcTimeout,
        LlmStatus::KvCacheNotExist,
        LlmStatus::ParamInvalid,
        LlmStatus::NotYetLink,
        LlmStatus::AlreadyLink,
        LlmStatus::LinkFailed,
        LlmStatus::UnlinkFailed,
        LlmStatus::ClusterNumExceedLimit,
        LlmStatus::ExistLink,
        LlmStatus::FeatureNotEnabled,
        LlmStatus::Timeout,
        LlmStatus::OutOfMemory,
        LlmStatus::LeaseEnded,
        LlmStatus::LeaseHeld,
        LlmStatus::Failed,
    ] {
        codes.append((s.name(), s.code()))?;
    }
    // The codes the Rust layer returns, for the Python package to check its enum against.
    m.add("DATADIST_STATUS_CODES", codes)?;
    Ok(())
}
