//! Target side of one TCP data connection: validates each request against the region table
//! (rkey, bounds, access) before a byte moves, then moves bytes directly between the socket
//! and registered memory.

use std::sync::Arc;

use hixl_core::wire::{
    encode_ack, encode_read_resp, ty, DataReq, FrameHeader, Message, StridedReq, DATA_REQ_BODY,
    HEADER_LEN, STRIDED_REQ_BODY,
};
use hixl_core::{Access, Error};
use tokio::net::TcpStream;

use crate::context::{EngineConfig, Regions, TARGET_SPINNERS};
use crate::memory::Lease;
use crate::rawio::{self, Piece, Sock};
use crate::stage::{self, Stage};

/// Answers (acks, read responses) gathered before a forced flush: frames, read payloads and
/// their bytes.
const ANSWER_FRAMES: usize = 64;
const ANSWER_READS: usize = 64;
const ANSWER_BYTES: u64 = 256 << 10;

/// Answers not yet sent, in request order: their frames concatenated, and each read payload
/// (with the lease that keeps its region registered until it is out) after its header. They
/// go out in one gathered `sendmsg` once no next request is waiting, or a bound is reached:
/// a batch of small requests is answered by one syscall instead of one per request.
#[derive(Default)]
struct Answers {
    frames: Vec<u8>,
    /// Each read payload: where its header ends in `frames`, its lease, and its pieces.
    reads: Vec<(usize, Lease, Pieces)>,
    count: usize,
    bytes: u64,
}

/// A read's payload at the target: `count` pieces of `len` bytes, `stride` apart from `addr`
/// (one piece for a plain read).
#[derive(Clone, Copy)]
struct Pieces {
    addr: u64,
    len: u64,
    stride: u64,
    count: u64,
}

/// Iovecs of one answer `sendmsg` at most.
const ANSWER_IOV: usize = 2 * ANSWER_READS + 1;

impl Answers {
    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    fn push(&mut self, frame: &[u8]) {
        self.frames.extend_from_slice(frame);
        self.count += 1;
    }

    fn push_read(&mut self, frame: &[u8], lease: Lease, p: Pieces) {
        self.push(frame);
        self.reads.push((self.frames.len(), lease, p));
        self.bytes += p.len * p.count;
    }

    fn full(&self) -> bool {
        self.count >= ANSWER_FRAMES
            || self.reads.len() >= ANSWER_READS
            || self.bytes >= ANSWER_BYTES
    }

    /// Sends every answer, then lets the leases go.
    async fn flush(&mut self, sock: &mut Sock) -> Result<(), Error> {
        if self.is_empty() {
            return Ok(());
        }
        {
            // Header runs and payload pieces in order, at most ANSWER_IOV per sendmsg (a
            // strided read's pieces may take several).
            let mut pieces = [Piece::Head(&[]); ANSWER_IOV];
            let mut n = 0;
            let mut at = 0;
            for (end, lease, p) in &self.reads {
                if n == ANSWER_IOV {
                    send_answers(sock, &pieces[..n]).await?;
                    n = 0;
                }
                pieces[n] = Piece::Head(&self.frames[at..*end]);
                n += 1;
                at = *end;
                // Back-to-back pieces go out as one range.
                let p = if p.stride == p.len {
                    Pieces {
                        len: p.len * p.count,
                        stride: p.len * p.count,
                        count: 1,
                        ..*p
                    }
                } else {
                    *p
                };
                for i in 0..p.count {
                    if n == ANSWER_IOV {
                        send_answers(sock, &pieces[..n]).await?;
                        n = 0;
                    }
                    // validate checked every piece lies inside the region, which grants
                    // remote read; the range borrows the lease, which keeps the region
                    // registered (and its memory alive) until the payload is handed to the
                    // socket.
                    pieces[n] = Piece::Body(lease.range(p.addr + i * p.stride, p.len)?);
                    n += 1;
                }
            }
            if n == ANSWER_IOV {
                send_answers(sock, &pieces[..n]).await?;
                n = 0;
            }
            pieces[n] = Piece::Head(&self.frames[at..]);
            send_answers(sock, &pieces[..=n]).await?;
        }
        self.frames.clear();
        self.reads.clear();
        self.count = 0;
        self.bytes = 0;
        Ok(())
    }
}

