//! How a data connection moves its bytes: the one place it asks, epoll or io_uring.
//!
//! [`Io::Epoll`] sends with nonblocking `sendmsg` and waits on the socket's write readiness.
//! [`Io::Uring`] (`hixl.TcpIo=uring`) queues each gather as one io_uring send on a ring of the
//! connection's own ([`Uring`]), which a submitter, a spinner or the sending task submits and
//! reaps; the sending task waits on the ring's descriptor. Answers are received the same way
//! for both (nonblocking `recv` on read readiness, see [`Uring`] for why). The state machines
//! and the tasks are the same for both: they ask [`Io`] how to send, whether work is in
//! flight, what to wait on, and whom to hand over to.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;

use tokio::io::Interest;

use super::handoff::{self, Sending};
use super::Registration;
use crate::rawio;
use crate::tcp::uring::{Piece, Uring};

/// How a data connection moves its bytes, chosen when its socket is opened.
// One per connection, in place as the ring was before it: a box would put an indirection on
// every send.
#[allow(clippy::large_enum_variant)]
pub(super) enum Io {
    /// Nonblocking syscalls on the socket's readiness.
    Epoll,
    /// Sends through a ring of the connection's own.
    Uring {
        /// The ring's registration with tokio while the sending task waits for a send's
        /// completion (dropped before `ring`).
        watch: Mutex<Registration>,
        /// Dropped before the socket: its drop waits out every request in flight.
        ring: Uring,
    },
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_ring() { "Uring" } else { "Epoll" })
    }
}

impl Io {
    /// The I/O of a connection that asked for io_uring (`uring`) or not. A ring the kernel
    /// refuses makes the connection fall back to epoll, and say so.
    pub(super) fn open(uring: bool, peer: &str) -> Io {
        if !uring {
            return Io::Epoll;
        }
        match Uring::new() {
            Ok(ring) => Io::Uring {
                watch: Mutex::new(Registration::default()),
                ring,
            },
            Err(e) => {
                tracing::warn!(
                    peer = %peer,
                    "io_uring refused for a data connection ({e}); it uses epoll"
                );
                Io::Epoll
            }
        }
    }

    /// Whether sends go through a ring (driven after the submitter releases the sending
    /// half, see [`handoff::sender`]).
    pub(super) fn is_ring(&self) -> bool {
        matches!(self, Io::Uring { .. })
    }

    /// Sends `pieces` on socket `fd`, as a nonblocking `sendmsg` reports it: with io_uring
    /// the first ask queues the send ([`Io::flush`] submits it) and "would block" stands until
    /// its completion is reaped, when the same ask (the half's state is unchanged) gets it.
    pub(super) fn send(&self, fd: RawFd, pieces: &[Piece<'_>]) -> std::io::Result<usize> {
        match self {
            Io::Epoll => rawio::sendmsg_pieces_now(fd, pieces),
            Io::Uring { ring, .. } => ring.send(fd, pieces),
        }
    }

    /// After a pump: submits what it queued and reaps what completed. Returns whether a
    /// completion waits for a pump to take it (never with epoll, whose sends are done when
    /// they return).
    pub(super) fn flush(&self) -> std::io::Result<bool> {
        match self {
            Io::Epoll => Ok(false),
            Io::Uring { ring, .. } => ring.flush(),
        }
    }

    /// What the sending task awaits while its sends wait ([`Sending::Io`]), and the
    /// descriptor with its registration when it is not the socket (whose registration the
    /// reader shares): room in the socket's send buffer, or the ring's completions.
    pub(super) fn waits_on(&self) -> (Interest, Option<(RawFd, &Mutex<Registration>)>) {
        match self {
            Io::Epoll => (Interest::WRITABLE, None),
            Io::Uring { watch, ring } => (Interest::READABLE, Some((ring.as_raw_fd(), watch))),
        }
    }

    /// Whether a kick ([`super::Conn::tx_blocked`]) also ends the sending task's wait on its
    /// I/O. With io_uring a submitter or spinner may reap the completion the task waits for,
    /// and then hands over what it left ([`Io::hands_over`]); with epoll a kick is only kept
    /// for later: the work a direct pump left waits for the same room the task waits for,
    /// and waking for it would only meet a full socket again.
    pub(super) fn kick_ends_wait(&self) -> bool {
        self.is_ring()
    }

    /// Whether the sending task, woken by its I/O's readiness, drives before it clears the
    /// readiness. The ring's completions are reaped first, so that completions posted after
    /// the readiness was seen keep it set. The socket's readiness is cleared first, as tokio
    /// has it, then the pump sends into the room the edge announced (a later edge sets it
    /// again); the socket's registration is shared with the reader, whose edges would keep
    /// a readiness cleared after a long pump set for a wake-up that finds the socket full.
    pub(super) fn drives_before_clearing(&self) -> bool {
        self.is_ring()
    }

    /// What the sending task waits for after its drive, which left the socket refusing part
    /// of the backlog (`blocked`); `spinners` is asked only as needed.
    pub(super) fn waits(&self, blocked: bool, spinners: impl FnOnce() -> usize) -> Sending {
        match self {
            // Spinners only try the sending half's lock: the task waits for room regardless.
            Io::Epoll => handoff::socket_waits(blocked),
            Io::Uring { ring, .. } => handoff::ring_waits(spinners(), || ring.status().in_flight),
        }
    }

    /// Whether the sending task, its state (`waits`) published, drives again at once: what
    /// changed before it published, it sees here (what changes after wakes it, see
    /// [`Io::hands_over`]). `pending`: parts wait to be sent.
    pub(super) fn again(
        &self,
        waits: Sending,
        pending: impl FnOnce() -> bool,
        spinners: impl FnOnce() -> usize,
    ) -> bool {
        match self {
            // A direct pump that the socket blocked kicks the task, and the kick is kept.
            Io::Epoll => false,
            Io::Uring { ring, .. } => handoff::ring_again(waits, ring.status(), pending, spinners),
        }
    }

    /// After a submitter or a spinner drove the connection (its pump left the socket
    /// refusing part of the backlog: `blocked`): whether the sending task must be woken for
    /// what it left. `sending`: what the task waits for now; `pending`: parts wait to be sent.
    pub(super) fn hands_over(
        &self,
        blocked: bool,
        spinners: impl FnOnce() -> usize,
        sending: impl FnOnce() -> Sending,
        pending: impl FnOnce() -> bool,
    ) -> bool {
        match self {
            // The socket is full: the task waits for room.
            Io::Epoll => blocked,
            // While a waiter spins, it reaps; the task is woken when the last spinner stops.
            Io::Uring { ring, .. } => {
                spinners() == 0 && handoff::ring_hands_over(ring.status(), sending(), pending)
            }
        }
    }

    /// Before the connection fails what it holds: with io_uring, the socket (`sock`) is shut
    /// down, which ends a send waiting for room, and the ring quiesced, so that no request
    /// touches a part's memory once it is failed. Idempotent.
    pub(super) fn quiesce(&self, sock: Option<&std::net::TcpStream>) {
        if let Io::Uring { ring, .. } = self {
            if let Some(s) = sock {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            ring.quiesce();
        }
    }
}
