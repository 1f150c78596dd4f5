//! Initiator side of one TCP data connection, run to completion.
//!
//! A connection has two halves, each a nonblocking state machine under its own lock:
//! - [`Tx`]: the parts not yet (wholly) sent: request headers, and for WRITE the payload
//!   straight from registered memory;
//! - [`Rx`]: the parts sent and awaiting their answer, in the order they were sent, matched
//!   as answers come (READ payloads land straight in registered memory).
//!
//! Whoever gets there first drives them, with nonblocking syscalls:
//! - the submitting task sends its op's parts itself when the connection is free (nothing
//!   queued before them): no hand-off to another task for a small op;
//! - the task awaiting a transfer pumps both halves while it spins ([`DataConn::progress`],
//!   called from `Transfer::poll` for a bounded quiet period);
//! - the connection's two tasks take over only when the socket blocks: the writer when the
//!   send buffer is full, the reader when answers are awaited and nobody spins. They wait on
//!   tokio's readiness, so an idle connection costs nothing.
//!
//! Lock order: `tx` before `rx` (a part moves from one to the other under both, so the answer
//! queue keeps the order requests went out in). Completions are delivered after the locks
//! are released.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use hixl_core::wire::{
    encode_data_req, encode_strided_req, DataReq, FrameHeader, Message, StridedReq, ACK_FRAME,
    DATA_REQ_FRAME, HEADER_LEN, READ_RESP_FRAME, STRIDED_REQ_FRAME,
};
use hixl_core::{Error, Status, Token};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::gather::{GATHER_BYTES, GATHER_PARTS};
use super::uring::{Piece, Uring};
use crate::completion::Completion;
use crate::context::OpsHandle;
use crate::link_state::LinkState;
use crate::rawio::{self, PartRange, Watched};
use crate::sink::Completions;
use crate::stage::{Stage, MAX_SCATTER};
use crate::sync::lock;

/// One piece of a transfer on one connection. Its local bytes stay valid until it is
/// completed: the op table holds its op's lease ([`PartRange`]).
#[derive(Debug)]
pub(crate) struct Part {
    pub(crate) token: Token,
    pub(crate) write: bool,
    /// The part's local bytes.
    pub(crate) local: PartRange,
    /// `len` is the part's bytes (a strided part's pieces together).
    pub(crate) req: DataReq,
    /// A strided part's remote pieces: bytes per piece, distance, count (sent as one
    /// strided request).
    pub(crate) strided: Option<(u64, u64, u64)>,
}

/// Bytes a submitter sends itself at most; the rest of a large op goes to the writer task,
/// so that submitting to several peers overlaps their sends.
const SUBMIT_SEND_BYTES: usize = 256 << 10;
/// Bytes a spinning waiter sends per progress call at most (it calls again while it spins).
const SPIN_SEND_BYTES: usize = 1 << 20;

/// Opens a data connection of a link (connect and the data channel's handshake).
pub(crate) type DataOpener =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<TcpStream, Error>> + Send + Sync>;

/// Handle to a data connection.
#[derive(Debug, Clone)]
pub(crate) struct DataConn {
    conn: Arc<Conn>,
}

struct Conn {
    /// The socket's registration with tokio while a task waits on it (dropped before `sock`).
    watch: Mutex<Registration>,
    /// The ring's, while the io_uring driver waits for a send's completion (dropped before
    /// `ring`).
    ring_watch: Mutex<Registration>,
    /// With `hixl.TcpIo=uring`, the connection's ring, made when the socket is opened and
    /// set before it (a pump that sees the socket sees the ring). Dropped before `sock`: its
    /// drop waits out every request in flight.
    ring: OnceLock<Uring>,
    /// This connection is to use io_uring (the engine's `hixl.TcpIo`).
    uring: bool,
    /// What the io_uring driver task waits for now ([`DRIVER_BUSY`] and the others).
    driver: AtomicU8,
    /// Whether the connection's tasks were started ([`DataConn::start`], on its first
    /// transfer).
    started: AtomicBool,
    /// The socket (nonblocking), once the writer task opened it for the first parts (an
    /// unused connection holds no descriptor).
    sock: OnceLock<std::net::TcpStream>,
    /// Waiters spinning on the connection now (`DataConn::spinning`): while there are, the
    /// reader task leaves the socket to them, unregistered.
    spinners: AtomicUsize,
    /// Whether the owner of a transfer spins on it when it awaits it (the engine's
    /// `hixl.SpinUs` is not zero): a part queued then wakes no reader, the owner's spin takes
    /// its answer (and a spin that ends without it hands the answer over to the reader).
    owners_spin: bool,
    open: DataOpener,
    peer: Arc<str>,
    ops: OpsHandle,
    state: Arc<LinkState>,
    /// The link's count of withdrawn ops (`TcpChannel::withdraw`).
    withdrawals: Arc<AtomicU64>,
    tx: Mutex<Tx>,
    rx: Mutex<Rx>,
    /// Wakes the writer task: the socket refused part of the backlog.
    tx_blocked: Notify,
    /// Wakes the parked reader task ([`Rx::reader_parked`]): answers are awaited that nobody
    /// spinning takes, or answers wait in the stage.
    reader_kick: Notify,
}

