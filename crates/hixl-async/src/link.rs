//! The initiator's side of a link to one peer: handshake, the peer's memory table, data
//! connections, notifies, and the `Peer` handle users hold.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, DataReq, Message};
use hixl_core::{
    Access, Error, OpDesc, RemoteRegion, Result, Status, Token, TransferOp, NOTIFY_MAX_LEN,
    NOTIFY_MAX_PENDING,
};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

#[cfg(feature = "fabric")]
use crate::completion::Completion;
use crate::engine::Shared;
use crate::frame_io::{read_frame, tune, write_frame, write_frames};
use crate::link_state::LinkState;
use crate::memory::Lease;
use crate::tcp::initiator::{fail_parts, DataConn, Part};
use crate::transfer::Transfer;

/// Fabric copies of one call up to this many bytes (and ops) run on the submitting thread:
/// cheaper than waking a copy stream and, through the reactor, the caller again.
#[cfg(feature = "fabric")]
const INLINE_BYTES: u64 = 64 << 10;
#[cfg(feature = "fabric")]
const INLINE_OPS: usize = 4;

/// Tokens of a link's ops, so that the channel pool can tell a busy link from an idle one and
/// the link's death can cancel its copies still queued on the copy engine. Finished ops are
/// pruned only when the list has doubled since the last prune: amortized O(1) per submit, and
/// the op table is not locked on every submission.
#[derive(Debug, Default)]
struct TokenLog {
    tokens: Vec<Token>,
    prune_at: usize,
}

impl TokenLog {
    fn record(&mut self, token: Token, ops: &Mutex<hixl_core::OpTable<std::task::Waker>>) {
        if self.tokens.len() >= self.prune_at {
            if let Ok(o) = ops.lock() {
                self.tokens.retain(|&t| o.phase(t).is_some());
            }
            self.prune_at = (self.tokens.len() * 2).max(64);
        }
        self.tokens.push(token);
    }
}

/// Milliseconds since the first call in this process (a clock links can be compared by).
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// What the initiator keeps per connected peer.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) name: Arc<str>,
    pub(crate) state: Arc<LinkState>,
    table: RwLock<Vec<RemoteRegion>>,
    conns: Vec<DataConn>,
    next: AtomicUsize,
    control: mpsc::UnboundedSender<BytesMut>,
    notify_seq: AtomicU64,
    notify_waiters: Mutex<HashMap<u64, oneshot::Sender<u32>>>,
    chunk: u64,
    /// The same-host fast path, when the peer is on this host and the options allow it.
    #[cfg(feature = "fabric")]
    fabric: Option<Arc<crate::fabric::client::FabricLink>>,
    /// Every op of the link: for [`Link::busy`], and so that the link's death can cancel its
    /// copies still queued on the copy engine.
    ops: Mutex<TokenLog>,
    /// When the link was last used for a transfer or notify (`now_ms`).
    last_used: AtomicU64,
    /// The RDMA path, when both peers have a device and no better transport serves the peer.
    #[cfg(feature = "verbs")]
    verbs: Option<Arc<crate::verbs::VerbsLink>>,
    /// Which transport serves this peer, and why.
    transport: String,
    /// When the control connection last delivered a frame (ms since `born`).
    last_rx: AtomicU64,
    born: std::time::Instant,
}

fn refusal(peer: &str, status: u32, reason: String) -> Error {
    Error::Remote {
        peer: peer.to_string(),
        status: Status::from_code(status).unwrap_or(Status::Failed),
        message: reason,
    }
}

fn unexpected(peer: &str, m: &Message, wanted: &str) -> Error {
    Error::Protocol {
        peer: peer.to_string(),
        reason: format!("expected {wanted}, got {m:?}"),
    }
}

fn sort_table(mut v: Vec<RemoteRegion>) -> Vec<RemoteRegion> {
    v.sort_by_key(|r| r.addr);
    v
}

