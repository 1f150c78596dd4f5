//! Passing file descriptors between processes over a Unix stream socket (`SCM_RIGHTS`).
//!
//! Both calls work on blocking and non-blocking sockets; on a non-blocking one they return
//! `WouldBlock` unchanged, so the async layer can call them inside tokio's `try_io`.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors Linux accepts in one `SCM_RIGHTS` message.
pub const SCM_MAX_FD: usize = 253;

/// A zeroed control buffer of at least `bytes` bytes, aligned for `cmsghdr`.
fn cmsg_buffer(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(size_of::<u64>())]
}

fn cmsg_space(nfds: usize) -> usize {
    // SAFETY: CMSG_SPACE is pure arithmetic; nfds ≤ SCM_MAX_FD keeps it far from overflow.
    unsafe { libc::CMSG_SPACE((nfds * size_of::<RawFd>()) as libc::c_uint) as usize }
}

/// Sends `payload` with `fds` attached to its first byte. Returns how many payload bytes were
/// sent, like `write`: on a blocking socket all of them; on a non-blocking one possibly fewer,
/// and the caller writes the rest with ordinary writes (the fds already went with the first
/// byte). `WouldBlock` is returned only when nothing was sent, in which case no fd was sent
/// either.
///
/// The receiver must read the bytes that carry fds with [`recv_fds`]: a plain `read` of them
/// makes the kernel discard (close) the fds.
///
/// # Errors
/// `InvalidInput` for an empty payload (fds need at least one byte to ride on) or more than
/// [`SCM_MAX_FD`] fds; otherwise the OS error of `sendmsg` (`EPIPE` if the peer is gone, never
/// a SIGPIPE).
pub fn send_fds(sock: impl AsFd, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    if payload.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "send_fds needs at least one payload byte to carry descriptors",
        ));
    }
    if fds.len() > SCM_MAX_FD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "send_fds: more than SCM_MAX_FD (253) descriptors in one message",
        ));
    }
    let sock = sock.as_fd().as_raw_fd();
    let mut control = cmsg_buffer(cmsg_space(fds.len()));
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_space(fds.len()) as _;
        // SAFETY: msg_control points at a live, aligned, zeroed buffer of msg_controllen bytes,
        // which CMSG_SPACE sized for one header plus fds.len() descriptors, so the first header
        // and its data area are in bounds.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len =
                libc::CMSG_LEN((fds.len() * size_of::<RawFd>()) as libc::c_uint) as _;
            let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    let first = loop {
        // SAFETY: msg points at the live iovec (into `payload`) and control buffer built above.
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // The fds are delivered; push the rest of the payload plainly while the socket takes it.
    let mut sent = first;
    while sent < payload.len() {
        let rest = &payload[sent..];
        // SAFETY: sends from a live slice of `payload`.
        let n = unsafe { libc::send(sock, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL) };
        if n > 0 {
            sent += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            // Report the partial write; the caller finishes it when the socket is writable.
            io::ErrorKind::WouldBlock => break,
            _ => return Err(e),
        }
    }
    Ok(sent)
}

