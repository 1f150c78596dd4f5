//! Received notifies: a bounded queue per sending peer, consumed as a `Stream` or drained at
//! once (HIXL `GetNotifies`).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll, Waker};

use futures::Stream;
use hixl_core::{Error, Notify, Result, Status, NOTIFY_MAX_PENDING};

use crate::sync::{lock, read, write};

/// A served notify's handler: runs on the task that received the notify, must not block, and
/// its status is the sender's answer (see [`crate::Engine::serve_notifies`]).
pub type NotifyHandler = dyn Fn(&Notify) -> Status + Send + Sync;

#[derive(Default)]
struct Handlers {
    next: u64,
    by_prefix: Vec<(u64, Vec<u8>, Arc<NotifyHandler>)>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.by_prefix
                    .iter()
                    .map(|(_, p, _)| String::from_utf8_lossy(p).into_owned()),
            )
            .finish()
    }
}

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<Notify>,
    /// Undrained notifies per link (not per engine name: client-only engines on one host
    /// share their name).
    pending: HashMap<u64, usize>,
    wakers: Vec<Waker>,
    closed: bool,
}

/// The engine's inbox of notifies from all peers.
#[derive(Debug, Default)]
pub(crate) struct NotifyQueue {
    inner: Mutex<Inner>,
    handlers: RwLock<Handlers>,
}

/// While it lives, notifies whose name starts with its prefix go to its handler instead of the
/// inbox; dropping it ends that.
#[derive(Debug)]
pub struct NotifyService {
    queue: Arc<NotifyQueue>,
    id: u64,
}

impl Drop for NotifyService {
    fn drop(&mut self) {
        write(&self.queue.handlers)
            .by_prefix
            .retain(|(id, _, _)| *id != self.id);
    }
}

impl NotifyQueue {
    /// Routes names starting with `prefix` to `f`.
    pub(crate) fn serve(
        self: &Arc<Self>,
        prefix: Vec<u8>,
        f: Arc<NotifyHandler>,
    ) -> Result<NotifyService> {
        let mut h = write(&self.handlers);
        if prefix.is_empty() {
            return Err(Error::InvalidParam {
                what: "notify service prefix is empty (it would take every notify)".into(),
            });
        }
        if let Some((_, p, _)) = h
            .by_prefix
            .iter()
            .find(|(_, p, _)| p.starts_with(&prefix) || prefix.starts_with(p))
        {
            return Err(Error::InvalidParam {
                what: format!(
                    "notify service prefix {:?} overlaps the served prefix {:?}",
                    String::from_utf8_lossy(&prefix),
                    String::from_utf8_lossy(p)
                ),
            });
        }
        h.next += 1;
        let id = h.next;
        h.by_prefix.push((id, prefix, f));
        Ok(NotifyService {
            queue: self.clone(),
            id,
        })
    }

    /// Delivers a received notify: to the handler serving its name (whose status is the
    /// answer), else into the inbox (`SUCCESS`, or `RESOURCE_EXHAUSTED` past the budget).
    pub(crate) fn deliver(&self, n: Notify) -> Status {
        let served = read(&self.handlers)
            .by_prefix
            .iter()
            .find(|(_, p, _)| n.name.starts_with(p))
            .map(|(_, _, f)| f.clone());
        match served {
            Some(f) => f(&n),
            None if self.offer(n) => Status::Success,
            None => Status::ResourceExhausted,
        }
    }

    /// Queues a notify; `false` if its sender already has the maximum pending.
    pub(crate) fn offer(&self, n: Notify) -> bool {
        let wakers = {
            let mut g = lock(&self.inner);
            let c = g.pending.entry(n.link).or_insert(0);
            if *c >= NOTIFY_MAX_PENDING {
                return false;
            }
            *c += 1;
            g.queue.push_back(n);
            std::mem::take(&mut g.wakers)
        };
        for w in wakers {
            w.wake();
        }
        true
    }

