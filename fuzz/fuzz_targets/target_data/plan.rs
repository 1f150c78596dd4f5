//! The input: the data connection's hello and the stream sent after it.

use hixl_core::wire::{encode_data_req, encode_strided_req, DataReq, StridedReq};
use hixl_fuzz::{generic_step, In, Step, GENERIC_TAGS};

use crate::setup::Ctx;
use crate::{FENCE, STREAM_CAP};

pub(crate) enum Hello {
    Valid,
    WrongSession(u64),
    WrongEngine,
    /// The hello and the requests in one write: refused when the engine read them together.
    WithData,
}

fn addr_of(ctx: &Ctx, i: &mut In) -> (u64, u64) {
    let (w, r, l, d) = (ctx.w, ctx.r, ctx.l, ctx.d);
    match i.u8() % 8 {
        0 => (w.rkey, w.addr + u64::from(i.u16()) % w.len),
        1 => (
            w.rkey,
            w.addr.wrapping_add_signed(i64::from(i.u16() as i16)),
        ),
        2 => (
            w.rkey,
            (w.addr + w.len).wrapping_add_signed(i64::from(i.u16() as i16)),
        ),
        3 => (r.rkey, r.addr + u64::from(i.u16()) % r.len),
        4 => (l.rkey, l.addr + u64::from(i.u16()) % l.len),
        5 => (d.rkey, d.addr + u64::from(i.u16()) % d.len),
        6 => (i.u64(), i.u64()),
        _ => (w.rkey ^ i.u64().max(1), w.addr),
    }
}

fn len_of(ctx: &Ctx, i: &mut In, addr: u64) -> u64 {
    let end = ctx.w.addr + ctx.w.len;
    match i.u8() % 5 {
        0 => u64::from(i.u8()),
        1 => u64::from(i.u16()),
        2 => end.wrapping_sub(addr),
        3 => i.u64(),
        _ => end.wrapping_sub(addr).wrapping_add(1),
    }
}

/// The hello and the data stream the input describes (the fence included).
pub(crate) fn plan(ctx: &Ctx, data: &[u8]) -> (Hello, Vec<Step>) {
    let mut i = In(data);
    let hello = match i.u8() % 4 {
        0 => Hello::Valid,
        1 => Hello::WrongSession(i.u64()),
        2 => Hello::WrongEngine,
        _ => Hello::WithData,
    };
    let mut steps = Vec::new();
    let mut total = 0usize;
    while !i.is_empty() && steps.len() < 256 && total < STREAM_CAP {
        let tag = i.u8() % (4 + GENERIC_TAGS);
        let step = match tag {
            0 | 1 => {
                let id = u64::from(i.u16());
                let (rkey, addr) = addr_of(ctx, &mut i);
                let len = len_of(ctx, &mut i, addr);
                let req = DataReq {
                    id,
                    rkey,
                    addr,
                    len,
                };
                let mut b = encode_data_req(tag == 0, &req).to_vec();
                if tag == 0 {
                    let room = (STREAM_CAP - total).saturating_sub(b.len()) as u64;
                    let n = match i.u8() % 3 {
                        0 => len.min(room),
                        1 => len.min(u64::from(i.u16())).min(room),
                        _ => 0,
                    } as usize;
                    let seed = i.u8();
                    b.extend((0..n).map(|k| seed.wrapping_add((k as u8).wrapping_mul(13))));
                }
                Some(Step::Bytes(b))
            }
            2 => {
                // Several small in-bounds writes of `w` in a row (many acks: batched and
                // flushed at 64).
                let n = usize::from(i.u8());
                let seed = i.u8();
                let mut b = Vec::new();
                for k in 0..n {
                    let req = DataReq {
                        id: 1000 + k as u64,
                        rkey: ctx.w.rkey,
                        addr: ctx.w.addr + (k as u64 * 97) % (ctx.w.len - 4),
                        len: 4,
                    };
                    b.extend_from_slice(&encode_data_req(true, &req));
                    b.extend_from_slice(&[seed, k as u8, seed ^ 0xff, 0x5a]);
                }
                Some(Step::Bytes(b))
            }
            3 => {
                // A strided read or write: pieces aimed like plain requests, strides that
                // space them, touch (stride = len), overlap or overflow.
                let write = i.u8() % 2 == 0;
                let (rkey, addr) = addr_of(ctx, &mut i);
                let len = u64::from(i.u8() % 64) + u64::from(i.u8() % 2) * i.u64() % 4;
                let stride = match i.u8() % 4 {
                    0 => len + u64::from(i.u8()),
                    1 => len,
                    2 => len.saturating_sub(1),
                    _ => i.u64(),
                };
                let count = match i.u8() % 4 {
                    0 => u64::from(i.u8() % 8),
                    1 => u64::from(i.u16() % 1100),
                    _ => i.u64(),
                };
                let req = StridedReq {
                    id: u64::from(i.u16()),
                    rkey,
                    addr,
                    len,
                    stride,
                    count,
                };
                let mut b = encode_strided_req(write, &req).to_vec();
                if write {
                    let room = (STREAM_CAP - total).saturating_sub(b.len()) as u64;
                    let want = len.saturating_mul(count.min(1100));
                    let n = match i.u8() % 3 {
                        0 => want.min(room),
                        1 => want.min(u64::from(i.u16())).min(room),
                        _ => 0,
                    } as usize;
                    let seed = i.u8();
                    b.extend((0..n).map(|k| seed.wrapping_add((k as u8).wrapping_mul(7))));
                }
                Some(Step::Bytes(b))
            }
            t => generic_step(t - 4, &mut i),
        };
        if let Some(s) = step {
            if let Step::Bytes(b) = &s {
                total += b.len();
            }
            steps.push(s);
        }
    }
    let fence = DataReq {
        id: FENCE,
        rkey: ctx.w.rkey,
        addr: ctx.w.addr,
        len: 1,
    };
    steps.push(Step::Bytes(encode_data_req(false, &fence).to_vec()));
    (hello, steps)
}
