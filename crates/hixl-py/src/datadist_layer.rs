//! `hixl._hixl.LayerTask`: the transfers of one `transfer_cache_async`. The Python side calls
//! the user's `LayerSynchronizer` on its own thread, layer after layer, and hands each ready
//! layer to [`LayerTask::send`], which starts that layer's push to a target on the runtime and
//! returns at once: the push of layer `l` runs while the synchronizer waits for layer `l + 1`.
//! [`LayerTask::wait`] waits for every push and gives each target's outcome.

use std::sync::{Arc, Mutex};

use hixl_datadist::{BlocksCacheKey, Cache, CacheIndex, DataDistError, KvCacheExtParam, LlmStatus};
use pyo3::prelude::*;

use crate::datadist::{bkey, cache_index, lock, param, Shared};
use crate::runtime;

/// A target as Python passes it: `(kind, cluster_id, id, batch_index, src_blocks, dst_blocks,
/// src_batch_index, tensor_num_per_layer)`. `kind` 0: the peer's blocks cache with key
/// `(cluster_id, id)`; 1: batch entry `batch_index` of the peer's cache `id`; 2: the blocks of
/// the peer's cache `id` (a blocks cache named by id, e.g. found from `dst_addrs`).
pub(crate) type TargetSpec = (u8, u64, u64, u32, Vec<u64>, Vec<u64>, u32, u32);

#[derive(Clone)]
enum Dest {
    BlocksKey(BlocksCacheKey),
    Entry(CacheIndex),
    BlocksId { cluster_id: u64, cache_id: i64 },
}

#[derive(Clone)]
struct Target {
    dest: Dest,
    src_blocks: Arc<[u64]>,
    dst_blocks: Arc<[u64]>,
    src_batch: u32,
    per_layer: u32,
}

/// A per-target outcome as Python receives it: `(code, message, failed pairs)`.
type Outcome = (u32, String, Vec<(u32, u32, u64, u64)>);

#[derive(Default)]
struct Progress {
    /// The first error of each target, with the (layer, block) pairs of every failed layer.
    errors: Vec<Option<DataDistError>>,
    /// The pushes started, with their targets.
    handles: Vec<(usize, tokio::task::JoinHandle<()>)>,
}

/// `hixl._hixl.LayerTask` (see the module docs).
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct LayerTask {
    shared: Arc<Shared>,
    src: Cache,
    targets: Vec<Target>,
    progress: Arc<Mutex<Progress>>,
}

impl LayerTask {
    pub(crate) fn new(shared: Arc<Shared>, src: Cache, specs: Vec<TargetSpec>) -> PyResult<Self> {
        let mut targets = Vec::with_capacity(specs.len());
        for (i, (kind, cluster_id, id, batch, sb, db, src_batch, per_layer)) in
            specs.into_iter().enumerate()
        {
            let cache_id = i64::try_from(id).map_err(|_| {
                param(format!(
                    "transfer config {i}: cache id {id} is past 2^63 - 1"
                ))
            });
            let dest = match kind {
                0 => Dest::BlocksKey(bkey((cluster_id, id))),
                1 => Dest::Entry(cache_index((cluster_id, cache_id?, batch))),
                2 => Dest::BlocksId {
                    cluster_id,
                    cache_id: cache_id?,
                },
                k => return Err(param(format!("transfer config {i}: target kind {k}"))),
            };
            if sb.len() != db.len() {
                return Err(param(format!(
                    "transfer config {i}: {} source blocks but {} destination blocks",
                    sb.len(),
                    db.len()
                )));
            }
            if matches!(dest, Dest::BlocksKey(_) | Dest::BlocksId { .. }) && sb.is_empty() {
                return Err(param(format!(
                    "transfer config {i}: a blocks destination needs src_block_indices and \
                     dst_block_indices"
                )));
            }
            if let Dest::BlocksId { .. } = dest {
                if let Some(b) = sb.iter().chain(&db).find(|&&b| b > u64::from(u32::MAX)) {
                    return Err(param(format!(
                        "transfer config {i}: block {b} is past 2^32 - 1"
                    )));
                }
            }
            targets.push(Target {
                dest,
                src_blocks: sb.into(),
                dst_blocks: db.into(),
                src_batch,
                per_layer,
            });
        }
        let progress = Progress {
            errors: vec![None; targets.len()],
            handles: Vec::new(),
        };
        Ok(LayerTask {
            shared,
            src,
            targets,
            progress: Arc::new(Mutex::new(progress)),
        })
    }
}

