//! Tests of the session state machines: a [`Pair`] of sessions joined by a simulated
//! connection on a virtual clock (no sleeps), plus scripted fake peers.

use std::time::{Duration, Instant};

use super::{Admission, Config, Event, InitiatorSession, Phase, TargetSession};
use crate::auth::{Secret, NONCE_LEN};
use crate::types::{Access, MemKind, RemoteRegion};
use crate::wire::Message;
use crate::Error;

mod control;
mod handshake;
mod idle;
mod liveness;
mod notify;
mod random;

pub(super) const MS: Duration = Duration::from_millis(1);
pub(super) const NONCE_I: [u8; NONCE_LEN] = [0x11; NONCE_LEN];
pub(super) const NONCE_T: [u8; NONCE_LEN] = [0x22; NONCE_LEN];
pub(super) const SESSION: u64 = 0x5e55;

/// Which way a frame travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dir {
    ToTarget,
    ToInitiator,
}

/// What the simulated connection does with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    Deliver,
    Drop,
    /// Delivered this much later than the latency alone would (so later frames overtake it).
    Delay(Duration),
}

#[derive(Debug)]
enum Packet {
    Frame(Message),
    /// The other end closed its socket.
    Eof,
}

type Filter = Box<dyn FnMut(Dir, &Message) -> Fate>;

/// An initiator and a target joined by a connection with a one-way latency, on a virtual
/// clock. The target's driver is simulated: on `Welcomed` it sends `offers` and `table`.
pub(super) struct Pair {
    pub(super) now: Instant,
    pub(super) latency: Duration,
    pub(super) ini: InitiatorSession,
    pub(super) tgt: TargetSession,
    pub(super) filter: Filter,
    pub(super) table: Vec<RemoteRegion>,
    pub(super) offers: Vec<Message>,
    /// Whether the simulated initiator driver has ops in flight: it reports them whenever
    /// the session is about to turn the link idle, as the engine's driver does.
    pub(super) ops_in_flight: bool,
    /// Every frame either side sent, with the time it was sent.
    pub(super) sent: Vec<(Instant, Dir, Message)>,
    pub(super) ini_events: Vec<(Instant, Event)>,
    pub(super) tgt_events: Vec<(Instant, Event)>,
    in_flight: Vec<(Instant, u64, Dir, Packet)>,
    order: u64,
    eof_sent: [bool; 2],
}

pub(super) fn config(engine: &str, incarnation: u64) -> Config {
    Config::new(engine, incarnation)
}

pub(super) fn secret_config(engine: &str, incarnation: u64, secret: &str) -> Config {
    Config {
        secret: Some(Secret::new(secret)),
        ..Config::new(engine, incarnation)
    }
}

pub(super) fn region(addr: u64, rkey: u64) -> RemoteRegion {
    RemoteRegion {
        addr,
        len: 4096,
        rkey,
        access: Access::REMOTE_RW,
        kind: MemKind::Host,
        name: None,
    }
}

impl Pair {
    /// A pair of default sessions (no secret, 1 s probes, 5 misses), not yet run.
    pub(super) fn new() -> Pair {
        Pair::with(config("10.0.0.1", 1), config("10.0.0.2:5000", 2))
    }

    pub(super) fn with(ini: Config, tgt: Config) -> Pair {
        let now = Instant::now();
        Pair {
            now,
            latency: MS,
            ini: InitiatorSession::new(ini, "10.0.0.2:5000", now, NONCE_I),
            tgt: TargetSession::new(tgt, now, "10.0.0.1:40000", SESSION, NONCE_T),
            filter: Box::new(|_, _| Fate::Deliver),
            table: vec![region(0x2000, 2), region(0x1000, 1)],
            offers: Vec::new(),
            ops_in_flight: false,
            sent: Vec::new(),
            ini_events: Vec::new(),
            tgt_events: Vec::new(),
            in_flight: Vec::new(),
            order: 0,
            eof_sent: [false; 2],
        }
    }

    /// Runs until the initiator is established (or either side closed), at most 1 s.
    pub(super) fn connect(mut self) -> Pair {
        let limit = self.now + Duration::from_secs(1);
        while self.ini.phase() != Phase::Established && !self.ini.is_closed() {
            if !self.step(limit) {
                break;
            }
        }
        self.flush();
        self
    }

    fn schedule(&mut self, dir: Dir, p: Packet, extra: Duration) {
        self.order += 1;
        let at = self.now + self.latency + extra;
        self.in_flight.push((at, self.order, dir, p));
    }

