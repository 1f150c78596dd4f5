//! Idle links: an initiator with nothing in flight probes every `heartbeat_idle` and says so
//! in its probes; work turns the link active at once, with the active bound; the target
//! holds an idle initiator to the period it announced.

use std::time::{Duration, Instant};

use super::*;
use crate::wire::{HEARTBEAT_PERIOD_MAX_MS, HEARTBEAT_PERIOD_SHIFT};

const SEC: Duration = Duration::from_secs(1);
const IDLE: Duration = Duration::from_secs(30);

/// A pair whose ends both have a 30 s idle period (1 s interval, 5 misses).
fn idle_pair() -> Pair {
    let idle = |mut c: Config| {
        c.heartbeat_idle = Some(IDLE);
        c
    };
    Pair::with(
        idle(config("10.0.0.1", 1)),
        idle(config("10.0.0.2:5000", 2)),
    )
    .connect()
}

/// The frames sent one way at or after `t`, with when they were sent.
fn sent_since(p: &Pair, dir: Dir, t: Instant) -> Vec<(Instant, Message)> {
    p.sent
        .iter()
        .filter(|s| s.1 == dir && s.0 >= t)
        .map(|s| (s.0, s.2.clone()))
        .collect()
}

/// The period an initiator's probe announces, in ms.
fn period_ms(m: &Message) -> u64 {
    match m {
        Message::Heartbeat { seq } => (seq >> HEARTBEAT_PERIOD_SHIFT) & HEARTBEAT_PERIOD_MAX_MS,
        m => panic!("not a heartbeat: {m:?}"),
    }
}

/// Drops every frame one way from now on.
fn freeze(p: &mut Pair, silent: Dir) {
    p.filter = Box::new(move |d, _| {
        if d == silent {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    });
}

/// When the frames one way last arrived, up to `t` (sent plus the latency).
fn last_heard(p: &Pair, dir: Dir, t: Instant) -> Instant {
    p.sent
        .iter()
        .filter(|s| s.1 == dir && s.0 <= t)
        .map(|s| s.0 + p.latency)
        .max()
        .expect("heard something")
}

#[test]
fn an_idle_link_sends_nothing_for_the_idle_period() {
    let mut p = idle_pair();
    let up = p.now;
    // Nothing at establishment; the first probe, an interval later, announces the idle period.
    p.run_until(up + SEC + 10 * MS);
    let probes = sent_since(&p, Dir::ToTarget, up);
    assert_eq!(probes.len(), 1, "{probes:?}");
    assert_eq!(probes[0].0, up + SEC);
    assert_eq!(period_ms(&probes[0].1), 30_000);
    // Past the first exchange, nothing either way until the next idle probe, 30 s later.
    let after = up + SEC + 10 * MS;
    p.run_until(up + SEC + IDLE - 10 * MS);
    assert!(
        sent_since(&p, Dir::ToTarget, after).is_empty(),
        "{:?}",
        p.sent
    );
    assert!(
        sent_since(&p, Dir::ToInitiator, after).is_empty(),
        "{:?}",
        p.sent
    );
    // Ten minutes: one probe and one answer per idle period, the target never probes.
    p.run_for(600 * SEC);
    assert!(p.ini_closed().is_none() && p.tgt_closed().is_none());
    let probes = sent_since(&p, Dir::ToTarget, after);
    assert_eq!(probes.len(), 20, "{probes:?}");
    for w in probes.windows(2) {
        assert_eq!(w[1].0 - w[0].0, IDLE);
        assert_eq!(period_ms(&w[1].1), 30_000);
    }
    let from_target = sent_since(&p, Dir::ToInitiator, after);
    assert_eq!(from_target.len(), 20);
    assert!(from_target
        .iter()
        .all(|(_, m)| matches!(m, Message::Heartbeat { seq } if !target_bit(*seq))));
}

#[test]
fn work_on_an_idle_link_probes_at_once() {
    let mut p = idle_pair();
    p.run_for(12 * SEC);
    let t = p.now;
    p.ini.work_in_flight(t);
    p.flush();
    let now = sent_since(&p, Dir::ToTarget, t);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].0, t);
    assert_eq!(period_ms(&now[0].1), 1000, "announces the interval");
    // A second report while active sends nothing more.
    p.ini.work_in_flight(t);
    p.flush();
    assert_eq!(sent_since(&p, Dir::ToTarget, t).len(), 1);
}

