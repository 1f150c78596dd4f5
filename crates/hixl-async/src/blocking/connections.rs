//! Connections of the blocking facade: `Connect`, `Disconnect` and their asynchronous forms.

use hixl_core::{AsyncConnectStatus, Error, Result};

use super::{check_timeout, Hixl};

impl Hixl {
    /// Connects to a server engine `"ip:port"` (HIXL `Connect`), fetching its memory table,
    /// within `timeout_ms` (HIXL's default is 1000; at least 200 is recommended).
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::AlreadyConnected`], [`Error::ConnectToSelf`], [`Error::InvalidAddress`],
    /// [`Error::Timeout`], [`Error::Io`] (refused), the peer's refusal, or
    /// [`Error::InsideRuntime`] from inside a tokio runtime.
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
    /// [`Error::InsideRuntime`] from inside a tokio runtime.
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
}
