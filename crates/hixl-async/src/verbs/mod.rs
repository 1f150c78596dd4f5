//! The engine's side of the RDMA verbs backend: the device, its protection domain and
//! completion queue, memory regions for registered memory, and the initiator's RC queue pair
//! to each peer reached over verbs.
//!
//! **Leases.** A work request names local memory by lkey; the device touches it until the
//! request's completion is polled. The op table holds the lease on each op's local regions
//! until the op's last completion has been drained (`rawio::PartRange`), whether the
//! transfer's future is still waiting, was dropped or timed out. [`VerbsSource`]'s hold table
//! only maps a transfer's token to its link, so that a flushed request reports why its link
//! closed. Remote memory needs no lease: the peer's device refuses a request once the
//! region's memory region is deregistered.
//!
//! **Send-queue room.** A call's work requests go to the QP as one chain when they fit in its
//! free send-queue slots; the rest wait in the link's backlog, posted as completions free
//! slots (the drain pumps every link with a backlog).
//!
//! **Failure.** A QP whose work request failed is in the error state: everything it had
//! outstanding completes with an error (the device's cause, then "flushed"), its backlog is
//! failed with the same cause, and the link is closed so that the peer can be reconnected.

pub(crate) mod channel;
pub(crate) mod connect;
pub(crate) mod target;

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, RwLock, Weak};

use hixl_core::options::TransportChoice;
use hixl_core::{CompletionSource, Error, Options, PartResult, Result, Token};
use hixl_verbs::{
    Context, Cq, MemoryRegion, ProtectionDomain, QpConfig, QpEndpoint, QueuePair, WorkRequest,
};

use crate::completion::Completion;
use crate::link_state::LinkState;
use crate::sink::Completions;
use crate::sync::{lock, read, write};

/// Send-queue depth of an initiator's QP (clamped to the device's `max_qp_wr`).
const SEND_QUEUE: u32 = 2048;
/// Completion-queue entries (clamped to the device's `max_cqe`).
const CQ_ENTRIES: u32 = 1 << 16;

/// What an engine with the verbs backend owns.
pub(crate) struct VerbsBackend {
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: Cq,
    pub(crate) source: Arc<VerbsSource>,
    /// Config of initiator QPs (from the engine's options).
    cfg: QpConfig,
    /// `hixl.Transport=verbs`: refuse peers verbs cannot reach instead of using TCP.
    pub(crate) forced: bool,
    /// The device's name.
    pub(crate) device: String,
}

impl std::fmt::Debug for VerbsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsBackend")
            .field("device", &self.device)
            .field("forced", &self.forced)
            .finish_non_exhaustive()
    }
}

impl VerbsBackend {
    /// The backend the options ask for. `Ok((None, why))` when verbs is not wanted or (with
    /// `auto`) no device is usable; an error only when `hixl.Transport=verbs` cannot be met.
    pub(crate) fn new(o: &Options) -> Result<(Option<VerbsBackend>, String)> {
        match o.transport {
            TransportChoice::Tcp | TransportChoice::Fabric => {
                return Ok((None, format!("hixl.Transport={}", o.transport.as_str())))
            }
            TransportChoice::Auto | TransportChoice::Verbs => {}
        }
        let forced = o.transport == TransportChoice::Verbs;
        match Self::open(o, forced) {
            Ok(b) => {
                let why = format!("device {}", b.device);
                Ok((Some(b), why))
            }
            Err(e) if forced => Err(Error::Unsupported {
                what: format!("hixl.Transport=verbs, but no RDMA device is usable: {e}"),
            }),
            Err(e) => {
                tracing::debug!("verbs backend off: {e}");
                Ok((None, e.to_string()))
            }
        }
    }

    fn open(o: &Options, forced: bool) -> hixl_verbs::Result<VerbsBackend> {
        let ctx = match &o.verbs_device {
            Some(d) => Context::open(d)?,
            None => Context::open_first_active()?,
        };
        let limits = ctx.limits();
        let pd = ProtectionDomain::new(&ctx)?;
        let cq = Cq::new(&ctx, CQ_ENTRIES.min(limits.max_cqe))?;
        let mut cfg = QpConfig::from_options(o);
        cfg.max_send_wr = SEND_QUEUE.min(limits.max_qp_wr);
        // Fail at build, not at the first connect, for a port without an active MTU or a
        // GID index the port does not have.
        drop(QueuePair::new(&pd, &cq, target_config(&cfg))?);
        Ok(VerbsBackend {
            device: ctx.name().to_string(),
            source: Arc::new(VerbsSource {
                cq: cq.clone(),
                holds: Mutex::new(HashMap::new()),
                links: Mutex::new(Vec::new()),
            }),
            pd,
            cq,
            cfg,
            forced,
        })
    }