async fn send_answers(sock: &mut Sock, pieces: &[Piece<'_>]) -> Result<(), Error> {
    rawio::send_pieces(sock, pieces)
        .await
        .map_err(|e| io("writing answers", e))
}

/// Serves one data connection until the peer closes it or sends something invalid.
///
/// Between requests, and while a write's payload streams in, it spins on nonblocking receives
/// for `spin` (`hixl.SpinUs`) after the last bytes came before it parks: an initiator that
/// sends its next request within that time is served without a wake-up of this thread.
/// At most `TARGET_SPINNERS` connections of the engine spin at once; the others park at once.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: Arc<str>,
    regions: Regions,
    config: Arc<EngineConfig>,
    served: Arc<crate::served::PeerServed>,
) {
    let mut sock = match Sock::new(stream) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(peer = %peer, "cannot take a data connection out of the reactor: {e}");
            return;
        }
    };
    let mut answers = Answers::default();
    let r = serve_loop(&mut sock, &peer, &regions, &config, &mut answers, &served).await;
    if r.is_err() {
        // What was answered before the stream went bad still goes out (as when each read
        // was answered at once), if the socket takes it.
        let _ = answers.flush(&mut sock).await;
    }
    match r {
        Ok(()) => tracing::debug!(peer = %peer, "data connection closed"),
        // A peer that breaks the protocol is worth a warning; one that went away (reset,
        // broken pipe: an initiator disconnecting mid-read, or dying) is not.
        Err(e @ hixl_core::Error::Protocol { .. }) => {
            tracing::warn!(peer = %peer, "closing data connection: {e}")
        }
        Err(e) => tracing::debug!(peer = %peer, "closing data connection: {e}"),
    }
}

fn validate(regions: &Regions, req: &DataReq, need: Access) -> Result<Lease, Error> {
    let regions = crate::sync::lock(regions);
    let e = regions.check_remote(req.rkey, req.addr, req.len, need)?;
    Ok(Lease::new(&e.data))
}

/// Checks a strided request once, by the span of its pieces: pieces may not overlap and the
/// span must lie in one region with the access.
fn validate_strided(regions: &Regions, req: &StridedReq, need: Access) -> Result<Lease, Error> {
    if req.count > 1 && req.stride < req.len {
        return Err(Error::InvalidParam {
            what: format!(
                "strided request: stride {} shorter than its pieces of {} bytes",
                req.stride, req.len
            ),
        });
    }
    let span = hixl_core::strided_span(req.len, req.stride, req.count).ok_or_else(|| {
        Error::InvalidParam {
            what: format!(
                "strided request: {} pieces of {} bytes, stride {}, overflow",
                req.count, req.len, req.stride
            ),
        }
    })?;
    let regions = crate::sync::lock(regions);
    let e = regions.check_remote(req.rkey, req.addr, span, need)?;
    Ok(Lease::new(&e.data))
}

/// A decoded data request, plain or strided.
enum Req {
    Plain(DataReq),
    Strided(StridedReq),
}

/// Stages a whole request header, flushing gathered answers before blocking for it: `false`
/// on a clean close between requests.
async fn next_request(
    sock: &mut Sock,
    answers: &mut Answers,
    stage: &mut Stage,
    config: &EngineConfig,
) -> Result<bool, Error> {
    let reading = |e| io("reading request", e);
    let fd = sock.fd();
    // A whole frame: its header says how long (a strided request's is the longest).
    while stage.len() < frame_len(stage.bytes()) {
        if !answers.is_empty() {
            // No next request waiting: the gathered answers go out before we wait for one.
            match stage.recv_now(fd, None) {
                Ok(g) if g.is_eof() => return closed(stage.len()).map_err(reading),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    answers.flush(sock).await?;
                }
                Err(e) => return Err(reading(e)),
            }
        }
        // Answers are out (the initiator waits for them): spin for the next request a while,
        // if no other connection of the engine spins, then wait on readiness. The spinning
        // slot is given back when the spin ends: a connection parked (idle) holds none.
        let slot = SpinSlot::take(config);
        let quiet = if slot.is_some() {
            config.spin
        } else {
            std::time::Duration::ZERO
        };
        let spun = stage::recv_spinning(sock, stage, None, quiet)
            .await
            .map_err(reading)?;
        drop(slot);
        let g = match spun {
            Some(g) => g,
            None => stage::recv_parked(sock, stage, None)
                .await
                .map_err(reading)?,
        };
        if g.is_eof() {
            return closed(stage.len()).map_err(reading);
        }
    }
    Ok(true)
}

