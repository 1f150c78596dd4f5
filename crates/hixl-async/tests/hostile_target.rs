//! Targets that answer with frames the protocol forbids: the initiator's op must fail at once
//! with a protocol error naming the peer, never wait for its timeout.

mod common;

use std::time::{Duration, Instant};

use hixl_async::{Engine, HostBuffer};
use hixl_core::wire::{Message, FEATURES};
use hixl_core::{Error, OpDesc};
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_read_that_carries_a_payload_fails_its_op() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let name = addr.clone();
    let fake = tokio::spawn(async move {
        let region = common::host_region(0x10_0000, 5, None);
        let c = common::accept_control(&l, &name, FEATURES, vec![region]).await;
        let (mut d, mut b) = common::accept_data(&l, &name, FEATURES).await;
        let Some(Message::ReadReq(r)) = common::recv(&mut d, &mut b).await else {
            panic!("expected a read request");
        };
        // A refusal must not carry data; this one announces (and sends) 8 bytes.
        common::send(
            &mut d,
            Message::ReadResp {
                id: r.id,
                status: 103_900,
                len: 8,
            },
        )
        .await;
        d.write_all(&[0xee; 8]).await.expect("payload");
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop((c, d));
    });
    let e = Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .option("hixl.TcpStreams", "1")
        .build()
        .await
        .expect("engine");
    let local = e
        .register(HostBuffer::zeroed(4096).expect("buf"))
        .expect("register");
    let p = e
        .connect(&addr, Duration::from_secs(5))
        .await
        .expect("connect");
    let t0 = Instant::now();
    let err = p
        .read(&[OpDesc::new(local.addr(), 0x10_0000, 64)])
        .timeout(Duration::from_secs(8))
        .await
        .expect_err("a protocol violation");
    assert!(matches!(err, Error::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains(&addr), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "failed after {:?}",
        t0.elapsed()
    );
    assert_eq!(e.ops_in_flight(), 0);
    fake.abort();
}

/// A web server (or a metrics endpoint) on the port: the connect fails at once, and the error
/// says the peer speaks HTTP, not a bare "bad magic"; a host name is resolved on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_on_the_port_is_named_and_a_host_name_is_resolved() {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    let http = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.expect("accept");
        let mut b = [0u8; 256];
        let _ = s.read(&mut b).await;
        let _ = s
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .await;
    });
    let e = Engine::builder("localhost")
        .option("hixl.Transport", "tcp")
        .build()
        .await
        .expect("an engine named by a host name");
    let err = e
        .connect(&format!("localhost:{port}"), Duration::from_secs(5))
        .await
        .expect_err("not a hixl engine");
    let msg = err.to_string();
    assert!(msg.contains("speaks HTTP"), "{msg}");
    let _ = http.await;
    let err = e
        .connect("no-such-host.invalid:26000", Duration::from_secs(5))
        .await
        .expect_err("does not resolve");
    assert!(
        matches!(err, Error::InvalidAddress { .. })
            && err.to_string().contains("no-such-host.invalid"),
        "{err:?}"
    );
}
