//! The target's side: accepting connections, sessions for connected initiators, their control
//! channel (notifies, memory-table updates) and their data connections.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, Message};
use hixl_core::{Error, Result, Status};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::context::Shared;
use crate::frame_io::{read_frame, tune, write_frame, write_frames};
use crate::transport::target::{Session, Sessions, TargetCx};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The listening side of an engine.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) shared: Arc<Shared>,
    instance: u64,
    /// What the transports serve their peers with (the sessions among it).
    pub(crate) cx: TargetCx,
}

impl Server {
    pub(crate) fn new(shared: Arc<Shared>, instance: u64) -> Arc<Server> {
        let cx = TargetCx {
            sessions: Arc::new(Sessions::default()),
            regions: shared.regions.clone(),
            notifies: shared.notifies.clone(),
        };
        Arc::new(Server {
            shared,
            instance,
            cx,
        })
    }

    /// Starts the transports' own listeners (the fabric channel's).
    ///
    /// # Errors
    /// A transport that cannot listen.
    pub(crate) fn listen_transports(&self, shutdown: &watch::Receiver<bool>) -> Result<()> {
        for t in &self.shared.transports {
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
                        let me = self.clone();
                        let sd = shutdown.clone();
                        tokio::spawn(async move {
                            let mut sd = sd;
                            tokio::select! {
                                _ = me.handle(s, from.to_string()) => {}
                                _ = sd.changed() => {}
                            }
                        });
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

    /// Tells every connected initiator that we are going away.
    pub(crate) fn close_all(&self, reason: &str) {
        for s in self.cx.sessions.drain() {
            s.send(&Message::Disconnect {
                reason: reason.into(),
            });
            s.state.kill(Error::NotConnected {
                peer: s.peer.to_string(),
            });
        }
    }

    /// Sends the current memory table to every connected initiator (preceded, on verbs
    /// links, by the regions' device keys, so that a region is never in an initiator's table
    /// without its key).
    ///
    /// `added`: a region was registered, so the transports' channels learn of it too (the
    /// fabric sends its memfd); after a deregistration, [`Server::revoke`] does their part.
    pub(crate) fn broadcast_table(&self, added: bool) {
        let Ok(regions) = self.shared.regions.lock() else {
            return;
        };
        let mut b = BytesMut::new();
        Message::MemTable(regions.exported()).encode(&mut b);
        for sess in self.cx.sessions.all() {
            for t in &self.shared.transports {
                if let Some(m) = t.before_table(&sess, &regions) {
                    sess.send(&m);
                }
            }
            sess.send_encoded(b.clone());
        }
        drop(regions);
        if added {
            for t in &self.shared.transports {
                t.table_changed(&self.cx);
            }
        }
    }

    /// A region is being deregistered: waits until every transport's peers stopped touching
    /// it.
    pub(crate) async fn revoke(&self, rkey: u64) {
        for t in &self.shared.transports {
            t.revoke(&self.cx, rkey).await;
        }
    }

    async fn refuse(s: &mut TcpStream, status: Status, reason: String, peer: &str) {
        tracing::info!(peer, "refusing connection: {reason}");
        let _ = write_frame(
            s,
            &Message::Refuse {
                status: status.code(),
                reason,
            },
            peer,
        )
        .await;
    }

    async fn handle(self: Arc<Self>, mut s: TcpStream, from: String) {
        tune(&s);
        let mut buf = BytesMut::with_capacity(4096);
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, read_frame(&mut s, &mut buf, &from))
            .await
        {
            Ok(Ok(m)) => m,
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
            Message::Hello {
                engine,
                channel: Channel::Control,
                session: nonce,
            } => {
                if nonce == self.instance {
                    tracing::info!(engine = %engine, "refusing a connect to self");
                    let reason = hixl_core::wire::REFUSE_SELF.to_string();
                    return Self::refuse(&mut s, Status::ParamInvalid, reason, &from).await;
                }
                if let Some(secret) = &self.shared.auth {
                    if !Self::authenticate(&mut s, &mut buf, &from, &engine, secret).await {
                        return;
                    }
                }
                self.serve_control(s, buf, Arc::from(engine.as_str())).await
            }
            Message::Hello {
                engine,
                channel: Channel::Data,
                session,
            } => {
                let sess = self.cx.sessions.get(session);
                let sess = match sess {
                    Some(x) if *x.peer == *engine && buf.is_empty() => x,
                    _ => {
                        let reason = format!("no session {session:#x} for engine {engine}");
                        return Self::refuse(&mut s, Status::NotConnected, reason, &from).await;
                    }
                };
                let welcome = Message::Welcome {
                    engine: self.shared.name.clone(),
                    session,
                };
                if write_frame(&mut s, &welcome, &from).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = crate::tcp::target::serve(s, sess.peer.clone(), self.shared.clone()) => {}
                    _ = sess.state.dead() => {}
                }
            }
            m => {
                tracing::warn!(peer = %from, "closing connection: expected hello, got {m:?}");
            }
        }
    }

