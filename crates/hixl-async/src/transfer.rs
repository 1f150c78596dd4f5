//! The `Transfer` future: an op already posted to the device, awaited for its result.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hixl_core::{Error, Result, Token, TransferStatus};
use tokio::time::Sleep;

use crate::keep::SharedOps;
use crate::rawio::SPIN_SLICE;
use crate::sync::lock;
use crate::telemetry::{Outcome, Started};
use crate::transport::Withdraw;

/// A transfer in flight (HIXL `TransferReq`). `.await` it for the result, or ask
/// [`Transfer::status`] without waiting.
///
/// The transfer was posted when it was created. Dropping it before it finishes does not free
/// anything the device may still touch: the op is parked until every part it posted is done,
/// and parts not yet sent are not sent.
#[must_use = "a transfer is posted already; await it to learn its result"]
pub struct Transfer {
    ops: SharedOps,
    /// The link that posted it, told when the transfer is dropped or times out.
    link: Option<Arc<dyn Withdraw>>,
    state: State,
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
    /// The peer's name, unless `link` names it (one reference count less per transfer).
    peer: Option<Arc<str>>,
    /// When the transfer's spin last saw progress (see [`spin`]).
    spun: Option<std::time::Instant>,
    /// Its telemetry, counted when it ends (see [`crate::telemetry`]).
    tele: Option<Box<Started>>,
    /// Past the deadline, resolve only once no part of the op is in flight
    /// ([`Transfer::quiesce_on_timeout`]).
    quiesce: bool,
}

enum State {
    /// AutoConnect: the link is being set up by a task, which then posts the transfer.
    Connecting(tokio::task::JoinHandle<Result<Transfer>>),
    Posted(Token),
    /// Timed out and abandoned, waiting until none of its parts is in flight any more; then
    /// it resolves with the timeout after this long.
    Quiescing(Token, Duration),
    Failed(Option<Error>),
    Done(TransferStatus),
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("peer", &self.peer_name())
            .field("status", &self.peek())
            .finish()
    }
}

impl Transfer {
    pub(crate) fn posted(ops: SharedOps, token: Token, link: Arc<dyn Withdraw>) -> Transfer {
        Transfer {
            ops,
            link: Some(link),
            state: State::Posted(token),
            deadline: None,
            peer: None,
            spun: None,
            tele: None,
            quiesce: false,
        }
    }

    /// The peer's name, for errors.
    fn peer_name(&self) -> &str {
        match (&self.peer, &self.link) {
            (Some(p), _) => p,
            (None, Some(l)) => l.peer(),
            (None, None) => "",
        }
    }

    pub(crate) fn failed(ops: SharedOps, e: Error, peer: Arc<str>) -> Transfer {
        Transfer {
            ops,
            link: None,
            state: State::Failed(Some(e)),
            deadline: None,
            peer: Some(peer),
            spun: None,
            tele: None,
            quiesce: false,
        }
    }

    /// A transfer whose link is still being connected (AutoConnect); `task` posts it.
    pub(crate) fn connecting(
        ops: SharedOps,
        task: tokio::task::JoinHandle<Result<Transfer>>,
        peer: Arc<str>,
    ) -> Transfer {
        Transfer {
            ops,
            link: None,
            state: State::Connecting(task),
            deadline: None,
            peer: Some(peer),
            spun: None,
            tele: None,
            quiesce: false,
        }
    }

    /// Attaches what the transfer's telemetry needs (its link's counters, size, post time).
    pub(crate) fn with_telemetry(mut self, s: Started) -> Transfer {
        self.tele = Some(Box::new(s));
        self
    }

    /// Counts the transfer as ended (once).
    fn ended(&mut self, outcome: Outcome) {
        if let Some(s) = self.tele.take() {
            s.end(outcome);
        }
    }

    /// Bounds the wait: past `after` the future resolves with [`Error::Timeout`] (HIXL
    /// `TIMEOUT`) and the op is abandoned as on drop.
    ///
    /// One deadline: a transfer whose deadline has passed when it is polled is a timeout even
    /// if its last part arrived meanwhile.
    pub fn timeout(mut self, after: Duration) -> Transfer {
        self.deadline = Some((Box::pin(tokio::time::sleep(after)), after));
        self
    }

    /// As [`Transfer::timeout`], with the deadline an instant (a caller's window that opened
    /// before the transfer was created, so that its parts' deadline is not later than it).
    pub fn deadline(mut self, at: tokio::time::Instant) -> Transfer {
        let after = at.saturating_duration_since(tokio::time::Instant::now());
        self.deadline = Some((Box::pin(tokio::time::sleep_until(at)), after));
        self
    }

