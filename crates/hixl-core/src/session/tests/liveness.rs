//! Heartbeats on both ends and death after interval × misses of silence.

use std::time::Duration;

use super::*;

const SEC: Duration = Duration::from_secs(1);

fn heartbeats(p: &Pair, dir: Dir) -> Vec<u64> {
    p.frames(dir)
        .into_iter()
        .filter_map(|m| match m {
            Message::Heartbeat { seq } => Some(seq),
            _ => None,
        })
        .collect()
}

#[test]
fn death_exactly_at_interval_times_misses() {
    let mut p = Pair::new().connect();
    // Freeze the target's side: from now on nothing it sends arrives.
    let cut = p.now;
    p.filter = Box::new(|d, _| {
        if d == Dir::ToInitiator {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    // The last frame the initiator heard is the one in flight at the cut (the target's first
    // probe, or the answer to ours), delivered at most one latency later.
    p.run_for(Duration::from_millis(500));
    let heard = p
        .sent
        .iter()
        .filter(|s| s.1 == Dir::ToInitiator && s.0 <= cut)
        .map(|s| s.0 + p.latency)
        .max()
        .expect("heard something");
    p.run_for(Duration::from_secs(20));
    let (t, e) = p.ini_closed().expect("initiator closed");
    assert_eq!(t, heard + 5 * SEC, "not a tick early, not a tick late");
    match e {
        Error::HeartbeatLost {
            silent_ms,
            probes,
            interval_ms,
            ..
        } => assert_eq!((silent_ms, probes, interval_ms), (5000, 5, 1000)),
        e => panic!("{e:?}"),
    }
}

#[test]
fn death_is_exact_with_odd_settings() {
    // 250 ms × 3, latency 7 ms: the bound is not a multiple of anything else in play.
    let mut ini = config("i", 1);
    ini.heartbeat_interval = Duration::from_millis(250);
    ini.heartbeat_miss_limit = 3;
    let mut p = Pair::with(ini, config("t", 2));
    p.latency = 7 * MS;
    let mut p = p.connect();
    let established = p.now;
    p.filter = Box::new(|d, _| {
        if d == Dir::ToInitiator {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.run_for(Duration::from_secs(10));
    let heard = p
        .sent
        .iter()
        .filter(|s| s.1 == Dir::ToInitiator && s.0 <= established)
        .map(|s| s.0 + p.latency)
        .max()
        .expect("heard");
    let (t, _) = p.ini_closed().expect("closed");
    assert_eq!(t, heard + Duration::from_millis(750));
    // One step before the death the session was alive.
    assert!(p
        .ini_events
        .iter()
        .all(|(at, e)| !matches!(e, Event::Closed(_)) || *at == t));
}

#[test]
fn idle_link_with_answered_probes_stays_alive() {
    let mut p = Pair::new().connect();
    p.latency = 100 * MS;
    p.run_for(Duration::from_secs(600));
    assert_eq!(p.ini.phase(), Phase::Established);
    assert_eq!(p.tgt.phase(), Phase::Established);
    let from_i = heartbeats(&p, Dir::ToTarget);
    let from_t = heartbeats(&p, Dir::ToInitiator);
    // Each side probes once a second and answers each probe of the other once.
    let probes_i = from_i.iter().filter(|s| !target_bit(**s)).count();
    let probes_t = from_t.iter().filter(|s| target_bit(**s)).count();
    assert!((600..=602).contains(&probes_i), "{probes_i}");
    assert!((600..=602).contains(&probes_t), "{probes_t}");
}

#[test]
fn high_latency_below_the_bound_stays_alive() {
    let mut p = Pair::new();
    p.latency = Duration::from_millis(2400);
    let mut p = p.connect();
    p.run_for(Duration::from_secs(120));
    assert!(!p.ini.is_closed() && !p.tgt.is_closed());
}

#[test]
fn frozen_target_is_detected() {
    let mut p = Pair::new().connect();
    p.filter = Box::new(|d, _| {
        if d == Dir::ToInitiator {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.run_for(Duration::from_secs(60));
    assert!(matches!(
        p.ini_closed(),
        Some((_, Error::HeartbeatLost { .. }))
    ));
    // The target then sees the connection close.
    let (_, te) = p.tgt_closed().expect("target closed");
    assert!(matches!(te, Error::PeerLost { cause, .. } if cause == "connection closed"));
}

#[test]
fn frozen_initiator_is_detected_by_the_target_probes() {
    let mut p = Pair::new().connect();
    let cut = p.now;
    p.filter = Box::new(|d, _| {
        if d == Dir::ToTarget {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.run_for(Duration::from_secs(60));
    let (t, e) = p.tgt_closed().expect("target closed");
    let heard = p
        .sent
        .iter()
        .filter(|s| s.1 == Dir::ToTarget && s.0 <= cut)
        .map(|s| s.0 + p.latency)
        .max()
        .expect("heard");
    assert_eq!(t, heard + 5 * SEC);
    assert!(
        matches!(
            e,
            Error::HeartbeatLost {
                silent_ms: 5000,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn neither_end_answers_an_answer() {
    let mut p = Pair::new().connect();
    p.run_for(Duration::from_secs(30));
    let from_i = heartbeats(&p, Dir::ToTarget);
    let from_t = heartbeats(&p, Dir::ToInitiator);
    // The initiator's own probes count up without the bit; what it sends with the bit are
    // exactly the target's probes, each once.
    let own_i: Vec<u64> = from_i.iter().copied().filter(|s| !target_bit(*s)).collect();
    let own_t: Vec<u64> = from_t.iter().copied().filter(|s| target_bit(*s)).collect();
    let echoed_by_i: Vec<u64> = from_i.iter().copied().filter(|s| target_bit(*s)).collect();
    let echoed_by_t: Vec<u64> = from_t.iter().copied().filter(|s| !target_bit(*s)).collect();
    assert_eq!(own_i, (1..=own_i.len() as u64).collect::<Vec<_>>());
    let delivered_t = own_t.len() - 1; // the last probe may still be in flight
    assert!(echoed_by_i.len() >= delivered_t && echoed_by_i.len() <= own_t.len());
    assert_eq!(echoed_by_i[..], own_t[..echoed_by_i.len()]);
    assert_eq!(echoed_by_t[..], own_i[..echoed_by_t.len()]);
    // An answer fed back to its sender is not answered again.
    let now = p.now;
    let before = p.sent.len();
    p.ini
        .handle_frame(now, Message::Heartbeat { seq: 3 })
        .expect("alive");
    p.tgt
        .handle_frame(
            now,
            Message::Heartbeat {
                seq: 3 | crate::wire::HEARTBEAT_FROM_TARGET,
            },
        )
        .expect("alive");
    p.flush();
    assert_eq!(p.sent.len(), before);
}

#[test]
fn any_frame_counts_as_hearing_the_peer() {
    // Heartbeats from the target are dropped, but a table update every 2 s keeps the
    // initiator's liveness fed (and the target hears the initiator's probes).
    let mut p = Pair::new().connect();
    p.filter = Box::new(|d, m| match (d, m) {
        (Dir::ToInitiator, Message::Heartbeat { .. }) => Fate::Drop,
        _ => Fate::Deliver,
    });
    for i in 0..30 {
        p.run_for(Duration::from_secs(2));
        let now = p.now;
        p.tgt
            .send_table(now, vec![region(0x1000 * (i + 1), i)])
            .expect("table");
    }
    assert!(!p.ini.is_closed(), "{:?}", p.ini.error());
    p.run_for(Duration::from_secs(10));
    assert!(matches!(p.ini.error(), Some(Error::HeartbeatLost { .. })));
}
