//! io_uring for the sends of one TCP data connection of an initiator (`hixl.TcpIo=uring`).
//!
//! The connection's state machines ([`super::initiator`]) stay what they are; only the way a
//! byte moves changes. Where the epoll path makes a nonblocking `sendmsg`/`recv`, this one
//! queues a request on the connection's ring and reports "would block" until its completion
//! is reaped; the state machine then asks again (its state is unchanged, so it asks for the
//! same bytes) and gets the result. One send is in flight at a time: a gather of up to 64
//! requests (headers, and WRITE payloads straight from registered memory) goes out as one
//! `IORING_OP_SENDMSG` with `MSG_WAITALL`, so the kernel finishes a short send itself (one
//! completion per gather, where `sendmsg` would return part-way and need another round from
//! the sending task). A send with room in the socket buffer completes inside the
//! `io_uring_enter` that submits it; one that waits for room completes later, reaped from the
//! shared completion queue without a syscall by a spinning waiter, or by the connection's
//! sending task when tokio reports the ring readable.
//!
//! Answers are received as on the epoll path (nonblocking `recv` on readiness): an io_uring
//! receive on a socket completes through task work signalled to the thread that submitted
//! it, which on a 2-vCPU VM made a 4 KiB round trip 60 µs instead of 20 (measured, see
//! `docs/benchmarks.md`).
//!
//! Memory the kernel touches while a send is in flight (the message header, the iovecs and
//! the request headers) is one allocation that Rust never forms a reference over; payloads
//! are reached only through [`RawRange`](crate::rawio::RawRange)s. Before a part whose memory a send may still read
//! is completed or dropped, the ring is quiesced: the send in flight is cancelled and its
//! completion awaited ([`Uring::quiesce`]).
//!
//! A send that waits for room completes through task work of the thread that submitted it:
//! that thread may see `EINTR` from a blocking call meanwhile, which tokio's reactor and the
//! standard library retry.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::addr_of_mut;
use std::sync::Mutex;

use hixl_core::wire::STRIDED_REQ_FRAME;
use io_uring::{opcode, types, IoUring};

use super::gather::GATHER_PARTS;
pub(crate) use crate::rawio::Piece;
use crate::sync::lock;

/// Iovecs of one send at most: a header and a payload per gathered request.
const MAX_IOV: usize = 2 * GATHER_PARTS;
/// Header bytes of one send at most.
const HEAD_BYTES: usize = GATHER_PARTS * STRIDED_REQ_FRAME;
/// Ring size: one request in flight, room to spare.
const ENTRIES: u32 = 4;

const SEND: u64 = 1;

/// The connection's send.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Idle,
    /// Submitted or queued.
    Flight,
    /// Completed with `res` (bytes, or a negated errno), not yet taken.
    Done {
        res: i32,
    },
}

/// The memory the kernel reads or writes while a request is in flight.
#[repr(C)]
struct Kernel {
    msg: libc::msghdr,
    iov: [libc::iovec; MAX_IOV],
    head: [u8; HEAD_BYTES],
}

/// Where a ring stands ([`Uring::status`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    /// A request is queued or in flight.
    pub(crate) in_flight: bool,
    /// A completion waits to be taken by a pump.
    pub(crate) results: bool,
}

/// A data connection's ring.
pub(crate) struct Uring {
    fd: RawFd,
    inner: Mutex<Ring>,
}

struct Ring {
    ring: IoUring,
    send: Slot,
    /// Requests pushed to the submission queue and not yet submitted.
    queued: bool,
    /// Set by [`Uring::quiesce`]: nothing is submitted any more.
    closed: bool,
    /// Owned (from `Box::into_raw`), freed in `drop` once nothing is in flight.
    mem: *mut Kernel,
}

// SAFETY: `mem` is owned by the ring and only accessed under the `Uring`'s mutex (or in drop);
// the kernel's accesses are ordered by submission and completion.
unsafe impl Send for Ring {}

impl std::fmt::Debug for Uring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uring").field("fd", &self.fd).finish()
    }
}