/// Bytes of the request frame starting `b`, as far as its header is in: the header alone
/// until it is, then the whole frame (a body longer than a strided request's is refused once
/// the header is decoded).
fn frame_len(b: &[u8]) -> usize {
    if b.len() < HEADER_LEN {
        return HEADER_LEN;
    }
    match FrameHeader::decode(&b[..HEADER_LEN]) {
        Ok(h) if (h.body_len as usize) <= STRIDED_REQ_BODY => HEADER_LEN + h.body_len as usize,
        // Bad or too long: the header alone, for the caller to refuse.
        _ => HEADER_LEN,
    }
}

/// One of the engine's [`TARGET_SPINNERS`] spinning slots, given back when dropped.
struct SpinSlot<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> SpinSlot<'a> {
    fn take(config: &'a EngineConfig) -> Option<SpinSlot<'a>> {
        use std::sync::atomic::Ordering;
        if config.spin.is_zero() {
            return None;
        }
        let n = &config.target_spinners;
        if n.fetch_add(1, Ordering::AcqRel) >= TARGET_SPINNERS {
            n.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(SpinSlot(n))
    }
}

impl Drop for SpinSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

fn closed(have: usize) -> std::io::Result<bool> {
    if have == 0 {
        Ok(false)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed inside a request header",
        ))
    }
}

fn io(context: &str, e: std::io::Error) -> Error {
    Error::io(context.to_string(), e)
}

