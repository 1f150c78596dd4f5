//! The receiving half: answers matched to the parts in flight, read payloads landed in
//! registered memory, refusals and protocol errors named.

use std::collections::VecDeque;

use hixl_core::wire::{FrameHeader, Message, ACK_FRAME, HEADER_LEN, READ_RESP_FRAME};
use hixl_core::{Error, Status};

use super::{lost, Conn, Part, Pumped, Rx};
use crate::completion::Completion;
use crate::stage::{Stage, MAX_SCATTER};

impl Rx {
    pub(super) fn new() -> Rx {
        Rx {
            inflight: Some(VecDeque::new()),
            stage: Stage::default(),
            payload: None,
            reader_parked: false,
        }
    }

    pub(super) fn awaiting(&self) -> bool {
        self.inflight.as_ref().is_some_and(|q| !q.is_empty())
    }

    /// Receives what the socket holds and completes the parts it answers (into `done`).
    /// Returns an error when the connection is unusable (the caller fails it, and with it
    /// every part still queued: a part leaves the queue only completed).
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
        loop {
            let Some(q) = self.inflight.as_mut() else {
                return Ok(Pumped::Idle);
            };
            let Some(front) = q.front() else {
                return Ok(Pumped::Idle);
            };
            if let Some(got) = self.payload {
                let total = front.local_len();
                let mut got = got;
                // What the stage holds goes first, piece by piece (a strided part's pieces
                // are apart locally).
                while got < total {
                    // SAFETY: the front part has not been completed: only this half, whose
                    // lock we hold, pops and completes it, after its payload is in.
                    let dst = unsafe { front.local.raw_at(got as u64) };
                    let took = self.stage.take_into(dst);
                    got += took;
                    if took < dst.len() {
                        break;
                    }
                }
                if got < total {
                    // The rest of the payload, and whatever follows it, in one receive: into
                    // the rest of a contiguous part, or up to MAX_SCATTER pieces of a strided one.
                    // SAFETY: as above.
                    let first = unsafe { front.local.raw_at(got as u64) };
                    let r = if got + first.len() >= total {
                        self.stage.recv_now(fd, Some(first))
                    } else {
                        let mut dsts = [first; MAX_SCATTER];
                        let (mut k, mut at) = (1, (got + first.len()) as u64);
                        while k < MAX_SCATTER && at < total as u64 {
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
                        Ok(g) => got += g.into_dst,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.payload = Some(got);
                            return Ok(Pumped::Blocked);
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
                if got < front.local_len() {
                    self.payload = Some(got);
                    continue;
                }
                self.payload = None;
                if let Some(p) = q.pop_front() {
                    done.push(Completion {
                        token: p.token,
                        result: Ok(()),
                    });
                }
                continue;
            }
            let want = if front.write {
                ACK_FRAME
            } else {
                READ_RESP_FRAME
            };
            if self.stage.len() < want {
                match self.stage.recv_now(fd, None) {
                    Ok(g) if g.is_eof() => return Err(lost(peer, "connection closed by peer")),
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        return Ok(Pumped::Blocked)
                    }
                    Err(e) => {
                        return Err(conn.cause(Error::connection_lost(peer, "reading answers", e)))
                    }
                }
            }
            if front.write {
                // The acks staged for the writes at the front (a read's answer may follow).
                let staged = self.stage.len() / ACK_FRAME;
                let whole = q.iter().take(staged).take_while(|p| p.write).count();
                take_acks(&self.stage.bytes()[..whole * ACK_FRAME], q, peer, done)?;
                self.stage.consume(whole * ACK_FRAME);
                continue;
            }
            let Message::ReadResp { id, status, len } =
                decode_answer(&self.stage.bytes()[..READ_RESP_FRAME], peer)?
            else {
                return Err(protocol(peer, "expected a read response"));
            };
            self.stage.consume(READ_RESP_FRAME);
            if id != front.req.id || front.write {
                let e = protocol(
                    peer,
                    format!("read response for {id:#x}, expected {:#x}", front.req.id),
                );
                return Err(e);
            }
            if status != 0 {
                if len != 0 {
                    return Err(protocol(peer, "refused read carries a payload"));
                }
                let e = refused(peer, front, status);
                if let Some(p) = q.pop_front() {
                    done.push(Completion {
                        token: p.token,
                        result: Err(e),
                    });
                }
                continue;
            }
            if len != front.req.len {
                return Err(protocol(
                    peer,
                    format!("read response of {len} bytes, asked {}", front.req.len),
                ));
            }
            self.payload = Some(0);
        }
    }
}

pub(super) fn protocol(peer: &str, reason: impl Into<String>) -> Error {
    Error::Protocol {
        peer: peer.to_string(),
        reason: reason.into(),
    }
}

pub(super) fn refused(peer: &str, p: &Part, status: u32) -> Error {
    Error::Remote {
        peer: peer.to_string(),
        status: Status::from_code(status).unwrap_or(Status::Failed),
        message: format!(
            "{} of {} bytes at {:#x} (rkey {:#x})",
            if p.write { "write" } else { "read" },
            p.req.len,
            p.req.addr,
            p.req.rkey
        ),
    }
}

pub(super) fn decode_answer(frame: &[u8], peer: &str) -> Result<Message, Error> {
    let h = FrameHeader::decode(frame).map_err(|e| protocol(peer, e.to_string()))?;
    let body = frame
        .get(HEADER_LEN..HEADER_LEN + h.body_len as usize)
        .ok_or_else(|| protocol(peer, "answer frame of unexpected size"))?;
    Message::decode_body(h.ty, body).map_err(|e| protocol(peer, e.to_string()))
}

/// Matches whole ack frames with the write parts at the front of `q`, completing them into
/// `done`. A bad frame is an error (the parts stay queued, to be failed with the connection).
pub(super) fn take_acks(
    frames: &[u8],
    q: &mut VecDeque<Part>,
    peer: &str,
    done: &mut Vec<Completion>,
) -> Result<(), Error> {
    for frame in frames.chunks_exact(ACK_FRAME) {
        let Message::Ack { id, status } = decode_answer(frame, peer)? else {
            return Err(protocol(peer, "expected an ack for a write"));
        };
        let p = q
            .front()
            .ok_or_else(|| protocol(peer, "ack with no write outstanding"))?;
        if id != p.req.id || !p.write {
            return Err(protocol(
                peer,
                format!("ack for request {id:#x}, expected {:#x}", p.req.id),
            ));
        }
        let result = if status == 0 {
            Ok(())
        } else {
            Err(refused(peer, p, status))
        };
        if let Some(p) = q.pop_front() {
            done.push(Completion {
                token: p.token,
                result,
            });
        }
    }
    Ok(())
}
