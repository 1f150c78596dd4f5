//! `ConnectAsync` / `DisconnectAsync`: per-peer task queues and their statuses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_core::{AsyncConnectStatus, Error, Result};

use super::Engine;
use crate::sync::lock;

/// One peer's `ConnectAsync`/`DisconnectAsync` queue: tasks run in FIFO order on one worker;
/// the reported status is that of the latest task.
#[derive(Debug)]
pub(super) struct AsyncQueue {
    tx: tokio::sync::mpsc::UnboundedSender<AsyncTask>,
    status: Arc<Mutex<(u64, AsyncConnectStatus)>>,
    next: u64,
}

#[derive(Debug)]
enum AsyncTask {
    Connect(u64, Duration),
    Disconnect(u64, Duration),
}

impl Engine {
    /// Queues a connect to `remote` and returns at once (HIXL `ConnectAsync`). Tasks for one
    /// peer run in order; [`Engine::async_connect_status`] reports the latest one's state.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`], [`Error::InvalidAddress`], [`Error::ResourceExhausted`]
    /// past `connect_pool.task_queue_capacity` queued tasks.
    pub fn connect_async(&self, remote: &str, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidTimeout { millis: 0 });
        }
        self.queue_async(remote, |id| AsyncTask::Connect(id, timeout))
    }

    /// Queues a disconnect from `remote` (HIXL `DisconnectAsync`).
    ///
    /// # Errors
    /// As [`Engine::connect_async`].
    pub fn disconnect_async(&self, remote: &str, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidTimeout { millis: 0 });
        }
        self.queue_async(remote, |id| AsyncTask::Disconnect(id, timeout))
    }

    fn queue_async(&self, remote: &str, task: impl FnOnce(u64) -> AsyncTask) -> Result<()> {
        use std::sync::atomic::Ordering;
        self.check_open("asynchronous connect or disconnect refused")?;
        let key = self.key(remote)?;
        let cap = self.inner.options.global.connect_pool.task_queue_capacity as usize;
        if self.inner.async_pending.fetch_add(1, Ordering::SeqCst) >= cap {
            self.inner.async_pending.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::ResourceExhausted {
                what: format!("{cap} connect tasks are queued (connect_pool.task_queue_capacity)"),
            });
        }
        let mut queues = lock(&self.inner.async_conn);
        let q = queues
            .entry(key.clone())
            .or_insert_with(|| self.start_async_worker(&key));
        q.next += 1;
        let t = task(q.next);
        let pending = match t {
            AsyncTask::Connect(..) => AsyncConnectStatus::ConnectPending,
            AsyncTask::Disconnect(..) => AsyncConnectStatus::DisconnectPending,
        };
        *lock(&q.status) = (q.next, pending);
        if q.tx.send(t).is_err() {
            self.inner.async_pending.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::ShutDown {
                engine: self.inner.lcx.config.name.clone(),
                what: "asynchronous connect or disconnect refused",
            });
        }
        Ok(())
    }

    fn start_async_worker(&self, key: &str) -> AsyncQueue {
        use std::sync::atomic::Ordering;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<AsyncTask>();
        let status = Arc::new(Mutex::new((0u64, AsyncConnectStatus::NotConnect)));
        let (weak, st, key, pending) = (
            Arc::downgrade(&self.inner),
            status.clone(),
            key.to_string(),
            self.inner.async_pending.clone(),
        );
        tokio::spawn(async move {
            let set = |id: u64, v: AsyncConnectStatus| {
                let mut s = lock(&st);
                if s.0 == id {
                    s.1 = v;
                }
            };
            while let Some(task) = rx.recv().await {
                let Some(inner) = weak.upgrade() else { break };
                let engine = Engine { inner };
                match task {
                    AsyncTask::Connect(id, t) => {
                        set(id, AsyncConnectStatus::Connecting);
                        let r = engine.connect(&key, t).await;
                        let ok = matches!(r, Ok(_) | Err(Error::AlreadyConnected { .. }));
                        if let Err(e) = &r {
                            if !ok {
                                tracing::warn!(peer = %key, "async connect failed: {e}");
                            }
                        }
                        set(
                            id,
                            if ok {
                                AsyncConnectStatus::Connected
                            } else {
                                AsyncConnectStatus::ConnectFailed
                            },
                        );
                    }
                    AsyncTask::Disconnect(id, t) => {
                        set(id, AsyncConnectStatus::Disconnecting);
                        let _ = tokio::time::timeout(t, engine.disconnect(&key)).await;
                        set(id, AsyncConnectStatus::NotConnect);
                    }
                }
                pending.fetch_sub(1, Ordering::SeqCst);
            }
        });
        AsyncQueue {
            tx,
            status,
            next: 0,
        }
    }

    /// The state the latest `connect_async`/`disconnect_async` task for `remote` left (HIXL
    /// `GetAsyncConnectStatus`); without any, whether a live link exists.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`].
    pub fn async_connect_status(&self, remote: &str) -> Result<AsyncConnectStatus> {
        let key = self.key(remote)?;
        let queued = lock(&self.inner.async_conn)
            .get(&key)
            .map(|q| lock(&q.status).1);
        Ok(match queued {
            Some(AsyncConnectStatus::Connected) | None => match self.peer(&key) {
                Ok(p) if p.is_connected() => AsyncConnectStatus::Connected,
                _ if queued.is_some() => AsyncConnectStatus::ConnectFailed,
                _ => AsyncConnectStatus::NotConnect,
            },
            Some(s) => s,
        })
    }

    /// [`Engine::async_connect_status`] of every peer with a queue or a link.
    pub fn async_connect_statuses(&self) -> HashMap<String, AsyncConnectStatus> {
        let mut keys: Vec<String> = self.peers();
        keys.extend(lock(&self.inner.async_conn).keys().cloned());
        keys.into_iter()
            .filter_map(|k| Some((k.clone(), self.async_connect_status(&k).ok()?)))
            .collect()
    }
}