#[test]
fn a_notify_on_an_idle_link_probes_at_once() {
    let mut p = idle_pair();
    p.run_for(7 * SEC);
    let t = p.now;
    p.ini.notify(t, b"n", b"m").expect("notify");
    p.flush();
    let now = sent_since(&p, Dir::ToTarget, t);
    assert!(
        matches!(now[0].1, Message::Heartbeat { .. }) && period_ms(&now[0].1) == 1000,
        "{now:?}"
    );
    assert!(matches!(now[1].1, Message::Notify { .. }), "{now:?}");
}

#[test]
fn frozen_peer_with_work_in_flight_dies_within_the_active_bound() {
    // The target froze long ago, on an idle link; work starts 20 s later.
    let mut p = idle_pair();
    freeze(&mut p, Dir::ToInitiator);
    p.run_for(20 * SEC);
    assert!(p.ini_closed().is_none());
    let t = p.now;
    p.ini.work_in_flight(t);
    p.ops_in_flight = true;
    p.run_for(60 * SEC);
    let (at, e) = p.ini_closed().expect("initiator closed");
    assert_eq!(at, t + 5 * SEC, "interval × misses after the work started");
    match e {
        Error::HeartbeatLost {
            silent_ms,
            interval_ms,
            ..
        } => assert_eq!((silent_ms, interval_ms), (5000, 1000)),
        e => panic!("{e:?}"),
    }
}

#[test]
fn a_peer_frozen_mid_work_dies_within_the_active_bound() {
    let mut p = idle_pair();
    p.ini.work_in_flight(p.now);
    p.ops_in_flight = true;
    p.run_for(40 * SEC);
    assert!(p.ini_closed().is_none(), "answered probes keep it up");
    let cut = p.now;
    freeze(&mut p, Dir::ToInitiator);
    p.run_for(20 * SEC);
    let (at, _) = p.ini_closed().expect("initiator closed");
    assert_eq!(at, last_heard(&p, Dir::ToInitiator, cut) + 5 * SEC);
}

#[test]
fn an_active_link_probes_every_interval_then_turns_idle() {
    let mut p = idle_pair();
    p.run_for(3 * SEC);
    let t = p.now;
    p.ini.work_in_flight(t);
    p.ops_in_flight = true;
    p.run_for(10 * SEC);
    p.ops_in_flight = false;
    p.run_for(100 * SEC);
    assert!(p.ini_closed().is_none() && p.tgt_closed().is_none());
    let probes: Vec<_> = sent_since(&p, Dir::ToTarget, t)
        .into_iter()
        .filter(|(_, m)| matches!(m, Message::Heartbeat { .. }))
        .collect();
    // Active from t: probes every second; the driver last saw ops at t + 10 s (the first
    // look, at t + 5 s, extended it), so it turns idle at t + 15 s with a probe announcing
    // 30 s, then probes every 30 s.
    let active: Vec<_> = probes
        .iter()
        .filter(|(_, m)| period_ms(m) == 1000)
        .collect();
    assert_eq!(active.len(), 15, "{probes:?}");
    for (k, (at, _)) in active.iter().enumerate() {
        assert_eq!(*at, t + k as u32 * SEC);
    }
    let idle: Vec<_> = probes
        .iter()
        .filter(|(_, m)| period_ms(m) == 30_000)
        .collect();
    assert_eq!(idle[0].0, t + 15 * SEC);
    for w in idle.windows(2) {
        assert_eq!(w[1].0 - w[0].0, IDLE);
    }
    // The target never had to probe: the initiator announced its silences.
    assert!(!sent_since(&p, Dir::ToInitiator, t)
        .iter()
        .any(|(_, m)| matches!(m, Message::Heartbeat { seq } if target_bit(*seq))));
}

