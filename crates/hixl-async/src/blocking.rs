//! Blocking facade with HIXL's method set, for callers without a tokio runtime.
//!
//! [`Hixl`] mirrors HIXL's `hixl::Hixl` class (and its Python binding): `initialize`,
//! `register_mem`, `connect`, `transfer_sync`, `transfer_async` + `get_transfer_status`,
//! `send_notify` + `get_notifies`, `finalize`. It owns a private two-thread tokio runtime and
//! an [`Engine`]; every call returns a [`hixl_core::Result`] whose error maps onto HIXL's
//! status code through [`Error::status`].

mod types;

pub use types::{
    FeatureType, GetTransferStatusArgs, MemHandle, TransferReq, TransferResult,
    FEATURE_NOT_SUPPORTED, FEATURE_SUPPORTED, MAX_OUTSTANDING_REQUESTS,
};

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use futures::FutureExt;
use hixl_core::{
    Access, AsyncConnectStatus, Error, MemDesc, MemKind, Notify, OpDesc, Result, TransferOp,
    TransferStatus,
};
use tokio::runtime::Runtime;

use crate::{Engine, HostBuffer, Region, Transfer};

/// How long `finalize` waits for abandoned transfers to drain after closing every link.
const FINALIZE_GRACE: Duration = Duration::from_secs(1);

/// An asynchronous request kept until a terminal status is read.
struct Pending {
    transfer: Transfer,
    user_data: u64,
}

/// What exists between `initialize` and `finalize`.
struct Inner {
    rt: Runtime,
    engine: Engine,
    /// Outstanding requests by number; numbers grow, so key order is submission order.
    reqs: Mutex<BTreeMap<u64, Pending>>,
}

impl Inner {
    /// Runs `f` to completion on the runtime, refusing (instead of panicking) when the calling
    /// thread is already inside a tokio runtime.
    fn block_on<F: Future>(&self, call: &'static str, f: F) -> Result<F::Output> {
        not_in_runtime(call)?;
        Ok(self.rt.block_on(f))
    }

    /// Finalize: abandon outstanding requests, close links and the listener, stop the runtime.
    /// Must run outside any tokio runtime (the caller guarantees it).
    fn shutdown(self) {
        let Inner { rt, engine, reqs } = self;
        let _ctx = rt.enter();
        drop(std::mem::take(&mut *lock(&reqs)));
        rt.block_on(engine.shutdown(FINALIZE_GRACE));
        drop(engine);
        drop(_ctx);
        // Waits until every engine task has been dropped: no peer touches memory afterwards.
        drop(rt);
    }

    /// Finalize from inside a tokio runtime, where neither `block_on` nor dropping a runtime
    /// is allowed: tell the engine to stop and let the runtime wind down in the background.
    fn shutdown_background(self) {
        let Inner { rt, engine, reqs } = self;
        {
            let _ctx = rt.enter();
            drop(std::mem::take(&mut *lock(&reqs)));
            // Dropping the last handle closes the links and stops the listener.
            drop(engine);
        }
        // Only reached when no helper thread could be started: tasks are cancelled, but may
        // still be finishing on the workers for a moment after finalize returns.
        rt.shutdown_background();
    }
}

fn not_in_runtime(call: &'static str) -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::InvalidParam {
            what: format!(
                "Hixl::{call} blocks and cannot be called from inside a tokio runtime \
                 (it would have to nest block_on); use the async Engine (Hixl::engine) there, \
                 or call from a thread outside the runtime"
            ),
        });
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn check_timeout(millis: i32) -> Result<Duration> {
    Error::check_timeout_ms(i64::from(millis))
}

