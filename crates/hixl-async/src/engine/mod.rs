//! The `Engine`: registered memory, links to peers, the listener, the reactor, notifies.

mod async_connect;
mod builder;
mod http_probe;
mod links;
#[cfg(feature = "directory")]
mod named;
mod pool;
mod registry;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_core::{Error, Notify, Options, Result};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

pub use builder::EngineBuilder;

use self::async_connect::AsyncQueue;
use crate::addr::{engine_name, EngineAddr};
use crate::link::Link;
use crate::link::LinkCx;
use crate::notify::NotifyQueue;
use crate::notify::{NotifyService, NotifyStream};
use crate::server::Server;
use crate::sync::lock;

#[derive(Debug)]
enum LinkSlot {
    Connecting,
    Up(Arc<Link>),
}

#[derive(Debug)]
struct EngineInner {
    /// What every link is built with: the settings, the op table and sink, the regions, the
    /// transports.
    lcx: LinkCx,
    notifies: Arc<NotifyQueue>,
    addr: EngineAddr,
    listen: Option<SocketAddr>,
    instance: u64,
    options: Options,
    server: Option<Arc<Server>>,
    links: Mutex<HashMap<String, LinkSlot>>,
    shutdown: watch::Sender<bool>,
    /// The engine's own tasks: the reactor, the accept loops, each accepted connection's
    /// (which becomes its session's driver). [`Engine::shutdown`] joins them; each link's
    /// tasks are its own (`LinkState`).
    tasks: TaskTracker,
    /// `AutoConnect=1`, or `channel_pool.*` configured: transfers connect lazily and dead
    /// links are dropped from the table.
    auto_connect: bool,
    /// `ConnectAsync`/`DisconnectAsync` queues, one per peer.
    async_conn: Mutex<HashMap<String, AsyncQueue>>,
    /// Tasks queued on all of them (bounded by `connect_pool.task_queue_capacity`).
    async_pending: Arc<std::sync::atomic::AtomicUsize>,
    /// The directory (`hixl.Directory`), once started.
    #[cfg(feature = "directory")]
    named: std::sync::OnceLock<named::Named>,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        // The entry goes at once rather than with its lease, when a runtime is there to say so.
        #[cfg(feature = "directory")]
        if let (Some(n), Ok(rt)) = (self.named.get(), tokio::runtime::Handle::try_current()) {
            let dir = n.dir.clone();
            rt.spawn(async move { dir.close().await });
        }
        // The reactor runs on until the ops of the closed links have resolved.
        self.shutdown.send_replace(true);
        for (_, s) in lock(&self.links).drain() {
            if let LinkSlot::Up(link) = s {
                link.close_because(
                    "engine dropped",
                    Error::ShutDown {
                        engine: self.lcx.config.name.clone(),
                        what: "the engine was dropped",
                    },
                );
            }
        }
        if let Some(s) = &self.server {
            s.close_all("engine dropped");
        }
        self.notifies.close();
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
                engine: self.inner.lcx.config.name.clone(),
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
        &self.inner.lcx.config.name
    }

    /// The listening address, if this engine is a server.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.inner.listen
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.inner.options
    }

    /// Whether transfers connect lazily (`AutoConnect=1`, or a configured channel pool).
    pub fn auto_connects(&self) -> bool {
        self.inner.auto_connect
    }

    /// How this engine's TCP data connections move bytes (`hixl.TcpIo`), and why io_uring is
    /// not used if it was asked for and the kernel refused it (the engine then uses epoll).
    pub fn tcp_io(&self) -> (hixl_core::options::TcpIo, Option<&str>) {
        let c = &self.inner.lcx.config;
        (c.tcp_io, c.tcp_io_refused.as_deref())
    }

    /// Which RDMA device this engine uses, or why it uses none.
    pub fn verbs_status(&self) -> std::result::Result<String, String> {
        self.inner
            .lcx
            .transports
            .iter()
            .find_map(|t| t.device())
            .unwrap_or_else(|| {
                Err("this build has no verbs backend (feature `verbs` is off)".to_string())
            })
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

    fn key(&self, remote: &str) -> Result<String> {
        #[cfg(feature = "directory")]
        if self.named().is_some() && named::is_name(remote) {
            return Ok(self.named_key(remote).unwrap_or_else(|| remote.to_string()));
        }
        let ra = EngineAddr::lookup_blocking(remote)?;
        Ok(match ra.socket_addr() {
            Some(sa) => engine_name(sa),
            None => remote.to_string(),
        })
    }

    /// Notifies received by this engine, as a stream.
    pub fn notifications(&self) -> NotifyStream {
        NotifyStream {
            queue: self.inner.notifies.clone(),
        }
    }

    /// Serves notifies whose name starts with `prefix` with `handler` instead of queuing
    /// them: the handler runs on the task that received the notify (it must not block), and
    /// the status it returns is what the sender's [`Peer::notify`] returns (`SUCCESS`: `Ok`;
    /// any other: [`hixl_core::Error::Remote`] carrying it). This is a request/answer on
    /// the link, used by layers above the engine (the KV layer's leases). Served notifies do
    /// not count against the sender's notify budget. Serving ends when the returned
    /// [`NotifyService`] is dropped.
    ///
    /// # Errors
    /// [`Error::InvalidParam`] for an empty prefix or one overlapping a served prefix.
    pub fn serve_notifies(
        &self,
        prefix: impl Into<Vec<u8>>,
        handler: impl Fn(&Notify) -> hixl_core::Status + Send + Sync + 'static,
    ) -> Result<NotifyService> {
        self.inner.notifies.serve(prefix.into(), Arc::new(handler))
    }

    /// Whether the initiator link `link` (a [`Notify::link`]) is still connected to this
    /// engine. `false` once it closed, died or was never known.
    pub fn initiator_connected(&self, link: u64) -> bool {
        self.inner.server.as_ref().is_some_and(|s| {
            s.cx.sessions
                .get(link)
                .is_some_and(|sess| !sess.state.is_dead())
        })
    }

    /// Returns and clears every received notify (HIXL `GetNotifies`).
    pub fn take_notifies(&self) -> Vec<Notify> {
        self.inner.notifies.drain()
    }

    /// Ops not yet finished or reaped (in-flight and abandoned ones).
    pub fn ops_in_flight(&self) -> usize {
        lock(&self.inner.lcx.ops.table).live()
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
        let first = !self.inner.shutdown.send_replace(true);
        // Peers looking this engine up stop finding it before its links close.
        #[cfg(feature = "directory")]
        if first {
            self.close_directory().await;
        }
        let _ = first;
        let links: Vec<_> = lock(&self.inner.links).drain().map(|(_, v)| v).collect();
        let mut up = Vec::new();
        for l in links {
            if let LinkSlot::Up(l) = l {
                l.close_because(
                    "engine finalized",
                    Error::ShutDown {
                        engine: self.inner.lcx.config.name.clone(),
                        what: "the link was closed by shutdown",
                    },
                );
                up.push(l);
            }
        }
        if let Some(s) = &self.inner.server {
            s.close_all("engine finalized");
        }
        let deadline = crate::clock::deadline_after(grace);
        // Each link's driver joins its tasks (their ops resolved) as it ends.
        let joined = futures::future::join_all(up.iter().map(|l| l.closed()));
        let _ = tokio::time::timeout_at(deadline, joined).await;
        while self.ops_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The accept loops and every accepted connection's session (each has said goodbye).
        self.inner.tasks.close();
        if tokio::time::timeout_at(deadline, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                engine = %self.inner.lcx.config.name,
                "{} of the engine's tasks still running after the shutdown's grace of {grace:?}",
                self.inner.tasks.len()
            );
        }
        self.inner.notifies.close();
    }
}