/// The initiator's half of the challenge-response of [`hixl_core::auth`]: answers a
/// challenge and checks the target's proof, or refuses a target that does not authenticate
/// when we have a secret. Returns the frame that follows (the `Welcome`, or a refusal).
async fn authenticate(
    shared: &Shared,
    s: &mut TcpStream,
    buf: &mut BytesMut,
    remote: &str,
    first: Message,
) -> Result<Message> {
    use hixl_core::auth::nonce;
    let failed = |reason: String| Error::AuthFailed {
        peer: remote.to_string(),
        reason,
    };
    match (first, &shared.auth) {
        (Message::AuthChallenge { nonce: nt }, Some(secret)) => {
            let ni = nonce().map_err(|e| Error::io("drawing an authentication nonce", e))?;
            let answer = Message::AuthResponse {
                nonce: ni.to_vec(),
                mac: secret.initiator_mac(&nt, &ni).to_vec(),
            };
            write_frame(s, &answer, remote).await?;
            match read_frame(s, buf, remote).await? {
                Message::AuthProof { mac } if secret.verify_target(&nt, &ni, &mac) => {
                    read_frame(s, buf, remote).await
                }
                Message::AuthProof { .. } => Err(failed(
                    "the peer's proof does not match our shared secret: it does not know it".into(),
                )),
                Message::Refuse { reason, .. } => Err(failed(reason)),
                m => Err(unexpected(remote, &m, "authentication proof")),
            }
        }
        (Message::AuthChallenge { .. }, None) => {
            // Tell the target why, so that its log names the problem too.
            let none = Message::AuthResponse {
                nonce: Vec::new(),
                mac: Vec::new(),
            };
            let _ = write_frame(s, &none, remote).await;
            Err(failed(
                "the peer requires a shared secret and this engine has none (set hixl.AuthSecret or HIXL_AUTH_SECRET)".into(),
            ))
        }
        (Message::Welcome { .. }, Some(_)) => Err(failed(
            "the peer did not authenticate itself (it has no shared secret configured); its memory table is not accepted".into(),
        )),
        (m, _) => Ok(m),
    }
}

/// Kills a half-built link's state when dropped (unless disarmed by taking the state).
struct KillOnDrop(Option<Arc<LinkState>>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.kill(Error::InvalidParam {
                what: "connect did not complete".into(),
            });
        }
    }
}

/// Connection parameters of one link.
pub(crate) struct LinkParams<'a> {
    pub(crate) local_name: &'a str,
    pub(crate) instance: u64,
    pub(crate) remote: &'a str,
    pub(crate) addr: SocketAddr,
    pub(crate) streams: usize,
    pub(crate) chunk: u64,
}

