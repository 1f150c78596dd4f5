//! Leases, wired: the owner's side (grant, revoke, the stream of ended leases, the notify
//! service that answers pullers, the reaper that applies TTLs and link deaths) and the
//! puller's side (a leased pull: acquire, READ, release). The rules are in [`crate::lease`].

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Weak};
use std::time::Duration;

use hixl_core::{Error, Notify, Status};

use super::bound::Bound;
use super::{Cache, Inner, LlmDataDist};
use crate::cache::{coalesce, BlocksCacheKey, KvCacheExtParam};
use crate::lease::{EndedLease, Frame, LeaseGrant, LEASE_NOTIFY};
use crate::status::{DataDistError, LlmStatus, Result};
use hixl_async::clock::now;
use hixl_async::sync::lock;

/// How often the reaper checks the links of bound leases (a killed puller's link closes at
/// once; a silent one is ended by the engine's heartbeats, then seen here).
const LINK_POLL: Duration = Duration::from_millis(20);

/// The owner's stream of ended leases (see [`LlmDataDist::lease_events`]).
pub type LeaseEvents = futures::channel::mpsc::UnboundedReceiver<EndedLease>;

/// Starts answering lease frames and the reaper.
pub(super) fn start(inner: &Arc<Inner>) -> Result<()> {
    let weak = Arc::downgrade(inner);
    let svc = inner
        .engine
        .serve_notifies(LEASE_NOTIFY, move |n: &Notify| match weak.upgrade() {
            Some(inner) => on_frame(&inner, n),
            None => Status::Failed,
        })?;
    *lock(&inner.lease_service) = Some(svc);
    let task = tokio::spawn(reaper(Arc::downgrade(inner), inner.reaper_wake.clone()));
    *lock(&inner.reaper) = Some(task.abort_handle());
    Ok(())
}

/// Stops both (finalize).
pub(super) fn stop(inner: &Inner) {
    lock(&inner.lease_service).take();
    if let Some(r) = lock(&inner.reaper).take() {
        r.abort();
    }
}

fn emit(inner: &Inner, ended: Vec<EndedLease>) {
    for e in ended {
        inner.lease_counts.ended(e.why);
        tracing::debug!(
            request = e.request_id,
            lease = e.lease_id,
            "lease ended: {:?}",
            e.why
        );
        let _ = inner.ended_tx.unbounded_send(e);
    }
}

/// The owner's answer to a lease frame from a puller.
fn on_frame(inner: &Inner, n: &Notify) -> Status {
    let frame = Frame::decode(&n.msg);
    let mut t = lock(&inner.leases);
    let (r, ended) = t.on_frame(frame, n.link, now());
    drop(t);
    emit(inner, ended);
    inner.reaper_wake.notify_one();
    match r {
        Ok(()) => Status::Success,
        Err(why) => {
            tracing::debug!(peer = %n.from, "lease frame {frame:?} refused: {why:?}");
            Status::ParamInvalid
        }
    }
}

