//! The accepting side of a control connection.
//!
//! States (see the [module docs](super) for the frames):
//!
//! ```text
//! AwaitHello ──control Hello (we have a secret)──▶ AwaitResponse ──valid AuthResponse──┐
//!     │                                                  (AuthProof, Welcome sent)     │
//!     └──control Hello (no secret; Welcome sent)──▶ Welcomed ◀─────────────────────────┘
//!                                                     │ offer(FabricInfo/VerbsInfo)
//!                                                     └─send_table─▶ Established
//! ```
//!
//! The driver creates a `TargetSession` for a connection whose first frame it expects to be a
//! control `Hello` (data and fabric hellos are routed by the driver, not here: one arriving
//! here is a protocol violation). Failures of the handshake:
//! - a hello carrying our own incarnation: `Refuse{PARAM_INVALID, "connect to self"}` and
//!   [`Error::ConnectToSelf`];
//! - an `AuthResponse` without a MAC, with a wrong one, or another frame instead: a `Refuse`
//!   with the reason and [`Error::AuthFailed`]; no answer within the handshake timeout: the
//!   same, after the challenge, or [`Error::Timeout`] (nothing sent) before the hello;
//! - a first frame that is not a hello: [`Error::Protocol`], nothing sent.
//!
//! Between `Welcome` and the memory table the initiator has nothing to say: any frame but a
//! `Disconnect` there is a violation. Established, it takes `Notify`, `Heartbeat`,
//! `VerbsConnect` (passed through), `RevokeAck` for a revocation in progress and
//! `Disconnect`; anything else closes the session with [`Error::Protocol`], sending nothing,
//! as the asynchronous engine does.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::heartbeat::Liveness;
use super::notify::Budget;
use super::{check_frame, clip, describe, earliest, Admission, Config, Core, Event, Phase};
use crate::auth::NONCE_LEN;
use crate::error::{Error, Result};
use crate::status::Status;
use crate::types::{Notify, RemoteRegion};
use crate::wire::{Channel, Message, REFUSE_SELF};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitHello,
    AwaitResponse,
    Welcomed,
    Established,
    Closed,
}

/// The target's half of a control connection (sans-io).
#[derive(Debug)]
pub struct TargetSession {
    config: Config,
    core: Core,
    state: State,
    session: u64,
    nonce_t: [u8; NONCE_LEN],
    deadline: Option<Instant>,
    liveness: Liveness,
    budget: Budget,
    /// Rkeys revoked and not yet acked.
    revoking: BTreeSet<u64>,
    /// `VerbsConnect`s received and not yet answered.
    verbs_connects: usize,
    /// With [`Admission::Driver`]: notifies offered to the driver and not yet answered.
    offered: BTreeSet<u64>,
    /// The initiator's incarnation, from its hello.
    peer_incarnation: u64,
    /// The features the peer's hello announced.
    peer_features: u64,
}

impl TargetSession {
    /// A session for a new connection from `from` (its address, named in errors until the
    /// hello gives the engine name). `session` is the id the `Welcome` will hand out (the
    /// driver keeps it unique and non-zero); `nonce` this connection's challenge nonce (from
    /// [`crate::auth::nonce`]), only used when we have a secret.
    pub fn new(
        config: Config,
        now: Instant,
        from: impl Into<String>,
        session: u64,
        nonce: [u8; NONCE_LEN],
    ) -> TargetSession {
        TargetSession {
            deadline: config.handshake_timeout.and_then(|t| now.checked_add(t)),
            liveness: Liveness::new(
                config.heartbeat_interval,
                config.heartbeat_miss_limit,
                config.heartbeat_idle,
                now,
                true,
                config.probe_grid,
            ),
            budget: Budget::new(config.notify_budget),
            config,
            core: Core::new(from.into()),
            state: State::AwaitHello,
            session,
            nonce_t: nonce,
            revoking: BTreeSet::new(),
            verbs_connects: 0,
            offered: BTreeSet::new(),
            peer_incarnation: 0,
            peer_features: 0,
        }
    }

    /// The peer's name: its engine name once it said hello, else its address.
    pub fn peer(&self) -> &str {
        &self.core.peer
    }

    /// The session id the `Welcome` hands out.
    pub fn session_id(&self) -> u64 {
        self.session
    }

    /// Where the session is.
    pub fn phase(&self) -> Phase {
        match self.state {
            State::AwaitHello | State::AwaitResponse => Phase::Handshake,
            State::Welcomed => Phase::Offers,
            State::Established => Phase::Established,
            State::Closed => Phase::Closed,
        }
    }

    /// This link's notifies not drained yet.
    pub fn undrained_notifies(&self) -> usize {
        self.budget.undrained()
    }

