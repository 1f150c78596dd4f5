//! AutoConnect, the channel pool's eviction, ConnectAsync/DisconnectAsync and abandoned
//! connects, against real engines and silent raw-socket targets.

mod common;

use std::time::Duration;

use hixl_async::blocking::Hixl;
use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::{Access, AsyncConnectStatus, Error, OpDesc, TransferOp};

const T: Duration = Duration::from_secs(5);

async fn target() -> (Engine, Region) {
    let e = Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .ephemeral_port()
        .build()
        .await
        .expect("target");
    let r = e
        .register_with(
            HostBuffer::zeroed(1 << 16).expect("buf"),
            Access::REMOTE_RW,
            Some("kv"),
        )
        .expect("register");
    (e, r)
}

/// A tcp initiator with one data connection per link and the channel pool `pool`; its
/// heartbeats are slow enough that silent targets keep their links for the whole test.
async fn pooled_initiator(pool: &str) -> Engine {
    Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .option("hixl.TcpStreams", "1")
        .option("GlobalResourceConfig", pool)
        .option("hixl.HeartbeatIntervalMs", "60000")
        .build()
        .await
        .expect("initiator")
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_connect_connects_inside_transfers_and_again_after_the_peer_restarts() {
    let (t1, r1) = target().await;
    let addr = t1.local_engine().to_string();
    let port: u16 = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");
    let init = Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .option("AutoConnect", "1")
        .build()
        .await
        .expect("initiator");
    assert!(init.auto_connects());
    let local = init
        .register(HostBuffer::zeroed(1 << 16).expect("buf"))
        .expect("register");
    local.write_at(0, b"first").expect("fill");
    // No connect: the transfer connects (and the future need not be polled for that).
    let w = init.transfer(
        &addr,
        TransferOp::Write,
        &[OpDesc::new(local.addr(), r1.addr(), 5)],
    );
    w.timeout(T).await.expect("auto-connected write");
    let mut got = [0u8; 5];
    r1.read_at(0, &mut got).expect("read");
    assert_eq!(&got, b"first");
    assert_eq!(init.peers(), vec![addr.clone()]);
    // The target goes away: the broken link is cleaned up by itself.
    t1.shutdown(Duration::from_millis(100)).await;
    drop(t1);
    eventually("the dead link to be dropped", || init.peers().is_empty()).await;
    // A new target on the same port (once the old listener task has let go of it): the next
    // transfer reconnects.
    let mut tries = 0;
    let (t2, r2) = loop {
        let b = Engine::builder(format!("127.0.0.1:{port}")).option("hixl.Transport", "tcp");
        match b.build().await {
            Ok(e) => {
                let r = e
                    .register_with(
                        HostBuffer::zeroed(1 << 16).expect("buf"),
                        Access::REMOTE_RW,
                        Some("kv"),
                    )
                    .expect("register");
                break (e, r);
            }
            Err(e) if tries < 150 => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("port {port} not free again: {e}"),
        }
    };
    local.write_at(0, b"again").expect("fill");
    init.transfer(
        &addr,
        TransferOp::Write,
        &[OpDesc::new(local.addr(), r2.addr(), 5)],
    )
    .timeout(T)
    .await
    .expect("write after the restart");
    r2.read_at(0, &mut got).expect("read");
    assert_eq!(&got, b"again");
    drop(t2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auto_connect_a_transfer_to_an_unconnected_peer_is_not_connected() {
    let (t, r) = target().await;
    let init = Engine::builder("127.0.0.1")
        .build()
        .await
        .expect("initiator");
    let local = init
        .register(HostBuffer::zeroed(4096).expect("buf"))
        .expect("register");
    let e = init
        .transfer(
            t.local_engine(),
            TransferOp::Write,
            &[OpDesc::new(local.addr(), r.addr(), 1)],
        )
        .await
        .expect_err("not connected");
    assert!(matches!(e, Error::NotConnected { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_pool_evicts_idle_links_and_never_busy_ones() {
    // max 4 links; at 2 (0.5 × 4) evict down to 1 (0.25 × 4).
    let init = pooled_initiator(r#"{"channel_pool.max_channel": 4, "channel_pool.high_waterline": 0.5, "channel_pool.low_waterline": 0.25}"#).await;
    let local = init
        .register(HostBuffer::zeroed(1 << 16).expect("buf"))
        .expect("register");
    // A busy link: a silent target holds a write unanswered.
    let (silent, _s) = common::silent_target(1, Duration::from_secs(30)).await;
    let busy = init.connect(&silent, T).await.expect("connect silent");
    let pending = busy.write(&[OpDesc::new(local.addr(), common::SILENT_ADDR, 64)]);
    let (t1, _) = target().await;
    let (t2, r2) = target().await;
    let p1 = init
        .connect(t1.local_engine(), T)
        .await
        .expect("connect t1");
    // Two links reached the high mark; the busy one stays, the new one is kept.
    assert_eq!(init.peers().len(), 2);
    let p2 = init
        .connect(t2.local_engine(), T)
        .await
        .expect("connect t2");
    // Three links: t1 (idle, least recently used) goes; the busy link stays.
    let mut peers = init.peers();
    peers.sort();
    let mut want = vec![silent.clone(), t2.local_engine().to_string()];
    want.sort();
    assert_eq!(peers, want);
    assert!(!p1.is_connected());
    assert!(
        matches!(p1.error(), Some(Error::Evicted { ref peer }) if *peer == p1.name()),
        "{:?}",
        p1.error()
    );
    assert!(
        busy.is_connected(),
        "a link with an op in flight is never evicted"
    );
    assert_eq!(pending.status(), hixl_core::TransferStatus::Waiting);
    p2.write(&[OpDesc::new(local.addr(), r2.addr(), 64)])
        .timeout(T)
        .await
        .expect("the kept link works");
    drop(pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_of_busy_links_refuses_a_new_one() {
    let init = pooled_initiator(r#"{"channel_pool.max_channel": 2, "channel_pool.high_waterline": 0.9, "channel_pool.low_waterline": 0.5}"#).await;
    let local = init
        .register(HostBuffer::zeroed(4096).expect("buf"))
        .expect("register");
    let mut held = Vec::new();
    for _ in 0..2 {
        let (a, task) = common::silent_target(1, Duration::from_secs(30)).await;
        let p = init.connect(&a, T).await.expect("connect");
        held.push((
            p.write(&[OpDesc::new(local.addr(), common::SILENT_ADDR, 8)]),
            task,
        ));
    }
    let (t, _) = target().await;
    let e = init
        .connect(t.local_engine(), T)
        .await
        .expect_err("pool full of busy links");
    assert!(matches!(e, Error::ResourceExhausted { .. }), "{e:?}");
    assert!(e.to_string().contains("max_channel"), "{e}");
    // Once an op resolves (dropped: abandoned ops still count as busy until answered), a
    // link can be closed by hand and the new connect succeeds.
    let (w, _task) = held.remove(0);
    drop(w);
    init.disconnect(&init.peers()[0]).await.expect("disconnect");
    init.connect(t.local_engine(), T).await.expect("room again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_async_reports_the_latest_tasks_state() {
    let (t, _) = target().await;
    let addr = t.local_engine().to_string();
    let init = Engine::builder("127.0.0.1")
        .build()
        .await
        .expect("initiator");
    assert_eq!(
        init.async_connect_status(&addr).expect("status"),
        AsyncConnectStatus::NotConnect
    );
    init.connect_async(&addr, T).expect("queue connect");
    eventually("connected", || {
        init.async_connect_status(&addr).ok() == Some(AsyncConnectStatus::Connected)
    })
    .await;
    assert!(init.peer(&addr).expect("peer").is_connected());
    init.disconnect_async(&addr, T).expect("queue disconnect");
    eventually("disconnected", || {
        init.async_connect_status(&addr).ok() == Some(AsyncConnectStatus::NotConnect)
    })
    .await;
    assert!(init.peers().is_empty());
    // A connect that cannot succeed ends as CONNECT_FAILED.
    init.connect_async("127.0.0.1:1", T).expect("queue");
    eventually("failed", || {
        init.async_connect_status("127.0.0.1:1").ok() == Some(AsyncConnectStatus::ConnectFailed)
    })
    .await;
    let all = init.async_connect_statuses();
    assert_eq!(
        all.get("127.0.0.1:1"),
        Some(&AsyncConnectStatus::ConnectFailed)
    );
    assert!(init.connect_async(&addr, Duration::ZERO).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_abandoned_by_its_caller_frees_the_peer_for_the_next_one() {
    // A listener that never accepts: the kernel completes the TCP handshake, the engine's
    // hello is never answered.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let init = Engine::builder("127.0.0.1")
        .build()
        .await
        .expect("initiator");
    let r = tokio::time::timeout(Duration::from_millis(100), init.connect(&addr, T)).await;
    assert!(r.is_err(), "the caller gave up");
    // Not ALREADY_CONNECTED: the abandoned attempt left nothing behind.
    let e = init
        .connect(&addr, Duration::from_millis(100))
        .await
        .expect_err("still unanswered");
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    drop(l);
}

#[test]
fn blocking_facade_auto_connects_in_transfer_sync_and_async() {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let (t, r) = rt.block_on(target());
    let addr = t.local_engine().to_string();
    let h = Hixl::new();
    h.initialize(
        "127.0.0.1",
        &[("AutoConnect", "1"), ("hixl.Transport", "tcp")],
    )
    .expect("initialize");
    let buf = HostBuffer::zeroed(4096).expect("buf");
    let (_, local) = h.register_buffer(buf).expect("register");
    local.write_at(0, b"sync").expect("fill");
    h.transfer_sync(
        &addr,
        TransferOp::Write,
        &[OpDesc::new(local.addr(), r.addr(), 4)],
        3000,
    )
    .expect("auto-connected transfer_sync");
    let mut got = [0u8; 4];
    r.read_at(0, &mut got).expect("read");
    assert_eq!(&got, b"sync");
    h.connect_async(&addr, 1000)
        .expect("connect_async on a live link");
    let s = h.get_async_connect_status(&addr).expect("status");
    assert!(
        matches!(
            s,
            AsyncConnectStatus::ConnectPending
                | AsyncConnectStatus::Connecting
                | AsyncConnectStatus::Connected
        ),
        "{s:?}"
    );
    h.finalize();
    drop(t);
}