impl Link {
    /// Connects the control channel, fetches the memory table and opens the data connections.
    pub(crate) async fn establish(shared: Arc<Shared>, p: LinkParams<'_>) -> Result<Arc<Link>> {
        let remote = p.remote;
        let mut s = TcpStream::connect(p.addr)
            .await
            .map_err(|e| Error::io(format!("connecting to {remote}"), e))?;
        tune(&s);
        let hello = Message::Hello {
            engine: p.local_name.to_string(),
            channel: Channel::Control,
            session: p.instance,
        };
        write_frame(&mut s, &hello, remote).await?;
        let mut buf = BytesMut::with_capacity(4096);
        let first = read_frame(&mut s, &mut buf, remote).await?;
        let first = authenticate(&shared, &mut s, &mut buf, remote, first).await?;
        let session = match first {
            Message::Welcome { session, .. } => session,
            Message::Refuse { status, reason } => return Err(refusal(remote, status, reason)),
            m => return Err(unexpected(remote, &m, "welcome")),
        };
        let mut fabric_info = None;
        let mut verbs_info = None;
        #[allow(unused_mut)]
        let mut table = loop {
            match read_frame(&mut s, &mut buf, remote).await? {
                Message::MemTable(v) => break sort_table(v),
                m @ Message::FabricInfo { .. } => fabric_info = Some(m),
                Message::VerbsInfo { device } => verbs_info = Some(device),
                m => return Err(unexpected(remote, &m, "memory table")),
            }
        };
        let mut data = Vec::with_capacity(p.streams);
        for _ in 0..p.streams.max(1) {
            let mut d = TcpStream::connect(p.addr)
                .await
                .map_err(|e| Error::io(format!("opening data connection to {remote}"), e))?;
            tune(&d);
            let hello = Message::Hello {
                engine: p.local_name.to_string(),
                channel: Channel::Data,
                session,
            };
            write_frame(&mut d, &hello, remote).await?;
            let mut b = BytesMut::new();
            match read_frame(&mut d, &mut b, remote).await? {
                Message::Welcome { .. } if b.is_empty() => {}
                Message::Refuse { status, reason } => return Err(refusal(remote, status, reason)),
                m => return Err(unexpected(remote, &m, "welcome on a data connection")),
            }
            data.push(d);
        }
        let name: Arc<str> = Arc::from(remote);
        let state = Arc::new(LinkState::new());
        // Until the link is built, an error or a dropped connect future must end the data
        // connections' tasks (and close their sockets): nothing else would.
        let mut unbuilt = KillOnDrop(Some(state.clone()));
        let conns = data
            .into_iter()
            .map(|d| DataConn::spawn(d, name.clone(), shared.clone(), state.clone()))
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        #[cfg(feature = "fabric")]
        let (fabric, fstream, transport) =
            Self::choose_fabric(&shared, fabric_info.as_ref(), session, &p, &name).await?;
        #[cfg(not(feature = "fabric"))]
        let (fabric, transport) = {
            let _ = fabric_info;
            (
                None::<()>,
                "tcp (this build has no fabric backend)".to_string(),
            )
        };
        #[cfg(feature = "verbs")]
        let (verbs, transport) = if fabric.is_some() {
            (None, transport)
        } else {
            let v = Self::choose_verbs(
                &shared,
                verbs_info.as_deref(),
                &mut s,
                &mut buf,
                &mut table,
                &state,
                &name,
            )
            .await?;
            match v {
                Ok(v) => {
                    let d = v.describe.clone();
                    (Some(v), d)
                }
                Err(why) => (None, format!("{transport}; not verbs: {why}")),
            }
        };
        #[cfg(not(feature = "verbs"))]
        let _ = (&verbs_info, &fabric);
        tracing::info!(peer = %name, "transport: {transport}");
        let link = Arc::new(Link {
            name,
            state,
            table: RwLock::new(table),
            conns,
            next: AtomicUsize::new(0),
            control: tx,
            notify_seq: AtomicU64::new(1),
            notify_waiters: Mutex::new(HashMap::new()),
            chunk: p.chunk.max(4096),
            #[cfg(feature = "fabric")]
            fabric,
            ops: Mutex::new(TokenLog::default()),
            last_used: AtomicU64::new(now_ms()),
            #[cfg(feature = "verbs")]
            verbs,
            transport,
            last_rx: AtomicU64::new(0),
            born: std::time::Instant::now(),
        });
        unbuilt.0 = None;
        let (r, w) = s.into_split();
        tokio::spawn(write_frames(w, rx, link.state.clone(), link.name.clone()));
        tokio::spawn(control_reader(r, buf, link.clone()));
        tokio::spawn(probe(link.clone(), shared.heartbeat));
        #[cfg(feature = "fabric")]
        if let (Some(f), Some(fs)) = (&link.fabric, fstream) {
            tokio::spawn(crate::fabric::client::writer(
                fs.stream.clone(),
                fs.rx,
                link.name.clone(),
            ));
            // Like HIXL's FabricMem disconnect: copies not yet started are aborted with the
            // link's cause; running ones finish (they only touch mapped or leased memory).
            let (l, sh) = (link.clone(), shared.clone());
            tokio::spawn(async move {
                l.state.dead().await;
                let tokens: std::collections::HashSet<Token> = l
                    .ops
                    .lock()
                    .map(|t| t.tokens.iter().copied().collect())
                    .unwrap_or_default();
                if let (Some(b), Some(e)) = (&sh.fabric, l.state.error()) {
                    b.copy.cancel_queued(|t| tokens.contains(&t), &e);
                }
            });
            let (f, l) = (f.clone(), link.clone());
            tokio::spawn(async move {
                let l2 = l.clone();
                let on_ack = move |seq, status| l2.notify_acked(seq, status);
                let e = tokio::select! {
                    e = crate::fabric::client::reader(fs.stream, fs.buf, f, on_ack) => e,
                    _ = l.state.dead() => return,
                };
                l.state.kill(e);
            });
        }
        Ok(link)
    }

    /// Decides whether the fabric serves this peer and opens its channel if so.
    #[cfg(feature = "fabric")]
    async fn choose_fabric(
        shared: &Arc<Shared>,
        info: Option<&Message>,
        session: u64,
        p: &LinkParams<'_>,
        name: &Arc<str>,
    ) -> Result<(
        Option<Arc<crate::fabric::client::FabricLink>>,
        Option<crate::fabric::client::FabricStream>,
        String,
    )> {
        use crate::fabric::client::{FabricLink, PeerInfo};
        let Some(backend) = &shared.fabric else {
            return Ok((
                None,
                None,
                "tcp (the fabric backend is off: hixl.Transport is tcp or verbs)".into(),
            ));
        };
        let refuse = |why: String| -> Result<_> {
            if backend.forced {
                Err(Error::Unsupported {
                    what: format!("hixl.Transport=fabric, but {name} cannot use it: {why}"),
                })
            } else {
                Ok((None, None, format!("tcp ({why})")))
            }
        };
        let Some(info) = info.and_then(PeerInfo::from_message) else {
            return refuse("the peer offers no fabric channel".into());
        };
        if !backend.identity.same_host(&info.identity) {
            return refuse(if backend.identity.boot_id != info.identity.boot_id {
                "the peer is on another host (its boot id differs)".into()
            } else {
                "the peer is on this host but in another mount namespace (a container), where our memfds and sockets do not reach".into()
            });
        }
        let (fl, fs) = match FabricLink::establish(
            backend,
            &info,
            session,
            p.local_name,
            name.clone(),
        )
        .await
        {
            Ok(x) => x,
            // E.g. a peer that shares our boot id and mounts but not our network
            // namespace, where its abstract fabric socket does not exist.
            Err(e) => return refuse(format!("the fabric channel could not be opened: {e}")),
        };
        let fallback = fl.fallback.lock().ok().and_then(|f| f.clone());
        if let (true, Some(why)) = (backend.forced, &fallback) {
            return refuse(why.clone());
        }
        let (mapped, cma) = fl.counts();
        let translated = fl.translated.lock().map(|t| *t).unwrap_or(0);
        let mut why = format!(
            "fabric (same host: boot id and mount namespace match; {mapped} pool regions mapped{}, {cma} reached by cross-memory attach",
            if backend.unified { format!(", {translated} of them translated") } else { String::new() }
        );
        if let Some(f) = fallback {
            why.push_str(&format!("; host regions over tcp: {f}"));
        }
        why.push(')');
        Ok((Some(Arc::new(fl)), Some(fs), why))
    }