/// The blocking HIXL object (HIXL `hixl::Hixl`): one engine with its own runtime.
///
/// Call order, as in HIXL: [`initialize`](Hixl::initialize) → [`register_mem`](Hixl::register_mem)
/// on both sides → [`connect`](Hixl::connect) (client to server) → transfers and notifies →
/// [`disconnect`](Hixl::disconnect) → [`deregister_mem`](Hixl::deregister_mem) →
/// [`finalize`](Hixl::finalize) (also run on drop). Any call before `initialize` or after
/// `finalize` fails with [`Error::NotInitialized`] (HIXL `FAILED`, 503900).
///
/// Every method takes `&self`; `Hixl` is `Send + Sync` and may be shared between threads
/// (for example in an `Arc`). Calls run concurrently, except `initialize` and `finalize`,
/// which wait for the calls in progress.
///
/// Blocking methods (`initialize`, `connect`, `disconnect`, `deregister_mem`,
/// `transfer_sync`, `send_notify`) must not be called from inside a tokio runtime: they
/// return [`Error::InvalidParam`] there instead of blocking a worker (use the async
/// [`Engine`] from [`Hixl::engine`] in async code). `finalize` and drop work anywhere.
///
/// ```no_run
/// use hixl_async::blocking::Hixl;
/// use hixl_async::HostBuffer;
/// use hixl_core::{OpDesc, TransferOp};
///
/// # fn main() -> hixl_core::Result<()> {
/// let hixl = Hixl::new();
/// hixl.initialize("10.0.0.2", &[])?; // client only: no port
/// let (_handle, local) = hixl.register_buffer(HostBuffer::zeroed(1 << 20)?)?;
/// hixl.connect("10.0.0.1:26000", 1000)?;
/// let remote_addr = 0x7f00_0000_0000; // learned from the server out of band
/// let descs = [OpDesc::new(local.addr(), remote_addr, 4096)];
/// hixl.transfer_sync("10.0.0.1:26000", TransferOp::Write, &descs, 1000)?;
/// hixl.send_notify("10.0.0.1:26000", "cache_ready", "block_0", 1000)?;
/// hixl.disconnect("10.0.0.1:26000", 1000)?;
/// hixl.finalize();
/// # Ok(()) }
/// ```
pub struct Hixl {
    state: RwLock<Option<Inner>>,
    next_req: AtomicU64,
}

impl std::fmt::Debug for Hixl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hixl")
            .field("local_engine", &self.local_engine())
            .finish()
    }
}

impl Default for Hixl {
    fn default() -> Self {
        Hixl::new()
    }
}

impl Drop for Hixl {
    /// Finalizes, as HIXL's destructor does.
    fn drop(&mut self) {
        self.finalize();
    }
}