    fn pop_locked(g: &mut Inner) -> Option<Notify> {
        let n = g.queue.pop_front()?;
        if let Some(c) = g.pending.get_mut(&n.link) {
            *c -= 1;
            if *c == 0 {
                g.pending.remove(&n.link);
            }
        }
        Some(n)
    }

    /// Takes a notify frame from `peer` on `link` and returns the ack to send back (a served
    /// name's status, or RESOURCE_EXHAUSTED when that link already has the maximum pending).
    /// The fabric channel's path (the control connection's goes through its session).
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn receive(
        &self,
        peer: &str,
        link: u64,
        seq: u64,
        name: Vec<u8>,
        msg: Vec<u8>,
    ) -> hixl_core::wire::Message {
        let status = self.deliver(Notify {
            from: peer.to_string(),
            link,
            name,
            msg,
        });
        hixl_core::wire::Message::NotifyAck {
            seq,
            status: status.code(),
        }
    }

    /// Returns and clears every queued notify.
    pub(crate) fn drain(&self) -> Vec<Notify> {
        let mut g = lock(&self.inner);
        g.pending.clear();
        g.queue.drain(..).collect()
    }

    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Notify>> {
        let mut g = lock(&self.inner);
        if let Some(n) = Self::pop_locked(&mut g) {
            return Poll::Ready(Some(n));
        }
        if g.closed {
            return Poll::Ready(None);
        }
        if !g.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            g.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Ends every stream (engine shutdown).
    pub(crate) fn close(&self) {
        let wakers = {
            let mut g = lock(&self.inner);
            g.closed = true;
            std::mem::take(&mut g.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }
}

/// A `Stream` of notifies received by this engine, in arrival order. Several streams share one
/// inbox: each notify goes to exactly one of them.
#[derive(Debug, Clone)]
pub struct NotifyStream {
    pub(crate) queue: Arc<NotifyQueue>,
}

impl Stream for NotifyStream {
    type Item = Notify;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Notify>> {
        self.queue.poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn n(from: &str, i: usize) -> Notify {
        n_on(from, from.bytes().fold(7, |h, b| h * 31 + u64::from(b)), i)
    }

    fn n_on(from: &str, link: u64, i: usize) -> Notify {
        Notify {
            from: from.into(),
            link,
            name: b"n".to_vec(),
            msg: i.to_string().into_bytes(),
        }
    }

    #[test]
    fn per_peer_limit_and_drain() {
        let q = NotifyQueue::default();
        for i in 0..NOTIFY_MAX_PENDING {
            assert!(q.offer(n("a", i)));
        }
        assert!(!q.offer(n("a", 0)));
        assert!(q.offer(n("b", 0)), "another peer has its own budget");
        assert_eq!(q.drain().len(), NOTIFY_MAX_PENDING + 1);
        assert!(q.offer(n("a", 0)));
    }

    #[test]
    fn two_links_with_one_engine_name_have_their_own_budgets() {
        let q = NotifyQueue::default();
        for i in 0..NOTIFY_MAX_PENDING {
            assert!(q.offer(n_on("10.0.0.1", 7, i)));
        }
        assert!(!q.offer(n_on("10.0.0.1", 7, 0)));
        assert!(
            q.offer(n_on("10.0.0.1", 8, 0)),
            "the other link is not charged"
        );
    }

    #[tokio::test]
    async fn stream_in_order_and_ends_on_close() {
        let q = Arc::new(NotifyQueue::default());
        let mut s = NotifyStream { queue: q.clone() };
        q.offer(n("a", 1));
        q.offer(n("a", 2));
        assert_eq!(s.next().await.unwrap().msg, b"1");
        assert_eq!(s.next().await.unwrap().msg, b"2");
        let q2 = q.clone();
        tokio::spawn(async move { q2.offer(n("a", 3)) });
        assert_eq!(s.next().await.unwrap().msg, b"3");
        q.close();
        assert!(s.next().await.is_none());
    }
}
