//! A connect that fails after its handshake must close its connections and end their tasks,
//! and opens no data connection (alone in this binary, so that the process's fd count is a
//! clean signal).

mod common;

use std::time::Duration;

use bytes::BytesMut;
use hixl_async::Engine;
use hixl_core::wire::Message;
use hixl_core::Error;

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// A target that welcomes the control connection but offers no fabric channel, so an
/// initiator forced onto the fabric refuses it after the handshake. Data connections open only
/// when a transfer needs them, so none may come. Returns once the initiator has closed the
/// control connection.
async fn fake_without_fabric(l: tokio::net::TcpListener) {
    let name = l.local_addr().expect("addr").to_string();
    let (mut c, _) = l.accept().await.expect("accept control");
    let mut buf = BytesMut::new();
    let _hello = common::recv(&mut c, &mut buf).await;
    common::send(
        &mut c,
        Message::Welcome {
            engine: name.clone(),
            session: 9,
            incarnation: 0x1ca7,
            features: hixl_core::wire::FEATURES,
        },
    )
    .await;
    common::send(&mut c, Message::MemTable(vec![])).await;
    loop {
        let closed = tokio::time::timeout(Duration::from_secs(5), common::recv(&mut c, &mut buf))
            .await
            .expect("control connection left open");
        match closed {
            None => break,
            // A Disconnect (or a heartbeat) may come first.
            Some(_) => continue,
        }
    }
    let data = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
    assert!(
        data.is_err(),
        "a connect that moved no data opened a data connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_fails_after_its_handshake_leaks_nothing() {
    let init = Engine::builder("127.0.0.1")
        .option("hixl.Transport", "fabric")
        .option("hixl.TcpStreams", "4")
        .build()
        .await
        .expect("initiator");
    // Warm up (runtime threads, eventfds), then count.
    let warm = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = warm.local_addr().expect("addr").to_string();
    let f = tokio::spawn(fake_without_fabric(warm));
    assert!(init.connect(&addr, Duration::from_secs(5)).await.is_err());
    f.await.expect("fake");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = fds();
    for _ in 0..10 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let f = tokio::spawn(fake_without_fabric(l));
        let e = init
            .connect(&addr, Duration::from_secs(5))
            .await
            .expect_err("no fabric offered");
        assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
        f.await.expect("the initiator closed its connections");
    }
    let mut after = fds();
    for _ in 0..100 {
        if after <= before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = fds();
    }
    assert!(
        after <= before,
        "fds {before} -> {after} after 10 failed connects"
    );
}