/// Ends leases whose time passed or whose puller's link died.
async fn reaper(inner: Weak<Inner>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let (next, bound) = {
            let Some(inner) = inner.upgrade() else { return };
            let mut t = lock(&inner.leases);
            let ended = t.tick(now(), |l| inner.engine.initiator_connected(l));
            let next = (t.next_deadline(), t.any_bound());
            drop(t);
            emit(&inner, ended);
            next
        };
        let poll = bound.then(|| now() + LINK_POLL);
        let at = match (next, poll) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match at {
            Some(at) => {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(tokio::time::Instant::from_std(at)) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A pull from `src` of `src_blocks` under `grant`: the grant is of `src`'s cluster and
/// leases every block.
///
/// # Errors
/// `LLM_PARAM_INVALID` naming the cluster or the first block not leased.
pub(super) fn check_grant_blocks(
    grant: &LeaseGrant,
    src: BlocksCacheKey,
    src_blocks: &[u64],
) -> Result<()> {
    if src.cluster_id != grant.owner {
        return Err(DataDistError::param(format!(
            "the grant of lease {} is from cluster {}, the cache {src:?} is not",
            grant.lease_id, grant.owner
        )));
    }
    let leased: HashSet<u64> = grant.blocks.iter().copied().collect();
    if let Some(b) = src_blocks.iter().find(|b| !leased.contains(b)) {
        return Err(DataDistError::param(format!(
            "block {b} is not in lease {} of request {}",
            grant.lease_id, grant.request_id
        )));
    }
    Ok(())
}

/// The owner's cache `cache_id` (that `src` names) is one `grant` covers.
///
/// # Errors
/// `LLM_PARAM_INVALID` naming the cache.
pub(super) fn check_grant_cache(
    grant: &LeaseGrant,
    src: BlocksCacheKey,
    cache_id: i64,
) -> Result<()> {
    if grant.caches.contains(&cache_id) {
        return Ok(());
    }
    Err(DataDistError::param(format!(
        "cache {cache_id} ({src:?}) is not covered by lease {} of request {}",
        grant.lease_id, grant.request_id
    )))
}

impl LlmDataDist {
    /// Leases `blocks` (the same block ids in each of `caches`) of request `request_id` to
    /// the peer that will pull them, for `ttl` without progress. Hand the returned grant to
    /// that peer (it is serializable); its [`LlmDataDist::pull_leased_blocks`] calls are
    /// checked against the lease before a byte moves. Until the lease ends (reported on
    /// [`LlmDataDist::lease_events`]) its blocks cannot be leased again, overwritten by a
    /// local copy, or their cache unregistered.
    ///
    /// # Errors
    /// `LLM_KV_CACHE_NOT_EXIST` for a cache not registered here; `LLM_PARAM_INVALID` for no
    /// blocks, a block past a cache's end, a block or cache named twice, a TTL of zero or over
    /// [`crate::lease::MAX_TTL`] (one day; `Duration::MAX` too) naming it;
    /// `LLM_LEASE_HELD` naming a block a live lease holds, and that lease's request.
    pub fn lease_blocks(
        &self,
        request_id: u64,
        caches: &[&Cache],
        blocks: &[u64],
        ttl: Duration,
    ) -> Result<LeaseGrant> {
        self.lease_blocks_as(request_id, caches, blocks, ttl, None)
    }

    /// [`LlmDataDist::lease_blocks`] under a lease id and generation minted ahead, `(id,
    /// generation)`, when given: for a coordinator that hands the grant out before this
    /// instance runs again (a serving engine's scheduler process, whose worker process holds
    /// the memory). The minter keeps ids unique and generations random and nonzero; until the
    /// lease is created here a pull presenting the grant is refused (`LLM_LEASE_ENDED`) and
    /// moves no byte, so a puller that may run first retries for a bounded time.
    ///
    /// # Errors
    /// As [`LlmDataDist::lease_blocks`], and `LLM_PARAM_INVALID` for an id 0, an id a live
    /// lease has, or a generation 0.
    pub fn lease_blocks_as(
        &self,
        request_id: u64,
        caches: &[&Cache],
        blocks: &[u64],
        ttl: Duration,
        minted: Option<(u64, u64)>,
    ) -> Result<LeaseGrant> {
        let inner = self.inner()?;
        {
            let st = lock(&inner.state);
            for c in caches {
                if !st.caches.contains_key(&c.cache_id) {
                    return Err(DataDistError::new(
                        LlmStatus::KvCacheNotExist,
                        format!("cache {} is not registered here", c.cache_id),
                    ));
                }
                let units = c.desc.units()?;
                if let Some(b) = blocks.iter().find(|&&b| b >= units) {
                    return Err(DataDistError::param(format!(
                        "block {b} is past cache {}'s {units} blocks",
                        c.cache_id
                    )));
                }
            }
        }
        let ids: Vec<i64> = caches.iter().map(|c| c.cache_id).collect();
        let grant = lock(&inner.leases).create_as(
            self.cluster_id,
            request_id,
            &ids,
            blocks,
            ttl,
            minted.map(|m| m.0),
            minted.map_or_else(random_u64, |m| m.1),
            now(),
        )?;
        inner.lease_counts.granted();
        inner.reaper_wake.notify_one();
        Ok(grant)
    }

    /// Ends a lease this cluster granted (the request was aborted): no new pull of it is
    /// admitted; it is reported ended (`Revoked`) at once, or when the pulls in flight are
    /// done or past their window.
    ///
    /// # Errors
    /// `LLM_LEASE_ENDED` for a lease that is not live.
    pub fn end_lease(&self, lease_id: u64) -> Result<()> {
        let inner = self.inner()?;
        let ended = {
            let mut t = lock(&inner.leases);
            if !t.revoke(lease_id) {
                return Err(DataDistError::new(
                    LlmStatus::LeaseEnded,
                    format!("lease {lease_id} is not live"),
                ));
            }
            t.tick(now(), |l| inner.engine.initiator_connected(l))
        };
        emit(inner, ended);
        inner.reaper_wake.notify_one();
        Ok(())
    }

    /// The stream of leases this cluster granted that ended, with why; each ended lease's
    /// blocks may be freed and reused. One stream per instance (a second call fails).
    ///
    /// # Errors
    /// `LLM_FAILED` when the stream was taken already.
    pub fn lease_events(&self) -> Result<LeaseEvents> {
        lock(&self.inner()?.ended_rx).take().ok_or_else(|| {
            DataDistError::new(
                LlmStatus::Failed,
                "the lease event stream was taken already",
            )
        })
    }

    /// The engine's metrics ([`hixl_async::Engine::metrics_text`]) and this cluster's
    /// leases: `hixl_leases_live`, `hixl_leases_granted_total` and `hixl_leases_ended_total`
    /// by reason (`done`, `expired`, `link_down`, `revoked`).
    ///
    /// # Errors
    /// `LLM_FAILED` before initialize.
    pub fn metrics_text(&self) -> Result<String> {
        let inner = self.inner()?;
        let mut out = inner.engine.metrics_text();
        let live = lock(&inner.leases).len();
        let name = inner.engine.local_engine().to_string();
        inner
            .lease_counts
            .prometheus(&mut out, &name, self.cluster_id, live);
        Ok(out)
    }

    /// Leases this cluster granted that are live.
    ///
    /// # Errors
    /// `LLM_FAILED` before initialize.
    pub fn live_leases(&self) -> Result<usize> {
        Ok(lock(&self.inner()?.leases).len())
    }

    /// The live lease holding one of `blocks` of `cache_id`: `LLM_LEASE_HELD` naming it.
    pub(super) fn check_not_leased(&self, cache_id: i64, blocks: &[u64]) -> Result<()> {
        let inner = self.inner()?;
        let t = lock(&inner.leases);
        match t.holder(cache_id, blocks) {
            Some((b, req)) => Err(DataDistError::new(
                LlmStatus::LeaseHeld,
                format!("block {b} of cache {cache_id} is leased to request {req}"),
            )),
            None => Ok(()),
        }
    }

    /// A live lease covering `cache_id`: `LLM_LEASE_HELD` naming its request.
    pub(super) fn check_cache_not_leased(&self, cache_id: i64) -> Result<()> {
        let inner = self.inner()?;
        let t = lock(&inner.leases);
        match t.holds_cache(cache_id) {
            Some(req) => Err(DataDistError::new(
                LlmStatus::LeaseHeld,
                format!("cache {cache_id} has blocks leased to request {req}"),
            )),
            None => Ok(()),
        }
    }

    async fn lease_frame(&self, grant: &LeaseGrant, frame: Frame, timeout: Duration) -> Result<()> {
        let peer = self.linked_peer(grant.owner)?;
        peer.notify_timeout(LEASE_NOTIFY, frame.encode(), timeout)
            .await
            .map_err(|e| match e {
                Error::Remote {
                    status: Status::ParamInvalid,
                    ..
                } => DataDistError::new(
                    LlmStatus::LeaseEnded,
                    format!(
                        "lease {} (generation {:#x}) of request {} at cluster {} is not live as presented: it ended (done, expired, link down or revoked), or was never granted with these caches and blocks; nothing was moved",
                        grant.lease_id, grant.generation, grant.request_id, grant.owner
                    ),
                ),
                e => DataDistError::from(e),
            })
    }

    /// Pulls leased blocks of the owner's blocks cache `src` into `dst` (the puller's side of
    /// [`LlmDataDist::lease_blocks`]). The owner admits the pull only while the lease is live
    /// and of `grant`'s generation, and keeps the blocks unreused until the pull is done or
    /// its window (`llm.SyncKvCacheWaitTime`) passed; so a pull never returns bytes of a
    /// request the blocks were reused for. With `done` the lease ends after a successful pull.
    /// On a partial failure the error lists the (layer, block) pairs that did not land.
    ///
    /// # Errors
    /// `LLM_LEASE_ENDED` when the lease is not live (nothing moved); `LLM_PARAM_INVALID` for
    /// blocks or a cache the grant does not cover, or a grant of another cluster than `src`'s;
    /// otherwise as [`LlmDataDist::pull_kv_blocks`].
    #[allow(clippy::too_many_arguments)]
    pub async fn pull_leased_blocks(
        &self,
        grant: &LeaseGrant,
        src: BlocksCacheKey,
        dst: &Cache,
        src_blocks: &[u64],
        dst_blocks: &[u64],
        ext: &KvCacheExtParam,
        done: bool,
    ) -> Result<()> {
        let window = self.inner()?.opts.sync_wait;
        check_grant_blocks(grant, src, src_blocks)?;
        let (peer, remote) = self.remote_for(src).await?;
        check_grant_cache(grant, src, remote.cache_id)?;
        let runs = coalesce(
            src_blocks,
            dst_blocks,
            remote.desc.units()?,
            dst.desc.units()?,
        )?;
        let start = tokio::time::Instant::now();
        let ticket = self.acquire_lease(grant, 1, window).await?;
        // The owner's window opened when it admitted the acquire, after `start`: ending the
        // pull by `start + window` ends it inside the window, and a layer past it resolves
        // only once none of its parts is in flight, so the release below goes out when
        // nothing of this pull reads the blocks any more.
        let res = self
            .move_runs(
                &peer,
                &remote,
                dst,
                &runs,
                ext,
                true,
                Bound::leased(start, window),
            )
            .await;
        self.release_lease(grant, ticket, done && res.is_ok(), window)
            .await;
        res
    }

    /// Takes a ticket on `grant`'s lease for a pull within `window`, declaring that `readers`
    /// distinct links read the lease (1: this one only). Returns the ticket.
    ///
    /// # Errors
    /// `LLM_LEASE_ENDED` when the owner refuses (nothing may move); the link's error.
    pub(super) async fn acquire_lease(
        &self,
        grant: &LeaseGrant,
        readers: u32,
        window: Duration,
    ) -> Result<u64> {
        let ticket = random_u64();
        let frame = Frame::Acquire {
            lease: grant.lease_id,
            gen: grant.generation,
            ticket,
            window_ms: window.as_millis().min(u128::from(u32::MAX)) as u32,
            digest: grant.digest(),
            readers,
        };
        self.lease_frame(grant, frame, window).await?;
        Ok(ticket)
    }

    /// Gives a ticket back, `done` when this puller needs the blocks no more. The release
    /// goes out now and its answer is not waited for: the blocks have landed (or not)
    /// whatever the owner says, and a lost release only delays the lease's end to its TTL or
    /// the ticket's window. Not waiting saves the puller a round trip.
    pub(super) async fn release_lease(
        &self,
        grant: &LeaseGrant,
        ticket: u64,
        done: bool,
        window: Duration,
    ) {
        let release = Frame::Release {
            lease: grant.lease_id,
            gen: grant.generation,
            ticket,
            done,
        };
        let lease = grant.lease_id;
        match (
            self.linked_peer(grant.owner),
            tokio::runtime::Handle::try_current(),
        ) {
            (Ok(peer), Ok(rt)) => {
                let frame = release.encode();
                rt.spawn(async move {
                    if let Err(e) = peer.notify_timeout(LEASE_NOTIFY, frame, window).await {
                        tracing::debug!(lease, "lease release not acknowledged: {e}");
                    }
                });
            }
            _ => {
                if let Err(e) = self.lease_frame(grant, release, window).await {
                    tracing::debug!(lease, "lease release not acknowledged: {e}");
                }
            }
        }
    }

    /// Tells the owner the lease's blocks are needed no more (the "done" notify): the owner
    /// reports the lease ended (`Done`) once no pull of it is in flight. For a lease read by
    /// several links ([`LlmDataDist::pull_leased_blocks_resharded`]) this link's done counts
    /// once, and the lease ends when every reader link's is in.
    ///
    /// # Errors
    /// `LLM_LEASE_ENDED` when the lease is not live; `LLM_NOT_YET_LINK` without a link to the
    /// owner.
    pub async fn lease_done(&self, grant: &LeaseGrant) -> Result<()> {
        let t = self.inner()?.opts.sync_wait;
        let f = Frame::Release {
            lease: grant.lease_id,
            gen: grant.generation,
            ticket: 0,
            done: true,
        };
        self.lease_frame(grant, f, t).await
    }

    /// Extends the lease by its TTL (the puller's heartbeat while it still needs the blocks
    /// but is not pulling yet).
    ///
    /// # Errors
    /// As [`LlmDataDist::lease_done`].
    pub async fn renew_lease(&self, grant: &LeaseGrant) -> Result<()> {
        let t = self.inner()?.opts.sync_wait;
        let f = Frame::Renew {
            lease: grant.lease_id,
            gen: grant.generation,
        };
        self.lease_frame(grant, f, t).await
    }
}
