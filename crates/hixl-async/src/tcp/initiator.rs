//! Initiator side of one TCP data connection: a writer task posts parts (request headers, and
//! for WRITE the payload straight from registered memory) and a reader task matches answers in
//! FIFO order, landing READ payloads straight into registered memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hixl_core::wire::{
    encode_data_req, DataReq, FrameHeader, Message, ACK_FRAME, DATA_REQ_FRAME, HEADER_LEN,
    READ_RESP_FRAME,
};
use hixl_core::{Error, Status, Token};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::completion::Completion;
use crate::context::OpsHandle;
use crate::frame_io::shutdown_both;
use crate::link_state::LinkState;
use crate::rawio::{self, PartRange, RawRange};
use crate::sink::Completions;
use crate::sync::lock;

/// One piece of a transfer on one connection. Its local bytes stay valid until it is
/// completed: the op table holds its op's lease ([`PartRange`]).
#[derive(Debug)]
pub(crate) struct Part {
    pub(crate) token: Token,
    pub(crate) write: bool,
    /// The part's local bytes.
    pub(crate) local: PartRange,
    pub(crate) req: DataReq,
}

/// Parts whose answer has not arrived, in the order they were sent; `None` once the reader
/// has stopped (then pushing fails the part instead). `pushed` wakes an idle reader.
///
/// A part in the queue belongs to the reader, which completes it; a write part is queued only
/// once its payload is sent, so that nobody completes it (and lets its op be reaped) while
/// the socket still reads its memory.
#[derive(Debug)]
struct Queue {
    parts: Mutex<Option<VecDeque<Part>>>,
    pushed: tokio::sync::Notify,
}

type Inflight = Arc<Queue>;

impl std::ops::Deref for Queue {
    type Target = Mutex<Option<VecDeque<Part>>>;
    fn deref(&self) -> &Self::Target {
        &self.parts
    }
}

/// Acks read per syscall at most.
const ACK_BATCH: usize = 64;
/// Read headers coalesced into one write.
const READ_REQ_BATCH: usize = 64;

/// One op's parts for one connection, and the link's count of withdrawals when they were
/// submitted (see [`send_batch`]).
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) parts: Vec<Part>,
    pub(crate) withdrawals: u64,
}

/// Handle to a running data connection.
#[derive(Debug, Clone)]
pub(crate) struct DataConn {
    tx: mpsc::UnboundedSender<Queued>,
}

impl DataConn {
    /// Starts the writer and reader tasks of an established data connection. `withdrawals`
    /// counts the link's withdrawn ops (`TcpChannel::withdraw`).
    pub(crate) fn spawn(
        stream: TcpStream,
        peer: Arc<str>,
        ops: OpsHandle,
        state: Arc<LinkState>,
        withdrawals: Arc<AtomicU64>,
    ) -> DataConn {
        let (r, w) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let inflight: Inflight = Arc::new(Queue {
            parts: Mutex::new(Some(VecDeque::new())),
            pushed: tokio::sync::Notify::new(),
        });
        state.spawn(writer(
            w,
            rx,
            inflight.clone(),
            ops.clone(),
            state.clone(),
            peer.clone(),
            withdrawals,
        ));
        state.clone().spawn(reader(r, inflight, ops, state, peer));
        DataConn { tx }
    }

    /// Queues parts of one op. On a dead connection they come back to be failed.
    pub(crate) fn submit(&self, q: Queued) -> Result<(), Vec<Part>> {
        self.tx.send(q).map_err(|e| e.0.parts)
    }
}

/// Completes `parts` with `err`.
pub(crate) fn fail_with(sink: &Completions, parts: impl IntoIterator<Item = Part>, err: &Error) {
    sink.complete_all(parts.into_iter().map(|p| Completion {
        token: p.token,
        result: Err(err.clone()),
    }));
}

fn fail_parts(ops: &OpsHandle, parts: impl IntoIterator<Item = Part>, err: &Error) {
    fail_with(&ops.sink, parts, err);
}

fn lost(peer: &str, cause: &'static str) -> Error {
    Error::PeerLost {
        peer: peer.to_string(),
        cause: cause.to_string(),
    }
}

