//! The connection's tasks: the lazy socket, the writer and the reader (epoll), and the
//! io_uring driver; each takes over only when the socket blocks and nobody else drives it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hixl_core::Error;
use tokio::sync::Notify;

use super::handoff;
use super::{lost, Conn, Pumped, Via, Watch, DRIVER_BUSY, DRIVER_IDLE, DRIVER_RING, DRIVER_SPIN};
use crate::completion::Completion;
use crate::sync::lock;
use crate::tcp::uring::Uring;

/// A task's registration of the socket, made in `slot` on first need and kept until the
/// task drops it. `None` when tokio refuses the registration: the connection has failed then.
pub(super) fn watching<'s, 'c>(
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
pub(super) async fn open_socket(
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
pub(super) fn turn(conn: &Conn, u: &Uring, done: &mut Vec<Completion>) -> bool {
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
pub(super) async fn woken(dead: &mut tokio::sync::watch::Receiver<bool>, n: &Notify) -> bool {
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

/// Sends what the submitters and spinners left when the socket was full (or before it was
/// open: this task opens it), waiting on the socket's write readiness. Every wait races the
/// link's death: a peer that stopped reading (frozen, or the network cut) must not keep parts
/// unresolved after the link was closed.
pub(super) async fn writer(conn: Arc<Conn>) {
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
pub(super) async fn driver(conn: Arc<Conn>) {
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
