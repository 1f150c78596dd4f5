//! Heartbeats on the control connection, against a peer that speaks the protocol over a real
//! socket and then goes silent (as a frozen process or a cut network would): each end must
//! declare the other dead within `hixl.HeartbeatIntervalMs × hixl.HeartbeatMissLimit`, and
//! every in-flight op must fail naming the peer and the cause.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use hixl_async::{Engine, HostBuffer};
use hixl_core::wire::{Message, HEARTBEAT_FROM_TARGET};
use hixl_core::{Error, OpDesc};

const INTERVAL_MS: u64 = 50;
const MISS: u64 = 4;

fn engine_builder(addr: &str) -> hixl_async::EngineBuilder {
    Engine::builder(addr)
        .option("hixl.Transport", "tcp")
        .option("hixl.TcpStreams", "1")
        .option("hixl.HeartbeatIntervalMs", INTERVAL_MS.to_string())
        .option("hixl.HeartbeatMissLimit", MISS.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_target_fails_in_flight_ops_within_the_heartbeat_bound() {
    // A target that completes the handshake, accepts the data connection, then never answers.
    let (addr, fake) = common::silent_target(1, Duration::from_secs(30)).await;
    let e = engine_builder("127.0.0.1").build().await.expect("engine");
    let local = e
        .register(HostBuffer::zeroed(1 << 20).expect("buf"))
        .expect("register");
    let p = e
        .connect(&addr, Duration::from_secs(5))
        .await
        .expect("connect");
    let t0 = Instant::now();
    let w = p.write(&[OpDesc::new(local.addr(), common::SILENT_ADDR, 4096)]);
    let n = p.notify_timeout("n", "m", Duration::from_secs(20));
    let (w, n) = tokio::join!(w, n);
    let took = t0.elapsed();
    let err = w.expect_err("the write cannot complete");
    println!("write failed after {took:?}: {err}");
    match &err {
        Error::HeartbeatLost { peer, .. } => assert_eq!(peer, &addr),
        other => panic!("expected a heartbeat loss, got {other:?}"),
    }
    assert!(n.is_err(), "the notify fails too");
    // The bound is interval × miss limit (200 ms); allow generous slack for a loaded machine,
    // far below the 20 s notify timeout that would otherwise have fired.
    assert!(took < Duration::from_secs(5), "detected after {took:?}");
    assert!(!p.is_connected());
    assert_eq!(e.ops_in_flight(), 0);
    fake.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_probes_a_silent_initiator_and_drops_its_session() {
    let target = engine_builder("127.0.0.1")
        .ephemeral_port()
        .build()
        .await
        .expect("engine");
    let mut c = common::hello_control(target.local_engine(), "127.0.0.1:1").await;
    let t0 = Instant::now();
    let mut buf = BytesMut::new();
    let (mut probes, mut welcomed) = (0, false);
    // Read until the target closes the connection; never answer its probes.
    while let Some(m) =
        tokio::time::timeout(Duration::from_secs(10), common::recv(&mut c, &mut buf))
            .await
            .expect("the target closes a silent session within its heartbeat bound")
    {
        match m {
            Message::Welcome { .. } => welcomed = true,
            Message::Heartbeat { seq } => {
                assert!(seq & HEARTBEAT_FROM_TARGET != 0, "probe seq {seq:#x}");
                probes += 1;
            }
            _ => {}
        }
    }
    let took = t0.elapsed();
    println!("session dropped after {took:?} and {probes} probes");
    assert!(welcomed);
    assert!(probes >= 2, "{probes} probes");
    assert!(
        took >= Duration::from_millis(INTERVAL_MS * MISS),
        "{took:?}"
    );
}

// An idle link whose probes are answered stays up: `virtual_time.rs` keeps two engines idle
// for a day of probes on tokio's paused clock.