/// A part waiting to be sent, with the link's count of withdrawals when it was submitted (see
/// [`wanted`]). A batch builds its parts as these, so an idle connection takes the list as
/// its backlog without copying it ([`DataConn::submit`]).
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) part: Part,
    seen: u64,
}

impl Pending {
    /// `part`, submitted when the link had seen `withdrawals` withdrawals.
    pub(crate) fn new(part: Part, withdrawals: u64) -> Pending {
        Pending {
            part,
            seen: withdrawals,
        }
    }
}

/// The sending half.
#[derive(Debug, Default)]
struct Tx {
    /// Parts not yet gathered for sending.
    backlog: VecDeque<Pending>,
    /// Gathered parts, in send order: from here on each is sent to the end whatever becomes
    /// of its op (the stream must stay in frame). A read part is in `rx` already.
    out: VecDeque<Out>,
    /// The headers of `out`, concatenated; `head_off` of them have gone out.
    head: Vec<u8>,
    head_off: usize,
    /// Bytes of the front of `out` already sent (its header, then its payload).
    front_sent: usize,
    /// The last withdrawal check: the op, the count it was made at, and whether the op was
    /// still wanted.
    checked: Option<(Token, u64, bool)>,
    /// Set once the connection is closed: nothing is sent any more.
    closed: bool,
}

/// One gathered request: its header (in `Tx::head`) and, for a write, the part whose payload
/// follows it.
#[derive(Debug)]
struct Out {
    write: Option<Part>,
    /// Its header's bytes in `Tx::head`.
    hlen: usize,
}

/// Rounds of pump, submit and reap one io_uring drive makes at most.
const DRIVE_ROUNDS: usize = 16;

/// The io_uring driver task runs (it looks at everything before it waits again).
const DRIVER_BUSY: u8 = 0;
/// It waits to be woken: nothing is in flight.
const DRIVER_IDLE: u8 = 1;
/// It waits for the ring's completions (registered with tokio) or to be woken.
const DRIVER_RING: u8 = 2;
/// It waits for the spinning waiters to stop (they reap meanwhile).
const DRIVER_SPIN: u8 = 3;

/// The receiving half.
#[derive(Debug)]
struct Rx {
    /// Parts awaiting their answer, oldest first; `None` once closed (then pushing fails the
    /// part instead). A write part is queued only once its payload is sent, so that nobody
    /// completes it (and lets its op be reaped) while the socket still reads its memory.
    inflight: Option<VecDeque<Part>>,
    /// Answer bytes received ahead: frames not yet matched, and the start of a read payload
    /// that came with its header (copied out of the stage into the part's memory).
    stage: Stage,
    /// `Some(n)` while the front part's read payload is coming: `n` bytes are in.
    payload: Option<usize>,
    /// The reader task waits for [`Conn::reader_kick`] (with nothing awaited, or while a
    /// waiter spins); whoever kicks it clears this.
    reader_parked: bool,
}

/// Where a half stands after a pump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pumped {
    /// Nothing left to do.
    Idle,
    /// The socket would block with work left.
    Blocked,
}

/// Who pumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    /// The connection's own task, which waits on the socket's readiness itself.
    Task,
    /// A submitter or a spinning waiter: what it leaves behind goes to the tasks.
    Direct,
}

/// The socket's registration with tokio's reactor, shared by the connection's two tasks and
/// held only while one of them waits on the socket. While the submitter and the waiter drive
/// the connection themselves the socket is not registered, so its traffic wakes no other
/// thread of the runtime (a parked worker would otherwise be woken by every answer).
#[derive(Default)]
struct Registration {
    fd: Option<Arc<AsyncFd<Watched>>>,
    users: usize,
}