    /// Whether the session has ended.
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// Why the session ended, once it has.
    pub fn error(&self) -> Option<&Error> {
        self.core.error()
    }

    /// The next frame to write, in order.
    pub fn poll_transmit(&mut self) -> Option<Message> {
        self.core.poll_transmit()
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.core.poll_event()
    }

    /// When [`TargetSession::handle_timeout`] must be called next (`None`: no timer runs).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.core.is_closed() {
            return None;
        }
        earliest(self.deadline, self.liveness.poll_timeout())
    }

    /// Time has passed: handshake deadlines, probes, and death after `interval × miss_limit`
    /// of silence.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.core.is_closed() {
            return;
        }
        if let (Some(t), Some(after)) = (self.deadline, self.config.handshake_timeout) {
            if now >= t {
                return self.handshake_timeout(after);
            }
        }
        match self.liveness.on_timeout(now) {
            Ok(Some(probe)) => self.core.send(probe),
            Ok(None) => {}
            Err(silence) => {
                let e = self.liveness.lost(&self.core.peer, silence);
                self.close(e, None);
            }
        }
    }

    fn handshake_timeout(&mut self, after: Duration) {
        if self.state == State::AwaitResponse {
            let reason = format!("authentication failed: no answer within {after:?}");
            return self.refuse_auth(reason);
        }
        let e = Error::Timeout {
            what: "hello",
            peer: self.core.peer.clone(),
            after,
        };
        self.close(e, None);
    }

    fn refuse_auth(&mut self, reason: String) {
        let reason = clip(reason);
        let refuse = Message::Refuse {
            status: Status::Failed.code(),
            reason: reason.clone(),
        };
        let e = Error::AuthFailed {
            peer: self.core.peer.clone(),
            reason,
        };
        self.close(e, Some(refuse));
    }

    /// Takes a frame read from the control connection.
    ///
    /// # Errors
    /// The session's cause when this frame ended it (or it had already ended).
    pub fn handle_frame(&mut self, now: Instant, m: Message) -> Result<()> {
        self.core.alive()?;
        self.liveness.heard(now);
        match self.state {
            State::AwaitHello => self.on_hello(now, m),
            State::AwaitResponse => self.on_response(m),
            State::Welcomed => match m {
                Message::Disconnect { reason } => self.peer_disconnected(reason),
                m => {
                    let reason = format!(
                        "unexpected {} before the memory table was sent",
                        describe(&m)
                    );
                    let e = self.core.protocol(reason);
                    self.close(e, None);
                }
            },
            State::Established => self.established(m),
            State::Closed => {}
        }
        self.core.alive()
    }

    fn on_hello(&mut self, now: Instant, m: Message) {
        match m {
            Message::Hello {
                engine,
                channel: Channel::Control,
                session,
                features,
            } => {
                self.core.peer = engine.clone();
                self.peer_features = features;
                self.peer_incarnation = session;
                if session == self.config.incarnation {
                    let refuse = Message::Refuse {
                        status: Status::ParamInvalid.code(),
                        reason: REFUSE_SELF.to_string(),
                    };
                    return self.close(Error::ConnectToSelf { engine }, Some(refuse));
                }
                if self.config.secret.is_some() {
                    self.core.send(Message::AuthChallenge {
                        nonce: self.nonce_t.to_vec(),
                    });
                    self.state = State::AwaitResponse;
                    // The answer gets a timeout of its own.
                    self.deadline = self
                        .config
                        .handshake_timeout
                        .and_then(|t| now.checked_add(t));
                } else {
                    self.welcome();
                }
            }
            m => {
                let e = self
                    .core
                    .protocol(format!("expected a control hello, got {}", describe(&m)));
                self.close(e, None);
            }
        }
    }

    fn on_response(&mut self, m: Message) {
        let engine = self.core.peer.clone();
        let Some(secret) = &self.config.secret else {
            return self.refuse_auth("authentication state without a secret".into());
        };
        let reason = match m {
            Message::AuthResponse { mac, .. } if mac.is_empty() => format!(
                "authentication required: this engine has a shared secret and {engine} sent no proof (set hixl.AuthSecret or HIXL_AUTH_SECRET on it)"
            ),
            Message::AuthResponse { nonce, mac }
                if nonce.len() == NONCE_LEN && secret.verify_initiator(&self.nonce_t, &nonce, &mac) =>
            {
                let proof = Message::AuthProof {
                    mac: secret.target_mac(&self.nonce_t, &nonce).to_vec(),
                };
                self.core.send(proof);
                self.core.event(Event::Authenticated);
                return self.welcome();
            }
            Message::AuthResponse { .. } => format!(
                "authentication failed: the proof from {engine} does not match this engine's shared secret"
            ),
            m => format!(
                "authentication failed: expected an answer to the challenge, got {}",
                describe(&m)
            ),
        };
        self.refuse_auth(reason);
    }

    fn welcome(&mut self) {
        self.core.send(Message::Welcome {
            engine: self.config.engine.clone(),
            session: self.session,
            incarnation: self.config.incarnation,
            features: self.config.features,
        });
        self.core.event(Event::Welcomed {
            session: self.session,
            engine: self.core.peer.clone(),
            incarnation: self.peer_incarnation,
            features: self.peer_features & self.config.features,
        });
        self.deadline = None;
        self.state = State::Welcomed;
    }

    fn established(&mut self, m: Message) {
        match m {
            Message::Notify { seq, name, msg }
                if self.config.notify_admission == Admission::Driver =>
            {
                if !self.offered.insert(seq) {
                    let reason = format!("notify {seq} sent twice before its ack");
                    let e = self.core.protocol(reason);
                    return self.close(e, None);
                }
                let notify = Notify {
                    from: self.core.peer.clone(),
                    link: self.session,
                    name,
                    msg,
                };
                self.core.event(Event::NotifyOffered { seq, notify });
            }
            Message::Notify { seq, name, msg } => {
                let queued = self.budget.admit();
                if queued {
                    self.core.event(Event::NotifyReceived(Notify {
                        from: self.core.peer.clone(),
                        link: self.session,
                        name,
                        msg,
                    }));
                }
                self.notify_ack(seq, queued);
            }
            Message::Heartbeat { seq } => {
                if let Some(a) = self.liveness.on_heartbeat(seq) {
                    self.core.send(a);
                }
            }
            Message::Disconnect { reason } => self.peer_disconnected(reason),
            m @ Message::VerbsConnect { .. } => {
                self.verbs_connects += 1;
                self.core.event(Event::TransportMessage(m));
            }
            Message::RevokeAck { rkey } if self.revoking.remove(&rkey) => {
                self.core.event(Event::RevokeAcked { rkey });
            }
            m => {
                let reason = format!("unexpected {} on the control connection", describe(&m));
                let e = self.core.protocol(reason);
                self.close(e, None);
            }
        }
    }

    fn peer_disconnected(&mut self, reason: String) {
        let e = Error::PeerLost {
            peer: self.core.peer.clone(),
            cause: format!("peer disconnected: {reason}"),
        };
        self.close(e, None);
    }

    fn check_open(&self, what: &'static str) -> Result<()> {
        self.core.alive()?;
        match self.state {
            State::Welcomed | State::Established => Ok(()),
            _ => Err(Error::SessionOutOfPhase {
                command: what,
                needs: "it waits for the initiator's welcome",
            }),
        }
    }

    /// Offers a transport (`FabricInfo`, `VerbsInfo`) before the first memory table.
    ///
    /// # Errors
    /// [`Error::SessionWrongMessage`] for another message, [`Error::SessionOutOfPhase`] before
    /// the `Welcome` or after the first
    /// table; the session's cause once closed.
    pub fn offer(&mut self, m: Message) -> Result<()> {
        self.check_open("a transport offer")?;
        if self.state != State::Welcomed {
            return Err(Error::SessionOutOfPhase {
                command: "a transport offer",
                needs: "offers go before the first memory table",
            });
        }
        if !matches!(m, Message::FabricInfo { .. } | Message::VerbsInfo { .. }) {
            return Err(Error::SessionWrongMessage {
                command: "a transport offer",
                frame: describe(&m),
            });
        }
        check_frame(&m)?;
        self.core.send(m);
        Ok(())
    }

    /// Sends the memory table: the first one establishes the link (ending the offers and
    /// starting the liveness timer), later ones are updates.
    ///
    /// # Errors
    /// [`Error::SessionOutOfPhase`] before the `Welcome`; the session's cause once closed.
    pub fn send_table(&mut self, now: Instant, table: Vec<RemoteRegion>) -> Result<()> {
        self.check_open("a memory table")?;
        self.core.send(Message::MemTable(table));
        if self.state == State::Welcomed {
            self.state = State::Established;
            self.liveness.start(now);
        }
        Ok(())
    }

    /// Sends a transport message: `VerbsKeys` (any time after the `Welcome`) or the
    /// `VerbsAccept` answering a `VerbsConnect`.
    ///
    /// # Errors
    /// [`Error::SessionWrongMessage`] for another message or a `VerbsAccept` nobody asked for,
    /// [`Error::SessionOutOfPhase`] before the `Welcome`, [`Error::Unsendable`] for a message
    /// the wire cannot carry (a field over the decoder's limit); the session's cause once
    /// closed.
    pub fn send_transport(&mut self, m: Message) -> Result<()> {
        self.check_open("a transport message")?;
        match m {
            Message::VerbsKeys(_) => {}
            Message::VerbsAccept { .. } if self.verbs_connects > 0 => {}
            m => {
                return Err(Error::SessionWrongMessage {
                    command: "a target's transport message now",
                    frame: describe(&m),
                })
            }
        }
        check_frame(&m)?;
        if matches!(m, Message::VerbsAccept { .. }) {
            self.verbs_connects -= 1;
        }
        self.core.send(m);
        Ok(())
    }

    /// Refuses a transport request that no transport of this engine takes (a `VerbsConnect`
    /// from a peer that ignored our offers): answers it with `UNSUPPORTED` and `reason`.
    ///
    /// # Errors
    /// [`Error::SessionWrongMessage`] for a message that is not a transport request, or one nobody
    /// asked; the session's cause once closed.
    pub fn refuse_transport(&mut self, request: &Message, reason: &str) -> Result<()> {
        match request {
            Message::VerbsConnect { rail, .. } => self.send_transport(Message::VerbsAccept {
                rail: *rail,
                status: Status::Unsupported.code(),
                endpoints: Vec::new(),
                reason: clip(reason.to_string()),
            }),
            m => Err(Error::SessionWrongMessage {
                command: "refusing a transport request",
                frame: describe(m),
            }),
        }
    }

    /// Revokes a region: sends `Revoke`; the initiator's answer arrives as
    /// [`Event::RevokeAcked`].
    ///
    /// # Errors
    /// [`Error::SessionOutOfPhase`] before the link is established, [`Error::AlreadyRevoking`]
    /// while this rkey is already
    /// being revoked; the session's cause once closed.
    pub fn revoke(&mut self, rkey: u64) -> Result<()> {
        self.core.alive()?;
        if self.state != State::Established {
            return Err(Error::SessionOutOfPhase {
                command: "a revocation",
                needs: "it waits for the memory table",
            });
        }
        if !self.revoking.insert(rkey) {
            return Err(Error::AlreadyRevoking { rkey });
        }
        self.core.send(Message::Revoke { rkey });
        Ok(())
    }

    /// Answers an [`Event::NotifyOffered`]: `queued` acks it, otherwise the initiator hears
    /// `RESOURCE_EXHAUSTED`.
    ///
    /// # Errors
    /// [`Error::SessionNotPending`] for a seq that was not offered or is answered already; the
    /// session's cause once closed.
    pub fn ack_notify(&mut self, seq: u64, queued: bool) -> Result<()> {
        let status = if queued {
            Status::Success
        } else {
            Status::ResourceExhausted
        };
        self.ack_notify_status(seq, status)
    }

    /// Answers an offered notify with `status` (a notify the application served itself:
    /// `SUCCESS`, or the status it refused it with, which the sender's `notify` returns).
    ///
    /// # Errors
    /// As [`TargetSession::ack_notify`].
    pub fn ack_notify_status(&mut self, seq: u64, status: Status) -> Result<()> {
        self.core.alive()?;
        if !self.offered.remove(&seq) {
            return Err(Error::SessionNotPending {
                what: "notify",
                id: seq,
            });
        }
        self.core.send(Message::NotifyAck {
            seq,
            status: status.code(),
        });
        Ok(())
    }

    /// Acks a notify: queued, or `RESOURCE_EXHAUSTED`.
    fn notify_ack(&mut self, seq: u64, queued: bool) {
        let status = if queued {
            Status::Success
        } else {
            Status::ResourceExhausted
        };
        self.core.send(Message::NotifyAck {
            seq,
            status: status.code(),
        });
    }

    /// The application drained `n` of this link's notifies: they no longer count against
    /// its budget.
    pub fn notifies_drained(&mut self, n: usize) {
        self.budget.drained(n);
    }

    /// The notify budget of this link.
    pub fn notify_budget(&self) -> usize {
        self.budget.limit()
    }

    /// Orderly close: queues a `Disconnect` (once the initiator was welcomed) and ends the
    /// session with [`Error::NotConnected`].
    pub fn disconnect(&mut self, reason: &str) {
        if self.core.is_closed() {
            return;
        }
        let last = matches!(self.state, State::Welcomed | State::Established).then(|| {
            Message::Disconnect {
                reason: clip(reason.to_string()),
            }
        });
        let e = Error::NotConnected {
            peer: self.core.peer.clone(),
        };
        self.close(e, last);
    }

    /// The connection broke (EOF, a socket error, an undecodable frame): the session ends
    /// with `cause`.
    pub fn connection_lost(&mut self, cause: Error) {
        self.close(cause, None);
    }

    fn close(&mut self, cause: Error, last: Option<Message>) {
        self.state = State::Closed;
        self.core.close(cause, last);
    }
}
