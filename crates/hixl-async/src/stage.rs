//! Read-ahead for a TCP data connection's receiving side: one `recvmsg` takes the rest of the
//! payload being received (straight into registered memory) *and* whatever follows it (the
//! next frames, and the start of their payloads) into a small buffer of our own, the stage.
//!
//! Receiving a frame's exact bytes costs a syscall per header and one per payload: 64 for a
//! batch of 32 small reads or writes. With the stage, the frames that follow a payload arrive
//! with it, and a small payload that came with its header is copied out of the stage (a copy
//! of a few KiB costs less than the `recv` it saves). A large payload still lands in place:
//! the stage never holds more than its capacity, and what follows is asked for only after the
//! payload's own bytes (the kernel fills iovecs in order).
//!
//! The stage only ever holds bytes that came after everything already consumed, so the
//! protocol reads it in order, exactly as it would read the socket.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::rawio::{self, RawRange, Sock, SPIN_SLICE};

/// Bytes a stage holds at most: a batch of small answers or requests per syscall, while an
/// idle data connection's stage stays unallocated and a busy one costs this much.
pub(crate) const STAGE_BYTES: usize = 16 << 10;

/// Bytes received ahead of where the protocol stands (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct Stage {
    /// Allocated at the first receive.
    buf: Vec<u8>,
    /// The unconsumed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
}

/// What one receive brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Got {
    /// Bytes that landed in the destination range.
    pub(crate) into_dst: usize,
    /// Bytes that landed in the stage, after it.
    pub(crate) staged: usize,
}

impl Got {
    /// The peer closed the stream (nothing came, where something was asked for).
    pub(crate) fn is_eof(&self) -> bool {
        self.into_dst == 0 && self.staged == 0
    }
}

impl Stage {
    /// Unconsumed bytes.
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The unconsumed bytes, oldest first.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Drops the first `n` unconsumed bytes (`n <= len`).
    pub(crate) fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.start += n.min(self.len());
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Copies the first unconsumed bytes into `dst` (as many as both have) and consumes them:
    /// how many moved.
    pub(crate) fn take_into(&mut self, dst: RawRange<'_>) -> usize {
        let n = self.len().min(dst.len());
        if n > 0 {
            dst.to(n).copy_in(&self.buf[self.start..self.start + n]);
            self.consume(n);
        }
        n
    }

    /// One nonblocking `recvmsg` (`MSG_DONTWAIT`, `EINTR` retried): into `dst` first, when
    /// given, then into the stage's free room after its unconsumed bytes. `Ok` with
    /// [`Got::is_eof`] when the peer closed; [`io::ErrorKind::WouldBlock`] when nothing is
    /// there yet.
    ///
    /// Callers consume what the stage holds before asking the socket for more, so a receive
    /// into `dst` finds the stage empty, and one for the next frame finds less than a frame.
    pub(crate) fn recv_now(&mut self, fd: RawFd, dst: Option<RawRange<'_>>) -> io::Result<Got> {
        // The common receive: one range at most, so a two-iovec array (no larger one to fill
        // per syscall).
        let mut iov = [rawio::NO_IOV; 2];
        match dst {
            Some(d) => self.recv_iov(fd, &[d], &mut iov),
            None => self.recv_iov(fd, &[], &mut iov),
        }
    }

