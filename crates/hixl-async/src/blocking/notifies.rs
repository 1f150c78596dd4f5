//! Notifies of the blocking facade (HIXL `SendNotify` / `GetNotifies`).

#[cfg(doc)]
use hixl_core::Error;
use hixl_core::{Notify, Result};

use super::{check_timeout, Hixl};

impl Hixl {
    /// Sends a notify to a server this engine is connected to and waits for its ack (HIXL
    /// `SendNotify`). The server reads it with [`Hixl::get_notifies`]. Send it after the
    /// transfer it announces has completed.
    ///
    /// # Errors
    /// [`Error::NotInitialized`], [`Error::InvalidTimeout`] for `timeout_ms <= 0`,
    /// [`Error::NotConnected`], [`Error::NotifyTooLong`] (over 1024 bytes; `PARAM_INVALID`),
    /// [`Error::NotifyQueueFull`] (`RESOURCE_EXHAUSTED`: the server holds 4096 undrained
    /// notifies of ours), [`Error::Timeout`], the link's failure, or [`Error::InsideRuntime`]
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
}