    /// Decides whether verbs serves this peer and, if so, connects a queue pair over the
    /// control connection (before it is split): `VerbsConnect` with our endpoint, the peer's
    /// device keys, then `VerbsAccept` with its endpoint. `Ok(Err(why))` means "not verbs".
    #[cfg(feature = "verbs")]
    #[allow(clippy::too_many_arguments)]
    async fn choose_verbs(
        shared: &Arc<Shared>,
        info: Option<&str>,
        s: &mut TcpStream,
        buf: &mut BytesMut,
        table: &mut Vec<RemoteRegion>,
        state: &Arc<LinkState>,
        name: &Arc<str>,
    ) -> Result<std::result::Result<Arc<crate::verbs::VerbsLink>, String>> {
        let Some(backend) = &shared.verbs else {
            return Ok(Err(format!(
                "this engine has no RDMA device ({})",
                shared.verbs_why
            )));
        };
        let refuse = |why: String| -> Result<std::result::Result<_, String>> {
            if backend.forced {
                Err(Error::Unsupported {
                    what: format!("hixl.Transport=verbs, but {name} cannot use it: {why}"),
                })
            } else {
                Ok(Err(why))
            }
        };
        let Some(peer_device) = info else {
            return refuse("the peer offers no verbs (no usable RDMA device there)".into());
        };
        let mut qp = match backend.initiator_qp(name) {
            Ok(q) => q,
            Err(e) => return refuse(format!("creating a queue pair: {e}")),
        };
        let connect = Message::VerbsConnect {
            endpoint: qp.endpoint().to_bytes().to_vec(),
        };
        write_frame(s, &connect, name).await?;
        let mut keys = HashMap::new();
        let remote = loop {
            match read_frame(s, buf, name).await? {
                Message::VerbsKeys(v) => keys.extend(v),
                Message::MemTable(v) => *table = sort_table(v),
                // The target's liveness probes start with the session; answer them here too.
                Message::Heartbeat { seq } => {
                    if seq & hixl_core::wire::HEARTBEAT_FROM_TARGET != 0 {
                        write_frame(s, &Message::Heartbeat { seq }, name).await?;
                    }
                }
                Message::VerbsAccept {
                    status: 0,
                    endpoint,
                    ..
                } => break hixl_verbs::QpEndpoint::from_bytes(&endpoint)?,
                Message::VerbsAccept { reason, .. } => {
                    return refuse(format!("the peer refused a queue pair: {reason}"))
                }
                m => return Err(unexpected(name, &m, "verbs accept")),
            }
        };
        if let Err(e) = qp.connect(&remote) {
            // The peer's QP is connected to ours; it is dropped with the session.
            return refuse(format!("connecting the queue pair: {e}"));
        }
        let c = crate::verbs::Connected {
            qp,
            remote,
            peer_device: peer_device.to_string(),
            keys,
        };
        Ok(Ok(crate::verbs::VerbsLink::start(
            backend,
            shared,
            state.clone(),
            name.clone(),
            c,
        )))
    }

    /// Marks the link used now.
    fn touch(&self) {
        self.last_used.store(now_ms(), Ordering::Relaxed);
    }

    /// When the link was last used (for least-recently-used eviction).
    pub(crate) fn last_used(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }

    /// Whether an op of this link may still touch memory or wait for an answer (posted,
    /// waited on or abandoned with parts outstanding): such a link is never evicted.
    pub(crate) fn busy(&self, ops: &hixl_core::OpTable<std::task::Waker>) -> bool {
        use hixl_core::Phase;
        if self.notify_waiters.lock().map_or(true, |w| !w.is_empty()) {
            return true;
        }
        let Ok(t) = self.ops.lock() else { return true };
        t.tokens.iter().any(|&t| {
            matches!(
                ops.phase(t),
                Some(Phase::Staged | Phase::Posted | Phase::Waiting | Phase::Abandoned)
            )
        })
    }

