//! Sans-io state machines of a link's control connection: [`InitiatorSession`] (the
//! connecting side) and [`TargetSession`] (the accepting side).
//!
//! Neither reads a clock, touches a socket or draws randomness. The driver feeds them decoded
//! frames ([`InitiatorSession::handle_frame`]), the passing of time
//! ([`InitiatorSession::handle_timeout`] at the instant [`InitiatorSession::poll_timeout`]
//! named) and local commands (notify, table updates, revocations, disconnect), and drains what
//! they produce: frames to write, in order ([`InitiatorSession::poll_transmit`]) and events for
//! the application ([`InitiatorSession::poll_event`]). Time is an [`Instant`] passed in; nonces
//! and ids are values the caller drew. The same inputs always give the same outputs.
//!
//! # The control protocol
//!
//! ```text
//! initiator                                   target
//!   Hello{engine, Control, incarnation} ───▶      (refused with REFUSE_SELF if the
//!                                                  incarnation is the target's own)
//!                               [with a secret on the target]
//!          ◀─── AuthChallenge{nonce_t}
//!   AuthResponse{nonce_i, mac_i} ───▶             (checked; Refuse on failure)
//!          ◀─── AuthProof{mac_t}                  (checked by the initiator)
//!          ◀─── Welcome{engine, session}  or  Refuse{status, reason}
//!          ◀─── FabricInfo / VerbsInfo ...        (transport offers, opaque here)
//!          ◀─── MemTable                          (the link is established)
//!   Notify{seq} ───▶  ◀─── NotifyAck{seq, status}
//!   Heartbeat{seq} ───▶ ◀─── Heartbeat{seq}       (the initiator's probes, every interval)
//!          ◀─── Heartbeat{seq | FROM_TARGET} ───▶ (the target's, after silence only)
//!          ◀─── MemTable / VerbsKeys              (updates, any time)
//!          ◀─── Revoke{rkey}   RevokeAck{rkey} ───▶
//!   VerbsConnect ───▶  ◀─── VerbsKeys, VerbsAccept
//!   Disconnect ───▶  or  ◀─── Disconnect          (orderly close, either way)
//! ```
//!
//! Both sides move through the same [`Phase`]s: `Handshake` (hello and authentication),
//! `Offers` (after `Welcome`, before the first memory table: the only window for transport
//! offers), `Established` (probes run, notifies flow) and `Closed` (terminal). Any frame out of
//! its phase is a protocol violation: the session closes with a typed [`Error`], and sends a
//! last `Refuse` or answer only where the asynchronous engine does (the target refuses failed
//! authentications; an initiator without a secret tells a challenging target why, with an
//! empty `AuthResponse`). Once closed, a session transmits nothing more after that last frame,
//! reports the cause from [`InitiatorSession::error`], and every command fails with it.
//!
//! # Liveness
//!
//! Once established, each end answers the other end's probes, never an answer (the target's
//! probes carry [`HEARTBEAT_FROM_TARGET`](crate::wire::HEARTBEAT_FROM_TARGET)). The initiator
//! probes one interval after the handshake, then every `heartbeat_interval` (on the
//! [`Config::probe_grid`] when it has one); nothing is sent at establishment, so that a
//! link's connect costs one round trip and no probe exchange. The target
//! probes only a link it has heard nothing on for one and a half intervals, then every
//! interval while the silence lasts. An idle link thus carries one probe and one answer per
//! interval, and the target arms no timer that fires while its initiator probes. Any frame
//! received counts as hearing the peer. A session that has heard nothing for exactly
//! `heartbeat_interval × heartbeat_miss_limit` dies at that instant with
//! [`Error::HeartbeatLost`] (how long it was silent, the probes and their interval). Both
//! rules hold against a peer that probes every interval (an older engine): it is answered,
//! and its probes keep our silence short.
//!
//! With a [`Config::heartbeat_idle`] period, the initiator's link is *idle* while nothing is
//! in flight: it probes every idle period and dies after `heartbeat_idle × miss_limit` of
//! silence. Work in flight ([`InitiatorSession::work_in_flight`], and pending notifies)
//! makes it *active* at once (a probe then, the silence counted from then) until
//! `interval × miss_limit` after the last report, with the rules above. Every initiator probe
//! announces its period ([`HEARTBEAT_PERIOD_SHIFT`](crate::wire::HEARTBEAT_PERIOD_SHIFT));
//! the target uses the last one announced, clamped to its interval and its own idle period,
//! as its period (its interval before one is announced).
//!
//! # Notifies
//!
//! The initiator numbers notifies 1, 2, 3, ... and keeps each pending until its `NotifyAck`
//! ([`Event::NotifyAcked`]); an ack for a sequence number it does not hold (never sent, already
//! acked, or cancelled after a timeout) is ignored, as the asynchronous engine does. When the
//! session closes, every pending notify is resolved with the cause. The target queues each
//! notify as [`Event::NotifyReceived`] unless this link already has `notify_budget` undrained
//! (the driver reports drains with [`TargetSession::notifies_drained`]); then it acks with
//! `RESOURCE_EXHAUSTED`. Budgets are per session (per link), not per engine name.
//!
//! # Example
//!
//! A driver loop in miniature: both sessions in one process, frames handed over directly.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use hixl_core::session::{Config, Event, InitiatorSession, Phase, TargetSession};
//!
//! let t0 = Instant::now(); // the driver's clock; the sessions never read one
//! let mut ini = InitiatorSession::new(Config::new("10.0.0.1", 1), "10.0.0.2:5000", t0, [1; 32]);
//! let mut tgt = TargetSession::new(Config::new("10.0.0.2:5000", 2), t0, "10.0.0.1:40000", 77, [2; 32]);
//! for _ in 0..4 {
//!     while let Some(m) = ini.poll_transmit() {
//!         tgt.handle_frame(t0, m).unwrap();
//!     }
//!     while let Some(e) = tgt.poll_event() {
//!         if let Event::Welcomed { .. } = e {
//!             tgt.send_table(t0, Vec::new()).unwrap(); // offers would go first
//!         }
//!     }
//!     while let Some(m) = tgt.poll_transmit() {
//!         ini.handle_frame(t0, m).unwrap();
//!     }
//! }
//! assert_eq!(ini.phase(), Phase::Established);
//! assert_eq!(ini.session_id(), Some(77));
//! let seq = ini.notify(t0, b"name", b"msg").unwrap();
//! assert_eq!(seq, 1);
//! // Nothing heard for 5 s (1 s probes, 5 misses): the initiator gives up exactly then.
//! let death = ini.poll_timeout().unwrap() + Duration::from_secs(4);
//! let mut now = t0;
//! while !ini.is_closed() {
//!     now = ini.poll_timeout().unwrap();
//!     ini.handle_timeout(now);
//! }
//! assert_eq!(now, death);
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::auth::Secret;
use crate::error::Error;
use crate::types::{Notify, RemoteRegion, NOTIFY_MAX_PENDING};
use crate::wire::Message;

