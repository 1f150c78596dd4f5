//! Table updates, revocation, transport pass-through, disconnects and protocol violations.

use std::time::Duration;

use super::*;
use crate::status::Status;
use crate::wire::{Channel, DataReq};

#[test]
fn table_update_during_traffic() {
    let mut p = Pair::new().connect();
    for round in 0..20u64 {
        let now = p.now;
        for _ in 0..5 {
            p.ini.notify(now, b"n", b"m").expect("notify");
        }
        if round % 4 == 3 {
            let t = vec![region(0x9000 + round, round), region(0x100, 100 + round)];
            p.tgt.send_table(now, t).expect("update");
        }
        p.run_for(Duration::from_millis(300));
    }
    let updates: Vec<_> = p
        .ini_events
        .iter()
        .filter_map(|e| match &e.1 {
            Event::TableUpdated(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(updates.len(), 5);
    assert_eq!(updates[4][0].addr, 0x100, "sorted");
    assert_eq!(p.ini.table(), &updates[4][..]);
    let acked = p
        .ini_events
        .iter()
        .filter(|e| matches!(&e.1, Event::NotifyAcked { result: Ok(()), .. }))
        .count();
    assert_eq!(acked, 100);
    assert!(!p.ini.is_closed() && !p.tgt.is_closed());
}

#[test]
fn revocation_round_trip() {
    let mut p = Pair::new().connect();
    let now = p.now;
    p.tgt.revoke(2).expect("revoke");
    assert!(
        matches!(p.tgt.revoke(2), Err(Error::AlreadyRevoking { rkey: 2 })),
        "already revoking"
    );
    p.run_for(Duration::from_millis(10));
    assert!(p
        .ini_events
        .iter()
        .any(|e| matches!(e.1, Event::Revoked { rkey: 2 })));
    assert!(!p
        .tgt_events
        .iter()
        .any(|e| matches!(e.1, Event::RevokeAcked { .. })));
    assert!(matches!(
        p.ini.revoke_ack(3),
        Err(Error::SessionNotPending {
            what: "rkey",
            id: 3
        })
    ));
    p.ini.revoke_ack(2).expect("ack");
    assert!(p.ini.revoke_ack(2).is_err(), "once");
    p.run_for(Duration::from_millis(10));
    assert!(p
        .tgt_events
        .iter()
        .any(|e| matches!(e.1, Event::RevokeAcked { rkey: 2 })));
    // A region the initiator never had in its table is acked at once, without an event.
    p.tgt.revoke(77).expect("revoke");
    p.run_for(Duration::from_millis(10));
    assert!(!p
        .ini_events
        .iter()
        .any(|e| matches!(e.1, Event::Revoked { rkey: 77 })));
    assert!(p
        .tgt_events
        .iter()
        .any(|e| matches!(e.1, Event::RevokeAcked { rkey: 77 })));
    // An ack nobody asked for is a violation.
    let _ = p.tgt.handle_frame(now, Message::RevokeAck { rkey: 5 });
    assert!(matches!(p.tgt.error(), Some(Error::Protocol { .. })));
}

#[test]
fn verbs_negotiation_passes_through() {
    let mut p = Pair::new().connect();
    let connect = Message::VerbsConnect {
        rail: 0,
        device: 0,
        endpoints: vec![1, 2, 3],
    };
    // The target cannot answer what was not asked.
    let accept = Message::VerbsAccept {
        rail: 0,
        status: 0,
        endpoints: vec![9],
        reason: String::new(),
    };
    assert!(p.tgt.send_transport(accept.clone()).is_err());
    assert!(p.ini.send_transport(Message::VerbsKeys(vec![])).is_err());
    p.ini.send_transport(connect.clone()).expect("connect");
    p.run_for(Duration::from_millis(10));
    assert!(p
        .tgt_events
        .iter()
        .any(|e| matches!(&e.1, Event::TransportMessage(m) if *m == connect)));
    let keys = Message::VerbsKeys(vec![(1, 0, 11), (2, 1, 22)]);
    p.tgt.send_transport(keys.clone()).expect("keys");
    p.tgt.send_transport(accept.clone()).expect("accept");
    p.run_for(Duration::from_millis(10));
    let passed: Vec<_> = p
        .ini_events
        .iter()
        .filter_map(|e| match &e.1 {
            Event::TransportMessage(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(passed, vec![keys, accept.clone()]);
    // A second, unsolicited accept is a violation at the initiator.
    let now = p.now;
    let _ = p.ini.handle_frame(now, accept);
    assert!(matches!(p.ini.error(), Some(Error::Protocol { .. })));
}

#[test]
fn an_unserved_transport_request_is_refused_unsupported() {
    let mut p = Pair::new().connect();
    let connect = Message::VerbsConnect {
        rail: 0,
        device: 0,
        endpoints: vec![1, 2, 3],
    };
    assert!(
        p.tgt.refuse_transport(&connect, "no").is_err(),
        "nothing was asked yet"
    );
    assert!(p
        .tgt
        .refuse_transport(&Message::Heartbeat { seq: 1 }, "no")
        .is_err());
    p.ini.send_transport(connect.clone()).expect("connect");
    p.run_for(Duration::from_millis(10));
    p.tgt
        .refuse_transport(&connect, "not offered")
        .expect("refuse");
    p.run_for(Duration::from_millis(10));
    let answer = p.ini_events.iter().find_map(|e| match &e.1 {
        Event::TransportMessage(m @ Message::VerbsAccept { .. }) => Some(m.clone()),
        _ => None,
    });
    assert_eq!(
        answer,
        Some(Message::VerbsAccept {
            rail: 0,
            status: Status::Unsupported.code(),
            endpoints: Vec::new(),
            reason: "not offered".into(),
        })
    );
    assert!(!p.ini.is_closed() && !p.tgt.is_closed());
}

#[test]
fn initiator_disconnects() {
    let mut p = Pair::new().connect();
    let now = p.now;
    p.ini.notify(now, b"", b"").expect("notify");
    p.ini.disconnect("bye");
    p.run_for(Duration::from_millis(10));
    let (_, ie) = p.ini_closed().expect("closed");
    assert!(matches!(ie, Error::NotConnected { .. }));
    assert!(matches!(
        p.frames(Dir::ToTarget).last(),
        Some(Message::Disconnect { reason }) if reason == "bye"
    ));
    let (_, te) = p.tgt_closed().expect("target closed");
    assert!(matches!(te, Error::PeerLost { cause, .. } if cause == "peer disconnected: bye"));
    // The notify queued before the disconnect went out and its waiter was resolved.
    assert!(p.ini_events.iter().any(|e| matches!(
        &e.1,
        Event::NotifyAcked {
            seq: 1,
            result: Err(Error::NotConnected { .. })
        }
    )));
}

#[test]
fn target_disconnects() {
    let mut p = Pair::new().connect();
    p.tgt.disconnect("engine finalized");
    p.run_for(Duration::from_millis(10));
    assert!(matches!(
        p.tgt_closed(),
        Some((_, Error::NotConnected { .. }))
    ));
    let (_, ie) = p.ini_closed().expect("closed");
    assert!(
        matches!(ie, Error::PeerLost { cause, .. } if cause == "peer disconnected: engine finalized")
    );
    assert_eq!(
        p.frames(Dir::ToInitiator)
            .iter()
            .filter(|m| matches!(m, Message::Disconnect { .. }))
            .count(),
        1
    );
}

#[test]
fn memtable_before_welcome_is_a_violation() {
    let now = Instant::now();
    let mut i = InitiatorSession::new(config("i", 1), "t", now, NONCE_I);
    assert!(i
        .handle_frame(now, Message::MemTable(vec![region(1, 1)]))
        .is_err());
    assert!(
        matches!(i.error(), Some(Error::Protocol { reason, .. }) if reason.contains("expected welcome"))
    );
    assert!(i.table().is_empty());
    assert_eq!(drain_i(&mut i).len(), 1, "the hello only");
    let ev = events_i(&mut i);
    assert!(matches!(&ev[..], [Event::Closed(Error::Protocol { .. })]));
}

#[test]
fn data_messages_on_control_are_violations() {
    let req = DataReq {
        id: 1,
        rkey: 1,
        addr: 0x1000,
        len: 8,
    };
    let mut p = Pair::new().connect();
    let now = p.now;
    assert!(p.tgt.handle_frame(now, Message::WriteReq(req)).is_err());
    assert!(
        matches!(p.tgt.error(), Some(Error::Protocol { reason, .. }) if reason.contains("on the control connection"))
    );
    let mut p = Pair::new().connect();
    assert!(p
        .ini
        .handle_frame(now, Message::Ack { id: 1, status: 0 })
        .is_err());
    assert!(matches!(p.ini.error(), Some(Error::Protocol { .. })));
    // Between welcome and table the initiator has nothing to say.
    let mut t = TargetSession::new(config("t", 2), now, "a", 7, NONCE_T);
    let hello = Message::Hello {
        engine: "i".into(),
        channel: Channel::Control,
        session: 1,
        features: crate::wire::FEATURES,
    };
    t.handle_frame(now, hello).expect("hello");
    assert!(t.handle_frame(now, Message::Heartbeat { seq: 1 }).is_err());
}

#[test]
fn data_hello_or_garbage_first_frame_on_a_control_session() {
    let now = Instant::now();
    for first in [
        Message::Hello {
            engine: "i".into(),
            channel: Channel::Data,
            session: SESSION,
            features: crate::wire::FEATURES,
        },
        Message::Notify {
            seq: 1,
            name: vec![],
            msg: vec![],
        },
    ] {
        let mut t = TargetSession::new(config("t", 2), now, "a", 7, NONCE_T);
        assert!(t.handle_frame(now, first).is_err());
        assert!(matches!(t.error(), Some(Error::Protocol { .. })));
        assert!(drain_t(&mut t).is_empty(), "nothing is sent");
    }
}

#[test]
fn after_close_everything_fails_with_the_cause() {
    let mut p = Pair::new().connect();
    p.tgt.disconnect("bye");
    p.run_for(Duration::from_millis(10));
    let now = p.now;
    let cause = p.ini.error().expect("closed").to_string();
    assert_eq!(
        p.ini.notify(now, b"", b"").map_err(|e| e.to_string()),
        Err(cause.clone())
    );
    assert!(p
        .ini
        .handle_frame(now, Message::Heartbeat { seq: 1 })
        .is_err());
    assert!(p
        .ini
        .send_transport(Message::VerbsConnect {
            rail: 0,
            device: 0,
            endpoints: vec![],
        })
        .is_err());
    p.ini.disconnect("again");
    p.ini.handle_timeout(now + Duration::from_secs(100));
    assert!(drain_i(&mut p.ini).is_empty());
    assert!(events_i(&mut p.ini).is_empty(), "one Closed only");
    assert_eq!(p.ini.poll_timeout(), None);
    assert!(p.tgt.send_table(now, vec![]).is_err());
    assert!(p.tgt.revoke(1).is_err());
    assert_eq!(p.tgt.phase(), Phase::Closed);
}

#[test]
fn reordered_frames_during_traffic() {
    // Every third frame to the target is held back 50 ms: notifies then arrive out of
    // order, and acks for them still resolve the right seqs.
    let mut p = Pair::new().connect();
    let mut n = 0u32;
    p.filter = Box::new(move |d, _| {
        n += 1;
        if d == Dir::ToTarget && n % 3 == 0 {
            Fate::Delay(Duration::from_millis(50))
        } else {
            Fate::Deliver
        }
    });
    let now = p.now;
    for _ in 0..30 {
        p.ini.notify(now, b"", b"").expect("notify");
    }
    p.run_for(Duration::from_secs(1));
    let mut seqs: Vec<u64> = p
        .ini_events
        .iter()
        .filter_map(|e| match &e.1 {
            Event::NotifyAcked {
                seq,
                result: Ok(()),
            } => Some(*seq),
            _ => None,
        })
        .collect();
    assert_ne!(seqs, (1..=30).collect::<Vec<_>>(), "reordered");
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
}

#[test]
fn messages_the_wire_cannot_carry_are_refused() {
    let mut p = Pair::new().connect();
    let long = Message::VerbsConnect {
        rail: 0,
        device: 0,
        endpoints: vec![0; crate::wire::MAX_ENDPOINTS + 1],
    };
    assert!(matches!(
        p.ini.send_transport(long),
        Err(Error::Unsendable {
            source: Some(_),
            ..
        })
    ));
    // A refused accept does not use up the pending connect.
    p.ini
        .send_transport(Message::VerbsConnect {
            rail: 0,
            device: 0,
            endpoints: vec![1],
        })
        .expect("connect");
    p.run_for(Duration::from_millis(10));
    let bad = Message::VerbsAccept {
        rail: 0,
        status: 0,
        endpoints: vec![0; crate::wire::MAX_ENDPOINTS + 1],
        reason: String::new(),
    };
    assert!(p.tgt.send_transport(bad).is_err());
    let good = Message::VerbsAccept {
        rail: 0,
        status: 0,
        endpoints: vec![2],
        reason: String::new(),
    };
    p.tgt.send_transport(good).expect("still answerable");
    // A very long reason is cut to something the peer decodes.
    p.ini.disconnect(&"é".repeat(40_000));
    let Some(Message::Disconnect { reason }) = drain_i(&mut p.ini).pop() else {
        panic!("no disconnect")
    };
    assert!(reason.len() <= 1024 && reason.starts_with('é'));
}

#[test]
fn config_from_options() {
    let o = crate::Options::from_pairs([
        ("hixl.HeartbeatIntervalMs", "250"),
        ("hixl.HeartbeatMissLimit", "3"),
        ("hixl.AuthSecret", "correct horse battery"),
    ])
    .expect("options");
    let c = Config::from_options(&o, "10.0.0.1", 9);
    assert_eq!(c.heartbeat_interval, Duration::from_millis(250));
    assert_eq!(c.heartbeat_miss_limit, 3);
    assert_eq!(c.secret, Some(Secret::new("correct horse battery")));
    assert_eq!((c.engine.as_str(), c.incarnation), ("10.0.0.1", 9));
    assert_eq!(c.notify_budget, crate::NOTIFY_MAX_PENDING);
}

/// `sync` is a barrier: its `Synced` comes after every table the target sent before it
/// answered, even with the frames delayed; before the link is established, and after it
/// closed, it is refused.
#[test]
fn a_sync_follows_every_table_sent_before_its_answer() {
    let mut fresh = Pair::new();
    let now = fresh.now;
    assert!(matches!(
        fresh.ini.sync(now),
        Err(Error::SessionOutOfPhase { .. })
    ));
    let mut p = Pair::new().connect();
    let now = p.now;
    for k in 0..3 {
        p.tgt
            .send_table(now, vec![region(0x1000 * (k + 1), k)])
            .expect("update");
    }
    let seq = p.ini.sync(now).expect("sync");
    let other = p.ini.sync(now).expect("second sync");
    assert_ne!(seq, other);
    p.run_for(Duration::from_millis(50));
    let at = |want: &dyn Fn(&Event) -> bool| p.ini_events.iter().position(|e| want(&e.1));
    let synced = at(&|e| matches!(e, Event::Synced { seq: s } if *s == seq)).expect("synced");
    let last_table = at(&|e| matches!(e, Event::TableUpdated(t) if t[0].addr == 0x3000))
        .expect("the last table");
    assert!(last_table < synced, "the table came first");
    assert!(at(&|e| matches!(e, Event::Synced { seq: s } if *s == other)).is_some());
    assert_eq!(p.ini.table()[0].addr, 0x3000);
    p.ini.disconnect("done");
    assert!(p.ini.sync(p.now).is_err());
}