    /// Which transport serves this peer, and why.
    pub(crate) fn transport(&self) -> &str {
        &self.transport
    }

    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    fn notify_acked(&self, seq: u64, status: u32) {
        let w = self
            .notify_waiters
            .lock()
            .ok()
            .and_then(|mut w| w.remove(&seq));
        if let Some(w) = w {
            let _ = w.send(status);
        }
    }

    /// The peer's remotely accessible regions, in address order.
    pub(crate) fn regions(&self) -> Vec<RemoteRegion> {
        self.table.read().map(|t| t.clone()).unwrap_or_default()
    }

    fn remote_rkey(
        table: &[RemoteRegion],
        peer: &str,
        index: usize,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<u64> {
        hixl_core::region::check_range(hixl_core::Side::Remote, index, addr, len)?;
        let i = table.partition_point(|r| r.addr <= addr);
        let r = i
            .checked_sub(1)
            .and_then(|i| table.get(i))
            .filter(|r| r.contains(addr, len))
            .ok_or_else(|| Error::RemoteOutOfBounds {
                peer: peer.to_string(),
                addr,
                len,
                index,
            })?;
        if !r.access.contains(need) {
            return Err(Error::AccessDenied {
                addr,
                len,
                need: need.describe(),
            });
        }
        Ok(r.rkey)
    }

    /// Validates every descriptor, splits them into parts and posts them on the data
    /// connections. Nothing is sent unless every descriptor is valid.
    pub(crate) fn submit(
        &self,
        shared: &Arc<Shared>,
        op: TransferOp,
        descs: &[OpDesc],
    ) -> Result<Token> {
        if let Some(e) = self.state.error() {
            return Err(e);
        }
        if descs.is_empty() {
            return Err(Error::InvalidParam {
                what: "a transfer needs at least one descriptor".into(),
            });
        }
        let write = op == TransferOp::Write;
        let need = Access::needed_by(op);
        let n = self.conns.len();
        let mut per: Vec<Vec<Part>> = (0..n).map(|_| Vec::new()).collect();
        let mut k = self.next.fetch_add(1, Ordering::Relaxed);
        let token = shared.ops.lock().map_err(|_| poisoned())?.insert();
        #[cfg(feature = "fabric")]
        let mut copies: Vec<hixl_fabric::CopyOp> = Vec::new();
        #[cfg(feature = "verbs")]
        let (mut wrs, mut wr_leases) = (Vec::new(), Vec::new());
        let built = (|| -> Result<u32> {
            let table = self.table.read().map_err(|_| poisoned())?;
            let regions = shared.regions.lock().map_err(|_| poisoned())?;
            let mut parts = 0u32;
            let mut count = |n: u32| -> Result<()> {
                parts = parts
                    .checked_add(n)
                    .ok_or_else(|| Error::ResourceExhausted {
                        what: "more than 2^32 parts in one transfer".into(),
                    })?;
                Ok(())
            };
            for (i, d) in descs.iter().enumerate() {
                let local = regions.lookup_local(i, d.local_addr, d.len)?;
                let rkey = Self::remote_rkey(&table, &self.name, i, d.remote_addr, d.len, need)?;
                #[cfg(feature = "fabric")]
                if let Some(e) = self.fabric.as_ref().and_then(|f| f.entry(rkey)) {
                    let n = self.fabric_parts(&mut copies, token, write, d, &e, &local.data)?;
                    count(n)?;
                    continue;
                }
                #[cfg(feature = "verbs")]
                if let Some(v) = &self.verbs {
                    if let (Some(lkey), Some(dev)) = (local.data.lkey, v.key(rkey)) {
                        let l = hixl_verbs::LocalRange {
                            addr: d.local_addr,
                            len: d.len,
                            lkey,
                        };
                        let r = hixl_verbs::RemoteRange {
                            addr: d.remote_addr,
                            rkey: dev,
                        };
                        wrs.push(hixl_verbs::WorkRequest {
                            token,
                            op,
                            local: l,
                            remote: r,
                        });
                        wr_leases.push(Lease::new(&local.data));
                        count(1)?;
                        continue;
                    }
                }
                let mut off = 0;
                while off < d.len {
                    let len = self.chunk.min(d.len - off);
                    per[k % n].push(Part {
                        token,
                        write,
                        local: d.local_addr + off,
                        req: DataReq {
                            id: token.0,
                            rkey,
                            addr: d.remote_addr + off,
                            len,
                        },
                        lease: Lease::new(&local.data),
                    });
                    k += 1;
                    off += len;
                    count(1)?;
                }
            }
            Ok(parts)
        })();
        let mut ops = shared.ops.lock().map_err(|_| poisoned())?;
        let parts = match built {
            Ok(p) => p,
            Err(e) => {
                ops.abandon(token);
                return Err(e);
            }
        };
        ops.post(token, parts).map_err(|e| Error::InvalidParam {
            what: e.to_string(),
        })?;
        drop(ops);
        self.touch();
        if let Ok(mut t) = self.ops.lock() {
            t.record(token, &shared.ops);
        }
        #[cfg(feature = "fabric")]
        if !copies.is_empty() {
            match &shared.fabric {
                Some(b) => {
                    let small = copies.len() <= INLINE_OPS
                        && copies.iter().map(|c| c.kind.len()).sum::<u64>() <= INLINE_BYTES;
                    let submitted = if small {
                        // SAFETY: as below; the copies run before this call returns.
                        let done = unsafe { b.copy.run_inline(copies) };
                        shared.complete_all(
                            done.into_iter()
                                .map(|(token, result)| Completion { token, result }),
                        );
                        Ok(())
                    } else {
                        // SAFETY: every copy's local range lies in a registered region and its
                        // remote range in a mapping (or, for CMA, a region the peer exported);
                        // each op's `keep` holds the local region's lease and the peer region's
                        // reach until the copy has run.
                        unsafe { b.copy.submit(copies) }
                    };
                    if let Err((e, failed)) = submitted {
                        shared.complete_all(failed.into_iter().map(|c| Completion {
                            token: c.token,
                            result: Err(e.clone()),
                        }));
                    }
                }
                None => shared.complete_all(copies.into_iter().map(|c| Completion {
                    token: c.token,
                    result: Err(Error::Unsupported {
                        what: "no fabric backend".into(),
                    }),
                })),
            }
        }
        #[cfg(feature = "verbs")]
        if let Some(v) = &self.verbs {
            v.submit(token, wrs, wr_leases);
        }
        for (i, batch) in per.into_iter().enumerate() {
            if batch.is_empty() {
                continue;
            }
            if let Err(batch) = self.conns[i].submit(batch) {
                let e = self.state.error().unwrap_or_else(|| Error::PeerLost {
                    peer: self.name.to_string(),
                    cause: "data connection closed".into(),
                });
                fail_parts(shared, batch, &e);
            }
        }
        Ok(token)
    }

    /// Turns one descriptor to a fabric-reachable region into copy ops; returns how many.
    #[cfg(feature = "fabric")]
    fn fabric_parts(
        &self,
        out: &mut Vec<hixl_fabric::CopyOp>,
        token: Token,
        write: bool,
        d: &OpDesc,
        e: &crate::fabric::client::Entry,
        local: &Arc<crate::memory::RegionInner>,
    ) -> Result<u32> {
        use crate::fabric::client::Reach;
        use hixl_fabric::{CopyKind, CopyOp};
        let pid = self.fabric.as_ref().map(|f| f.pid).unwrap_or(0);
        let mut n = 0;
        let mut off = 0;
        while off < d.len {
            let len = self.chunk.min(d.len - off);
            let (l, r) = (d.local_addr + off, d.remote_addr + off);
            let kind = match &*e.reach {
                Reach::Mapped(m) => {
                    let mapped =
                        m.translate(r, e.base, len)
                            .ok_or_else(|| Error::RemoteOutOfBounds {
                                peer: self.name.to_string(),
                                addr: r,
                                len,
                                index: 0,
                            })?;
                    if write {
                        CopyKind::Memcpy {
                            src: l,
                            dst: mapped,
                            len,
                        }
                    } else {
                        CopyKind::Memcpy {
                            src: mapped,
                            dst: l,
                            len,
                        }
                    }
                }
                Reach::Cma if write => CopyKind::CmaWrite {
                    pid,
                    local: l,
                    remote: r,
                    len,
                },
                Reach::Cma => CopyKind::CmaRead {
                    pid,
                    local: l,
                    remote: r,
                    len,
                },
            };
            out.push(CopyOp {
                token,
                kind,
                keep: Some(Box::new((Lease::new(local), e.reach.clone()))),
            });
            n += 1;
            off += len;
        }
        Ok(n)
    }

    /// Sends a notify and waits for the peer's ack.
    pub(crate) async fn notify(&self, name: &[u8], msg: &[u8], timeout: Duration) -> Result<()> {
        for (field, v) in [("name", name), ("msg", msg)] {
            if v.len() > NOTIFY_MAX_LEN {
                return Err(Error::NotifyTooLong {
                    field,
                    len: v.len(),
                    max: NOTIFY_MAX_LEN,
                });
            }
        }
        if let Some(e) = self.state.error() {
            return Err(e);
        }
        self.touch();
        let seq = self.notify_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.notify_waiters
            .lock()
            .map_err(|_| poisoned())?
            .insert(seq, tx);
        let m = Message::Notify {
            seq,
            name: name.to_vec(),
            msg: msg.to_vec(),
        };
        let forget = || {
            if let Ok(mut w) = self.notify_waiters.lock() {
                w.remove(&seq);
            }
        };
        if !self.send_notify_frame(m) {
            forget();
            return Err(self.lost("control connection closed"));
        }
        let status = tokio::select! {
            r = rx => r.map_err(|_| self.lost("control connection closed"))?,
            _ = tokio::time::sleep(timeout) => {
                forget();
                return Err(Error::Timeout { what: "notify", peer: self.name.to_string(), after: timeout });
            }
            _ = self.state.dead() => {
                forget();
                return Err(self.lost("link closed"));
            }
        };
        match Status::from_code(status) {
            Some(Status::Success) => Ok(()),
            Some(Status::ResourceExhausted) => Err(Error::NotifyQueueFull {
                peer: self.name.to_string(),
                limit: NOTIFY_MAX_PENDING,
            }),
            _ => Err(refusal(&self.name, status, "notify refused".into())),
        }
    }

    /// Notifies take the fabric channel when there is one (the fast path), else the control
    /// connection. Either way they are sent only after the caller saw its transfers complete.
    fn send_notify_frame(&self, m: Message) -> bool {
        #[cfg(feature = "fabric")]
        if let Some(f) = &self.fabric {
            return f.send(m);
        }
        let mut frame = BytesMut::with_capacity(64);
        m.encode(&mut frame);
        self.control.send(frame).is_ok()
    }

    fn lost(&self, cause: &str) -> Error {
        self.state.error().unwrap_or_else(|| Error::PeerLost {
            peer: self.name.to_string(),
            cause: cause.into(),
        })
    }

    /// Orderly close with `cause` as the link's error (what later uses of it report).
    pub(crate) fn close_because(&self, reason: &str, cause: Error) {
        let mut b = BytesMut::new();
        Message::Disconnect {
            reason: reason.into(),
        }
        .encode(&mut b);
        let _ = self.control.send(b);
        self.state.kill(cause);
    }

    /// Orderly close: tells the peer, then ends every task of the link. In-flight ops fail.
    pub(crate) fn close(&self, reason: &str) {
        let mut b = BytesMut::new();
        Message::Disconnect {
            reason: reason.into(),
        }
        .encode(&mut b);
        let _ = self.control.send(b);
        self.state.kill(Error::NotConnected {
            peer: self.name.to_string(),
        });
    }
}

fn poisoned() -> Error {
    Error::InvalidParam {
        what: "engine lock poisoned by an earlier panic".into(),
    }
}

/// Probes the peer every heartbeat interval on the control connection and kills the link when
/// nothing (no answer, nor any other frame) has arrived for `interval × miss_limit`.
async fn probe(link: Arc<Link>, hb: crate::engine::Heartbeat) {
    let mut tick = tokio::time::interval(hb.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = link.state.dead() => return,
        }
        let silent = link.silence();
        if silent > hb.bound() {
            let e = hb.lost(&link.name, silent);
            tracing::warn!(peer = %link.name, "closing link: {e}");
            link.state.kill(e);
            return;
        }
        seq = (seq + 1) & !hixl_core::wire::HEARTBEAT_FROM_TARGET;
        let mut b = BytesMut::with_capacity(24);
        Message::Heartbeat { seq }.encode(&mut b);
        if link.control.send(b).is_err() {
            return;
        }
    }
}