/// Receives into `buf` with up to `max_fds` descriptors (opened close-on-exec). Returns the
/// number of bytes read (0 at end of stream) and the descriptors that came with them.
///
/// # Errors
/// `InvalidData` when the peer attached more than `max_fds` descriptors (`MSG_CTRUNC`): the
/// ones that did arrive are closed and the bytes read are lost, so the stream should be
/// treated as broken. Otherwise the OS error of `recvmsg`, including `WouldBlock` on a
/// non-blocking socket with nothing to read.
pub fn recv_fds(
    sock: impl AsFd,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let max_fds = max_fds.min(SCM_MAX_FD);
    let sock = sock.as_fd().as_raw_fd();
    let space = if max_fds == 0 { 0 } else { cmsg_space(max_fds) };
    let mut control = cmsg_buffer(space);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if space > 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
    }
    let n = loop {
        // SAFETY: msg points at the live iovec (into `buf`) and control buffer built above; the
        // kernel writes at most their lengths.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    if space > 0 {
        // SAFETY: the kernel set msg_controllen to the bytes of control data it wrote into our
        // buffer; CMSG_FIRSTHDR/NXTHDR stay within it, and each SCM_RIGHTS payload holds
        // (cmsg_len - CMSG_LEN(0)) / 4 descriptors that are now ours to own.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data_len =
                        ((*cmsg).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                    for i in 0..data_len / size_of::<RawFd>() {
                        fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        let got = fds.len();
        drop(fds);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "recv_fds: control data truncated (MSG_CTRUNC): this process is out of file \
                 descriptors (RLIMIT_NOFILE), or the peer sent more than {max_fds}; the {got} \
                 received were closed"
            ),
        ));
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    fn memfd() -> OwnedFd {
        // SAFETY: valid NUL-terminated name; result checked below.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn ino(fd: BorrowedFd<'_>) -> u64 {
        // SAFETY: all-zero is a valid stat; fstat writes into it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: live descriptor and live stat buffer.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        st.st_ino
    }

    #[test]
    fn fds_and_payload_arrive_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let (m1, m2) = (memfd(), memfd());
        let n = send_fds(&a, b"hello", &[m1.as_fd(), m2.as_fd()]).unwrap();
        assert_eq!(n, 5);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_fds(&b, &mut buf, 4).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 2);
        assert_eq!(ino(fds[0].as_fd()), ino(m1.as_fd()));
        assert_eq!(ino(fds[1].as_fd()), ino(m2.as_fd()));
        // SAFETY: plain syscall on a live descriptor.
        let flags = unsafe { libc::fcntl(fds[0].as_raw_fd(), libc::F_GETFD) };
        assert_ne!(
            flags & libc::FD_CLOEXEC,
            0,
            "received fds are close-on-exec"
        );
    }

    #[test]
    fn plain_bytes_and_eof() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"xyz").unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_fds(&b, &mut buf, 2).unwrap();
        assert_eq!((n, fds.len()), (3, 0));
        drop(a);
        let (n, fds) = recv_fds(&b, &mut buf, 2).unwrap();
        assert_eq!((n, fds.len()), (0, 0));
    }

    #[test]
    fn too_many_fds_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        let m = [memfd(), memfd(), memfd()];
        let fds: Vec<_> = m.iter().map(|f| f.as_fd()).collect();
        send_fds(&a, b"x", &fds).unwrap();
        let mut buf = [0u8; 4];
        let e = recv_fds(&b, &mut buf, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("MSG_CTRUNC"), "{e}");
        // With no room at all the fds are refused the same way.
        send_fds(&a, b"y", &fds[..1]).unwrap();
        let e = recv_fds(&b, &mut buf, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn bad_arguments_and_would_block() {
        let (a, b) = UnixStream::pair().unwrap();
        let m = memfd();
        let e = send_fds(&a, b"", &[m.as_fd()]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let many = vec![m.as_fd(); SCM_MAX_FD + 1];
        assert_eq!(
            send_fds(&a, b"x", &many).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        b.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4];
        let e = recv_fds(&b, &mut buf, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn non_blocking_sender_reports_partial_writes() {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let m = memfd();
        let big = vec![7u8; 8 << 20];
        // The socket buffer is far smaller than 8 MiB: the first call sends part, with the fd.
        let n = send_fds(&a, &big, &[m.as_fd()]).unwrap();
        assert!(n > 0 && n < big.len(), "sent {n}");
        // Full now: nothing more goes, and WouldBlock comes back unchanged.
        let e = send_fds(&a, &big, &[m.as_fd()]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let mut buf = vec![0u8; 1 << 16];
        let (got, fds) = recv_fds(&b, &mut buf, 1).unwrap();
        assert!(got > 0);
        assert_eq!(fds.len(), 1);
    }
}