/// A task's use of the [`Registration`]; the last one dropped deregisters the socket.
struct Watch<'a> {
    reg: &'a Mutex<Registration>,
    fd: Arc<AsyncFd<Watched>>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut r = lock(self.reg);
        r.users = r.users.saturating_sub(1);
        if r.users == 0 {
            r.fd = None;
        }
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.peer)
            .field("open", &self.sock.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// The socket's descriptor; `None` until it is opened.
    fn fd(&self) -> Option<RawFd> {
        self.sock.get().map(|s| s.as_raw_fd())
    }

    /// Registers the socket (`ring`: the io_uring) with tokio's reactor (if no other task
    /// has) for a task that is about to wait on it. A registration reports the current
    /// readiness at once, so bytes (completions) that came while it was unregistered are not
    /// missed.
    fn watch(&self, ring: bool) -> std::io::Result<Watch<'_>> {
        let (fd, interest, reg) = match (ring, self.ring.get()) {
            (true, Some(u)) => (u.as_raw_fd(), Interest::READABLE, &self.ring_watch),
            (true, None) => return Err(std::io::Error::other("no io_uring")),
            (false, _) => (
                self.fd()
                    .ok_or_else(|| std::io::Error::other("data connection not open"))?,
                Interest::READABLE | Interest::WRITABLE,
                &self.watch,
            ),
        };
        let mut r = lock(reg);
        let afd = match &r.fd {
            Some(a) => a.clone(),
            None => {
                // SAFETY: the descriptor is the connection's socket or ring, which the
                // connection owns and closes only when it drops; the registration is held by
                // the connection (its `watch` field, dropped before `ring` and `sock`) and by
                // `Watch` guards borrowing it, so it ends while the descriptor is still open.
                let a =
                    Arc::new(unsafe { AsyncFd::register_with_interest(Watched(fd), interest) }?);
                r.fd = Some(a.clone());
                a
            }
        };
        r.users += 1;
        Ok(Watch { reg, fd: afd })
    }

    /// `e`, unless the link is already down: then the link's cause (an op cut off by our own
    /// disconnect reports NOT_CONNECTED like the others, not the socket error it caused).
    fn cause(&self, e: Error) -> Error {
        self.state.error().unwrap_or(e)
    }

    /// The connection failed with `e`: the link dies, and every part it holds fails.
    fn fail(&self, e: Error) {
        if !self.state.is_dead() {
            tracing::warn!(peer = %self.peer, "data connection failed: {e}");
        }
        self.state.kill(e.clone());
        self.close(&self.cause(e));
    }

    /// Closes both halves, failing every part they hold with `cause`, and shuts the socket
    /// down. With io_uring, the ring is quiesced first: no request touches a part's memory
    /// once it is failed. Idempotent.
    fn close(&self, cause: &Error) {
        if let Some(u) = self.ring.get() {
            if let Some(s) = self.sock.get() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            u.quiesce();
        }
        let unsent: Vec<Part> = {
            let mut tx = lock(&self.tx);
            tx.closed = true;
            tx.head.clear();
            tx.head_off = 0;
            tx.front_sent = 0;
            let gathered: Vec<Part> = tx.out.drain(..).filter_map(|o| o.write).collect();
            gathered
                .into_iter()
                .chain(tx.backlog.drain(..).map(|p| p.part))
                .collect()
        };
        let unanswered = lock(&self.rx).inflight.take().unwrap_or_default();
        if let Some(s) = self.sock.get() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        fail_with(&self.ops.sink, unsent.into_iter().chain(unanswered), cause);
    }

    /// Pumps the sending half, then delivers what it finished. A pump that leaves work behind
    /// (the socket is full) hands it to the writer task, unless that task is the caller.
    fn pump_tx(
        &self,
        tx: &mut Tx,
        via: Via,
        budget: usize,
        done: &mut Vec<Completion>,
    ) -> Result<Pumped, Error> {
        let r = tx.pump(self, via, budget, done);
        if matches!(r, Ok(Pumped::Blocked)) && via == Via::Direct {
            self.tx_blocked.notify_one();
        }
        r
    }

    /// Sends `pieces` on `fd`: a nonblocking `sendmsg`, or with io_uring the ring's send.
    fn sendmsg(&self, fd: RawFd, pieces: &[Piece<'_>]) -> std::io::Result<usize> {
        match self.ring.get() {
            Some(u) => u.send(fd, pieces),
            None => rawio::sendmsg_pieces_now(fd, pieces),
        }
    }

    /// With io_uring: pumps the sending half (its gathers queued on the ring), submits with
    /// one `io_uring_enter`, reaps what completed and goes round again while completions
    /// came. `wait`: take the lock even when contended (a task, a submitter); a spinner only
    /// tries it.
    ///
    /// Answers are received as on the epoll path, by nonblocking `recv` when the socket is
    /// readable: an io_uring receive completes through task work signalled to the thread
    /// that submitted it, which costs a round trip 20–40 µs more than a `recv` on a vCPU
    /// (measured; see `docs/benchmarks.md`), while a send with room in the socket buffer
    /// completes inside `io_uring_enter`.
    fn drive(
        &self,
        u: &Uring,
        via: Via,
        wait: bool,
        done: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        let budget = match via {
            Via::Task => usize::MAX,
            Via::Direct => SPIN_SEND_BYTES,
        };
        for _ in 0..DRIVE_ROUNDS {
            let tx = if wait {
                Some(lock(&self.tx))
            } else {
                self.tx.try_lock().ok()
            };
            if let Some(mut tx) = tx {
                if !tx.closed && !tx.is_free() {
                    tx.pump(self, via, budget, done)?;
                }
            }
            match u.flush() {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    return Err(self.cause(Error::connection_lost(
                        &self.peer,
                        "submitting to io_uring",
                        e,
                    )))
                }
            }
        }
        Ok(())
    }

    /// After a submitter or a spinner drove the ring: wakes the driver task if what it left
    /// needs the task (requests in flight that nobody may reap, or parts not yet sent) and
    /// the task does not wait for it already. While a waiter spins, it reaps; the driver is
    /// woken when the last spinner stops.
    fn hand_over(&self, u: &Uring) {
        if self.spinners.load(Ordering::SeqCst) > 0 {
            return;
        }
        let pending = || {
            self.tx
                .try_lock()
                .is_ok_and(|tx| !tx.closed && !tx.is_free())
        };
        let ring = u.status();
        let needed = match self.driver.load(Ordering::SeqCst) {
            // Waiting for a kick: the last spinner's, or a submitter's.
            DRIVER_IDLE | DRIVER_SPIN => ring.in_flight || ring.results || pending(),
            DRIVER_RING => ring.results || (!ring.in_flight && pending()),
            _ => false,
        };
        if needed {
            self.tx_blocked.notify_one();
        }
    }

    /// Queues `part` for its answer; gives it back if the connection is closed.
    fn push_rx(&self, part: Part, via: Via) -> Result<(), Part> {
        let mut rx = lock(&self.rx);
        // Answers received ahead (with an earlier one, before this part was queued) wait in
        // the stage, announced by no readiness edge: the reader must look. Otherwise a parked
        // reader is woken unless a waiter spins now (the last to stop hands the answers over,
        // `DataConn::spinning`), or the part's submitter queued it and its owner will spin
        // for the answer on its own thread when it awaits the transfer (no wake-up of another
        // thread). An owner that does not await it hands it over when it asks the status or
        // drops it (`DataConn::nudge`).
        let ring = !rx.stage.is_empty()
            || (rx.reader_parked
                && self.spinners.load(Ordering::SeqCst) == 0
                && !(via == Via::Direct && self.owners_spin));
        let Some(q) = rx.inflight.as_mut() else {
            return Err(part);
        };
        q.push_back(part);
        self.kick_reader(rx, ring);
        Ok(())
    }

    /// Wakes the reader task when `ring`, releasing `rx` first; a kicked reader is no longer
    /// parked (a kick it has not waited for yet is kept by the `Notify`).
    fn kick_reader(&self, mut rx: std::sync::MutexGuard<'_, Rx>, ring: bool) {
        if ring {
            rx.reader_parked = false;
            drop(rx);
            self.reader_kick.notify_one();
        }
    }

    fn deliver(&self, done: &mut Vec<Completion>) {
        if !done.is_empty() {
            self.ops.sink.complete_all(done.drain(..));
        }
    }
}

