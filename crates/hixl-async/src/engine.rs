//! The `Engine`: registered memory, links to peers, the listener, the reactor, notifies.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use hixl_core::region::OsRkeys;
use hixl_core::{
    Access, AsyncConnectStatus, Error, MemDesc, MemKind, Notify, OpDesc, OpTable, Options,
    RegionId, RegionTable, Result, TransferOp,
};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::addr::{engine_name, EngineAddr};
use crate::completion::{Completion, CompletionQueue, Completions};
use crate::link::{Link, LinkParams, Peer};
use crate::memory::{Backing, HostBuffer, Owned, Region, RegionInner};
use crate::notify::{NotifyQueue, NotifyStream};
use crate::reactor::Reactor;
use crate::server::Server;
use crate::transfer::Transfer;

/// State shared by the engine's tasks and handles.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) regions: Arc<Mutex<RegionTable<Arc<RegionInner>>>>,
    pub(crate) ops: Arc<Mutex<OpTable<Waker>>>,
    /// Where transports hand in finished parts.
    pub(crate) sink: Completions,
    pub(crate) notifies: Arc<NotifyQueue>,
    /// The transports besides TCP, in the order the transport policy tries them.
    pub(crate) transports: Vec<Arc<dyn crate::transport::Transport>>,
    /// Liveness of control connections (`hixl.HeartbeatIntervalMs`, `hixl.HeartbeatMissLimit`).
    pub(crate) heartbeat: Heartbeat,
    /// The shared secret connects are authenticated with (`hixl.AuthSecret` or
    /// `HIXL_AUTH_SECRET`), if any.
    pub(crate) auth: Option<hixl_core::auth::Secret>,
}

/// The secret of `hixl.AuthSecret`, else of the `HIXL_AUTH_SECRET` environment variable.
fn auth_secret(options: &Options) -> Result<Option<hixl_core::auth::Secret>> {
    use hixl_core::auth::SECRET_ENV;
    if let Some(s) = &options.auth_secret {
        return Ok(Some(s.clone()));
    }
    match std::env::var(SECRET_ENV) {
        Ok(v) if !v.trim().is_empty() => {
            let mut o = Options::default();
            o.set("hixl.AuthSecret", &v)
                .map_err(|e| Error::InvalidOption {
                    key: SECRET_ENV.into(),
                    value: "<redacted>".into(),
                    reason: match e {
                        Error::InvalidOption { reason, .. } => reason,
                        e => e.to_string(),
                    },
                })?;
            Ok(o.auth_secret)
        }
        Ok(_) => Ok(None),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::InvalidOption {
            key: SECRET_ENV.into(),
            value: "<redacted>".into(),
            reason: "not valid UTF-8".into(),
        }),
    }
}

/// How often each end of a control connection probes the other, and how many probes may go
/// unanswered before the link is declared dead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heartbeat {
    pub(crate) interval: Duration,
    pub(crate) miss_limit: u32,
}

impl Heartbeat {
    /// Silence longer than this kills a link.
    pub(crate) fn bound(&self) -> Duration {
        self.interval * self.miss_limit
    }

    /// The error of a link that went silent.
    pub(crate) fn lost(&self, peer: &str, silent: Duration) -> Error {
        Error::PeerLost {
            peer: peer.to_string(),
            cause: format!(
                "no heartbeat answer for {} ms ({} probes at {} ms intervals missed; the peer is dead or the network is cut)",
                silent.as_millis(),
                self.miss_limit,
                self.interval.as_millis()
            ),
        }
    }
}

impl Shared {
    /// See [`Completions::complete_all`].
    pub(crate) fn complete_all(&self, cs: impl IntoIterator<Item = Completion>) {
        self.sink.complete_all(cs);
    }

    /// See [`Completions::complete`].
    pub(crate) fn complete(&self, c: Completion) {
        self.sink.complete(c);
    }
}

/// A random u64 from the OS CSPRNG.
pub(crate) fn random_u64() -> u64 {
    use hixl_core::region::RkeySource;
    OsRkeys.next_rkey()
}

#[derive(Debug)]
enum LinkSlot {
    Connecting,
    Up(Arc<Link>),
}

#[derive(Debug)]
struct EngineInner {
    shared: Arc<Shared>,
    addr: EngineAddr,
    listen: Option<SocketAddr>,
    instance: u64,
    options: Options,
    server: Option<Arc<Server>>,
    links: Mutex<HashMap<String, LinkSlot>>,
    shutdown: watch::Sender<bool>,
    /// `AutoConnect=1`, or `channel_pool.*` configured: transfers connect lazily and dead
    /// links are dropped from the table.
    auto_connect: bool,
    /// `ConnectAsync`/`DisconnectAsync` queues, one per peer.
    async_conn: Mutex<HashMap<String, AsyncQueue>>,
    /// Tasks queued on all of them (bounded by `connect_pool.task_queue_capacity`).
    async_pending: Arc<std::sync::atomic::AtomicUsize>,
}

