//! The reactor: one task per engine that drains completion queues into the op table and wakes
//! the tasks waiting on finished ops.
//!
//! Each turn is poll → arm → poll → park. A completion that arrives between the first poll and
//! the arm is caught by the second poll; one that arrives after the arm rings the eventfd, so
//! the park returns at once. Nothing is lost either way (see the tests, which inject completions
//! between the steps).

use std::sync::{Arc, Mutex};
use std::task::Waker;

use std::os::fd::{AsRawFd, RawFd};

use hixl_core::{Completed, CompletionSource, PartResult};

use crate::keep::{Keep, SharedOps};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How many empty polls the reactor spins (yielding to tokio) before arming the fd and parking.
const BUSY_POLLS: u32 = 4;

/// Scratch space of one drain, reused.
#[derive(Default)]
struct Drain {
    batch: Vec<PartResult>,
    wake: Vec<Waker>,
    /// Keep-alive of ops reaped by the batch, dropped once the op table is unlocked.
    reaped: Vec<Keep>,
}

/// Drains completion queues into an op table. The async loop is [`Reactor::run`]; the steps
/// are separate so tests can interleave completions with them.
///
/// Exactly one drain runs at a time (the `drain` lock). Besides the reactor task, a device
/// task that just posted completions may run a drain inline when nobody else is draining
/// ([`Reactor::poll_inline`]): the completion then reaches its waiter without a trip through
/// the eventfd and the reactor task, which matters for small-op latency.
pub(crate) struct Reactor {
    sources: Vec<Arc<dyn CompletionSource>>,
    /// Busy-poll budget: after the last completion the reactor keeps polling this long before
    /// it arms and parks (0: a few yields only). Bounded, so an idle engine uses no CPU.
    busy: std::time::Duration,
    ops: SharedOps,
    drain: Mutex<Drain>,
    /// Set once the engine shuts down or is dropped: the reactor then runs on until no op has
    /// parts outstanding, so every transfer in flight still resolves.
    stopping: std::sync::atomic::AtomicBool,
    /// Rung by a drain that, while stopping, leaves no op outstanding (the drain may be an
    /// inline one, which the parked reactor would not see).
    settled: tokio::sync::Notify,
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor").finish_non_exhaustive()
    }
}

impl Reactor {
    /// A reactor over the completion queues of every backend the engine runs.
    pub(crate) fn new(sources: Vec<Arc<dyn CompletionSource>>, ops: SharedOps) -> Reactor {
        Reactor {
            sources,
            busy: std::time::Duration::ZERO,
            ops,
            drain: Mutex::new(Drain {
                batch: Vec::with_capacity(1024),
                wake: Vec::with_capacity(64),
                reaped: Vec::with_capacity(64),
            }),
            stopping: std::sync::atomic::AtomicBool::new(false),
            settled: tokio::sync::Notify::new(),
        }
    }

    /// Poll: applies every queued completion; wakes owners after releasing the op-table
    /// lock. Returns how many completions were applied.
    pub(crate) fn poll(&self) -> usize {
        self.poll_with(&mut crate::sync::lock(&self.drain))
    }

    /// A poll run by a producer right after posting. `None` when a drain is already running;
    /// the producer must then ring the eventfd, since that drain may have taken its batch
    /// before the producer's push.
    pub(crate) fn poll_inline(&self) -> Option<usize> {
        match self.drain.try_lock() {
            Ok(mut d) => Some(self.poll_with(&mut d)),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                let mut d = crate::sync::recover(p);
                Some(self.poll_with(&mut d))
            }
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    fn poll_with(&self, d: &mut Drain) -> usize {
        let Drain {
            batch,
            wake,
            reaped,
        } = d;
        let n: usize = self.sources.iter().map(|s| s.drain(batch)).sum();
        if n == 0 {
            return 0;
        }
        {
            let mut ops = crate::sync::lock(&self.ops);
            for (token, result) in batch.drain(..) {
                match ops.complete(token, result, reaped) {
                    Completed::Finished(Some(w)) | Completed::Reaped(Some(w)) => wake.push(w),
                    Completed::Stale => {
                        tracing::debug!(token = token.0, "stale completion ignored")
                    }
                    Completed::Finished(None) | Completed::Pending | Completed::Reaped(None) => {}
                }
            }
            if self.stopping.load(std::sync::atomic::Ordering::Acquire) && ops.outstanding() == 0 {
                self.settled.notify_one();
            }
        }
        batch.clear();
        // Leases and mappings drop outside the op table's lock (a drop may wake a
        // deregistration or a revocation, or unmap memory).
        reaped.clear();
        for w in wake.drain(..) {
            w.wake();
        }
        n
    }

    /// Sets the busy-poll budget.
    pub(crate) fn with_busy_poll(mut self, busy: std::time::Duration) -> Reactor {
        self.busy = busy;
        self
    }

    /// Arm every source before parking.
    pub(crate) fn arm(&self) {
        for s in &self.sources {
            s.arm();
        }
    }

    fn disarm(&self) {
        for s in &self.sources {
            s.disarm();
        }
    }

    /// Whether no op has parts outstanding.
    fn is_settled(&self) -> bool {
        crate::sync::lock(&self.ops).outstanding() == 0
    }

    /// Runs until the engine shuts down (or is dropped) and then, so that every transfer in
    /// flight resolves, until no op has parts outstanding. Transports end their parts when
    /// their links close (TCP fails them, the fabric withdraws queued copies and finishes
    /// running ones, verbs flushes its queue pair), so this ends.
    pub(crate) async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        use std::sync::atomic::Ordering;
        let mut afds = Vec::with_capacity(self.sources.len());
        for s in &self.sources {
            // SAFETY: the fd belongs to the source, which the Arc inside SourceFd keeps alive
            // (and open, returning the same fd) for the AsyncFd's whole lifetime.
            match unsafe {
                AsyncFd::register_with_interest(SourceFd(s.clone()), Interest::READABLE)
            } {
                Ok(a) => afds.push(a),
                Err(e) => {
                    tracing::error!("reactor cannot watch a completion fd: {e}");
                    return;
                }
            }
        }
        let mut stopping = false;
        loop {
            if stopping && self.is_settled() {
                self.poll();
                return;
            }
            if !self.busy.is_zero() && !stopping {
                let mut until = std::time::Instant::now() + self.busy;
                while std::time::Instant::now() < until {
                    if self.poll() > 0 {
                        until = std::time::Instant::now() + self.busy;
                    }
                    tokio::task::yield_now().await;
                }
            }
            let mut idle = 0;
            while idle < BUSY_POLLS {
                if self.poll() == 0 {
                    idle += 1;
                    tokio::task::yield_now().await;
                } else {
                    idle = 0;
                }
            }
            self.arm();
            if self.poll() > 0 {
                self.disarm();
                continue;
            }
            let ready = futures::future::select_all(afds.iter().map(|a| Box::pin(a.readable())));
            tokio::select! {
                (r, _, _) = ready => match r {
                    Ok(mut g) => g.clear_ready(),
                    Err(e) => {
                        tracing::error!("reactor completion fd failed: {e}");
                        return;
                    }
                },
                // Also when the engine (the sender) is dropped.
                _ = shutdown.changed(), if !stopping => {
                    stopping = true;
                    self.stopping.store(true, Ordering::Release);
                    self.disarm();
                }
                _ = self.settled.notified(), if stopping => self.disarm(),
            }
        }
    }
}

