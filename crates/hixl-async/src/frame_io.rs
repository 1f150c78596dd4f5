//! Reading and writing whole control frames on a socket.

use std::sync::Arc;

use bytes::BytesMut;
use hixl_core::wire::{Message, WireError, VERSION};
use hixl_core::{Error, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

use crate::link_state::LinkState;

/// Free room a control connection's read buffer gets before a read. Control frames are small
/// (a welcome with its memory table is about a hundred bytes, a heartbeat twenty); a larger
/// frame grows the buffer, which keeps its size. Every link holds one at each end, so a
/// thousand links pay it two thousand times.
pub(crate) const READ_ROOM: usize = 512;

/// Reads one whole frame, keeping any bytes after it in `buf`.
///
/// # Errors
/// [`Error::PeerLost`] on EOF, [`Error::ConnectionLost`] on a socket error,
/// [`Error::WireVersion`] on a frame of another wire version, [`Error::Protocol`] on a
/// malformed frame.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    peer: &str,
) -> Result<Message> {
    loop {
        match Message::decode(buf) {
            Ok(Some(m)) => return Ok(m),
            Ok(None) => {}
            Err(WireError::BadVersion(theirs)) => {
                return Err(Error::WireVersion {
                    peer: peer.to_string(),
                    theirs,
                    ours: VERSION,
                })
            }
            Err(e) => {
                return Err(Error::Protocol {
                    peer: peer.to_string(),
                    reason: e.to_string(),
                })
            }
        }
        buf.reserve(READ_ROOM);
        match r.read_buf(buf).await {
            Ok(0) => {
                return Err(Error::PeerLost {
                    peer: peer.to_string(),
                    cause: "connection closed".into(),
                })
            }
            Ok(_) => {}
            Err(e) => return Err(Error::connection_lost(peer, "reading a frame", e)),
        }
    }
}

/// Takes what the socket already holds into `buf` with one nonblocking `recv`, without
/// waiting for tokio's reactor: a socket just accepted (or connected) has no readiness known
/// to tokio yet, so its first read would otherwise wait for a turn of the reactor and a trip
/// through the runtime's queue even when the peer's first frame is already there. Returns
/// whether anything was taken; errors and end of stream are left to the next [`read_frame`].
pub(crate) fn take_ready(s: &tokio::net::TcpStream, buf: &mut BytesMut) -> bool {
    buf.reserve(READ_ROOM);
    let sock = socket2::SockRef::from(s);
    // `recv` writes at most the spare capacity's length into it and says how much.
    match sock.recv(buf.spare_capacity_mut()) {
        Ok(n) if n > 0 => {
            // SAFETY: the kernel initialised the first `n` bytes of the spare capacity.
            unsafe { buf.set_len(buf.len() + n) };
            true
        }
        _ => false,
    }
}

/// Connects to `addr`. On loopback and other fast paths the kernel has usually finished the
/// handshake by the time the nonblocking `connect` returns; then the stream is used at once
/// instead of after a turn of tokio's reactor (which, with a thousand connects under way,
/// means a trip through a long run queue). Otherwise it waits for writability as
/// `TcpStream::connect` does.
///
/// # Errors
/// The socket's or the connect's error.
pub(crate) async fn connect(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_nonblocking(true)?;
    match sock.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&sock),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) } == 1;
    let s = tokio::net::TcpStream::from_std(std::net::TcpStream::from(sock))?;
    if !ready {
        s.writable().await?;
    }
    match s.take_error()? {
        Some(e) => Err(e),
        None => {
            // A connect still in progress would fail here (ENOTCONN): make sure it is done.
            s.peer_addr()?;
            Ok(s)
        }
    }
}

/// Encodes and writes one frame.
///
/// # Errors
/// [`Error::ConnectionLost`] on a socket error.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    m: &Message,
    peer: &str,
) -> Result<()> {
    let mut b = BytesMut::with_capacity(64);
    m.encode(&mut b);
    w.write_all(&b)
        .await
        .map_err(|e| Error::connection_lost(peer, "writing a frame", e))
}

/// Sets the socket options every hixl connection uses.
pub(crate) fn tune(s: &tokio::net::TcpStream) {
    let _ = s.set_nodelay(true);
    let sock = socket2::SockRef::from(s);
    let _ = sock.set_keepalive(true);
}

