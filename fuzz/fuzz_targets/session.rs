//! Fuzz target for hixl-core's sans-io control sessions (`hixl_core::session`): an
//! `InitiatorSession` and a `TargetSession` joined by an in-order connection the input
//! controls (deliver, drop or duplicate the next frame each way), with frames injected on
//! either side (decoded from raw bytes with `Message::decode`, or built by `arbitrary`), time
//! advances, timeouts and every local command.
//!
//! Input: a header byte (bit 0: initiator has a secret, bit 1: target has one, bit 2: they
//! differ, bits 3-4: heartbeat interval and miss limit, bit 5: no handshake timeouts), then
//! steps, each a tag byte and its fields (see `step`).
//!
//! Invariants checked after every step:
//! - nothing panics;
//! - a session closed at the start of a step transmits nothing and emits no event in it;
//!   the step that closes it emits exactly one `Closed`, as its last event, and at most one
//!   frame after it was closed (the last `Refuse`, `Disconnect` or empty `AuthResponse`);
//! - right after `handle_timeout(now)`, `poll_timeout()` is `None` or later than `now`, and a
//!   closed session has no deadline;
//! - notify seqs from `notify` are 1, 2, 3, ...; each is resolved exactly once (an
//!   `NotifyAcked` event or a successful `cancel_notify`), and none is left once closed;
//! - the target never holds more undrained notifies than its budget;
//! - every frame a session sends encodes and decodes back to itself;
//! - `phase()` only moves forward (Handshake, Offers, Established, Closed).
#![no_main]

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use hixl_core::auth::Secret;
use hixl_core::session::{Config, Event, InitiatorSession, Phase, TargetSession};
use hixl_core::wire::Message;
use hixl_core::{Access, Error, MemKind, RemoteRegion};
use hixl_fuzz::In;
use libfuzzer_sys::fuzz_target;

const NONCE_I: [u8; 32] = [0x11; 32];
const NONCE_T: [u8; 32] = [0x22; 32];

fn rank(p: Phase) -> u8 {
    match p {
        Phase::Handshake => 0,
        Phase::Offers => 1,
        Phase::Established => 2,
        Phase::Closed => 3,
    }
}

fn region(k: u64) -> RemoteRegion {
    RemoteRegion {
        addr: 0x1000 * (k + 1),
        len: 4096,
        rkey: k,
        access: Access::REMOTE_RW,
        kind: MemKind::Host,
        name: None,
    }
}

fn lost(peer: &str) -> Error {
    Error::PeerLost {
        peer: peer.to_string(),
        cause: "connection closed".into(),
    }
}

/// What one side has produced so far, and the invariants over it.
#[derive(Default)]
struct Watch {
    closed_events: usize,
    phase: u8,
}

impl Watch {
    fn check(
        &mut self,
        who: &str,
        was_closed: bool,
        closed: bool,
        phase: Phase,
        frames: &[Message],
        events: &[Event],
    ) {
        let r = rank(phase);
        assert!(
            r >= self.phase,
            "invariant violated: {who} phase went backwards to {phase:?}"
        );
        self.phase = r;
        assert_eq!(
            closed,
            phase == Phase::Closed,
            "invariant violated: {who} phase vs is_closed"
        );
        if was_closed {
            assert!(
                frames.is_empty() && events.is_empty(),
                "invariant violated: {who} produced {frames:?} / {events:?} after it closed"
            );
        } else if closed {
            let n = events
                .iter()
                .filter(|e| matches!(e, Event::Closed(_)))
                .count();
            assert_eq!(
                n, 1,
                "invariant violated: {who} closed without one Closed event"
            );
            assert!(
                matches!(events.last(), Some(Event::Closed(_))),
                "invariant violated: {who}'s Closed is not its last event"
            );
        }
        self.closed_events += events
            .iter()
            .filter(|e| matches!(e, Event::Closed(_)))
            .count();
        assert!(
            self.closed_events <= 1,
            "invariant violated: {who} closed twice"
        );
        for m in frames {
            let mut b = BytesMut::new();
            m.encode(&mut b);
            match Message::decode(&mut b) {
                Ok(Some(back)) => assert_eq!(
                    &back, m,
                    "invariant violated: {who} sent a frame that does not round-trip"
                ),
                r => panic!("invariant violated: {who} sent an undecodable frame {m:?}: {r:?}"),
            }
        }
    }
}

