//! The model of `tcp::target::serve_loop`, and the parser of the engine's answers.

use hixl_core::wire::{DataReq, FrameHeader, Message, DATA_REQ_FRAME, HEADER_LEN};
use hixl_core::Access;

use crate::setup::{Ctx, Reg};

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resp {
    Ack { id: u64, ok: bool },
    Read { id: u64, ok: bool, payload: Vec<u8> },
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Clean EOF between requests.
    Eof,
    /// EOF inside a request header or a write payload.
    EofInside,
    /// A frame the handler refuses: it closes the connection.
    Protocol,
}

pub(crate) struct Model {
    pub(crate) resps: Vec<Resp>,
    pub(crate) stop: Stop,
    /// `w`'s bytes afterwards.
    pub(crate) w: Vec<u8>,
}

fn check(regs: &[Reg], req: &DataReq, need: Access) -> Option<Reg> {
    let r = regs.iter().find(|r| r.rkey == req.rkey)?;
    let end = req.addr.checked_add(req.len)?;
    (req.len > 0 && req.addr >= r.addr && end <= r.addr + r.len && r.access.contains(need))
        .then_some(*r)
}

pub(crate) fn model(ctx: &Ctx, stream: &[u8], w0: Vec<u8>) -> Model {
    let regs = [ctx.w, ctx.r];
    let mut w = w0;
    let mut resps = Vec::new();
    let mut pos = 0usize;
    let stop = loop {
        if pos == stream.len() {
            break Stop::Eof;
        }
        if stream.len() - pos < DATA_REQ_FRAME {
            break Stop::EofInside;
        }
        let hdr = &stream[pos..pos + DATA_REQ_FRAME];
        pos += DATA_REQ_FRAME;
        let Ok(h) = FrameHeader::decode(hdr) else {
            break Stop::Protocol;
        };
        if h.body_len as usize != DATA_REQ_FRAME - HEADER_LEN {
            break Stop::Protocol;
        }
        match Message::decode_body(h.ty, &hdr[HEADER_LEN..]) {
            Ok(Message::WriteReq(req)) => {
                let n = (req.len.min((stream.len() - pos) as u64)) as usize;
                if let Some(r) = check(&regs, &req, Access::REMOTE_WRITE) {
                    // Only `w` grants remote write.
                    let off = (req.addr - r.addr) as usize;
                    w[off..off + n].copy_from_slice(&stream[pos..pos + n]);
                    pos += n;
                    if (n as u64) < req.len {
                        break Stop::EofInside;
                    }
                    resps.push(Resp::Ack {
                        id: req.id,
                        ok: true,
                    });
                } else {
                    pos += n;
                    if (n as u64) < req.len {
                        break Stop::EofInside;
                    }
                    resps.push(Resp::Ack {
                        id: req.id,
                        ok: false,
                    });
                }
            }
            Ok(Message::ReadReq(req)) => match check(&regs, &req, Access::REMOTE_READ) {
                Some(r) => {
                    let off = (req.addr - r.addr) as usize;
                    let src = if r.rkey == ctx.w.rkey {
                        &w[..]
                    } else {
                        &ctx.r_bytes[..]
                    };
                    resps.push(Resp::Read {
                        id: req.id,
                        ok: true,
                        payload: src[off..off + req.len as usize].to_vec(),
                    });
                }
                None => resps.push(Resp::Read {
                    id: req.id,
                    ok: false,
                    payload: Vec::new(),
                }),
            },
            _ => break Stop::Protocol,
        }
    };
    Model { resps, stop, w }
}

/// Parses the engine's answers. Returns them and whether the bytes end on a boundary.
pub(crate) fn parse_answers(mut b: &[u8]) -> (Vec<Resp>, bool) {
    let mut out = Vec::new();
    loop {
        if b.is_empty() {
            return (out, true);
        }
        if b.len() < HEADER_LEN {
            return (out, false);
        }
        let h = match FrameHeader::decode(&b[..HEADER_LEN]) {
            Ok(h) => h,
            Err(e) => panic!(
                "invariant violated: the engine sent a malformed data answer ({e}) after {out:?}"
            ),
        };
        let end = HEADER_LEN + h.body_len as usize;
        if b.len() < end {
            return (out, false);
        }
        match Message::decode_body(h.ty, &b[HEADER_LEN..end]) {
            Ok(Message::Ack { id, status }) => {
                out.push(Resp::Ack {
                    id,
                    ok: status == 0,
                });
                b = &b[end..];
            }
            Ok(Message::ReadResp { id, status, len }) => {
                assert!(
                    status == 0 || len == 0,
                    "invariant violated: a refused read (status {status}) announced {len} payload bytes"
                );
                let n = len as usize;
                if b.len() < end + n {
                    return (out, false);
                }
                out.push(Resp::Read {
                    id,
                    ok: status == 0,
                    payload: b[end..end + n].to_vec(),
                });
                b = &b[end + n..];
            }
            other => {
                panic!("invariant violated: the engine answered {other:?} on a data connection")
            }
        }
    }
}

pub(crate) fn short(r: &Resp) -> String {
    match r {
        Resp::Ack { id, ok } => format!("Ack {{ id: {id}, ok: {ok} }}"),
        Resp::Read { id, ok, payload } => {
            format!("Read {{ id: {id}, ok: {ok}, {} bytes }}", payload.len())
        }
    }
}