mod heartbeat;
mod initiator;
mod notify;
mod target;

#[cfg(test)]
mod tests;

pub use initiator::InitiatorSession;
pub use target::TargetSession;

/// The result a notify's sender gets for the ack status `status` from `peer` (as
/// [`Event::NotifyAcked`] carries it): for a driver that resolves an ack arriving on a
/// transport's channel after the session closed.
pub fn notify_ack_result(peer: &str, status: u32) -> Result<(), Error> {
    notify::ack_result(peer, status, NOTIFY_MAX_PENDING)
}

/// How long a target waits for a hello and for the answer to its challenge by default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of one session; the same type serves both sides.
#[derive(Clone, Debug)]
pub struct Config {
    /// This engine's name (`ip` or `ip:port`), sent in `Hello` and `Welcome`.
    pub engine: String,
    /// This engine's incarnation id (random per engine start). An initiator sends it in its
    /// control `Hello`; a target refuses a hello that carries its own (a connect to self).
    pub incarnation: u64,
    /// The shared secret (`hixl.AuthSecret`), if any.
    pub secret: Option<Secret>,
    /// Interval between liveness probes (`hixl.HeartbeatIntervalMs`); at least 1 ms is used.
    pub heartbeat_interval: Duration,
    /// Probes that may go unanswered (`hixl.HeartbeatMissLimit`); at least 1 is used.
    pub heartbeat_miss_limit: u32,
    /// Initiator: the probing period of an idle link (nothing in flight for
    /// `heartbeat_interval × heartbeat_miss_limit`; `hixl.HeartbeatIdleMs`), announced to
    /// the target in its probes. Target: the longest period an initiator may announce (the
    /// target's own idle period). `None`, or not longer than the interval: idle links probe
    /// like active ones, and the target holds its initiators to its interval.
    pub heartbeat_idle: Option<Duration>,
    /// Initiator: the instant its probes are aligned to: each probe after the first falls on
    /// `probe_grid + k × heartbeat_interval` (never more than an interval after the one
    /// before), so that the sessions of a process that share it probe together and one timer
    /// wake-up serves them all. `None`: an interval after the previous probe. The target
    /// ignores it.
    pub probe_grid: Option<Instant>,
    /// Target: undrained notifies this link may queue. Initiator: notifies it may have
    /// waiting for an ack.
    pub notify_budget: usize,
    /// Target: who admits a notify against the budget (the session by default).
    pub notify_admission: Admission,
    /// Initiator: the whole handshake, hello to memory table (the connect timeout). Target:
    /// the wait for the hello, and again for the answer to the challenge. `None`: no limit.
    pub handshake_timeout: Option<Duration>,
    /// The optional parts of the protocol this end announces ([`crate::wire::feature`];
    /// [`crate::wire::FEATURES`] by default): the link uses those both ends announced.
    pub features: u64,
}