struct World {
    now: Instant,
    ini: InitiatorSession,
    tgt: TargetSession,
    /// Frames on their way: to the target, to the initiator.
    to_t: VecDeque<Message>,
    to_i: VecDeque<Message>,
    wi: Watch,
    wt: Watch,
    /// Seqs `notify` returned and not yet resolved.
    open: BTreeSet<u64>,
    last_seq: u64,
    /// Whether the target driver sends its table on `Welcomed`.
    auto_table: bool,
}

impl World {
    /// Moves both sessions' output onto the connection and checks the invariants; the
    /// target's driver answers `Welcomed` with a table when `auto_table` is set.
    fn pump(&mut self, was_closed: (bool, bool)) {
        let mut ti = Vec::new();
        let mut ei = Vec::new();
        let mut tt = Vec::new();
        let mut et = Vec::new();
        loop {
            let mut moved = false;
            while let Some(e) = self.tgt.poll_event() {
                moved = true;
                if matches!(e, Event::Welcomed { .. }) && self.auto_table {
                    let _ = self.tgt.send_table(self.now, vec![region(1), region(2)]);
                }
                et.push(e);
            }
            while let Some(e) = self.ini.poll_event() {
                moved = true;
                if let Event::NotifyAcked { seq, .. } = &e {
                    assert!(
                        self.open.remove(seq),
                        "invariant violated: seq {seq} resolved twice or never sent"
                    );
                }
                ei.push(e);
            }
            while let Some(m) = self.ini.poll_transmit() {
                moved = true;
                ti.push(m.clone());
                self.to_t.push_back(m);
            }
            while let Some(m) = self.tgt.poll_transmit() {
                moved = true;
                tt.push(m.clone());
                self.to_i.push_back(m);
            }
            if !moved {
                break;
            }
        }
        self.wi.check(
            "initiator",
            was_closed.0,
            self.ini.is_closed(),
            self.ini.phase(),
            &ti,
            &ei,
        );
        self.wt.check(
            "target",
            was_closed.1,
            self.tgt.is_closed(),
            self.tgt.phase(),
            &tt,
            &et,
        );
        if self.ini.is_closed() {
            assert!(
                self.open.is_empty(),
                "invariant violated: notifies {:?} unresolved after close",
                self.open
            );
            assert_eq!(self.ini.pending_notifies(), 0);
            assert!(
                self.ini.poll_timeout().is_none(),
                "invariant violated: closed initiator has a deadline"
            );
        }
        if self.tgt.is_closed() {
            assert!(
                self.tgt.poll_timeout().is_none(),
                "invariant violated: closed target has a deadline"
            );
        }
        assert!(
            self.tgt.undrained_notifies() <= self.tgt.notify_budget(),
            "invariant violated: target over its notify budget"
        );
    }

    fn timeouts(&mut self) {
        self.ini.handle_timeout(self.now);
        self.tgt.handle_timeout(self.now);
        for t in [self.ini.poll_timeout(), self.tgt.poll_timeout()]
            .into_iter()
            .flatten()
        {
            assert!(
                t > self.now,
                "invariant violated: deadline {t:?} not after the timeout at {:?}",
                self.now
            );
        }
    }

    fn frame(&mut self, to_target: bool, m: Message) {
        if to_target {
            let _ = self.tgt.handle_frame(self.now, m);
        } else {
            let _ = self.ini.handle_frame(self.now, m);
        }
    }

