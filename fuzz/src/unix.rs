//! Unix sockets (the fabric channel), where frames may carry file descriptors.

use std::sync::OnceLock;
use std::time::Duration;

use crate::{ReadEnd, Step};

/// A descriptor to pass around in `Fds` steps: `/dev/null`, opened once.
pub fn spare_fd() -> std::os::fd::BorrowedFd<'static> {
    use std::os::fd::AsFd;
    static F: OnceLock<std::fs::File> = OnceLock::new();
    F.get_or_init(|| std::fs::File::open("/dev/null").expect("harness setup: /dev/null"))
        .as_fd()
}

/// Sends `b` with `fds` attached to its first byte.
pub async fn send_with_fds(
    s: &tokio::net::UnixStream,
    b: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    let mut off = 0;
    let mut fds = fds;
    while off < b.len() {
        s.writable().await?;
        match s.try_io(tokio::io::Interest::WRITABLE, || {
            hixl_fabric::send_fds(s.as_fd(), &b[off..], fds)
        }) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                off += n;
                fds = &[];
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `steps` to a Unix stream (an `Fds(n)` step attaches `n` copies of [`spare_fd`] to
/// the next bytes), then shuts the write side down. Returns false when a write failed.
pub async fn write_steps_unix(s: &tokio::net::UnixStream, steps: &[Step]) -> bool {
    let mut nfds = 0usize;
    for st in steps {
        match st {
            Step::Bytes(b) if !b.is_empty() => {
                let fds = vec![spare_fd(); nfds];
                nfds = 0;
                if send_with_fds(s, b, &fds).await.is_err() {
                    return false;
                }
            }
            Step::Bytes(_) => {}
            Step::Pause => tokio::task::yield_now().await,
            Step::Fds(n) => nfds = usize::from(*n),
        }
    }
    shutdown_write(s);
    true
}

/// `shutdown(SHUT_WR)` on a socket.
pub fn shutdown_write(s: &impl std::os::fd::AsRawFd) {
    // SAFETY: plain syscall on a live descriptor.
    unsafe {
        libc::shutdown(s.as_raw_fd(), libc::SHUT_WR);
    }
}

/// Reads a Unix stream until EOF or error (at most `limit` bytes), keeping the descriptors
/// that arrive (in arrival order) so they can be checked and then closed.
pub async fn read_to_end_unix(
    s: &tokio::net::UnixStream,
    limit: usize,
    within: Duration,
) -> (Vec<u8>, ReadEnd, Vec<std::os::fd::OwnedFd>) {
    use std::os::fd::AsFd;
    let mut v = Vec::new();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.readable()).await {
            Err(_) => return (v, ReadEnd::Timeout, fds),
            Ok(Err(_)) => return (v, ReadEnd::Reset, fds),
            Ok(Ok(())) => {}
        }
        match s.try_io(tokio::io::Interest::READABLE, || {
            hixl_fabric::recv_fds(s.as_fd(), &mut buf, hixl_fabric::SCM_MAX_FD)
        }) {
            Ok((0, _)) => return (v, ReadEnd::Eof, fds),
            Ok((n, got)) => {
                v.extend_from_slice(&buf[..n]);
                fds.extend(got);
                assert!(
                    v.len() <= limit,
                    "invariant violated: the engine sent more than {limit} bytes on one fabric channel"
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return (v, ReadEnd::Reset, fds),
        }
    }
}

/// Connects to an abstract Unix socket.
pub fn connect_abstract(name: &str) -> std::io::Result<tokio::net::UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let s = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    s.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(s)
}

/// Binds an abstract Unix socket.
pub fn listen_abstract(name: &str) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(l)
}