    /// The target's half of the challenge-response of [`hixl_core::auth`]; true when the
    /// initiator proved it knows the secret (and our proof is sent). Otherwise the initiator
    /// has been refused with the reason, which is also logged.
    async fn authenticate(
        s: &mut TcpStream,
        buf: &mut BytesMut,
        from: &str,
        engine: &str,
        secret: &hixl_core::auth::Secret,
    ) -> bool {
        use hixl_core::auth::{nonce, NONCE_LEN};
        let nt = match nonce() {
            Ok(n) => n,
            Err(e) => {
                let reason = format!("authentication unavailable: no random nonce: {e}");
                Self::refuse(s, Status::Failed, reason, from).await;
                return false;
            }
        };
        let challenge = Message::AuthChallenge { nonce: nt.to_vec() };
        if write_frame(s, &challenge, from).await.is_err() {
            return false;
        }
        let m = tokio::time::timeout(HELLO_TIMEOUT, read_frame(s, buf, from)).await;
        let reason = match m {
            Ok(Ok(Message::AuthResponse { mac, .. })) if mac.is_empty() => format!(
                "authentication required: this engine has a shared secret and {engine} sent no proof (set hixl.AuthSecret or HIXL_AUTH_SECRET on it)"
            ),
            Ok(Ok(Message::AuthResponse { nonce, mac }))
                if nonce.len() == NONCE_LEN && secret.verify_initiator(&nt, &nonce, &mac) =>
            {
                let proof = Message::AuthProof {
                    mac: secret.target_mac(&nt, &nonce).to_vec(),
                };
                return write_frame(s, &proof, from).await.is_ok();
            }
            Ok(Ok(Message::AuthResponse { .. })) => format!(
                "authentication failed: the proof from {engine} does not match this engine's shared secret"
            ),
            Ok(Ok(m)) => format!("authentication failed: expected an answer to the challenge, got {m:?}"),
            Ok(Err(e)) => {
                tracing::warn!(peer = %from, engine, "authentication: connection lost: {e}");
                return false;
            }
            Err(_) => format!("authentication failed: no answer within {HELLO_TIMEOUT:?}"),
        };
        tracing::warn!(peer = %from, engine, "refusing: {reason}");
        Self::refuse(s, Status::Failed, reason, from).await;
        false
    }