/// Lets the kernel watch a control connection whose link is silent for long (an idle link
/// probes only every `hixl.HeartbeatIdleMs`): after `interval × miss_limit` without a segment
/// from the peer it sends keepalives every interval, and after `miss_limit` unanswered ones,
/// or when data it sent stays unacknowledged as long (`TCP_USER_TIMEOUT`), it fails the
/// socket, which kills the link. This catches a dead host or a cut network without user
/// space waking; a frozen process still answers keepalives, and only the probes see it. The
/// kernel counts whole seconds: at least one is used.
pub(crate) fn keep_alive(s: &tokio::net::TcpStream, hb: &crate::context::Heartbeat) {
    use std::time::Duration;
    let secs = |d: Duration| Duration::from_secs(d.as_secs().clamp(1, 32_767));
    let idle = secs(hb.interval.saturating_mul(hb.miss_limit));
    let every = secs(hb.interval);
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(every)
        .with_retries(hb.miss_limit.max(1));
    let sock = socket2::SockRef::from(s);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        tracing::debug!(
            "TCP keepalive of a control connection ({idle:?}, then {every:?} x {}): {e}",
            hb.miss_limit
        );
    }
    let give_up = idle.saturating_add(every.saturating_mul(hb.miss_limit.max(1)));
    if let Err(e) = sock.set_tcp_user_timeout(Some(give_up)) {
        tracing::debug!("TCP_USER_TIMEOUT of a control connection ({give_up:?}): {e}");
    }
}

/// Shuts both directions of a socket down, so a task blocked reading it wakes with EOF.
pub(crate) fn shutdown_both(s: &tokio::net::TcpStream) {
    let _ = socket2::SockRef::from(s).shutdown(std::net::Shutdown::Both);
}

/// How long a dead link's writer may still take to flush its last frames (a `Disconnect`)
/// to a peer that does not read.
const FLUSH_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The most bytes of queued frames [`write_frames`] joins into one write.
const GATHER_MAX: usize = 64 * 1024;

/// Appends the frames already queued behind `f` to it, up to [`GATHER_MAX`] bytes: frames
/// queued together (a `Welcome`, its offers and the memory table; a burst of notifies) go
/// out in one `send`, one segment, one wake-up of the peer's reader.
fn gather(f: &mut BytesMut, rx: &mut mpsc::UnboundedReceiver<BytesMut>) {
    while f.len() < GATHER_MAX {
        match rx.try_recv() {
            Ok(g) => f.extend_from_slice(&g),
            Err(_) => break,
        }
    }
}

/// Writes queued control frames until every sender is gone or the link dies (then flushes
/// what is queued, typically a `Disconnect`, for at most [`FLUSH_GRACE`]: a peer that stopped
/// reading never holds a dead link's tasks); a write error kills the link.
pub(crate) async fn write_frames(
    mut w: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<BytesMut>,
    state: Arc<LinkState>,
    peer: Arc<str>,
) {
    let write = async {
        let mut dead = state.subscribe();
        loop {
            tokio::select! {
                biased;
                f = rx.recv() => match f {
                    Some(mut f) => {
                        gather(&mut f, &mut rx);
                        if let Err(e) = w.write_all(&f).await {
                            state.kill(Error::connection_lost(&peer, "writing a control frame", e));
                            break;
                        }
                    }
                    None => break,
                },
                _ = dead.changed() => {
                    while let Ok(f) = rx.try_recv() {
                        if w.write_all(&f).await.is_err() {
                            break;
                        }
                    }
                    break;
                }
            }
        }
    };
    let grace = async {
        state.dead().await;
        tokio::time::sleep(FLUSH_GRACE).await;
    };
    tokio::select! {
        _ = write => {}
        _ = grace => {}
    }
    shutdown_both(w.as_ref());
}

/// The protocol error of a frame that is not the one the exchange expects next.
pub(crate) fn unexpected(peer: &str, m: &Message, wanted: &str) -> Error {
    Error::Protocol {
        peer: peer.to_string(),
        reason: format!("expected {wanted}, got {m:?}"),
    }
}