impl Config {
    /// A configuration with hixl's defaults: no secret, probes every second, five misses, no
    /// idle period (an engine's options give one, see [`Config::from_options`]),
    /// [`NOTIFY_MAX_PENDING`] notifies, [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn new(engine: impl Into<String>, incarnation: u64) -> Config {
        Config {
            engine: engine.into(),
            incarnation,
            secret: None,
            heartbeat_interval: Duration::from_millis(1000),
            heartbeat_miss_limit: 5,
            heartbeat_idle: None,
            probe_grid: None,
            notify_budget: NOTIFY_MAX_PENDING,
            notify_admission: Admission::Session,
            handshake_timeout: Some(DEFAULT_HANDSHAKE_TIMEOUT),
            features: crate::wire::FEATURES,
        }
    }

    /// The configuration an engine with these options uses (secret and heartbeat settings).
    pub fn from_options(
        options: &crate::Options,
        engine: impl Into<String>,
        incarnation: u64,
    ) -> Config {
        Config {
            secret: options.auth_secret.clone(),
            heartbeat_interval: Duration::from_millis(options.heartbeat_interval_ms),
            heartbeat_miss_limit: options.heartbeat_miss_limit,
            heartbeat_idle: Some(Duration::from_millis(options.heartbeat_idle_ms))
                .filter(|d| !d.is_zero()),
            ..Config::new(engine, incarnation)
        }
    }
}

/// Who decides whether a target takes a notify in or answers `RESOURCE_EXHAUSTED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The session counts this link's undrained notifies against `notify_budget`
    /// ([`Event::NotifyReceived`], drains reported with [`TargetSession::notifies_drained`]).
    Session,
    /// The driver does, because notifies of this link also arrive on another path (a
    /// transport's channel) and one queue must count them all: each notify comes out as
    /// [`Event::NotifyOffered`] and is acked only once the driver answers with
    /// [`TargetSession::ack_notify`].
    Driver,
}

/// Where a session is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Hello and authentication, until `Welcome`.
    Handshake,
    /// After `Welcome`, before the first memory table: transport offers may pass.
    Offers,
    /// The memory table was delivered: probes run, notifies and updates flow.
    Established,
    /// Terminal; [`InitiatorSession::error`] / [`TargetSession::error`] tell why.
    Closed,
}

