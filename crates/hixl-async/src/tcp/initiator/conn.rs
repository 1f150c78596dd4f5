//! A data connection's shared state: its socket and ring, the registration its tasks wait
//! on, pumping each half, and closing (every part it holds fails with the cause).

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hixl_core::Error;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::handoff::{self, Queued};
use super::{
    fail_with, Conn, Part, Pumped, Rx, Tx, Via, Watch, DRIVER_IDLE, DRIVER_RING, DRIVER_SPIN,
    DRIVE_ROUNDS, SPIN_SEND_BYTES,
};
use crate::completion::Completion;
use crate::rawio::{self, Watched};
use crate::sync::lock;
use crate::tcp::uring::{Piece, Uring};

impl Conn {
    /// The socket's descriptor; `None` until it is opened.
    pub(super) fn fd(&self) -> Option<RawFd> {
        self.sock.get().map(|s| s.as_raw_fd())
    }

    /// Registers the socket (`ring`: the io_uring) with tokio's reactor (if no other task
    /// has) for a task that is about to wait on it. A registration reports the current
    /// readiness at once, so bytes (completions) that came while it was unregistered are not
    /// missed.
    pub(super) fn watch(&self, ring: bool) -> std::io::Result<Watch<'_>> {
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
        Ok(Watch {
            reg,
            fd: ManuallyDrop::new(afd),
        })
    }

    /// `e`, unless the link is already down: then the link's cause (an op cut off by our own
    /// disconnect reports NOT_CONNECTED like the others, not the socket error it caused).
    pub(super) fn cause(&self, e: Error) -> Error {
        self.state.error().unwrap_or(e)
    }

    /// The connection failed with `e`: the link dies, and every part it holds fails.
    pub(super) fn fail(&self, e: Error) {
        if !self.state.is_dead() {
            tracing::warn!(peer = %self.peer, "data connection failed: {e}");
        }
        self.state.kill(e.clone());
        self.close(&self.cause(e));
    }

    /// Closes both halves, failing every part they hold with `cause`, and shuts the socket
    /// down. With io_uring, the ring is quiesced first: no request touches a part's memory
    /// once it is failed. Idempotent.
    pub(super) fn close(&self, cause: &Error) {
        if let Some(u) = self.ring.get() {
            if let Some(s) = self.sock.get() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            u.quiesce();
        }
        let unsent: Vec<Part> = lock(&self.tx).close();
        let unanswered = lock(&self.rx).answers.close();
        if let Some(s) = self.sock.get() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        fail_with(&self.ops.sink, unsent.into_iter().chain(unanswered), cause);
    }

    /// Pumps the sending half, then delivers what it finished. A pump that leaves work behind
    /// (the socket is full) hands it to the writer task, unless that task is the caller.
    pub(super) fn pump_tx(
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
    pub(super) fn sendmsg(&self, fd: RawFd, pieces: &[Piece<'_>]) -> std::io::Result<usize> {
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
    pub(super) fn drive(
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
    pub(super) fn hand_over(&self, u: &Uring) {
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
    pub(super) fn push_rx(&self, part: Part, via: Via) -> Result<(), Part> {
        let mut rx = lock(&self.rx);
        // Answers received ahead (with an earlier one, before this part was queued) wait in
        // the stage, announced by no readiness edge: the reader must look. Otherwise a parked
        // reader is woken unless a waiter spins now (the last to stop hands the answers over,
        // `DataConn::spinning`), or the part's submitter queued it and its owner will spin
        // for the answer on its own thread when it awaits the transfer (no wake-up of another
        // thread). An owner that does not await it hands it over when it asks the status or
        // drops it (`DataConn::nudge`).
        let ring = handoff::wakes_reader(Queued {
            staged: !rx.stage.is_empty(),
            parked: rx.reader_parked,
            spinners: self.spinners.load(Ordering::SeqCst),
            direct: via == Via::Direct,
            owners_spin: self.owners_spin,
        });
        rx.answers.push(part)?;
        self.kick_reader(rx, ring);
        Ok(())
    }

    /// Wakes the reader task when `ring`, releasing `rx` first; a kicked reader is no longer
    /// parked (a kick it has not waited for yet is kept by the `Notify`).
    pub(super) fn kick_reader(&self, mut rx: std::sync::MutexGuard<'_, Rx>, ring: bool) {
        if ring {
            rx.reader_parked = false;
            drop(rx);
            self.reader_kick.notify_one();
        }
    }

    pub(super) fn deliver(&self, done: &mut Vec<Completion>) {
        if !done.is_empty() {
            self.ops.sink.complete_all(done.drain(..));
        }
    }
}
