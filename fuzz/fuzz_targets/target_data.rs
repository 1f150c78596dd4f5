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

#[path = "target_data/checks.rs"]
mod checks;
#[path = "target_data/model.rs"]
mod model;
#[path = "target_data/plan.rs"]
mod plan;
#[path = "target_data/setup.rs"]
mod setup;

use std::sync::Mutex;
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, Message};
use hixl_core::Status;
use hixl_fuzz::{encode, read_to_end, runtime, write_steps, ReadEnd, Step};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use checks::{check_memory, check_session, snapshot_w};
use model::{model, parse_answers, short, Resp, Stop};
use plan::{plan, Hello};
use setup::{setup, Ctx};

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
        features: hixl_core::wire::FEATURES,
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
