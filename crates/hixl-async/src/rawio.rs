//! Raw-range I/O: the one place where bytes move between registered memory and a socket or a
//! caller's buffer.
//!
//! Registered memory is shared. While we read or write it, a peer's requests (through this
//! engine's TCP target or the fabric copy engines), the RDMA device and the user may touch the
//! same bytes. A `&[u8]` or `&mut [u8]` over it would promise the compiler that nobody writes
//! (or, for `&mut`, reads) those bytes while the reference lives, a promise nobody here can
//! keep. So no reference is ever formed over a [`RawRange`]: it is an address and a length,
//! and bytes move through it only by `recv(2)`/`sendmsg(2)` (the kernel copies) or
//! `ptr::copy_nonoverlapping` between raw pointers. Concurrent access by others then yields
//! unspecified bytes (the caller's protocol, completion or notify, orders it), never a broken
//! aliasing assumption.
//!
//! The unsafety is at construction ([`RawRange::new`]); every operation on a range is safe.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// `len` bytes at `ptr` in memory that stays valid for `'a` and that others may access
/// concurrently. Never dereferenced into a reference.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawRange<'a> {
    ptr: *mut u8,
    len: usize,
    _keep: PhantomData<&'a ()>,
}

// SAFETY: a RawRange is an address range; every access through it is a syscall or a raw copy,
// valid from any thread for 'a by the contract of `new`. No reference is formed, so sharing or
// moving the range across threads creates no aliasing claim.
unsafe impl Send for RawRange<'_> {}
// SAFETY: as above: `&RawRange` only gives the same raw accesses.
unsafe impl Sync for RawRange<'_> {}

impl<'a> RawRange<'a> {
    /// A range over `ptr..ptr + len`.
    ///
    /// # Safety
    /// For all of `'a` (tie `'a` to whatever keeps the memory alive, such as a region lease),
    /// the bytes `ptr..ptr + len` must be allocated, mapped and valid for reads and writes, and
    /// `len` at most `isize::MAX`. Others (peers, copy engines, the device, the user through
    /// raw pointers) may read and write them concurrently: that makes the bytes moved
    /// unspecified, not the program undefined, because no reference to them is ever formed
    /// here. The caller must not hold a Rust reference to them while the range is in use.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> RawRange<'a> {
        RawRange {
            ptr,
            len,
            _keep: PhantomData,
        }
    }

    /// The empty range (for a send with nothing but a header).
    #[cfg(test)]
    pub(crate) fn empty() -> RawRange<'static> {
        RawRange {
            ptr: std::ptr::NonNull::dangling().as_ptr(),
            len: 0,
            _keep: PhantomData,
        }
    }

    /// The address of byte `off` (`off <= len`); pointer arithmetic only.
    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.len);
        self.ptr.wrapping_add(off)
    }

    /// Copies the whole range into `out`, which must be exactly as long.
    pub(crate) fn copy_out(&self, out: &mut [u8]) {
        assert_eq!(
            out.len(),
            self.len,
            "copy_out into a buffer of another length"
        );
        // SAFETY: validity: the range is readable for 'a (contract of `new`) and `out` is a
        // distinct, exclusively borrowed buffer of the same length (it cannot overlap: the
        // caller holds no reference into the range). Aliasing: the source is read through the
        // raw pointer only; no reference to it exists.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), self.len) }
    }

    /// Copies `data`, which must be exactly as long, into the range.
    pub(crate) fn copy_in(&self, data: &[u8]) {
        assert_eq!(
            data.len(),
            self.len,
            "copy_in from a buffer of another length"
        );
        // SAFETY: validity: the range is writable for 'a (contract of `new`) and `data` cannot
        // overlap it (no reference into the range exists). Aliasing: the destination is written
        // through the raw pointer only.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr, self.len) }
    }

    /// Copies `src`, which must be exactly as long, into the range; the two may overlap (a
    /// copy within one region moves as `memmove` does).
    pub(crate) fn copy_from(&self, src: &RawRange<'_>) {
        assert_eq!(src.len, self.len, "copy_from a range of another length");
        // SAFETY: validity: both ranges are valid for reads and writes for their lifetimes
        // (contract of `new`), which outlive this call. `ptr::copy` allows overlap. Aliasing:
        // both are accessed through raw pointers only; no reference to either is formed.
        unsafe { std::ptr::copy(src.ptr, self.ptr, self.len) }
    }
}