impl Hixl {
    /// An uninitialized object; the runtime and engine start at [`Hixl::initialize`].
    pub fn new() -> Hixl {
        Hixl {
            state: RwLock::new(None),
            next_req: AtomicU64::new(1),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Option<Inner>> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Hixl::with`] for a blocking call: refused first thing inside a tokio runtime.
    fn with_blocking<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&Inner) -> Result<T>,
    ) -> Result<T> {
        not_in_runtime(call)?;
        self.with(f)
    }

    fn with<T>(&self, f: impl FnOnce(&Inner) -> Result<T>) -> Result<T> {
        match self.read().as_ref() {
            Some(inner) => f(inner),
            None => Err(Error::NotInitialized),
        }
    }

    /// Starts the engine (HIXL `Initialize`). `local_engine` is `"ip"`/`"[ipv6]"` (client
    /// only) or `"ip:port"`/`"[ipv6]:port"` (a server listening on that port); `options` are
    /// HIXL option keys and values (`"BufferPool"`, `"GlobalResourceConfig"`, ...).
    ///
    /// Calling it again while initialized is a no-op that returns `Ok` and keeps the running
    /// engine, whatever the arguments (as HIXL's Python binding does). After
    /// [`Hixl::finalize`] it starts a new engine.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`], option errors naming the key, the OS error of `bind`,
    /// [`Error::InvalidParam`] when called from inside a tokio runtime.
    pub fn initialize(&self, local_engine: &str, options: &[(&str, &str)]) -> Result<()> {
        self.init(local_engine, options, false)
    }

    /// [`Hixl::initialize`] listening on a port the OS picks (hixl extension, for tests and
    /// tools): `local_ip` is `"ip"` or `"[ipv6]"`; [`Hixl::local_engine`] then reports the
    /// real `ip:port` for peers to connect to.
    ///
    /// # Errors
    /// As [`Hixl::initialize`].
    pub fn initialize_ephemeral(&self, local_ip: &str, options: &[(&str, &str)]) -> Result<()> {
        self.init(local_ip, options, true)
    }

    fn init(&self, local: &str, options: &[(&str, &str)], ephemeral: bool) -> Result<()> {
        not_in_runtime("initialize")?;
        let mut g = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(inner) = g.as_ref() {
            tracing::debug!(
                engine = inner.engine.local_engine(),
                "initialize on an initialized Hixl: no-op"
            );
            return Ok(());
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hixl-blocking")
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting the tokio runtime", e))?;
        let mut b = Engine::builder(local);
        for (k, v) in options {
            b = b.option(*k, *v);
        }
        if ephemeral {
            b = b.ephemeral_port();
        }
        let engine = rt.block_on(b.build())?;
        *g = Some(Inner {
            rt,
            engine,
            reqs: Mutex::new(BTreeMap::new()),
        });
        Ok(())
    }

    /// Stops the engine (HIXL `Finalize`): outstanding asynchronous requests are dropped,
    /// every link is closed (peers' and our in-flight transfers fail), the listener stops and
    /// the runtime shuts down. Afterwards every call fails with [`Error::NotInitialized`]
    /// until [`Hixl::initialize`] runs again. A no-op when not initialized. Also run on drop.
    ///
    /// As in HIXL, a server should finalize only after its clients disconnected. Waits for
    /// calls in progress on other threads. Safe to call from inside a tokio runtime (the
    /// runtime then winds down in the background).
    pub fn finalize(&self) {
        let mut g = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let Some(inner) = g.take() else { return };
        if tokio::runtime::Handle::try_current().is_err() {
            inner.shutdown();
            return;
        }
        // Inside a runtime: finish on a plain thread, where blocking is allowed.
        let slot = Mutex::new(Some(inner));
        std::thread::scope(|s| {
            let spawned = std::thread::Builder::new()
                .name("hixl-finalize".into())
                .spawn_scoped(s, || {
                    if let Some(inner) = lock(&slot).take() {
                        inner.shutdown();
                    }
                });
            if let Ok(h) = spawned {
                let _ = h.join();
            }
        });
        let left = lock(&slot).take();
        if let Some(inner) = left {
            inner.shutdown_background();
        }
    }

    /// This engine's name (`ip:port` of a server, with the real port; `ip` of a client), or
    /// `None` when not initialized.
    pub fn local_engine(&self) -> Option<String> {
        self.read()
            .as_ref()
            .map(|i| i.engine.local_engine().to_string())
    }

    /// A clone of the underlying async [`Engine`], for advanced use from async code. It runs
    /// on this object's runtime and is stopped by [`Hixl::finalize`]; do not use it afterwards.
    ///
    /// # Errors
    /// [`Error::NotInitialized`].
    pub fn engine(&self) -> Result<Engine> {
        self.with(|i| Ok(i.engine.clone()))
    }

    /// Registers memory the caller owns for remote read and write (HIXL `RegisterMem`).
    /// Registering the identical `(addr, len)` again returns the same handle. Register before
    /// [`Hixl::connect`]: as in HIXL, a link only sees the memory the peer had registered
    /// when it was set up (hixl also pushes later changes, but do not rely on it for HIXL
    /// portability). Does not block.
    ///
    /// # Safety
    /// `desc` must describe memory that stays valid for reads and writes for its whole length
    /// until [`Hixl::deregister_mem`] has returned for the handle or [`Hixl::finalize`] has
    /// returned (and no clone from [`Hixl::engine`] is still in use): peers may read and write
    /// it at any time until then, concurrently with this process. Do not hold Rust references
    /// to it while transfers may touch it.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::NullAddress`], [`Error::ZeroLength`],
    /// [`Error::RangeOverflow`], [`Error::Overlap`] (a partial overlap with a registered region
    /// of the same kind), [`Error::Unsupported`] for [`MemKind::Device`] (no device runtime).
    pub unsafe fn register_mem(&self, desc: MemDesc, kind: MemKind) -> Result<MemHandle> {
        self.with(|i| {
            // SAFETY: the caller upholds register_raw's contract, restated above.
            let r = unsafe { i.engine.register_raw(desc, kind, Access::REMOTE_RW, None) }?;
            Ok(r.id())
        })
    }

    /// Registers an owned host buffer for remote read and write (hixl extension; safe). The
    /// engine keeps the buffer until [`Hixl::deregister_mem`] or [`Hixl::finalize`]; the
    /// returned [`Region`] reads and writes it and gives its address for descriptors.
    ///
    /// # Errors
    /// [`Error::NotInitialized`].
    pub fn register_buffer(&self, buf: HostBuffer) -> Result<(MemHandle, Region)> {
        self.with(|i| {
            let r = i.engine.register(buf)?;
            Ok((r.id(), r))
        })
    }

    /// Ends a registration (HIXL `DeregisterMem`): peers lose access at once, then this waits
    /// until no in-flight transfer touches the region. An unknown or already deregistered
    /// handle is a successful no-op, as in HIXL. A buffer from [`Hixl::register_buffer`] is
    /// freed. Disconnect from peers first, as HIXL recommends.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidParam`] from inside a tokio runtime.
    pub fn deregister_mem(&self, handle: MemHandle) -> Result<()> {
        self.with_blocking("deregister_mem", |i| {
            i.block_on("deregister_mem", i.engine.deregister_id(handle))??;
            Ok(())
        })
    }

    /// Connects to a server engine `"ip:port"` (HIXL `Connect`), fetching its memory table,
    /// within `timeout_ms` (HIXL's default is 1000; at least 200 is recommended).
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::AlreadyConnected`], [`Error::ConnectToSelf`], [`Error::InvalidAddress`],
    /// [`Error::Timeout`], [`Error::Io`] (refused), the peer's refusal, or
    /// [`Error::InvalidParam`] from inside a tokio runtime.
    pub fn connect(&self, remote: &str, timeout_ms: i32) -> Result<()> {
        self.with_blocking("connect", |i| {
            let t = check_timeout(timeout_ms)?;
            i.block_on("connect", i.engine.connect(remote, t))??;
            Ok(())
        })
    }

    /// Closes the link to `remote` (HIXL `Disconnect`); its in-flight transfers fail.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::NotConnected`] without a link, [`Error::Timeout`], or
    /// [`Error::InvalidParam`] from inside a tokio runtime.
    pub fn disconnect(&self, remote: &str, timeout_ms: i32) -> Result<()> {
        self.with_blocking("disconnect", |i| {
            let t = check_timeout(timeout_ms)?;
            let r = i.block_on(
                "disconnect",
                // The timer must be created inside the runtime, hence the async block.
                async { tokio::time::timeout(t, i.engine.disconnect(remote)).await },
            )?;
            r.map_err(|_| Error::Timeout {
                what: "disconnect",
                peer: remote.to_string(),
                after: t,
            })?
        })
    }

    /// Queues a connect and returns at once (HIXL `ConnectAsync`); tasks for one peer run in
    /// order. Poll [`Hixl::get_async_connect_status`].
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::InvalidAddress`], [`Error::ResourceExhausted`] when the queue is full.
    pub fn connect_async(&self, remote: &str, timeout_ms: i32) -> Result<()> {
        self.with(|i| {
            let t = check_timeout(timeout_ms)?;
            let _ctx = i.rt.enter();
            i.engine.connect_async(remote, t)
        })
    }

    /// Queues a disconnect (HIXL `DisconnectAsync`).
    ///
    /// # Errors
    /// As [`Hixl::connect_async`].
    pub fn disconnect_async(&self, remote: &str, timeout_ms: i32) -> Result<()> {
        self.with(|i| {
            let t = check_timeout(timeout_ms)?;
            let _ctx = i.rt.enter();
            i.engine.disconnect_async(remote, t)
        })
    }

    /// The state the latest async task for `remote` left (HIXL `GetAsyncConnectStatus`).
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidAddress`].
    pub fn get_async_connect_status(&self, remote: &str) -> Result<AsyncConnectStatus> {
        self.with(|i| i.engine.async_connect_status(remote))
    }

