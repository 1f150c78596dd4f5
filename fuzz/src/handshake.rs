//! A raw initiator's control handshake.

use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, Message};
use hixl_core::RemoteRegion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::encode;

/// What a target engine told a raw initiator in its handshake.
#[derive(Debug)]
pub struct Handshake {
    /// The control connection (kept open: closing it ends the session).
    pub stream: tokio::net::TcpStream,
    /// The session data and fabric channels must present.
    pub session: u64,
    /// The target's fabric socket, if it offered one.
    pub fabric_socket: Option<String>,
    /// The memory table.
    pub table: Vec<RemoteRegion>,
    /// Bytes read past the memory table.
    pub rest: BytesMut,
}

/// Connects to `addr` as initiator `engine` with raw frames: Hello, then Welcome, FabricInfo /
/// VerbsInfo and the memory table.
///
/// # Panics
/// When the target does not complete a valid handshake (an invariant: it must serve one).
pub async fn handshake(addr: &str, engine: &str) -> Handshake {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| {
            panic!("invariant violated: the engine at {addr} does not accept connections: {e}")
        });
    let _ = s.set_nodelay(true);
    let hello = Message::Hello {
        engine: engine.to_string(),
        channel: Channel::Control,
        session: 1,
        features: hixl_core::wire::FEATURES,
    };
    s.write_all(&encode(&hello))
        .await
        .unwrap_or_else(|e| panic!("invariant violated: writing a hello to {addr}: {e}"));
    let mut buf = BytesMut::new();
    let mut session = None;
    let mut fabric_socket = None;
    let table = loop {
        match Message::decode(&mut buf) {
            Ok(Some(Message::Welcome { session: s, .. })) if session.is_none() => session = Some(s),
            Ok(Some(Message::FabricInfo { socket, .. })) if session.is_some() => {
                fabric_socket = Some(socket)
            }
            Ok(Some(Message::VerbsInfo { .. })) if session.is_some() => {}
            Ok(Some(Message::Heartbeat { .. })) if session.is_some() => {}
            Ok(Some(Message::MemTable(t))) if session.is_some() => break t,
            Ok(Some(m)) => {
                panic!("invariant violated: a valid hello to {addr} was answered with {m:?}")
            }
            Err(e) => panic!("invariant violated: {addr} sent a malformed handshake frame: {e}"),
            Ok(None) => {
                let r = tokio::time::timeout(Duration::from_secs(10), s.read_buf(&mut buf)).await;
                match r {
                    Ok(Ok(n)) if n > 0 => {}
                    other => panic!(
                        "invariant violated: {addr} did not complete a valid handshake: {other:?}"
                    ),
                }
            }
        }
    };
    Handshake {
        stream: s,
        session: session.unwrap_or_default(),
        fabric_socket,
        table,
        rest: buf,
    }
}