/// AutoConnect and the channel pool connect with HIXL's fixed timeout (`kAutoConnectTimeout`).
const AUTO_CONNECT_TIMEOUT: Duration = Duration::from_millis(3000);

/// One peer's `ConnectAsync`/`DisconnectAsync` queue: tasks run in FIFO order on one worker;
/// the reported status is that of the latest task.
#[derive(Debug)]
struct AsyncQueue {
    tx: tokio::sync::mpsc::UnboundedSender<AsyncTask>,
    status: Arc<Mutex<(u64, AsyncConnectStatus)>>,
    next: u64,
}

#[derive(Debug)]
enum AsyncTask {
    Connect(u64, Duration),
    Disconnect(u64, Duration),
}

/// Removes a `Connecting` placeholder when a connect is abandoned (its future dropped, e.g.
/// by a caller's own timeout), so the peer can be connected again.
struct ConnectingSlot<'a> {
    links: &'a Mutex<HashMap<String, LinkSlot>>,
    key: &'a str,
    armed: bool,
}

impl Drop for ConnectingSlot<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Ok(mut l) = self.links.lock() {
                if matches!(l.get(self.key), Some(LinkSlot::Connecting)) {
                    l.remove(self.key);
                }
            }
        }
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        // The reactor runs on until the ops of the closed links have resolved.
        self.shutdown.send_replace(true);
        if let Ok(mut l) = self.links.lock() {
            for (_, s) in l.drain() {
                if let LinkSlot::Up(link) = s {
                    link.close_because(
                        "engine dropped",
                        Error::ShutDown {
                            engine: self.shared.name.clone(),
                            what: "the engine was dropped",
                        },
                    );
                }
            }
        }
        if let Some(s) = &self.server {
            s.close_all("engine dropped");
        }
        self.shared.notifies.close();
    }
}

/// Builds an [`Engine`] from HIXL's `local_engine` string and option keys.
#[derive(Debug)]
pub struct EngineBuilder {
    local: String,
    pairs: Vec<(String, String)>,
    options: Option<Options>,
    ephemeral: bool,
}

impl EngineBuilder {
    /// Adds one HIXL option (`"BufferPool"`, `"GlobalResourceConfig"`, `"hixl.TcpStreams"`...).
    /// Keys and values are validated by [`EngineBuilder::build`].
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.pairs.push((key.into(), value.into()));
        self
    }

    /// Uses already-parsed options (pairs given with [`EngineBuilder::option`] apply on top).
    pub fn options(mut self, options: Options) -> Self {
        self.options = Some(options);
        self
    }

    /// Listens on a free port chosen by the OS (hixl extension; HIXL needs a fixed port).
    /// [`Engine::local_engine`] then reports the real `ip:port`.
    pub fn ephemeral_port(mut self) -> Self {
        self.ephemeral = true;
        self
    }

    /// Starts the engine: listener (for `ip:port`), reactor. Must run inside a tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`], option errors naming the key, or the OS error of `bind`.
    pub async fn build(self) -> Result<Engine> {
        let addr = EngineAddr::parse(&self.local)?;
        let options = match self.options {
            None => Options::from_pairs(self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?,
            Some(mut o) => {
                for (k, v) in &self.pairs {
                    o.set(k, v)?;
                }
                o
            }
        };
        let listener = match (addr.socket_addr(), self.ephemeral) {
            (Some(sa), _) => Some(sa),
            (None, true) => Some(SocketAddr::new(addr.ip, 0)),
            (None, false) => None,
        };
        let listener = match listener {
            Some(sa) => Some(
                TcpListener::bind(sa)
                    .await
                    .map_err(|e| Error::io(format!("listening on {sa}"), e))?,
            ),
            None => None,
        };
        let listen = match &listener {
            Some(l) => Some(
                l.local_addr()
                    .map_err(|e| Error::io("reading listen address", e))?,
            ),
            None => None,
        };
        let name = match listen {
            Some(sa) => engine_name(sa),
            None => addr.ip.to_string(),
        };
        let auth = auth_secret(&options)?;
        let cq = Arc::new(CompletionQueue::new().map_err(|e| Error::io("creating eventfd", e))?);
        let ops = Arc::new(Mutex::new(OpTable::new()));
        let instance = random_u64();
        let transports = crate::transport::registry::start(&options, instance)?;
        let mut sources: Vec<Arc<dyn hixl_core::CompletionSource>> = vec![cq.clone()];
        sources.extend(transports.iter().filter_map(|t| t.completions()));
        let reactor = Arc::new(
            Reactor::new(sources, ops.clone())
                .with_busy_poll(Duration::from_micros(options.fabric_busy_poll_us)),
        );
        let shared = Arc::new(Shared {
            transports,
            name,
            regions: Arc::new(Mutex::new(RegionTable::new())),
            ops,
            sink: Completions::new(cq, reactor.clone()),
            notifies: Arc::new(NotifyQueue::default()),
            heartbeat: Heartbeat {
                interval: Duration::from_millis(options.heartbeat_interval_ms),
                miss_limit: options.heartbeat_miss_limit,
            },
            auth,
        });
        let (shutdown, rx) = watch::channel(false);
        tokio::spawn(reactor.run(rx.clone()));
        let server = match listener {
            Some(l) => {
                let srv = Server::new(shared.clone(), instance);
                tokio::spawn(srv.clone().accept_loop(l, rx.clone()));
                srv.listen_transports(&rx)?;
                Some(srv)
            }
            None => None,
        };
        tracing::debug!(engine = %shared.name, "engine started");
        Ok(Engine {
            inner: Arc::new(EngineInner {
                shared,
                addr,
                listen,
                instance,
                server,
                links: Mutex::new(HashMap::new()),
                shutdown,
                auto_connect: options.auto_connect || options.global.channel_pool.configured,
                async_conn: Mutex::new(HashMap::new()),
                async_pending: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
                options,
            }),
        })
    }
}