async fn serve_loop(
    sock: &mut Sock,
    peer: &str,
    regions: &Regions,
    config: &EngineConfig,
    answers: &mut Answers,
    served: &crate::served::PeerServed,
) -> Result<(), Error> {
    let mut stage = Stage::default();
    loop {
        if answers.full() {
            answers.flush(sock).await?;
        }
        if !next_request(sock, answers, &mut stage, config).await? {
            // The initiator closed between requests: what it asked is answered first.
            answers.flush(sock).await?;
            return Ok(());
        }
        let proto = |reason: String| Error::Protocol {
            peer: peer.to_string(),
            reason,
        };
        let h =
            FrameHeader::decode(&stage.bytes()[..HEADER_LEN]).map_err(|e| proto(e.to_string()))?;
        let body = h.body_len as usize;
        let expected = match h.ty {
            ty::WRITE_REQ | ty::READ_REQ => DATA_REQ_BODY,
            ty::WRITE_STRIDED_REQ | ty::READ_STRIDED_REQ => STRIDED_REQ_BODY,
            _ => usize::MAX,
        };
        if body != expected {
            return Err(proto(format!(
                "data request frame type {} with body of {} bytes",
                h.ty, h.body_len
            )));
        }
        let msg = Message::decode_body(h.ty, &stage.bytes()[HEADER_LEN..HEADER_LEN + body])
            .map_err(|e| proto(e.to_string()))?;
        stage.consume(HEADER_LEN + body);
        let (write, req) = match msg {
            Message::WriteReq(r) => (true, Req::Plain(r)),
            Message::ReadReq(r) => (false, Req::Plain(r)),
            Message::WriteStridedReq(r) => (true, Req::Strided(r)),
            Message::ReadStridedReq(r) => (false, Req::Strided(r)),
            other => return Err(proto(format!("unexpected {other:?} on a data connection"))),
        };
        let need = if write {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        let (id, pieces, checked) = match req {
            Req::Plain(r) => (
                r.id,
                Pieces {
                    addr: r.addr,
                    len: r.len,
                    stride: r.len,
                    count: 1,
                },
                validate(regions, &r, need),
            ),
            Req::Strided(r) => (
                r.id,
                Pieces {
                    addr: r.addr,
                    len: r.len,
                    stride: r.stride,
                    count: r.count,
                },
                validate_strided(regions, &r, need),
            ),
        };
        // The decoder bounds len × count by MAX_PAYLOAD.
        let total = pieces.len * pieces.count;
        if write {
            if !answers.reads.is_empty() {
                // A read asked before this write sees the bytes from before it: its payload
                // goes out before the write's lands.
                answers.flush(sock).await?;
            }
            // Back-to-back pieces land as one range.
            let pieces = if pieces.stride == pieces.len {
                Pieces {
                    len: total,
                    stride: total,
                    count: 1,
                    ..pieces
                }
            } else {
                pieces
            };
            let status = match checked {
                Ok(lease) => {
                    for i in 0..pieces.count {
                        // validate checked every piece lies inside the region, which grants
                        // remote write; the range borrows `lease`, which keeps the region
                        // registered (and its memory alive) until the payload is in.
                        let dst = lease.range(pieces.addr + i * pieces.stride, pieces.len)?;
                        stage::recv_exact(sock, &mut stage, dst, config.spin)
                            .await
                            .map_err(|e| io("reading write payload", e))?;
                    }
                    drop(lease);
                    served.served(true, total);
                    0
                }
                Err(e) => {
                    tracing::info!(peer, "refused write {:#x}+{total}: {e}", pieces.addr);
                    served.refused(true, e.status().name());
                    discard(sock, &mut stage, total)
                        .await
                        .map_err(|e| io("draining refused payload", e))?;
                    e.status().code()
                }
            };
            answers.push(&encode_ack(id, status));
        } else {
            match checked {
                Ok(lease) => {
                    served.served(false, total);
                    answers.push_read(&encode_read_resp(id, 0, total), lease, pieces)
                }
                Err(e) => {
                    tracing::info!(peer, "refused read {:#x}+{total}: {e}", pieces.addr);
                    served.refused(false, e.status().name());
                    answers.push(&encode_read_resp(id, e.status().code(), 0));
                }
            }
        }
    }
}

/// Reads and discards a refused write's payload, keeping the stream in sync.
async fn discard(sock: &mut Sock, stage: &mut Stage, mut len: u64) -> std::io::Result<()> {
    loop {
        let n = len.min(stage.len() as u64);
        stage.consume(n as usize);
        len -= n;
        if len == 0 {
            return Ok(());
        }
        let g = stage::recv_staged(sock, stage, None, std::time::Duration::ZERO).await?;
        if g.is_eof() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed inside a refused payload",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use hixl_core::RegionTable;

    use super::serve;
    use crate::context::{EngineConfig, Heartbeat};

    fn config(spin: Duration) -> Arc<EngineConfig> {
        Arc::new(EngineConfig {
            name: "127.0.0.1".into(),
            heartbeat: Heartbeat {
                interval: Duration::from_secs(1),
                miss_limit: 3,
                idle: None,
            },
            auth: None,
            spin,
            target_spinners: std::sync::atomic::AtomicUsize::new(0),
            tcp_io: hixl_core::options::TcpIo::Epoll,
            tcp_io_refused: None,
        })
    }

    /// A connection that spun for its next request and then parked (an idle link) gives its
    /// spinning slot back: another connection of the engine spins for its requests instead of
    /// paying a wake-up each (it held the engine's only slot for as long as it stayed idle).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_parked_connection_holds_no_spinning_slot() {
        let config = config(Duration::from_millis(50));
        let regions = Arc::new(Mutex::new(RegionTable::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let task = tokio::spawn(serve(
            server,
            "test".into(),
            regions,
            config.clone(),
            Arc::default(),
        ));
        // It takes the slot at once (waiting for its first request), spins 50 ms and parks.
        let mut held = false;
        for _ in 0..2000 {
            held |= config.target_spinners.load(Ordering::Acquire) == 1;
            if held && config.target_spinners.load(Ordering::Acquire) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(held, "the connection never spun");
        assert_eq!(
            config.target_spinners.load(Ordering::Acquire),
            0,
            "a parked connection still holds the spinning slot"
        );
        assert!(!task.is_finished(), "the connection is still served");
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
