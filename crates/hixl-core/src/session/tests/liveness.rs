//! Heartbeats on both ends and death after interval × misses of silence.

use std::time::{Duration, Instant};

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
    // The initiator probes once a second and the target answers each probe once; the
    // target, hearing those probes, sends none of its own: one probe and one answer per
    // interval.
    let probes_i = from_i.iter().filter(|s| !target_bit(**s)).count();
    let probes_t = from_t.iter().filter(|s| target_bit(**s)).count();
    let answers_t = from_t.iter().filter(|s| !target_bit(**s)).count();
    assert!((600..=602).contains(&probes_i), "{probes_i}");
    assert_eq!(probes_t, 0, "the target probed a link it hears");
    assert!(
        probes_i - answers_t <= 1,
        "{probes_i} probes, {answers_t} answers"
    );
    assert!(from_i.len() + from_t.len() <= 2 * 602);
}

#[test]
fn target_probes_only_a_link_it_does_not_hear() {
    // The initiator's probes are lost, but its notifies every 700 ms reach the target: the
    // target hears it and stays quiet. Then the notifies stop too: the target probes after
    // 1.5 s of silence, and again 1.5 s after each answer: the answers keep the link up.
    let mut p = Pair::new().connect();
    p.filter = Box::new(|d, m| match (d, m) {
        (Dir::ToTarget, Message::Heartbeat { seq }) if !target_bit(*seq) => Fate::Drop,
        _ => Fate::Deliver,
    });
    let start = p.now;
    for _ in 0..40 {
        p.run_for(Duration::from_millis(700));
        let now = p.now;
        p.ini.notify(now, b"n", b"m").expect("notify");
    }
    let quiet_until = p.now;
    let probes = |p: &Pair, from: Instant, to: Instant| -> Vec<Instant> {
        p.sent
            .iter()
            .filter(|s| s.0 > from && s.0 <= to && s.1 == Dir::ToInitiator)
            .filter(|s| matches!(s.2, Message::Heartbeat { seq } if target_bit(seq)))
            .map(|s| s.0)
            .collect()
    };
    assert!(
        probes(&p, start, quiet_until).is_empty(),
        "the target probed a link it hears"
    );
    p.run_for(Duration::from_secs(30));
    assert!(
        !p.ini.is_closed() && !p.tgt.is_closed(),
        "{:?}",
        p.tgt.error()
    );
    let late = probes(&p, quiet_until, p.now);
    // The last notify arrives one latency after it was sent.
    assert_eq!(late[0], quiet_until + p.latency + 1500 * MS);
    let rtt = 2 * p.latency;
    assert!(
        late.windows(2).all(|w| w[1] - w[0] == 1500 * MS + rtt),
        "{late:?}"
    );
    assert!((19..=20).contains(&late.len()), "{}", late.len());
}

#[test]
fn probes_of_sessions_on_one_grid_leave_together() {
    let t0 = Instant::now();
    let grid = t0 + 123 * MS;
    let ini = |n| Config {
        probe_grid: Some(grid),
        ..config("10.0.0.1", n)
    };
    // Two pairs established at different moments, with different latencies.
    let mut a = Pair::with(ini(1), config("t", 2));
    a.now = t0 + 10 * MS;
    let mut a = a.connect();
    let mut b = Pair::with(ini(3), config("t", 4));
    b.now = t0 + 610 * MS;
    b.latency = 9 * MS;
    let mut b = b.connect();
    a.run_for(Duration::from_secs(20));
    b.run_for(Duration::from_secs(20));
    let probes = |p: &Pair| -> Vec<Instant> {
        p.sent
            .iter()
            .filter(|s| s.1 == Dir::ToTarget)
            .filter(|s| matches!(s.2, Message::Heartbeat { seq } if !target_bit(seq)))
            .map(|s| s.0)
            .skip(1) // the first goes at once
            .collect()
    };
    let (pa, pb) = (probes(&a), probes(&b));
    for t in pa.iter().chain(&pb) {
        assert_eq!((*t - grid).as_nanos() % SEC.as_nanos(), 0, "off the grid");
    }
    let common = pa.iter().filter(|t| pb.contains(t)).count();
    assert!(common >= 18, "{common} of {} probes together", pa.len());
}

#[test]
fn death_is_exact_on_a_grid() {
    // Probes on a grid do not move the death: it comes at the bound after the last frame.
    let t0 = Instant::now();
    let mut ini = config("i", 1);
    ini.probe_grid = Some(t0 + 333 * MS);
    let mut p = Pair::with(ini, config("t", 2));
    p.latency = 7 * MS;
    let mut p = p.connect();
    p.run_for(Duration::from_millis(4321));
    let cut = p.now;
    p.filter = Box::new(|d, _| {
        if d == Dir::ToInitiator {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
    p.run_for(Duration::from_secs(20));
    let heard = p
        .sent
        .iter()
        .filter(|s| s.1 == Dir::ToInitiator && s.0 <= cut)
        .map(|s| s.0 + p.latency)
        .max()
        .expect("heard");
    let (t, _) = p.ini_closed().expect("closed");
    assert_eq!(t, heard + 5 * SEC);
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

/// A pair whose initiator freezes `after` its connect: how long after the last frame it sent
/// arrived the target closed, and why.
fn frozen_initiator(after: Duration) -> (Duration, Error) {
    let mut p = Pair::new().connect();
    p.run_for(after);
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
    (t - heard, e)
}

#[test]
fn frozen_initiator_is_detected_by_the_target_probes() {
    // Nothing heard after the hello: the bound counts from when the initiator's first probe
    // was due, an interval after the target's table; the silence reported is the whole one.
    let (silence, e) = frozen_initiator(Duration::ZERO);
    assert_eq!(silence, 6 * SEC);
    assert!(
        matches!(
            e,
            Error::HeartbeatLost {
                silent_ms: 6000,
                ..
            }
        ),
        "{e:?}"
    );
    // Frozen later, after the first probe: the bound counts from the last frame heard.
    let (silence, e) = frozen_initiator(Duration::from_millis(1500));
    assert_eq!(silence, 5 * SEC);
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
    // (Above the count, each announces the 1 s period.)
    let count: Vec<u64> = own_i.iter().map(|s| s & 0xffff_ffff).collect();
    assert_eq!(count, (1..=own_i.len() as u64).collect::<Vec<_>>());
    assert!(own_i.iter().all(|s| s >> 32 == 1000), "{own_i:?}");
    let delivered_t = own_t.len().saturating_sub(1); // the last probe may still be in flight
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
