//! The transport interface: what a transport's channel to one peer does for the initiator's
//! side of a link. TCP, the fabric and verbs each implement it in their own module; the link
//! holds its channels in the order the transport policy chose them and routes every
//! descriptor to the first that reaches it, with the link's TCP data connections as the path
//! every peer has.
//!
//! A channel must resolve every part it takes: a part is either completed through the
//! engine's [`Completions`] by the transport (success or failure), withdrawn by
//! [`PeerChannel::close`] or [`PeerChannel::withdraw`] with a failure completion, or flushed
//! by the device. Nothing is ever dropped silently.
//!
//! Which transport serves a peer is one policy over the transports' answers to the peer's
//! offers, in [`select`]: the `auto` order and the forced choice of `hixl.Transport`.

// Part of the transport interface: hooks and kinds that only some transports use (the
// fabric's, verbs'). A build without one of them leaves those unused; the full build
// (`--features verbs`, the fabric being a default) checks every item here for dead code.
#![cfg_attr(not(all(feature = "fabric", feature = "verbs")), allow(dead_code))]

pub(crate) mod kind;
pub(crate) mod registry;
pub(crate) mod select;
pub(crate) mod target;

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hixl_core::wire::Message;
use hixl_core::{
    Access, CompletionSource, Error, MemDesc, OpDesc, RemoteRegion, Result, StridedDesc, Token,
    TransferOp,
};

use crate::keep::Keeps;
use crate::link_state::LinkState;
use crate::memory::{DeviceMr, Owned, RegionInner};
use crate::sink::Completions;
pub(crate) use kind::{Declined, TransportKind};
use target::{Session, TargetCx};

/// The peer's memory table as a link keeps it: sorted by address, so lookups bisect it.
pub(crate) fn sort_table(mut v: Vec<RemoteRegion>) -> Vec<RemoteRegion> {
    v.sort_by_key(|r| r.addr);
    v
}

/// A boxed future, as the transport interface's async methods return.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The engine-wide part of a transport, on the initiator's side of a handshake: whether it
/// can serve a peer (from what the peer offered), and opening its channel to it.
pub(crate) trait Transport: Send + Sync + std::fmt::Debug {
    /// Which transport it is.
    fn kind(&self) -> TransportKind;

    /// Whether `hixl.Transport` forces it: a peer it cannot serve is then an error, never a
    /// silent fallback.
    fn forced(&self) -> bool;

    // The engine's side.

    /// Its completion source, drained by the engine's reactor.
    fn completions(&self) -> Option<Arc<dyn CompletionSource>> {
        None
    }

    /// Its device, or why it has none (for transports with a device: verbs).
    fn device(&self) -> Option<std::result::Result<String, String>> {
        None
    }

    /// Registers memory with the transport's device, when it has one (an RDMA memory region);
    /// `Ok(None)`: nothing to register here.
    ///
    /// # Safety
    /// The memory stays valid until the returned registration has been dropped.
    ///
    /// # Errors
    /// A forced transport whose device refused the memory.
    unsafe fn register(&self, _desc: MemDesc, _access: Access) -> Result<Option<DeviceMr>> {
        Ok(None)
    }

    /// Allocates `len` bytes of memory that this transport's peers reach directly (the fabric
    /// pool), or `None` when it has no such memory.
    fn alloc(&self, _len: u64) -> Option<Result<(MemDesc, Owned)>> {
        None
    }