impl Tx {
    fn is_free(&self) -> bool {
        self.backlog.is_empty() && self.out.is_empty()
    }

    /// Takes parts from the backlog into `out` (their headers into `head`) while the gather
    /// bounds allow, at least one, all reads or all writes. Parts of withdrawn ops complete
    /// as cancelled (into `done`); a read part is queued for its answer before its header can
    /// go out.
    fn gather(&mut self, conn: &Conn, via: Via, done: &mut Vec<Completion>) -> Result<(), Error> {
        let mut bytes: u64 = 0;
        // Reads or writes only: a read joins `rx` when gathered and a write once sent, so a
        // mixed gather would queue a read ahead of a write sent before it.
        let mut kind = None;
        while self.out.len() < GATHER_PARTS && (self.out.is_empty() || bytes < GATHER_BYTES) {
            let Some(front) = self.backlog.front() else {
                break;
            };
            if *kind.get_or_insert(front.part.write) != front.part.write {
                break;
            }
            let Some(p) = self.backlog.pop_front() else {
                break;
            };
            if !wanted(&mut self.checked, conn, p.part.token, p.seen) {
                done.push(Completion {
                    token: p.part.token,
                    result: Err(Error::Cancelled { what: "a TCP part" }),
                });
                continue;
            }
            let part = p.part;
            let hlen = match part.strided {
                Some((len, stride, count)) => {
                    let r = StridedReq {
                        id: part.req.id,
                        rkey: part.req.rkey,
                        addr: part.req.addr,
                        len,
                        stride,
                        count,
                    };
                    self.head
                        .extend_from_slice(&encode_strided_req(part.write, &r));
                    STRIDED_REQ_FRAME
                }
                None => {
                    self.head
                        .extend_from_slice(&encode_data_req(part.write, &part.req));
                    DATA_REQ_FRAME
                }
            };
            if part.write {
                bytes += part.req.len;
                self.out.push_back(Out {
                    write: Some(part),
                    hlen,
                });
            } else if let Err(p) = conn.push_rx(part, via) {
                done.push(Completion {
                    token: p.token,
                    result: Err(lost(&conn.peer, "data connection closed")),
                });
                return Err(lost(&conn.peer, "data connection closed"));
            } else {
                self.out.push_back(Out { write: None, hlen });
            }
        }
        Ok(())
    }

