//! `LlmDataDist`: a cluster's KV caches, its links to other clusters, and pull/push of caches
//! and blocks between them, over a hixl engine.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_async::{Engine, HostBuffer, NotifyService, Peer, Region};
use hixl_core::Access;

use crate::cache::CacheDesc;
use crate::lease::{EndedLease, LeaseTable};
use crate::options::DataDistOptions;
use crate::status::{DataDistError, LlmStatus, Result};
use crate::table::{CacheEntry, CacheTable, TABLE_REGION};
use hixl_async::sync::lock;

mod bound;
mod caches;
mod lease_metrics;
mod leased_reshard;
mod leases;
pub use leases::LeaseEvents;
mod links;
mod local;
mod reshard;
mod transfers;

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
    /// The leases this cluster granted (it owns their blocks).
    leases: Mutex<LeaseTable>,
    /// Leases granted and ended, for the metrics.
    lease_counts: lease_metrics::LeaseCounts,
    /// Ended leases, to [`LlmDataDist::lease_events`]' stream.
    ended_tx: futures::channel::mpsc::UnboundedSender<EndedLease>,
    ended_rx: Mutex<Option<futures::channel::mpsc::UnboundedReceiver<EndedLease>>>,
    /// Rings the lease reaper when deadlines change.
    reaper_wake: Arc<tokio::sync::Notify>,
    reaper: Mutex<Option<tokio::task::AbortHandle>>,
    /// Answers the lease protocol's notifies while it lives.
    lease_service: Mutex<Option<NotifyService>>,
}

impl Drop for Inner {
    /// An instance dropped without `finalize`: its lease reaper stops with it.
    fn drop(&mut self) {
        leases::stop(self);
    }
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

    /// Changes the role label (LLM-DataDist `switch_role`, HIXL `SetRole`). As there, it is
    /// refused while this cluster has links: unlink them first.
    ///
    /// # Errors
    /// `LLM_EXIST_LINK` naming the clusters still linked.
    pub fn switch_role(&mut self, role: LlmRole) -> Result<()> {
        if let Some(inner) = &self.inner {
            let st = lock(&inner.state);
            if !st.links.is_empty() {
                let mut ids: Vec<u64> = st.links.keys().copied().collect();
                ids.sort_unstable();
                return Err(DataDistError::new(
                    LlmStatus::ExistLink,
                    format!(
                        "cluster {} cannot switch from {:?} to {role:?}: still linked to clusters {ids:?}",
                        self.cluster_id, self.role
                    ),
                ));
            }
        }
        self.role = role;
        Ok(())
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
        // A ticket past its window is held while its puller's link lives, up to the time
        // this engine takes to notice a dead link: the puller quiesces its parts in flight
        // before it releases, and a link that dies voids its tickets at once.
        let grace = {
            let o = engine.options();
            Duration::from_millis(o.heartbeat_interval_ms)
                .saturating_mul(o.heartbeat_miss_limit.max(1))
        };
        let (ended_tx, ended_rx) = futures::channel::mpsc::unbounded();
        let inner = Arc::new(Inner {
            engine,
            opts,
            state: Mutex::new(State {
                next_id: 1,
                ..State::default()
            }),
            leases: Mutex::new(LeaseTable::with_grace(grace)),
            lease_counts: lease_metrics::LeaseCounts::default(),
            ended_tx,
            ended_rx: Mutex::new(Some(ended_rx)),
            reaper_wake: Arc::new(tokio::sync::Notify::new()),
            reaper: Mutex::new(None),
            lease_service: Mutex::new(None),
        });
        leases::start(&inner)?;
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
            leases::stop(&inner);
            inner.engine.shutdown(Duration::from_secs(1)).await;
        }
    }

    /// Republishes the cache table. The table region is rewritten in place while the table
    /// fits (peers' views of the region stay valid; a read that races the rewrite fails its
    /// checksum and is retried); a larger table moves to a new region of twice the size.
    async fn publish(&self) -> Result<()> {
        let inner = self.inner()?;
        let old = {
            let mut st = lock(&inner.state);
            let table = CacheTable {
                cluster_id: self.cluster_id,
                caches: st.caches.values().map(|l| l.entry.clone()).collect(),
            };
            let bytes = table.encode();
            if let Some(r) = &st.table_region {
                if r.len() >= bytes.len() as u64 {
                    r.write_at(0, &bytes)?;
                    return Ok(());
                }
            }
            let mut buf = HostBuffer::zeroed((bytes.len() * 2).max(4096))?;
            buf.as_mut_slice()[..bytes.len()].copy_from_slice(&bytes);
            let region =
                inner
                    .engine
                    .register_with(buf, Access::REMOTE_READ, Some(TABLE_REGION))?;
            st.table_region.replace(region)
        };
        if let Some(old) = old {
            inner.engine.deregister(&old).await?;
        }
        Ok(())
    }
}
