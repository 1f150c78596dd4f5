//! `hixl._hixl.DataDist`'s lease methods (a hixl extension): leasing blocks to a puller,
//! ending leases and their events on the owner; pulling leased blocks, done and renew on the
//! puller.

use std::time::Duration;

use futures::{FutureExt, StreamExt};
use hixl_datadist::{Cache, DataDistError};
use pyo3::prelude::*;

use super::convert::{bkey, dd_result, ext_of, grant_of, millis, param, why_name, EndedTuple, Ext};
use super::{run, DataDist};

#[pymethods]
impl DataDist {
    /// Leases `blocks` of `caches` for request `request_id`, under a minted `(lease_id,
    /// generation)` when given; returns the grant as JSON.
    #[pyo3(signature = (request_id, caches, blocks, ttl_ms, minted=None))]
    fn lease_blocks(
        &self,
        py: Python<'_>,
        request_id: u64,
        caches: Vec<i64>,
        blocks: Vec<u64>,
        ttl_ms: u64,
        minted: Option<(u64, u64)>,
    ) -> PyResult<String> {
        let ttl = millis(ttl_ms, "lease TTL")?;
        let cs: Vec<Cache> = caches
            .iter()
            .map(|&c| self.shared.cache(c))
            .collect::<PyResult<_>>()?;
        let dd = self.shared.dd.clone();
        let grant = dd_result(run(py, async move {
            let refs: Vec<&Cache> = cs.iter().collect();
            dd.read()
                .await
                .lease_blocks_as(request_id, &refs, &blocks, ttl, minted)
        }))?;
        serde_json::to_string(&grant).map_err(|e| param(format!("lease grant: {e}")))
    }

    /// Ends a lease this cluster granted.
    fn end_lease(&self, py: Python<'_>, lease_id: u64) -> PyResult<()> {
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move { dd.read().await.end_lease(lease_id) }))
    }

    /// Leases this cluster granted that are live.
    fn live_leases(&self, py: Python<'_>) -> PyResult<usize> {
        let dd = self.shared.dd.clone();
        dd_result(run(py, async move { dd.read().await.live_leases() }))
    }

    /// Ended leases: waits up to `timeout_ms` (`None`: not at all) for the first, then takes
    /// every one that is ready.
    #[pyo3(signature = (timeout_ms=None))]
    fn lease_events(&self, py: Python<'_>, timeout_ms: Option<u64>) -> PyResult<Vec<EndedTuple>> {
        let sh = self.shared.clone();
        dd_result(run(py, async move {
            let mut ev = sh.events.lock().await;
            if ev.is_none() {
                *ev = Some(sh.dd.read().await.lease_events()?);
            }
            let mut out = Vec::new();
            let Some(rx) = ev.as_mut() else {
                return Ok(Vec::new());
            };
            if let Some(ms) = timeout_ms.filter(|&m| m > 0) {
                if let Ok(Some(e)) =
                    tokio::time::timeout(Duration::from_millis(ms), rx.next()).await
                {
                    out.push(e);
                }
            }
            while let Some(Some(e)) = rx.next().now_or_never() {
                out.push(e);
            }
            let out: Vec<EndedTuple> = out
                .into_iter()
                .map(|e| {
                    (
                        e.request_id,
                        e.lease_id,
                        e.caches,
                        e.blocks,
                        why_name(e.why),
                    )
                })
                .collect();
            Ok::<_, DataDistError>(out)
        }))
    }

    /// Pulls leased blocks of the owner's blocks cache `key` into `dst`.
    #[allow(clippy::too_many_arguments)]
    fn pull_leased_blocks(
        &self,
        py: Python<'_>,
        grant: &str,
        key: (u64, u64),
        dst: i64,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
        ext: Ext,
        done: bool,
    ) -> PyResult<()> {
        let grant = grant_of(grant)?;
        let dst = self.shared.cache(dst)?;
        let (dd, ext) = (self.shared.dd.clone(), ext_of(ext));
        dd_result(run(py, async move {
            dd.read()
                .await
                .pull_leased_blocks(
                    &grant,
                    bkey(key),
                    &dst,
                    &src_blocks,
                    &dst_blocks,
                    &ext,
                    done,
                )
                .await
        }))
    }

    /// Tells the owner the lease's blocks are needed no more.
    fn lease_done(&self, py: Python<'_>, grant: &str) -> PyResult<()> {
        let grant = grant_of(grant)?;
        let dd = self.shared.dd.clone();
        dd_result(run(
            py,
            async move { dd.read().await.lease_done(&grant).await },
        ))
    }

    /// Extends the lease by its TTL.
    fn renew_lease(&self, py: Python<'_>, grant: &str) -> PyResult<()> {
        let grant = grant_of(grant)?;
        let dd = self.shared.dd.clone();
        dd_result(run(
            py,
            async move { dd.read().await.renew_lease(&grant).await },
        ))
    }
}
