//! The model of `tcp::target::serve_loop`, and the parser of the engine's answers.

use hixl_core::wire::{
    ty, DataReq, FrameHeader, Message, StridedReq, DATA_REQ_BODY, HEADER_LEN, STRIDED_REQ_BODY,
};
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

/// A request's pieces: first address, bytes each, distance, count.
#[derive(Clone, Copy)]
struct Pieces {
    rkey: u64,
    addr: u64,
    len: u64,
    stride: u64,
    count: u64,
}

impl From<DataReq> for Pieces {
    fn from(r: DataReq) -> Pieces {
        Pieces {
            rkey: r.rkey,
            addr: r.addr,
            len: r.len,
            stride: r.len,
            count: 1,
        }
    }
}

impl From<StridedReq> for Pieces {
    fn from(r: StridedReq) -> Pieces {
        Pieces {
            rkey: r.rkey,
            addr: r.addr,
            len: r.len,
            stride: r.stride,
            count: r.count,
        }
    }
}

/// The region that holds every piece with the access, if the request is valid: pieces do
/// not overlap, and their span lies in the region.
fn check(regs: &[Reg], p: &Pieces, need: Access) -> Option<Reg> {
    let r = regs.iter().find(|r| r.rkey == p.rkey)?;
    if p.len == 0 || p.count == 0 || (p.count > 1 && p.stride < p.len) {
        return None;
    }
    let span = (p.count - 1).checked_mul(p.stride)?.checked_add(p.len)?;
    let end = p.addr.checked_add(span)?;
    (p.addr >= r.addr && end <= r.addr + r.len && r.access.contains(need)).then_some(*r)
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
        // The target stages a header, then (a body of at most a strided request's) the whole
        // frame, then checks the body's size against the type.
        if stream.len() - pos < HEADER_LEN {
            break Stop::EofInside;
        }
        let Ok(h) = FrameHeader::decode(&stream[pos..pos + HEADER_LEN]) else {
            break Stop::Protocol;
        };
        let body = h.body_len as usize;
        if body > STRIDED_REQ_BODY {
            break Stop::Protocol;
        }
        if stream.len() - pos < HEADER_LEN + body {
            break Stop::EofInside;
        }
        let expected = match h.ty {
            ty::WRITE_REQ | ty::READ_REQ => DATA_REQ_BODY,
            ty::WRITE_STRIDED_REQ | ty::READ_STRIDED_REQ => STRIDED_REQ_BODY,
            _ => usize::MAX,
        };
        if body != expected {
            break Stop::Protocol;
        }
        let frame = &stream[pos + HEADER_LEN..pos + HEADER_LEN + body];
        pos += HEADER_LEN + body;
        let (write, id, p) = match Message::decode_body(h.ty, frame) {
            Ok(Message::WriteReq(r)) => (true, r.id, Pieces::from(r)),
            Ok(Message::ReadReq(r)) => (false, r.id, Pieces::from(r)),
            Ok(Message::WriteStridedReq(r)) => (true, r.id, Pieces::from(r)),
            Ok(Message::ReadStridedReq(r)) => (false, r.id, Pieces::from(r)),
            _ => break Stop::Protocol,
        };
        // The decoder bounds len × count.
        let total = p.len * p.count;
        if write {
            let n = (total.min((stream.len() - pos) as u64)) as usize;
            let ok = match check(&regs, &p, Access::REMOTE_WRITE) {
                Some(r) => {
                    // Only `w` grants remote write; the pieces land in order.
                    for k in 0..n {
                        let (piece, within) = (k as u64 / p.len, k as u64 % p.len);
                        let off = (p.addr - r.addr + piece * p.stride + within) as usize;
                        w[off] = stream[pos + k];
                    }
                    true
                }
                None => false,
            };
            pos += n;
            if (n as u64) < total {
                break Stop::EofInside;
            }
            resps.push(Resp::Ack { id, ok });
        } else {
            match check(&regs, &p, Access::REMOTE_READ) {
                Some(r) => {
                    let src = if r.rkey == ctx.w.rkey {
                        &w[..]
                    } else {
                        &ctx.r_bytes[..]
                    };
                    let mut payload = Vec::with_capacity(total as usize);
                    for k in 0..p.count {
                        let off = (p.addr - r.addr + k * p.stride) as usize;
                        payload.extend_from_slice(&src[off..off + p.len as usize]);
                    }
                    resps.push(Resp::Read {
                        id,
                        ok: true,
                        payload,
                    });
                }
                None => resps.push(Resp::Read {
                    id,
                    ok: false,
                    payload: Vec::new(),
                }),
            }
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