    /// Opens this transport's channel to the peer of `cx`, from the peer's offers. `Ok(Err)`
    /// says why it cannot serve this peer.
    ///
    /// # Errors
    /// A failure of the control connection (the connect fails).
    fn connect<'a>(
        &'a self,
        cx: &'a mut Negotiation<'_>,
    ) -> BoxFuture<'a, Result<std::result::Result<Opened, Declined>>>;

    // The target's side.

    /// The offer for a new initiator, sent before the memory table, when this engine serves
    /// the transport.
    fn offer(&self) -> Option<Message> {
        None
    }

    /// Starts serving the transport's own channels (the fabric's listener) until shutdown.
    ///
    /// # Errors
    /// Failing to listen.
    fn listen(&self, _cx: &TargetCx, _shutdown: tokio::sync::watch::Receiver<bool>) -> Result<()> {
        Ok(())
    }

    /// A control frame of this transport from `sess`'s initiator (e.g. `VerbsConnect`),
    /// answered on `sess`. Returns whether it was this transport's.
    fn on_control(&self, _cx: &TargetCx, _sess: &Session, _m: &Message) -> bool {
        false
    }

    /// A frame to send `sess` before every later memory table (verbs: the device keys, so
    /// that a region is never in a table without its key).
    fn before_table(
        &self,
        _sess: &Session,
        _regions: &hixl_core::RegionTable<Arc<RegionInner>>,
    ) -> Option<Message> {
        None
    }

    /// Whether this transport serves the connections whose hello names `channel` (TCP: the
    /// data connections); the control connection is the server's own.
    fn takes(&self, _channel: hixl_core::wire::Channel) -> bool {
        false
    }

    /// Serves such a connection (after its hello), until it ends.
    fn serve<'a>(&'a self, _cx: &'a TargetCx, _c: Accepted<'a>) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Whether this transport serves session `id` (it keeps a channel for it): for the
    /// target's telemetry.
    fn serves(&self, _id: u64) -> bool {
        false
    }

    /// The exported regions changed (the new memory table is out).
    fn table_changed(&self, _cx: &TargetCx) {}

    /// A region is being deregistered: resolves once no peer of this transport touches it.
    fn revoke<'a>(&'a self, _cx: &'a TargetCx, _rkey: u64) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// The engine is closing `sess`: resolves once what this transport's channel of it has
    /// queued (notify acks) is sent, so that it goes out before the control connection's
    /// goodbye (bounded).
    fn farewell<'a>(&'a self, _sess: &'a Session) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// A channel a transport opened, and what `Peer::transport` says of it.
pub(crate) struct Opened {
    pub(crate) channel: Arc<dyn PeerChannel>,
    pub(crate) describe: String,
}

/// The control connection during a transport's negotiation, as its session sees it: a
/// transport sends its own messages (`VerbsConnect`) and receives the peer's (`VerbsKeys`,
/// `VerbsAccept`); heartbeats, table updates and everything else the session handles itself.
pub(crate) trait ControlExchange: Send {
    /// Sends a transport message through the session.
    ///
    /// # Errors
    /// A message the session does not let an initiator send, or the connection's death.
    fn send(&mut self, m: Message) -> BoxFuture<'_, Result<()>>;

    /// The next transport message from the peer.
    ///
    /// # Errors
    /// The session's cause when it ends first (a lost connection, a protocol violation).
    fn recv(&mut self) -> BoxFuture<'_, Result<Message>>;
}

/// What a transport may use while it negotiates its channel during the handshake: the
/// peer's offers, the control connection (through its session: a transport may exchange
/// frames on it), and the link's handles. (A build without a transport that negotiates over
/// the control connection, such as verbs, reads only some of it.)
pub(crate) struct Negotiation<'a> {
    /// The transport offers the peer sent before its memory table (`FabricInfo`, `VerbsInfo`).
    pub(crate) offers: &'a [Message],
    pub(crate) control: &'a mut dyn ControlExchange,
    /// The peer's name and the session it handed out.
    pub(crate) peer: &'a Arc<str>,
    pub(crate) session: u64,
    /// This engine's name.
    pub(crate) local_name: &'a str,
    /// The peer's address, its data connections per link (`hixl.TcpStreams`) and the
    /// optional parts of the protocol both ends speak.
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) streams: usize,
    pub(crate) features: u64,
    /// Largest single part (`hixl.TcpChunkBytes`).
    pub(crate) chunk: u64,
    pub(crate) state: &'a Arc<LinkState>,
    pub(crate) ops: &'a crate::context::OpsHandle,
    pub(crate) sink: &'a Completions,
    pub(crate) config: &'a Arc<crate::context::EngineConfig>,
}