impl<'a> RawRange<'a> {
    /// The range from byte `off` on (`off <= len`), for a transfer resumed part-way.
    pub(crate) fn from(&self, off: usize) -> RawRange<'a> {
        let off = off.min(self.len);
        RawRange {
            ptr: self.at(off),
            len: self.len - off,
            _keep: PhantomData,
        }
    }

    /// The first `n` bytes of the range (`n <= len`).
    pub(crate) fn to(&self, n: usize) -> RawRange<'a> {
        RawRange {
            ptr: self.ptr,
            len: n.min(self.len),
            _keep: PhantomData,
        }
    }

    /// The range's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The range's first byte, for an asynchronous request (io_uring) that the caller keeps
    /// the range valid for until it completes. Taking the address touches nothing.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// One piece of a gathered send: bytes of our own (a header; io_uring copies them into the
/// ring's memory) or a range of registered memory (sent from where it is).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Piece<'a> {
    Head(&'a [u8]),
    Body(RawRange<'a>),
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Head(h) => h.len(),
            Piece::Body(r) => r.len,
        }
    }

    /// An iovec over the piece from byte `skip` on. Building it touches nothing.
    fn iovec_from(&self, skip: usize) -> libc::iovec {
        match self {
            Piece::Head(h) => libc::iovec {
                // The kernel only reads through an iovec given to sendmsg.
                iov_base: h[skip.min(h.len())..].as_ptr().cast_mut().cast(),
                iov_len: h.len().saturating_sub(skip),
            },
            Piece::Body(r) => {
                let r = r.from(skip);
                libc::iovec {
                    iov_base: r.ptr.cast(),
                    iov_len: r.len,
                }
            }
        }
    }
}

/// Most iovecs one `sendmsg` of pieces carries: a header and a payload for each of 64
/// requests or answers, and a trailing header.
const SEND_IOV: usize = 130;