/// Pushes one layer of `src` to `t`.
async fn push_layer(
    shared: Arc<Shared>,
    src: Cache,
    t: Target,
    src_layer: u32,
    dst_layer: u32,
) -> Result<(), DataDistError> {
    let dd = shared.dd.clone().read_owned().await;
    let ext = KvCacheExtParam {
        src_layer_range: Some(src_layer..src_layer + 1),
        dst_layer_range: Some(dst_layer..dst_layer + 1),
        tensor_num_per_layer: t.per_layer,
    };
    match t.dest {
        Dest::BlocksKey(key) => {
            dd.push_kv_blocks(key, &src, &t.src_blocks, &t.dst_blocks, &ext)
                .await
        }
        Dest::Entry(idx) => dd.push_kv_cache(&src, idx, t.src_batch, &ext).await,
        Dest::BlocksId {
            cluster_id,
            cache_id,
        } => {
            // One entry-sized unit (a block) per pair: any layer mapping is allowed this way.
            let pushes = t
                .src_blocks
                .iter()
                .zip(t.dst_blocks.iter())
                .map(|(&s, &d)| {
                    let idx = CacheIndex {
                        cluster_id,
                        cache_id,
                        batch_index: d as u32,
                    };
                    dd.push_kv_cache(&src, idx, s as u32, &ext)
                });
            let mut first: Option<DataDistError> = None;
            for r in futures::future::join_all(pushes).await {
                if let Err(e) = r {
                    match &mut first {
                        Some(f) => {
                            let mut all = std::mem::take(&mut f.failed).into_vec();
                            all.extend_from_slice(&e.failed);
                            f.failed = all.into_boxed_slice();
                        }
                        None => first = Some(e),
                    }
                }
            }
            match first {
                Some(mut e) => {
                    let mut all = std::mem::take(&mut e.failed).into_vec();
                    all.sort_unstable();
                    e.failed = all.into_boxed_slice();
                    Err(e)
                }
                None => Ok(()),
            }
        }
    }
}

fn record(progress: &Mutex<Progress>, target: usize, e: DataDistError) {
    let mut p = lock(progress);
    match p.errors.get_mut(target) {
        Some(Some(first)) => {
            let mut all = std::mem::take(&mut first.failed).into_vec();
            all.extend_from_slice(&e.failed);
            all.sort_unstable();
            first.failed = all.into_boxed_slice();
        }
        Some(slot) => *slot = Some(e),
        None => {}
    }
}

#[pymethods]
impl LayerTask {
    /// Starts pushing source layer `src_layer` into destination layer `dst_layer` of target
    /// `target`; returns at once. `False` (nothing started) once that target failed.
    fn send(&self, target: usize, src_layer: u32, dst_layer: u32) -> PyResult<bool> {
        let t = self
            .targets
            .get(target)
            .cloned()
            .ok_or_else(|| param(format!("target {target} does not exist")))?;
        if let Dest::BlocksKey(k) = &t.dest {
            if src_layer != dst_layer {
                return Err(param(format!(
                    "blocks cache {k:?}: layer {src_layer} would go to layer {dst_layer}; a push \
                     by BlocksCacheKey needs equal layers"
                )));
            }
        }
        let mut p = lock(&self.progress);
        if p.errors.get(target).is_some_and(Option::is_some) {
            return Ok(false);
        }
        let (shared, src, progress) =
            (self.shared.clone(), self.src.clone(), self.progress.clone());
        let h = runtime().spawn(async move {
            if let Err(e) = push_layer(shared, src, t, src_layer, dst_layer).await {
                record(&progress, target, e);
            }
        });
        p.handles.push((target, h));
        Ok(true)
    }

    /// Whether target `target` failed already.
    fn failed(&self, target: usize) -> bool {
        lock(&self.progress)
            .errors
            .get(target)
            .is_some_and(Option::is_some)
    }

    /// Waits for every push started; each target's outcome (`None`: every layer landed).
    fn wait(&self, py: Python<'_>) -> PyResult<Vec<Option<Outcome>>> {
        let handles = std::mem::take(&mut lock(&self.progress).handles);
        py.detach(|| {
            runtime().block_on(async {
                for (target, h) in handles {
                    if let Err(e) = h.await {
                        // A push that did not run to its end (the runtime shut down under it)
                        // did not land.
                        let e = DataDistError::new(
                            LlmStatus::Failed,
                            format!("a layer push to target {target} ended early: {e}"),
                        );
                        record(&self.progress, target, e);
                    }
                }
            })
        });
        let p = lock(&self.progress);
        let out = p
            .errors
            .iter()
            .map(|e| {
                e.as_ref().map(|e| {
                    let failed = e
                        .failed
                        .iter()
                        .map(|f| (f.src_layer, f.dst_layer, f.src_block, f.dst_block))
                        .collect();
                    (e.status.code(), e.message.clone(), failed)
                })
            })
            .collect();
        Ok(out)
    }
}