impl Link {
    fn heard(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.last_rx.store(ms, Ordering::Relaxed);
    }

    /// How long the control connection has been silent.
    fn silence(&self) -> Duration {
        let now = self.born.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_rx.load(Ordering::Relaxed)))
    }
}

async fn control_reader(mut r: OwnedReadHalf, mut buf: BytesMut, link: Arc<Link>) {
    let mut dead = link.state.subscribe();
    let err = loop {
        let m = tokio::select! {
            m = read_frame(&mut r, &mut buf, &link.name) => m,
            _ = dead.changed() => break None,
        };
        if m.is_ok() {
            link.heard();
        }
        match m {
            Ok(Message::NotifyAck { seq, status }) => {
                let w = link
                    .notify_waiters
                    .lock()
                    .ok()
                    .and_then(|mut w| w.remove(&seq));
                if let Some(w) = w {
                    let _ = w.send(status);
                }
            }
            Ok(Message::MemTable(v)) => {
                let v = sort_table(v);
                #[cfg(feature = "verbs")]
                if let Some(vl) = &link.verbs {
                    vl.prune_keys(&v);
                }
                if let Ok(mut t) = link.table.write() {
                    *t = v;
                }
            }
            Ok(Message::VerbsKeys(v)) => {
                #[cfg(feature = "verbs")]
                if let Some(vl) = &link.verbs {
                    vl.update_keys(&v);
                }
                let _ = v;
            }
            Ok(Message::Heartbeat { seq }) => {
                // Answer the target's probes; our own answered ones need nothing more.
                if seq & hixl_core::wire::HEARTBEAT_FROM_TARGET != 0 {
                    let mut b = BytesMut::with_capacity(24);
                    Message::Heartbeat { seq }.encode(&mut b);
                    let _ = link.control.send(b);
                }
            }
            Ok(Message::Disconnect { reason }) => {
                break Some(Error::PeerLost {
                    peer: link.name.to_string(),
                    cause: format!("peer disconnected: {reason}"),
                })
            }
            Ok(m) => {
                break Some(Error::Protocol {
                    peer: link.name.to_string(),
                    reason: format!("unexpected {m:?} on the control connection"),
                })
            }
            Err(e) => break Some(e),
        }
    };
    if let Some(e) = err {
        if matches!(e, Error::Protocol { .. }) {
            tracing::warn!(peer = %link.name, "closing link: {e}");
        }
        link.state.kill(e);
    }
    // Pending notifies learn of the death through LinkState::dead().
}

