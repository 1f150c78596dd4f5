//! Heartbeats on the control connection, against a peer that speaks the protocol over a real
//! socket and then goes silent (as a frozen process or a cut network would): each end must
//! declare the other dead within `hixl.HeartbeatIntervalMs × hixl.HeartbeatMissLimit`, and
//! every in-flight op must fail naming the peer and the cause.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use hixl_async::{Engine, HostBuffer};
use hixl_core::wire::{Channel, Message, HEARTBEAT_FROM_TARGET};
use hixl_core::{Access, Error, MemKind, OpDesc, RemoteRegion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const INTERVAL_MS: u64 = 50;
const MISS: u64 = 4;

async fn send(s: &mut TcpStream, m: Message) {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    s.write_all(&b).await.expect("write frame");
}

/// Reads one frame; `None` at EOF or on a reset.
async fn recv(s: &mut TcpStream, buf: &mut BytesMut) -> Option<Message> {
    loop {
        if let Some(m) = Message::decode(buf).expect("well-formed frame") {
            return Some(m);
        }
        match s.read_buf(buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

fn engine_builder(addr: &str) -> hixl_async::EngineBuilder {
    Engine::builder(addr)
        .option("hixl.Transport", "tcp")
        .option("hixl.TcpStreams", "1")
        .option("hixl.HeartbeatIntervalMs", INTERVAL_MS.to_string())
        .option("hixl.HeartbeatMissLimit", MISS.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_target_fails_in_flight_ops_within_the_heartbeat_bound() {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let name = addr.clone();
    // A target that completes the handshake, accepts the data connection, then never answers.
    let fake = tokio::spawn(async move {
        let mut conns = Vec::new();
        let (mut c, _) = l.accept().await.expect("accept control");
        let mut buf = BytesMut::new();
        assert!(matches!(
            recv(&mut c, &mut buf).await,
            Some(Message::Hello {
                channel: Channel::Control,
                ..
            })
        ));
        send(
            &mut c,
            Message::Welcome {
                engine: name.clone(),
                session: 7,
            },
        )
        .await;
        let region = RemoteRegion {
            addr: 0x10_0000,
            len: 1 << 20,
            rkey: 99,
            access: Access::REMOTE_RW,
            kind: MemKind::Host,
            name: Some("kv".into()),
        };
        send(&mut c, Message::MemTable(vec![region])).await;
        let (mut d, _) = l.accept().await.expect("accept data");
        let mut dbuf = BytesMut::new();
        assert!(matches!(
            recv(&mut d, &mut dbuf).await,
            Some(Message::Hello {
                channel: Channel::Data,
                session: 7,
                ..
            })
        ));
        send(
            &mut d,
            Message::Welcome {
                engine: name,
                session: 7,
            },
        )
        .await;
        conns.push(c);
        conns.push(d);
        // Silent from here on; keep the sockets open.
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(conns);
    });
    let e = engine_builder("127.0.0.1").build().await.expect("engine");
    let local = e
        .register(HostBuffer::zeroed(1 << 20).expect("buf"))
        .expect("register");
    let p = e
        .connect(&addr, Duration::from_secs(5))
        .await
        .expect("connect");
    let t0 = Instant::now();
    let w = p.write(&[OpDesc::new(local.addr(), 0x10_0000, 4096)]);
    let n = p.notify_timeout("n", "m", Duration::from_secs(20));
    let (w, n) = tokio::join!(w, n);
    let took = t0.elapsed();
    let err = w.expect_err("the write cannot complete");
    println!("write failed after {took:?}: {err}");
    match &err {
        Error::PeerLost { peer, cause } => {
            assert_eq!(peer, &addr);
            assert!(cause.contains("heartbeat"), "{cause}");
        }
        other => panic!("expected PeerLost, got {other:?}"),
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
    let mut c = TcpStream::connect(target.local_engine())
        .await
        .expect("connect");
    send(
        &mut c,
        Message::Hello {
            engine: "127.0.0.1:1".into(),
            channel: Channel::Control,
            session: 1,
        },
    )
    .await;
    let t0 = Instant::now();
    let mut buf = BytesMut::new();
    let (mut probes, mut welcomed) = (0, false);
    // Read until the target closes the connection; never answer its probes.
    while let Some(m) = tokio::time::timeout(Duration::from_secs(10), recv(&mut c, &mut buf))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_probes_keep_an_idle_link_up() {
    let target = engine_builder("127.0.0.1")
        .ephemeral_port()
        .build()
        .await
        .expect("engine");
    let init = engine_builder("127.0.0.1").build().await.expect("engine");
    let p = init
        .connect(target.local_engine(), Duration::from_secs(5))
        .await
        .expect("connect");
    // Idle for many bounds: both ends probe and answer, nothing is torn down.
    tokio::time::sleep(Duration::from_millis(INTERVAL_MS * MISS * 5)).await;
    assert!(p.is_connected(), "{:?}", p.error());
    p.notify("still", "here")
        .await
        .expect("notify over the idle link");
}