/// A hixl engine: one per process and device, like HIXL's `Hixl` object.
///
/// ```no_run
/// # async fn demo() -> hixl_core::Result<()> {
/// use std::time::Duration;
/// use hixl_async::{Engine, HostBuffer};
/// use hixl_core::OpDesc;
///
/// let engine = Engine::builder("127.0.0.1").build().await?;
/// let local = engine.register(HostBuffer::zeroed(1 << 20)?)?;
/// let peer = engine.connect("127.0.0.1:26000", Duration::from_secs(1)).await?;
/// let remote = peer.region("kv").expect("peer exported a region named kv");
/// peer.write(&[OpDesc::new(local.addr(), remote.addr, 4096)]).await?;
/// peer.notify("cache_ready", "block_0").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

fn poisoned() -> Error {
    Error::Internal {
        what: "engine lock poisoned by an earlier panic",
    }
}

impl Engine {
    /// Starts building an engine for `local_engine`: `"ip:port"` listens (a server, which
    /// peers can connect to), `"ip"` is client-only, as in HIXL.
    pub fn builder(local_engine: impl Into<String>) -> EngineBuilder {
        EngineBuilder {
            local: local_engine.into(),
            pairs: Vec::new(),
            options: None,
            ephemeral: false,
        }
    }

    /// `Err(ShutDown)` once [`Engine::shutdown`] has begun.
    fn check_open(&self, what: &'static str) -> Result<()> {
        if *self.inner.shutdown.borrow() {
            return Err(Error::ShutDown {
                engine: self.inner.shared.name.clone(),
                what,
            });
        }
        Ok(())
    }

    /// Whether [`Engine::shutdown`] has begun (every later call fails with
    /// [`Error::ShutDown`]).
    pub fn is_shut_down(&self) -> bool {
        *self.inner.shutdown.borrow()
    }

    /// This engine's name: `ip:port` for a server (the real port), `ip` for a client.
    pub fn local_engine(&self) -> &str {
        &self.inner.shared.name
    }

    /// The listening address, if this engine is a server.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner.listen
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// Registers an owned host buffer, readable and writable by peers.
    ///
    /// # Errors
    /// As [`Engine::register_with`].
    pub fn register(&self, buf: HostBuffer) -> Result<Region> {
        self.register_with(buf, Access::REMOTE_RW, None)
    }

    /// Registers an owned host buffer with the given peer access and an optional name that
    /// peers see in their memory table. The engine keeps the buffer until
    /// [`Engine::deregister`] hands it back.
    ///
    /// # Errors
    /// [`Error::Overlap`] (cannot happen for a fresh buffer, but kept for symmetry).
    pub fn register_with(
        &self,
        buf: HostBuffer,
        access: Access,
        name: Option<&str>,
    ) -> Result<Region> {
        let mut buf = buf;
        let desc = MemDesc::new(buf.as_mut_ptr() as u64, buf.len() as u64);
        self.register_inner(desc, MemKind::Host, access, name, Some(Owned::Host(buf)))
    }

