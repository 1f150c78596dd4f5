//! Hello, authentication, welcome and refusal, transport offers.

use std::time::Duration;

use super::*;
use crate::status::Status;
use crate::wire::{Channel, REFUSE_SELF};

fn auth_failed(e: &Error) -> &str {
    match e {
        Error::AuthFailed { reason, .. } => reason,
        e => panic!("expected AuthFailed, got {e:?}"),
    }
}

#[test]
fn handshake_without_auth() {
    let p = Pair::new().connect();
    assert_eq!(p.ini.phase(), Phase::Established);
    assert_eq!(p.tgt.phase(), Phase::Established);
    assert_eq!(p.ini.session_id(), Some(SESSION));
    let to_t = p.frames(Dir::ToTarget);
    assert_eq!(
        to_t[0],
        Message::Hello {
            engine: "10.0.0.1".into(),
            channel: Channel::Control,
            session: 1,
            features: crate::wire::FEATURES,
        }
    );
    let to_i = p.frames(Dir::ToInitiator);
    assert_eq!(
        to_i[0],
        Message::Welcome {
            engine: "10.0.0.2:5000".into(),
            session: SESSION,
            incarnation: 2,
            features: crate::wire::FEATURES,
        }
    );
    assert!(matches!(&to_i[1], Message::MemTable(t) if t.len() == 2));
    // The connect is one round trip: no probe follows it either way (the initiator's first
    // one is due an interval later).
    assert_eq!(to_t.len(), 1, "{to_t:?}");
    assert_eq!(to_i.len(), 2, "{to_i:?}");
    let evs: Vec<_> = p.ini_events.iter().map(|e| &e.1).collect();
    assert!(
        matches!(evs[0], Event::Welcomed { session: SESSION, engine, incarnation: 2, ..  } if engine == "10.0.0.2:5000"),
        "the target's name and incarnation"
    );
    match evs[1] {
        Event::Table(t) => assert_eq!(
            t.iter().map(|r| r.addr).collect::<Vec<_>>(),
            vec![0x1000, 0x2000],
            "sorted by address"
        ),
        e => panic!("{e:?}"),
    }
    assert_eq!(p.ini.table().len(), 2);
    assert!(
        matches!(&p.tgt_events[0].1, Event::Welcomed { engine, incarnation: 1, .. } if engine == "10.0.0.1"),
        "the initiator's name and incarnation"
    );
    assert_eq!(p.tgt.peer(), "10.0.0.1");
    assert!(!p
        .ini_events
        .iter()
        .any(|e| matches!(e.1, Event::Authenticated)));
}

#[test]
fn handshake_with_auth() {
    let p = Pair::with(
        secret_config("i", 1, "correct horse battery"),
        secret_config("t", 2, "correct horse battery"),
    )
    .connect();
    assert_eq!(p.ini.phase(), Phase::Established);
    let to_i = p.frames(Dir::ToInitiator);
    let to_t = p.frames(Dir::ToTarget);
    assert_eq!(
        to_i[0],
        Message::AuthChallenge {
            nonce: NONCE_T.to_vec()
        }
    );
    let s = Secret::new("correct horse battery");
    assert_eq!(
        to_t[1],
        Message::AuthResponse {
            nonce: NONCE_I.to_vec(),
            mac: s.initiator_mac(&NONCE_T, &NONCE_I).to_vec()
        }
    );
    assert_eq!(
        to_i[1],
        Message::AuthProof {
            mac: s.target_mac(&NONCE_T, &NONCE_I).to_vec()
        }
    );
    assert!(matches!(to_i[2], Message::Welcome { .. }));
    assert!(matches!(p.ini_events[0].1, Event::Authenticated));
    assert!(matches!(p.tgt_events[0].1, Event::Authenticated));
}

#[test]
fn wrong_secret_is_refused_by_the_target() {
    let p = Pair::with(
        secret_config("i", 1, "correct horse battery"),
        secret_config("t", 2, "another secret here"),
    )
    .connect();
    let (_, te) = p.tgt_closed().expect("target closed");
    assert!(auth_failed(&te).contains("does not match this engine's shared secret"));
    let to_i = p.frames(Dir::ToInitiator);
    assert!(matches!(&to_i[1], Message::Refuse { status, .. } if *status == Status::Failed.code()));
    assert_eq!(to_i.len(), 2, "nothing after the refusal: {to_i:?}");
    let (_, ie) = p.ini_closed().expect("initiator closed");
    assert!(auth_failed(&ie).contains("does not match"), "{ie}");
}

