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

use crate::context::Shared;
use crate::frame_io::{read_frame, tune, write_frame, write_frames};
use crate::link_state::LinkState;
use crate::memory::Lease;
use crate::tcp::initiator::{fail_parts, DataConn, Part};
use crate::transfer::Transfer;
use crate::transport::{select, LinkHooks, Negotiation, PeerChannel, Withdraw};

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
    /// The transports' channels to the peer (fabric, verbs), in the order the transport
    /// policy chose; a descriptor goes to the first that reaches it, else over the data
    /// connections.
    channels: Vec<Arc<dyn PeerChannel>>,
    /// Every op of the link: for [`Link::busy`], and so that the link's death can cancel its
    /// copies still queued on the copy engine.
    ops: Mutex<TokenLog>,
    /// When the link was last used for a transfer or notify (`now_ms`).
    last_used: AtomicU64,
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
            s.kill(Error::Cancelled { what: "a connect" });
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
        // The transports the peer offers come before its memory table.
        let mut offers = Vec::new();
        let mut table = loop {
            match read_frame(&mut s, &mut buf, remote).await? {
                Message::MemTable(v) => break sort_table(v),
                m @ (Message::FabricInfo { .. } | Message::VerbsInfo { .. }) => offers.push(m),
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
        let mut cx = Negotiation {
            offers: &offers,
            control: &mut s,
            buf: &mut buf,
            table: &mut table,
            peer: &name,
            session,
            local_name: p.local_name,
            chunk: p.chunk.max(4096),
            state: &state,
            ops: &shared.ops,
            sink: &shared.sink,
        };
        let (channel, transport) = select::choose(&shared.transports, &mut cx).await?;
        let channels: Vec<Arc<dyn PeerChannel>> = channel.into_iter().collect();
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
            channels,
            ops: Mutex::new(TokenLog::default()),
            last_used: AtomicU64::new(now_ms()),
            transport,
            last_rx: AtomicU64::new(0),
            born: std::time::Instant::now(),
        });
        unbuilt.0 = None;
        let (r, w) = s.into_split();
        tokio::spawn(write_frames(w, rx, link.state.clone(), link.name.clone()));
        tokio::spawn(control_reader(r, buf, link.clone()));
        tokio::spawn(probe(link.clone(), shared.heartbeat));
        if !link.channels.is_empty() {
            // The link's death reaches every channel: work not yet started fails with the
            // link's cause, the devices flush the rest.
            let l = link.clone();
            tokio::spawn(async move {
                l.state.dead().await;
                let tokens: std::collections::HashSet<Token> = l
                    .ops
                    .lock()
                    .map(|t| t.tokens.iter().copied().collect())
                    .unwrap_or_default();
                let e = l.lost("link closed");
                for ch in &l.channels {
                    ch.close(&e, &tokens);
                }
            });
        }
        for ch in &link.channels {
            let l = link.clone();
            ch.start(LinkHooks {
                state: link.state.clone(),
                on_ack: Box::new(move |seq, status| l.notify_acked(seq, status)),
            });
        }
        Ok(link)
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
        let mut batches: Vec<_> = self.channels.iter().map(|c| c.batch(token, op)).collect();
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
            'descs: for (i, d) in descs.iter().enumerate() {
                let local = regions.lookup_local(i, d.local_addr, d.len)?;
                let rkey = Self::remote_rkey(&table, &self.name, i, d.remote_addr, d.len, need)?;
                for b in batches.iter_mut() {
                    if let Some(n) = b.add(i, d, &local.data, rkey)? {
                        count(n)?;
                        continue 'descs;
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
        for b in batches {
            b.post(&shared.sink);
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
        if let Some(ch) = self.channels.first() {
            // Only the first channel can carry notifies (the fabric's, which follows its
            // copies); with another, the control connection carries them.
            if let Some(sent) = ch.send_notify(m.clone()) {
                return sent;
            }
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
        self.state.doom(cause.clone());
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
        self.close_because(
            reason,
            Error::NotConnected {
                peer: self.name.to_string(),
            },
        );
    }
}

fn poisoned() -> Error {
    Error::Internal {
        what: "engine lock poisoned by an earlier panic",
    }
}

/// Probes the peer every heartbeat interval on the control connection and kills the link when
/// nothing (no answer, nor any other frame) has arrived for `interval × miss_limit`.
async fn probe(link: Arc<Link>, hb: crate::context::Heartbeat) {
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
                for ch in &link.channels {
                    ch.on_table(&v);
                }
                if let Ok(mut t) = link.table.write() {
                    *t = v;
                }
            }
            // The peer's device keys: for the verbs channel, if this link has one.
            Ok(m @ Message::VerbsKeys(_)) => {
                let _ = link.channels.iter().any(|c| c.on_control(&m));
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

impl Withdraw for Link {
    fn withdraw(&self, token: Token) {
        if self.channels.is_empty() {
            return; // TCP writers skip parts of unwanted ops themselves.
        }
        let e = Error::Cancelled {
            what: "a transport part",
        };
        for ch in &self.channels {
            ch.withdraw(token, &e);
        }
    }
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
            Ok(t) => Transfer::posted(
                self.shared.clone(),
                t,
                self.link.name.clone(),
                self.link.clone(),
            ),
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
