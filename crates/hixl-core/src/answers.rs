//! The answers a TCP data connection awaits, sans-io: the requests in flight in the order they
//! went out, each matched with its answer as the answer's bytes come (an `Ack` for a write; a
//! `ReadResp` for a read, then its payload), and where each payload byte goes.
//!
//! The I/O around it is the caller's: it asks [`Answers::next`] what the connection needs,
//! stages answer frames and hands them to [`Answers::take`], and lands payload bytes straight
//! in the part's memory, reporting them with [`Answers::landed`]. Every request resolves
//! exactly once: answered (by `take` or `landed`), or given back by [`Answers::close`] to be
//! failed with the connection. After an error the connection is unusable: the caller closes
//! it, and the parts still queued (the one whose answer was bad among them) come back from
//! `close`.

use std::collections::VecDeque;

use crate::wire::{FrameHeader, Message, ACK_FRAME, HEADER_LEN, READ_RESP_FRAME};
use crate::{Error, Status};

/// A request awaiting its answer.
pub trait Awaited {
    /// The request id the answer echoes.
    fn id(&self) -> u64;
    /// Whether it is a write (answered by an `Ack`) or a read (a `ReadResp` and payload).
    fn is_write(&self) -> bool;
    /// Its bytes: a read's payload is exactly this many.
    fn bytes(&self) -> u64;
    /// Where it points in the peer's memory, `(rkey, addr)`, for errors.
    fn target(&self) -> (u64, u64);
}

/// What the connection needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing is awaited.
    Idle,
    /// At least `need` staged bytes (the front request's answer frame), then
    /// [`Answers::take`].
    Frames {
        /// Bytes of staged answers `take` needs to make progress.
        need: usize,
    },
    /// Bytes `got..len` of the front request's read payload, into its memory at those
    /// offsets, then [`Answers::landed`].
    Payload {
        /// Payload bytes already landed.
        got: u64,
        /// The payload's length.
        len: u64,
    },
}

/// The requests of one connection awaiting their answers.
#[derive(Debug)]
pub struct Answers<P> {
    /// Oldest first; `None` once closed.
    queue: Option<VecDeque<P>>,
    /// `Some(n)` while the front read's payload comes: `n` bytes have landed.
    payload: Option<u64>,
}

impl<P> Default for Answers<P> {
    fn default() -> Answers<P> {
        Answers {
            queue: Some(VecDeque::new()),
            payload: None,
        }
    }
}

impl<P: Awaited> Answers<P> {
    /// Queues `p`, whose request has gone out (a write once its payload has); gives it back
    /// if the connection is closed.
    pub fn push(&mut self, p: P) -> Result<(), P> {
        match self.queue.as_mut() {
            Some(q) => {
                q.push_back(p);
                Ok(())
            }
            None => Err(p),
        }
    }

    /// Whether any request awaits its answer.
    pub fn awaiting(&self) -> bool {
        self.queue.as_ref().is_some_and(|q| !q.is_empty())
    }