/// Lets AsyncFd watch a completion source's fd while keeping the source alive.
struct SourceFd(Arc<dyn CompletionSource>);

impl AsRawFd for SourceFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::CompletionQueue;
    use hixl_core::Error;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn setup() -> (Reactor, Arc<CompletionQueue>, SharedOps) {
        let cq = Arc::new(CompletionQueue::new().unwrap());
        let ops = Arc::new(Mutex::new(hixl_core::OpTable::new()));
        (Reactor::new(vec![cq.clone()], ops.clone()), cq, ops)
    }

    fn waiting_op(ops: &Mutex<crate::keep::Ops>, count: &Arc<Count>) -> hixl_core::Token {
        let mut t = ops.lock().unwrap();
        let tok = t.insert();
        t.post(tok, 1, [], &mut Vec::new()).unwrap();
        assert!(t.poll_result(tok, Waker::from(count.clone())).is_none());
        tok
    }

    #[test]
    fn completion_between_poll_and_arm_is_seen_by_second_poll() {
        let (r, cq, ops) = setup();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let tok = waiting_op(&ops, &count);
        assert_eq!(r.poll(), 0);
        cq.push(tok, Ok(())); // injected between the polls
        assert!(!cq.is_rung(), "not armed yet: no syscall");
        r.arm();
        assert_eq!(r.poll(), 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn poisoned_locks_drop_no_completion() {
        let (r, cq, ops) = setup();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let tok = waiting_op(&ops, &count);
        // A panic while holding the op table's lock poisons it (a bug elsewhere).
        let o = ops.clone();
        let _ = std::thread::spawn(move || {
            let _g = o.lock().unwrap();
            panic!("poison the op table");
        })
        .join();
        assert!(ops.is_poisoned());
        cq.push(tok, Ok(()));
        assert_eq!(r.poll(), 1);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the waiter was still woken"
        );
        assert_eq!(
            crate::sync::lock(&ops).live(),
            1,
            "done, waiting to be taken"
        );
    }

    #[test]
    fn completion_after_arm_rings_the_fd() {
        let (r, cq, ops) = setup();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let tok = waiting_op(&ops, &count);
        assert_eq!(r.poll(), 0);
        r.arm();
        assert_eq!(r.poll(), 0);
        cq.push(tok, Err(Error::NotInitialized)); // while parking
        assert!(cq.is_rung(), "armed queue must ring so the park returns");
        assert_eq!(r.poll(), 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        // arming again consumes the old ring
        r.arm();
        assert!(!cq.is_rung());
    }

    #[test]
    fn inline_drain_wakes_and_yields_to_a_running_drain() {
        let (r, cq, ops) = setup();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let tok = waiting_op(&ops, &count);
        r.arm();
        cq.push_quiet([(tok, Ok(()))]);
        assert!(!cq.is_rung(), "a quiet push does not ring");
        {
            let _running = r.drain.lock().unwrap();
            assert_eq!(r.poll_inline(), None, "must not wait for a running drain");
        }
        assert_eq!(r.poll_inline(), Some(1));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_loop_wakes_waiters_from_other_threads() {
        let (r, cq, ops) = setup();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let h0 = tokio::spawn(Arc::new(r).run(rx));
        for _ in 0..200 {
            let tok = {
                let mut t = ops.lock().unwrap();
                let k = t.insert();
                t.post(k, 1, [], &mut Vec::new()).unwrap();
                k
            };
            let cq2 = cq.clone();
            std::thread::spawn(move || cq2.push(tok, Ok(())));
            std::future::poll_fn(|cx| {
                match ops.lock().unwrap().poll_result(tok, cx.waker().clone()) {
                    Some(r) => std::task::Poll::Ready(r),
                    None => std::task::Poll::Pending,
                }
            })
            .await
            .unwrap();
        }
        tx.send(true).unwrap();
        h0.await.unwrap();
    }
}
