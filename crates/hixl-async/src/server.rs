//! The target's side: accepting connections, sessions for connected initiators, their control
//! channel (notifies, memory-table updates) and their data connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, Message};
use hixl_core::{Error, Status};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::engine::Shared;
use crate::frame_io::{read_frame, tune, write_frame, write_frames};
use crate::link_state::LinkState;

/// `(rkey, device rkey)` of every exported region registered with the RDMA device.
fn device_keys(r: &hixl_core::RegionTable<Arc<crate::memory::RegionInner>>) -> Vec<(u64, u32)> {
    r.iter()
        .filter(|e| e.access.is_remote())
        .filter_map(|e| Some((e.rkey, e.data.dev_rkey?)))
        .collect()
}

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// One connected initiator.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) peer: Arc<str>,
    pub(crate) state: Arc<LinkState>,
    control: mpsc::UnboundedSender<BytesMut>,
    /// The same-host fabric channel, once the initiator opened it.
    #[cfg(feature = "fabric")]
    pub(crate) fabric: Mutex<Option<Arc<crate::fabric::server::FabricChan>>>,
    /// The target's end of the initiator's RC queue pair, once it asked for one. Nothing is
    /// posted on it; it lives as long as the session.
    #[cfg(feature = "verbs")]
    verbs: Mutex<Option<hixl_verbs::QueuePair>>,
}

impl Session {
    fn has_verbs(&self) -> bool {
        #[cfg(feature = "verbs")]
        return self.verbs.lock().map(|q| q.is_some()).unwrap_or(false);
        #[cfg(not(feature = "verbs"))]
        false
    }
}

/// The listening side of an engine.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) shared: Arc<Shared>,
    instance: u64,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
}

impl Server {
    pub(crate) fn new(shared: Arc<Shared>, instance: u64) -> Arc<Server> {
        Arc::new(Server {
            shared,
            instance,
            sessions: Mutex::new(HashMap::new()),
        })
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
        let sessions: Vec<_> = self
            .sessions
            .lock()
            .map(|mut s| s.drain().map(|(_, v)| v).collect())
            .unwrap_or_default();
        for s in sessions {
            let mut b = BytesMut::new();
            Message::Disconnect {
                reason: reason.into(),
            }
            .encode(&mut b);
            let _ = s.control.send(b);
            s.state.kill(Error::NotConnected {
                peer: s.peer.to_string(),
            });
        }
    }

    /// The session with this id.
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn session(&self, id: u64) -> Option<Arc<Session>> {
        self.sessions.lock().ok()?.get(&id).cloned()
    }