    /// Whether [`Answers::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.queue.is_none()
    }

    /// The oldest request awaiting its answer (the one a payload is for).
    pub fn front(&self) -> Option<&P> {
        self.queue.as_ref().and_then(|q| q.front())
    }

    /// Closes: every request still awaiting its answer, oldest first, for the caller to fail;
    /// later pushes are refused.
    pub fn close(&mut self) -> VecDeque<P> {
        self.payload = None;
        self.queue.take().unwrap_or_default()
    }

    /// What the connection needs next.
    pub fn next(&self) -> Next {
        let Some(front) = self.front() else {
            return Next::Idle;
        };
        match self.payload {
            Some(got) => Next::Payload {
                got,
                len: front.bytes(),
            },
            None if front.is_write() => Next::Frames { need: ACK_FRAME },
            None => Next::Frames {
                need: READ_RESP_FRAME,
            },
        }
    }

    /// Matches the answer frames at the start of `staged` with the requests at the front:
    /// the acks of the writes at the front while whole ones are staged, or one read's
    /// `ReadResp` (a refusal resolves the read; else its payload comes next). Resolved
    /// requests go to `done` in order. Returns the bytes it consumed; 0 when `staged` holds
    /// no whole answer for the front (or a payload is due, or nothing is awaited).
    ///
    /// # Errors
    /// [`Error::Protocol`] naming `peer` for an answer that is not the front request's (bad
    /// frame, wrong kind or id, a payload of the wrong length, a refusal that carries one).
    pub fn take(
        &mut self,
        staged: &[u8],
        peer: &str,
        done: &mut impl FnMut(P, Result<(), Error>),
    ) -> Result<usize, Error> {
        if self.payload.is_some() {
            return Ok(0);
        }
        let Some(q) = self.queue.as_mut() else {
            return Ok(0);
        };
        let mut used = 0;
        while let Some(front) = q.front() {
            if !front.is_write() {
                break;
            }
            let Some(frame) = staged.get(used..used + ACK_FRAME) else {
                return Ok(used);
            };
            let Message::Ack { id, status } = decode_answer(frame, peer)? else {
                return Err(protocol(peer, "expected an ack for a write"));
            };
            if id != front.id() {
                let e = format!("ack for request {id:#x}, expected {:#x}", front.id());
                return Err(protocol(peer, e));
            }
            let result = answered(peer, front, status);
            used += ACK_FRAME;
            if let Some(p) = q.pop_front() {
                done(p, result);
            }
        }
        if used > 0 {
            // A read's answer may follow: it is taken on the next call.
            return Ok(used);
        }
        let Some(front) = q.front() else {
            return Ok(0);
        };
        let Some(frame) = staged.get(..READ_RESP_FRAME) else {
            return Ok(0);
        };
        let Message::ReadResp { id, status, len } = decode_answer(frame, peer)? else {
            return Err(protocol(peer, "expected a read response"));
        };
        if id != front.id() {
            let e = format!("read response for {id:#x}, expected {:#x}", front.id());
            return Err(protocol(peer, e));
        }
        if status != 0 {
            if len != 0 {
                return Err(protocol(peer, "refused read carries a payload"));
            }
            let result = answered(peer, front, status);
            if let Some(p) = q.pop_front() {
                done(p, result);
            }
            return Ok(READ_RESP_FRAME);
        }
        if len != front.bytes() {
            let e = format!("read response of {len} bytes, asked {}", front.bytes());
            return Err(protocol(peer, e));
        }
        self.payload = Some(0);
        self.complete_payload(done);
        Ok(READ_RESP_FRAME)
    }

    /// `n` more bytes of the front read's payload have landed in its memory (where
    /// [`Next::Payload`] said); the read resolves once all have. More than the payload's rest
    /// counts as its rest.
    pub fn landed(&mut self, n: u64, done: &mut impl FnMut(P, Result<(), Error>)) {
        if let Some(got) = self.payload.as_mut() {
            *got = got.saturating_add(n);
            self.complete_payload(done);
        }
    }

    fn complete_payload(&mut self, done: &mut impl FnMut(P, Result<(), Error>)) {
        let (Some(got), Some(q)) = (self.payload, self.queue.as_mut()) else {
            return;
        };
        if q.front().is_some_and(|f| got >= f.bytes()) {
            self.payload = None;
            if let Some(p) = q.pop_front() {
                done(p, Ok(()));
            }
        }
    }
}

fn answered<P: Awaited>(peer: &str, p: &P, status: u32) -> Result<(), Error> {
    if status == 0 {
        return Ok(());
    }
    let (rkey, addr) = p.target();
    Err(Error::Remote {
        peer: peer.to_string(),
        status: Status::from_code(status).unwrap_or(Status::Failed),
        message: format!(
            "{} of {} bytes at {addr:#x} (rkey {rkey:#x})",
            if p.is_write() { "write" } else { "read" },
            p.bytes(),
        ),
    })
}

/// The protocol error of a data connection's peer.
pub fn protocol(peer: &str, reason: impl Into<String>) -> Error {
    Error::Protocol {
        peer: peer.to_string(),
        reason: reason.into(),
    }
}

/// One whole answer frame (`frame` holds exactly its bytes).
fn decode_answer(frame: &[u8], peer: &str) -> Result<Message, Error> {
    let h = FrameHeader::decode(frame).map_err(|e| protocol(peer, e.to_string()))?;
    let body = frame
        .get(HEADER_LEN..)
        .filter(|b| b.len() == h.body_len as usize)
        .ok_or_else(|| protocol(peer, "answer frame of unexpected size"))?;
    Message::decode_body(h.ty, body).map_err(|e| protocol(peer, e.to_string()))
}

#[cfg(test)]
#[path = "answers_tests.rs"]
mod tests;
