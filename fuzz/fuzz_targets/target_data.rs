//! Fuzz target for a live engine's TCP data path, target side: the data hello in
//! `Server::handle` and `tcp/target.rs` (request validation, payloads straight into registered
//! memory, reads straight out of it, refused writes drained, batched acks).
//!
//! One engine per process, with:
//! - `w`: a read-write region registered in the middle of a larger buffer, at odd offsets,
//!   with guard bytes all around it;
//! - `r`: a read-only region; `l`: a local-only region (not exported);
//! - `d`: a region registered and then deregistered (its rkey is stale; the engine handed its
//!   buffer back, and the harness still checks it).
//!
//! A raw initiator holds one control session open (raw frames: Hello → Welcome carries the
//! session id). Each input opens a data connection with a hello for that session (or a wrong
//! one), then sends a stream of write requests (with whole, short or missing payloads), read
//! requests, raw bytes and other frames; rkeys and addresses aim inside, at the edges of and
//! outside the regions. A 1-byte read of `w` is appended as a fence (it flushes batched acks).
//!
//! The stream is run through a model of the data handler, byte for byte. Invariants:
//! - the answers are the model's (all of them after an orderly close when the fence was
//!   served; a prefix otherwise, never shorter than up to the last read answer): every
//!   request in bounds of a region granting the access succeeds, every other one is refused;
//!   read payloads are the region's bytes;
//! - afterwards `w` holds exactly the model's bytes, every guard byte is intact, and `r`, `l`
//!   and `d` are unchanged: nothing outside a region that grants remote write is ever written;
//! - no panic; the engine closes the connection within 10 s of ours; the session survives;
//! - every 64th input a real client engine (tcp, then auto) writes and reads back 1 KiB of
//!   `w`, and the process's fd count stays bounded.
#![no_main]

use std::sync::Mutex;
use std::time::Duration;

use bytes::BytesMut;
use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::wire::{
    encode_data_req, Channel, DataReq, FrameHeader, Message, DATA_REQ_FRAME, HEADER_LEN,
};
use hixl_core::{Access, MemDesc, MemKind, Status};
use hixl_fuzz::{
    encode, generic_step, handshake, read_to_end, runtime, write_steps, FdWatch, Handshake, In,
    Prober, ReadEnd, Step, GENERIC_TAGS,
};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PEER: &str = "127.0.0.1:7";
const CLOSE_BOUND: Duration = Duration::from_secs(10);
/// Guard bytes around `w`.
const GUARD: u8 = 0xA5;
/// The buffer `w` lives in, and where in it.
const W_BUF: usize = 3 << 16;
const W_OFF: usize = (1 << 16) + 5;
const W_LEN: usize = (1 << 16) - 11;
/// Most bytes one input sends.
const STREAM_CAP: usize = 1 << 20;
/// Id of the fence read.
const FENCE: u64 = u64::MAX - 1;

/// A region as the harness sees it.
#[derive(Clone, Copy)]
struct Reg {
    addr: u64,
    len: u64,
    rkey: u64,
    access: Access,
}

impl Reg {
    fn of(r: &Region) -> Reg {
        Reg {
            addr: r.addr(),
            len: r.len(),
            rkey: r.rkey(),
            access: r.access(),
        }
    }
}

struct Ctx {
    engine: Engine,
    addr: String,
    /// The buffer `w` is registered in; never freed (the registration outlives everything).
    wbuf: HostBuffer,
    w: Reg,
    r: Reg,
    r_bytes: Vec<u8>,
    rbuf: Region,
    l: Reg,
    lbuf: Region,
    l_bytes: Vec<u8>,
    d: Reg,
    dbuf: HostBuffer,
    d_bytes: Vec<u8>,
    session: Handshake,
    probers: Vec<Prober>,
    inputs: u64,
    fds: FdWatch,
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_add((i as u8).wrapping_mul(7)))
        .collect()
}

