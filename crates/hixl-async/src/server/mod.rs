//! The target's side: accepting connections, routing each by its hello (a control
//! connection gets a session driver, in [`control`]; a data connection serves the TCP data
//! path of its session), broadcasting memory-table changes and revocations.

mod control;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{version_refusal, Channel, Message};
use hixl_core::{Error, Result};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use crate::context::{EngineConfig, Regions};
use crate::frame_io::{read_frame, take_ready, tune};
use crate::notify::NotifyQueue;
use crate::transport::target::{Sessions, TargetCx};
use crate::transport::{Accepted, Transport};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The listening side of an engine.
#[derive(Debug)]
pub(crate) struct Server {
    config: Arc<EngineConfig>,
    /// The transports this engine serves, TCP among them.
    transports: Arc<Vec<Arc<dyn Transport>>>,
    instance: u64,
    /// What the transports serve their peers with (the sessions among it).
    pub(crate) cx: TargetCx,
}

impl Server {
    pub(crate) fn new(
        config: Arc<EngineConfig>,
        transports: Arc<Vec<Arc<dyn Transport>>>,
        regions: Regions,
        notifies: Arc<NotifyQueue>,
        instance: u64,
        tasks: TaskTracker,
    ) -> Arc<Server> {
        let cx = TargetCx {
            sessions: Arc::new(Sessions::default()),
            regions,
            notifies,
            served: Arc::default(),
            tasks,
        };
        Arc::new(Server {
            config,
            transports,
            instance,
            cx,
        })
    }

    /// Starts the transports' own listeners (the fabric channel's).
    ///
    /// # Errors
    /// A transport that cannot listen.
    pub(crate) fn listen_transports(&self, shutdown: &watch::Receiver<bool>) -> Result<()> {
        for t in self.transports.iter() {
            t.listen(&self.cx, shutdown.clone())?;
        }
        Ok(())
    }

    /// Accepts connections until shutdown.
    pub(crate) async fn accept_loop(
        self: Arc<Self>,
        l: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                r = l.accept() => match r {
                    Ok((s, from)) => {
                        // Each connection watches the shutdown itself: a session's driver
                        // still says goodbye to its initiator. The engine's shutdown joins it.
                        let conn = self.clone().handle(s, from.to_string(), shutdown.clone());
                        self.cx.tasks.spawn(conn);
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                _ = shutdown.changed() => break,
            }
        }
        self.close_all("engine finalized");
    }

    /// Tells every connected initiator that we are going away (each session's driver sends
    /// the `Disconnect` and ends the session).
    pub(crate) fn close_all(&self, reason: &str) {
        for s in self.cx.sessions.drain() {
            let cause = Error::NotConnected {
                peer: s.peer.to_string(),
            };
            s.state.doom(cause.clone());
            if !s.send(&Message::Disconnect {
                reason: reason.into(),
            }) {
                s.state.kill(cause);
            }
        }
    }

    /// Sends the current memory table to every connected initiator (preceded, on verbs
    /// links, by the regions' device keys, so that a region is never in an initiator's table
    /// without its key).
    ///
    /// `added`: a region was registered, so the transports' channels learn of it too (the
    /// fabric sends its memfd); after a deregistration, [`Server::revoke`] does their part.
    pub(crate) fn broadcast_table(&self, added: bool) {
        let regions = crate::sync::lock(&self.cx.regions);
        let table = Message::MemTable(regions.exported());
        for sess in self.cx.sessions.all() {
            for t in self.transports.iter() {
                if let Some(m) = t.before_table(&sess, &regions) {
                    sess.send(&m);
                }
            }
            sess.send(&table);
        }
        drop(regions);
        if added {
            for t in self.transports.iter() {
                t.table_changed(&self.cx);
            }
        }
    }

    /// A region is being deregistered: waits until every transport's peers stopped touching
    /// it.
    pub(crate) async fn revoke(&self, rkey: u64) {
        for t in self.transports.iter() {
            t.revoke(&self.cx, rkey).await;
        }
    }

    async fn handle(
        self: Arc<Self>,
        mut s: TcpStream,
        from: String,
        shutdown: watch::Receiver<bool>,
    ) {
        tune(&s);
        let mut buf = BytesMut::new();
        // The hello has often arrived with the connection (see `take_ready`).
        take_ready(&s, &mut buf);
        let mut sd = shutdown.clone();
        let hello = tokio::select! {
            m = tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut s, &mut buf, &from)) => m,
            _ = sd.changed() => return,
        };
        let hello = match hello {
            Ok(Ok(m)) => m,
            Ok(Err(e @ Error::WireVersion { theirs, .. })) => {
                // Answered in the peer's framing, so that it can report why (see
                // `hixl_core::wire::version_refusal`).
                tracing::warn!(peer = %from, "refusing connection: {e}");
                let _ = s.write_all(&version_refusal(theirs)).await;
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(peer = %from, "closing connection before hello: {e}");
                return;
            }
            Err(_) => {
                tracing::warn!(peer = %from, "closing connection: no hello within {HELLO_TIMEOUT:?}");
                return;
            }
        };
        match hello {
            m @ Message::Hello {
                channel: Channel::Control,
                ..
            } => self.serve_control(s, buf, from, m, shutdown).await,
            Message::Hello {
                engine,
                channel,
                session,
                ..
            } => {
                let Some(t) = self.transports.iter().find(|t| t.takes(channel)) else {
                    tracing::warn!(peer = %from, "closing connection: no transport takes a {channel:?} channel over TCP");
                    return;
                };
                let c = Accepted {
                    stream: s,
                    buf,
                    from,
                    engine,
                    session,
                    config: &self.config,
                    instance: self.instance,
                };
                t.serve(&self.cx, c).await;
            }
            m => {
                tracing::warn!(peer = %from, "closing connection: expected hello, got {m:?}");
            }
        }
    }
}