async fn writer(
    mut w: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    inflight: Inflight,
    ops: OpsHandle,
    state: Arc<LinkState>,
    peer: Arc<str>,
    withdrawals: Arc<AtomicU64>,
) {
    let mut live = Live {
        dead: state.subscribe(),
        state: &state,
    };
    let mut hdrs: Vec<u8> = Vec::with_capacity(READ_REQ_BATCH * DATA_REQ_FRAME);
    loop {
        let batch = tokio::select! {
            biased;
            _ = live.dead.changed() => break,
            b = rx.recv() => match b { Some(b) => b, None => break },
        };
        let sent = send_batch(
            &mut w,
            &mut live,
            batch,
            &inflight,
            &ops,
            &peer,
            &mut hdrs,
            &withdrawals,
        );
        if let Err(e) = sent.await {
            state.kill(e);
            break;
        }
    }
    shutdown_both(w.as_ref());
    rx.close();
    let err = state.error().unwrap_or_else(|| lost(&peer, "link closed"));
    while let Ok(batch) = rx.try_recv() {
        fail_parts(&ops, batch.parts, &err);
    }
}

/// The writer's view of its link's liveness.
struct Live<'a> {
    dead: watch::Receiver<bool>,
    state: &'a LinkState,
}

impl Live<'_> {
    /// `e`, unless the link is already down: then the link's cause (an op cut off by our own
    /// disconnect reports NOT_CONNECTED like the others, not the socket error it caused).
    fn cause(&self, e: Error) -> Error {
        self.state.error().unwrap_or(e)
    }
}

/// Sends one op's parts. Returns an error only when the connection is unusable; parts not
/// yet handed to the reader's queue are failed here.
///
/// Every socket write races the link's death: a peer that stopped reading (frozen, or the
/// network cut) must not keep this task blocked in a full socket buffer after the link was
/// closed, or the link's in-flight parts would never fail and their ops never be reaped.
///
/// A dropped or timed-out transfer moves no further bytes. Its withdrawal takes the one path
/// of every transport (the op table abandons the op, then the link's channels withdraw it):
/// the TCP channel counts it in `withdrawals`. Before each part this task compares the count
/// with the one it last saw (the batch's, taken when it was submitted, before its op could
/// be abandoned) and only when it moved asks the op table whether the op is still wanted. So
/// without withdrawals a part costs one atomic load and no lock; an unwanted op's unsent parts
/// complete as cancelled, and the op can be reaped.
#[allow(clippy::too_many_arguments)]
async fn send_batch(
    w: &mut OwnedWriteHalf,
    live: &mut Live<'_>,
    batch: Queued,
    inflight: &Inflight,
    ops: &OpsHandle,
    peer: &str,
    hdrs: &mut Vec<u8>,
    withdrawals: &AtomicU64,
) -> Result<(), Error> {
    let Queued {
        parts: batch,
        withdrawals: mut seen,
    } = batch;
    let Some(token) = batch.first().map(|p| p.token) else {
        return Ok(());
    };
    // The op table is locked only after the count moved: the abandon, made under that lock
    // before the count was bumped, is then seen.
    let mut withdrawn = || {
        let now = withdrawals.load(Ordering::Acquire);
        if now == seen {
            return false;
        }
        seen = now;
        !lock(&ops.table).is_wanted(token)
    };
    let cancelled = || Error::Cancelled { what: "a TCP part" };
    let mut it = batch.into_iter();
    while let Some(part) = it.next() {
        if withdrawn() {
            // Failed before the flush, whose error would otherwise leave them unresolved.
            fail_parts(ops, std::iter::once(part).chain(it), &cancelled());
            return flush(w, live, hdrs, peer).await;
        }
        let hdr = encode_data_req(part.write, &part.req);
        if part.write {
            // SAFETY: the part is not completed while the socket reads it: it is queued for
            // the reader (which completes it) only after the send, and fails here otherwise.
            let payload = unsafe { part.local.raw() };
            let r = send_part(w, live, hdrs, &hdr, payload).await;
            if let Err(e) = r {
                // The parts not yet queued for the reader would never complete otherwise.
                let e = live.cause(Error::connection_lost(peer, "sending a write part", e));
                fail_parts(ops, std::iter::once(part).chain(it), &e);
                return Err(e);
            }
            // Its ack may already be in the socket: the reader waits for the push (the
            // queue keeps the order the requests were sent in, as the answers come).
            if let Err(p) = push(inflight, part) {
                return Err(fail_rest(ops, peer, p, it));
            }
        } else {
            if let Err(p) = push(inflight, part) {
                let e = fail_rest(ops, peer, p, it);
                let _ = flush(w, live, hdrs, peer).await;
                return Err(e);
            }
            hdrs.extend_from_slice(&hdr);
            if hdrs.len() >= READ_REQ_BATCH * DATA_REQ_FRAME {
                if let Err(e) = flush(w, live, hdrs, peer).await {
                    fail_parts(ops, it, &e);
                    return Err(e);
                }
            }
        }
    }
    flush(w, live, hdrs, peer).await
}