    /// [`Stage::recv_now`] into several ranges in order (the pieces of a strided part, at
    /// most [`MAX_SCATTER`] of them), then the stage: one `recvmsg` lands many pieces in place.
    pub(crate) fn recv_now_into(&mut self, fd: RawFd, dsts: &[RawRange<'_>]) -> io::Result<Got> {
        let mut iov = [rawio::NO_IOV; MAX_SCATTER + 1];
        self.recv_iov(fd, dsts, &mut iov)
    }

    /// One `recvmsg` into the non-empty ranges of `dsts` (as many as `iov` holds, less one)
    /// and then the stage's free room, with `iov` as the iovec array.
    fn recv_iov(
        &mut self,
        fd: RawFd,
        dsts: &[RawRange<'_>],
        iov: &mut [libc::iovec],
    ) -> io::Result<Got> {
        self.make_room();
        let mut n_iov = 0;
        let mut dst_len = 0;
        for d in dsts.iter().filter(|d| d.len() > 0).take(iov.len() - 1) {
            iov[n_iov] = libc::iovec {
                iov_base: d.as_ptr().cast(),
                iov_len: d.len(),
            };
            n_iov += 1;
            dst_len += d.len();
        }
        let spare = &mut self.buf[self.end..];
        iov[n_iov] = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: spare.len(),
        };
        n_iov += 1;
        // The iovecs cover the ranges (writable for their lives: contract of RawRange::new)
        // and the stage's spare bytes, exclusively borrowed (`spare`) until the call returns.
        let n = rawio::recvmsg_now(fd, &mut iov[..n_iov])?;
        let into_dst = n.min(dst_len);
        let staged = n - into_dst;
        self.end += staged;
        Ok(Got { into_dst, staged })
    }

    /// Allocates the buffer on first use and moves unconsumed bytes to its front, so that
    /// the free room after them is as large as it can be.
    fn make_room(&mut self) {
        if self.buf.is_empty() {
            self.buf = vec![0; STAGE_BYTES];
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }
}

/// Ranges one receive scatters into at most (besides the stage).
pub(crate) const MAX_SCATTER: usize = 64;

/// Receives into `dst` (when given) and then `stage`: at once if bytes are there, else
/// spinning on nonblocking receives for up to `quiet` (in slices between which the task
/// yields; the socket out of the reactor meanwhile), else waiting on read readiness
/// (registered for the wait). Returns what the first receive that found bytes (or the peer's
/// close) brought.
pub(crate) async fn recv_staged(
    s: &mut Sock,
    stage: &mut Stage,
    dst: Option<RawRange<'_>>,
    quiet: Duration,
) -> io::Result<Got> {
    if let Some(g) = recv_spinning(s, stage, dst, quiet).await? {
        return Ok(g);
    }
    recv_parked(s, stage, dst).await
}

/// The spinning half of [`recv_staged`]: tries at once, then spins for up to `quiet` (the
/// socket out of the reactor); `None` when nothing came meanwhile.
pub(crate) async fn recv_spinning(
    s: &mut Sock,
    stage: &mut Stage,
    dst: Option<RawRange<'_>>,
    quiet: Duration,
) -> io::Result<Option<Got>> {
    let fd = s.fd();
    if !quiet.is_zero() {
        s.unwatch();
    }
    let until = Instant::now() + quiet;
    let mut slice = Instant::now() + SPIN_SLICE;
    loop {
        match stage.recv_now(fd, dst) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r.map(Some),
        }
        let now = Instant::now();
        if now >= until {
            return Ok(None);
        }
        if now >= slice {
            tokio::task::yield_now().await;
            slice = Instant::now() + SPIN_SLICE;
        }
        std::hint::spin_loop();
    }
}

/// The parked half of [`recv_staged`]: waits on read readiness (the socket registered for the
/// wait) and receives what came.
pub(crate) async fn recv_parked(
    s: &mut Sock,
    stage: &mut Stage,
    dst: Option<RawRange<'_>>,
) -> io::Result<Got> {
    let fd = s.fd();
    loop {
        // Honours the cooperative budget (as tokio's reads do) before touching the socket.
        let w = s.watch()?;
        let mut g = w.readable().await?;
        match g.try_io(|_| stage.recv_now(fd, dst)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// Fills `dst` exactly: first from what `stage` holds, then from the socket through the stage
/// ([`recv_staged`], which spins up to `quiet` after each arrival before it parks). Bytes that
/// follow `dst` stay staged.
///
/// Cancel-safe in `read_exact`'s weak sense: when dropped, an unknown prefix of `dst` is in.
///
/// # Errors
/// [`io::ErrorKind::UnexpectedEof`] when the peer closes before `dst` is full; socket errors
/// as they come.
pub(crate) async fn recv_exact(
    s: &mut Sock,
    stage: &mut Stage,
    dst: RawRange<'_>,
    quiet: Duration,
) -> io::Result<()> {
    let mut off = stage.take_into(dst);
    while off < dst.len() {
        let g = recv_staged(s, stage, Some(dst.from(off)), quiet).await?;
        if g.is_eof() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a payload",
            ));
        }
        off += g.into_dst;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    fn range(v: &mut [u8]) -> RawRange<'_> {
        // SAFETY: the slice's memory lives for the borrow, which the range's lifetime carries;
        // the exclusive borrow keeps every other reference away while the range is used.
        unsafe { RawRange::new(v.as_mut_ptr(), v.len()) }
    }

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// Receives until `want` bytes are staged (or `dst` and the stage got them together).
    fn recv_until(s: &mut Stage, fd: RawFd, mut dst: Option<RawRange<'_>>, want: usize) {
        let mut got = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got < want {
            match s.recv_now(fd, dst) {
                Ok(g) => {
                    assert!(!g.is_eof(), "peer closed early");
                    got += g.into_dst + g.staged;
                    dst = dst.map(|d| d.from(g.into_dst));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "nothing came");
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn payload_then_following_frames_in_one_receive() {
        let (mut a, b) = pair();
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let next = b"next-frame-header";
        a.write_all(&payload).unwrap();
        a.write_all(next).unwrap();
        let mut dst = vec![0u8; payload.len()];
        let mut s = Stage::default();
        recv_until(
            &mut s,
            b.as_raw_fd(),
            Some(range(&mut dst)),
            payload.len() + next.len(),
        );
        assert_eq!(dst, payload);
        assert_eq!(s.bytes(), next);
    }

    #[test]
    fn staged_bytes_go_out_in_order_and_room_is_reclaimed() {
        let (mut a, b) = pair();
        let data: Vec<u8> = (0..(STAGE_BYTES + 5000) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        a.write_all(&data).unwrap();
        let mut s = Stage::default();
        recv_until(&mut s, b.as_raw_fd(), None, 100);
        let mut out = Vec::new();
        let mut chunk = vec![0u8; 777];
        while out.len() < data.len() {
            if s.is_empty() {
                recv_until(&mut s, b.as_raw_fd(), None, 1);
            }
            let n = s.take_into(range(&mut chunk));
            out.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(out, data);
        assert!(s.is_empty());
    }

    #[test]
    fn a_closed_peer_reads_as_eof() {
        let (a, b) = pair();
        drop(a);
        let mut s = Stage::default();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match s.recv_now(b.as_raw_fd(), None) {
                Ok(g) => {
                    assert!(g.is_eof());
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline);
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}