/// A connected peer (the initiator's view): its memory table, transfers and notifies.
#[derive(Debug, Clone)]
pub struct Peer {
    pub(crate) link: Arc<Link>,
    pub(crate) shared: Arc<Shared>,
}

impl Peer {
    /// The peer's engine address.
    pub fn name(&self) -> &str {
        &self.link.name
    }

    /// Which transport serves this peer and why, e.g. `fabric (same host: ...)` or
    /// `tcp (the peer is on another host ...)`.
    pub fn transport(&self) -> &str {
        self.link.transport()
    }

    /// Whether the link is up.
    pub fn is_connected(&self) -> bool {
        !self.link.state.is_dead()
    }

    /// Why the link went down, if it did.
    pub fn error(&self) -> Option<Error> {
        self.link.state.error()
    }

    /// The regions the peer made remotely accessible, in address order. Kept current: the
    /// peer pushes its table again whenever it registers or deregisters memory.
    pub fn regions(&self) -> Vec<RemoteRegion> {
        self.link.regions()
    }

    /// The peer's region registered under `name`.
    pub fn region(&self, name: &str) -> Option<RemoteRegion> {
        self.link
            .regions()
            .into_iter()
            .find(|r| r.name.as_deref() == Some(name))
    }

    /// Posts a transfer. Every descriptor is checked first (local range registered, remote
    /// range inside a region the peer exported with the needed access); if any fails, nothing
    /// moves and the returned future resolves with that error.
    pub fn transfer(&self, op: TransferOp, descs: &[OpDesc]) -> Transfer {
        match self.link.submit(&self.shared, op, descs) {
            Ok(t) => Transfer::posted(self.shared.clone(), t, self.link.name.clone()),
            Err(e) => Transfer::failed(self.shared.clone(), e, self.link.name.clone()),
        }
    }

