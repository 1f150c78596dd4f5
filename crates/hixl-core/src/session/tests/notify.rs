//! Notify sequencing, acks, the per-link budget, and resolution on death.

use std::time::Duration;

use super::*;
use crate::status::Status;
use crate::types::NOTIFY_MAX_LEN;

fn acks(p: &Pair) -> Vec<(u64, Result<(), Error>)> {
    p.ini_events
        .iter()
        .filter_map(|e| match &e.1 {
            Event::NotifyAcked { seq, result } => Some((*seq, result.clone())),
            _ => None,
        })
        .collect()
}

fn received(p: &Pair) -> Vec<Vec<u8>> {
    p.tgt_events
        .iter()
        .filter_map(|e| match &e.1 {
            Event::NotifyReceived(n) => Some(n.msg.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn notifies_are_numbered_from_one_and_acked_in_order() {
    let mut p = Pair::new().connect();
    let now = p.now;
    let seqs: Vec<u64> = (0..200u32)
        .map(|i| p.ini.notify(now, b"n", &i.to_le_bytes()).expect("notify"))
        .collect();
    assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
    assert_eq!(p.ini.pending_notifies(), 200);
    p.run_for(Duration::from_millis(10));
    let a = acks(&p);
    assert_eq!(a.len(), 200);
    for (i, (seq, r)) in a.iter().enumerate() {
        assert_eq!(*seq, i as u64 + 1);
        assert!(r.is_ok(), "{r:?}");
    }
    let r = received(&p);
    assert_eq!(r.len(), 200);
    assert!(r
        .iter()
        .enumerate()
        .all(|(i, m)| *m == (i as u32).to_le_bytes()));
    assert!(p
        .tgt_events
        .iter()
        .all(|e| !matches!(&e.1, Event::NotifyReceived(n) if n.from != "10.0.0.1")));
    assert_eq!(p.ini.pending_notifies(), 0);
}

#[test]
fn notify_length_limits_name_the_offending_length() {
    let mut p = Pair::new().connect();
    let now = p.now;
    let big = vec![0u8; NOTIFY_MAX_LEN + 7];
    match p.ini.notify(now, &big, b"") {
        Err(Error::NotifyTooLong { field, len, max }) => {
            assert_eq!(
                (field, len, max),
                ("name", NOTIFY_MAX_LEN + 7, NOTIFY_MAX_LEN)
            )
        }
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        p.ini.notify(now, b"", &big),
        Err(Error::NotifyTooLong { field: "msg", .. })
    ));
    let max = vec![1u8; NOTIFY_MAX_LEN];
    assert_eq!(
        p.ini.notify(now, &max, &max).ok(),
        Some(1),
        "the limit itself is fine"
    );
}

#[test]
fn notify_before_the_table_is_not_connected() {
    let now = Instant::now();
    let mut i = InitiatorSession::new(config("i", 1), "t", now, NONCE_I);
    assert!(matches!(
        i.notify(now, b"a", b"b"),
        Err(Error::NotConnected { .. })
    ));
}

#[test]
fn budget_is_per_link_not_per_engine_name() {
    let mut tcfg = config("t", 2);
    tcfg.notify_budget = 3;
    // Two initiators with the same engine name on one target engine.
    let mut a = Pair::with(config("10.0.0.1", 1), tcfg.clone()).connect();
    let mut b = Pair::with(config("10.0.0.1", 3), tcfg).connect();
    let now = a.now;
    for i in 0..5u8 {
        a.ini.notify(now, b"a", &[i]).expect("notify");
    }
    a.run_for(Duration::from_millis(10));
    let r = acks(&a);
    assert_eq!(r.len(), 5);
    assert!(r[..3].iter().all(|x| x.1.is_ok()));
    for (_, x) in &r[3..] {
        assert!(matches!(x, Err(Error::NotifyQueueFull { .. })), "{x:?}");
    }
    assert!(a.frames(Dir::ToInitiator).contains(&Message::NotifyAck {
        seq: 4,
        status: Status::ResourceExhausted.code()
    }));
    assert_eq!(received(&a).len(), 3, "refused notifies are not queued");
    assert_eq!(a.tgt.undrained_notifies(), 3);
    // The other link's budget is untouched.
    let now = b.now;
    for i in 0..3u8 {
        b.ini.notify(now, b"b", &[i]).expect("notify");
    }
    b.run_for(Duration::from_millis(10));
    assert!(acks(&b).iter().all(|x| x.1.is_ok()));
    // Draining frees the budget again.
    a.tgt.notifies_drained(2);
    let now = a.now;
    for _ in 0..3 {
        a.ini.notify(now, b"a", b"later").expect("notify");
    }
    a.run_for(Duration::from_millis(10));
    let later: Vec<_> = acks(&a)[5..].iter().map(|x| x.1.is_ok()).collect();
    assert_eq!(later, vec![true, true, false]);
}

#[test]
fn initiator_limits_notifies_waiting_for_acks() {
    let mut icfg = config("i", 1);
    icfg.notify_budget = 2;
    let mut p = Pair::with(icfg, config("t", 2)).connect();
    let now = p.now;
    p.ini.notify(now, b"", b"").expect("1");
    p.ini.notify(now, b"", b"").expect("2");
    assert!(matches!(
        p.ini.notify(now, b"", b""),
        Err(Error::NotifyQueueFull { limit: 2, .. })
    ));
    p.run_for(Duration::from_millis(10));
    assert_eq!(p.ini.notify(now, b"", b"").ok(), Some(3));
}

#[test]
fn pending_notifies_fail_with_the_cause_when_the_link_dies() {
    let mut p = Pair::new().connect();
    p.filter = Box::new(|d, _| {
        if d == Dir::ToInitiator {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    let now = p.now;
    for _ in 0..10 {
        p.ini.notify(now, b"x", b"y").expect("notify");
    }
    p.run_for(Duration::from_secs(30));
    let (_, cause) = p.ini_closed().expect("closed");
    let a = acks(&p);
    assert_eq!(
        a.iter().map(|x| x.0).collect::<Vec<_>>(),
        (1..=10).collect::<Vec<_>>()
    );
    for (_, r) in a {
        assert_eq!(r.map_err(|e| e.to_string()), Err(cause.to_string()));
    }
    // The failures come before Closed, so a driver resolves every waiter before it forgets
    // the session.
    let pos_closed = p
        .ini_events
        .iter()
        .position(|e| matches!(e.1, Event::Closed(_)));
    let pos_last_ack = p
        .ini_events
        .iter()
        .rposition(|e| matches!(e.1, Event::NotifyAcked { .. }));
    assert!(pos_last_ack < pos_closed);
    assert_eq!(p.ini.pending_notifies(), 0);
    assert!(matches!(
        p.ini.notify(now, b"", b""),
        Err(Error::HeartbeatLost { .. })
    ));
}

#[test]
fn unknown_and_cancelled_acks_are_ignored() {
    let mut p = Pair::new().connect();
    let now = p.now;
    // A seq never sent.
    p.ini
        .handle_frame(
            now,
            Message::NotifyAck {
                seq: 999,
                status: 0,
            },
        )
        .expect("ignored");
    // A notify whose waiter gave up.
    let seq = p.ini.notify(now, b"", b"").expect("notify");
    assert!(p.ini.cancel_notify(seq));
    assert!(!p.ini.cancel_notify(seq));
    p.run_for(Duration::from_millis(10));
    assert!(acks(&p).is_empty());
    // A duplicate ack.
    let seq = p.ini.notify(p.now, b"", b"").expect("notify");
    p.run_for(Duration::from_millis(10));
    let t = p.now;
    p.ini
        .handle_frame(t, Message::NotifyAck { seq, status: 0 })
        .expect("ignored");
    p.flush();
    assert_eq!(acks(&p).len(), 1);
    assert!(!p.ini.is_closed());
}

#[test]
fn refused_notify_with_another_status_is_a_remote_error() {
    let mut p = Pair::new().connect();
    let now = p.now;
    p.filter = Box::new(|d, m| match (d, m) {
        (Dir::ToInitiator, Message::NotifyAck { .. }) => Fate::Drop,
        _ => Fate::Deliver,
    });
    let seq = p.ini.notify(now, b"", b"").expect("notify");
    p.ini
        .handle_frame(
            now,
            Message::NotifyAck {
                seq,
                status: Status::Unsupported.code(),
            },
        )
        .expect("alive");
    p.flush();
    assert!(matches!(
        &acks(&p)[..],
        [(
            _,
            Err(Error::Remote {
                status: Status::Unsupported,
                ..
            })
        )]
    ));
}

#[test]
fn driver_admission_acks_only_once_the_driver_answers() {
    let tgt = Config {
        notify_admission: Admission::Driver,
        ..config("10.0.0.2:5000", 2)
    };
    let mut p = Pair::with(config("10.0.0.1", 1), tgt).connect();
    let now = p.now;
    let a = p.ini.notify(now, b"n", b"a").expect("notify");
    let b = p.ini.notify(now, b"n", b"b").expect("notify");
    p.run_for(Duration::from_millis(10));
    assert!(acks(&p).is_empty(), "no ack before the driver answered");
    assert!(received(&p).is_empty(), "offered, not received");
    let offered: Vec<(u64, Vec<u8>)> = p
        .tgt_events
        .iter()
        .filter_map(|e| match &e.1 {
            Event::NotifyOffered { seq, notify } => Some((*seq, notify.msg.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(offered, vec![(a, b"a".to_vec()), (b, b"b".to_vec())]);
    p.tgt.ack_notify(b, false).expect("answer b");
    p.tgt.ack_notify(a, true).expect("answer a");
    assert!(
        matches!(
            p.tgt.ack_notify(a, true),
            Err(Error::SessionNotPending { what: "notify", .. })
        ),
        "answered once only"
    );
    assert!(matches!(
        p.tgt.ack_notify(99, true),
        Err(Error::SessionNotPending {
            what: "notify",
            id: 99
        })
    ));
    p.run_for(Duration::from_millis(10));
    let got = acks(&p);
    assert_eq!(got.len(), 2);
    assert!(got.iter().any(|(s, r)| *s == a && r.is_ok()));
    assert!(got
        .iter()
        .any(|(s, r)| *s == b && matches!(r, Err(Error::NotifyQueueFull { .. }))));
}

#[test]
fn driver_admission_refuses_a_repeated_seq() {
    let tgt = Config {
        notify_admission: Admission::Driver,
        ..config("10.0.0.2:5000", 2)
    };
    let mut t = TargetSession::new(tgt, Instant::now(), "10.0.0.1:4", 9, [0; 32]);
    let now = Instant::now();
    t.handle_frame(
        now,
        Message::Hello {
            engine: "10.0.0.1".into(),
            channel: crate::wire::Channel::Control,
            session: 1,
            features: crate::wire::FEATURES,
        },
    )
    .expect("hello");
    t.send_table(now, Vec::new()).expect("table");
    let n = || Message::Notify {
        seq: 5,
        name: b"n".to_vec(),
        msg: b"m".to_vec(),
    };
    t.handle_frame(now, n()).expect("first");
    assert!(matches!(
        t.handle_frame(now, n()),
        Err(Error::Protocol { .. })
    ));
}