impl AsRawFd for Uring {
    /// The ring's descriptor: readable while completions wait to be reaped.
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

/// Whether this kernel gives io_uring to this process: `Err` with the reason (a seccomp
/// filter, `kernel.io_uring_disabled`, an old kernel) if not.
pub(crate) fn probe() -> io::Result<()> {
    Uring::new().map(drop)
}

impl Uring {
    /// A ring for one connection.
    pub(crate) fn new() -> io::Result<Uring> {
        let ring = IoUring::builder().build(ENTRIES)?;
        let fd = ring.as_raw_fd();
        // SAFETY: every field of `Kernel` is plain data for which all zeros are valid (null
        // pointers, zero lengths).
        let mem = Box::into_raw(Box::new(unsafe { std::mem::zeroed::<Kernel>() }));
        Ok(Uring {
            fd,
            inner: Mutex::new(Ring {
                ring,
                send: Slot::Idle,
                queued: false,
                closed: false,
                mem,
            }),
        })
    }

    /// The send of `pieces` on socket `fd`, as a nonblocking `sendmsg` would report it: the
    /// bytes sent once its completion is in, [`io::ErrorKind::WouldBlock`] until then (the
    /// first call queues the request; call [`Uring::flush`] to submit it). The caller asks
    /// again with the same pieces, and keeps every payload valid until the send completes or
    /// the ring is quiesced.
    pub(crate) fn send(&self, fd: RawFd, pieces: &[Piece<'_>]) -> io::Result<usize> {
        let mut r = lock(&self.inner);
        match r.send {
            Slot::Flight => return Err(io::ErrorKind::WouldBlock.into()),
            Slot::Done { res } => {
                r.send = Slot::Idle;
                if let Some(settled) = r.settled(res) {
                    return settled;
                }
            }
            Slot::Idle => {}
        }
        if r.closed {
            return Err(closed());
        }
        let mem = r.mem;
        let (mut n, mut hoff, mut total) = (0usize, 0usize, 0usize);
        for p in pieces {
            if n == MAX_IOV {
                break;
            }
            let (base, len) = match p {
                Piece::Head(b) => {
                    if hoff + b.len() > HEAD_BYTES {
                        break;
                    }
                    // SAFETY: `mem` is live; no request reads `head` (the send slot is idle)
                    // and no reference into it exists; the bounds were checked above.
                    let dst = unsafe { addr_of_mut!((*mem).head).cast::<u8>().add(hoff) };
                    // SAFETY: `b` is a live buffer of `b.len()` bytes, `dst` has room for them
                    // and they do not overlap (one is the ring's own memory).
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len()) };
                    hoff += b.len();
                    (dst, b.len())
                }
                Piece::Body(range) => (range.as_ptr(), range.len()),
            };
            // SAFETY: `n < MAX_IOV`, inside `iov`; nothing reads it now (send slot idle).
            unsafe {
                addr_of_mut!((*mem).iov)
                    .cast::<libc::iovec>()
                    .add(n)
                    .write(libc::iovec {
                        iov_base: base.cast(),
                        iov_len: len,
                    });
            }
            n += 1;
            total += len;
        }
        if total == 0 {
            return Ok(0);
        }
        // SAFETY: as above: the header is the ring's, unread while the send slot is idle.
        let msg = unsafe {
            let msg = addr_of_mut!((*mem).msg);
            addr_of_mut!((*msg).msg_iov).write(addr_of_mut!((*mem).iov).cast());
            addr_of_mut!((*msg).msg_iovlen).write(n as _);
            msg
        };
        let sqe = opcode::SendMsg::new(types::Fd(fd), msg)
            .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
            .build()
            .user_data(SEND);
        // SAFETY: the message header, iovecs and headers are the ring's memory, freed only
        // after the ring is quiet; the payloads stay valid until the send completes or the
        // ring is quiesced (the caller's contract).
        unsafe { r.push(&sqe) }?;
        r.send = Slot::Flight;
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// Submits what was queued, then reaps what has completed. Returns whether a completion
    /// waits to be taken.
    pub(crate) fn flush(&self) -> io::Result<bool> {
        let mut r = lock(&self.inner);
        r.submit()?;
        r.reap();
        Ok(r.has_results())
    }