    /// Registers memory the caller owns, as HIXL's `RegisterMem` does. Registering the identical
    /// range again returns the same region.
    ///
    /// # Safety
    /// `desc` must describe memory that is valid for reads and writes for its whole length
    /// until [`Engine::deregister`] (or [`Engine::deregister_id`]) has returned for it, or the
    /// engine has been shut down and dropped: peers may read and write it at any time until
    /// then, concurrently with this process. Meanwhile the caller must not hold a Rust reference
    /// (`&[u8]`, `&mut [u8]`) to it: reach it through raw pointers or [`Region::read_at`] and
    /// [`Region::write_at`].
    ///
    /// # Errors
    /// [`Error::NullAddress`], [`Error::ZeroLength`], [`Error::Overlap`] for a partial overlap
    /// with a region of the same kind, [`Error::Unsupported`] for device memory (no device
    /// runtime in this build).
    pub unsafe fn register_raw(
        &self,
        desc: MemDesc,
        kind: MemKind,
        access: Access,
        name: Option<&str>,
    ) -> Result<Region> {
        self.register_inner(desc, kind, access, name, None)
    }

    fn register_inner(
        &self,
        desc: MemDesc,
        kind: MemKind,
        access: Access,
        name: Option<&str>,
        owned: Option<Owned>,
    ) -> Result<Region> {
        self.check_open("register refused")?;
        if kind == MemKind::Device {
            return Err(Error::Unsupported {
                what: "device memory needs a device runtime (CUDA or Ascend ACL); this build has none, and hixl never falls back to host memory silently".into(),
            });
        }
        if let Some(n) = name {
            if n.len() > hixl_core::wire::MAX_NAME {
                return Err(Error::InvalidParam {
                    what: format!(
                        "region name of {} bytes exceeds {}",
                        n.len(),
                        hixl_core::wire::MAX_NAME
                    ),
                });
            }
        }
        let mr = self.device_register(desc, access)?;
        let mut owned = owned;
        let mut mr = mr;
        let region = {
            let mut t = self.inner.shared.regions.lock().map_err(|_| poisoned())?;
            let r = t.register(
                desc,
                kind,
                access,
                name.map(str::to_string),
                &mut OsRkeys,
                |id, rkey| {
                    Arc::new(RegionInner::new(
                        id,
                        desc.addr,
                        desc.len,
                        kind,
                        access,
                        rkey,
                        Backing {
                            owned: owned.take(),
                            mr: mr.take(),
                        },
                    ))
                },
            )?;
            let e = t.get(r.id()).ok_or_else(poisoned)?;
            e.data.clone()
        };
        if access.is_remote() {
            if let Some(s) = &self.inner.server {
                s.broadcast_table(true);
            }
        }
        Ok(Region { inner: region })
    }

    /// Registers the memory with each transport's device (an RDMA memory region), when the
    /// engine has one; see [`crate::transport::Transport::register`].
    fn device_register(
        &self,
        desc: MemDesc,
        access: Access,
    ) -> Result<Option<crate::memory::DeviceMr>> {
        for t in &self.inner.shared.transports {
            // SAFETY: the memory stays valid until deregistration has returned (register_raw's
            // contract; owned buffers are kept by the region). The registration is dropped by
            // deregistration after the region's leases are gone and before the memory is
            // handed back, or when the region itself is dropped (it is declared before the
            // owned memory).
            if let Some(mr) = unsafe { t.register(desc, access) }? {
                return Ok(Some(mr));
            }
        }
        Ok(None)
    }

    /// Which RDMA device this engine uses, or why it uses none.
    pub fn verbs_status(&self) -> std::result::Result<String, String> {
        self.inner
            .shared
            .transports
            .iter()
            .find_map(|t| t.device())
            .unwrap_or_else(|| {
                Err("this build has no verbs backend (feature `verbs` is off)".to_string())
            })
    }

    /// Allocates `len` bytes from the engine's fabric pool (sealed, memfd-backed shared memory)
    /// and registers them. Same-host peers map such regions and copy into them directly;
    /// remote peers reach them over TCP like any other region.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the engine runs without the fabric backend
    /// (`hixl.Transport` `tcp` or `verbs`), [`Error::ResourceExhausted`] past the pool's capacity
    /// (`fabric_memory.max_capacity`), or the OS error of creating the memory.
    pub fn register_pooled(&self, len: u64, access: Access, name: Option<&str>) -> Result<Region> {
        self.check_open("register refused")?;
        let (desc, owned) = self
            .inner
            .shared
            .transports
            .iter()
            .find_map(|t| t.alloc(len))
            .ok_or_else(|| Error::Unsupported {
                what: "this engine has no fabric pool (hixl.Transport is tcp or verbs, or the build has no fabric)".into(),
            })??;
        self.register_inner(desc, MemKind::Host, access, name, Some(owned))
    }

    /// Ends a registration: peers lose access at once (later requests are refused), then this
    /// waits until no in-flight op touches the region and returns the owned buffer, if any.
    ///
    /// # Errors
    /// Only on a poisoned lock; an unknown region is not an error (HIXL: SUCCESS).
    pub async fn deregister(&self, region: &Region) -> Result<Option<HostBuffer>> {
        self.deregister_id(region.id()).await
    }