/// The iovecs of `pieces` from byte `skip` of the first on, empty ones left out, as many as
/// `iov` holds: how many were filled, and their bytes. Building them touches nothing.
fn fill_iovecs(pieces: &[Piece<'_>], skip: usize, iov: &mut [libc::iovec]) -> (usize, usize) {
    let (mut n, mut bytes) = (0, 0);
    for (i, p) in pieces.iter().enumerate() {
        if n == iov.len() {
            break;
        }
        let v = p.iovec_from(if i == 0 { skip } else { 0 });
        if v.iov_len == 0 {
            continue;
        }
        bytes += v.iov_len;
        iov[n] = v;
        n += 1;
    }
    (n, bytes)
}

/// An empty iovec, to fill arrays of them with.
pub(crate) const NO_IOV: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// One nonblocking [`sendmsg_now`] of `pieces` (up to [`SEND_IOV`] of them).
pub(crate) fn sendmsg_pieces_now(fd: RawFd, pieces: &[Piece<'_>]) -> io::Result<usize> {
    let mut iov = [NO_IOV; SEND_IOV];
    let (n, _) = fill_iovecs(pieces, 0, &mut iov);
    sendmsg_now(fd, &mut iov[..n])
}

/// One nonblocking `sendmsg(2)` of `iov` (`MSG_DONTWAIT | MSG_NOSIGNAL`), `EINTR` retried.
/// Returns the bytes the kernel took; [`io::ErrorKind::WouldBlock`] when the buffer is full.
///
/// The caller keeps every iovec's bytes readable for the call (iovecs built from pieces
/// are: live borrowed headers, and [`RawRange`]s valid for their life).
fn sendmsg_now(fd: RawFd, iov: &mut [libc::iovec]) -> io::Result<usize> {
    if iov.is_empty() {
        return Ok(0);
    }
    loop {
        // SAFETY: an all-zero msghdr is valid (null name and control, no iovecs); the iovecs
        // are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: validity: every iovec covers bytes readable for the call (the caller's
        // contract: live buffers, or RawRanges valid for their life); `msg` and `iov` outlive
        // the call. Aliasing: the kernel only reads the iovecs' bytes; no Rust reference to a
        // range's memory exists.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One nonblocking `recvmsg(2)` into `iov` (`MSG_DONTWAIT`), `EINTR` retried. Returns the
/// bytes received, filling the iovecs in order (0: the peer closed);
/// [`io::ErrorKind::WouldBlock`] when nothing is there yet.
///
/// The caller keeps every iovec's bytes writable for the call, with no Rust reference to them
/// but the exclusive borrow of a buffer of its own (iovecs built from [`RawRange`]s, valid for
/// their life, or from such a buffer).
pub(crate) fn recvmsg_now(fd: RawFd, iov: &mut [libc::iovec]) -> io::Result<usize> {
    loop {
        // SAFETY: an all-zero msghdr is valid (null name and control, no iovecs); the iovecs
        // are set below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: validity: every iovec covers bytes writable for the call (the caller's
        // contract); `msg` and `iov` outlive it. Aliasing: the kernel writes the bytes; no
        // Rust reference to a range's memory exists, and a buffer of the caller's is
        // exclusively borrowed by it.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Longest a task spins without yielding to its runtime: spinning is sliced so that other
/// tasks of the worker thread (and a current-thread runtime's only one) still run.
pub(crate) const SPIN_SLICE: std::time::Duration = std::time::Duration::from_micros(100);

/// The local bytes of one part of an op, as a transport holds them from post until the part
/// completes: an address and a length, with no lifetime and no lease of its own.
///
/// **The invariant, relied on here only.** `Link::submit` checks that every descriptor's
/// local range lies inside one registered region, and posts the op in the op table with a
/// lease on that region in the op's keep-alive (see the `keep` module). The op table hands an op's
/// keep-alive back only once the op's last part is done (completed or failed through the
/// engine's `Completions`), whatever became of its `Transfer`. So while a part has not been
/// completed, the region it lies in stays registered: an owned buffer is not freed, and raw
/// memory stays valid by `register_raw`'s contract. The copy engines' and the verbs queue
/// pair's unsafe contracts (ranges valid until the copy ran, until the request's completion is
/// drained) are met the same way. The op table itself outlives every thread that may touch a
/// part: tasks only touch memory while polled (they hold the op table through their
/// `OpsHandle`), and the fabric backend keeps the op table until its copy streams are joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartRange {
    addr: u64,
    len: u64,
    /// Bytes per piece and the distance between pieces (a contiguous range: one piece of
    /// `len`).
    piece: u64,
    stride: u64,
}

impl PartRange {
    /// `len` bytes at `addr`, already checked to lie in a registered region (plain numbers:
    /// nothing is touched until [`PartRange::raw_at`]).
    pub(crate) fn new(addr: u64, len: u64) -> PartRange {
        PartRange {
            addr,
            len,
            piece: len.max(1),
            stride: len.max(1),
        }
    }

    /// `count` pieces of `piece` bytes, `stride` apart from `addr` (a strided part), the span
    /// already checked to lie in one registered region and `stride ≥ piece`.
    pub(crate) fn strided(addr: u64, piece: u64, stride: u64, count: u64) -> PartRange {
        if stride == piece {
            // Back to back: one contiguous range.
            return PartRange::new(addr, piece * count);
        }
        PartRange {
            addr,
            len: piece * count,
            piece: piece.max(1),
            stride,
        }
    }

    /// Bytes of the part.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// From the part's byte `off` (`< len`) to the end of the piece holding it, as a range
    /// for raw I/O (the whole rest of a contiguous part).
    ///
    /// # Safety
    /// The part this range belongs to has not been completed, and is not completed (by
    /// anyone) while the returned range is in use: then its op's keep-alive, held by the op
    /// table, keeps the memory valid (see the type's docs).
    pub(crate) unsafe fn raw_at(&self, off: u64) -> RawRange<'_> {
        let off = off.min(self.len);
        let (i, within) = (off / self.piece, off % self.piece);
        let at = self.addr + i * self.stride + within;
        let n = (self.piece - within).min(self.len - off);
        // SAFETY: by the caller's contract the part is outstanding for the range's whole use,
        // so the op table holds its op's lease on the region the part's span lies in (checked
        // by submit, pieces included); the region's memory is allocated, mapped and valid.
        // Others may touch it concurrently: a RawRange never forms a reference over it.
        unsafe { RawRange::new(at as *mut u8, n as usize) }
    }
}

/// A nonblocking socket that one task drives, registered with tokio's reactor only while
/// that task waits on it: while the task spins on nonblocking syscalls, the peer's bytes wake
/// no parked worker thread (a registered socket's every arrival wakes the thread blocked in
/// the reactor's `epoll_wait`, which on a small machine preempts a spinning one).
#[derive(Debug)]
pub(crate) struct Sock {
    s: std::net::TcpStream,
    watch: Option<AsyncFd<Watched>>,
}

/// A socket's descriptor as tokio's reactor watches it (the socket itself is owned elsewhere
/// and outlives the registration).
#[derive(Debug)]
pub(crate) struct Watched(pub(crate) RawFd);

impl AsRawFd for Watched {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

impl Sock {
    /// Takes a tokio stream out of the reactor (it is registered again only to wait).
    pub(crate) fn new(s: TcpStream) -> io::Result<Sock> {
        Ok(Sock {
            s: s.into_std()?,
            watch: None,
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.s.as_raw_fd()
    }

    /// Leaves the reactor, for a spin: nothing the peer sends wakes another thread meanwhile.
    pub(crate) fn unwatch(&mut self) {
        self.watch = None;
    }

    /// The registration to wait on, made now if the socket is not registered. A socket
    /// registered while ready reports that readiness at once (epoll reports the state at
    /// registration), so nothing that came before is missed.
    pub(crate) fn watch(&mut self) -> io::Result<&AsyncFd<Watched>> {
        let w = match self.watch.take() {
            Some(w) => w,
            // SAFETY: the descriptor is the socket `self.s` owns; the registration lives in
            // `self.watch`, which `Sock`'s `Drop` clears before the fields drop (and `s`
            // closes the descriptor), so it ends while the descriptor is open.
            None => unsafe {
                AsyncFd::register_with_interest(
                    Watched(self.s.as_raw_fd()),
                    Interest::READABLE | Interest::WRITABLE,
                )
            }?,
        };
        Ok(self.watch.insert(w))
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        // Deregistered before the socket closes its descriptor.
        self.watch = None;
    }
}

/// [`send_pieces`] of a header and one range (the tests' shorthand).
#[cfg(test)]
pub(crate) async fn send_all(s: &mut Sock, head: &[u8], src: RawRange<'_>) -> io::Result<()> {
    send_pieces(s, &[Piece::Head(head), Piece::Body(src)]).await
}

/// Sends every byte of `pieces` on `s`, in order, as few `sendmsg` calls as the socket allows
/// (up to 130 iovecs each: a batch of answers, headers and payloads, is one syscall), looping
/// on partial sends and waiting on write readiness (registered for the wait) only when the
/// socket takes nothing. `MSG_NOSIGNAL`: a peer that went away gives `EPIPE`, never `SIGPIPE`.
///
/// Not cancel-safe beyond `write_all`'s sense: when dropped, an unknown prefix has been sent.
///
/// # Errors
/// Socket errors (`EINTR` is retried); [`io::ErrorKind::WriteZero`] if the kernel accepts
/// nothing.
pub(crate) async fn send_pieces(s: &mut Sock, pieces: &[Piece<'_>]) -> io::Result<()> {
    let fd = s.fd();
    let total: usize = pieces.iter().map(Piece::len).sum();
    // The first piece not wholly sent, and the bytes of it already sent.
    let (mut at, mut skip) = (0usize, 0usize);
    let mut off = 0;
    while off < total {
        while at < pieces.len() && skip >= pieces[at].len() {
            skip -= pieces[at].len();
            at += 1;
        }
        let rest = &pieces[at..];
        let sent = 'sent: {
            match send_from(fd, rest, skip) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => break 'sent r?,
            }
            loop {
                // Parked until the socket has room (registered for the wait).
                let w = s.watch()?;
                let mut g = w.writable().await?;
                match g.try_io(|_| send_from(fd, rest, skip)) {
                    Ok(r) => break 'sent r?,
                    Err(_would_block) => continue,
                }
            }
        };
        if sent == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        off += sent;
        skip += sent;
    }
    Ok(())
}

/// One nonblocking `sendmsg` of `pieces` from byte `skip` of the first on.
fn send_from(fd: RawFd, pieces: &[Piece<'_>], skip: usize) -> io::Result<usize> {
    let mut iov = [NO_IOV; SEND_IOV];
    let (n, _) = fill_iovecs(pieces, skip, &mut iov);
    sendmsg_now(fd, &mut iov[..n])
}

#[cfg(test)]
#[path = "rawio_tests.rs"]
mod tests;
