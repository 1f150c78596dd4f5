//! Heartbeats and timeouts of real engines on tokio's paused clock: the engines, their links'
//! drivers and the fake peers run on one current-thread runtime over real loopback sockets,
//! and time moves only when every task waits (tokio then advances it to the next timer). The
//! bounds are asserted as the protocol states them, to the millisecond, with the engines'
//! default settings: minutes of heartbeat schedule take milliseconds of wall time, and a
//! loaded machine cannot make them flaky.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use hixl_async::{Engine, HostBuffer};
use hixl_core::wire::{Message, HEARTBEAT_FROM_TARGET};
use hixl_core::{Error, OpDesc};
use tokio::time::{sleep, Instant};

/// The defaults of `hixl.HeartbeatIntervalMs`, `hixl.HeartbeatMissLimit` and
/// `hixl.HeartbeatIdleMs`.
const INTERVAL: Duration = Duration::from_secs(1);
const MISS: u32 = 5;
const IDLE: Duration = Duration::from_secs(30);

/// How far past its bound an event may come on the paused clock: a timer's granularity.
const SLACK: Duration = Duration::from_millis(1);

/// A fake target that keeps its sockets open and silent for a day.
const DAY: Duration = Duration::from_secs(86_400);

#[track_caller]
fn assert_at(what: &str, took: Duration, bound: Duration) {
    assert!(
        took >= bound && took <= bound + SLACK,
        "{what} after {took:?}, bound {bound:?}"
    );
}

async fn engine(listen: bool) -> Engine {
    let b = Engine::builder("127.0.0.1").option("hixl.Transport", "tcp");
    let b = if listen { b.ephemeral_port() } else { b };
    b.build().await.expect("engine")
}

/// An engine linked to a fake target that stays silent for a day, with a local region.
struct Silent {
    addr: String,
    fake: tokio::task::JoinHandle<()>,
    e: Engine,
    local: hixl_async::Region,
    p: hixl_async::Peer,
}

async fn silent() -> Silent {
    let (addr, fake) = common::silent_target(1, DAY).await;
    let e = engine(false).await;
    let local = e
        .register(HostBuffer::zeroed(1 << 20).expect("buf"))
        .expect("register");
    let p = e
        .connect(&addr, Duration::from_secs(5))
        .await
        .expect("connect");
    Silent {
        addr,
        fake,
        e,
        local,
        p,
    }
}

/// Work in flight to a target that went silent: the write and the notify fail at
/// `interval × miss limit` after the work began, naming the heartbeat loss; nothing stays in
/// flight.
#[tokio::test(start_paused = true)]
async fn in_flight_work_fails_at_the_active_bound() {
    let Silent {
        addr,
        fake,
        e,
        local,
        p,
    } = silent().await;
    // Idle first, for less than the idle bound: the idle schedule does not stretch the
    // active bound of the work that follows.
    sleep(Duration::from_secs(100)).await;
    assert!(p.is_connected());
    let t0 = Instant::now();
    let w = p.write(&[OpDesc::new(local.addr(), common::SILENT_ADDR, 4096)]);
    let n = p.notify_timeout("n", "m", Duration::from_secs(600));
    let (w, n) = tokio::join!(w, n);
    assert_at("the write failed", t0.elapsed(), INTERVAL * MISS);
    for r in [w, n] {
        match r {
            Err(Error::HeartbeatLost {
                peer,
                silent_ms,
                probes,
                interval_ms,
            }) => {
                assert_eq!(peer, addr);
                assert_eq!(silent_ms, 5000);
                assert_eq!(probes, MISS);
                assert_eq!(interval_ms, 1000);
            }
            other => panic!("expected a heartbeat loss, got {other:?}"),
        }
    }
    assert!(!p.is_connected());
    assert_eq!(e.ops_in_flight(), 0);
    fake.abort();
}

/// An idle link to a silent target is probed at the idle period and declared lost at
/// `idle period × miss limit` of silence, not before.
#[tokio::test(start_paused = true)]
async fn an_idle_link_is_lost_at_the_idle_bound() {
    // The engine is kept (a `..` would drop it, and with it the link).
    let Silent { fake, p, e: _e, .. } = silent().await;
    let bound = IDLE * MISS;
    sleep(bound - SLACK).await;
    assert!(
        p.is_connected(),
        "lost before the idle bound: {:?}",
        p.error()
    );
    sleep(2 * SLACK).await;
    match p.error() {
        Some(Error::HeartbeatLost {
            silent_ms,
            interval_ms,
            ..
        }) => {
            assert_eq!(silent_ms, 150_000);
            assert_eq!(interval_ms, 30_000);
        }
        other => panic!("expected a heartbeat loss at the idle bound, got {other:?}"),
    }
    fake.abort();
}

/// Two real engines idle for a day of probes and answers: the link stays up, and carries a
/// notify at the end.
#[tokio::test(start_paused = true)]
async fn answered_probes_keep_a_link_up_for_a_day() {
    let target = engine(true).await;
    let init = engine(false).await;
    let p = init
        .connect(target.local_engine(), Duration::from_secs(5))
        .await
        .expect("connect");
    sleep(DAY).await;
    assert!(p.is_connected(), "{:?}", p.error());
    p.notify("still", "here").await.expect("notify");
}

/// A target whose initiator says hello and then nothing: it probes after one and a half
/// periods of silence, then every period, and drops the session at `interval × miss limit`
/// counted from when the initiator's first probe was due (an interval after the table).
#[tokio::test(start_paused = true)]
async fn the_target_probes_a_silent_initiator_and_drops_it_at_the_bound() {
    let target = engine(true).await;
    let mut c = common::hello_control(target.local_engine(), "127.0.0.1:1").await;
    let t0 = Instant::now();
    let mut buf = BytesMut::new();
    let mut probes = Vec::new();
    while let Some(m) = common::recv(&mut c, &mut buf).await {
        if let Message::Heartbeat { seq } = m {
            assert!(seq & HEARTBEAT_FROM_TARGET != 0, "probe seq {seq:#x}");
            probes.push(t0.elapsed());
        }
    }
    assert_at("the target closed", t0.elapsed(), INTERVAL * (MISS + 1));
    let ms: Vec<u128> = probes.iter().map(Duration::as_millis).collect();
    assert_eq!(ms, [1500, 2500, 3500, 4500, 5500]);
}

/// A transfer's timeout is honoured to the millisecond and leaves the link up; the abandoned
/// op is resolved when the heartbeats end the link.
#[tokio::test(start_paused = true)]
async fn a_transfer_times_out_at_its_deadline() {
    let Silent {
        fake, e, local, p, ..
    } = silent().await;
    let t0 = Instant::now();
    let r = p
        .read(&[OpDesc::new(local.addr(), common::SILENT_ADDR, 4096)])
        .timeout(Duration::from_secs(2))
        .await;
    assert_at("the read timed out", t0.elapsed(), Duration::from_secs(2));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(p.is_connected(), "{:?}", p.error());
    let n = p
        .notify_timeout("n", "m", Duration::from_millis(1500))
        .await;
    assert_at(
        "the notify timed out",
        t0.elapsed(),
        Duration::from_millis(3500),
    );
    assert!(matches!(n, Err(Error::Timeout { .. })), "{n:?}");
    // The silence counts from the read: the link ends at its active bound.
    sleep(INTERVAL * MISS - t0.elapsed() + SLACK).await;
    assert!(matches!(p.error(), Some(Error::HeartbeatLost { .. })));
    assert_eq!(e.ops_in_flight(), 0);
    fake.abort();
}