    /// Registers `[addr, addr+len)` with the device.
    ///
    /// # Safety
    /// The memory stays mapped until the returned region is dropped and every work request
    /// naming it has completed (the engine drops it in deregistration, after its leases).
    pub(crate) unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        access: hixl_core::Access,
    ) -> Result<MemoryRegion> {
        let len = usize::try_from(len).map_err(|_| Error::TooLarge {
            what: "region",
            len,
            max: usize::MAX as u64,
        })?;
        // SAFETY: this function's contract.
        unsafe { MemoryRegion::register(&self.pd, addr as *mut u8, len, access) }
            .map_err(Error::from)
    }

    /// A QP for an initiator's link (RESET state until connected).
    pub(crate) fn initiator_qp(&self, peer: &str) -> Result<QueuePair> {
        let mut qp = QueuePair::new(&self.pd, &self.cq, self.cfg.clone())?;
        qp.set_peer_name(peer);
        Ok(qp)
    }

    /// The target's QP for an initiator that asked for one, connected to its endpoint.
    pub(crate) fn accept(&self, peer: &str, endpoint: &[u8]) -> Result<QueuePair> {
        let remote = QpEndpoint::from_bytes(endpoint)?;
        let mut qp = QueuePair::new(&self.pd, &self.cq, target_config(&self.cfg))?;
        qp.set_peer_name(peer);
        qp.connect(&remote)?;
        Ok(qp)
    }
}

/// Targets post nothing on their QPs: one send-queue slot, so that many initiators fit in
/// the completion queue.
fn target_config(cfg: &QpConfig) -> QpConfig {
    QpConfig {
        max_send_wr: 1,
        ..cfg.clone()
    }
}

/// How many of one transfer's work requests are posted or waiting, and the link they are on.
struct Hold {
    parts: usize,
    link: Weak<VerbsLink>,
}

/// The verbs completion queue as the reactor sees it: draining also names the cause of
/// flushed requests, closes links whose QP failed and posts backlogs into freed slots.
pub(crate) struct VerbsSource {
    cq: Cq,
    holds: Mutex<HashMap<Token, Hold>>,
    links: Mutex<Vec<Weak<VerbsLink>>>,
}

impl VerbsSource {
    fn hold(&self, token: Token, parts: usize, link: Weak<VerbsLink>) {
        {
            let mut h = lock(&self.holds);
            h.entry(token)
                .and_modify(|x| x.parts += parts)
                .or_insert(Hold { parts, link });
        }
    }

    fn release(&self, token: Token, parts: usize) {
        {
            let mut h = lock(&self.holds);
            if let Some(x) = h.get_mut(&token) {
                x.parts = x.parts.saturating_sub(parts);
                if x.parts == 0 {
                    h.remove(&token);
                }
            }
        }
    }

    fn add_link(&self, l: &Arc<VerbsLink>) {
        let mut v = lock(&self.links);
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(l));
    }

    fn live_links(&self) -> Vec<Arc<VerbsLink>> {
        lock(&self.links).iter().filter_map(Weak::upgrade).collect()
    }
}

impl std::fmt::Debug for VerbsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSource").finish_non_exhaustive()
    }
}

impl CompletionSource for VerbsSource {
    fn drain(&self, out: &mut Vec<PartResult>) -> usize {
        let start = out.len();
        let n = self.cq.drain(out);
        if n == 0 {
            return 0;
        }
        // One pass under one lock of the hold table: a flushed request reports why its link
        // closed, and each completion releases one part of its transfer's hold.
        let mut failed = false;
        {
            let mut holds = lock(&self.holds);
            for (token, r) in &mut out[start..] {
                let Some(h) = holds.get_mut(token) else {
                    continue;
                };
                if r.is_err() {
                    failed = true;
                    if let Some(e) = h.link.upgrade().and_then(|l| l.state.error()) {
                        *r = Err(e);
                    }
                }
                h.parts = h.parts.saturating_sub(1);
                if h.parts == 0 {
                    holds.remove(token);
                }
            }
        }
        failed |= out[start..].iter().any(|(_, r)| r.is_err());
        for l in self.live_links() {
            if failed {
                l.check_failed();
            }
            l.pump();
        }
        n
    }

    fn arm(&self) {
        self.cq.arm();
    }

    fn disarm(&self) {
        self.cq.disarm();
    }

    fn fd(&self) -> RawFd {
        self.cq.fd()
    }
}