    /// Past its deadline the transfer still abandons the op (parts not started are not
    /// started), but resolves with the timeout only once every part already in flight is done:
    /// after it returns, nothing of it moves any more. A caller that hands the memory on after
    /// a failed transfer (a leased pull releasing its lease, so that the owner reuses the
    /// source blocks) needs this; a part only ends with its completion or its link's failure.
    pub fn quiesce_on_timeout(mut self) -> Transfer {
        self.quiesce = true;
        self
    }

    /// Whether the transfer's last poll left it spinning: it saw progress within its link's
    /// spin period (`hixl.SpinUs`), so polling again soon drives it on this thread; `false`
    /// once it parked (it waits for its waker) or when it never spun. For callers that poll
    /// it by hand (a Python event loop's thread) to know when to stop.
    pub fn spinning(&self) -> bool {
        match (self.spun, self.link.as_deref(), &self.state) {
            (Some(t), Some(l), State::Posted(_)) => t.elapsed() < l.spin(),
            _ => false,
        }
    }

    /// The op's state without waiting (HIXL `GetTransferStatus`). An owner that polls this
    /// instead of awaiting the transfer does not drive it: a waiting op has its link's own
    /// tasks watch for its completion (no spinning owner will).
    pub fn status(&self) -> TransferStatus {
        let s = self.peek();
        if s == TransferStatus::Waiting {
            if let (State::Posted(_), Some(l)) = (&self.state, self.link.as_deref()) {
                l.nudge();
            }
        }
        s
    }

    /// The op's state without waiting, asking nothing of the link: for an owner about to
    /// await it (which then drives it), such as a binding checking whether it finished at
    /// submission.
    pub fn peek(&self) -> TransferStatus {
        match &self.state {
            State::Posted(t) => lock(&self.ops).status(*t).unwrap_or(TransferStatus::Failed),
            State::Connecting(_) => TransferStatus::Waiting,
            State::Quiescing(..) => TransferStatus::TimedOut,
            State::Failed(_) => TransferStatus::Failed,
            State::Done(s) => *s,
        }
    }
}

impl Future for Transfer {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        if let State::Connecting(task) = &mut this.state {
            match Pin::new(task).poll(cx) {
                Poll::Ready(Ok(Ok(mut posted))) => {
                    // Adopt the posted op; the inner handle must not abandon it on drop.
                    this.state =
                        std::mem::replace(&mut posted.state, State::Done(TransferStatus::Failed));
                    this.tele = posted.tele.take();
                }
                Poll::Ready(Ok(Err(e))) => this.state = State::Failed(Some(e)),
                Poll::Ready(Err(e)) => {
                    this.state = State::Failed(Some(Error::TaskEnded {
                        what: "auto-connect",
                        source: Arc::new(e),
                    }))
                }
                Poll::Pending => {
                    if let Some((sleep, after)) = &mut this.deadline {
                        if sleep.as_mut().poll(cx).is_ready() {
                            // The task finishes the connect (bounded) and drops what it posts.
                            let after = *after;
                            this.state = State::Done(TransferStatus::TimedOut);
                            this.ended(Outcome::TimedOut);
                            return Poll::Ready(Err(Error::Timeout {
                                what: "transfer (while auto-connecting)",
                                peer: this.peer_name().to_string(),
                                after,
                            }));
                        }
                    }
                    return Poll::Pending;
                }
            }
        }
        let token = match &mut this.state {
            State::Connecting(_) => return Poll::Pending,
            State::Posted(t) => *t,
            State::Quiescing(t, after) => {
                let (t, after) = (*t, *after);
                return poll_quiesced(this, t, after, cx);
            }
            State::Failed(e) => {
                let e = e.take().unwrap_or(Error::UnknownRequest { req: 0 });
                this.state = State::Done(TransferStatus::Failed);
                this.ended(Outcome::Failed);
                return Poll::Ready(Err(e));
            }
            State::Done(_) => {
                return Poll::Ready(Err(Error::AlreadyFinished {
                    peer: this.peer_name().to_string(),
                }))
            }
        };
        // The deadline first: a result that arrived after it is a timeout too.
        if let Some((sleep, after)) = &mut this.deadline {
            if sleep.as_mut().poll(cx).is_ready() {
                let after = *after;
                abandon(&this.ops, this.link.as_deref(), token);
                if this.quiesce {
                    this.state = State::Quiescing(token, after);
                    return poll_quiesced(this, token, after, cx);
                }
                return timed_out(this, after);
            }
        }
        let mut r = lock(&this.ops).poll_result(token, cx.waker().clone());
        if r.is_none() {
            if let Some(link) = this.link.as_deref() {
                r = spin(&this.ops, link, token, &mut this.spun, cx);
            }
        }
        if let Some(r) = r {
            // A device error (a copy engine's syscall) is the link's failure: name the peer.
            let r = r.map_err(|e| match e {
                e @ Error::Io { .. } => Error::transport(this.peer_name(), "device I/O", e),
                e => e,
            });
            this.state = State::Done(if r.is_ok() {
                TransferStatus::Completed
            } else {
                TransferStatus::Failed
            });
            this.ended(if r.is_ok() {
                Outcome::Completed
            } else {
                Outcome::Failed
            });
            return Poll::Ready(r);
        }
        Poll::Pending
    }
}

