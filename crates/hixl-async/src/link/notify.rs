//! Notifies over the control connection: sending, the bound on pending notifies, and acks.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::Message;
use hixl_core::{Error, Result, Status, NOTIFY_MAX_LEN, NOTIFY_MAX_PENDING};
use tokio::sync::oneshot;

use super::{poisoned, refusal, Link};

impl Link {
    /// Sends a notify and waits for the peer's ack.
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
        let seq = self.notify_seq.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.notify_waiters
            .lock()
            .map_err(|_| poisoned())?
            .insert(seq, tx);
        let m = Message::Notify {
            seq,
            name: name.to_vec(),
            msg: msg.to_vec(),
        };
        let forget = || {
            if let Ok(mut w) = self.notify_waiters.lock() {
                w.remove(&seq);
            }
        };
        if !self.send_notify_frame(m) {
            forget();
            return Err(self.lost("control connection closed"));
        }
        let status = tokio::select! {
            r = rx => r.map_err(|_| self.lost("control connection closed"))?,
            _ = tokio::time::sleep(timeout) => {
                forget();
                return Err(Error::Timeout { what: "notify", peer: self.name.to_string(), after: timeout });
            }
            _ = self.state.dead() => {
                forget();
                return Err(self.lost("link closed"));
            }
        };
        match Status::from_code(status) {
            Some(Status::Success) => Ok(()),
            Some(Status::ResourceExhausted) => Err(Error::NotifyQueueFull {
                peer: self.name.to_string(),
                limit: NOTIFY_MAX_PENDING,
            }),
            _ => Err(refusal(&self.name, status, "notify refused".into())),
        }
    }

    /// Notifies take the fabric channel when there is one (the fast path), else the control
    /// connection. Either way they are sent only after the caller saw its transfers complete.
    fn send_notify_frame(&self, m: Message) -> bool {
        if let Some(ch) = self.channels.first() {
            // Only the first channel can carry notifies (the fabric's, which follows its
            // copies); with another, the control connection carries them.
            if let Some(sent) = ch.send_notify(m.clone()) {
                return sent;
            }
        }
        let mut frame = BytesMut::with_capacity(64);
        m.encode(&mut frame);
        self.control.send(frame).is_ok()
    }

    pub(super) fn notify_acked(&self, seq: u64, status: u32) {
        let w = self
            .notify_waiters
            .lock()
            .ok()
            .and_then(|mut w| w.remove(&seq));
        if let Some(w) = w {
            let _ = w.send(status);
        }
    }
}