/// A queue pair connected during the handshake, and what the peer sent with its endpoint.
pub(crate) struct Connected {
    pub(crate) qp: QueuePair,
    pub(crate) remote: QpEndpoint,
    pub(crate) peer_device: String,
    pub(crate) keys: HashMap<u64, u32>,
}

/// An initiator's RC connection to one peer.
pub(crate) struct VerbsLink {
    peer: Arc<str>,
    /// Where the link's completions go.
    sink: Completions,
    source: Arc<VerbsSource>,
    state: Arc<LinkState>,
    /// `None` once the link is closed (dropping the QP flushes what it had outstanding).
    qp: Mutex<Option<QueuePair>>,
    capacity: usize,
    max_msg: u32,
    /// Work requests waiting for send-queue room, in submission order.
    backlog: Mutex<VecDeque<WorkRequest>>,
    /// The peer's device keys by memory-table rkey.
    keys: RwLock<HashMap<u64, u32>>,
    /// What `Peer::transport` says.
    pub(crate) describe: String,
    /// This link, for the holds of its requests.
    me: Weak<VerbsLink>,
}

impl std::fmt::Debug for VerbsLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsLink")
            .field("peer", &self.peer)
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

impl VerbsLink {
    /// Wraps a connected QP, registers the link with the backend's drain and arranges for the
    /// QP to be flushed and the backlog failed when the link dies.
    pub(crate) fn start(
        backend: &VerbsBackend,
        sink: &Completions,
        state: Arc<LinkState>,
        peer: Arc<str>,
        c: Connected,
    ) -> Arc<VerbsLink> {
        let Connected {
            qp,
            remote,
            peer_device,
            keys,
        } = c;
        let describe = format!(
            "verbs (RDMA RC: {} to the peer's {peer_device}; qpn {:#x} to {:#x}, mtu {}, gid index {})",
            backend.device,
            qp.qpn(),
            remote.qpn,
            qp.endpoint().mtu.min(remote.mtu),
            qp.endpoint().gid_index,
        );
        let l = Arc::new_cyclic(|me| VerbsLink {
            me: me.clone(),
            peer,
            sink: sink.clone(),
            source: backend.source.clone(),
            state: state.clone(),
            capacity: qp.config().max_send_wr as usize,
            max_msg: qp.max_message_size(),
            qp: Mutex::new(Some(qp)),
            backlog: Mutex::new(VecDeque::new()),
            keys: RwLock::new(keys),
            describe,
        });
        backend.source.add_link(&l);
        let weak = Arc::downgrade(&l);
        let st = state.clone();
        st.spawn(async move {
            state.dead().await;
            if let Some(l) = weak.upgrade() {
                l.close();
            }
        });
        l
    }

    /// The peer's device rkey for the region with memory-table key `rkey`.
    pub(crate) fn key(&self, rkey: u64) -> Option<u32> {
        read(&self.keys).get(&rkey).copied()
    }

    /// Takes the peer's key list, merged in: an entry whose region is gone is never looked up
    /// (lookups start from the memory table), and [`VerbsLink::prune_keys`] drops it with the
    /// next table.
    pub(crate) fn update_keys(&self, v: &[(u64, u32)]) {
        write(&self.keys).extend(v.iter().copied());
    }

    /// Drops keys of regions no longer in the peer's memory table.
    pub(crate) fn prune_keys(&self, table: &[hixl_core::RemoteRegion]) {
        let mut k = write(&self.keys);
        if k.len() > table.len() {
            let live: std::collections::HashSet<u64> = table.iter().map(|r| r.rkey).collect();
            k.retain(|r, _| live.contains(r));
        }
    }

    /// Posts one transfer's work requests (all carrying `token`; the op table holds their
    /// memory until their completions are drained). What does not fit in the send queue waits
    /// in the backlog.
    pub(crate) fn submit(&self, token: Token, wrs: Vec<WorkRequest>) {
        if wrs.is_empty() {
            return;
        }
        if let Some(w) = wrs
            .iter()
            .find(|w| w.pieces(self.max_msg) > self.capacity as u64)
        {
            // Cannot happen with real limits (max_msg × send-queue depth is terabytes), but
            // a request that can never fit must fail rather than wait forever.
            let e = Error::OpTooLarge {
                len: w.local.len,
                work_requests: w.pieces(self.max_msg),
                capacity: self.capacity,
            };
            return self.fail_now(&wrs, &e);
        }
        self.source.hold(token, wrs.len(), self.me.clone());
        {
            let mut b = lock(&self.backlog);
            b.extend(wrs);
        }
        self.pump();
    }

