//! The connection's two tasks, the same for epoll and io_uring: the sending task (which opens
//! the socket when the first parts come) and the reader; each takes over only when the socket
//! blocks and nobody else drives it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hixl_core::Error;
use tokio::sync::watch::Receiver;
use tokio::sync::Notify;

use super::handoff::{self, Sending};
use super::io::Io;
use super::{lost, Conn, Pumped, Via, Watch};
use crate::completion::Completion;
use crate::sync::lock;

/// A task's registration of what it waits on (`sending`: see [`Conn::watch`]), made in `slot`
/// on first need and kept until the task drops it. `None` when tokio refuses the
/// registration: the connection has failed then.
pub(super) fn watching<'s, 'c>(
    conn: &'c Conn,
    sending: Option<&'c Io>,
    slot: &'s mut Option<Watch<'c>>,
) -> Option<&'s Watch<'c>> {
    if slot.is_none() {
        match conn.watch(sending) {
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
pub(super) async fn open_socket(
    conn: &Conn,
    dead: &mut Receiver<bool>,
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

/// One drive of the sending half by the sending task, its completions delivered: `None`
/// when the connection failed.
fn turn(conn: &Conn, done: &mut Vec<Completion>) -> Option<Pumped> {
    conn.sending.store(Sending::Busy as u8, Ordering::SeqCst);
    let r = conn.drive(Via::Task, true, done);
    conn.deliver(done);
    match r {
        Ok(p) => Some(p),
        Err(e) => {
            conn.fail(e);
            None
        }
    }
}

/// Waits for `n` unless the link dies first: `false` when it died.
pub(super) async fn woken(dead: &mut Receiver<bool>, n: &Notify) -> bool {
    tokio::select! {
        biased;
        r = dead.changed() => { let _ = r; false }
        _ = n.notified() => true,
    }
}

/// A connection task ends: the connection closes with the link's cause.
pub(super) fn end(conn: &Conn) {
    let cause = conn
        .state
        .error()
        .unwrap_or_else(|| lost(&conn.peer, "link closed"));
    conn.close(&cause);
}

/// Sends what the submitters and spinners left when the socket was full or a send was still
/// in flight on the ring (or before the socket was open: this task opens it, and its I/O),
/// whenever nobody else does. It waits for what its I/O waits on (the socket's write
/// readiness, the ring's completions; registered with tokio for the wait only) or for a kick.
/// Every wait races the link's death: a peer that stopped reading (frozen, or the network
/// cut) must not keep parts unresolved after the link was closed.
pub(super) async fn sender(conn: Arc<Conn>) {
    let mut dead = conn.state.subscribe();
    let mut done = Vec::new();
    if let Some(io) = open(&conn, &mut dead).await {
        send(&conn, io, &mut dead, &mut done).await;
    }
    end(&conn);
}

/// Waits for the connection's first parts, then opens its socket and its I/O: `None` if the
/// link died first or the open failed (which fails the connection).
async fn open<'c>(conn: &'c Conn, dead: &mut Receiver<bool>) -> Option<&'c Io> {
    loop {
        if *dead.borrow() || !woken(dead, &conn.tx_blocked).await {
            return None;
        }
        if lock(&conn.tx).is_free() {
            continue;
        }
        let s = open_socket(conn, dead).await?;
        // Set before the socket: a pump that sees the socket sees its I/O.
        let _ = conn.io.set(Io::open(conn.wants_uring, &conn.peer));
        let _ = conn.sock.set(s);
        return conn.io.get();
    }
}

/// The sending task's loop once the connection is open, until it or the link fails.
async fn send(conn: &Conn, io: &Io, dead: &mut Receiver<bool>, done: &mut Vec<Completion>) {
    let mut watch: Option<Watch<'_>> = None;
    let spinners = || conn.spinners.load(Ordering::SeqCst);
    // Pump first: the socket has room more often than not.
    let Some(mut pumped) = turn(conn, done) else {
        return;
    };
    loop {
        let waits = io.waits(pumped == Pumped::Blocked, spinners);
        conn.sending.store(waits as u8, Ordering::SeqCst);
        // Published: a submitter or spinner that changes things from here on wakes us
        // (`Conn::hand_over`). What changed before, we see now.
        if !io.again(waits, || !lock(&conn.tx).is_free(), spinners) {
            if waits != Sending::Io {
                watch = None;
                if !woken(dead, &conn.tx_blocked).await {
                    return;
                }
            } else {
                let Some(w) = watching(conn, Some(io), &mut watch) else {
                    return;
                };
                tokio::select! {
                    biased;
                    r = dead.changed() => { let _ = r; return }
                    _ = conn.tx_blocked.notified(), if io.kick_ends_wait() => {}
                    r = w.ready() => match r {
                        Ok(mut g) => {
                            // Cleared before the drive (the socket) or after it (the ring's
                            // completions), see `Io::drives_before_clearing`.
                            if !io.drives_before_clearing() {
                                g.clear_ready();
                            }
                            let Some(p) = turn(conn, done) else {
                                return;
                            };
                            pumped = p;
                            g.clear_ready();
                            continue;
                        }
                        Err(e) => {
                            let e = Error::connection_lost(&conn.peer, "waiting to send", e);
                            conn.fail(conn.cause(e));
                            return;
                        }
                    },
                }
            }
        }
        if *dead.borrow() {
            return;
        }
        let Some(p) = turn(conn, done) else {
            return;
        };
        pumped = p;
    }
}

/// Receives answers that nobody spinning takes: while answers are awaited and no waiter
/// spins, it waits on the socket's read readiness (registering the socket with tokio for the
/// wait); otherwise it waits for a pushed part or the end of the spin.
pub(super) async fn reader(conn: Arc<Conn>) {
    let mut dead = conn.state.subscribe();
    let mut done = Vec::new();
    let mut watch: Option<Watch<'_>> = None;
    loop {
        if *dead.borrow() {
            break;
        }
        let parked = {
            let mut rx = lock(&conn.rx);
            if rx.answers.is_closed() {
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
            let spinners = conn.spinners.load(Ordering::SeqCst);
            let parked = handoff::reader_parks(rx.awaiting(), conn.sock.get().is_some(), spinners);
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
        let Some(w) = watching(&conn, None, &mut watch) else {
            break;
        };
        tokio::select! {
            biased;
            r = dead.changed() => { let _ = r; break }
            // A part queued while answers for it wait in the stage (see `push_rx`).
            _ = conn.reader_kick.notified() => {}
            r = w.ready() => match r {
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