    /// `transfer(TransferOp::Read, descs)`: remote → local.
    pub fn read(&self, descs: &[OpDesc]) -> Transfer {
        self.transfer(TransferOp::Read, descs)
    }

    /// `transfer(TransferOp::Write, descs)`: local → remote.
    pub fn write(&self, descs: &[OpDesc]) -> Transfer {
        self.transfer(TransferOp::Write, descs)
    }

    /// Sends a notify (name and msg ≤ 1024 bytes each) and waits up to 1 s for the ack.
    ///
    /// A notify sent after a transfer completed is observed by the peer after that transfer's
    /// bytes are in its memory: a transfer completes only once the peer has placed the data.
    ///
    /// # Errors
    /// [`Error::NotifyTooLong`], [`Error::NotifyQueueFull`] when the peer has 4096 of ours
    /// undrained, [`Error::Timeout`], or the link's failure.
    pub async fn notify(&self, name: impl AsRef<[u8]>, msg: impl AsRef<[u8]>) -> Result<()> {
        self.notify_timeout(name, msg, Duration::from_secs(1)).await
    }

    /// [`Peer::notify`] with an explicit timeout.
    ///
    /// # Errors
    /// As [`Peer::notify`].
    pub async fn notify_timeout(
        &self,
        name: impl AsRef<[u8]>,
        msg: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> Result<()> {
        self.link.notify(name.as_ref(), msg.as_ref(), timeout).await
    }
}
