//! Random inputs never panic and keep the invariants of a closed session.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::wire::{Channel, DataReq, FabricRegion, HEARTBEAT_FROM_TARGET};

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9:.]{0,12}"
}

fn message() -> impl Strategy<Value = Message> {
    let secret = Secret::new("correct horse battery");
    let proof = Message::AuthProof {
        mac: secret.target_mac(&NONCE_T, &NONCE_I).to_vec(),
    };
    let response = Message::AuthResponse {
        nonce: NONCE_I.to_vec(),
        mac: secret.initiator_mac(&NONCE_T, &NONCE_I).to_vec(),
    };
    let req =
        (any::<u64>(), 0u64..4, any::<u64>(), any::<u64>()).prop_map(|(id, rkey, addr, len)| {
            DataReq {
                id,
                rkey,
                addr,
                len,
            }
        });
    prop_oneof![
        (
            text(),
            0u8..3,
            prop_oneof![Just(1u64), Just(2u64), any::<u64>()]
        )
            .prop_map(|(engine, c, session)| Message::Hello {
                engine,
                channel: [Channel::Control, Channel::Data, Channel::Fabric][c as usize],
                session,
                features: crate::wire::FEATURES,
            }),
        (text(), any::<u64>(), any::<u64>()).prop_map(|(engine, session, incarnation)| {
            Message::Welcome {
                engine,
                session,
                incarnation,
                features: crate::wire::FEATURES,
            }
        }),
        (any::<u32>(), text()).prop_map(|(status, reason)| Message::Refuse { status, reason }),
        proptest::collection::vec((0u64..8, 0u64..4), 0..4).prop_map(|v| Message::MemTable(
            v.into_iter().map(|(a, k)| region(a << 12, k)).collect()
        )),
        (0u64..8, bytes(4), bytes(4)).prop_map(|(seq, name, msg)| Message::Notify {
            seq,
            name,
            msg
        }),
        (
            0u64..8,
            prop_oneof![Just(0u32), Just(203_900u32), any::<u32>()]
        )
            .prop_map(|(seq, status)| Message::NotifyAck { seq, status }),
        (0u64..4, any::<bool>()).prop_map(|(s, t)| Message::Heartbeat {
            seq: if t { s | HEARTBEAT_FROM_TARGET } else { s }
        }),
        text().prop_map(|reason| Message::Disconnect { reason }),
        req.clone().prop_map(Message::WriteReq),
        req.prop_map(Message::ReadReq),
        (any::<u64>(), any::<u32>(), any::<u64>())
            .prop_map(|(id, status, len)| Message::ReadResp { id, status, len }),
        (any::<u64>(), any::<u32>()).prop_map(|(id, status)| Message::Ack { id, status }),
        text().prop_map(|socket| Message::FabricInfo {
            boot_id: "b".into(),
            mnt_ns: 1,
            pid: 2,
            uid: 3,
            socket
        }),
        Just(Message::FabricTable(vec![FabricRegion {
            rkey: 1,
            addr: 0x1000,
            len: 8,
            fd_index: 0
        }])),
        (0u64..4).prop_map(|rkey| Message::Revoke { rkey }),
        (0u64..4).prop_map(|rkey| Message::RevokeAck { rkey }),
        bytes(8).prop_map(|devices| Message::VerbsInfo { devices }),
        (0u32..3, 0u32..3, bytes(8)).prop_map(|(rail, device, endpoints)| {
            Message::VerbsConnect {
                rail,
                device,
                endpoints,
            }
        }),
        (
            0u32..3,
            prop_oneof![Just(0u32), any::<u32>()],
            bytes(8),
            text()
        )
            .prop_map(|(rail, status, endpoints, reason)| Message::VerbsAccept {
                rail,
                status,
                endpoints,
                reason
            }),
        proptest::collection::vec((0u64..4, 0u32..3, any::<u32>()), 0..3)
            .prop_map(Message::VerbsKeys),
        prop_oneof![Just(NONCE_T.to_vec()), bytes(40)]
            .prop_map(|nonce| Message::AuthChallenge { nonce }),
        prop_oneof![
            Just(response),
            (bytes(40), bytes(40)).prop_map(|(nonce, mac)| Message::AuthResponse { nonce, mac })
        ],
        prop_oneof![
            Just(proof),
            bytes(40).prop_map(|mac| Message::AuthProof { mac })
        ],
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Frame(Message),
    Advance(u64),
    Timeout,
    Notify(usize),
    Table(u8),
    Offer,
    Revoke(u64),
    RevokeAck(u64),
    Transport(Message),
    Drained(usize),
    Cancel(u64),
    Disconnect,
    Lost,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => message().prop_map(Op::Frame),
        2 => (0u64..3000).prop_map(Op::Advance),
        2 => Just(Op::Timeout),
        1 => prop_oneof![Just(0usize), Just(1025usize)].prop_map(Op::Notify),
        1 => any::<u8>().prop_map(Op::Table),
        1 => Just(Op::Offer),
        1 => (0u64..4).prop_map(Op::Revoke),
        1 => (0u64..4).prop_map(Op::RevokeAck),
        1 => message().prop_map(Op::Transport),
        1 => (0usize..3).prop_map(Op::Drained),
        1 => (0u64..8).prop_map(Op::Cancel),
        1 => Just(Op::Disconnect),
        1 => Just(Op::Lost),
    ]
}

