//! Frames over the fabric channel: a Unix stream socket whose frames may carry memfds.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use bytes::BytesMut;
use hixl_core::wire::Message;
use hixl_core::{Error, Result};
use hixl_fabric::{recv_fds, send_fds, SCM_MAX_FD};
use tokio::io::Interest;
use tokio::net::UnixStream;

fn lost(peer: &str, cause: &'static str) -> Error {
    Error::PeerLost {
        peer: peer.to_string(),
        cause: format!("fabric channel: {cause}"),
    }
}

fn sending(peer: &str, e: std::io::Error) -> Error {
    Error::connection_lost(peer, "fabric channel send", e)
}

fn receiving(peer: &str, e: std::io::Error) -> Error {
    Error::connection_lost(peer, "fabric channel receive", e)
}

/// Writes one frame, with `fds` attached to its first byte.
///
/// # Errors
/// [`Error::ConnectionLost`] when the socket fails, [`Error::PeerLost`] when it is closed.
pub(crate) async fn send_frame(
    s: &UnixStream,
    m: &Message,
    fds: &[BorrowedFd<'_>],
    peer: &str,
) -> Result<()> {
    let mut b = BytesMut::with_capacity(64);
    m.encode(&mut b);
    let mut off = 0;
    let mut fds = fds;
    while off < b.len() {
        s.writable().await.map_err(|e| sending(peer, e))?;
        match s.try_io(Interest::WRITABLE, || send_fds(s.as_fd(), &b[off..], fds)) {
            Ok(0) => return Err(lost(peer, "socket closed")),
            Ok(n) => {
                off += n;
                fds = &[];
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(sending(peer, e)),
        }
    }
    Ok(())
}

/// Reads one whole frame; descriptors that arrive meanwhile are appended to `fds`.
///
/// # Errors
/// [`Error::PeerLost`] on EOF, [`Error::ConnectionLost`] on a socket error,
/// [`Error::Protocol`] on a malformed frame.
pub(crate) async fn recv_frame(
    s: &UnixStream,
    buf: &mut BytesMut,
    fds: &mut Vec<OwnedFd>,
    peer: &str,
) -> Result<Message> {
    let mut tmp = [0u8; 8192];
    loop {
        match Message::decode(buf) {
            Ok(Some(m)) => return Ok(m),
            Ok(None) => {}
            Err(e) => {
                return Err(Error::Protocol {
                    peer: peer.to_string(),
                    reason: format!("fabric channel: {e}"),
                })
            }
        }
        s.readable().await.map_err(|e| receiving(peer, e))?;
        match s.try_io(Interest::READABLE, || {
            recv_fds(s.as_fd(), &mut tmp, SCM_MAX_FD)
        }) {
            Ok((0, _)) => return Err(lost(peer, "connection closed")),
            Ok((n, got)) => {
                buf.extend_from_slice(&tmp[..n]);
                fds.extend(got);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(receiving(peer, e)),
        }
    }
}
