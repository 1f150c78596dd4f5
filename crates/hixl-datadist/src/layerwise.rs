//! Layer-wise transfer: each layer moves as soon as the caller says it is ready (HIXL's
//! `LayerSynchronizer` + `transfer_cache_async`), so the transfer hides under compute.

use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, Stream, StreamExt};

use crate::cache::{coalesce, BlocksCacheKey, KvCacheExtParam};
use crate::datadist::{Cache, LlmDataDist};
use crate::status::Result;

/// One destination of a layer-wise push: a peer's blocks cache and the block mapping.
#[derive(Clone, Debug)]
pub struct LayerTarget {
    /// The destination cache.
    pub dst: BlocksCacheKey,
    /// Source blocks.
    pub src_blocks: Vec<u64>,
    /// Destination blocks, pairwise with `src_blocks`.
    pub dst_blocks: Vec<u64>,
    /// Tensors per layer in both caches (2 for K,V; 1 for a per-kind MLA cache).
    pub tensor_num_per_layer: u32,
}

/// What a layer-wise transfer did.
#[derive(Debug)]
pub struct LayerwiseReport {
    /// One result per target, in order. A failed target's error lists every (layer, block)
    /// pair that did not land there (`DataDistError::failed`); the rest landed.
    pub results: Vec<Result<()>>,
    /// Layers moved.
    pub layers: u32,
    /// From the start until the last layer was signalled ready.
    pub last_ready: Duration,
    /// From the start until every transfer finished.
    pub finished: Duration,
}

impl LayerwiseReport {
    /// Transfer time not hidden under compute: what remained after the last layer was ready.
    pub fn exposed(&self) -> Duration {
        self.finished.saturating_sub(self.last_ready)
    }

    /// Share of a transfer that takes `alone` when run by itself (after compute) that this
    /// layer-wise run hid under compute, 0..=1.
    pub fn hidden_fraction(&self, alone: Duration) -> f64 {
        let a = alone.as_secs_f64();
        if a <= 0.0 {
            return 1.0;
        }
        (1.0 - self.exposed().as_secs_f64() / a).clamp(0.0, 1.0)
    }
}

impl LlmDataDist {
    /// Pushes `src` to every target layer by layer: each index that `ready` yields starts that
    /// layer's transfers at once. Ends when `ready` ends and every started transfer finished;
    /// a failed layer fails only its target's result.
    ///
    /// ```no_run
    /// # async fn f(dd: &hixl_datadist::LlmDataDist, cache: &hixl_datadist::Cache, t: hixl_datadist::LayerTarget) {
    /// use futures::StreamExt;
    /// // In a server this is the model's forward pass: after computing layer l, send l.
    /// let (tx, rx) = futures::channel::mpsc::unbounded::<u32>();
    /// let targets = [t];
    /// let task = dd.transfer_layerwise(cache, rx, &targets);
    /// for l in 0..32 {
    ///     // ... compute layer l ...
    ///     tx.unbounded_send(l).unwrap();
    /// }
    /// drop(tx);
    /// let report = task.await;
    /// assert!(report.results.iter().all(|r| r.is_ok()));
    /// # }
    /// ```
    pub async fn transfer_layerwise<S>(
        &self,
        src: &Cache,
        mut ready: S,
        targets: &[LayerTarget],
    ) -> LayerwiseReport
    where
        S: Stream<Item = u32> + Unpin,
    {
        let start = Instant::now();
        let mut results: Vec<Result<()>> = Vec::with_capacity(targets.len());
        let mut resolved = Vec::with_capacity(targets.len());
        for t in targets {
            let r = async {
                let (peer, remote) = self.remote_for(t.dst).await?;
                let runs = coalesce(
                    &t.src_blocks,
                    &t.dst_blocks,
                    src.desc.units()?,
                    remote.desc.units()?,
                )?;
                Ok((peer, remote, runs))
            }
            .await;
            match r {
                Ok(x) => {
                    resolved.push(Some(x));
                    results.push(Ok(()));
                }
                Err(e) => {
                    resolved.push(None);
                    results.push(Err(e));
                }
            }
        }
        let mut inflight = FuturesUnordered::new();
        let mut layers = 0u32;
        let mut last_ready = Duration::ZERO;
        let mut open = true;
        while open || !inflight.is_empty() {
            tokio::select! {
                l = ready.next(), if open => match l {
                    Some(l) => {
                        layers += 1;
                        last_ready = start.elapsed();
                        for (i, r) in resolved.iter().enumerate() {
                            let Some((peer, remote, runs)) = r else { continue };
                            let ext = KvCacheExtParam {
                                tensor_num_per_layer: targets[i].tensor_num_per_layer,
                                ..KvCacheExtParam::layers(l..l + 1)
                            };
                            inflight.push(async move {
                                let res = self.move_runs_pub(peer, remote, src, runs, &ext).await;
                                (i, res)
                            });
                        }
                    }
                    None => open = false,
                },
                Some((i, res)) = inflight.next(), if !inflight.is_empty() => {
                    if let Err(e) = res {
                        match &mut results[i] {
                            // The first failed layer gives the status; later ones add their
                            // (layer, block) pairs.
                            Err(first) => {
                                let mut all = std::mem::take(&mut first.failed).into_vec();
                                all.extend_from_slice(&e.failed);
                                first.failed = all.into_boxed_slice();
                            }
                            ok => *ok = Err(e),
                        }
                    }
                }
            }
        }
        for r in &mut results {
            if let Err(e) = r {
                e.failed.sort_unstable();
            }
        }
        LayerwiseReport {
            results,
            layers,
            last_ready,
            finished: start.elapsed(),
        }
    }
}
