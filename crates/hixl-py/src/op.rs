//! `hixl._hixl.Op`: one asynchronous operation (a transfer, a connect, a notify, the next
//! notification...), awaitable from asyncio, waitable from any thread, cancellable.
//!
//! An op starts `Ready`: its future exists and nobody drives it. [`Op::spin`] polls it on the
//! calling thread (GIL released) for a bounded time: a small transfer finishes there without
//! any thread hand-off (the engine's own spin drives the link). [`Op::wait`] drives it to the
//! end on the calling thread. [`Op::drive`] hands it to a runtime task, which reports its end
//! through a [`Bell`] (an asyncio loop's eventfd) and the op's condition variable. Cancelling
//! drops the future: a transfer's parts not yet sent are withdrawn, as when a Rust transfer is
//! dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use hixl_core::{Error, TransferStatus};
use pyo3::prelude::*;

use crate::runtime;
use crate::waker::{lock, Bell, Waker};

/// What an op produces, turned into a Python object on the thread that collects it.
pub(crate) type OutFn = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;
/// An op's outcome before conversion.
pub(crate) type Outcome = Result<OutFn, ErrOut>;

/// An op's error before conversion.
pub(crate) enum ErrOut {
    /// An engine error: a `hixl.HixlError`.
    Hixl(Error),
    /// Any other, made into a Python exception when collected.
    Other(Box<dyn FnOnce(Python<'_>) -> PyErr + Send>),
}

impl ErrOut {
    fn into_py(self, py: Python<'_>) -> PyErr {
        match self {
            ErrOut::Hixl(e) => crate::hixl_err(e),
            ErrOut::Other(f) => f(py),
        }
    }

    fn is_timeout(&self) -> bool {
        matches!(self, ErrOut::Hixl(Error::Timeout { .. }))
    }
}

/// `Ok(None)` as an outcome.
pub(crate) fn none() -> OutFn {
    Box::new(|py| Ok(py.None()))
}

/// The future of an op.
pub(crate) enum Fut {
    /// A transfer: its status is asked of the engine.
    Transfer(hixl_async::Transfer),
    /// Anything else.
    Other(BoxFuture<'static, Outcome>),
}

impl Future for Fut {
    type Output = Outcome;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match self.get_mut() {
            Fut::Transfer(t) => Pin::new(t).poll(cx).map(|r| match r {
                Ok(()) => Ok(none()),
                Err(e) => Err(ErrOut::Hixl(e)),
            }),
            Fut::Other(f) => f.as_mut().poll(cx),
        }
    }
}

enum Slot {
    /// Not driven yet.
    Ready(Fut),
    /// Polled by the calling thread of `spin` or `wait` right now.
    Polling,
    /// Driven by a runtime task.
    Driving(tokio::task::AbortHandle),
    /// Finished; not yet collected.
    Done(Outcome),
    /// Collected: the Python result, kept for later calls.
    Collected(Result<Py<PyAny>, PyErr>),
}

struct Shared {
    slot: Mutex<Slot>,
    /// Rung when the slot becomes `Done` (or leaves `Polling`).
    changed: Condvar,
    /// Bells to ring when it finishes, with the id to report.
    bells: Mutex<Vec<Arc<Bell>>>,
    /// Final status, once finished (`TransferStatus::code`, or 4 for cancelled).
    status: Mutex<Option<u8>>,
}

/// A status code beyond HIXL's four: the op was cancelled.
const CANCELLED: u8 = 4;

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// `hixl._hixl.Op`.
#[pyclass(module = "hixl._hixl", frozen)]
pub(crate) struct Op {
    id: u64,
    shared: Arc<Shared>,
    /// For a transfer: its engine-side status while unfinished (kept by the Transfer itself;
    /// here only what the op knows).
    is_transfer: bool,
}

impl Op {
    pub(crate) fn new(fut: Fut) -> Op {
        let is_transfer = matches!(fut, Fut::Transfer(_));
        Op {
            id: next_id(),
            shared: Arc::new(Shared {
                slot: Mutex::new(Slot::Ready(fut)),
                changed: Condvar::new(),
                bells: Mutex::new(Vec::new()),
                status: Mutex::new(None),
            }),
            is_transfer,
        }
    }

    pub(crate) fn other<F>(f: F) -> Op
    where
        F: Future<Output = Outcome> + Send + 'static,
    {
        Op::new(Fut::Other(Box::pin(f)))
    }
}

fn status_of(o: &Outcome) -> u8 {
    match o {
        Ok(_) => TransferStatus::Completed.code(),
        Err(e) if e.is_timeout() => TransferStatus::TimedOut.code(),
        Err(ErrOut::Hixl(Error::Cancelled { .. })) => CANCELLED,
        Err(_) => TransferStatus::Failed.code(),
    }
}

/// Records the outcome (unless the op finished already) and tells everyone waiting.
fn finish(shared: &Shared, id: u64, o: Outcome) {
    {
        let mut slot = lock(&shared.slot);
        if matches!(*slot, Slot::Done(_) | Slot::Collected(_)) {
            return;
        }
        *lock(&shared.status) = Some(status_of(&o));
        *slot = Slot::Done(o);
    }
    shared.changed.notify_all();
    for b in std::mem::take(&mut *lock(&shared.bells)) {
        b.ring(id);
    }
}

fn cancelled() -> Outcome {
    Err(ErrOut::Hixl(Error::Cancelled {
        what: "the op (cancelled by its owner)",
    }))
}

/// A waker that does nothing: the spinning thread polls again by itself.
fn noop_waker() -> std::task::Waker {
    futures::task::noop_waker()
}

impl Op {
    /// Takes the future to poll it on this thread, unless someone else drives it.
    fn take_ready(&self) -> Option<Fut> {
        let mut slot = lock(&self.shared.slot);
        match std::mem::replace(&mut *slot, Slot::Polling) {
            Slot::Ready(f) => Some(f),
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Puts back a future polled on this thread that is not finished.
    fn put_back(&self, f: Fut) {
        {
            let mut slot = lock(&self.shared.slot);
            if matches!(*slot, Slot::Polling) {
                *slot = Slot::Ready(f);
            } else {
                // Cancelled meanwhile: `cancel` recorded the outcome; the future goes
                // (withdrawing what it has not sent).
                drop(slot);
                drop(f);
            }
        }
        self.shared.changed.notify_all();
    }

    /// Polls `f` on this thread until it finishes or `budget` passes (at least once). A
    /// transfer is polled again while `keep_on` says so of it; any other op is polled once.
    fn poll_for(
        f: &mut Fut,
        budget: Duration,
        keep_on: impl Fn(&hixl_async::Transfer) -> bool,
    ) -> Option<Outcome> {
        let _rt = runtime().enter();
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        let start = Instant::now();
        loop {
            if let Poll::Ready(o) = Pin::new(&mut *f).poll(&mut cx) {
                return Some(o);
            }
            let again = matches!(f, Fut::Transfer(t) if keep_on(t));
            if !again || start.elapsed() >= budget {
                return None;
            }
            std::hint::spin_loop();
        }
    }

    fn collect(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let mut slot = lock(&self.shared.slot);
        let r = match std::mem::replace(&mut *slot, Slot::Polling) {
            Slot::Done(o) => match o {
                Ok(f) => f(py),
                Err(e) => Err(e.into_py(py)),
            },
            Slot::Collected(r) => r,
            other => {
                *slot = other;
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "hixl: the op has not finished",
                ));
            }
        };
        let out = match &r {
            Ok(v) => Ok(v.clone_ref(py)),
            Err(e) => Err(e.clone_ref(py)),
        };
        *slot = Slot::Collected(r);
        out
    }
}

#[pymethods]
impl Op {
    /// The op's id (reported through a waker's `drain`).
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// Whether this op is a transfer.
    #[getter]
    fn is_transfer(&self) -> bool {
        self.is_transfer
    }

    /// Whether the op finished (completed, failed, timed out or cancelled).
    fn done(&self) -> bool {
        matches!(*lock(&self.shared.slot), Slot::Done(_) | Slot::Collected(_))
    }

    /// The status without waiting: 0 waiting, 1 completed, 2 timed out, 3 failed (HIXL's
    /// `TransferStatus`), 4 cancelled.
    fn status(&self) -> u8 {
        if let Some(s) = *lock(&self.shared.status) {
            return s;
        }
        if let Slot::Ready(Fut::Transfer(t)) = &*lock(&self.shared.slot) {
            return t.status().code();
        }
        TransferStatus::Waiting.code()
    }

    /// Polls the op on this thread (GIL released) for up to `budget_us` microseconds. Returns
    /// whether it finished.
    fn spin(&self, py: Python<'_>, budget_us: u64) -> bool {
        let Some(mut f) = self.take_ready() else {
            return self.done();
        };
        let budget = Duration::from_micros(budget_us);
        // A transfer that finished already (a same-host copy done at submission) is collected
        // without releasing the GIL: its poll returns at once.
        let finished = matches!(&f, Fut::Transfer(t) if t.peek() != TransferStatus::Waiting);
        let polled = if finished {
            Op::poll_for(&mut f, Duration::ZERO, |_| false)
        } else {
            py.detach(|| Op::poll_for(&mut f, budget, hixl_async::Transfer::spinning))
        };
        match polled {
            Some(o) => {
                finish(&self.shared, self.id, o);
                true
            }
            None => {
                self.put_back(f);
                self.done()
            }
        }
    }

    /// Hands the op to a runtime task; `waker`'s eventfd reports its end (with this op's id).
    /// If it finished already, the waker is rung at once.
    fn drive(&self, waker: &Waker) {
        lock(&self.shared.bells).push(waker.bell.clone());
        let mut slot = lock(&self.shared.slot);
        loop {
            match std::mem::replace(&mut *slot, Slot::Polling) {
                Slot::Ready(f) => {
                    let shared = self.shared.clone();
                    let id = self.id;
                    let task = runtime().spawn(async move {
                        let o = f.await;
                        finish(&shared, id, o);
                    });
                    *slot = Slot::Driving(task.abort_handle());
                    return;
                }
                Slot::Polling => {
                    // Another thread polls it now: it finishes it (ringing the bells) or puts
                    // it back; then look again.
                    slot = self
                        .shared
                        .changed
                        .wait(slot)
                        .unwrap_or_else(|p| p.into_inner());
                }
                done @ (Slot::Done(_) | Slot::Collected(_)) => {
                    *slot = done;
                    drop(slot);
                    for b in std::mem::take(&mut *lock(&self.shared.bells)) {
                        b.ring(self.id);
                    }
                    return;
                }
                driving @ Slot::Driving(_) => {
                    *slot = driving;
                    return;
                }
            }
        }
    }

    /// Blocks (GIL released) until the op finishes and returns its result, or raises its
    /// error. Past `timeout` seconds the op is abandoned (cancelled, as on drop) and
    /// `hixl.HixlTimeoutError` is raised. A transfer is polled on this thread for up to
    /// `spin_us` microseconds before the thread parks.
    #[pyo3(signature = (timeout=None, spin_us=0))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>, spin_us: u64) -> PyResult<Py<PyAny>> {
        let limit = timeout.map(crate::seconds).transpose()?;
        if let Some(mut f) = self.take_ready() {
            // Finished already (a same-host copy done at submission): collect it at once.
            if matches!(&f, Fut::Transfer(t) if t.peek() != TransferStatus::Waiting) {
                if let Some(o) = Op::poll_for(&mut f, Duration::ZERO, |_| false) {
                    drop(f);
                    finish(&self.shared, self.id, o);
                    return self.collect(py);
                }
            }
            // Drive it here: the fastest path (no thread hand-off). The thread blocks anyway:
            // it polls the op for up to `spin_us` (an op in flight, however it progresses),
            // then parks until the op's end wakes it.
            let spin = Duration::from_micros(spin_us).min(limit.unwrap_or(Duration::MAX));
            let o = py.detach(|| {
                if let Some(o) = Op::poll_for(&mut f, spin, |_| true) {
                    return Some(o);
                }
                let _rt = runtime().enter();
                let rest = limit.map(|d| d.saturating_sub(spin));
                runtime().block_on(async {
                    match rest {
                        None => Some((&mut f).await),
                        Some(d) => tokio::time::timeout(d, &mut f).await.ok(),
                    }
                })
            });
            match o {
                Some(o) => {
                    drop(f);
                    finish(&self.shared, self.id, o);
                }
                None => {
                    drop(f);
                    finish(
                        &self.shared,
                        self.id,
                        Err(ErrOut::Hixl(Error::Timeout {
                            what: "wait",
                            peer: String::new(),
                            after: limit.unwrap_or_default(),
                        })),
                    );
                }
            }
            return self.collect(py);
        }
        // Driven elsewhere: wait for its end.
        // A limit past any instant is none.
        let deadline = limit.and_then(|d| Instant::now().checked_add(d));
        let finished = py.detach(|| {
            let mut slot = lock(&self.shared.slot);
            loop {
                if matches!(*slot, Slot::Done(_) | Slot::Collected(_)) {
                    return true;
                }
                match deadline {
                    None => {
                        slot = self
                            .shared
                            .changed
                            .wait(slot)
                            .unwrap_or_else(|p| p.into_inner())
                    }
                    Some(d) => {
                        let now = Instant::now();
                        if now >= d {
                            return false;
                        }
                        slot = self
                            .shared
                            .changed
                            .wait_timeout(slot, d - now)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                }
            }
        });
        if !finished {
            self.abandon(Err(ErrOut::Hixl(Error::Timeout {
                what: "wait",
                peer: String::new(),
                after: limit.unwrap_or_default(),
            })));
        }
        self.collect(py)
    }

    /// The result of a finished op (raises its error; raises RuntimeError if unfinished).
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.collect(py)
    }

    /// Cancels the op: its future is dropped (a transfer's unsent parts are withdrawn; parts
    /// already sent may still land until the op's memory is deregistered, which waits for
    /// them). Returns whether it was still unfinished.
    fn cancel(&self) -> bool {
        self.abandon(cancelled())
    }
}

impl Op {
    /// Ends the op with `o` unless it finished: its future is dropped, its task aborted.
    fn abandon(&self, o: Outcome) -> bool {
        let mut slot = lock(&self.shared.slot);
        match std::mem::replace(&mut *slot, Slot::Polling) {
            Slot::Ready(f) => {
                drop(slot);
                drop(f);
            }
            Slot::Driving(h) => {
                drop(slot);
                h.abort();
            }
            Slot::Polling => {
                // The polling thread sees `Done` when it puts the future back, and drops it.
                drop(slot);
            }
            done => {
                *slot = done;
                return false;
            }
        }
        finish(&self.shared, self.id, o);
        true
    }
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Op>()
}

impl Drop for Op {
    /// A future dropped here (an op nobody awaited) is dropped inside the runtime's context:
    /// abandoning a transfer may need it.
    fn drop(&mut self) {
        let _rt = runtime().enter();
        let ready = {
            let mut slot = lock(&self.shared.slot);
            match &*slot {
                Slot::Ready(_) => Some(std::mem::replace(&mut *slot, Slot::Polling)),
                _ => None,
            }
        };
        drop(ready);
    }
}
