//! Initiator side of one TCP data connection, run to completion.
//!
//! A connection has two halves, each a nonblocking state machine under its own lock:
//! - [`Tx`]: the parts not yet (wholly) sent: request headers, and for WRITE the payload
//!   straight from registered memory;
//! - [`Rx`]: the parts sent and awaiting their answer, in the order they were sent, matched
//!   as answers come (READ payloads land straight in registered memory).
//!
//! Whoever gets there first drives them, with nonblocking syscalls (or, for sends, the
//! connection's io_uring: [`Io`] is how bytes move, the rest is the same for both):
//! - the submitting task sends its op's parts itself when the connection is free (nothing
//!   queued before them): no hand-off to another task for a small op;
//! - the task awaiting a transfer pumps both halves while it spins ([`DataConn::progress`],
//!   called from `Transfer::poll` for a bounded quiet period);
//! - the connection's two tasks take over only when the socket blocks: the sending task when
//!   the send buffer is full (or a send is in flight on the ring), the reader when answers
//!   are awaited and nobody spins. They wait on tokio's readiness, so an idle connection costs
//!   nothing.
//!
//! Lock order: `tx` before `rx` (a part moves from one to the other under both, so the answer
//! queue keeps the order requests went out in). Completions are delivered after the locks
//! are released.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use hixl_core::answers::Answers;
use hixl_core::outbox::Outbox;
use hixl_core::wire::DataReq;
use hixl_core::{Error, Token};
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::gather::GATHER_PARTS;
use crate::completion::Completion;
use crate::context::OpsHandle;
use crate::link_state::LinkState;
use crate::rawio::{PartRange, Watched};
use crate::sink::Completions;
use crate::stage::Stage;
use crate::sync::lock;

mod conn;
mod handoff;
mod io;
mod rx;
mod tasks;
mod tx;

use handoff::{Sender, Sending};
use io::Io;
use tasks::{end, reader, sender};

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

/// Bytes a submitter sends itself at most; the rest of a large op goes to the sending task,
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
    /// How the connection moves its bytes, chosen when the socket is opened and set before
    /// it (a pump that sees the socket sees its I/O). Dropped before `sock`: a ring's drop
    /// waits out every request in flight.
    io: OnceLock<Io>,
    /// This connection asks for io_uring (the engine's `hixl.TcpIo`); what it got is `io`,
    /// once opened.
    wants_uring: bool,
    /// What the sending task waits for now ([`Sending`], as its `u8`).
    sending: AtomicU8,
    /// Whether the connection's tasks were started ([`DataConn::start`], on its first
    /// transfer).
    started: AtomicBool,
    /// The socket (nonblocking), once the sending task opened it for the first parts (an
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
    /// Wakes the sending task: the socket refused part of the backlog, or work was left to it
    /// (see [`Conn::hand_over`]).
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
    /// Parts not yet sent: the backlog, and the gather being sent (from which on each is
    /// sent to the end whatever becomes of its op: the stream must stay in frame; a read part
    /// is in `rx` already).
    outbox: Outbox<Pending>,
    /// The last withdrawal check: the op, the count it was made at, and whether the op was
    /// still wanted.
    checked: Option<(Token, u64, bool)>,
    /// Set once the connection is closed: nothing is sent any more.
    closed: bool,
}

/// Rounds of pump, submit and reap one drive makes at most (one with epoll, whose sends
/// leave no completion to reap).
const DRIVE_ROUNDS: usize = 16;

/// The receiving half.
#[derive(Debug)]
struct Rx {
    /// Parts awaiting their answer, oldest first, and how far the front one's answer is;
    /// closed with the connection (then pushing fails the part instead). A write part is
    /// queued only once its payload is sent, so that nobody completes it (and lets its op be
    /// reaped) while the socket still reads its memory.
    answers: Answers<Part>,
    /// Answer bytes received ahead: frames not yet matched, and the start of a read payload
    /// that came with its header (copied out of the stage into the part's memory).
    stage: Stage,
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

/// A descriptor's registration with tokio's reactor: the socket's, shared by the connection's
/// two tasks, or the ring's, the sending task's; held only while a task waits on it. While
/// the submitter and the waiter drive the connection themselves the socket is not
/// registered, so its traffic wakes no other thread of the runtime (a parked worker would
/// otherwise be woken by every answer).
#[derive(Default)]
struct Registration {
    fd: Option<Arc<AsyncFd<Watched>>>,
    users: usize,
}

/// A task's use of the [`Registration`]; the last one dropped deregisters the descriptor.
struct Watch<'a> {
    reg: &'a Mutex<Registration>,
    /// Dropped in `drop`, under the registration's lock.
    fd: ManuallyDrop<Arc<AsyncFd<Watched>>>,
    /// The readiness the task awaits.
    awaits: Interest,
}

