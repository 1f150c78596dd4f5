//! A data connection's shared state: its socket and I/O, the registrations its tasks wait
//! on, driving the sending half and handing over what a drive left, and closing (every part
//! it holds fails with the cause).

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hixl_core::Error;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::handoff::{self, Queued, Sending};
use super::io::Io;
use super::{fail_with, Conn, Part, Pumped, Rx, Via, Watch, DRIVE_ROUNDS, SPIN_SEND_BYTES};
use crate::completion::Completion;
use crate::rawio::Watched;
use crate::sync::lock;

impl Conn {
    /// The socket's descriptor; `None` until it is opened.
    pub(super) fn fd(&self) -> Option<RawFd> {
        self.sock.get().map(|s| s.as_raw_fd())
    }

    /// The socket's descriptor and the connection's I/O; `None` until it is opened.
    pub(super) fn opened(&self) -> Option<(RawFd, &Io)> {
        // The I/O is set before the socket.
        Some((self.fd()?, self.io.get()?))
    }

    /// Whether sends go through a ring: the connection's I/O once opened, else what it asks
    /// for.
    pub(super) fn ring(&self) -> bool {
        self.io.get().map_or(self.wants_uring, Io::is_ring)
    }

    /// What the sending task waits for now.
    pub(super) fn sending(&self) -> Sending {
        Sending::from_u8(self.sending.load(Ordering::SeqCst))
    }

    /// Registers, for a task about to wait, what it waits on with tokio's reactor (if no
    /// other task has): the socket's read readiness for the reader, what `sending` (the
    /// connection's I/O) waits on for the sending task ([`Io::waits_on`]). A registration
    /// reports the current readiness at once, so bytes (completions) that came while it was
    /// unregistered are not missed.
    pub(super) fn watch<'c>(&'c self, sending: Option<&'c Io>) -> std::io::Result<Watch<'c>> {
        let (awaits, own) = sending.map_or((Interest::READABLE, None), Io::waits_on);
        let (fd, interest, reg) = match own {
            Some((fd, reg)) => (fd, awaits, reg),
            // The socket's registration serves both tasks.
            None => (
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
                // the connection (its `watch` field, or its ring's, dropped before `io`'s ring
                // and `sock`) and by `Watch` guards borrowing it, so it ends while the
                // descriptor is still open.
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
            awaits,
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
    /// down. The I/O is quiesced first ([`Io::quiesce`]): no request touches a part's memory
    /// once it is failed. Idempotent.
    pub(super) fn close(&self, cause: &Error) {
        if let Some(io) = self.io.get() {
            io.quiesce(self.sock.get());
        }
        let unsent: Vec<Part> = lock(&self.tx).close();
        let unanswered = lock(&self.rx).answers.close();
        if let Some(s) = self.sock.get() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        fail_with(&self.ops.sink, unsent.into_iter().chain(unanswered), cause);
    }

    /// Drives the sending half: pumps it (its gathers sent, or with io_uring queued on the
    /// ring), then flushes the I/O (one `io_uring_enter` submits, completions are reaped) and
    /// goes round again while completions came. `wait`: take the lock even when contended (a
    /// task, a submitter); a spinner only tries it. Returns how the last pump left the half
    /// (blocked also before the socket is opened: the sending task opens it).
    ///
    /// Answers are received the same way for both kinds, by nonblocking `recv` when the
    /// socket is readable: an io_uring receive completes through task work signalled to the
    /// thread that submitted it, which costs a round trip 20–40 µs more than a `recv` on a
    /// vCPU (measured; see `docs/benchmarks.md`), while a send with room in the socket buffer
    /// completes inside `io_uring_enter`.
    pub(super) fn drive(
        &self,
        via: Via,
        wait: bool,
        done: &mut Vec<Completion>,
    ) -> Result<Pumped, Error> {
        let budget = match via {
            Via::Task => usize::MAX,
            Via::Direct => SPIN_SEND_BYTES,
        };
        let mut pumped = Pumped::Idle;
        for _ in 0..DRIVE_ROUNDS {
            let tx = if wait {
                Some(lock(&self.tx))
            } else {
                self.tx.try_lock().ok()
            };
            pumped = match tx {
                Some(mut tx) if !tx.closed && !tx.is_free() => tx.pump(self, via, budget, done)?,
                _ => Pumped::Idle,
            };
            // Not open: nothing was queued on any ring.
            let Some(io) = self.io.get() else {
                break;
            };
            match io.flush() {
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
        Ok(pumped)
    }

    /// After a submitter or a spinner drove the connection, its last pump leaving the half
    /// `pumped`: wakes the sending task if what was left needs it ([`Io::hands_over`]) and it
    /// does not wait for it already. Before the socket is opened, parts left are the task's
    /// to open it for.
    pub(super) fn hand_over(&self, pumped: Pumped) {
        let blocked = pumped == Pumped::Blocked;
        let needed = match self.io.get() {
            None => blocked,
            Some(io) => io.hands_over(
                blocked,
                || self.spinners.load(Ordering::SeqCst),
                || self.sending(),
                || {
                    self.tx
                        .try_lock()
                        .is_ok_and(|tx| !tx.closed && !tx.is_free())
                },
            ),
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
