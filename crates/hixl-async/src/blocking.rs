//! Blocking facade with HIXL's method set, for callers without a tokio runtime.
//!
//! [`Hixl`] mirrors HIXL's `hixl::Hixl` class (and its Python binding): `initialize`,
//! `register_mem`, `connect`, `transfer_sync`, `transfer_async` + `get_transfer_status`,
//! `send_notify` + `get_notifies`, `finalize`. It owns a private two-thread tokio runtime and
//! an [`Engine`]; every call returns a [`hixl_core::Result`] whose error maps onto HIXL's
//! status code through [`Error::status`].

mod connections;
mod lifecycle;
mod notifies;
mod registration;
mod runtime;
mod transfers;
mod types;

pub use types::{
    FeatureType, GetTransferStatusArgs, MemHandle, TransferReq, TransferResult,
    FEATURE_NOT_SUPPORTED, FEATURE_SUPPORTED, MAX_OUTSTANDING_REQUESTS,
};

use std::sync::atomic::AtomicU64;
use std::sync::{RwLock, RwLockReadGuard};
use std::time::Duration;

use hixl_core::{Error, Result};

use self::runtime::{not_in_runtime, Inner};
#[cfg(doc)]
use crate::Engine;

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
/// return [`Error::InsideRuntime`] there instead of blocking a worker (use the async
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
        crate::sync::read(&self.state)
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

    /// Whether a feature is supported (HIXL's static `GetCapability`; no `initialize`
    /// needed): [`FEATURE_SUPPORTED`] or [`FEATURE_NOT_SUPPORTED`]. An unknown non-negative
    /// feature is `Ok(FEATURE_NOT_SUPPORTED)`, as in HIXL.
    ///
    /// # Errors
    /// [`Error::InvalidFeature`] (HIXL `PARAM_INVALID`) for a negative feature value.
    pub fn get_capability(feature: impl Into<i32>) -> Result<i32> {
        let feature = feature.into();
        if feature < 0 {
            return Err(Error::InvalidFeature { feature });
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