    /// Posts as much of the backlog as the send queue has room for, as one chain.
    pub(crate) fn pump(&self) {
        let mut qp = lock(&self.qp);
        let mut backlog = lock(&self.backlog);
        if backlog.is_empty() {
            return;
        }
        let Some(q) = qp.as_mut() else {
            let e = self.cause("link closed");
            let wrs: Vec<_> = backlog.drain(..).collect();
            drop((backlog, qp));
            return self.fail(&wrs, &e);
        };
        if let Some(f) = q.failure() {
            let e = self.qp_failed(&f);
            let wrs: Vec<_> = backlog.drain(..).collect();
            drop((backlog, qp));
            return self.fail(&wrs, &e);
        }
        // Requests of transfers dropped or timed out while they waited left the backlog then
        // ([`VerbsLink::withdraw`]).
        let mut room = self.capacity.saturating_sub(q.outstanding());
        let mut n = 0;
        for w in backlog.iter() {
            let p = usize::try_from(w.pieces(self.max_msg)).unwrap_or(usize::MAX);
            if p > room {
                break;
            }
            room -= p;
            n += 1;
        }
        if n == 0 {
            return;
        }
        let chain: Vec<WorkRequest> = backlog.drain(..n).collect();
        // SAFETY: every request's local range lies in a region registered with this
        // engine's protection domain under `local.lkey`, leased (so neither deregistered
        // nor freed) until the request's completion is drained: the op table holds its op's
        // lease until its last part completes (`rawio::PartRange`), and a posted request
        // completes only through the drain. The remote range was checked against the peer's
        // memory table; the peer's device refuses anything else.
        let r = unsafe { q.post_chain(&chain) };
        match r {
            Ok(_) => {}
            Err(hixl_verbs::VerbsError::SendQueueFull { .. }) => {
                // Room was computed under the lock; keep the order and retry on the next drain.
                for w in chain.into_iter().rev() {
                    backlog.push_front(w);
                }
            }
            Err(e @ hixl_verbs::VerbsError::Post { reported_ops, .. }) => {
                let err = Error::transport(&self.peer, "posting RDMA work requests", e);
                let rest: Vec<_> = backlog.drain(..).collect();
                drop((backlog, qp));
                let unposted = chain.get(reported_ops..).unwrap_or(&[]);
                self.fail(unposted, &err);
                self.fail(&rest, &err);
                self.state.kill(err);
            }
            Err(e) => {
                let err = Error::from(e);
                drop((backlog, qp));
                self.fail(&chain, &err);
            }
        }
    }

    /// The owner of `token` went away: its requests still in the backlog are failed with
    /// `cause` and never posted; posted ones complete on the device.
    pub(crate) fn withdraw(&self, token: Token, cause: &Error) {
        let mut out = Vec::new();
        {
            let mut b = lock(&self.backlog);
            b.retain(|w| {
                let mine = w.token == token;
                if mine {
                    out.push(*w);
                }
                !mine
            });
        }
        self.fail(&out, cause);
    }

    /// Closes the link when its QP has failed.
    fn check_failed(&self) {
        let f = lock(&self.qp).as_ref().and_then(QueuePair::failure);
        if let Some(f) = f {
            let e = self.qp_failed(&f);
            tracing::warn!(peer = %self.peer, "closing link: {e}");
            self.state.kill(e);
        }
    }

    fn qp_failed(&self, f: &str) -> Error {
        Error::PeerLost {
            peer: self.peer.to_string(),
            cause: format!("RDMA queue pair failed: {f}"),
        }
    }

    fn cause(&self, what: &str) -> Error {
        self.state.error().unwrap_or_else(|| Error::PeerLost {
            peer: self.peer.to_string(),
            cause: what.into(),
        })
    }

    /// Flushes the QP (its outstanding requests complete with errors, releasing their leases)
    /// and fails the backlog with the link's cause.
    pub(crate) fn close(&self) {
        let qp = lock(&self.qp).take();
        drop(qp);
        let wrs: Vec<_> = lock(&self.backlog).drain(..).collect();
        let e = self.cause("link closed");
        self.fail(&wrs, &e);
    }

    /// Completes requests that were held but never posted with `e`.
    fn fail(&self, wrs: &[WorkRequest], e: &Error) {
        for w in wrs {
            self.source.release(w.token, 1);
        }
        self.fail_now(wrs, e);
    }

    /// Completes requests with `e` (no hold involved).
    fn fail_now(&self, wrs: &[WorkRequest], e: &Error) {
        if wrs.is_empty() {
            return;
        }
        self.sink.complete_all(wrs.iter().map(|w| Completion {
            token: w.token,
            result: Err(e.clone()),
        }));
    }
}