/// Checks the invariants of one step's outputs: nothing but one last frame once closed, one
/// `Closed` event, the last event, and no deadline in the past after a timeout.
struct Watch {
    closed_before: bool,
    closed_events: usize,
}

impl Watch {
    fn step(&mut self, closed_now: bool, frames: &[Message], events: &[Event]) {
        if self.closed_before {
            assert!(frames.is_empty(), "frames after close: {frames:?}");
            assert!(events.is_empty(), "events after close: {events:?}");
        } else if closed_now {
            let n = events
                .iter()
                .filter(|e| matches!(e, Event::Closed(_)))
                .count();
            assert_eq!(n, 1);
            assert!(matches!(events.last(), Some(Event::Closed(_))));
        }
        self.closed_events += events
            .iter()
            .filter(|e| matches!(e, Event::Closed(_)))
            .count();
        assert!(self.closed_events <= 1);
        self.closed_before = closed_now;
    }
}

fn configs(secret: bool) -> (Config, Config) {
    if secret {
        (
            secret_config("i", 1, "correct horse battery"),
            secret_config("t", 2, "correct horse battery"),
        )
    } else {
        (config("i", 1), config("t", 2))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs_never_panic_the_initiator(secret in any::<bool>(), ops in proptest::collection::vec(op(), 0..60)) {
        let base = Instant::now();
        let mut now = base;
        let mut s = InitiatorSession::new(configs(secret).0, "t", now, NONCE_I);
        let mut w = Watch { closed_before: false, closed_events: 0 };
        for op in ops {
            let was_closed = s.is_closed();
            match op {
                Op::Frame(m) => { let _ = s.handle_frame(now, m); }
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::Timeout => {
                    if let Some(t) = s.poll_timeout() { now = now.max(t); }
                    s.handle_timeout(now);
                    if let Some(t) = s.poll_timeout() { prop_assert!(t > now, "deadline not moved on"); }
                }
                Op::Notify(len) => { let _ = s.notify(now, &vec![0; len], b""); }
                Op::Revoke(_) | Op::Table(_) | Op::Offer | Op::Drained(_) => {}
                Op::RevokeAck(rkey) => { let _ = s.revoke_ack(rkey); }
                Op::Transport(m) => { let _ = s.send_transport(m); }
                Op::Cancel(seq) => { s.cancel_notify(seq); }
                Op::Disconnect => s.disconnect("x"),
                Op::Lost => s.connection_lost(lost("t")),
            }
            let frames = drain_i(&mut s);
            let events = events_i(&mut s);
            w.closed_before = was_closed;
            w.step(s.is_closed(), &frames, &events);
            if s.is_closed() { prop_assert_eq!(s.pending_notifies(), 0); prop_assert!(s.poll_timeout().is_none()); }
        }
    }

    #[test]
    fn random_inputs_never_panic_the_target(secret in any::<bool>(), ops in proptest::collection::vec(op(), 0..60)) {
        let base = Instant::now();
        let mut now = base;
        let mut s = TargetSession::new(configs(secret).1, now, "a", SESSION, NONCE_T);
        let mut w = Watch { closed_before: false, closed_events: 0 };
        for op in ops {
            let was_closed = s.is_closed();
            match op {
                Op::Frame(m) => { let _ = s.handle_frame(now, m); }
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::Timeout => {
                    if let Some(t) = s.poll_timeout() { now = now.max(t); }
                    s.handle_timeout(now);
                    if let Some(t) = s.poll_timeout() { prop_assert!(t > now, "deadline not moved on"); }
                }
                Op::Table(n) => { let _ = s.send_table(now, (0..u64::from(n % 4)).map(|k| region(k << 12, k)).collect()); }
                Op::Offer => { let _ = s.offer(Message::VerbsInfo { devices: b"d".to_vec() }); }
                Op::Revoke(rkey) => { let _ = s.revoke(rkey); }
                Op::Transport(m) => { let _ = s.send_transport(m); }
                Op::Drained(n) => s.notifies_drained(n),
                Op::Notify(_) | Op::RevokeAck(_) | Op::Cancel(_) => {}
                Op::Disconnect => s.disconnect("x"),
                Op::Lost => s.connection_lost(lost("i")),
            }
            let frames = drain_t(&mut s);
            let events = events_t(&mut s);
            w.closed_before = was_closed;
            w.step(s.is_closed(), &frames, &events);
            prop_assert!(s.undrained_notifies() <= s.notify_budget());
        }
    }

    /// Two honest sessions over a connection that drops or delays random frames: whatever
    /// happens, both end closed or both alive, and nothing panics.
    #[test]
    fn lossy_pairs_never_panic(secret in any::<bool>(), fates in proptest::collection::vec(0u8..8, 1..64), steps in 1usize..200) {
        let (i, t) = configs(secret);
        let mut p = Pair::with(i, t);
        let mut k = 0usize;
        p.filter = Box::new(move |_, _| {
            k += 1;
            match fates[k % fates.len()] {
                0 => Fate::Drop,
                1 => Fate::Delay(Duration::from_millis(700)),
                _ => Fate::Deliver,
            }
        });
        for n in 0..steps {
            let now = p.now;
            if n % 7 == 0 { let _ = p.ini.notify(now, b"n", b"m"); }
            if n % 11 == 0 { let _ = p.tgt.send_table(now, vec![region(0x1000, 1)]); }
            let limit = p.now + Duration::from_secs(3);
            if !p.step(limit) { p.run_until(limit); }
        }
        p.run_for(Duration::from_secs(60));
        if p.ini.is_closed() || p.tgt.is_closed() {
            // A closed side's socket close reaches the other (EOFs are never dropped).
            prop_assert!(p.ini.is_closed() && p.tgt.is_closed());
        }
    }
    /// Over a lossless connection, random traffic keeps both sides up and every notify is
    /// acked, in order, with success. The round trip must stay under the 5 s bound: the
    /// target starts its clock when it sends the table and first hears the initiator a round
    /// trip later.
    #[test]
    fn lossless_random_traffic_stays_up(
        secret in any::<bool>(),
        latency in 0u64..2400,
        ops in proptest::collection::vec((0u8..3, 0u64..4000), 1..40),
    ) {
        let (i, t) = configs(secret);
        let mut p = Pair::with(i, t);
        p.latency = Duration::from_millis(latency);
        p.run_for(Duration::from_secs(10));
        prop_assert_eq!(p.ini.phase(), Phase::Established);
        let mut sent = Vec::new();
        for (n, (kind, wait)) in ops.into_iter().enumerate() {
            let now = p.now;
            match kind {
                0 => sent.push(p.ini.notify(now, b"n", &n.to_le_bytes()).expect("notify")),
                1 => p.tgt.send_table(now, vec![region(0x1000 * n as u64, n as u64)]).expect("table"),
                _ => {}
            }
            p.run_for(Duration::from_millis(wait));
        }
        p.run_for(Duration::from_millis(2 * latency + 10));
        prop_assert_eq!(p.ini.phase(), Phase::Established);
        prop_assert_eq!(p.tgt.phase(), Phase::Established);
        let acked: Vec<u64> = p.ini_events.iter().filter_map(|e| match &e.1 {
            Event::NotifyAcked { seq, result: Ok(()) } => Some(*seq),
            _ => None,
        }).collect();
        prop_assert_eq!(acked, sent);
    }
}