/// A connection a transport serves on the target (see [`Transport::takes`]): the stream after
/// its hello, what came with the hello, and the engine's settings.
pub(crate) struct Accepted<'a> {
    pub(crate) stream: tokio::net::TcpStream,
    /// Bytes received after the hello.
    pub(crate) buf: bytes::BytesMut,
    /// The peer's socket address, for logs.
    pub(crate) from: String,
    /// The hello's engine name and session.
    pub(crate) engine: String,
    pub(crate) session: u64,
    pub(crate) config: &'a Arc<crate::context::EngineConfig>,
    /// This engine's incarnation.
    pub(crate) instance: u64,
}

/// What a channel may call back into its link once the link is built (read by channels with
/// tasks of their own, such as the fabric's).
pub(crate) struct LinkHooks {
    pub(crate) state: Arc<LinkState>,
    /// A notify sent on the channel was acked: `(seq, status)`.
    pub(crate) on_ack: Box<dyn Fn(u64, u32) + Send + Sync>,
    /// Sends a transport message on the control connection (verbs: a rail's `VerbsConnect`
    /// when it is probed back); false once the link's driver has ended.
    pub(crate) control: Box<dyn Fn(Message) -> bool + Send + Sync>,
}

/// One transport's channel to one connected peer.
pub(crate) trait PeerChannel: Send + Sync + std::fmt::Debug {
    /// Starts the channel's own tasks, if it has any, once its link is built.
    fn start(&self, _hooks: LinkHooks) {}

    /// Starts collecting the work of one call (op `token`).
    fn batch(&self, token: Token, op: TransferOp) -> Box<dyn Batch + '_>;

    /// Runs `build` with a batch of this channel for op `token`, then posts the batch if
    /// `build` succeeded. The default boxes [`PeerChannel::batch`]; a channel may keep its batch
    /// on the stack instead (the path of a link's only channel: no allocation per call).
    ///
    /// # Errors
    /// `build`'s.
    fn with_batch(
        &self,
        token: Token,
        op: TransferOp,
        sink: &Completions,
        build: &mut dyn FnMut(&mut dyn Batch) -> Result<()>,
    ) -> Result<()> {
        let mut b = self.batch(token, op);
        build(&mut *b)?;
        b.post(sink);
        Ok(())
    }

    /// Sends a notify over the transport's own channel, when it has one that orders notifies
    /// after its data (the fabric channel does). `None`: it has none, the control connection
    /// carries it. `Some(false)`: the channel is closed.
    fn send_notify(&self, _m: Message) -> Option<bool> {
        None
    }

    /// Whether [`PeerChannel::send_notify`] carries notifies (their acks then come back on
    /// this channel, not on the control connection).
    fn carries_notifies(&self) -> bool {
        false
    }

    /// A frame of the control connection that belongs to this transport (e.g. the peer's
    /// device keys). Returns whether it was taken.
    fn on_control(&self, _m: &Message) -> bool {
        false
    }

    /// The peer's memory table changed.
    fn on_table(&self, _table: &[RemoteRegion]) {}

    /// The owner of `token` went away: work of it not yet started is withdrawn (failed with
    /// `cause`); what the device runs already finishes.
    fn withdraw(&self, _token: Token, _cause: &Error) {}

    /// The link died with `cause`: work of `tokens` not yet started is failed with it, and
    /// what the device still holds is flushed (and so completed).
    fn close(&self, cause: &Error, tokens: &HashSet<Token>);

    /// Drives the channel's device once without waiting, for a task that spins while it
    /// awaits a transfer: sends what can be sent, completes what has finished. Returns
    /// whether anything moved. The default: nothing to drive (the device completes on its own).
    fn progress(&self) -> bool {
        false
    }

    /// A waiter starts (`true`) or stops (`false`) spinning on the channel: a channel whose
    /// own tasks would otherwise watch the device may leave it to the spinner meanwhile.
    fn spinning(&self, _on: bool) {}

    /// The channel's RDMA rails (verbs), for [`crate::Peer::rails`] and the metrics.
    fn rails(&self) -> Vec<crate::RailInfo> {
        Vec::new()
    }

    /// An owner asks about a transfer without driving it (its status): a channel that left
    /// its device to spinning owners makes sure its own tasks watch it now.
    fn nudge(&self) {}
}