    /// Every peer's async connect state (HIXL `GetAsyncConnectStatus` for all).
    ///
    /// # Errors
    /// [`Error::NotInitialized`].
    pub fn get_all_async_connect_status(
        &self,
    ) -> Result<std::collections::HashMap<String, AsyncConnectStatus>> {
        self.with(|i| Ok(i.engine.async_connect_statuses()))
    }

    /// Moves data and waits until every byte landed (HIXL `TransferSync`). `Read` copies
    /// remote → local, `Write` local → remote; local ranges must be registered here, remote
    /// ranges inside memory the peer registered. Nothing moves if any descriptor is invalid.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::NotConnected`], descriptor errors ([`Error::NullAddress`],
    /// [`Error::ZeroLength`], [`Error::LocalUnregistered`], [`Error::RemoteOutOfBounds`],
    /// [`Error::InvalidParam`] for an empty list), [`Error::Timeout`] (the op is abandoned),
    /// the link's failure, or [`Error::InvalidParam`] from inside a tokio runtime.
    pub fn transfer_sync(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[OpDesc],
        timeout_ms: i32,
    ) -> Result<()> {
        self.with_blocking("transfer_sync", |i| {
            let t = check_timeout(timeout_ms)?;
            let peer = i.block_on("transfer_sync", i.engine.peer_or_connect(remote))??;
            i.block_on("transfer_sync", async move {
                peer.transfer(op, descs).timeout(t).await
            })?
        })
    }