fn push(inflight: &Inflight, part: Part) -> Result<(), Part> {
    let mut g = lock(inflight);
    match g.as_mut() {
        Some(q) => {
            q.push_back(part);
            drop(g);
            inflight.pushed.notify_one();
            Ok(())
        }
        None => Err(part),
    }
}

fn fail_rest(ops: &OpsHandle, peer: &str, p: Part, rest: impl Iterator<Item = Part>) -> Error {
    let e = lost(peer, "data connection closed");
    fail_parts(ops, std::iter::once(p).chain(rest), &e);
    e
}

async fn flush(
    w: &mut OwnedWriteHalf,
    live: &mut Live<'_>,
    hdrs: &mut Vec<u8>,
    peer: &str,
) -> Result<(), Error> {
    if hdrs.is_empty() {
        return Ok(());
    }
    let r = write_or_dead(w, &mut live.dead, hdrs, RawRange::empty()).await;
    hdrs.clear();
    r.map_err(|e| live.cause(Error::connection_lost(peer, "sending part headers", e)))
}

/// Sends a write part's header (after the read headers waiting in `hdrs`, which it empties)
/// and its payload, racing the link's death.
async fn send_part(
    w: &mut OwnedWriteHalf,
    live: &mut Live<'_>,
    hdrs: &mut Vec<u8>,
    hdr: &[u8],
    payload: RawRange<'_>,
) -> std::io::Result<()> {
    if hdrs.is_empty() {
        write_or_dead(w, &mut live.dead, hdr, payload).await
    } else {
        hdrs.extend_from_slice(hdr);
        let r = write_or_dead(w, &mut live.dead, hdrs, payload).await;
        hdrs.clear();
        r
    }
}

/// [`rawio::send_all`] of `head` then `payload`, abandoned when the link dies (the socket is
/// shut down after that anyway).
async fn write_or_dead(
    w: &mut OwnedWriteHalf,
    dead: &mut watch::Receiver<bool>,
    head: &[u8],
    payload: RawRange<'_>,
) -> std::io::Result<()> {
    if *dead.borrow() {
        return Err(std::io::Error::other("link closed"));
    }
    tokio::select! {
        r = rawio::send_all(w.as_ref(), head, payload) => r,
        _ = dead.changed() => Err(std::io::Error::other("link closed while sending")),
    }
}

async fn reader(
    mut r: OwnedReadHalf,
    inflight: Inflight,
    ops: OpsHandle,
    state: Arc<LinkState>,
    peer: Arc<str>,
) {
    // No select on link death here: a read cancelled half-way would lose the part it popped.
    // The writer shuts the socket down on death, which ends any read in progress with an error.
    if let Err(e) = read_loop(&mut r, &inflight, &ops, &state, &peer).await {
        if !state.is_dead() {
            tracing::warn!(peer = %peer, "data connection failed: {e}");
        }
        state.kill(e);
    }
    let parts = lock(&inflight).take().unwrap_or_default();
    let err = state.error().unwrap_or_else(|| lost(&peer, "link closed"));
    fail_parts(&ops, parts, &err);
}

enum Next {
    Idle,
    Acks(usize),
    ReadResp,
}

fn next_expected(inflight: &Inflight) -> Option<Next> {
    let g = lock(inflight);
    let q = g.as_ref()?;
    Some(match q.front() {
        None => Next::Idle,
        Some(p) if p.write => Next::Acks(q.iter().take(ACK_BATCH).take_while(|p| p.write).count()),
        Some(_) => Next::ReadResp,
    })
}

fn pop(inflight: &Inflight) -> Option<Part> {
    lock(inflight).as_mut()?.pop_front()
}

fn protocol(peer: &str, reason: impl Into<String>) -> Error {
    Error::Protocol {
        peer: peer.to_string(),
        reason: reason.into(),
    }
}

