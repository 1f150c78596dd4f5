//! The requests of a TCP data connection on their way out, sans-io: a backlog of parts, a
//! gather of them into one send (request headers back to back, each write's payload after its
//! header), and how far the send has got.
//!
//! The I/O around it is the caller's: [`Outbox::gather`] when nothing is gathered, then
//! [`Outbox::pieces`] to build one vectored send (expanding each [`Piece::Payload`] into the
//! part's memory from the offset given), then [`Outbox::sent`] with the bytes the socket
//! took. Once a request is gathered it is sent to its end whatever becomes of its op, so the
//! stream stays in frame; a part whose op is no longer wanted when it would be gathered is
//! dropped instead. A read part goes to its answers as it is gathered (its answer can only
//! follow its header out), a write part once its payload is all out (nobody may complete it
//! while the socket still reads its memory).

use std::collections::VecDeque;

/// A part of an op on its way out.
pub trait Outgoing {
    /// Appends its request frame.
    fn put_request(&self, out: &mut Vec<u8>);
    /// Whether it is a write (its payload follows its request).
    fn is_write(&self) -> bool;
    /// A write's payload bytes.
    fn bytes(&self) -> u64;
}

/// How much one gather takes at most.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Requests.
    pub parts: usize,
    /// Write payload bytes: past them only what is gathered goes (at least one part).
    pub bytes: u64,
}

/// One piece of the next send.
#[derive(Debug)]
pub enum Piece<'a, P> {
    /// Request headers, as they go.
    Head(&'a [u8]),
    /// A write's payload from this offset on (to its end, as much as the send takes).
    Payload(&'a P, u64),
}

/// A gathered request: its header's length in `head` and, for a write, the part.
#[derive(Debug)]
struct Out<P> {
    write: Option<P>,
    hlen: usize,
}

/// The parts of one connection on their way out.
#[derive(Debug)]
pub struct Outbox<P> {
    backlog: VecDeque<P>,
    out: VecDeque<Out<P>>,
    /// The headers of `out`, back to back; `head_off` of them have gone.
    head: Vec<u8>,
    head_off: usize,
    /// Bytes of the front of `out` sent (its header, then its payload).
    front_sent: usize,
}

impl<P> Default for Outbox<P> {
    fn default() -> Outbox<P> {
        Outbox {
            backlog: VecDeque::new(),
            out: VecDeque::new(),
            head: Vec::new(),
            head_off: 0,
            front_sent: 0,
        }
    }
}

impl<P: Outgoing> Outbox<P> {
    /// Queues parts behind the backlog (a list given to an empty outbox becomes its backlog
    /// as it is).
    pub fn queue(&mut self, parts: Vec<P>) {
        if self.backlog.is_empty() {
            self.backlog = VecDeque::from(parts);
        } else {
            self.backlog.extend(parts);
        }
    }

    /// Whether nothing is queued or gathered.
    pub fn is_free(&self) -> bool {
        self.backlog.is_empty() && self.out.is_empty()
    }

    /// Whether a gathered send is under way (then [`Outbox::pieces`] has work).
    pub fn is_gathered(&self) -> bool {
        !self.out.is_empty()
    }

    /// When nothing is gathered, takes parts from the backlog while `bounds` allow (at least
    /// one), all reads or all writes: a read joins its answers when gathered and a write once
    /// sent, so a mixed gather would queue a read's answer ahead of a write sent before it.
    /// Parts `wanted` refuses go to `dropped`; read parts go to `answer` (a part it gives
    /// back ends the gather with that part, the connection being closed).
    ///
    /// # Errors
    /// The part `answer` gave back.
    pub fn gather(
        &mut self,
        bounds: Bounds,
        wanted: &mut impl FnMut(&P) -> bool,
        dropped: &mut impl FnMut(P),
        answer: &mut impl FnMut(P) -> Result<(), P>,
    ) -> Result<(), P> {
        if !self.out.is_empty() {
            return Ok(());
        }
        self.head.clear();
        self.head_off = 0;
        self.front_sent = 0;
        let mut bytes: u64 = 0;
        let mut kind = None;
        while self.out.len() < bounds.parts && (self.out.is_empty() || bytes < bounds.bytes) {
            let Some(front) = self.backlog.front() else {
                break;
            };
            if *kind.get_or_insert(front.is_write()) != front.is_write() {
                break;
            }
            let Some(p) = self.backlog.pop_front() else {
                break;
            };
            if !wanted(&p) {
                dropped(p);
                continue;
            }
            let before = self.head.len();
            p.put_request(&mut self.head);
            let hlen = self.head.len() - before;
            if p.is_write() {
                bytes = bytes.saturating_add(p.bytes());
                self.out.push_back(Out {
                    write: Some(p),
                    hlen,
                });
            } else {
                answer(p)?;
                self.out.push_back(Out { write: None, hlen });
            }
        }
        Ok(())
    }

    /// The pieces of what the gathered requests still have to send, in order: headers, and
    /// each write's payload from where the last send stopped.
    pub fn pieces(&self) -> impl Iterator<Item = Piece<'_, P>> {
        let mut hoff = self.head_off;
        let mut skip = self.front_sent;
        self.out.iter().flat_map(move |o| {
            let hdr = &self.head[hoff..hoff + o.hlen];
            hoff += o.hlen;
            let head = (skip < o.hlen).then(|| Piece::Head(&hdr[skip..]));
            let from = skip.saturating_sub(o.hlen) as u64;
            skip = 0;
            let body = o.write.as_ref().map(|p| Piece::Payload(p, from));
            head.into_iter().chain(body)
        })
    }

    /// `n` more bytes went out: the requests now wholly sent leave the gather, a write part
    /// to `answer` (a part it gives back is returned, the connection being closed).
    ///
    /// # Errors
    /// The part `answer` gave back.
    pub fn sent(&mut self, n: usize, answer: &mut impl FnMut(P) -> Result<(), P>) -> Result<(), P> {
        let mut left = self.front_sent + n;
        while let Some(front) = self.out.front() {
            let hlen = front.hlen;
            let len = hlen + front.write.as_ref().map_or(0, |p| p.bytes() as usize);
            if left < len {
                break;
            }
            left -= len;
            self.head_off += hlen;
            if let Some(Out { write: Some(p), .. }) = self.out.pop_front() {
                answer(p)?;
            }
        }
        self.front_sent = left;
        Ok(())
    }

    /// Empties the outbox: the gathered write parts (whose requests may be partly out), then
    /// the backlog, for the caller to fail.
    pub fn close(&mut self) -> Vec<P> {
        self.head.clear();
        self.head_off = 0;
        self.front_sent = 0;
        let gathered = self.out.drain(..).filter_map(|o| o.write);
        gathered.chain(self.backlog.drain(..)).collect()
    }
}

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
