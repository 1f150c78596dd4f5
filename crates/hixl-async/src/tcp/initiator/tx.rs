//! The sending half: the socket I/O around hixl-core's sans-io outbox
//! ([`hixl_core::outbox::Outbox`]): its gathers sent with one `sendmsg` (or io_uring send)
//! each, write payloads straight from registered memory, the parts of withdrawn ops dropped.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use hixl_core::outbox::{Bounds, Outgoing, Piece as Next};
use hixl_core::wire::{encode_data_req, encode_strided_req, StridedReq};
use hixl_core::{Error, Token};

use super::io::Io;
use super::{lost, Conn, Part, Pending, Pumped, Tx, Via};
use crate::completion::Completion;
use crate::sync::lock;
use crate::tcp::gather::{GATHER_BYTES, GATHER_PARTS};
use crate::tcp::uring::Piece;

impl Tx {
    pub(super) fn is_free(&self) -> bool {
        self.outbox.is_free()
    }

    /// Queues parts behind the backlog.
    pub(super) fn queue(&mut self, parts: Vec<Pending>) {
        self.outbox.queue(parts);
    }

    /// Gathers the next send from the backlog (up to the gather bounds). Parts of withdrawn
    /// ops complete as cancelled (into `done`); a read part is queued for its answer before
    /// its header can go out.
    pub(super) fn gather(
        &mut self,
        conn: &Conn,
        via: Via,
        done: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        let bounds = Bounds {
            parts: GATHER_PARTS,
            bytes: GATHER_BYTES,
        };
        let Tx {
            outbox, checked, ..
        } = self;
        let mut wanted = |p: &Pending| wanted(checked, conn, p.part.token, p.seen);
        let mut cancelled = Vec::new();
        let mut dropped = |p: Pending| cancelled.push(p.part.token);
        let r = outbox.gather(bounds, &mut wanted, &mut dropped, &mut answer(conn, via));
        done.extend(cancelled.into_iter().map(|token| Completion {
            token,
            result: Err(Error::Cancelled { what: "a TCP part" }),
        }));
        r.map_err(|p| closed(conn, p, done))
    }