#[test]
fn initiator_without_secret_facing_a_challenge() {
    let mut p = Pair::with(
        config("i", 1),
        secret_config("t", 2, "correct horse battery"),
    )
    .connect();
    p.run_for(Duration::from_millis(10));
    let (_, ie) = p.ini_closed().expect("initiator closed");
    assert!(auth_failed(&ie).contains("this engine has none"), "{ie}");
    // It says why with an empty answer, which the target refuses naming the problem.
    assert_eq!(
        p.frames(Dir::ToTarget)[1],
        Message::AuthResponse {
            nonce: vec![],
            mac: vec![]
        }
    );
    let (_, te) = p.tgt_closed().expect("target closed");
    assert!(auth_failed(&te).contains("sent no proof"), "{te}");
    assert!(matches!(
        p.frames(Dir::ToInitiator)[1],
        Message::Refuse { .. }
    ));
}

#[test]
fn target_without_secret_is_refused_by_an_initiator_with_one() {
    let mut p = Pair::with(
        secret_config("i", 1, "correct horse battery"),
        config("t", 2),
    )
    .connect();
    p.run_for(Duration::from_millis(10));
    let (_, ie) = p.ini_closed().expect("initiator closed");
    assert!(
        auth_failed(&ie).contains("did not authenticate itself"),
        "{ie}"
    );
    assert!(p.ini.table().is_empty(), "its table is not accepted");
    assert!(!p.ini_events.iter().any(|e| matches!(e.1, Event::Table(_))));
    // The target learns of it from the closed connection.
    let (_, te) = p.tgt_closed().expect("target closed");
    assert!(matches!(te, Error::PeerLost { .. }), "{te}");
}

/// A target that challenges and then answers with `proof`.
fn forged_proof(proof: Vec<u8>) -> InitiatorSession {
    let now = Instant::now();
    let mut i = InitiatorSession::new(
        secret_config("i", 1, "correct horse battery"),
        "t",
        now,
        NONCE_I,
    );
    i.handle_frame(
        now,
        Message::AuthChallenge {
            nonce: NONCE_T.to_vec(),
        },
    )
    .expect("challenge");
    let r = i.handle_frame(now, Message::AuthProof { mac: proof });
    assert!(r.is_err());
    i
}

#[test]
fn forged_or_short_proofs_fail() {
    let right = Secret::new("correct horse battery");
    let wrong = Secret::new("not the right secret");
    for (what, mac) in [
        (
            "other secret",
            wrong.target_mac(&NONCE_T, &NONCE_I).to_vec(),
        ),
        (
            "reflected initiator mac",
            right.initiator_mac(&NONCE_T, &NONCE_I).to_vec(),
        ),
        ("short", right.target_mac(&NONCE_T, &NONCE_I)[..31].to_vec()),
        ("empty", vec![]),
    ] {
        let mut i = forged_proof(mac);
        assert!(
            auth_failed(i.error().expect("closed")).contains("does not match"),
            "{what}"
        );
        let frames = drain_i(&mut i);
        assert_eq!(frames.len(), 2, "{what}: hello and response only");
        assert!(matches!(events_i(&mut i).last(), Some(Event::Closed(_))));
    }
}

#[test]
fn forged_or_short_responses_are_refused() {
    let s = Secret::new("correct horse battery");
    let cases: Vec<(&str, Message)> = vec![
        (
            "other secret",
            Message::AuthResponse {
                nonce: NONCE_I.to_vec(),
                mac: Secret::new("not the right secret")
                    .initiator_mac(&NONCE_T, &NONCE_I)
                    .to_vec(),
            },
        ),
        (
            "target label",
            Message::AuthResponse {
                nonce: NONCE_I.to_vec(),
                mac: s.target_mac(&NONCE_T, &NONCE_I).to_vec(),
            },
        ),
        (
            "short mac",
            Message::AuthResponse {
                nonce: NONCE_I.to_vec(),
                mac: s.initiator_mac(&NONCE_T, &NONCE_I)[..16].to_vec(),
            },
        ),
        (
            "31-byte nonce",
            Message::AuthResponse {
                nonce: NONCE_I[..31].to_vec(),
                mac: s.initiator_mac(&NONCE_T, &NONCE_I[..31]).to_vec(),
            },
        ),
        (
            "proof before response",
            Message::AuthProof {
                mac: s.target_mac(&NONCE_T, &NONCE_I).to_vec(),
            },
        ),
        (
            "notify before response",
            Message::Notify {
                seq: 1,
                name: vec![],
                msg: vec![],
            },
        ),
    ];
    for (what, m) in cases {
        let now = Instant::now();
        let mut t = TargetSession::new(
            secret_config("t", 2, "correct horse battery"),
            now,
            "a",
            7,
            NONCE_T,
        );
        let hello = Message::Hello {
            engine: "i".into(),
            channel: Channel::Control,
            session: 1,
            features: crate::wire::FEATURES,
        };
        t.handle_frame(now, hello).expect("hello");
        assert!(t.handle_frame(now, m).is_err(), "{what}");
        let frames = drain_t(&mut t);
        assert!(matches!(frames[0], Message::AuthChallenge { .. }));
        assert!(
            matches!(&frames[1], Message::Refuse { status, .. } if *status == Status::Failed.code()),
            "{what}"
        );
        assert_eq!(frames.len(), 2, "{what}: no welcome, no table");
        let reason = auth_failed(t.error().expect("closed"));
        assert!(
            reason.starts_with("authentication failed"),
            "{what}: {reason}"
        );
        assert!(!events_t(&mut t)
            .iter()
            .any(|e| matches!(e, Event::Welcomed { .. })));
    }
}

