//! The connecting side of a control connection.
//!
//! States (see the [module docs](super) for the frames):
//!
//! ```text
//! AwaitFirst ──AuthChallenge (we have a secret)──▶ AwaitProof ──valid AuthProof──▶ AwaitWelcome
//!     │                                                                                  │
//!     └──────────────Welcome (we have no secret)─────────────▶ Offers ◀─────Welcome──────┘
//!                                                               │ FabricInfo/VerbsInfo (events)
//!                                                               └─MemTable─▶ Established
//! ```
//!
//! Failures of the handshake, each closing the session:
//! - a challenge while we have no secret: an empty `AuthResponse` is sent (so the target's log
//!   names the problem) and [`Error::AuthFailed`];
//! - a `Welcome` without a challenge while we have a secret: [`Error::AuthFailed`] (the target
//!   did not authenticate itself);
//! - a proof that does not verify, or a `Refuse` instead of the proof: [`Error::AuthFailed`];
//! - a `Refuse` instead of the `Welcome`: [`Error::Remote`] with its status
//!   ([`Error::ConnectToSelf`] for the target's "connect to self" refusal);
//! - any other frame: [`Error::Protocol`]; the handshake timeout: [`Error::Timeout`].
//!
//! Established, it takes `NotifyAck`, `MemTable`, `VerbsKeys`, `VerbsAccept` (only answering a
//! `VerbsConnect` we sent), `Revoke`, `Heartbeat` and `Disconnect`; anything else is a protocol
//! violation. None of these failures sends a frame, as in the asynchronous engine.

use std::collections::BTreeSet;
use std::time::Instant;

use super::heartbeat::Liveness;
use super::notify::{ack_result, check_lengths, Ledger};
use super::{check_frame, clip, describe, earliest, Config, Core, Event, Phase};
use crate::auth::NONCE_LEN;
use crate::error::{Error, Result};
use crate::status::Status;
use crate::types::{RemoteRegion, NOTIFY_MAX_PENDING};
use crate::wire::{refused_version, Channel, Message, REFUSE_SELF, VERSION};

#[derive(Debug)]
enum State {
    AwaitFirst,
    AwaitProof { nonce_t: Vec<u8> },
    AwaitWelcome,
    Offers { session: u64 },
    Established { session: u64 },
    Closed,
}

/// The initiator's half of a control connection (sans-io).
#[derive(Debug)]
pub struct InitiatorSession {
    config: Config,
    core: Core,
    state: State,
    nonce_i: [u8; NONCE_LEN],
    handshake_deadline: Option<Instant>,
    liveness: Liveness,
    ledger: Ledger,
    table: Vec<RemoteRegion>,
    /// Revoked rkeys the driver has not acked yet.
    revoked: BTreeSet<u64>,
    /// `VerbsConnect`s sent and not yet answered.
    verbs_connects: usize,
    /// Probes of [`InitiatorSession::sync`] not yet answered.
    syncs: Vec<u64>,
}

impl InitiatorSession {
    /// Starts a handshake with `peer` (its engine name, used in errors): queues the `Hello`.
    /// `nonce` is this connection's fresh authentication nonce (from
    /// [`crate::auth::nonce`]); it is only used when both ends have a secret.
    pub fn new(
        config: Config,
        peer: impl Into<String>,
        now: Instant,
        nonce: [u8; NONCE_LEN],
    ) -> InitiatorSession {
        let mut core = Core::new(peer.into());
        core.send(Message::Hello {
            engine: config.engine.clone(),
            channel: Channel::Control,
            session: config.incarnation,
            features: config.features,
        });
        InitiatorSession {
            handshake_deadline: config.handshake_timeout.and_then(|t| now.checked_add(t)),
            liveness: Liveness::new(
                config.heartbeat_interval,
                config.heartbeat_miss_limit,
                config.heartbeat_idle,
                now,
                false,
                config.probe_grid,
            ),
            ledger: Ledger::new(config.notify_budget),
            config,
            core,
            state: State::AwaitFirst,
            nonce_i: nonce,
            table: Vec::new(),
            revoked: BTreeSet::new(),
            verbs_connects: 0,
            syncs: Vec::new(),
        }
    }

    /// The peer's name, as given to [`InitiatorSession::new`].
    pub fn peer(&self) -> &str {
        &self.core.peer
    }

    /// Where the session is.
    pub fn phase(&self) -> Phase {
        match self.state {
            State::AwaitFirst | State::AwaitProof { .. } | State::AwaitWelcome => Phase::Handshake,
            State::Offers { .. } => Phase::Offers,
            State::Established { .. } => Phase::Established,
            State::Closed => Phase::Closed,
        }
    }

