//! `initialize` and `finalize`: starting and stopping the runtime and engine.

use std::collections::BTreeMap;
use std::sync::Mutex;

use hixl_core::{Error, Result};

use super::runtime::{lock, not_in_runtime, Inner};
use super::Hixl;
use crate::Engine;

impl Hixl {
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
    /// [`Error::InsideRuntime`] when called from inside a tokio runtime.
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
        let mut g = crate::sync::write(&self.state);
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
        let mut g = crate::sync::write(&self.state);
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
}
