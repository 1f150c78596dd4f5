//! The sending half: gathering queued parts into requests (up to the gather bounds),
//! sending them with their write payloads, and dropping the parts of withdrawn ops.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use hixl_core::wire::{
    encode_data_req, encode_strided_req, StridedReq, DATA_REQ_FRAME, STRIDED_REQ_FRAME,
};
use hixl_core::{Error, Token};

use super::{lost, Conn, Out, Part, Pumped, Tx, Via};
use crate::completion::Completion;
use crate::sync::lock;
use crate::tcp::gather::{GATHER_BYTES, GATHER_PARTS};
use crate::tcp::uring::Piece;

impl Tx {
    pub(super) fn is_free(&self) -> bool {
        self.backlog.is_empty() && self.out.is_empty()
    }

    /// Takes parts from the backlog into `out` (their headers into `head`) while the gather
    /// bounds allow, at least one, all reads or all writes. Parts of withdrawn ops complete
    /// as cancelled (into `done`); a read part is queued for its answer before its header can
    /// go out.
    pub(super) fn gather(
        &mut self,
        conn: &Conn,
        via: Via,
        done: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        let mut bytes: u64 = 0;
        // Reads or writes only: a read joins `rx` when gathered and a write once sent, so a
        // mixed gather would queue a read ahead of a write sent before it.
        let mut kind = None;
        while self.out.len() < GATHER_PARTS && (self.out.is_empty() || bytes < GATHER_BYTES) {
            let Some(front) = self.backlog.front() else {
                break;
            };
            if *kind.get_or_insert(front.part.write) != front.part.write {
                break;
            }
            let Some(p) = self.backlog.pop_front() else {
                break;
            };
            if !wanted(&mut self.checked, conn, p.part.token, p.seen) {
                done.push(Completion {
                    token: p.part.token,
                    result: Err(Error::Cancelled { what: "a TCP part" }),
                });
                continue;
            }
            let part = p.part;
            let hlen = match part.strided {
                Some((len, stride, count)) => {
                    let r = StridedReq {
                        id: part.req.id,
                        rkey: part.req.rkey,
                        addr: part.req.addr,
                        len,
                        stride,
                        count,
                    };
                    self.head
                        .extend_from_slice(&encode_strided_req(part.write, &r));
                    STRIDED_REQ_FRAME
                }
                None => {
                    self.head
                        .extend_from_slice(&encode_data_req(part.write, &part.req));
                    DATA_REQ_FRAME
                }
            };
            if part.write {
                bytes += part.req.len;
                self.out.push_back(Out {
                    write: Some(part),
                    hlen,
                });
            } else if let Err(p) = conn.push_rx(part, via) {
                done.push(Completion {
                    token: p.token,
                    result: Err(lost(&conn.peer, "data connection closed")),
                });
                return Err(lost(&conn.peer, "data connection closed"));
            } else {
                self.out.push_back(Out { write: None, hlen });
            }
        }
        Ok(())
    }

    /// Sends what the socket takes, gathering up to [`GATHER_PARTS`] requests per `sendmsg`.
    /// A write part goes to `rx` once its payload is all out.
    ///
    /// Sends at most about `budget` bytes: past it, work left is reported as blocked (for the
    /// writer task to finish), so a submitter is not held by a large op.
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
        // Not opened yet: the writer task opens it (a direct pump reporting this wakes it).
        let Some(fd) = conn.fd() else {
            return Ok(Pumped::Blocked);
        };
        let mut moved = 0usize;
        loop {
            if self.out.is_empty() {
                self.head.clear();
                self.head_off = 0;
                self.front_sent = 0;
                if self.backlog.is_empty() {
                    return Ok(Pumped::Idle);
                }
                self.gather(conn, via, done)?;
                if self.out.is_empty() {
                    continue;
                }
            }
            if moved >= budget {
                return Ok(Pumped::Blocked);
            }
            let n = match self.send(conn, fd) {
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
            self.advance(conn, via, n, done)?;
        }
    }

    /// One nonblocking send of what `out` still holds: each request's header (from `head`)
    /// and, for a write, its payload straight from registered memory.
    pub(super) fn send(&self, conn: &Conn, fd: RawFd) -> std::io::Result<usize> {
        let mut pieces = [Piece::Head(&[]); 2 * GATHER_PARTS];
        let mut n = 0;
        let mut hoff = self.head_off;
        let mut skip = self.front_sent;
        'outs: for o in &self.out {
            if n == pieces.len() {
                break;
            }
            let hdr = &self.head[hoff..hoff + o.hlen];
            hoff += o.hlen;
            if skip < o.hlen {
                pieces[n] = Piece::Head(&hdr[skip..]);
                n += 1;
                skip = 0;
            } else {
                skip -= o.hlen;
            }
            if let Some(p) = &o.write {
                // A strided part's payload is its pieces: as many as the iovecs hold (the
                // next send goes on from where this one stopped).
                let mut off = std::mem::take(&mut skip) as u64;
                while off < p.local.len() {
                    if n == pieces.len() {
                        break 'outs;
                    }
                    // SAFETY: the part has not been completed: it is completed only after it
                    // leaves `out`, and this half (whose lock the caller holds) removes it
                    // only once its payload is out.
                    let payload = unsafe { p.local.raw_at(off) };
                    off += payload.len() as u64;
                    pieces[n] = Piece::Body(payload);
                    n += 1;
                }
            }
        }
        conn.sendmsg(fd, &pieces[..n])
    }

    /// `n` more bytes went out: the requests now wholly sent leave `out`, a write part joining
    /// `rx` for its ack.
    pub(super) fn advance(
        &mut self,
        conn: &Conn,
        via: Via,
        n: usize,
        done: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        let mut left = self.front_sent + n;
        while let Some(front) = self.out.front() {
            let hlen = front.hlen;
            let len = hlen + front.write.as_ref().map_or(0, Part::local_len);
            if left < len {
                break;
            }
            left -= len;
            self.head_off += hlen;
            if let Some(Out { write: Some(p), .. }) = self.out.pop_front() {
                // Its ack may already be in the socket: the reader matches it once queued.
                if let Err(p) = conn.push_rx(p, via) {
                    done.push(Completion {
                        token: p.token,
                        result: Err(lost(&conn.peer, "data connection closed")),
                    });
                    return Err(lost(&conn.peer, "data connection closed"));
                }
            }
        }
        self.front_sent = left;
        Ok(())
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
