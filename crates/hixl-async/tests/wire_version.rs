//! The negotiated wire: an engine of another wire version is refused with a reason naming
//! both versions, whichever end is the older, and a link uses an optional part of the
//! protocol only when both ends announced it.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use hixl_async::{Engine, HostBuffer};
use hixl_core::wire::{feature, ty, Channel, Message, FEATURES, HEADER_LEN, VERSION};
use hixl_core::{Error, Status, StridedDesc, TransferOp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const T: Duration = Duration::from_secs(10);

/// A control `Hello` of wire 1, byte for byte as an engine of release 0.2 sends it: engine
/// `10.0.0.1:26000`, channel control, incarnation 7 (and no features field).
const HELLO_V1: [u8; 37] = [
    b'H', b'I', b'X', b'L', 1, 1, 0, 0, 25, 0, 0, 0, // header: wire 1, HELLO, 25 bytes
    14, 0, b'1', b'0', b'.', b'0', b'.', b'0', b'.', b'1', b':', b'2', b'6', b'0', b'0', b'0',
    0, // channel: control
    7, 0, 0, 0, 0, 0, 0, 0, // session: the incarnation
];

/// An engine over tcp; `listen`: with a port of its own, to be a target.
async fn tcp_engine(listen: bool) -> Engine {
    let mut b = Engine::builder("127.0.0.1");
    if listen {
        b = b.ephemeral_port();
    }
    b.option("hixl.Transport", "tcp")
        .option("hixl.TcpStreams", "1")
        .build()
        .await
        .expect("engine")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_of_wire_1_gets_a_refusal_it_can_read() {
    let target = tcp_engine(true).await;
    let mut s = tokio::net::TcpStream::connect(target.local_engine())
        .await
        .expect("connect");
    s.write_all(&HELLO_V1).await.expect("hello");
    // Everything until the target closes: one frame a wire-1 reader accepts.
    let mut got = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut got))
        .await
        .expect("the target closes after refusing")
        .expect("read");
    assert!(got.len() >= HEADER_LEN, "{got:?}");
    assert_eq!(&got[..4], b"HIXL");
    assert_eq!(got[4], 1, "framed in the peer's version");
    assert_eq!(got[5], ty::REFUSE);
    assert_eq!(&got[6..8], &[0, 0]);
    let body_len = u32::from_le_bytes([got[8], got[9], got[10], got[11]]) as usize;
    assert_eq!(
        got.len(),
        HEADER_LEN + body_len,
        "one frame, then the close"
    );
    let Ok(Message::Refuse { status, reason }) = Message::decode_body(ty::REFUSE, &got[12..])
    else {
        panic!("not a refusal: {got:?}");
    };
    assert_eq!(status, Status::Unsupported.code());
    assert!(
        reason.contains(&format!("hixl wire {VERSION}")) && reason.contains("hixl wire 1"),
        "{reason}"
    );
    // The target goes on serving engines of its own version.
    let init = tcp_engine(false).await;
    init.connect(target.local_engine(), T)
        .await
        .expect("a current engine connects");
}

/// A fake target that reads the hello and answers with `answer`'s bytes.
async fn fake_target(answer: Vec<u8>) -> (String, tokio::task::JoinHandle<Option<Message>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let task = tokio::spawn(async move {
        let (mut c, _) = l.accept().await.expect("accept");
        let mut buf = BytesMut::new();
        let hello = common::recv(&mut c, &mut buf).await;
        c.write_all(&answer).await.expect("answer");
        let _ = c.read_to_end(&mut Vec::new()).await;
        hello
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_of_another_wire_is_reported_with_both_versions() {
    let newer = VERSION + 1;
    // A newer target refuses in this engine's framing, as `version_refusal` does.
    let mut refusal = BytesMut::new();
    Message::Refuse {
        status: Status::Unsupported.code(),
        reason: format!(
            "the target speaks hixl wire {newer}, the connecting engine hixl wire {VERSION}: they cannot talk"
        ),
    }
    .encode(&mut refusal);
    // An older target answers in its own framing.
    let mut old_welcome = BytesMut::new();
    Message::Welcome {
        engine: "x".into(),
        session: 1,
        incarnation: 2,
        features: 0,
    }
    .encode(&mut old_welcome);
    old_welcome[4] = 1;
    let init = tcp_engine(false).await;
    for (answer, theirs) in [(refusal.to_vec(), newer), (old_welcome.to_vec(), 1)] {
        let (addr, fake) = fake_target(answer).await;
        let e = init.connect(&addr, T).await.expect_err("refused");
        match &e {
            Error::WireVersion {
                theirs: t,
                ours: VERSION,
                ..
            } if *t == theirs => {}
            e => panic!("wire {theirs}: {e:?}"),
        }
        let text = e.to_string();
        assert!(
            text.contains(&format!("speaks hixl wire {theirs}, this engine {VERSION}")),
            "{text}"
        );
        assert_eq!(e.status(), Status::Unsupported);
        let hello = fake.await.expect("fake");
        assert!(
            matches!(
                hello,
                Some(Message::Hello {
                    channel: Channel::Control,
                    features: FEATURES,
                    ..
                })
            ),
            "the hello announces this engine's features: {hello:?}"
        );
    }
}

/// A fake target that welcomes with `features`, exports one 1 MiB region at 0x10_0000 and
/// answers every read on its data connection with zeros; gives back the kinds of request it
/// was sent.
async fn counting_target(features: u64) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let name = addr.clone();
    let task = tokio::spawn(async move {
        let region = common::host_region(0x10_0000, 5, None);
        let _c = common::accept_control(&l, &name, features, vec![region]).await;
        let (mut d, mut b) = common::accept_data(&l, &name, features).await;
        let mut kinds = Vec::new();
        while let Some(m) = common::recv(&mut d, &mut b).await {
            kinds.push(m.ty());
            let (id, len) = match m {
                Message::ReadReq(r) => (r.id, r.len),
                Message::ReadStridedReq(r) => (r.id, r.bytes()),
                m => panic!("unexpected {m:?}"),
            };
            common::send(&mut d, Message::ReadResp { id, status: 0, len }).await;
            d.write_all(&vec![0; len as usize]).await.expect("payload");
        }
        kinds
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_requests_go_only_to_a_peer_that_announced_them() {
    for (features, want) in [
        (FEATURES, vec![ty::READ_STRIDED_REQ]),
        (FEATURES & !feature::STRIDED, vec![ty::READ_REQ; 8]),
    ] {
        let (addr, fake) = counting_target(features).await;
        let init = tcp_engine(false).await;
        let local = init
            .register(HostBuffer::zeroed(4096).expect("buf"))
            .expect("register");
        let p = init.connect(&addr, T).await.expect("connect");
        let d = StridedDesc {
            local_addr: local.addr(),
            remote_addr: 0x10_0000,
            len: 64,
            local_stride: 64,
            remote_stride: 256,
            count: 8,
        };
        p.transfer_strided(TransferOp::Read, &[d])
            .await
            .expect("read");
        drop(p);
        init.shutdown(T).await;
        let kinds = tokio::time::timeout(T, fake)
            .await
            .expect("the fake sees the close")
            .expect("fake");
        assert_eq!(kinds, want, "features {features:#x}");
    }
}