/// The part of one call that one channel takes, built descriptor by descriptor and posted
/// once the op is in the op table.
pub(crate) trait Batch {
    /// Takes descriptor `index` (`d`, whose local range lies in `local` and whose remote range
    /// lies in the peer's region with memory-table key `rkey`) when this channel reaches both;
    /// returns how many parts it will complete, or `None` when it does not reach them.
    ///
    /// The op's keep-alive already leases `local`; what else the channel's parts need kept
    /// until they are done (a peer mapping) goes into `keep`. The op table holds it all until
    /// the op's last part is done, so the batch keeps only raw ranges
    /// ([`crate::rawio::PartRange`]).
    ///
    /// # Errors
    /// A descriptor this channel reaches but cannot serve (e.g. outside its mapping).
    fn add(
        &mut self,
        index: usize,
        d: &OpDesc,
        local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>>;

    /// Takes strided descriptor `index` (its whole local span lies in `local`, its remote span
    /// in the region with key `rkey`: checked once by the caller), as [`Batch::add`] takes a
    /// plain one. The default adds each piece as a plain descriptor; a transport with a
    /// strided operation of its own (the fabric's strided copy) takes it as one.
    ///
    /// # Errors
    /// As [`Batch::add`].
    fn add_strided(
        &mut self,
        index: usize,
        d: &StridedDesc,
        local: &Arc<RegionInner>,
        rkey: u64,
        keep: &mut Keeps,
    ) -> Result<Option<u32>> {
        add_pieces(self, index, d, local, rkey, keep)
    }

    /// A hint before the first `add`: the call has `descs` descriptors (a batch may size its
    /// lists once instead of growing them).
    fn expect(&mut self, _descs: usize) {}

    /// Posts what was added. Every part resolves through `sink`.
    fn post(self: Box<Self>, sink: &Completions);
}

/// The error of a call that would make more parts than an op counts (2^32).
pub(crate) fn too_many_parts() -> Error {
    Error::ResourceExhausted {
        what: "more than 2^32 parts in one transfer".into(),
    }
}

/// Adds each piece of a strided descriptor to `b` as a plain descriptor (the default of
/// [`Batch::add_strided`], and what a transport does with pieces too large to gain from its
/// own strided operation).
///
/// # Errors
/// As [`Batch::add`].
pub(crate) fn add_pieces<B: Batch + ?Sized>(
    b: &mut B,
    index: usize,
    d: &StridedDesc,
    local: &Arc<RegionInner>,
    rkey: u64,
    keep: &mut Keeps,
) -> Result<Option<u32>> {
    let mut parts = 0u32;
    for i in 0..d.count {
        match b.add(index, &d.piece(i), local, rkey, keep)? {
            Some(n) => {
                parts = parts
                    .checked_add(n)
                    .ok_or_else(crate::transport::too_many_parts)?
            }
            // Every piece lies in the same two regions: a channel reaches all or none.
            None if i == 0 => return Ok(None),
            None => {
                return Err(Error::Internal {
                    what: "a channel reached only some pieces of a strided descriptor",
                })
            }
        }
    }
    Ok(Some(parts))
}

/// What a transfer asks of the link that posted it: progress while it spins, and, when it is
/// dropped or times out, the withdrawal of the op's work that no transport has started yet.
pub(crate) trait Withdraw: Send + Sync {
    /// The peer's name.
    fn peer(&self) -> &str;

    /// Withdraws the unstarted work of `token` (failing it), on every channel of the link.
    fn withdraw(&self, token: Token);

    /// Drives the link's channels and the engine's completion queue once without waiting;
    /// whether anything moved ([`PeerChannel::progress`]).
    fn progress(&self) -> bool;

    /// A transfer starts or stops spinning on the link ([`PeerChannel::spinning`]).
    fn spinning(&self, on: bool);

    /// An owner asks about a transfer without driving it ([`PeerChannel::nudge`]).
    fn nudge(&self);

    /// How long an awaiting transfer keeps spinning after the last progress before it parks
    /// (`hixl.SpinUs`; zero: it parks at once).
    fn spin(&self) -> std::time::Duration;
}
