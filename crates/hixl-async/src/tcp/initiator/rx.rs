//! The receiving half: the socket I/O around hixl-core's sans-io answer matcher
//! ([`Answers`]): answers staged and matched to the parts in flight, read payloads received
//! straight into registered memory.

use hixl_core::answers::{Answers, Awaited, Next};
use hixl_core::Error;

use super::{lost, Conn, Part, Pumped, Rx};
use crate::completion::Completion;
use crate::stage::{Stage, MAX_SCATTER};

impl Rx {
    pub(super) fn new() -> Rx {
        Rx {
            answers: Answers::default(),
            stage: Stage::default(),
            reader_parked: false,
        }
    }

    pub(super) fn awaiting(&self) -> bool {
        self.answers.awaiting()
    }

    /// Receives what the socket holds and completes the parts it answers (into `done`): the
    /// I/O around the sans-io [`Answers`]. Returns an error when the connection is unusable
    /// (the caller fails it, and with it every part still queued: a part leaves the queue
    /// only completed).
    pub(super) fn pump(
        &mut self,
        conn: &Conn,
        done: &mut Vec<Completion>,
    ) -> Result<Pumped, Error> {
        let peer = &*conn.peer;
        // Nothing is awaited before the first send, which needs the socket.
        let Some(fd) = conn.fd() else {
            return Ok(Pumped::Idle);
        };
        let mut resolved = |p: Part, result| {
            done.push(Completion {
                token: p.token,
                result,
            })
        };
        loop {
            match self.answers.next() {
                Next::Idle => return Ok(Pumped::Idle),
                Next::Frames { need } if self.stage.len() >= need => {
                    let n = self.answers.take(self.stage.bytes(), peer, &mut resolved)?;
                    self.stage.consume(n);
                }
                Next::Frames { .. } => match self.stage.recv_now(fd, None) {
                    Ok(g) if g.is_eof() => return Err(lost(peer, "connection closed by peer")),
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        return Ok(Pumped::Blocked)
                    }
                    Err(e) => {
                        return Err(conn.cause(Error::connection_lost(peer, "reading answers", e)))
                    }
                },
                Next::Payload { got, len } => {
                    let Some(front) = self.answers.front() else {
                        return Ok(Pumped::Idle);
                    };
                    // SAFETY: the front part has not been completed: only this half, whose
                    // lock we hold, completes it, once its payload is in.
                    let first = unsafe { front.local.raw_at(got) };
                    // What the stage holds goes first, piece by piece (a strided part's
                    // pieces are apart locally).
                    if !self.stage.is_empty() {
                        let took = self.stage.take_into(first);
                        self.answers.landed(took as u64, &mut resolved);
                        continue;
                    }
                    // The rest of the payload, and whatever follows it, in one receive: into
                    // the rest of a contiguous part, or up to MAX_SCATTER pieces of a
                    // strided one.
                    let r = if got + first.len() as u64 >= len {
                        self.stage.recv_now(fd, Some(first))
                    } else {
                        let mut dsts = [first; MAX_SCATTER];
                        let (mut k, mut at) = (1, got + first.len() as u64);
                        while k < MAX_SCATTER && at < len {
                            // SAFETY: as above.
                            let d = unsafe { front.local.raw_at(at) };
                            at += d.len() as u64;
                            dsts[k] = d;
                            k += 1;
                        }
                        self.stage.recv_now_into(fd, &dsts[..k])
                    };
                    match r {
                        Ok(g) if g.is_eof() => {
                            return Err(lost(peer, "connection closed inside a read payload"))
                        }
                        Ok(g) => self.answers.landed(g.into_dst as u64, &mut resolved),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            return Ok(Pumped::Blocked)
                        }
                        Err(e) => {
                            return Err(conn.cause(Error::connection_lost(
                                peer,
                                "receiving a read payload",
                                e,
                            )))
                        }
                    }
                }
            }
        }
    }
}

impl Awaited for Part {
    fn id(&self) -> u64 {
        self.req.id
    }
    fn is_write(&self) -> bool {
        self.write
    }
    fn bytes(&self) -> u64 {
        self.req.len
    }
    fn target(&self) -> (u64, u64) {
        (self.req.rkey, self.req.addr)
    }
}
