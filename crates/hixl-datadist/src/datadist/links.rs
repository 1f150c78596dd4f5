//! Links to other clusters: linking (connect and read the peer's cache table), unlinking, and
//! finding a linked peer's cache.

use std::sync::Arc;
use std::time::Duration;

use hixl_async::{Engine, HostBuffer, Peer};
use hixl_core::OpDesc;

use super::{ClusterInfo, Inner, Linked, LlmDataDist, MAX_CLUSTERS_PER_CALL};
use crate::cache::BlocksCacheKey;
use crate::status::{DataDistError, LlmStatus, Result};
use crate::table::{CacheEntry, CacheTable, TABLE_REGION, TORN};
use hixl_async::sync::lock;

impl LlmDataDist {
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
        if lock(&inner.state).links.contains_key(&c.remote_cluster_id) {
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
        lock(&inner.state)
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
            let linked = lock(&inner.state).links.remove(&c.remote_cluster_id);
            out.push(match linked {
                None => Err(not_linked(c.remote_cluster_id)),
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
    pub(super) async fn remote(
        &self,
        cluster_id: u64,
        pick: impl Fn(&CacheTable) -> Option<CacheEntry>,
        what: String,
    ) -> Result<(Peer, CacheEntry)> {
        self.remote_table(cluster_id, pick, what, false).await
    }

    /// As [`LlmDataDist::remote`]; with `fresh` the peer's table is always re-read (keyed
    /// transfers: a removed key must not be pulled from a stale table).
    pub(super) async fn remote_table<R>(
        &self,
        cluster_id: u64,
        pick: impl Fn(&CacheTable) -> Option<R>,
        what: String,
        fresh: bool,
    ) -> Result<(Peer, R)> {
        let inner = self.inner()?;
        let (peer, found) = {
            let st = lock(&inner.state);
            let l = st
                .links
                .get(&cluster_id)
                .ok_or_else(|| not_linked(cluster_id))?;
            (l.peer.clone(), pick(&l.table))
        };
        if let (Some(e), false) = (found, fresh) {
            return Ok((peer, e));
        }
        let table = read_table(&inner.engine, &peer, inner.opts.sync_wait).await?;
        let found = pick(&table);
        if let Some(l) = lock(&inner.state).links.get_mut(&cluster_id) {
            l.table = table;
        }
        found.map(|e| (peer, e)).ok_or_else(|| {
            DataDistError::new(LlmStatus::KvCacheNotExist, format!("{what} does not exist"))
        })
    }

    /// `f` of the link to `cluster_id`.
    fn with_link<R>(&self, cluster_id: u64, f: impl FnOnce(&Linked) -> R) -> Result<R> {
        let inner = self.inner()?;
        let st = lock(&inner.state);
        st.links
            .get(&cluster_id)
            .map(f)
            .ok_or_else(|| not_linked(cluster_id))
    }

    /// The transport the link to `cluster_id` runs over and why, e.g. `fabric (same host: ...)`:
    /// what `hixl.Transport=auto` picked, or the forced one.
    ///
    /// # Errors
    /// `LLM_NOT_YET_LINK`.
    pub fn link_transport(&self, cluster_id: u64) -> Result<String> {
        self.with_link(cluster_id, |l| l.peer.transport().to_string())
    }

    /// The peer of a linked cluster.
    pub(super) fn linked_peer(&self, cluster_id: u64) -> Result<Peer> {
        self.with_link(cluster_id, |l| l.peer.clone())
    }

    /// The cache table of a linked cluster, as last read.
    ///
    /// # Errors
    /// `LLM_NOT_YET_LINK`.
    pub async fn peer_table(&self, cluster_id: u64) -> Result<CacheTable> {
        self.with_link(cluster_id, |l| l.table.clone())
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
}

fn not_linked(cluster_id: u64) -> DataDistError {
    DataDistError::new(
        LlmStatus::NotYetLink,
        format!("cluster {cluster_id} is not linked"),
    )
}

/// READs a peer's cache table region. A read can race the owner: a rewrite in place (the
/// checksum fails) or a move to a larger region whose announcement has not reached this link
/// yet (the old range is refused). Both are retried until `timeout`.
async fn read_table(engine: &Engine, peer: &Peer, timeout: Duration) -> Result<CacheTable> {
    // A timeout past any instant (`Duration::MAX`) is no bound.
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    loop {
        let e = match read_table_once(engine, peer, timeout).await {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let retry = e.status == LlmStatus::ParamInvalid || e.message.contains(TORN);
        let late = deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
        if !retry || !peer.is_connected() || late {
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn read_table_once(engine: &Engine, peer: &Peer, timeout: Duration) -> Result<CacheTable> {
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

/// Makes sure `peer`'s memory table is current for tensors `tensors` of its cache `remote`.
/// The owner's cache table names a cache as soon as its register call returns, while the
/// memory table that lets this side reach the cache's tensors is still on its way over the
/// control connection: a pull or push right after the owner registered syncs the table (one
/// round trip, bounded by `timeout`) instead of being refused. Free when the table holds them.
///
/// Returns the note for an error of the transfer when some tensor is still missing after the
/// sync: the transfer goes on, and fails exactly the layers of the missing tensors.
///
/// # Errors
/// `LLM_TIMEOUT` when the peer does not answer the sync in time; the link's error.
pub(super) async fn announced(
    peer: &Peer,
    remote: &CacheEntry,
    tensors: std::ops::Range<u32>,
    timeout: Duration,
) -> Result<Option<String>> {
    let len = remote.desc.tensor_size()?;
    // Tensors past the table's addresses are refused by the transfer's own plan.
    let first = tensors.start;
    let ranges: Vec<(u64, u64)> = tensors
        .map_while(|t| remote.addrs.get(t as usize).map(|&a| (a, len)))
        .collect();
    match peer.sync_regions(&ranges, timeout).await {
        Ok(()) => Ok(None),
        Err(hixl_core::Error::RemoteOutOfBounds { index, .. }) => Ok(Some(format!(
            "; tensor {} of cache {} of {} is named by its cache table but is in no region of \
             its memory table, synced before this transfer (no table update was in flight: \
             the owner no longer exports it)",
            u64::from(first) + index as u64,
            remote.cache_id,
            peer.name(),
        ))),
        Err(e) => Err(e.into()),
    }
}