/// What a session reports to its driver.
#[derive(Clone, Debug)]
pub enum Event {
    /// The peer proved that it knows the shared secret.
    Authenticated,
    /// Initiator: the target welcomed us. Target: we welcomed the initiator; the driver now
    /// sends its transport offers and the memory table.
    Welcomed {
        /// The session id (data connections present it in their hello).
        session: u64,
        /// The peer's engine name.
        engine: String,
        /// The peer engine's incarnation (from its `Welcome`, or its control `Hello`): a
        /// restarted peer has a new one.
        incarnation: u64,
        /// The optional parts of the protocol both ends announced ([`crate::wire::feature`]).
        features: u64,
    },
    /// Initiator: a transport offer of the target (`FabricInfo`, `VerbsInfo`), uninterpreted.
    TransportOffer(Message),
    /// Initiator: the first memory table (sorted by address): the link is established.
    Table(Vec<RemoteRegion>),
    /// Initiator: a later memory table (sorted by address) replacing the previous one.
    TableUpdated(Vec<RemoteRegion>),
    /// Target: a notify from the initiator, queued against this link's budget.
    NotifyReceived(Notify),
    /// Target, with [`Admission::Driver`]: a notify from the initiator; answer with
    /// [`TargetSession::ack_notify`] once it is queued (or refused).
    NotifyOffered {
        /// Its sequence number, to answer with.
        seq: u64,
        /// The notify.
        notify: Notify,
    },
    /// Initiator: a pending notify is resolved: acked (`Ok`), refused by the target, or
    /// failed with the cause of the session's death.
    NotifyAcked {
        /// Its sequence number.
        seq: u64,
        /// `Ok`, [`Error::NotifyQueueFull`], [`Error::Remote`] or the session's cause.
        result: Result<(), Error>,
    },
    /// Initiator: the target revokes the region with this rkey; answer with
    /// [`InitiatorSession::revoke_ack`] once nothing touches it any more.
    Revoked {
        /// The region's rkey.
        rkey: u64,
    },
    /// Target: the initiator no longer touches a region we revoked.
    RevokeAcked {
        /// The region's rkey.
        rkey: u64,
    },
    /// Initiator: the target answered the probe of [`InitiatorSession::sync`] with this
    /// sequence number: every frame it sent before (its memory table updates) was handled,
    /// and its events came before this one.
    Synced {
        /// The probe's sequence number, as `sync` returned it.
        seq: u64,
    },
    /// A transport message passed through (`VerbsKeys`, `VerbsAccept` to the initiator,
    /// `VerbsConnect` to the target), uninterpreted.
    TransportMessage(Message),
    /// The session ended; nothing follows.
    Closed(Error),
}

/// Output queues and the terminal error, shared by both sides.
#[derive(Debug)]
pub(crate) struct Core {
    /// The peer's name in errors.
    pub(crate) peer: String,
    transmit: VecDeque<Message>,
    events: VecDeque<Event>,
    error: Option<Error>,
}

impl Core {
    pub(crate) fn new(peer: String) -> Core {
        Core {
            peer,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            error: None,
        }
    }

    /// Queues a frame (dropped once closed).
    pub(crate) fn send(&mut self, m: Message) {
        if self.error.is_none() {
            self.transmit.push_back(m);
        }
    }

    /// Queues an event (dropped once closed).
    pub(crate) fn event(&mut self, e: Event) {
        if self.error.is_none() {
            self.events.push_back(e);
        }
    }

    /// Ends the session: `last` is the final frame, `Closed(cause)` the final event. A second
    /// close is a no-op.
    pub(crate) fn close(&mut self, cause: Error, last: Option<Message>) {
        if self.error.is_some() {
            return;
        }
        if let Some(m) = last {
            self.transmit.push_back(m);
        }
        self.events.push_back(Event::Closed(cause.clone()));
        self.error = Some(cause);
    }

    pub(crate) fn error(&self) -> Option<&Error> {
        self.error.as_ref()
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.error.is_some()
    }

    /// `Err(cause)` once closed.
    pub(crate) fn alive(&self) -> Result<(), Error> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Message> {
        self.transmit.pop_front()
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    pub(crate) fn protocol(&self, reason: String) -> Error {
        Error::Protocol {
            peer: self.peer.clone(),
            reason,
        }
    }
}

/// A short name of a frame for error messages (never its payload bytes in full).
pub(crate) fn describe(m: &Message) -> String {
    let s = format!("{m:?}");
    if s.len() <= 160 {
        return s;
    }
    let mut cut = 160;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

/// Longest reason a session puts in a `Refuse` or `Disconnect` it builds.
pub(crate) const MAX_REASON: usize = 1024;

/// `s` cut to [`MAX_REASON`] bytes at a character boundary.
pub(crate) fn clip(mut s: String) -> String {
    if s.len() > MAX_REASON {
        let mut cut = MAX_REASON;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// Checks that a message handed in by the driver survives the wire (its fields are within
/// the decoder's limits), so that a session never sends a frame its peer must reject.
pub(crate) fn check_frame(m: &Message) -> Result<(), Error> {
    let mut b = bytes::BytesMut::new();
    m.encode(&mut b);
    match Message::decode(&mut b) {
        Ok(Some(back)) if back == *m && b.is_empty() => Ok(()),
        Ok(_) => Err(Error::Unsendable {
            frame: describe(m),
            source: None,
        }),
        Err(e) => Err(Error::Unsendable {
            frame: describe(m),
            source: Some(e),
        }),
    }
}

/// The earlier of two optional deadlines.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