    /// Moves what both sessions produced onto the connection, and runs the target driver.
    pub(super) fn flush(&mut self) {
        loop {
            let mut moved = false;
            while let Some(e) = self.tgt.poll_event() {
                moved = true;
                if matches!(e, Event::Welcomed { .. }) {
                    for o in self.offers.clone() {
                        self.tgt.offer(o).expect("offer");
                    }
                    self.tgt
                        .send_table(self.now, self.table.clone())
                        .expect("table");
                }
                self.tgt_events.push((self.now, e));
            }
            while let Some(e) = self.ini.poll_event() {
                moved = true;
                self.ini_events.push((self.now, e));
            }
            for dir in [Dir::ToTarget, Dir::ToInitiator] {
                loop {
                    let m = match dir {
                        Dir::ToTarget => self.ini.poll_transmit(),
                        Dir::ToInitiator => self.tgt.poll_transmit(),
                    };
                    let Some(m) = m else { break };
                    moved = true;
                    self.sent.push((self.now, dir, m.clone()));
                    match (self.filter)(dir, &m) {
                        Fate::Deliver => self.schedule(dir, Packet::Frame(m), Duration::ZERO),
                        Fate::Delay(d) => self.schedule(dir, Packet::Frame(m), d),
                        Fate::Drop => {}
                    }
                }
                // A closed session's driver closes the socket after its last frames.
                let (closed, i) = match dir {
                    Dir::ToTarget => (self.ini.is_closed(), 0),
                    Dir::ToInitiator => (self.tgt.is_closed(), 1),
                };
                if closed && !self.eof_sent[i] {
                    self.eof_sent[i] = true;
                    self.schedule(dir, Packet::Eof, Duration::ZERO);
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// One step of the simulation: advances to the next delivery or deadline (not past
    /// `limit`) and processes it. False when nothing is due up to `limit`.
    pub(super) fn step(&mut self, limit: Instant) -> bool {
        self.flush();
        let next = self
            .in_flight
            .iter()
            .map(|p| p.0)
            .chain(self.ini.poll_timeout())
            .chain(self.tgt.poll_timeout())
            .min();
        let Some(next) = next else { return false };
        if next > limit {
            return false;
        }
        self.now = self.now.max(next);
        let now = self.now;
        self.in_flight.sort_by_key(|p| (p.0, p.1));
        while self.in_flight.first().is_some_and(|p| p.0 <= now) {
            let (_, _, dir, p) = self.in_flight.remove(0);
            match (dir, p) {
                (Dir::ToTarget, Packet::Frame(m)) => drop(self.tgt.handle_frame(now, m)),
                (Dir::ToInitiator, Packet::Frame(m)) => drop(self.ini.handle_frame(now, m)),
                (Dir::ToTarget, Packet::Eof) => self.tgt.connection_lost(lost(self.tgt.peer())),
                (Dir::ToInitiator, Packet::Eof) => self.ini.connection_lost(lost(self.ini.peer())),
            }
            self.flush();
        }
        if self.ini.poll_timeout().is_some_and(|t| t <= now) {
            if self.ops_in_flight && self.ini.turns_idle(now) {
                self.ini.work_in_flight(now);
            }
            self.ini.handle_timeout(now);
        }
        if self.tgt.poll_timeout().is_some_and(|t| t <= now) {
            self.tgt.handle_timeout(now);
        }
        self.flush();
        true
    }

    /// Runs every delivery and deadline up to `t`, then sets the clock to `t`.
    pub(super) fn run_until(&mut self, t: Instant) {
        while self.step(t) {}
        self.now = self.now.max(t);
        self.flush();
    }

    pub(super) fn run_for(&mut self, d: Duration) {
        let t = self.now + d;
        self.run_until(t);
    }

    /// Frames sent one way, in order.
    pub(super) fn frames(&self, dir: Dir) -> Vec<Message> {
        self.sent
            .iter()
            .filter(|s| s.1 == dir)
            .map(|s| s.2.clone())
            .collect()
    }

    /// When and why a side closed.
    pub(super) fn ini_closed(&self) -> Option<(Instant, Error)> {
        closed_in(&self.ini_events)
    }

    pub(super) fn tgt_closed(&self) -> Option<(Instant, Error)> {
        closed_in(&self.tgt_events)
    }
}

fn closed_in(events: &[(Instant, Event)]) -> Option<(Instant, Error)> {
    events.iter().find_map(|(t, e)| match e {
        Event::Closed(e) => Some((*t, e.clone())),
        _ => None,
    })
}

/// The error a driver reports for a socket closed by the peer.
pub(super) fn lost(peer: &str) -> Error {
    Error::PeerLost {
        peer: peer.to_string(),
        cause: "connection closed".into(),
    }
}

/// Drains a session's transmit queue.
pub(super) fn drain_i(s: &mut InitiatorSession) -> Vec<Message> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}

pub(super) fn drain_t(s: &mut TargetSession) -> Vec<Message> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}

pub(super) fn events_i(s: &mut InitiatorSession) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

pub(super) fn events_t(s: &mut TargetSession) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

/// Whether a heartbeat frame is a probe of the target.
pub(super) fn target_bit(seq: u64) -> bool {
    seq & crate::wire::HEARTBEAT_FROM_TARGET != 0
}