    /// [`Engine::deregister`] by handle. An unknown handle is a no-op, as in HIXL.
    ///
    /// # Errors
    /// Only on a poisoned lock.
    pub async fn deregister_id(&self, id: RegionId) -> Result<Option<HostBuffer>> {
        let e = self
            .inner
            .shared
            .regions
            .lock()
            .map_err(|_| poisoned())?
            .deregister(id);
        let Some(e) = e else { return Ok(None) };
        if e.access.is_remote() {
            if let Some(s) = &self.inner.server {
                s.broadcast_table(false);
                s.revoke(e.rkey).await;
            }
        }
        Ok(e.data.revoke_and_drain().await)
    }

    /// Connects to a server engine (`"ip:port"`), fetching its memory table and opening its
    /// data connections, within `timeout`.
    ///
    /// # Errors
    /// [`Error::ConnectToSelf`], [`Error::AlreadyConnected`], [`Error::InvalidAddress`] (also for
    /// an address without a port), [`Error::Timeout`], [`Error::Io`] (refused), or the peer's
    /// refusal.
    pub async fn connect(&self, remote: &str, timeout: Duration) -> Result<Peer> {
        self.check_open("connect refused")?;
        if timeout.is_zero() {
            return Err(Error::InvalidTimeout { millis: 0 });
        }
        let ra = EngineAddr::parse(remote)?;
        let sa = ra.socket_addr().ok_or_else(|| Error::InvalidAddress {
            addr: remote.to_string(),
            reason: "a remote engine needs a port".into(),
        })?;
        if self.is_self(sa) {
            return Err(Error::ConnectToSelf {
                engine: remote.to_string(),
            });
        }
        let key = engine_name(sa);
        {
            let mut links = self.inner.links.lock().map_err(|_| poisoned())?;
            match links.get(&key) {
                Some(LinkSlot::Up(l)) if !l.state.is_dead() => {
                    return Err(Error::AlreadyConnected { peer: key })
                }
                Some(LinkSlot::Connecting) => return Err(Error::AlreadyConnected { peer: key }),
                _ => {}
            }
            self.make_room(&mut links, &key)?;
            links.insert(key.clone(), LinkSlot::Connecting);
        }
        let mut slot = ConnectingSlot {
            links: &self.inner.links,
            key: &key,
            armed: true,
        };
        let params = LinkParams {
            local_name: &self.inner.shared.name,
            instance: self.inner.instance,
            remote: &key,
            addr: sa,
            streams: self.inner.options.tcp_streams,
            chunk: self.inner.options.tcp_chunk_bytes,
        };
        let r =
            tokio::time::timeout(timeout, Link::establish(self.inner.shared.clone(), params)).await;
        let r = match r {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout {
                what: "connect",
                peer: key.clone(),
                after: timeout,
            }),
        };
        slot.armed = false;
        // A shutdown that began while this connect ran has closed every link but this one.
        let r = match (r, self.check_open("connect refused")) {
            (Ok(link), Err(e)) => {
                link.close_because("engine finalized", e.clone());
                Err(e)
            }
            (r, _) => r,
        };
        let mut links = self.inner.links.lock().map_err(|_| poisoned())?;
        match r {
            Ok(link) => {
                links.insert(key.clone(), LinkSlot::Up(link.clone()));
                self.evict_idle(&mut links, &key);
                drop(links);
                if self.inner.auto_connect {
                    self.forget_when_dead(&key, &link);
                }
                Ok(Peer {
                    link,
                    shared: self.inner.shared.clone(),
                })
            }
            Err(e) => {
                links.remove(&key);
                if let Error::Remote {
                    status: hixl_core::Status::ParamInvalid,
                    message,
                    ..
                } = &e
                {
                    if message == hixl_core::wire::REFUSE_SELF {
                        return Err(Error::ConnectToSelf {
                            engine: remote.to_string(),
                        });
                    }
                }
                Err(e)
            }
        }
    }

    /// Whether transfers connect lazily (`AutoConnect=1`, or a configured channel pool).
    pub fn auto_connects(&self) -> bool {
        self.inner.auto_connect
    }

    /// Link-count marks of the channel pool: `(max, high, low)` with HIXL's rounding,
    /// `max(1, ⌊max·waterline⌋)`.
    fn pool_marks(&self) -> (usize, usize, usize) {
        let cp = &self.inner.options.global.channel_pool;
        (cp.max_channel as usize, cp.high_mark(), cp.low_mark())
    }

    /// Before a new link: when the table is full (`channel_pool.max_channel`), evict idle
    /// links; refuse with RESOURCE_EXHAUSTED if every link is busy.
    fn make_room(&self, links: &mut HashMap<String, LinkSlot>, key: &str) -> Result<()> {
        let (max, _, low) = self.pool_marks();
        if links.len() < max {
            return Ok(());
        }
        self.evict_down_to(links, key, low.min(max - 1));
        if links.len() >= max {
            return Err(Error::ResourceExhausted {
                what: format!(
                    "{} links are open (channel_pool.max_channel = {max}) and none is idle",
                    links.len()
                ),
            });
        }
        Ok(())
    }

    /// After a new link: once the count reaches the high waterline, idle links are evicted
    /// (least recently used first) down to the low waterline. A link with an op in flight,
    /// abandoned or not, or a notify awaiting its ack, is never evicted; nor is `keep`.
    fn evict_idle(&self, links: &mut HashMap<String, LinkSlot>, keep: &str) {
        let (_, high, low) = self.pool_marks();
        if links.len() >= high {
            self.evict_down_to(links, keep, low);
        }
    }

    fn evict_down_to(&self, links: &mut HashMap<String, LinkSlot>, keep: &str, target: usize) {
        let Ok(ops) = self.inner.shared.ops.lock() else {
            return;
        };
        // Dead links go first, then idle ones by age.
        let mut idle: Vec<(bool, u64, String)> = links
            .iter()
            .filter_map(|(k, v)| match v {
                LinkSlot::Up(l) if k != keep && (l.state.is_dead() || !l.busy(&ops)) => {
                    Some((!l.state.is_dead(), l.last_used(), k.clone()))
                }
                _ => None,
            })
            .collect();
        drop(ops);
        idle.sort();
        for (_, _, k) in idle {
            if links.len() <= target {
                break;
            }
            if let Some(LinkSlot::Up(l)) = links.remove(&k) {
                tracing::info!(peer = %k, "channel pool: closing an idle link");
                l.close_because(
                    "evicted by the channel pool (idle)",
                    Error::PeerLost {
                        peer: k.clone(),
                        cause: "evicted by the channel pool (an idle link, closed to make room; transfers through the engine reconnect)".into(),
                    },
                );
            }
        }
    }

    /// AutoConnect: drops a dead link from the table, so the next transfer reconnects.
    fn forget_when_dead(&self, key: &str, link: &Arc<Link>) {
        let (inner, key, link) = (Arc::downgrade(&self.inner), key.to_string(), link.clone());
        tokio::spawn(async move {
            link.state.dead().await;
            if let Some(inner) = inner.upgrade() {
                if let Ok(mut l) = inner.links.lock() {
                    if matches!(l.get(&key), Some(LinkSlot::Up(x)) if Arc::ptr_eq(x, &link)) {
                        l.remove(&key);
                        tracing::info!(peer = %key, "auto-connect: dropped a dead link");
                    }
                }
            }
        });
    }

    /// The peer `remote`; with AutoConnect (or a configured channel pool), connects first
    /// when there is no live link, within HIXL's 3000 ms.
    ///
    /// # Errors
    /// [`Error::NotConnected`] without AutoConnect; else those of [`Engine::connect`].
    pub async fn peer_or_connect(&self, remote: &str) -> Result<Peer> {
        match self.peer(remote) {
            Ok(p) if p.is_connected() || !self.inner.auto_connect => return Ok(p),
            Err(e) if !self.inner.auto_connect => return Err(e),
            _ => {}
        }
        let deadline = tokio::time::Instant::now() + AUTO_CONNECT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: "auto-connect",
                    peer: remote.to_string(),
                    after: AUTO_CONNECT_TIMEOUT,
                });
            }
            match self.connect(remote, left).await {
                Err(Error::AlreadyConnected { .. }) => {
                    // Connected meanwhile, or another task is connecting: use or wait for it.
                    if let Ok(p) = self.peer(remote) {
                        if p.is_connected() {
                            return Ok(p);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                r => return r,
            }
        }
    }

    /// Queues a connect to `remote` and returns at once (HIXL `ConnectAsync`). Tasks for one
    /// peer run in order; [`Engine::async_connect_status`] reports the latest one's state.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`], [`Error::InvalidAddress`], [`Error::ResourceExhausted`]
    /// past `connect_pool.task_queue_capacity` queued tasks.
    pub fn connect_async(&self, remote: &str, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidTimeout { millis: 0 });
        }
        self.queue_async(remote, |id| AsyncTask::Connect(id, timeout))
    }

    /// Queues a disconnect from `remote` (HIXL `DisconnectAsync`).
    ///
    /// # Errors
    /// As [`Engine::connect_async`].
    pub fn disconnect_async(&self, remote: &str, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidTimeout { millis: 0 });
        }
        self.queue_async(remote, |id| AsyncTask::Disconnect(id, timeout))
    }

    fn queue_async(&self, remote: &str, task: impl FnOnce(u64) -> AsyncTask) -> Result<()> {
        use std::sync::atomic::Ordering;
        self.check_open("asynchronous connect or disconnect refused")?;
        let key = self.key(remote)?;
        let cap = self.inner.options.global.connect_pool.task_queue_capacity as usize;
        if self.inner.async_pending.fetch_add(1, Ordering::SeqCst) >= cap {
            self.inner.async_pending.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::ResourceExhausted {
                what: format!("{cap} connect tasks are queued (connect_pool.task_queue_capacity)"),
            });
        }
        let mut queues = self.inner.async_conn.lock().map_err(|_| poisoned())?;
        let q = queues
            .entry(key.clone())
            .or_insert_with(|| self.start_async_worker(&key));
        q.next += 1;
        let t = task(q.next);
        let pending = match t {
            AsyncTask::Connect(..) => AsyncConnectStatus::ConnectPending,
            AsyncTask::Disconnect(..) => AsyncConnectStatus::DisconnectPending,
        };
        if let Ok(mut s) = q.status.lock() {
            *s = (q.next, pending);
        }
        if q.tx.send(t).is_err() {
            self.inner.async_pending.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::ShutDown {
                engine: self.inner.shared.name.clone(),
                what: "asynchronous connect or disconnect refused",
            });
        }
        Ok(())
    }

    fn start_async_worker(&self, key: &str) -> AsyncQueue {
        use std::sync::atomic::Ordering;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<AsyncTask>();
        let status = Arc::new(Mutex::new((0u64, AsyncConnectStatus::NotConnect)));
        let (weak, st, key, pending) = (
            Arc::downgrade(&self.inner),
            status.clone(),
            key.to_string(),
            self.inner.async_pending.clone(),
        );
        tokio::spawn(async move {
            let set = |id: u64, v: AsyncConnectStatus| {
                if let Ok(mut s) = st.lock() {
                    if s.0 == id {
                        s.1 = v;
                    }
                }
            };
            while let Some(task) = rx.recv().await {
                let Some(inner) = weak.upgrade() else { break };
                let engine = Engine { inner };
                match task {
                    AsyncTask::Connect(id, t) => {
                        set(id, AsyncConnectStatus::Connecting);
                        let r = engine.connect(&key, t).await;
                        let ok = matches!(r, Ok(_) | Err(Error::AlreadyConnected { .. }));
                        if let Err(e) = &r {
                            if !ok {
                                tracing::warn!(peer = %key, "async connect failed: {e}");
                            }
                        }
                        set(
                            id,
                            if ok {
                                AsyncConnectStatus::Connected
                            } else {
                                AsyncConnectStatus::ConnectFailed
                            },
                        );
                    }
                    AsyncTask::Disconnect(id, t) => {
                        set(id, AsyncConnectStatus::Disconnecting);
                        let _ = tokio::time::timeout(t, engine.disconnect(&key)).await;
                        set(id, AsyncConnectStatus::NotConnect);
                    }
                }
                pending.fetch_sub(1, Ordering::SeqCst);
            }
        });
        AsyncQueue {
            tx,
            status,
            next: 0,
        }
    }

    /// The state the latest `connect_async`/`disconnect_async` task for `remote` left (HIXL
    /// `GetAsyncConnectStatus`); without any, whether a live link exists.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`].
    pub fn async_connect_status(&self, remote: &str) -> Result<AsyncConnectStatus> {
        let key = self.key(remote)?;
        let queued = self
            .inner
            .async_conn
            .lock()
            .map_err(|_| poisoned())?
            .get(&key)
            .and_then(|q| q.status.lock().ok().map(|s| s.1));
        Ok(match queued {
            Some(AsyncConnectStatus::Connected) | None => match self.peer(&key) {
                Ok(p) if p.is_connected() => AsyncConnectStatus::Connected,
                _ if queued.is_some() => AsyncConnectStatus::ConnectFailed,
                _ => AsyncConnectStatus::NotConnect,
            },
            Some(s) => s,
        })
    }

    /// [`Engine::async_connect_status`] of every peer with a queue or a link.
    pub fn async_connect_statuses(&self) -> HashMap<String, AsyncConnectStatus> {
        let mut keys: Vec<String> = self.peers();
        if let Ok(q) = self.inner.async_conn.lock() {
            keys.extend(q.keys().cloned());
        }
        keys.into_iter()
            .filter_map(|k| Some((k.clone(), self.async_connect_status(&k).ok()?)))
            .collect()
    }

    fn is_self(&self, sa: SocketAddr) -> bool {
        match self.inner.listen {
            Some(l) if l.port() == sa.port() => {
                l.ip() == sa.ip()
                    || (l.ip().is_unspecified()
                        && (sa.ip().is_loopback() || sa.ip() == self.inner.addr.ip))
            }
            _ => false,
        }
    }

    /// Closes the link to `remote`. Its in-flight transfers fail.
    ///
    /// # Errors
    /// [`Error::NotConnected`] if there is no link.
    pub async fn disconnect(&self, remote: &str) -> Result<()> {
        let key = self.key(remote)?;
        let slot = self
            .inner
            .links
            .lock()
            .map_err(|_| poisoned())?
            .remove(&key);
        match slot {
            Some(LinkSlot::Up(l)) => {
                l.close("disconnect");
                Ok(())
            }
            Some(LinkSlot::Connecting) | None => Err(Error::NotConnected { peer: key }),
        }
    }

    fn key(&self, remote: &str) -> Result<String> {
        let ra = EngineAddr::parse(remote)?;
        Ok(match ra.socket_addr() {
            Some(sa) => engine_name(sa),
            None => remote.to_string(),
        })
    }

    /// The peer `remote`, if connected.
    ///
    /// # Errors
    /// [`Error::NotConnected`].
    pub fn peer(&self, remote: &str) -> Result<Peer> {
        let key = self.key(remote)?;
        match self.inner.links.lock().map_err(|_| poisoned())?.get(&key) {
            Some(LinkSlot::Up(l)) => Ok(Peer {
                link: l.clone(),
                shared: self.inner.shared.clone(),
            }),
            _ => Err(Error::NotConnected { peer: key }),
        }
    }

    /// Names of connected peers.
    pub fn peers(&self) -> Vec<String> {
        self.inner
            .links
            .lock()
            .map(|l| {
                l.iter()
                    .filter(|(_, v)| matches!(v, LinkSlot::Up(_)))
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Posts a transfer to `remote` by name (HIXL's `TransferAsync`); see [`Peer::transfer`].
    /// With `AutoConnect=1` (or a configured channel pool) a missing or dead link is
    /// connected first (within 3000 ms, as in HIXL); the transfer is posted as soon as it is
    /// up, whether or not the returned future is polled.
    pub fn transfer(&self, remote: &str, op: TransferOp, descs: &[OpDesc]) -> Transfer {
        if let Err(e) = self.check_open("transfer refused") {
            return Transfer::failed(self.inner.shared.clone(), e, Arc::from(remote));
        }
        if self.inner.auto_connect && !matches!(self.peer(remote), Ok(p) if p.is_connected()) {
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                return Transfer::failed(
                    self.inner.shared.clone(),
                    Error::InvalidParam {
                        what: "auto-connect needs a tokio runtime".into(),
                    },
                    Arc::from(remote),
                );
            };
            let (me, r, d) = (self.clone(), remote.to_string(), descs.to_vec());
            let task = rt.spawn(async move {
                let p = me.peer_or_connect(&r).await?;
                Ok(p.transfer(op, &d))
            });
            return Transfer::connecting(self.inner.shared.clone(), task, Arc::from(remote));
        }
        match self.peer(remote) {
            Ok(p) => p.transfer(op, descs),
            Err(e) => Transfer::failed(self.inner.shared.clone(), e, Arc::from(remote)),
        }
    }

    /// Notifies received by this engine, as a stream.
    pub fn notifications(&self) -> NotifyStream {
        NotifyStream {
            queue: self.inner.shared.notifies.clone(),
        }
    }

    /// Returns and clears every received notify (HIXL `GetNotifies`).
    pub fn take_notifies(&self) -> Vec<Notify> {
        self.inner.shared.notifies.drain()
    }

    /// Ops not yet finished or reaped (in-flight and abandoned ones).
    pub fn ops_in_flight(&self) -> usize {
        self.inner.shared.ops.lock().map(|o| o.live()).unwrap_or(0)
    }

    /// Stops the engine (HIXL `Finalize`): from now on every call that would start something
    /// (`connect`, `register`, `transfer`, `notify`, async connects) fails with
    /// [`Error::ShutDown`] (status FAILED, as HIXL answers after `Finalize`); `deregister`
    /// still hands buffers back. Closes every link, so their in-flight ops fail with
    /// [`Error::ShutDown`] (every one of them resolves, on every transport: the reactor runs
    /// on until no op has parts outstanding), tells connected initiators, stops listening and
    /// ends notify streams. Waits up to `grace` for the ops in flight to resolve. Calling it
    /// again is harmless.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutdown.send_replace(true);
        let links: Vec<_> = self
            .inner
            .links
            .lock()
            .map(|mut l| l.drain().map(|(_, v)| v).collect())
            .unwrap_or_default();
        for l in links {
            if let LinkSlot::Up(l) = l {
                l.close_because(
                    "engine finalized",
                    Error::ShutDown {
                        engine: self.inner.shared.name.clone(),
                        what: "the link was closed by shutdown",
                    },
                );
            }
        }
        if let Some(s) = &self.inner.server {
            s.close_all("engine finalized");
        }
        let deadline = tokio::time::Instant::now() + grace;
        while self.ops_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.inner.shared.notifies.close();
    }
}