    /// Sends what the socket takes, gathering up to [`GATHER_PARTS`] requests per `sendmsg`.
    /// A write part goes to `rx` once its payload is all out.
    ///
    /// Sends at most about `budget` bytes: past it, work left is reported as blocked (for the
    /// writer task to finish), so a submitter is not held by a large op.
    ///
    /// Returns an error only when the connection is unusable; the caller then fails it.
    /// `via`: who pumps (a part queued for its answer by a submitter or a spinner is left to
    /// its owner's spin, see [`Conn::push_rx`]).
    fn pump(
        &mut self,
        conn: &Conn,
        via: Via,
        budget: usize,
        done: &mut Vec<Completion>,
    ) -> Result<Pumped, Error> {
        if self.closed {
            return Ok(Pumped::Idle);
        }
        // Not opened yet: the writer task opens it (a direct pump reporting this wakes it).
        let Some(fd) = conn.fd() else {
            return Ok(Pumped::Blocked);
        };
        let mut moved = 0usize;
        loop {
            if self.out.is_empty() {
                self.head.clear();
                self.head_off = 0;
                self.front_sent = 0;
                if self.backlog.is_empty() {
                    return Ok(Pumped::Idle);
                }
                self.gather(conn, via, done)?;
                if self.out.is_empty() {
                    continue;
                }
            }
            if moved >= budget {
                return Ok(Pumped::Blocked);
            }
            let n = match self.send(conn, fd) {
                Ok(0) => {
                    return Err(conn.cause(Error::connection_lost(
                        &conn.peer,
                        "sending parts",
                        std::io::ErrorKind::WriteZero.into(),
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Pumped::Blocked),
                Err(e) => {
                    return Err(conn.cause(Error::connection_lost(&conn.peer, "sending parts", e)))
                }
            };
            moved += n;
            self.advance(conn, via, n, done)?;
        }
    }

    /// One nonblocking send of what `out` still holds: each request's header (from `head`)
    /// and, for a write, its payload straight from registered memory.
    fn send(&self, conn: &Conn, fd: RawFd) -> std::io::Result<usize> {
        let mut pieces = [Piece::Head(&[]); 2 * GATHER_PARTS];
        let mut n = 0;
        let mut hoff = self.head_off;
        let mut skip = self.front_sent;
        'outs: for o in &self.out {
            if n == pieces.len() {
                break;
            }
            let hdr = &self.head[hoff..hoff + o.hlen];
            hoff += o.hlen;
            if skip < o.hlen {
                pieces[n] = Piece::Head(&hdr[skip..]);
                n += 1;
                skip = 0;
            } else {
                skip -= o.hlen;
            }
            if let Some(p) = &o.write {
                // A strided part's payload is its pieces: as many as the iovecs hold (the
                // next send goes on from where this one stopped).
                let mut off = std::mem::take(&mut skip) as u64;
                while off < p.local.len() {
                    if n == pieces.len() {
                        break 'outs;
                    }
                    // SAFETY: the part has not been completed: it is completed only after it
                    // leaves `out`, and this half (whose lock the caller holds) removes it
                    // only once its payload is out.
                    let payload = unsafe { p.local.raw_at(off) };
                    off += payload.len() as u64;
                    pieces[n] = Piece::Body(payload);
                    n += 1;
                }
            }
        }
        conn.sendmsg(fd, &pieces[..n])
    }

    /// `n` more bytes went out: the requests now wholly sent leave `out`, a write part joining
    /// `rx` for its ack.
    fn advance(
        &mut self,
        conn: &Conn,
        via: Via,
        n: usize,
        done: &mut Vec<Completion>,
    ) -> Result<(), Error> {
        let mut left = self.front_sent + n;
        while let Some(front) = self.out.front() {
            let hlen = front.hlen;
            let len = hlen + front.write.as_ref().map_or(0, Part::local_len);
            if left < len {
                break;
            }
            left -= len;
            self.head_off += hlen;
            if let Some(Out { write: Some(p), .. }) = self.out.pop_front() {
                // Its ack may already be in the socket: the reader matches it once queued.
                if let Err(p) = conn.push_rx(p, via) {
                    done.push(Completion {
                        token: p.token,
                        result: Err(lost(&conn.peer, "data connection closed")),
                    });
                    return Err(lost(&conn.peer, "data connection closed"));
                }
            }
        }
        self.front_sent = left;
        Ok(())
    }
}

/// Whether op `token` (of a batch submitted at withdrawal count `seen`) is still wanted. The
/// op table is locked only after the link's withdrawal count moved since the batch was
/// submitted (the count was taken before its op could be abandoned): the abandon, made under
/// that lock before the count was bumped, is then seen. Without withdrawals a part costs one
/// atomic load and no lock; `checked` caches the last answer.
fn wanted(checked: &mut Option<(Token, u64, bool)>, conn: &Conn, token: Token, seen: u64) -> bool {
    let now = conn.withdrawals.load(Ordering::Acquire);
    if now == seen {
        return true;
    }
    if let Some((t, at, wanted)) = *checked {
        if t == token && at == now {
            return wanted;
        }
    }
    let wanted = lock(&conn.ops.table).is_wanted(token);
    *checked = Some((token, now, wanted));
    wanted
}

impl Part {
    fn local_len(&self) -> usize {
        self.req.len as usize
    }
}

impl Rx {
    fn new() -> Rx {
        Rx {
            inflight: Some(VecDeque::new()),
            stage: Stage::default(),
            payload: None,
            reader_parked: false,
        }
    }

    fn awaiting(&self) -> bool {
        self.inflight.as_ref().is_some_and(|q| !q.is_empty())
    }

    /// Receives what the socket holds and completes the parts it answers (into `done`).
    /// Returns an error when the connection is unusable (the caller fails it, and with it
    /// every part still queued: a part leaves the queue only completed).
    fn pump(&mut self, conn: &Conn, done: &mut Vec<Completion>) -> Result<Pumped, Error> {
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

impl DataConn {
    /// A data connection whose socket `open` opens when parts first come; starts its
    /// writer and reader tasks (idle until then). `withdrawals` counts the link's withdrawn
    /// ops (`TcpChannel::withdraw`).
    ///
    /// With `uring`, the connection moves its bytes through an io_uring of its own, made
    /// when the socket is opened, and one driver task stands in for the two (if the ring
    /// cannot be made then, the connection falls back to the epoll tasks and says so).
    pub(crate) fn spawn(
        open: DataOpener,
        peer: Arc<str>,
        ops: OpsHandle,
        state: Arc<LinkState>,
        withdrawals: Arc<AtomicU64>,
        uring: bool,
        owners_spin: bool,
    ) -> DataConn {
        let conn = Arc::new(Conn {
            watch: Mutex::new(Registration::default()),
            ring_watch: Mutex::new(Registration::default()),
            ring: OnceLock::new(),
            uring,
            driver: AtomicU8::new(DRIVER_BUSY),
            started: AtomicBool::new(false),
            sock: OnceLock::new(),
            spinners: AtomicUsize::new(0),
            owners_spin,
            open,
            peer,
            ops,
            state: state.clone(),
            withdrawals,
            tx: Mutex::new(Tx::default()),
            rx: Mutex::new(Rx::new()),
            tx_blocked: Notify::new(),
            reader_kick: Notify::new(),
        });
        DataConn { conn }
    }

    /// Starts the connection's tasks, on its first transfer: a link that never moves data
    /// over this connection costs no task (a thousand peers connecting at once would
    /// otherwise queue eight idle tasks each on the runtime, ahead of every handshake).
    /// The tasks see a link that is already dead at once and close the connection, failing
    /// what was queued.
    fn start(&self) {
        let c = &self.conn;
        if c.started.swap(true, Ordering::AcqRel) {
            return;
        }
        if c.state.is_dead() {
            // Nothing may be left to tasks that a stopped runtime would never run.
            end(c);
            return;
        }
        if c.uring {
            c.state.spawn(driver(c.clone()));
        } else {
            c.state.spawn(writer(c.clone()));
        }
        c.state.spawn(reader(c.clone()));
    }

    /// Sends the parts of one op, at once when the connection is free (the rest, if the
    /// socket fills, goes to the writer task). On a closed connection they come back to be
    /// failed.
    pub(crate) fn submit(&self, parts: Vec<Pending>) -> Result<(), Vec<Pending>> {
        self.start();
        let c = &*self.conn;
        let mut done = Vec::new();
        let r = {
            let mut tx = lock(&c.tx);
            if tx.closed {
                return Err(parts);
            }
            // An op of many parts (thousands of KV blocks) is handed to the writer task whole:
            // sending its first gather here would hold the submitter for no latency gain.
            let many = parts.len() > GATHER_PARTS;
            let free = tx.is_free();
            if tx.backlog.is_empty() {
                // The list becomes the backlog as it is (no copy of thousands of parts).
                tx.backlog = VecDeque::from(parts);
            } else {
                tx.backlog.extend(parts);
            }
            // A busy connection has its writer on it (or a spinner): the parts wait their turn.
            // With io_uring the ring is driven below, once the lock is free.
            match (c.uring, many, free) {
                (false, false, true) => c
                    .pump_tx(&mut tx, Via::Direct, SUBMIT_SEND_BYTES, &mut done)
                    .map(drop),
                (false, true, _) => {
                    c.tx_blocked.notify_one();
                    Ok(())
                }
                _ => Ok(()),
            }
        };
        let r = match c.ring.get() {
            Some(u) => {
                let r = c.drive(u, Via::Direct, true, &mut done);
                c.hand_over(u);
                r
            }
            // Not open yet: the driver opens it.
            None if c.uring => {
                c.tx_blocked.notify_one();
                r
            }
            None => r,
        };
        c.deliver(&mut done);
        if let Err(e) = r {
            c.fail(e);
        }
        Ok(())
    }

    /// A waiter starts (`true`) or stops (`false`) spinning on this connection. While one
    /// spins, the reader task leaves the socket to it (unregistered from tokio's reactor, so
    /// answers wake no other thread); when the last stops, the reader takes over.
    pub(crate) fn spinning(&self, on: bool) {
        let c = &*self.conn;
        if on {
            c.spinners.fetch_add(1, Ordering::SeqCst);
        } else if c.spinners.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.nudge();
            if let Some(u) = c.ring.get() {
                // A send the spinner left in flight is the driver's again.
                c.hand_over(u);
            }
        }
    }

    /// Wakes the reader if it is parked while answers are awaited and nobody spins for them:
    /// when the last spinner stops, when an owner asks its transfer's status instead of
    /// awaiting it, and when an op is withdrawn (its answers must still be read).
    pub(crate) fn nudge(&self) {
        let c = &*self.conn;
        let rx = lock(&c.rx);
        let ring = rx.reader_parked && rx.awaiting() && c.spinners.load(Ordering::SeqCst) == 0;
        c.kick_reader(rx, ring);
    }

    /// Drives both halves once without waiting, if nobody else is: sends what the socket
    /// takes, completes what has been answered. Returns whether anything moved. For a task
    /// that spins while awaiting a transfer.
    pub(crate) fn progress(&self) -> bool {
        let c = &*self.conn;
        let mut done = Vec::new();
        let mut failed = None;
        if let Some(u) = c.ring.get() {
            // Pumps what waits and reaps what completed; no syscall when nothing was queued.
            if let Err(e) = c.drive(u, Via::Direct, false, &mut done) {
                failed = Some(e);
            }
        } else if let Ok(mut tx) = c.tx.try_lock() {
            if !tx.is_free() && !tx.closed {
                if let Err(e) = c.pump_tx(&mut tx, Via::Direct, SPIN_SEND_BYTES, &mut done) {
                    failed = Some(e);
                }
            }
        }
        if failed.is_none() {
            if let Ok(mut rx) = c.rx.try_lock() {
                if rx.awaiting() {
                    if let Err(e) = rx.pump(c, &mut done) {
                        failed = Some(e);
                    }
                }
            }
        }
        let moved = !done.is_empty();
        c.deliver(&mut done);
        if let Some(e) = failed {
            c.fail(e);
            return true;
        }
        moved
    }
}

/// Completes `parts` with `err`.
pub(crate) fn fail_with(sink: &Completions, parts: impl IntoIterator<Item = Part>, err: &Error) {
    sink.complete_all(parts.into_iter().map(|p| Completion {
        token: p.token,
        result: Err(err.clone()),
    }));
}

fn lost(peer: &str, cause: &'static str) -> Error {
    Error::PeerLost {
        peer: peer.to_string(),
        cause: cause.to_string(),
    }
}

/// A task's registration of the socket, made in `slot` on first need and kept until the
/// task drops it. `None` when tokio refuses the registration: the connection has failed then.
fn watching<'s, 'c>(
    conn: &'c Conn,
    ring: bool,
    slot: &'s mut Option<Watch<'c>>,
) -> Option<&'s Watch<'c>> {
    if slot.is_none() {
        match conn.watch(ring) {
            Ok(w) => *slot = Some(w),
            Err(e) => {
                let e = Error::connection_lost(&conn.peer, "watching a data connection", e);
                conn.fail(conn.cause(e));
                return None;
            }
        }
    }
    slot.as_ref()
}

/// Opens the connection's socket (connect and the data channel's handshake), racing the
/// link's death: `None` if the link died first or the open failed (which fails the
/// connection).
async fn open_socket(
    conn: &Conn,
    dead: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<std::net::TcpStream> {
    let opened = tokio::select! {
        biased;
        r = dead.changed() => { let _ = r; return None }
        r = (conn.open)() => r,
    };
    let opened = opened.and_then(|s| {
        s.into_std()
            .map_err(|e| Error::connection_lost(&conn.peer, "opening a data connection", e))
    });
    match opened {
        Ok(s) => Some(s),
        Err(e) => {
            conn.fail(conn.cause(e));
            None
        }
    }
}

/// One drive of the ring by the io_uring driver task, its completions delivered: `false`
/// when the connection failed.
fn turn(conn: &Conn, u: &Uring, done: &mut Vec<Completion>) -> bool {
    conn.driver.store(DRIVER_BUSY, Ordering::SeqCst);
    let r = conn.drive(u, Via::Task, true, done);
    conn.deliver(done);
    match r {
        Ok(()) => true,
        Err(e) => {
            conn.fail(e);
            false
        }
    }
}

/// Waits for `n` unless the link dies first: `false` when it died.
async fn woken(dead: &mut tokio::sync::watch::Receiver<bool>, n: &Notify) -> bool {
    tokio::select! {
        biased;
        r = dead.changed() => { let _ = r; false }
        _ = n.notified() => true,
    }
}

/// A connection task ends: the connection closes with the link's cause.
fn end(conn: &Conn) {
    let cause = conn
        .state
        .error()
        .unwrap_or_else(|| lost(&conn.peer, "link closed"));
    conn.close(&cause);
}

/// Sends what the submitters and spinners left when the socket was full (or before it was
/// open: this task opens it), waiting on the socket's write readiness. Every wait races the
/// link's death: a peer that stopped reading (frozen, or the network cut) must not keep parts
/// unresolved after the link was closed.
async fn writer(conn: Arc<Conn>) {
    let mut dead = conn.state.subscribe();
    let mut done = Vec::new();
    'run: loop {
        if *dead.borrow() {
            break;
        }
        if !woken(&mut dead, &conn.tx_blocked).await {
            break;
        }
        if conn.sock.get().is_none() {
            let Some(s) = open_socket(&conn, &mut dead).await else {
                break;
            };
            let _ = conn.sock.set(s);
        }
        // Pump first: the socket has room more often than not.
        let mut watch = None;
        loop {
            let r = conn.pump_tx(&mut lock(&conn.tx), Via::Task, usize::MAX, &mut done);
            conn.deliver(&mut done);
            match r {
                Ok(Pumped::Idle) => break,
                Ok(Pumped::Blocked) => {}
                Err(e) => {
                    conn.fail(e);
                    break 'run;
                }
            }
            let Some(w) = watching(&conn, false, &mut watch) else {
                break 'run;
            };
            tokio::select! {
                biased;
                r = dead.changed() => { let _ = r; break 'run }
                r = w.fd.writable() => match r {
                    // The pump's last send would block: wait for the next edge.
                    Ok(mut g) => g.clear_ready(),
                    Err(e) => {
                        let e = Error::connection_lost(&conn.peer, "waiting to send", e);
                        conn.fail(conn.cause(e));
                        break 'run;
                    }
                },
            }
        }
    }
    end(&conn);
}

/// Receives answers that nobody spinning takes: while answers are awaited and no waiter
/// spins, it waits on the socket's read readiness (registering the socket with tokio for the
/// wait); otherwise it waits for a pushed part or the end of the spin.
async fn reader(conn: Arc<Conn>) {
    let mut dead = conn.state.subscribe();
    let mut done = Vec::new();
    let mut watch: Option<Watch<'_>> = None;
    loop {
        if *dead.borrow() {
            break;
        }
        let parked = {
            let mut rx = lock(&conn.rx);
            if rx.inflight.is_none() {
                break;
            }
            // Answers only follow requests, and a part is queued before (read) or right
            // after (write) its request is sent: with nothing queued, wait for a push (no
            // socket syscall, and the socket unregistered). A peer that closes meanwhile is
            // seen by the control channel (which kills the link) or by the next read.
            // While a waiter spins it drives the connection; the last one to stop kicks us
            // if answers are still awaited. Decided under the lock that kickers take, so no
            // kick is lost between the decision and the wait (a kick before the wait is kept
            // by the Notify).
            let parked = !rx.awaiting()
                || conn.sock.get().is_none()
                || conn.spinners.load(Ordering::SeqCst) > 0;
            rx.reader_parked = parked;
            parked
        };
        if parked {
            watch = None;
            if !woken(&mut dead, &conn.reader_kick).await {
                break;
            }
            continue;
        }
        // Pumps before waiting: answers may have come ahead of their parts (an ack received
        // with an earlier one, before its write was queued), and no readiness edge announces
        // those.
        let r = lock(&conn.rx).pump(&conn, &mut done);
        conn.deliver(&mut done);
        match r {
            Ok(Pumped::Blocked) => {}
            Ok(Pumped::Idle) => continue,
            Err(e) => {
                conn.fail(e);
                break;
            }
        }
        // Drained to a would-block: wait for the next edge (a registration made now reports
        // what came since the pump).
        let Some(w) = watching(&conn, false, &mut watch) else {
            break;
        };
        tokio::select! {
            biased;
            r = dead.changed() => { let _ = r; break }
            // A part queued while answers for it wait in the stage (see `push_rx`).
            _ = conn.reader_kick.notified() => {}
            r = w.fd.readable() => match r {
                // Cleared before the next pump, which receives whatever came before; what
                // comes after raises a new edge.
                Ok(mut g) => g.clear_ready(),
                Err(e) => {
                    let e = Error::connection_lost(&conn.peer, "waiting for answers", e);
                    conn.fail(conn.cause(e));
                    break;
                }
            },
        }
    }
    drop(watch);
    end(&conn);
}

/// The io_uring connection's one task: opens the socket (and its ring) when the first parts
/// come, then drives the ring whenever nobody else does: when a submitter or a spinner left
/// requests in flight and stopped, it waits for the ring's completions on tokio's reactor
/// (registered for the wait only). Every wait races the link's death.
async fn driver(conn: Arc<Conn>) {
    let mut dead = conn.state.subscribe();
    let mut done = Vec::new();
    let u = 'open: loop {
        if *dead.borrow() {
            break 'open None;
        }
        conn.driver.store(DRIVER_IDLE, Ordering::SeqCst);
        if !woken(&mut dead, &conn.tx_blocked).await {
            break 'open None;
        }
        conn.driver.store(DRIVER_BUSY, Ordering::SeqCst);
        if lock(&conn.tx).is_free() {
            continue;
        }
        let Some(s) = open_socket(&conn, &mut dead).await else {
            break 'open None;
        };
        match Uring::new() {
            Ok(u) => {
                let _ = conn.ring.set(u);
                let _ = conn.sock.set(s);
                break 'open conn.ring.get();
            }
            Err(e) => {
                tracing::warn!(
                    peer = %conn.peer,
                    "io_uring refused for a data connection ({e}); it uses epoll"
                );
                let _ = conn.sock.set(s);
                conn.state.spawn(writer(conn.clone()));
                conn.tx_blocked.notify_one();
                return;
            }
        }
    };
    if let Some(u) = u {
        let mut watch: Option<Watch<'_>> = None;
        loop {
            if *dead.borrow() {
                break;
            }
            if !turn(&conn, u, &mut done) {
                break;
            }
            let state = if conn.spinners.load(Ordering::SeqCst) > 0 {
                DRIVER_SPIN
            } else if u.status().in_flight {
                DRIVER_RING
            } else {
                DRIVER_IDLE
            };
            conn.driver.store(state, Ordering::SeqCst);
            // Published: a submitter or spinner that changes things from here on wakes us.
            // What changed before, we see now. Completions left for a pump (the drive's
            // rounds ran out): drive again.
            let ring = u.status();
            let again = ring.results
                || match state {
                    DRIVER_IDLE => {
                        ring.in_flight
                            || !lock(&conn.tx).is_free()
                            || conn.spinners.load(Ordering::SeqCst) > 0
                    }
                    DRIVER_RING => !ring.in_flight,
                    _ => false,
                };
            if again {
                continue;
            }
            if state != DRIVER_RING {
                watch = None;
                if !woken(&mut dead, &conn.tx_blocked).await {
                    break;
                }
                continue;
            }
            let Some(w) = watching(&conn, true, &mut watch) else {
                break;
            };
            tokio::select! {
                biased;
                r = dead.changed() => { let _ = r; break }
                _ = conn.tx_blocked.notified() => {}
                r = w.fd.readable() => match r {
                    Ok(mut g) => {
                        // Reap before clearing: completions posted after the readiness was
                        // seen keep it set.
                        if !turn(&conn, u, &mut done) {
                            break;
                        }
                        g.clear_ready();
                    }
                    Err(e) => {
                        let e = Error::connection_lost(&conn.peer, "waiting for io_uring", e);
                        conn.fail(conn.cause(e));
                        break;
                    }
                },
            }
        }
        drop(watch);
    }
    end(&conn);
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

/// Matches whole ack frames with the write parts at the front of `q`, completing them into
/// `done`. A bad frame is an error (the parts stay queued, to be failed with the connection).
fn take_acks(
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