fn refused(peer: &str, p: &Part, status: u32) -> Error {
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

fn decode_answer(frame: &[u8], peer: &str) -> Result<Message, Error> {
    let h = FrameHeader::decode(frame).map_err(|e| protocol(peer, e.to_string()))?;
    let body = frame
        .get(HEADER_LEN..HEADER_LEN + h.body_len as usize)
        .ok_or_else(|| protocol(peer, "answer frame of unexpected size"))?;
    Message::decode_body(h.ty, body).map_err(|e| protocol(peer, e.to_string()))
}

fn take_acks(
    frames: &[u8],
    inflight: &Inflight,
    ops: &OpsHandle,
    peer: &str,
    done: &mut Vec<Completion>,
) -> Result<(), Error> {
    for frame in frames.chunks_exact(ACK_FRAME) {
        let Message::Ack { id, status } = decode_answer(frame, peer)? else {
            return Err(protocol(peer, "expected an ack for a write"));
        };
        let p = pop(inflight).ok_or_else(|| protocol(peer, "ack with no write outstanding"))?;
        if id != p.req.id || !p.write {
            let e = protocol(
                peer,
                format!("ack for request {id:#x}, expected {:#x}", p.req.id),
            );
            fail_parts(ops, [p], &e);
            return Err(e);
        }
        let result = if status == 0 {
            Ok(())
        } else {
            Err(refused(peer, &p, status))
        };
        done.push(Completion {
            token: p.token,
            result,
        });
    }
    Ok(())
}

async fn read_loop(
    r: &mut OwnedReadHalf,
    inflight: &Inflight,
    ops: &OpsHandle,
    state: &LinkState,
    peer: &str,
) -> Result<(), Error> {
    let mut dead = state.subscribe();
    let mut buf = [0u8; ACK_FRAME * ACK_BATCH];
    let mut have = 0usize;
    let mut done: Vec<Completion> = Vec::with_capacity(ACK_BATCH);
    loop {
        match next_expected(inflight) {
            None => return Ok(()),
            Some(Next::Idle) => {
                // Answers only follow requests, and a request is queued before the next one is
                // sent: with nothing queued, wait for the writer (no socket syscall). A peer
                // that closes meanwhile is seen by the control channel (which kills the link)
                // or by the next read; bytes it sends unasked fail the next answer's checks.
                tokio::select! {
                    _ = inflight.pushed.notified() => {}
                    _ = dead.changed() => return Ok(()),
                }
            }
            Some(Next::Acks(n)) => {
                let want = n * ACK_FRAME;
                let got = r
                    .read(&mut buf[have..want])
                    .await
                    .map_err(|e| Error::connection_lost(peer, "reading write acks", e))?;
                if got == 0 {
                    return Err(lost(peer, "connection closed by peer"));
                }
                have += got;
                let whole = have / ACK_FRAME;
                let res = take_acks(&buf[..whole * ACK_FRAME], inflight, ops, peer, &mut done);
                // Completions already matched are delivered even if a later frame was bad.
                ops.sink.complete_all(done.drain(..));
                res?;
                buf.copy_within(whole * ACK_FRAME..have, 0);
                have -= whole * ACK_FRAME;
            }
            Some(Next::ReadResp) => {
                let mut frame = [0u8; READ_RESP_FRAME];
                r.read_exact(&mut frame)
                    .await
                    .map_err(|e| Error::connection_lost(peer, "reading a read response", e))?;
                let m = decode_answer(&frame, peer)?;
                let Message::ReadResp { id, status, len } = m else {
                    return Err(protocol(peer, "expected a read response"));
                };
                let p = pop(inflight)
                    .ok_or_else(|| protocol(peer, "read response with no read outstanding"))?;
                if id != p.req.id || p.write {
                    let e = protocol(
                        peer,
                        format!("read response for {id:#x}, expected {:#x}", p.req.id),
                    );
                    fail_parts(ops, [p], &e);
                    return Err(e);
                }
                if status != 0 {
                    if len != 0 {
                        // The part was popped: fail it here, or its op would wait forever.
                        let e = protocol(peer, "refused read carries a payload");
                        fail_parts(ops, [p], &e);
                        return Err(e);
                    }
                    let e = refused(peer, &p, status);
                    ops.sink.complete(Completion {
                        token: p.token,
                        result: Err(e),
                    });
                    continue;
                }
                if len != p.req.len {
                    let e = protocol(
                        peer,
                        format!("read response of {len} bytes, asked {}", p.req.len),
                    );
                    fail_parts(ops, [p], &e);
                    return Err(e);
                }
                // SAFETY: `p` was popped: only this task completes it, after the receive.
                let dst = unsafe { p.local.raw() };
                let got = rawio::recv_exact(r.as_ref(), dst).await;
                if let Err(e) = got {
                    // If the link was closed (our own disconnect shuts the socket down), the
                    // part fails with the link's cause like every other part of the link.
                    let e = state.error().unwrap_or_else(|| {
                        Error::connection_lost(peer, "receiving a read payload", e)
                    });
                    fail_parts(ops, [p], &e);
                    return Err(e);
                }
                ops.sink.complete(Completion {
                    token: p.token,
                    result: Ok(()),
                });
            }
        }
    }
}