    async fn serve_control(self: Arc<Self>, mut s: TcpStream, mut buf: BytesMut, peer: Arc<str>) {
        let id = loop {
            let id = crate::context::random_u64();
            if id != 0 && !self.cx.sessions.contains(id) {
                break id;
            }
        };
        let welcome = Message::Welcome {
            engine: self.shared.name.clone(),
            session: id,
        };
        let (tx, rx) = mpsc::unbounded_channel::<BytesMut>();
        let sess = Arc::new(Session::new(id, peer.clone(), tx));
        // Insert before sending the table so a concurrent registration's broadcast reaches
        // this peer too.
        self.cx.sessions.insert(sess.clone());
        let table = self
            .shared
            .regions
            .lock()
            .map(|r| r.exported())
            .unwrap_or_default();
        // The transports this engine serves are offered before the memory table.
        let mut frames = vec![welcome];
        frames.extend(self.shared.transports.iter().filter_map(|t| t.offer()));
        frames.push(Message::MemTable(table));
        for f in &frames {
            if write_frame(&mut s, f, &peer).await.is_err() {
                self.drop_session(id, &sess, "handshake failed");
                return;
            }
        }
        tracing::debug!(peer = %peer, session = id, "initiator connected");
        let (mut r, w) = s.into_split();
        let writer = tokio::spawn(write_frames(w, rx, sess.state.clone(), peer.clone()));
        // Our own probes: the initiator answers them, so a dead initiator or a cut network is
        // noticed within interval × miss limit even when the initiator sends nothing.
        let hb = self.shared.heartbeat;
        let mut tick = tokio::time::interval(hb.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_rx = tokio::time::Instant::now();
        let mut seq = 0u64;
        let reason = loop {
            let m = tokio::select! {
                m = read_frame(&mut r, &mut buf, &peer) => m,
                _ = sess.state.dead() => break "closed".to_string(),
                _ = tick.tick() => {
                    let silent = last_rx.elapsed();
                    if silent > hb.bound() {
                        let e = hb.lost(&peer, silent);
                        tracing::warn!(peer = %peer, "closing session: {e}");
                        break e.to_string();
                    }
                    seq = (seq + 1) | hixl_core::wire::HEARTBEAT_FROM_TARGET;
                    let mut b = BytesMut::with_capacity(24);
                    Message::Heartbeat { seq }.encode(&mut b);
                    let _ = sess.send_encoded(b);
                    continue;
                }
            };
            if m.is_ok() {
                last_rx = tokio::time::Instant::now();
            }
            match m {
                Ok(Message::Notify { seq, name, msg }) => {
                    let mut b = BytesMut::new();
                    self.shared
                        .notifies
                        .receive(&peer, id, seq, name, msg)
                        .encode(&mut b);
                    let _ = sess.send_encoded(b);
                }
                Ok(Message::Heartbeat { seq }) => {
                    // Answer the initiator's probes, not the answers to ours.
                    if seq & hixl_core::wire::HEARTBEAT_FROM_TARGET == 0 {
                        let mut b = BytesMut::new();
                        Message::Heartbeat { seq }.encode(&mut b);
                        let _ = sess.send_encoded(b);
                    }
                }
                Ok(Message::Disconnect { reason }) => break format!("peer disconnected: {reason}"),
                Ok(m @ Message::VerbsConnect { .. })
                    if self
                        .shared
                        .transports
                        .iter()
                        .any(|t| t.on_control(&self.cx, &sess, &m)) => {}
                // A transport request of a transport this build does not have.
                Ok(Message::VerbsConnect { .. }) => {
                    let reason = "this build has no verbs backend".to_string();
                    tracing::info!(peer = %sess.peer, "refusing a queue pair: {reason}");
                    sess.send(&Message::VerbsAccept {
                        status: Status::Unsupported.code(),
                        endpoint: Vec::new(),
                        reason,
                    });
                }
                Ok(m) => {
                    let e = format!("unexpected {m:?} on the control connection");
                    tracing::warn!(peer = %peer, "closing session: {e}");
                    break e;
                }
                Err(e) => {
                    if matches!(e, Error::Protocol { .. }) {
                        tracing::warn!(peer = %peer, "closing session: {e}");
                    }
                    break e.to_string();
                }
            }
        };
        self.drop_session(id, &sess, &reason);
        let _ = writer.await;
    }

    fn drop_session(&self, id: u64, sess: &Session, reason: &str) {
        self.cx.sessions.remove(id);
        sess.state.kill(Error::PeerLost {
            peer: sess.peer.to_string(),
            cause: reason.to_string(),
        });
    }
}