    /// Every connected initiator's session.
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn sessions(&self) -> Vec<Arc<Session>> {
        self.sessions
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Sends the current memory table to every connected initiator (preceded, on verbs
    /// links, by the regions' device keys, so that a region is never in an initiator's table
    /// without its key).
    pub(crate) fn broadcast_table(&self) {
        let (table, keys) = match self.shared.regions.lock() {
            Ok(r) => (r.exported(), device_keys(&r)),
            Err(_) => return,
        };
        let mut b = BytesMut::new();
        Message::MemTable(table).encode(&mut b);
        let mut kb = BytesMut::new();
        Message::VerbsKeys(keys).encode(&mut kb);
        if let Ok(s) = self.sessions.lock() {
            for s in s.values() {
                if s.has_verbs() {
                    let _ = s.control.send(kb.clone());
                }
                let _ = s.control.send(b.clone());
            }
        }
    }

    /// Answers an initiator's `VerbsConnect`: a QP connected to its endpoint, then the device
    /// keys and our endpoint.
    fn accept_verbs(&self, sess: &Session, endpoint: &[u8]) {
        let reply = |m: Message| {
            let mut b = BytesMut::new();
            m.encode(&mut b);
            let _ = sess.control.send(b);
        };
        let refuse = |status: Status, reason: String| {
            tracing::info!(peer = %sess.peer, "refusing a queue pair: {reason}");
            reply(Message::VerbsAccept {
                status: status.code(),
                endpoint: Vec::new(),
                reason,
            })
        };
        #[cfg(feature = "verbs")]
        {
            let Some(v) = &self.shared.verbs else {
                return refuse(Status::Unsupported, "this engine has no RDMA device".into());
            };
            let Ok(mut slot) = sess.verbs.lock() else {
                return refuse(Status::Failed, "session lock poisoned".into());
            };
            if slot.is_some() {
                return refuse(Status::AlreadyConnected, "a queue pair exists".into());
            }
            match v.accept(&sess.peer, endpoint) {
                Ok(qp) => {
                    let ep = qp.endpoint().to_bytes().to_vec();
                    *slot = Some(qp);
                    drop(slot);
                    let keys = match self.shared.regions.lock() {
                        Ok(r) => device_keys(&r),
                        Err(_) => Vec::new(),
                    };
                    reply(Message::VerbsKeys(keys));
                    reply(Message::VerbsAccept {
                        status: 0,
                        endpoint: ep,
                        reason: String::new(),
                    });
                }
                Err(e) => refuse(e.status(), e.to_string()),
            }
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = endpoint;
            refuse(
                Status::Unsupported,
                "this build has no verbs backend".into(),
            )
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
                let sess = self
                    .sessions
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&session).cloned());
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
            let id = crate::engine::random_u64();
            if id != 0
                && !self
                    .sessions
                    .lock()
                    .map(|m| m.contains_key(&id))
                    .unwrap_or(true)
            {
                break id;
            }
        };
        let welcome = Message::Welcome {
            engine: self.shared.name.clone(),
            session: id,
        };
        let (tx, rx) = mpsc::unbounded_channel::<BytesMut>();
        let sess = Arc::new(Session {
            peer: peer.clone(),
            state: Arc::new(LinkState::new()),
            control: tx,
            #[cfg(feature = "fabric")]
            fabric: Mutex::new(None),
            #[cfg(feature = "verbs")]
            verbs: Mutex::new(None),
        });
        // Insert before sending the table so a concurrent registration's broadcast reaches
        // this peer too.
        if let Ok(mut m) = self.sessions.lock() {
            m.insert(id, sess.clone());
        }
        let table = self
            .shared
            .regions
            .lock()
            .map(|r| r.exported())
            .unwrap_or_default();
        if write_frame(&mut s, &welcome, &peer).await.is_err()
            || !self.send_fabric_info(&mut s, &peer).await
            || !self.send_verbs_info(&mut s, &peer).await
            || write_frame(&mut s, &Message::MemTable(table), &peer)
                .await
                .is_err()
        {
            self.drop_session(id, &sess, "handshake failed");
            return;
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
                    let _ = sess.control.send(b);
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
                    let _ = sess.control.send(b);
                }
                Ok(Message::Heartbeat { seq }) => {
                    // Answer the initiator's probes, not the answers to ours.
                    if seq & hixl_core::wire::HEARTBEAT_FROM_TARGET == 0 {
                        let mut b = BytesMut::new();
                        Message::Heartbeat { seq }.encode(&mut b);
                        let _ = sess.control.send(b);
                    }
                }
                Ok(Message::Disconnect { reason }) => break format!("peer disconnected: {reason}"),
                Ok(Message::VerbsConnect { endpoint }) => self.accept_verbs(&sess, &endpoint),
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

    /// Offers the fabric backend to a same-host initiator (sent before the memory table).
    /// Returns false when the socket failed.
    async fn send_fabric_info(&self, s: &mut TcpStream, peer: &str) -> bool {
        #[cfg(feature = "fabric")]
        if let Some(f) = &self.shared.fabric {
            let info = Message::FabricInfo {
                boot_id: f.identity.boot_id.clone(),
                mnt_ns: f.identity.mnt_ns,
                pid: f.identity.pid as u32,
                uid: f.identity.uid,
                socket: f.socket.clone(),
            };
            return write_frame(s, &info, peer).await.is_ok();
        }
        let _ = (s, peer);
        true
    }

    /// Offers the verbs backend (sent before the memory table). Returns false when the
    /// socket failed.
    async fn send_verbs_info(&self, s: &mut TcpStream, peer: &str) -> bool {
        #[cfg(feature = "verbs")]
        if let Some(v) = &self.shared.verbs {
            let info = Message::VerbsInfo {
                device: v.device.clone(),
            };
            return write_frame(s, &info, peer).await.is_ok();
        }
        let _ = (s, peer);
        true
    }

    fn drop_session(&self, id: u64, sess: &Session, reason: &str) {
        if let Ok(mut m) = self.sessions.lock() {
            m.remove(&id);
        }
        sess.state.kill(Error::PeerLost {
            peer: sess.peer.to_string(),
            cause: reason.to_string(),
        });
    }
}