#[test]
fn frozen_peer_on_an_idle_link_dies_after_idle_times_misses() {
    let mut p = idle_pair();
    let cut = p.now;
    freeze(&mut p, Dir::ToInitiator);
    p.run_for(400 * SEC);
    let (at, e) = p.ini_closed().expect("initiator closed");
    assert_eq!(at, last_heard(&p, Dir::ToInitiator, cut) + 5 * IDLE);
    assert!(
        matches!(
            e,
            Error::HeartbeatLost {
                interval_ms: 30_000,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn the_target_holds_an_idle_initiator_to_its_announced_period() {
    let mut p = idle_pair();
    // Past the first probe, which announces the period.
    p.run_for(2 * SEC);
    let cut = p.now;
    // The initiator freezes: the target waits 1.5 announced periods, probes every period,
    // and gives up after announced period × misses, not after interval × misses.
    freeze(&mut p, Dir::ToTarget);
    p.run_for(100 * SEC);
    assert!(p.tgt_closed().is_none(), "not dead after 100 s");
    let heard = last_heard(&p, Dir::ToTarget, cut);
    let probes: Vec<_> = sent_since(&p, Dir::ToInitiator, cut + 2 * MS)
        .into_iter()
        .filter(|(_, m)| matches!(m, Message::Heartbeat { seq } if target_bit(*seq)))
        .map(|(t, _)| t)
        .collect();
    assert_eq!(probes, vec![heard + 45 * SEC, heard + 75 * SEC]);
    p.run_for(100 * SEC);
    let (at, e) = p.tgt_closed().expect("target closed");
    assert_eq!(at, heard + 5 * IDLE);
    assert!(
        matches!(
            e,
            Error::HeartbeatLost {
                interval_ms: 30_000,
                silent_ms: 150_000,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_target_without_an_idle_period_probes_an_idle_initiator_and_keeps_it() {
    // The target holds initiators to its interval (as an older target does): it probes the
    // silent idle link, the initiator answers, nobody dies.
    let mut ini = config("10.0.0.1", 1);
    ini.heartbeat_idle = Some(IDLE);
    let mut p = Pair::with(ini, config("10.0.0.2:5000", 2)).connect();
    let t = p.now;
    p.run_for(60 * SEC);
    assert!(p.ini_closed().is_none() && p.tgt_closed().is_none());
    let target_probes = sent_since(&p, Dir::ToInitiator, t)
        .into_iter()
        .filter(|(_, m)| matches!(m, Message::Heartbeat { seq } if target_bit(*seq)))
        .count();
    // One after every 1.5 s of silence (the initiator answers each at once).
    assert!(target_probes >= 35, "{target_probes}");
}

#[test]
fn an_announced_period_is_clamped_by_the_target() {
    let mut cfg = config("10.0.0.2:5000", 2);
    cfg.heartbeat_idle = Some(IDLE);
    // (An initiator that outlives the test, unanswered.)
    let mut ini = config("10.0.0.1", 1);
    ini.heartbeat_interval = 100 * SEC;
    let mut p = Pair::with(ini, cfg).connect();
    // A probe claiming the longest period, then silence: the target gives up after its own
    // idle period × misses.
    p.run_for(10 * MS);
    let t = p.now;
    p.tgt
        .handle_frame(
            t,
            Message::Heartbeat {
                seq: 9 | HEARTBEAT_PERIOD_MAX_MS << 32,
            },
        )
        .expect("a probe");
    freeze(&mut p, Dir::ToTarget);
    p.run_for(200 * SEC);
    let (at, e) = p.tgt_closed().expect("target closed");
    assert_eq!(at, t + 5 * IDLE, "{e:?}");
    // An older initiator's probe (no period): the interval holds.
    let mut p = Pair::with(config("10.0.0.1", 1), config("10.0.0.2:5000", 2)).connect();
    p.run_for(10 * MS);
    let t = p.now;
    p.tgt
        .handle_frame(t, Message::Heartbeat { seq: 3 })
        .expect("a probe");
    freeze(&mut p, Dir::ToTarget);
    p.run_for(20 * SEC);
    assert_eq!(p.tgt_closed().expect("closed").0, t + 5 * SEC);
}
