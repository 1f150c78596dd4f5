//! Notifies: handed to the link's driver, whose session numbers them, bounds how many wait
//! for an ack, and resolves each with its ack or the link's cause.

use std::sync::atomic::Ordering;
use std::time::Duration;

use hixl_core::{Error, Result, NOTIFY_MAX_LEN};
use tokio::sync::oneshot;

use super::driver::Command;
use super::Link;

/// Counts a waiting notify for [`Link::in_flight`] while it lives.
struct Waiting<'a>(&'a Link);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.notifies_waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Link {
    /// Sends a notify and waits for the peer's ack.
    ///
    /// # Errors
    /// [`Error::NotifyTooLong`], [`Error::NotifyQueueFull`] (the peer's queue for this link
    /// is full, or this link has as many notifies waiting for acks), [`Error::Timeout`] after
    /// `timeout`, the peer's refusal, or the link's cause.
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
        self.notifies_waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(self);
        let (reply, rx) = oneshot::channel();
        let cmd = Command::Notify {
            name: name.to_vec(),
            msg: msg.to_vec(),
            reply,
        };
        if self.driver.send(cmd).is_err() {
            return Err(self.lost("control connection closed"));
        }
        tokio::select! {
            r = rx => r.unwrap_or_else(|_| Err(self.lost("control connection closed"))),
            // Dropping `rx` tells the driver to forget the notify: a late ack is ignored.
            _ = tokio::time::sleep(timeout) => Err(Error::Timeout {
                what: "notify",
                peer: self.name.to_string(),
                after: timeout,
            }),
        }
    }

    /// A notify sent over a channel was acked there.
    pub(super) fn notify_acked(&self, seq: u64, status: u32) {
        let _ = self.driver.send(Command::Acked { seq, status });
    }
}