#[test]
fn proof_or_welcome_out_of_order_at_the_initiator() {
    let now = Instant::now();
    // A proof before any challenge, by an initiator without a secret.
    let mut i = InitiatorSession::new(config("i", 1), "t", now, NONCE_I);
    let _ = i.handle_frame(now, Message::AuthProof { mac: vec![1; 32] });
    assert!(
        matches!(i.error(), Some(Error::Protocol { reason, .. }) if reason.contains("expected welcome"))
    );
    // A memory table instead of the proof.
    let mut i = InitiatorSession::new(
        secret_config("i", 1, "correct horse battery"),
        "t",
        now,
        NONCE_I,
    );
    i.handle_frame(
        now,
        Message::AuthChallenge {
            nonce: NONCE_T.to_vec(),
        },
    )
    .expect("challenge");
    let _ = i.handle_frame(now, Message::MemTable(vec![]));
    assert!(
        matches!(i.error(), Some(Error::Protocol { reason, .. }) if reason.contains("expected authentication proof"))
    );
    // A refusal instead of the proof carries the target's reason.
    let mut i = InitiatorSession::new(
        secret_config("i", 1, "correct horse battery"),
        "t",
        now,
        NONCE_I,
    );
    i.handle_frame(
        now,
        Message::AuthChallenge {
            nonce: NONCE_T.to_vec(),
        },
    )
    .expect("challenge");
    let _ = i.handle_frame(
        now,
        Message::Refuse {
            status: 0,
            reason: "nope".into(),
        },
    );
    assert_eq!(auth_failed(i.error().expect("closed")), "nope");
}

#[test]
fn unanswered_challenge_is_refused_exactly_at_the_timeout() {
    let ini = Config {
        handshake_timeout: None,
        ..secret_config("i", 1, "correct horse battery")
    };
    let mut p = Pair::with(ini, secret_config("t", 2, "correct horse battery"));
    p.filter = Box::new(|d, m| match (d, m) {
        (Dir::ToTarget, Message::AuthResponse { .. }) => Fate::Drop,
        _ => Fate::Deliver,
    });
    let start = p.now;
    p.run_for(Duration::from_secs(30));
    let (t, e) = p.tgt_closed().expect("target closed");
    // The hello arrived after 1 ms; the answer had 10 s from then.
    assert_eq!(t, start + MS + Duration::from_secs(10));
    assert!(auth_failed(&e).contains("no answer within"), "{e}");
    assert!(matches!(
        p.frames(Dir::ToInitiator).last(),
        Some(Message::Refuse { .. })
    ));
}

#[test]
fn hello_timeout_sends_nothing() {
    let now = Instant::now();
    let mut t = TargetSession::new(config("t", 2), now, "10.0.0.9:1", 7, NONCE_T);
    assert_eq!(t.poll_timeout(), Some(now + Duration::from_secs(10)));
    t.handle_timeout(now + Duration::from_secs(10) - MS);
    assert!(!t.is_closed());
    t.handle_timeout(now + Duration::from_secs(10));
    assert!(
        matches!(t.error(), Some(Error::Timeout { what: "hello", peer, .. }) if peer == "10.0.0.9:1")
    );
    assert!(drain_t(&mut t).is_empty());
    assert_eq!(t.poll_timeout(), None);
}