impl Watch<'_> {
    /// Waits until the descriptor is ready as the task awaits.
    async fn ready(&self) -> std::io::Result<AsyncFdReadyGuard<'_, Watched>> {
        self.fd.ready(self.awaits).await
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut r = lock(self.reg);
        r.users = r.users.saturating_sub(1);
        // Under the lock, with the registration's own handle when this is the last use: the
        // descriptor is deregistered before anyone can register it again (a handle dropped
        // after the lock made the next registration fail with EEXIST).
        // SAFETY: `self.fd` is dropped exactly once, here, and not used after.
        unsafe { ManuallyDrop::drop(&mut self.fd) };
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

impl DataConn {
    /// A data connection whose socket `open` opens when parts first come; its sending and
    /// reader tasks start with its first transfer. `withdrawals` counts the link's withdrawn
    /// ops (`TcpChannel::withdraw`).
    ///
    /// With `uring`, the connection sends through an io_uring of its own, made when the
    /// socket is opened (if the ring cannot be made then, the connection falls back to epoll
    /// and says so).
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
            io: OnceLock::new(),
            wants_uring: uring,
            sending: AtomicU8::new(Sending::Busy as u8),
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
        c.state.spawn(sender(c.clone()));
        c.state.spawn(reader(c.clone()));
    }

    /// Sends the parts of one op, at once when the connection is free (the rest, if the
    /// socket fills, goes to the sending task). On a closed connection they come back to be
    /// failed.
    pub(crate) fn submit(&self, parts: Vec<Pending>) -> Result<(), Vec<Pending>> {
        self.start();
        let c = &*self.conn;
        let mut done = Vec::new();
        let (sender, r) = {
            let mut tx = lock(&c.tx);
            if tx.closed {
                return Err(parts);
            }
            // An op of many parts (thousands of KV blocks) is handed to the sending task
            // whole: sending its first gather here would hold the submitter for no latency
            // gain.
            let many = parts.len() > GATHER_PARTS;
            let free = tx.is_free();
            // A list given to an empty backlog becomes it as it is (no copy of thousands of
            // parts).
            tx.queue(parts);
            let sender = handoff::sender(c.ring(), many, free);
            let r = match sender {
                Sender::Submitter => tx.pump(c, Via::Direct, SUBMIT_SEND_BYTES, &mut done),
                // With io_uring the ring is driven below, once the lock is free.
                Sender::Task | Sender::Ring | Sender::Current => Ok(Pumped::Idle),
            };
            (sender, r)
        };
        let r = match sender {
            // What the socket did not take goes to the sending task.
            Sender::Submitter => r.map(|p| c.hand_over(p)),
            Sender::Task => {
                c.tx_blocked.notify_one();
                Ok(())
            }
            // Before the socket is opened this finds it blocked: the sending task opens it.
            Sender::Ring => c
                .drive(Via::Direct, true, &mut done)
                .map(|p| c.hand_over(p)),
            Sender::Current => Ok(()),
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
            // A send the spinner left in flight is the sending task's again.
            c.hand_over(Pumped::Idle);
        }
    }

    /// Wakes the reader if it is parked while answers are awaited and nobody spins for them:
    /// when the last spinner stops, when an owner asks its transfer's status instead of
    /// awaiting it, and when an op is withdrawn (its answers must still be read).
    pub(crate) fn nudge(&self) {
        let c = &*self.conn;
        let rx = lock(&c.rx);
        let spinners = c.spinners.load(Ordering::SeqCst);
        let ring = handoff::nudge_wakes(rx.reader_parked, rx.awaiting(), spinners);
        c.kick_reader(rx, ring);
    }

    /// Drives both halves once without waiting, if nobody else is: sends what the socket
    /// takes, completes what has been answered. Returns whether anything moved. For a task
    /// that spins while awaiting a transfer.
    pub(crate) fn progress(&self) -> bool {
        let c = &*self.conn;
        let mut done = Vec::new();
        // Pumps what waits (if nobody else is) and reaps what completed; no syscall when
        // nothing was queued.
        let mut failed = c
            .drive(Via::Direct, false, &mut done)
            .map(|p| c.hand_over(p))
            .err();
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