/// A transfer past its deadline, abandoned already: the timeout.
fn timed_out(this: &mut Transfer, after: Duration) -> Poll<Result<()>> {
    this.state = State::Done(TransferStatus::TimedOut);
    this.ended(Outcome::TimedOut);
    Poll::Ready(Err(Error::Timeout {
        what: "transfer",
        peer: this.peer_name().to_string(),
        after,
    }))
}

/// A timed-out transfer that quiesces: the timeout once the op's last part in flight is done
/// (its slot reaped), pending until then (woken by that part's completion).
fn poll_quiesced(
    this: &mut Transfer,
    token: Token,
    after: Duration,
    cx: &mut Context<'_>,
) -> Poll<Result<()>> {
    if lock(&this.ops).watch_parked(token, cx.waker().clone()) {
        // Drive the link here too (answers arrive on this thread when it spins).
        if let Some(link) = this.link.as_deref() {
            link.progress();
        }
        if lock(&this.ops).watch_parked(token, cx.waker().clone()) {
            return Poll::Pending;
        }
    }
    timed_out(this, after)
}

impl Drop for Transfer {
    fn drop(&mut self) {
        // Dropped before its owner awaited its end: one that finished meanwhile (its owner
        // asked `status`) counts as it ended, a refused one as failed, the rest as abandoned.
        if self.tele.is_some() {
            let outcome = match &self.state {
                State::Posted(t) => match lock(&self.ops).status(*t) {
                    Some(TransferStatus::Completed) => Outcome::Completed,
                    Some(TransferStatus::Failed) => Outcome::Failed,
                    _ => Outcome::Abandoned,
                },
                State::Failed(_) => Outcome::Failed,
                _ => Outcome::Abandoned,
            };
            self.ended(outcome);
        }
        if let State::Posted(t) = self.state {
            abandon(&self.ops, self.link.as_deref(), t);
        }
    }
}

/// Spins on the link while the op is in flight: drives the link's channels (sending, and
/// receiving answers, on this thread) and drains the engine's completion queue, until the op
/// is done or nothing moved for the link's spin period. An op that finishes meanwhile reaches
/// its owner without any thread being woken; one that does not is left to the transports'
/// tasks and the reactor, which wake the owner (its waker is registered already).
///
/// The spin is adaptive in the sense that matters: it lasts while work moves (a large op keeps
/// spinning as long as bytes flow) and stops after a quiet period about as long as parking
/// and waking costs, so an idle engine is quiet shortly after its last op.
///
/// It spins in slices of [`SPIN_SLICE`]: past one, it yields to the runtime (waking itself)
/// and goes on when polled next, so other tasks of its thread still run. `last` carries the
/// time of the last progress across those polls.
fn spin(
    ops: &SharedOps,
    link: &dyn Withdraw,
    token: Token,
    last: &mut Option<std::time::Instant>,
    cx: &mut Context<'_>,
) -> Option<Result<()>> {
    let quiet = link.spin();
    if quiet.is_zero() {
        return None;
    }
    let start = std::time::Instant::now();
    let since = last.get_or_insert(start);
    if start.duration_since(*since) >= quiet {
        // Parked already: woken by the op's completion, or polled for another reason.
        return None;
    }
    link.spinning(true);
    let r = spin_on(ops, link, token, since, quiet, start, cx);
    link.spinning(false);
    r
}

/// The loop of [`spin`], between the link's `spinning(true)` and `spinning(false)`.
fn spin_on(
    ops: &SharedOps,
    link: &dyn Withdraw,
    token: Token,
    since: &mut std::time::Instant,
    quiet: std::time::Duration,
    start: std::time::Instant,
    cx: &mut Context<'_>,
) -> Option<Result<()>> {
    loop {
        let moved = link.progress();
        if lock(ops).phase(token) == Some(hixl_core::Phase::Done) {
            return lock(ops).poll_result(token, cx.waker().clone());
        }
        let now = std::time::Instant::now();
        if moved {
            *since = now;
        } else if now.duration_since(*since) >= quiet {
            return None;
        }
        if now.duration_since(start) >= SPIN_SLICE {
            cx.waker().wake_by_ref();
            return None;
        }
        std::hint::spin_loop();
    }
}

/// The owner of `token` went away (dropped, or its deadline passed): the op is parked until
/// its outstanding parts are done, and parts not yet started are not started. TCP writers
/// check before sending; fabric copies still queued on a copy stream are withdrawn here.
fn abandon(ops: &SharedOps, link: Option<&dyn Withdraw>, token: Token) {
    lock(ops).abandon(token);
    if let Some(l) = link {
        l.withdraw(token);
    }
}
