//! Raw-socket peers for the engine's tests: frames in and out, and a target that completes
//! the handshake and then never answers.
#![allow(dead_code)]

use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, Message};
use hixl_core::{Access, MemKind, RemoteRegion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Where the silent target's one region is.
pub const SILENT_ADDR: u64 = 0x10_0000;

pub async fn send(s: &mut TcpStream, m: Message) {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    s.write_all(&b).await.expect("write frame");
}

/// Reads one frame; `None` at EOF or on a reset.
pub async fn recv(s: &mut TcpStream, buf: &mut BytesMut) -> Option<Message> {
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

/// A target that welcomes one initiator (control and `streams` data connections), exports
/// one 1 MiB region named `kv` at [`SILENT_ADDR`], then never answers anything (as a frozen
/// process or a cut network would) while keeping its sockets open for `hold`.
pub async fn silent_target(
    streams: usize,
    hold: Duration,
) -> (String, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let name = addr.clone();
    let task = tokio::spawn(async move {
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
                incarnation: 0x1ca7,
                features: hixl_core::wire::FEATURES,
            },
        )
        .await;
        let region = RemoteRegion {
            addr: SILENT_ADDR,
            len: 1 << 20,
            rkey: 99,
            access: Access::REMOTE_RW,
            kind: MemKind::Host,
            name: Some("kv".into()),
        };
        send(&mut c, Message::MemTable(vec![region])).await;
        conns.push(c);
        for _ in 0..streams {
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
                    engine: name.clone(),
                    session: 7,
                    incarnation: 0x1ca7,
                    features: hixl_core::wire::FEATURES,
                },
            )
            .await;
            conns.push(d);
        }
        tokio::time::sleep(hold).await;
        drop(conns);
    });
    (addr, task)
}