#[test]
fn initiator_connect_timeout() {
    let mut p = Pair::new();
    p.filter = Box::new(|_, _| Fate::Drop);
    let start = p.now;
    p.run_for(Duration::from_secs(20));
    let (t, e) = p.ini_closed().expect("initiator closed");
    assert_eq!(t, start + Duration::from_secs(10));
    assert!(
        matches!(
            e,
            Error::Timeout {
                what: "connect",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn connect_to_self_is_refused() {
    // The initiator's incarnation is the target's own.
    let p = Pair::with(config("i", 42), config("t", 42)).connect();
    let (_, ie) = p.ini_closed().expect("closed");
    assert!(matches!(ie, Error::ConnectToSelf { .. }), "{ie}");
    assert_eq!(
        p.frames(Dir::ToInitiator),
        vec![Message::Refuse {
            status: Status::ParamInvalid.code(),
            reason: REFUSE_SELF.into()
        }]
    );
    assert!(matches!(
        p.tgt_closed(),
        Some((_, Error::ConnectToSelf { .. }))
    ));
}

#[test]
fn refusal_is_a_remote_error_with_its_status() {
    let now = Instant::now();
    let mut i = InitiatorSession::new(config("i", 1), "t", now, NONCE_I);
    let refuse = Message::Refuse {
        status: Status::ResourceExhausted.code(),
        reason: "too many links".into(),
    };
    assert!(i.handle_frame(now, refuse).is_err());
    match i.error() {
        Some(Error::Remote {
            status, message, ..
        }) => {
            assert_eq!(*status, Status::ResourceExhausted);
            assert_eq!(message, "too many links");
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn transport_offers_pass_through_before_the_table_only() {
    let mut p = Pair::new();
    let fabric = Message::FabricInfo {
        boot_id: "b".into(),
        mnt_ns: 1,
        pid: 2,
        uid: 3,
        socket: "s".into(),
    };
    let verbs = Message::VerbsInfo {
        devices: "mlx5_0".as_bytes().to_vec(),
    };
    p.offers = vec![fabric.clone(), verbs.clone()];
    let mut p = p.connect();
    let offers: Vec<_> = p
        .ini_events
        .iter()
        .filter_map(|e| match &e.1 {
            Event::TransportOffer(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(offers, vec![fabric.clone(), verbs]);
    assert!(
        matches!(p.tgt.offer(fabric), Err(Error::SessionOutOfPhase { .. })),
        "after the table"
    );
    // An offer after the table, forced onto the wire, is a violation at the initiator.
    let now = p.now;
    let _ = p.ini.handle_frame(
        now,
        Message::VerbsInfo {
            devices: "x".as_bytes().to_vec(),
        },
    );
    assert!(matches!(p.ini.error(), Some(Error::Protocol { .. })));
    // Not an offer, or before the welcome.
    let mut t = TargetSession::new(config("t", 2), now, "a", 7, NONCE_T);
    assert!(t
        .offer(Message::VerbsInfo {
            devices: "x".as_bytes().to_vec(),
        })
        .is_err());
    assert!(t.send_table(now, vec![]).is_err());
    let hello = Message::Hello {
        engine: "i".into(),
        channel: Channel::Control,
        session: 1,
        features: crate::wire::FEATURES,
    };
    t.handle_frame(now, hello).expect("hello");
    assert!(t.offer(Message::Heartbeat { seq: 1 }).is_err());
    assert!(t
        .offer(Message::VerbsInfo {
            devices: "x".as_bytes().to_vec(),
        })
        .is_ok());
}

#[test]
fn a_link_uses_the_features_both_ends_announced() {
    let ini = Config {
        features: 0b101,
        ..config("10.0.0.1", 1)
    };
    let tgt = Config {
        features: 0b110,
        ..config("10.0.0.2:5000", 2)
    };
    let p = Pair::with(ini, tgt).connect();
    assert_eq!(p.ini.phase(), Phase::Established);
    for (side, events) in [("initiator", &p.ini_events), ("target", &p.tgt_events)] {
        assert!(
            matches!(
                events[0].1,
                Event::Welcomed {
                    features: 0b100,
                    ..
                }
            ),
            "{side}: {:?}",
            events[0].1
        );
    }
}

#[test]
fn a_refusal_for_the_wire_version_names_both() {
    let now = Instant::now();
    let mut i = InitiatorSession::new(config("i", 1), "t", now, NONCE_I);
    let newer = crate::wire::VERSION + 1;
    // What a target of the next version answers (see `wire::version_refusal`).
    let refuse = Message::Refuse {
        status: Status::Unsupported.code(),
        reason: format!(
            "the target speaks hixl wire {newer}, the connecting engine hixl wire {}: they cannot talk",
            crate::wire::VERSION
        ),
    };
    let e = i.handle_frame(now, refuse).unwrap_err();
    assert!(
        matches!(e, Error::WireVersion { theirs, ours, .. } if theirs == newer && ours == crate::wire::VERSION),
        "{e:?}"
    );
    assert_eq!(e.status(), Status::Unsupported);
}