    /// Posts a transfer and returns at once with its request (HIXL `TransferAsync`).
    /// `user_data` is echoed by [`Hixl::get_all_transfer_status`]. Query the request with
    /// [`Hixl::get_transfer_status`] until it is terminal, which frees it. As in HIXL there is
    /// no timeout: track a deadline yourself and [`Hixl::disconnect`] to abort. Does not
    /// block.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::NotConnected`], descriptor errors as for
    /// [`Hixl::transfer_sync`] (found at submission, so nothing is outstanding), the link's
    /// failure if it is already down, [`Error::ResourceExhausted`] when
    /// [`MAX_OUTSTANDING_REQUESTS`] requests are outstanding.
    pub fn transfer_async(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[OpDesc],
        user_data: u64,
    ) -> Result<TransferReq> {
        self.with(|i| {
            // AutoConnect: connect first (blocking, as HIXL does); otherwise a lookup.
            let peer = match i.engine.peer(remote) {
                Ok(p) if p.is_connected() || !i.engine.auto_connects() => p,
                Err(e) if !i.engine.auto_connects() => return Err(e),
                _ => {
                    not_in_runtime("transfer_async")?;
                    i.block_on("transfer_async", i.engine.peer_or_connect(remote))??
                }
            };
            let mut reqs = lock(&i.reqs);
            if reqs.len() >= MAX_OUTSTANDING_REQUESTS {
                return Err(Error::ResourceExhausted {
                    what: format!(
                        "{MAX_OUTSTANDING_REQUESTS} asynchronous requests are outstanding; \
                         read their status to free them"
                    ),
                });
            }
            let _ctx = i.rt.enter();
            let transfer = peer.transfer(op, descs);
            if transfer.status() == TransferStatus::Failed {
                return Err(match transfer.now_or_never() {
                    Some(Err(e)) => e,
                    _ => Error::InvalidParam {
                        what: "the transfer failed at submission".into(),
                    },
                });
            }
            let req = self.next_req.fetch_add(1, Ordering::Relaxed);
            reqs.insert(
                req,
                Pending {
                    transfer,
                    user_data,
                },
            );
            Ok(TransferReq(req))
        })
    }

