//! [`EngineBuilder`]: options, listener, reactor and transports of a new [`Engine`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_core::options::TcpIo;
use hixl_core::{Error, OpTable, Options, RegionTable, Result};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::{Engine, EngineInner};
use crate::addr::{engine_name, EngineAddr};
use crate::completion::CompletionQueue;
use crate::context::{random_u64, EngineConfig, Heartbeat, OpsHandle};
use crate::link::LinkCx;
use crate::notify::NotifyQueue;
use crate::reactor::Reactor;
use crate::server::Server;
use crate::sink::Completions;

/// Builds an [`Engine`] from HIXL's `local_engine` string and option keys.
#[derive(Debug)]
pub struct EngineBuilder {
    pub(super) local: String,
    pub(super) pairs: Vec<(String, String)>,
    pub(super) options: Option<Options>,
    pub(super) ephemeral: bool,
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
        let addr = EngineAddr::lookup(&self.local).await?;
        crate::rng::probe().map_err(|e| Error::io("drawing the engine's rkeys", e))?;
        let options = match self.options {
            None => Options::from_pairs(self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?,
            Some(mut o) => {
                for (k, v) in &self.pairs {
                    o.set(k, v)?;
                }
                o
            }
        };
        if let (Some(name), false) = (&options.directory.name, options.directory.is_enabled()) {
            return Err(Error::InvalidOption {
                key: "hixl.Name".into(),
                value: name.clone(),
                reason:
                    "a name is published in a directory: set hixl.Directory (etcd://host:port) too"
                        .into(),
            });
        }
        // The directory first: an engine that cannot reach it is refused before it listens.
        #[cfg(feature = "directory")]
        let directory = match options.directory.is_enabled() {
            true => Some(hixl_directory::Directory::open(&options.directory).await?),
            false => None,
        };
        #[cfg(not(feature = "directory"))]
        if options.directory.is_enabled() {
            return Err(Error::Unsupported {
                what: "hixl.Directory: this build has no directory (feature `directory`)".into(),
            });
        }
        let listener = match (addr.socket_addr(), self.ephemeral) {
            (Some(sa), _) => Some(sa),
            (None, true) => Some(SocketAddr::new(addr.ip, 0)),
            (None, false) => None,
        };
        let listener = match listener {
            Some(sa) => {
                Some(listen_on(sa).map_err(|e| Error::io(format!("listening on {sa}"), e))?)
            }
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
        let transports = crate::transport::registry::start(&options, instance, &ops)?;
        let mut sources: Vec<Arc<dyn hixl_core::CompletionSource>> = vec![cq.clone()];
        sources.extend(transports.iter().filter_map(|t| t.completions()));
        let reactor = Arc::new(
            Reactor::new(sources, ops.clone())
                .with_busy_poll(Duration::from_micros(options.fabric_busy_poll_us)),
        );
        let (tcp_io, tcp_io_refused) = match options.tcp_io {
            TcpIo::Uring => match crate::tcp::uring::probe() {
                Ok(()) => (TcpIo::Uring, None),
                Err(e) => {
                    let why = format!("the kernel refused io_uring ({e})");
                    tracing::warn!("hixl.TcpIo=uring: {why}; TCP uses epoll");
                    (TcpIo::Epoll, Some(why))
                }
            },
            io => (io, None),
        };
        let lcx = LinkCx {
            config: Arc::new(EngineConfig {
                name,
                heartbeat: Heartbeat {
                    interval: Duration::from_millis(options.heartbeat_interval_ms),
                    miss_limit: options.heartbeat_miss_limit,
                    idle: Some(Duration::from_millis(options.heartbeat_idle_ms))
                        .filter(|d| !d.is_zero()),
                },
                auth,
                spin: Duration::from_micros(options.spin_us),
                target_spinners: std::sync::atomic::AtomicUsize::new(0),
                tcp_io,
                tcp_io_refused,
            }),
            ops: OpsHandle {
                table: ops,
                sink: Completions::new(cq, reactor.clone()),
            },
            regions: Arc::new(Mutex::new(RegionTable::new())),
            transports: Arc::new(transports),
        };
        let notifies = Arc::new(NotifyQueue::default());
        let (shutdown, rx) = watch::channel(false);
        let tasks = TaskTracker::new();
        tasks.spawn(reactor.run(rx.clone()));
        let server = match listener {
            Some(l) => {
                let srv = Server::new(
                    lcx.config.clone(),
                    lcx.transports.clone(),
                    lcx.regions.clone(),
                    notifies.clone(),
                    instance,
                    tasks.clone(),
                );
                tasks.spawn(srv.clone().accept_loop(l, rx.clone()));
                srv.listen_transports(&rx)?;
                Some(srv)
            }
            None => None,
        };
        tracing::debug!(engine = %lcx.config.name, "engine started");
        let engine = Engine {
            inner: Arc::new(EngineInner {
                lcx,
                notifies,
                addr,
                listen,
                instance,
                server,
                links: Mutex::new(HashMap::new()),
                shutdown,
                tasks,
                auto_connect: options.auto_connect || options.global.channel_pool.configured,
                async_conn: Mutex::new(HashMap::new()),
                async_pending: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
                options,
                #[cfg(feature = "directory")]
                named: std::sync::OnceLock::new(),
            }),
        };
        #[cfg(feature = "directory")]
        if let Some(dir) = directory {
            if let Err(e) = engine.start_directory(dir).await {
                engine.shutdown(Duration::ZERO).await;
                return Err(e);
            }
        }
        Ok(engine)
    }
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

/// Connections the kernel may queue for the accept loop (capped by `net.core.somaxconn`). Each
/// link opens a control and `hixl.TcpStreams` data connections at once, so many initiators
/// connecting together overflow tokio's default of 1024 and their SYNs wait a second to retry.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds and listens on `sa` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as tokio's `bind`).
fn listen_on(sa: SocketAddr) -> std::io::Result<TcpListener> {
    let s = if sa.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    s.set_reuseaddr(true)?;
    s.bind(sa)?;
    s.listen(LISTEN_BACKLOG)
}
