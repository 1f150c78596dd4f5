//! The driver of one initiator's control connection on the target: it owns the connection
//! and its sans-io [`TargetSession`], feeds the session the frames, the time and the
//! commands of the engine (table updates, device keys, queue-pair answers, a `Disconnect`),
//! and carries out what the session asks for (frames to write, notifies to queue, transport
//! requests to hand to the transports). When the session ends, whatever ends it, the driver
//! removes it from the sessions and kills its state with the session's cause, so that its
//! data connections and the transports' channels of it end too.

use std::sync::Arc;

use bytes::BytesMut;
use hixl_core::session::{Admission, Config, Event, TargetSession};
use hixl_core::wire::Message;
use hixl_core::Error;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use super::{Server, HELLO_TIMEOUT};
use crate::clock::{now, sleep_until};
use crate::frame_io::{keep_alive, read_frame, write_frames};
use crate::transport::target::Session;

impl Server {
    /// Serves a control connection whose first frame, `hello`, was a control hello.
    pub(super) async fn serve_control(
        self: Arc<Self>,
        s: TcpStream,
        mut buf: BytesMut,
        from: String,
        hello: Message,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let id = loop {
            let id = crate::context::random_u64();
            if id != 0 && !self.cx.sessions.contains(id) {
                break id;
            }
        };
        let config = Config {
            handshake_timeout: Some(HELLO_TIMEOUT),
            // Notifies of a link also arrive over the fabric channel: the engine's queue
            // counts them all.
            notify_admission: Admission::Driver,
            ..self.config.session(self.instance)
        };
        let nonce = match self.config.nonce() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(peer = %from, "refusing: authentication unavailable: no random nonce: {e}");
                return;
            }
        };
        keep_alive(&s, &self.config.heartbeat);
        let mut session = TargetSession::new(config, now(), from.as_str(), id, nonce);
        let _ = session.handle_frame(now(), hello);
        let peer: Arc<str> = Arc::from(session.peer());
        let (tx, mut cmds) = mpsc::unbounded_channel();
        let sess = Arc::new(Session::new(id, peer.clone(), tx));
        let (mut r, w) = s.into_split();
        let (wtx, wrx) = mpsc::unbounded_channel::<BytesMut>();
        let writer = tokio::spawn(write_frames(w, wrx, sess.state.clone(), peer.clone()));
        let mut dead = sess.state.subscribe();
        let mut inserted = false;
        loop {
            while let Some(e) = session.poll_event() {
                self.on_event(&mut session, &sess, &mut inserted, e);
            }
            // What this turn queued goes to the writer as one buffer, one `send`.
            let mut b = BytesMut::new();
            while let Some(m) = session.poll_transmit() {
                m.encode(&mut b);
            }
            if !b.is_empty() {
                let _ = wtx.send(b);
            }
            if session.is_closed() {
                break;
            }
            let deadline = session.poll_timeout();
            tokio::select! {
                biased;
                c = cmds.recv() => match c {
                    Some(m) => {
                        if matches!(m, Message::Disconnect { .. }) {
                            self.farewell(&sess).await;
                        }
                        self.command(&mut session, &sess, m)
                    }
                    None => session.disconnect("session dropped"),
                },
                _ = dead.changed() => {
                    let cause = sess.state.error().unwrap_or_else(|| Error::NotConnected {
                        peer: peer.to_string(),
                    });
                    session.connection_lost(cause);
                }
                _ = shutdown.changed() => {
                    self.farewell(&sess).await;
                    session.disconnect("engine finalized")
                }
                m = read_frame(&mut r, &mut buf, &peer) => match m {
                    Ok(m) => {
                        let _ = session.handle_frame(now(), m);
                    }
                    Err(e) => session.connection_lost(e),
                },
                _ = sleep_until(deadline) => session.handle_timeout(now()),
            }
        }
        // The last frame (a Disconnect, a Refuse) is queued before the death is.
        while let Some(m) = session.poll_transmit() {
            let mut b = BytesMut::with_capacity(64);
            m.encode(&mut b);
            let _ = wtx.send(b);
        }
        drop(wtx);
        let cause = sess
            .state
            .error()
            .or_else(|| session.error().cloned())
            .unwrap_or_else(|| Error::NotConnected {
                peer: peer.to_string(),
            });
        match &cause {
            Error::Protocol { .. } | Error::AuthFailed { .. } => {
                tracing::warn!(peer = %peer, "closing session: {cause}")
            }
            Error::NotConnected { .. } => tracing::debug!(peer = %peer, "session closed"),
            _ => tracing::info!(peer = %peer, "closing session: {cause}"),
        }
        if inserted {
            self.cx.sessions.remove(id);
        }
        sess.state.kill(cause);
        let _ = writer.await;
        // Its data connections and transport channels end with it.
        sess.state.joined().await;
    }

    fn on_event(
        &self,
        session: &mut TargetSession,
        sess: &Arc<Session>,
        inserted: &mut bool,
        e: Event,
    ) {
        match e {
            Event::Welcomed { .. } => {
                // Inserted before the table goes, so that a concurrent registration's
                // broadcast reaches this initiator too; the transports this engine serves
                // are offered before the memory table.
                self.cx.sessions.insert(sess.clone());
                *inserted = true;
                for offer in self.transports.iter().filter_map(|t| t.offer()) {
                    if let Err(e) = session.offer(offer) {
                        tracing::warn!(peer = %sess.peer, "transport offer not sent: {e}");
                    }
                }
                let table = crate::sync::lock(&self.cx.regions).exported();
                let _ = session.send_table(now(), table);
                tracing::debug!(peer = %sess.peer, session = sess.id, "initiator connected");
            }
            Event::NotifyOffered { seq, notify } => {
                let status = self.cx.notifies.deliver(notify);
                let _ = session.ack_notify_status(seq, status);
            }
            Event::TransportMessage(m) => {
                let taken = self
                    .transports
                    .iter()
                    .any(|t| t.on_control(&self.cx, sess, &m));
                if !taken {
                    // Only a peer that ignored our offers asks for a transport we do not
                    // serve; it hears UNSUPPORTED.
                    let reason = "this engine does not offer that transport";
                    tracing::info!(peer = %sess.peer, "refusing {}: {reason}", short(&m));
                    let _ = session.refuse_transport(&m, reason);
                }
            }
            Event::Closed(_)
            | Event::Authenticated
            | Event::RevokeAcked { .. }
            | Event::NotifyReceived(_)
            | Event::TransportOffer(_)
            | Event::Table(_)
            | Event::TableUpdated(_)
            | Event::NotifyAcked { .. }
            | Event::Synced { .. }
            | Event::Revoked { .. } => {}
        }
    }

    /// Before a goodbye: what the transports' channels queued for this initiator (notify
    /// acks on the fabric channel) goes out first, so that a notify the application saw is
    /// never reported failed to its sender because the engine closed right after.
    async fn farewell(&self, sess: &Session) {
        for t in self.transports.iter() {
            t.farewell(sess).await;
        }
    }

    /// A frame the engine or a transport asks to send to this initiator.
    fn command(&self, session: &mut TargetSession, sess: &Session, m: Message) {
        let r = match m {
            Message::MemTable(t) => session.send_table(now(), t),
            Message::Disconnect { reason } => {
                session.disconnect(&reason);
                Ok(())
            }
            Message::Revoke { rkey } => session.revoke(rkey),
            m => session.send_transport(m),
        };
        if let Err(e) = r {
            if !session.is_closed() {
                tracing::warn!(peer = %sess.peer, "frame not sent: {e}");
            }
        }
    }
}

/// A frame's kind for a log line (never its payload in full).
fn short(m: &Message) -> String {
    let s = format!("{m:?}");
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}