    /// Sends what the socket takes, gathering up to [`GATHER_PARTS`] requests per `sendmsg`.
    /// A write part goes to `rx` once its payload is all out.
    ///
    /// Sends at most about `budget` bytes: past it, work left is reported as blocked (for the
    /// sending task to finish), so a submitter is not held by a large op.
    ///
    /// Returns an error only when the connection is unusable; the caller then fails it.
    /// `via`: who pumps (a part queued for its answer by a submitter or a spinner is left to
    /// its owner's spin, see [`Conn::push_rx`]).
    pub(super) fn pump(
        &mut self,
        conn: &Conn,
        via: Via,
        budget: usize,
        done: &mut Vec<Completion>,
    ) -> Result<Pumped, Error> {
        if self.closed {
            return Ok(Pumped::Idle);
        }
        // Not opened yet: the sending task opens it (a direct pump reporting this wakes it).
        let Some((fd, io)) = conn.opened() else {
            return Ok(Pumped::Blocked);
        };
        let mut moved = 0usize;
        loop {
            if !self.outbox.is_gathered() {
                if self.outbox.is_free() {
                    return Ok(Pumped::Idle);
                }
                self.gather(conn, via, done)?;
                continue;
            }
            if moved >= budget {
                return Ok(Pumped::Blocked);
            }
            let n = match self.send(io, fd) {
                Ok(0) => {
                    return Err(conn.cause(Error::connection_lost(
                        &conn.peer,
                        "sending parts",
                        std::io::ErrorKind::WriteZero.into(),
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Pumped::Blocked),
                Err(e) => {
                    return Err(conn.cause(Error::connection_lost(&conn.peer, "sending parts", e)))
                }
            };
            moved += n;
            // The requests now wholly sent leave the gather, a write part joining `rx` (its
            // ack may already be in the socket: the reader matches it once queued).
            let r = self.outbox.sent(n, &mut answer(conn, via));
            r.map_err(|p| closed(conn, p, done))?;
        }
    }

    /// One nonblocking send (through `io`) of what the gather still holds: each request's
    /// header and, for a write, its payload straight from registered memory.
    pub(super) fn send(&self, io: &Io, fd: RawFd) -> std::io::Result<usize> {
        let mut pieces = [Piece::Head(&[]); 2 * GATHER_PARTS];
        let mut n = 0;
        'all: for piece in self.outbox.pieces() {
            match piece {
                Next::Head(h) => {
                    if n == pieces.len() {
                        break;
                    }
                    pieces[n] = Piece::Head(h);
                    n += 1;
                }
                Next::Payload(p, from) => {
                    // A strided part's payload is its pieces: as many as the iovecs hold (the
                    // next send goes on from where this one stopped).
                    let mut off = from;
                    while off < p.part.local.len() {
                        if n == pieces.len() {
                            break 'all;
                        }
                        // SAFETY: the part has not been completed: it is completed only after
                        // it leaves the gather, and this half (whose lock the caller holds)
                        // removes it only once its payload is out.
                        let payload = unsafe { p.part.local.raw_at(off) };
                        off += payload.len() as u64;
                        pieces[n] = Piece::Body(payload);
                        n += 1;
                    }
                }
            }
        }
        io.send(fd, &pieces[..n])
    }

    /// Empties the half for closing: the gathered writes (partly sent, perhaps), then the
    /// backlog.
    pub(super) fn close(&mut self) -> Vec<Part> {
        self.closed = true;
        self.outbox.close().into_iter().map(|p| p.part).collect()
    }
}

/// Where a part goes for its answer: `rx` (a closed connection gives it back).
fn answer(conn: &Conn, via: Via) -> impl FnMut(Pending) -> Result<(), Pending> + '_ {
    move |p: Pending| {
        let seen = p.seen;
        conn.push_rx(p.part, via)
            .map_err(|part| Pending::new(part, seen))
    }
}

/// The error of a connection that closed under a part on its way to `rx`: the part fails
/// with it.
fn closed(conn: &Conn, p: Pending, done: &mut Vec<Completion>) -> Error {
    done.push(Completion {
        token: p.part.token,
        result: Err(lost(&conn.peer, "data connection closed")),
    });
    lost(&conn.peer, "data connection closed")
}

impl Outgoing for Pending {
    fn put_request(&self, out: &mut Vec<u8>) {
        let part = &self.part;
        match part.strided {
            Some((len, stride, count)) => {
                let r = StridedReq {
                    id: part.req.id,
                    rkey: part.req.rkey,
                    addr: part.req.addr,
                    len,
                    stride,
                    count,
                };
                out.extend_from_slice(&encode_strided_req(part.write, &r));
            }
            None => out.extend_from_slice(&encode_data_req(part.write, &part.req)),
        }
    }
    fn is_write(&self) -> bool {
        self.part.write
    }
    fn bytes(&self) -> u64 {
        self.part.local.len()
    }
}

/// Whether op `token` (of a batch submitted at withdrawal count `seen`) is still wanted. The
/// op table is locked only after the link's withdrawal count moved since the batch was
/// submitted (the count was taken before its op could be abandoned): the abandon, made under
/// that lock before the count was bumped, is then seen. Without withdrawals a part costs one
/// atomic load and no lock; `checked` caches the last answer.
pub(super) fn wanted(
    checked: &mut Option<(Token, u64, bool)>,
    conn: &Conn,
    token: Token,
    seen: u64,
) -> bool {
    let now = conn.withdrawals.load(Ordering::Acquire);
    if now == seen {
        return true;
    }
    if let Some((t, at, wanted)) = *checked {
        if t == token && at == now {
            return wanted;
        }
    }
    let wanted = lock(&conn.ops.table).is_wanted(token);
    *checked = Some((token, now, wanted));
    wanted
}
