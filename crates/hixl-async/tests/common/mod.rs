//! Raw-socket peers for the engine's tests: frames in and out, and a target that completes
//! the handshake and then never answers.
#![allow(dead_code)]

use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, Message, FEATURES};
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

/// Connects to the engine at `target` as a raw initiator and says a control hello as
/// `engine` (session 1, this build's features).
pub async fn hello_control(target: &str, engine: &str) -> TcpStream {
    let mut s = TcpStream::connect(target).await.expect("connect");
    send(
        &mut s,
        Message::Hello {
            engine: engine.into(),
            channel: Channel::Control,
            session: 1,
            features: FEATURES,
        },
    )
    .await;
    s
}

/// A 1 MiB read-write host region at `addr` of a fake target's table.
pub fn host_region(addr: u64, rkey: u64, name: Option<&str>) -> RemoteRegion {
    RemoteRegion {
        addr,
        len: 1 << 20,
        rkey,
        access: Access::REMOTE_RW,
        kind: MemKind::Host,
        name: name.map(str::to_string),
    }
}

/// The session a fake target hands out.
pub const SESSION: u64 = 7;

/// Accepts one initiator's control connection on `l`: reads its hello, welcomes it as `name`
/// (session [`SESSION`], `features`) and sends `table`.
pub async fn accept_control(
    l: &TcpListener,
    name: &str,
    features: u64,
    table: Vec<RemoteRegion>,
) -> TcpStream {
    let (mut c, _) = l.accept().await.expect("accept control");
    let mut buf = BytesMut::new();
    assert!(matches!(
        recv(&mut c, &mut buf).await,
        Some(Message::Hello {
            channel: Channel::Control,
            ..
        })
    ));
    send(&mut c, welcome(name, features)).await;
    send(&mut c, Message::MemTable(table)).await;
    c
}

/// Accepts one data connection of the session on `l` and welcomes it; gives it back with
/// what it sent past its hello.
pub async fn accept_data(l: &TcpListener, name: &str, features: u64) -> (TcpStream, BytesMut) {
    let (mut d, _) = l.accept().await.expect("accept data");
    let mut buf = BytesMut::new();
    assert!(matches!(
        recv(&mut d, &mut buf).await,
        Some(Message::Hello {
            channel: Channel::Data,
            session: SESSION,
            ..
        })
    ));
    send(&mut d, welcome(name, features)).await;
    (d, buf)
}

fn welcome(name: &str, features: u64) -> Message {
    Message::Welcome {
        engine: name.to_string(),
        session: SESSION,
        incarnation: 0x1ca7,
        features,
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
        let region = host_region(SILENT_ADDR, 99, Some("kv"));
        let mut conns = vec![accept_control(&l, &name, FEATURES, vec![region]).await];
        for _ in 0..streams {
            conns.push(accept_data(&l, &name, FEATURES).await.0);
        }
        tokio::time::sleep(hold).await;
        drop(conns);
    });
    (addr, task)
}