    /// The state of an asynchronous request, without waiting (HIXL `GetTransferStatus`).
    /// A terminal status ([`TransferStatus::Completed`], [`TransferStatus::Failed`]) frees
    /// the request: asking again is an error. ([`TransferStatus::TimedOut`] is never
    /// produced here, as in HIXL.)
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::UnknownRequest`] (HIXL `PARAM_INVALID`) for a
    /// request that is unknown or already freed.
    pub fn get_transfer_status(&self, req: TransferReq) -> Result<TransferStatus> {
        self.with(|i| {
            let mut reqs = lock(&i.reqs);
            let status = match reqs.get(&req.0) {
                Some(p) => p.transfer.status(),
                None => return Err(Error::UnknownRequest { req: req.0 }),
            };
            if status.is_terminal() {
                if let Some(p) = reqs.remove(&req.0) {
                    reap(i, req, p.transfer);
                }
            }
            Ok(status)
        })
    }

    /// The state of every outstanding asynchronous request, in submission order (HIXL's
    /// "get all" `GetTransferStatus`): at most `args.max_query_count` results, without the
    /// waiting ones if `args.skip_waiting`. Requests returned with a terminal status are
    /// freed. Does not block.
    ///
    /// HIXL answers `UNSUPPORTED` here unless UB hardware (uboe/ub_rtp) is configured; hixl
    /// supports it on every transport.
    ///
    /// # Errors
    /// [`Error::NotInitialized`].
    pub fn get_all_transfer_status(
        &self,
        args: GetTransferStatusArgs,
    ) -> Result<Vec<TransferResult>> {
        self.with(|i| {
            let max = usize::try_from(args.max_query_count).unwrap_or(usize::MAX);
            let mut reqs = lock(&i.reqs);
            let mut out = Vec::new();
            let mut freed = Vec::new();
            for (&req, p) in reqs.iter() {
                if out.len() >= max {
                    break;
                }
                let status = p.transfer.status();
                if args.skip_waiting && status == TransferStatus::Waiting {
                    continue;
                }
                if status.is_terminal() {
                    freed.push(req);
                }
                out.push(TransferResult {
                    req: TransferReq(req),
                    user_data: p.user_data,
                    status,
                });
            }
            for req in freed {
                if let Some(p) = reqs.remove(&req) {
                    reap(i, TransferReq(req), p.transfer);
                }
            }
            Ok(out)
        })
    }

    /// Sends a notify to a server this engine is connected to and waits for its ack (HIXL
    /// `SendNotify`). The server reads it with [`Hixl::get_notifies`]. Send it after the
    /// transfer it announces has completed.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::NotConnected`], [`Error::NotifyTooLong`] (over 1024 bytes; `PARAM_INVALID`),
    /// [`Error::NotifyQueueFull`] (`RESOURCE_EXHAUSTED`: the server holds 4096 undrained
    /// notifies of ours), [`Error::Timeout`], the link's failure, or [`Error::InvalidParam`]
    /// from inside a tokio runtime.
    pub fn send_notify(
        &self,
        remote: &str,
        name: impl AsRef<[u8]>,
        msg: impl AsRef<[u8]>,
        timeout_ms: i32,
    ) -> Result<()> {
        self.with_blocking("send_notify", |i| {
            let t = check_timeout(timeout_ms)?;
            let peer = i.engine.peer(remote)?;
            let (name, msg) = (name.as_ref(), msg.as_ref());
            i.block_on("send_notify", peer.notify_timeout(name, msg, t))?
        })
    }

    /// Returns and clears every notify this engine's server side received (HIXL
    /// `GetNotifies`), oldest first. Does not block.
    ///
    /// # Errors
    /// [`Error::NotInitialized`].
    pub fn get_notifies(&self) -> Result<Vec<Notify>> {
        self.with(|i| Ok(i.engine.take_notifies()))
    }

    /// Whether a feature is supported (HIXL's static `GetCapability`; no `initialize`
    /// needed): [`FEATURE_SUPPORTED`] or [`FEATURE_NOT_SUPPORTED`]. An unknown non-negative
    /// feature is `Ok(FEATURE_NOT_SUPPORTED)`, as in HIXL.
    ///
    /// # Errors
    /// [`Error::InvalidParam`] (HIXL `PARAM_INVALID`) for a negative feature value.
    pub fn get_capability(feature: impl Into<i32>) -> Result<i32> {
        let feature = feature.into();
        if feature < 0 {
            return Err(Error::InvalidParam {
                what: format!("feature type {feature} is negative"),
            });
        }
        const AUTO_CONNECT: i32 = FeatureType::AutoConnect.code();
        const CLIENT_SERVER_COMM: i32 = FeatureType::ClientServerComm.code();
        Ok(match feature {
            // `AutoConnect=1` (or a configured channel pool): transfers connect lazily.
            AUTO_CONNECT | CLIENT_SERVER_COMM => FEATURE_SUPPORTED,
            _ => FEATURE_NOT_SUPPORTED,
        })
    }
}

/// Frees a request that reached a terminal status: polls it once so its op slot is released
/// now (a failed op's error is logged, as HIXL only reports the status).
fn reap(inner: &Inner, req: TransferReq, transfer: Transfer) {
    let _ctx = inner.rt.enter();
    if let Some(Err(e)) = transfer.now_or_never() {
        tracing::debug!(req = req.0, "asynchronous transfer failed: {e}");
    }
}