    fn step(&mut self, inp: &mut In<'_>) {
        let tag = inp.u8();
        let side = tag & 0x80 != 0;
        match tag & 0x7f {
            // Deliver the next frame one way (the usual case: weighted).
            0..=39 => {
                let m = if side {
                    self.to_t.pop_front()
                } else {
                    self.to_i.pop_front()
                };
                if let Some(m) = m {
                    self.frame(side, m);
                }
            }
            40..=44 => {
                let _ = if side {
                    self.to_t.pop_front()
                } else {
                    self.to_i.pop_front()
                };
            }
            45..=46 => {
                let q = if side { &self.to_t } else { &self.to_i };
                if let Some(m) = q.front().cloned() {
                    self.frame(side, m);
                }
            }
            47..=52 => {
                let mut b = BytesMut::from(inp.blob16());
                while let Ok(Some(m)) = Message::decode(&mut b) {
                    self.frame(side, m);
                }
            }
            53..=60 => {
                if let Some(m) = inp.msg() {
                    self.frame(side, m);
                }
            }
            61..=70 => {
                self.now += Duration::from_millis(u64::from(inp.u16()));
            }
            71..=78 => {
                let next = [self.ini.poll_timeout(), self.tgt.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                if let Some(t) = next {
                    self.now = self.now.max(t);
                }
                self.timeouts();
            }
            79..=86 => {
                let n = inp.u8();
                let len = if n & 0x80 != 0 { 1025 } else { usize::from(n) };
                if let Ok(seq) = self.ini.notify(self.now, &vec![7; len], b"m") {
                    assert_eq!(
                        seq,
                        self.last_seq + 1,
                        "invariant violated: notify seqs not 1, 2, 3, ..."
                    );
                    self.last_seq = seq;
                    self.open.insert(seq);
                }
            }
            87..=90 => {
                let n = inp.u8() % 5;
                let _ = self
                    .tgt
                    .send_table(self.now, (0..u64::from(n)).map(region).collect());
            }
            91..=92 => {
                let m = if side {
                    Message::VerbsInfo {
                        devices: b"d".to_vec(),
                    }
                } else {
                    Message::FabricInfo {
                        boot_id: "b".into(),
                        mnt_ns: 1,
                        pid: 2,
                        uid: 3,
                        socket: "s".into(),
                    }
                };
                let _ = self.tgt.offer(m);
            }
            93..=95 => {
                let _ = self.tgt.revoke(u64::from(inp.u8() % 4));
            }
            96..=98 => {
                let _ = self.ini.revoke_ack(u64::from(inp.u8() % 4));
            }
            99..=102 => {
                if side {
                    let _ = self.ini.send_transport(Message::VerbsConnect {
                        rail: 0,
                        device: 0,
                        endpoints: vec![1; 8],
                    });
                } else if inp.u8() & 1 == 0 {
                    let _ = self.tgt.send_transport(Message::VerbsKeys(vec![(1, 0, 11)]));
                } else {
                    let accept = Message::VerbsAccept {
                        rail: 0,
                        status: 0,
                        endpoints: vec![2; 8],
                        reason: String::new(),
                    };
                    let _ = self.tgt.send_transport(accept);
                }
            }
            103..=105 => self.tgt.notifies_drained(usize::from(inp.u8() % 8)),
            106..=108 => {
                let seq = u64::from(inp.u8() % 16);
                if self.ini.cancel_notify(seq) {
                    assert!(
                        self.open.remove(&seq),
                        "invariant violated: cancelled an unknown seq {seq}"
                    );
                }
            }
            109..=112 => {
                let mut m = inp.msg();
                if let Some(m) = m.take() {
                    if side {
                        let _ = self.ini.send_transport(m);
                    } else {
                        let _ = self.tgt.send_transport(m.clone());
                        let _ = self.tgt.offer(m);
                    }
                }
            }
            113..=116 => {
                if side {
                    self.ini.disconnect("fuzz")
                } else {
                    self.tgt.disconnect("fuzz")
                }
            }
            117..=120 => {
                if side {
                    self.tgt.connection_lost(lost("initiator"))
                } else {
                    self.ini.connection_lost(lost("target"))
                }
            }
            _ => self.auto_table = !self.auto_table,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = In(data);
    let h = inp.u8();
    let secret_i = h & 1 != 0;
    let secret_t = h & 2 != 0;
    let differ = h & 4 != 0;
    let interval = Duration::from_millis(if h & 8 != 0 { 7 } else { 1000 });
    let misses = if h & 16 != 0 { 1 } else { 5 };
    let no_timeouts = h & 32 != 0;
    let cfg = |engine: &str, inc: u64, secret: bool, which: &str| Config {
        secret: secret.then(|| Secret::new(format!("a shared secret {which}"))),
        heartbeat_interval: interval,
        heartbeat_miss_limit: misses,
        notify_budget: 4,
        handshake_timeout: (!no_timeouts).then_some(Duration::from_secs(10)),
        ..Config::new(engine, inc)
    };
    let now = Instant::now();
    let ini = InitiatorSession::new(cfg("i", 1, secret_i, "x"), "t", now, NONCE_I);
    let tgt = TargetSession::new(
        cfg("t", 2, secret_t, if differ { "y" } else { "x" }),
        now,
        "a",
        7,
        NONCE_T,
    );
    let mut w = World {
        now,
        ini,
        tgt,
        to_t: VecDeque::new(),
        to_i: VecDeque::new(),
        wi: Watch::default(),
        wt: Watch::default(),
        open: BTreeSet::new(),
        last_seq: 0,
        auto_table: true,
    };
    w.pump((false, false));
    let mut steps = 0;
    while !inp.is_empty() && steps < 4096 {
        steps += 1;
        let was_closed = (w.ini.is_closed(), w.tgt.is_closed());
        w.step(&mut inp);
        w.pump(was_closed);
    }
});