async fn setup() -> Ctx {
    let engine = Engine::builder("127.0.0.1")
        .ephemeral_port()
        // The raw session sends no heartbeats: it must not be dropped for silence.
        .option("hixl.HeartbeatIntervalMs", "600000")
        .option("hixl.HeartbeatMissLimit", "100")
        .build()
        .await
        .expect("harness setup: target engine");
    let mut wbuf = HostBuffer::zeroed(W_BUF).expect("harness setup: buffer");
    wbuf.as_mut_slice().fill(GUARD);
    wbuf.as_mut_slice()[W_OFF..W_OFF + W_LEN].copy_from_slice(&pattern(W_LEN, 1));
    let wdesc = MemDesc::new(wbuf.as_ptr() as u64 + W_OFF as u64, W_LEN as u64);
    // SAFETY: `wbuf` lives in the context for the rest of the process, so the registered
    // range stays valid memory for as long as the engine exists.
    let w = unsafe { engine.register_raw(wdesc, MemKind::Host, Access::REMOTE_RW, Some("w")) }
        .expect("harness setup: register w");
    let mut rb = HostBuffer::zeroed(4096).expect("harness setup: buffer");
    let r_bytes = pattern(4096, 2);
    rb.as_mut_slice().copy_from_slice(&r_bytes);
    let rbuf = engine
        .register_with(rb, Access::REMOTE_READ, Some("r"))
        .expect("harness setup: register r");
    let mut lb = HostBuffer::zeroed(4096).expect("harness setup: buffer");
    let l_bytes = pattern(4096, 3);
    lb.as_mut_slice().copy_from_slice(&l_bytes);
    let lbuf = engine
        .register_with(lb, Access::LOCAL, Some("l"))
        .expect("harness setup: register l");
    let mut db = HostBuffer::zeroed(4096).expect("harness setup: buffer");
    let d_bytes = pattern(4096, 4);
    db.as_mut_slice().copy_from_slice(&d_bytes);
    let dreg = engine
        .register_with(db, Access::REMOTE_RW, Some("d"))
        .expect("harness setup: register d");
    let d = Reg::of(&dreg);
    let dbuf = engine
        .deregister(&dreg)
        .await
        .expect("harness setup: deregister d")
        .expect("harness setup: d's buffer handed back");
    let addr = engine.local_engine().to_string();
    let session = handshake(&addr, PEER).await;
    let probers = vec![
        Prober::new(&[("hixl.Transport", "tcp")]).await,
        Prober::new(&[]).await,
    ];
    Ctx {
        w: Reg::of(&w),
        r: Reg::of(&rbuf),
        l: Reg::of(&lbuf),
        engine,
        addr,
        wbuf,
        r_bytes,
        rbuf,
        lbuf,
        l_bytes,
        d,
        dbuf,
        d_bytes,
        session,
        probers,
        inputs: 0,
        fds: FdWatch::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// The input.

enum Hello {
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
fn plan(ctx: &Ctx, data: &[u8]) -> (Hello, Vec<Step>) {
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
        let tag = i.u8() % (3 + GENERIC_TAGS);
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
            t => generic_step(t - 3, &mut i),
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

// ---------------------------------------------------------------------------------------------
// The model of `tcp::target::serve_loop`.

#[derive(Debug, PartialEq, Eq)]
enum Resp {
    Ack { id: u64, ok: bool },
    Read { id: u64, ok: bool, payload: Vec<u8> },
}

#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// Clean EOF between requests.
    Eof,
    /// EOF inside a request header or a write payload.
    EofInside,
    /// A frame the handler refuses: it closes the connection.
    Protocol,
}

struct Model {
    resps: Vec<Resp>,
    stop: Stop,
    /// `w`'s bytes afterwards.
    w: Vec<u8>,
}

fn check(regs: &[Reg], req: &DataReq, need: Access) -> Option<Reg> {
    let r = regs.iter().find(|r| r.rkey == req.rkey)?;
    let end = req.addr.checked_add(req.len)?;
    (req.len > 0 && req.addr >= r.addr && end <= r.addr + r.len && r.access.contains(need))
        .then_some(*r)
}

fn model(ctx: &Ctx, stream: &[u8], w0: Vec<u8>) -> Model {
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
fn parse_answers(mut b: &[u8]) -> (Vec<Resp>, bool) {
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

// ---------------------------------------------------------------------------------------------

/// `w`'s bytes, and whether every guard byte around it is intact.
fn snapshot_w(ctx: &Ctx) -> (Vec<u8>, Option<usize>) {
    let all = ctx.wbuf.as_slice();
    let bad = all[..W_OFF]
        .iter()
        .chain(&all[W_OFF + W_LEN..])
        .position(|&b| b != GUARD);
    (all[W_OFF..W_OFF + W_LEN].to_vec(), bad)
}

fn check_memory(ctx: &Ctx, want_w: Option<&[u8]>, what: &str) {
    let (w, bad) = snapshot_w(ctx);
    if let Some(at) = bad {
        let off = if at < W_OFF { at } else { at + W_LEN };
        panic!(
            "invariant violated: guard byte at offset {off} of w's buffer (w is {W_OFF}..{}) was overwritten ({what})",
            W_OFF + W_LEN
        );
    }
    if let Some(want) = want_w {
        if w != want {
            let at = w.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            panic!(
                "invariant violated: w differs from the model's bytes from offset {at} ({what})"
            );
        }
    }
    let mut r = vec![0u8; 4096];
    ctx.rbuf
        .read_at(0, &mut r)
        .expect("harness setup: reading r");
    assert!(
        r == ctx.r_bytes,
        "invariant violated: the read-only region r was written ({what})"
    );
    let mut l = vec![0u8; 4096];
    ctx.lbuf
        .read_at(0, &mut l)
        .expect("harness setup: reading l");
    assert!(
        l == ctx.l_bytes,
        "invariant violated: the local-only region l was written ({what})"
    );
    assert!(
        ctx.dbuf.as_slice() == &ctx.d_bytes[..],
        "invariant violated: the deregistered region d was written ({what})"
    );
}

/// Fails if the engine closed the session's control connection; discards what it sent.
fn check_session(ctx: &Ctx) {
    let mut buf = [0u8; 4096];
    loop {
        match ctx.session.stream.try_read(&mut buf) {
            Ok(0) => panic!(
                "invariant violated: the engine closed the session's control connection after a data-connection input"
            ),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("invariant violated: the session's control connection failed: {e}"),
        }
    }
}

async fn run(ctx: &mut Ctx, data: &[u8]) {
    ctx.inputs += 1;
    check_session(ctx);
    let (hello, steps) = plan(ctx, data);
    let stream = hixl_fuzz::stream_bytes(&steps);
    let (w0, _) = snapshot_w(ctx);
    let m = model(ctx, &stream, w0.clone());

    let s = tokio::net::TcpStream::connect(&ctx.addr)
        .await
        .unwrap_or_else(|e| {
            panic!("invariant violated: the engine stopped accepting connections: {e}")
        });
    let _ = s.set_nodelay(true);
    let (mut rd, mut wr) = s.into_split();
    let (engine, session) = match &hello {
        Hello::Valid | Hello::WithData => (PEER, ctx.session.session),
        Hello::WrongSession(x) => (PEER, ctx.session.session ^ (*x).max(1)),
        Hello::WrongEngine => ("127.0.0.1:8", ctx.session.session),
    };
    let h = encode(&Message::Hello {
        engine: engine.into(),
        channel: Channel::Data,
        session,
    });
    let answers: usize = m
        .resps
        .iter()
        .map(|r| match r {
            Resp::Ack { .. } => 24,
            Resp::Read { payload, .. } => 32 + payload.len(),
        })
        .sum();
    let limit = answers + (1 << 20);
    let (accepted, rest) = match hello {
        Hello::WithData => {
            let mut all = vec![Step::Bytes(h)];
            all.extend(steps);
            let (wrote, (got, end)) = tokio::join!(
                write_steps(&mut wr, &all),
                read_to_end(&mut rd, limit, CLOSE_BOUND)
            );
            let end = hixl_fuzz::read_end(end, wrote);
            assert!(
                end != ReadEnd::Timeout,
                "invariant violated: the engine kept a data connection open {CLOSE_BOUND:?} after the initiator closed its side"
            );
            let mut b = BytesMut::from(&got[..]);
            match Message::decode(&mut b) {
                Ok(Some(Message::Welcome { .. })) => (true, Some((b.to_vec(), end))),
                Ok(Some(Message::Refuse { status, .. })) => {
                    assert_eq!(
                        status,
                        Status::NotConnected.code(),
                        "invariant violated: a refused data hello with status {status}"
                    );
                    (false, None)
                }
                other => panic!(
                    "invariant violated: a data hello (sent with requests) was answered with {other:?}"
                ),
            }
        }
        _ => {
            let _ = wr.write_all(&h).await;
            let mut b = BytesMut::new();
            let first = loop {
                match Message::decode(&mut b) {
                    Ok(Some(m)) => break Some(m),
                    Ok(None) => {}
                    Err(e) => panic!("invariant violated: malformed answer to a data hello: {e}"),
                }
                match tokio::time::timeout(CLOSE_BOUND, rd.read_buf(&mut b)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    Ok(_) => break None,
                    Err(_) => panic!(
                        "invariant violated: no answer to a data hello within {CLOSE_BOUND:?}"
                    ),
                }
            };
            match (&hello, first) {
                (Hello::Valid, Some(Message::Welcome { engine, session, .. })) => {
                    assert!(
                        engine == ctx.engine.local_engine()
                            && session == ctx.session.session
                            && b.is_empty(),
                        "invariant violated: the data welcome names {engine} / {session:#x} (+{} bytes)",
                        b.len()
                    );
                    let (wrote, (got, end)) = tokio::join!(
                        write_steps(&mut wr, &steps),
                        read_to_end(&mut rd, limit, CLOSE_BOUND)
                    );
                    let end = hixl_fuzz::read_end(end, wrote);
                    assert!(
                        end != ReadEnd::Timeout,
                        "invariant violated: the engine kept a data connection open {CLOSE_BOUND:?} after the initiator closed its side"
                    );
                    (true, Some((got, end)))
                }
                (Hello::Valid, other) => panic!(
                    "invariant violated: a valid data hello was answered with {other:?}"
                ),
                (_, Some(Message::Refuse { status, .. }))
                    if status == Status::NotConnected.code() =>
                {
                    (false, None)
                }
                (_, other) => panic!(
                    "invariant violated: a data hello with a wrong session or engine was answered with {other:?}"
                ),
            }
        }
    };

    if let (true, Some((got, end))) = (accepted, rest) {
        let (resps, whole) = parse_answers(&got);
        assert!(
            whole || end == ReadEnd::Reset,
            "invariant violated: the engine's data answers end inside a frame after an orderly close"
        );
        let prefix =
            resps.len() <= m.resps.len() && resps.iter().zip(&m.resps).all(|(a, b)| a == b);
        let last_read = m
            .resps
            .iter()
            .rposition(|r| matches!(r, Resp::Read { .. }))
            .map_or(0, |p| p + 1);
        let enough = end == ReadEnd::Reset || resps.len() >= last_read;
        // After a clean close the handler drops acks it had not flushed yet (a real initiator
        // never half-closes while it waits for them): all answers are due only when the last
        // request was a read (the fence, normally), which flushes the acks before it.
        let exact = end == ReadEnd::Eof
            && m.stop == Stop::Eof
            && matches!(m.resps.last(), Some(Resp::Read { .. }));
        let ok = prefix && enough && (!exact || resps.len() == m.resps.len());
        if !ok {
            let at = resps
                .iter()
                .zip(&m.resps)
                .position(|(a, b)| a != b)
                .unwrap_or(resps.len().min(m.resps.len()));
            panic!(
                "invariant violated: the engine's data answers differ from the handler's model (stop {:?}, {end:?}): {} answers, model {}; first difference at #{at}: got {:?}, want {:?}",
                m.stop,
                resps.len(),
                m.resps.len(),
                resps.get(at).map(short),
                m.resps.get(at).map(short),
            );
        }
        check_memory(ctx, Some(&m.w), "after a data-connection input");
    } else {
        check_memory(ctx, Some(&w0), "after a refused data hello");
    }

    if ctx.inputs % 64 == 1 {
        let which = ((ctx.inputs / 64) % ctx.probers.len() as u64) as usize;
        let addr = ctx.addr.clone();
        let (at, pat) = ctx.probers[which].check(&addr, "w").await;
        let (w, _) = snapshot_w(ctx);
        let off = (at - ctx.w.addr) as usize;
        assert!(
            w[off..off + pat.len()] == pat[..],
            "invariant violated: a normal write did not land in w"
        );
        check_memory(ctx, None, "after a normal client's write");
        ctx.fds.check();
    }
}

fn short(r: &Resp) -> String {
    match r {
        Resp::Ack { id, ok } => format!("Ack {{ id: {id}, ok: {ok} }}"),
        Resp::Read { id, ok, payload } => {
            format!("Read {{ id: {id}, ok: {ok}, {} bytes }}", payload.len())
        }
    }
}

static CTX: Mutex<Option<Ctx>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut g = CTX.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    if g.is_none() {
        *g = Some(rt.block_on(setup()));
    }
    if let Some(ctx) = g.as_mut() {
        rt.block_on(run(ctx, data));
    }
});