    /// Where the ring stands now (one look under its lock).
    pub(crate) fn status(&self) -> Status {
        let r = lock(&self.inner);
        Status {
            in_flight: r.queued || r.flying(),
            results: r.has_results(),
        }
    }

    /// Cancels every request in flight and waits for their completions, so that the kernel
    /// touches no memory of any part from here on; nothing is submitted afterwards (every
    /// later request fails as "not connected"). The caller has shut the socket down, which
    /// ends the requests quickly by itself. Idempotent.
    pub(crate) fn quiesce(&self) {
        lock(&self.inner).quiesce();
    }
}

impl Ring {
    /// The outcome of a completion's `res`: `None` when the request should simply be made
    /// again (cancelled by the exit of the thread that submitted it, or interrupted).
    fn settled(&self, res: i32) -> Option<io::Result<usize>> {
        if res >= 0 {
            return Some(Ok(res as usize));
        }
        let errno = -res;
        if self.closed {
            return Some(Err(closed()));
        }
        if errno == libc::ECANCELED || errno == libc::EINTR || errno == libc::EAGAIN {
            return None;
        }
        Some(Err(io::Error::from_raw_os_error(errno)))
    }

    /// Pushes `sqe`, submitting first if the queue is full.
    ///
    /// # Safety
    /// Every buffer `sqe` names stays valid until its completion is reaped.
    unsafe fn push(&mut self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        // SAFETY: the caller's contract.
        if unsafe { self.ring.submission().push(sqe) }.is_err() {
            self.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(sqe) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        self.queued = true;
        Ok(())
    }

    fn submit(&mut self) -> io::Result<()> {
        if !self.queued {
            return Ok(());
        }
        loop {
            match self.ring.submit() {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        self.queued = false;
        Ok(())
    }

    fn reap(&mut self) {
        let Ring { ring, send, .. } = self;
        for cqe in ring.completion() {
            if cqe.user_data() == SEND && matches!(send, Slot::Flight) {
                *send = Slot::Done { res: cqe.result() };
            }
        }
    }

    fn flying(&self) -> bool {
        matches!(self.send, Slot::Flight)
    }

    fn has_results(&self) -> bool {
        matches!(self.send, Slot::Done { .. })
    }

    fn quiesce(&mut self) {
        self.closed = true;
        if self.submit().is_err() {
            // The kernel reads the submission queue only in `io_uring_enter`, which refused
            // it: the queued send never started and touches nothing. No enter follows (a
            // cancel does not submit), so it never will.
            self.queued = false;
            self.send = Slot::Idle;
        }
        self.reap();
        let mut waited = 0u32;
        while self.flying() {
            let cancel = types::CancelBuilder::any();
            let _ = self
                .ring
                .submitter()
                .register_sync_cancel(Some(types::Timespec::new().sec(1)), cancel);
            self.reap();
            if !self.flying() {
                break;
            }
            let _ = self.ring.submit_and_wait(1);
            self.reap();
            waited += 1;
            if waited % 1000 == 0 {
                tracing::error!("io_uring requests still in flight after cancellation; waiting");
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.quiesce();
        // SAFETY: `mem` came from `Box::into_raw` and nothing is in flight any more, so the
        // kernel no longer touches it; it is freed once.
        drop(unsafe { Box::from_raw(self.mem) });
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "data connection closed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rawio::RawRange;
    use hixl_core::wire::DATA_REQ_FRAME;
    use std::io::Read;
    use std::sync::Arc;

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// A ring, or `None` (the test says why and is skipped) where the kernel refuses io_uring;
    /// `HIXL_REQUIRE_URING=1` makes that a failure.
    fn ring() -> Option<Uring> {
        match Uring::new() {
            Ok(u) => Some(u),
            Err(e) if std::env::var_os("HIXL_REQUIRE_URING").is_some() => {
                panic!("io_uring refused ({e}) and HIXL_REQUIRE_URING is set")
            }
            Err(e) => {
                eprintln!("io_uring refused here ({e}); skipped");
                None
            }
        }
    }

    /// Sends until the send completes, flushing between asks.
    fn send_all(u: &Uring, fd: RawFd, pieces: &[Piece<'_>]) -> io::Result<usize> {
        loop {
            match u.send(fd, pieces) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    u.flush()?;
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// A request header and a payload go out as one send, byte for byte.
    #[test]
    fn a_gather_goes_out_whole() {
        let Some(u) = ring() else {
            return;
        };
        let (a, mut b) = pair();
        let head = [7u8; DATA_REQ_FRAME];
        let mut body = vec![9u8; 100_000];
        // SAFETY: `body` outlives the send, which completes below.
        let range = unsafe { RawRange::new(body.as_mut_ptr(), body.len()) };
        let pieces = [Piece::Head(&head), Piece::Body(range)];
        let sent = send_all(&u, a.as_raw_fd(), &pieces).unwrap();
        assert_eq!(sent, DATA_REQ_FRAME + body.len());
        let mut got = vec![0u8; sent];
        b.read_exact(&mut got).unwrap();
        assert!(got[..DATA_REQ_FRAME].iter().all(|&x| x == 7));
        assert!(got[DATA_REQ_FRAME..].iter().all(|&x| x == 9));
    }

    /// A send that waits for room (the peer does not read) is ended by quiesce: once it
    /// returns nothing is in flight, and later sends fail as not connected.
    #[test]
    fn quiesce_ends_a_send_in_flight() {
        let Some(u) = ring() else {
            return;
        };
        let (a, _b) = pair();
        let mut body = vec![1u8; 64 << 20];
        // SAFETY: `body` outlives the send, which quiesce ends below.
        let range = unsafe { RawRange::new(body.as_mut_ptr(), body.len()) };
        let fd = a.as_raw_fd();
        let pieces = [Piece::Body(range)];
        assert_eq!(
            u.send(fd, &pieces).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        u.flush().unwrap();
        assert!(
            u.status().in_flight,
            "64 MiB to a peer that does not read cannot be sent yet"
        );
        a.shutdown(std::net::Shutdown::Both).unwrap();
        u.quiesce();
        assert!(!u.status().in_flight);
        // The ended send reports what it did, or the close; the next one fails.
        let _ = u.send(fd, &pieces);
        assert_eq!(
            u.send(fd, &pieces).unwrap_err().kind(),
            io::ErrorKind::NotConnected
        );
        drop(body);
    }

    struct Fd(RawFd);
    impl AsRawFd for Fd {
        fn as_raw_fd(&self) -> RawFd {
            self.0
        }
    }

    /// A task waiting on the ring's readiness is woken by the completion of a send another
    /// thread submitted (and that thread then sleeps).
    #[test]
    fn a_completion_wakes_a_task_waiting_on_the_ring() {
        let Some(u) = ring() else {
            return;
        };
        let u = Arc::new(u);
        let (a, mut b) = pair();
        let fd = a.as_raw_fd();
        let len = 32 << 20;
        let body = Arc::new(Mutex::new(vec![3u8; len]));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (u2, body2) = (u.clone(), body.clone());
        let submitter = std::thread::spawn(move || {
            let ptr = lock(&body2).as_mut_ptr();
            // SAFETY: the buffer lives in `body` until the test ends, after the send.
            let range = unsafe { RawRange::new(ptr, len) };
            assert!(u2.send(fd, &[Piece::Body(range)]).is_err());
            u2.flush().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        let got = rt.block_on(async {
            // SAFETY: the ring's descriptor stays open while `u` (held by the task) lives.
            let afd = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(
                    Fd(u.as_raw_fd()),
                    tokio::io::Interest::READABLE,
                )
            }
            .unwrap();
            let u3 = u.clone();
            let w = tokio::spawn(async move {
                loop {
                    let mut g = afd.readable().await.unwrap();
                    if u3.flush().unwrap() {
                        return true;
                    }
                    g.clear_ready();
                }
            });
            let reader = std::thread::spawn(move || {
                let mut got = vec![0u8; len];
                b.read_exact(&mut got).unwrap();
                got.iter().all(|&x| x == 3)
            });
            let r = tokio::time::timeout(std::time::Duration::from_secs(5), w).await;
            (r, reader.join().unwrap())
        });
        submitter.join().unwrap();
        assert!(matches!(got.0, Ok(Ok(true))), "{got:?}");
        assert!(got.1);
    }
}