    /// The session id of the target's `Welcome`, once welcomed.
    pub fn session_id(&self) -> Option<u64> {
        match self.state {
            State::Offers { session } | State::Established { session } => Some(session),
            _ => None,
        }
    }

    /// The peer's current memory table, sorted by address (empty before the first).
    pub fn table(&self) -> &[RemoteRegion] {
        &self.table
    }

    /// Notifies waiting for an ack.
    pub fn pending_notifies(&self) -> usize {
        self.ledger.pending()
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

    /// When [`InitiatorSession::handle_timeout`] must be called next (`None`: no timer runs).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.core.is_closed() {
            return None;
        }
        earliest(self.handshake_deadline, self.liveness.poll_timeout())
    }

    /// Time has passed: sends the probes due and fails the session at the handshake deadline
    /// or when the peer has been silent for `interval × miss_limit`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.core.is_closed() {
            return;
        }
        if let (Some(t), Some(after)) = (self.handshake_deadline, self.config.handshake_timeout) {
            if now >= t {
                let e = Error::Timeout {
                    what: "connect",
                    peer: self.core.peer.clone(),
                    after,
                };
                return self.close(e, None);
            }
        }
        // A notify waiting for its ack is work in flight.
        if self.ledger.pending() > 0 && self.liveness.turns_idle(now) {
            self.work_in_flight(now);
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

    /// Takes a frame read from the control connection.
    ///
    /// # Errors
    /// The session's cause when this frame ended it (or it had already ended).
    pub fn handle_frame(&mut self, now: Instant, m: Message) -> Result<()> {
        self.core.alive()?;
        self.liveness.heard(now);
        let state = std::mem::replace(&mut self.state, State::Closed);
        let r = self.on_frame(now, state, m);
        if let Err(f) = r {
            let (e, last) = *f;
            self.close(e, last);
        }
        self.core.alive()
    }

    fn on_frame(&mut self, now: Instant, state: State, m: Message) -> Step {
        let peer = self.core.peer.clone();
        let failed = |reason: &str| Error::AuthFailed {
            peer: peer.clone(),
            reason: reason.to_string(),
        };
        match (state, m) {
            (State::AwaitFirst, Message::AuthChallenge { nonce: nonce_t }) => {
                let Some(secret) = &self.config.secret else {
                    let none = Message::AuthResponse {
                        nonce: Vec::new(),
                        mac: Vec::new(),
                    };
                    return fail(failed("the peer requires a shared secret and this engine has none (set hixl.AuthSecret or HIXL_AUTH_SECRET)"), Some(none));
                };
                self.core.send(Message::AuthResponse {
                    nonce: self.nonce_i.to_vec(),
                    mac: secret.initiator_mac(&nonce_t, &self.nonce_i).to_vec(),
                });
                self.state = State::AwaitProof { nonce_t };
                Ok(())
            }
            (State::AwaitFirst, Message::Welcome { .. }) if self.config.secret.is_some() => {
                fail(failed("the peer did not authenticate itself (it has no shared secret configured); its memory table is not accepted"), None)
            }
            (State::AwaitProof { nonce_t }, m) => {
                let verified = match (&m, &self.config.secret) {
                    (Message::AuthProof { mac }, Some(s)) => {
                        s.verify_target(&nonce_t, &self.nonce_i, mac)
                    }
                    _ => false,
                };
                match m {
                    Message::AuthProof { .. } if verified => {
                        self.core.event(Event::Authenticated);
                        self.state = State::AwaitWelcome;
                        Ok(())
                    }
                    Message::AuthProof { .. } => fail(
                        failed("the peer's proof does not match our shared secret: it does not know it"),
                        None,
                    ),
                    Message::Refuse { reason, .. } => fail(failed(&reason), None),
                    m => fail(self.unexpected(&m, "authentication proof"), None),
                }
            }
            (
                State::AwaitFirst | State::AwaitWelcome,
                Message::Welcome {
                    engine,
                    session,
                    incarnation,
                    features,
                },
            ) => {
                self.core.event(Event::Welcomed {
                    session,
                    engine,
                    incarnation,
                    features: features & self.config.features,
                });
                self.state = State::Offers { session };
                Ok(())
            }
            (State::AwaitFirst | State::AwaitWelcome, Message::Refuse { status, reason }) => {
                let status = Status::from_code(status).unwrap_or(Status::Failed);
                let e = if status == Status::ParamInvalid && reason == REFUSE_SELF {
                    Error::ConnectToSelf { engine: peer }
                } else if let Some(theirs) = refused_version(status.code(), &reason) {
                    Error::WireVersion {
                        peer,
                        theirs,
                        ours: VERSION,
                    }
                } else {
                    Error::Remote {
                        peer,
                        status,
                        message: reason,
                    }
                };
                fail(e, None)
            }
            (State::AwaitFirst | State::AwaitWelcome, m) => {
                fail(self.unexpected(&m, "welcome"), None)
            }
            (State::Offers { session }, m @ (Message::FabricInfo { .. } | Message::VerbsInfo { .. })) => {
                self.core.event(Event::TransportOffer(m));
                self.state = State::Offers { session };
                Ok(())
            }
            (State::Offers { session }, Message::MemTable(v)) => {
                self.table = sorted(v);
                self.core.event(Event::Table(self.table.clone()));
                self.handshake_deadline = None;
                self.liveness.start(now);
                self.state = State::Established { session };
                Ok(())
            }
            (State::Offers { .. }, m) => fail(self.unexpected(&m, "memory table"), None),
            (State::Established { session }, m) => {
                self.established(m)?;
                self.state = State::Established { session };
                Ok(())
            }
            (State::Closed, _) => Ok(()),
        }
    }

    fn established(&mut self, m: Message) -> Step {
        match m {
            Message::NotifyAck { seq, status } => {
                // An ack for a seq we do not hold (never sent, acked, cancelled) is ignored.
                if self.ledger.resolve(seq) {
                    let result = ack_result(&self.core.peer, status, NOTIFY_MAX_PENDING);
                    self.core.event(Event::NotifyAcked { seq, result });
                }
            }
            Message::MemTable(v) => {
                self.table = sorted(v);
                self.core.event(Event::TableUpdated(self.table.clone()));
            }
            m @ Message::VerbsKeys(_) => self.core.event(Event::TransportMessage(m)),
            m @ Message::VerbsAccept { .. } if self.verbs_connects > 0 => {
                self.verbs_connects -= 1;
                self.core.event(Event::TransportMessage(m));
            }
            Message::Heartbeat { seq } => {
                if let Some(a) = self.liveness.on_heartbeat(seq) {
                    self.core.send(a);
                }
                if let Some(i) = self.syncs.iter().position(|&s| s == seq) {
                    self.syncs.swap_remove(i);
                    self.core.event(Event::Synced { seq });
                }
            }
            Message::Revoke { rkey } => {
                if self.table.iter().any(|r| r.rkey == rkey) {
                    if self.revoked.insert(rkey) {
                        self.core.event(Event::Revoked { rkey });
                    }
                } else {
                    // Not in the table: nothing of ours can be touching it.
                    self.core.send(Message::RevokeAck { rkey });
                }
            }
            Message::Disconnect { reason } => {
                let e = Error::PeerLost {
                    peer: self.core.peer.clone(),
                    cause: format!("peer disconnected: {reason}"),
                };
                return fail(e, None);
            }
            m => {
                let reason = format!("unexpected {} on the control connection", describe(&m));
                return fail(self.core.protocol(reason), None);
            }
        }
        Ok(())
    }

    fn unexpected(&self, m: &Message, wanted: &str) -> Error {
        self.core
            .protocol(format!("expected {wanted}, got {}", describe(m)))
    }

    /// Sends a notify; its ack arrives as [`Event::NotifyAcked`] with the returned seq.
    ///
    /// # Errors
    /// [`Error::NotifyTooLong`] naming the field and its length; [`Error::NotConnected`]
    /// before the link is established; [`Error::NotifyQueueFull`] when `notify_budget`
    /// notifies already wait for acks; the session's cause once closed.
    pub fn notify(&mut self, now: Instant, name: &[u8], msg: &[u8]) -> Result<u64> {
        check_lengths(name, msg)?;
        self.core.alive()?;
        if !matches!(self.state, State::Established { .. }) {
            return Err(Error::NotConnected {
                peer: self.core.peer.clone(),
            });
        }
        let seq = self
            .ledger
            .allocate()
            .ok_or_else(|| Error::NotifyQueueFull {
                peer: self.core.peer.clone(),
                limit: self.ledger.limit(),
            })?;
        self.work_in_flight(now);
        self.core.send(Message::Notify {
            seq,
            name: name.to_vec(),
            msg: msg.to_vec(),
        });
        Ok(seq)
    }

    /// The link has work in flight now (ops the driver tracks; notifies the session counts
    /// itself). The link stays active, probing every interval, until
    /// `heartbeat_interval × heartbeat_miss_limit` after the last report; on an idle link the
    /// first report queues a probe at once and the silence is counted from `now`, so that
    /// work in flight fails no later than that bound after it started when the peer is
    /// silent. Call it when work starts on an idle link, and whenever
    /// [`InitiatorSession::turns_idle`] says the link is about to go idle while work is
    /// still in flight. Without a `heartbeat_idle` period it does nothing: every link probes
    /// as an active one.
    pub fn work_in_flight(&mut self, now: Instant) {
        if self.core.is_closed() {
            return;
        }
        if let Some(probe) = self.liveness.work(now) {
            self.core.send(probe);
        }
    }

    /// A barrier on the control connection: sends a heartbeat probe now and returns its
    /// sequence number; [`Event::Synced`] with it follows once the target answered. The
    /// target handles frames in order and answers every probe, so by then every frame it
    /// sent before the answer (a memory table it queued when it registered memory) has been
    /// handled here, its events reported first. A probe of the ordinary kind: any target
    /// answers it, and its liveness schedule is unchanged but for this probe.
    ///
    /// # Errors
    /// [`Error::SessionOutOfPhase`] before the link is established or once it has closed.
    pub fn sync(&mut self, now: Instant) -> Result<u64, Error> {
        let probe = match (&self.state, self.core.is_closed()) {
            (State::Established { .. }, false) => self.liveness.probe_now(now),
            _ => None,
        };
        let Some(probe @ Message::Heartbeat { seq }) = probe else {
            return Err(Error::SessionOutOfPhase {
                command: "a table sync",
                needs: "an established, open link",
            });
        };
        self.core.send(probe);
        self.syncs.push(seq);
        Ok(seq)
    }

    /// Whether [`InitiatorSession::handle_timeout`] at `now` turns an active link idle (its
    /// probes then come every `heartbeat_idle`): a driver with ops still in flight reports
    /// them with [`InitiatorSession::work_in_flight`] first.
    pub fn turns_idle(&self, now: Instant) -> bool {
        !self.core.is_closed() && self.liveness.turns_idle(now)
    }

    /// Forgets a pending notify (its waiter timed out); a later ack for it is ignored.
    /// Returns whether it was pending.
    pub fn cancel_notify(&mut self, seq: u64) -> bool {
        self.ledger.resolve(seq)
    }

    /// Sends a transport message: `VerbsConnect` (its `VerbsAccept` comes back as
    /// [`Event::TransportMessage`]).
    ///
    /// # Errors
    /// [`Error::SessionWrongMessage`] for another message, [`Error::SessionOutOfPhase`] before
    /// the link is established; the
    /// session's cause once closed.
    pub fn send_transport(&mut self, m: Message) -> Result<()> {
        self.core.alive()?;
        match (&self.state, &m) {
            (State::Established { .. }, Message::VerbsConnect { .. }) => {
                check_frame(&m)?;
                self.verbs_connects += 1;
                self.core.send(m);
                Ok(())
            }
            (State::Established { .. }, _) => Err(Error::SessionWrongMessage {
                command: "an initiator's transport message",
                frame: describe(&m),
            }),
            _ => Err(Error::SessionOutOfPhase {
                command: "a transport message",
                needs: "it waits for the memory table",
            }),
        }
    }

    /// Answers a [`Event::Revoked`]: nothing of ours touches the region any more.
    ///
    /// # Errors
    /// [`Error::SessionNotPending`] when the rkey is not being revoked; the cause once closed.
    pub fn revoke_ack(&mut self, rkey: u64) -> Result<()> {
        self.core.alive()?;
        if !self.revoked.remove(&rkey) {
            return Err(Error::SessionNotPending {
                what: "rkey",
                id: rkey,
            });
        }
        self.core.send(Message::RevokeAck { rkey });
        Ok(())
    }

    /// Orderly close: queues a `Disconnect` (once welcomed) and ends the session with
    /// [`Error::NotConnected`].
    pub fn disconnect(&mut self, reason: &str) {
        if self.core.is_closed() {
            return;
        }
        let last =
            matches!(self.state, State::Offers { .. } | State::Established { .. }).then(|| {
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
        if self.core.is_closed() {
            return;
        }
        self.state = State::Closed;
        for seq in self.ledger.take_all() {
            self.core.event(Event::NotifyAcked {
                seq,
                result: Err(cause.clone()),
            });
        }
        self.core.close(cause, last);
    }
}

/// The result of a frame: `Err` ends the session with the error and a last frame.
type Step = std::result::Result<(), Box<(Error, Option<Message>)>>;

fn fail(e: Error, last: Option<Message>) -> Step {
    Err(Box::new((e, last)))
}

fn sorted(mut v: Vec<RemoteRegion>) -> Vec<RemoteRegion> {
    v.sort_by_key(|r| r.addr);
    v
}
