//! The target's fabric channel: hands a same-host initiator the memfds of its exported pool
//! regions, takes notifies on the fast path, and runs the revocation handshake.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::{Channel, FabricRegion, Message, NO_FD};
use hixl_core::{Error, Status};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};

use super::chan::{recv_frame, send_frame};
use crate::memory::RegionInner;
use crate::sync::lock;
use crate::transport::target::{PerSession, Session, TargetCx};

/// The target's end of each session's fabric channel (kept by the fabric transport).
pub(crate) type Chans = Arc<PerSession<FabricChan>>;

/// How long a deregistration waits for a peer to confirm it stopped using a region.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A frame for the initiator, with the fds that ride along.
type Out = (Message, Vec<OwnedFd>);

/// The target's end of one initiator's fabric channel.
#[derive(Debug)]
pub(crate) struct FabricChan {
    tx: mpsc::UnboundedSender<Out>,
    revokes: Mutex<HashMap<u64, Vec<oneshot::Sender<()>>>>,
    /// Frames queued and not yet written (or given up on).
    unsent: std::sync::atomic::AtomicUsize,
    /// Rung when `unsent` drops to 0.
    drained: tokio::sync::Notify,
}

/// How long closing a session waits for its fabric channel's queued frames.
const FLUSH_BOUND: Duration = Duration::from_secs(1);

/// Resolves once `sess`'s fabric channel has written what it had queued (at most
/// [`FLUSH_BOUND`]), or at once without a channel.
pub(crate) async fn flush(chans: &Chans, sess: &Session) {
    let Some(chan) = chans.get(sess.id) else {
        return;
    };
    let wait = async {
        loop {
            let drained = chan.drained.notified();
            if chan.unsent.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            drained.await;
        }
    };
    let _ = tokio::time::timeout(FLUSH_BOUND, wait).await;
}

/// The exported regions as fabric entries, with a memfd for each pool region; at most
/// `SCM_MAX_FD` fds per message, so the table may come in several messages. Every message but
/// the last names exactly `SCM_MAX_FD` memfds and the last fewer (possibly no regions at all):
/// that is how the initiator knows the table is complete (see
/// `fabric::client::fds_named`).
fn fabric_tables(regions: &Mutex<hixl_core::RegionTable<Arc<RegionInner>>>) -> Vec<Out> {
    let regions = lock(regions);
    let mut out: Vec<Out> = Vec::new();
    let mut cur: Vec<FabricRegion> = Vec::new();
    let mut fds: Vec<OwnedFd> = Vec::new();
    for e in regions.iter().filter(|e| e.access.is_remote()) {
        let fd = e
            .data
            .pooled(|b: &hixl_fabric::FabricBuf| b.fd().try_clone_to_owned().ok())
            .flatten();
        let fd_index = match fd {
            Some(fd) => {
                fds.push(fd);
                (fds.len() - 1) as u32
            }
            None => NO_FD,
        };
        cur.push(FabricRegion {
            rkey: e.rkey,
            addr: e.addr,
            len: e.len,
            fd_index,
        });
        if fds.len() == hixl_fabric::SCM_MAX_FD {
            out.push((
                Message::FabricTable(std::mem::take(&mut cur)),
                std::mem::take(&mut fds),
            ));
        }
    }
    out.push((Message::FabricTable(cur), fds));
    out
}

impl FabricChan {
    fn send(&self, m: Message) {
        self.queue((m, Vec::new()));
    }

    /// Queues a frame for the writer, counted until written.
    fn queue(&self, out: Out) {
        self.unsent
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if self.tx.send(out).is_err() {
            self.sent();
        }
    }

    /// One queued frame is written (or will never be).
    fn sent(&self) {
        if self
            .unsent
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.drained.notify_waiters();
        }
    }
}

/// Accepts fabric channels until shutdown.
pub(crate) async fn accept_loop(
    srv: TargetCx,
    chans: Chans,
    l: UnixListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            r = l.accept() => match r {
                Ok((s, _)) => {
                    let (tasks, srv, chans) = (srv.tasks.clone(), srv.clone(), chans.clone());
                    let mut sd = shutdown.clone();
                    tasks.spawn(async move {
                        tokio::select! {
                            _ = handle(srv, chans, s) => {}
                            _ = sd.changed() => {}
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("fabric accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

async fn handle(srv: TargetCx, chans: Chans, s: UnixStream) {
    let mut buf = BytesMut::new();
    let mut fds = Vec::new();
    let hello = tokio::time::timeout(
        Duration::from_secs(10),
        recv_frame(&s, &mut buf, &mut fds, "fabric peer"),
    )
    .await;
    let (engine, session) = match hello {
        Ok(Ok(Message::Hello {
            engine,
            channel: Channel::Fabric,
            session,
            ..
        })) if fds.is_empty() => (engine, session),
        other => {
            tracing::warn!("closing fabric channel: expected a fabric hello, got {other:?}");
            return;
        }
    };
    let sess = match srv.sessions.get(session) {
        Some(x) if *x.peer == *engine => x,
        _ => {
            let m = Message::Refuse {
                status: Status::NotConnected.code(),
                reason: format!("no session {session:#x} for engine {engine}"),
            };
            let _ = send_frame(&s, &m, &[], &engine).await;
            return;
        }
    };
    // The channel is a task of the session's: its driver joins it.
    let st = sess.state.clone();
    st.spawn(serve(srv, chans, s, buf, fds, sess, session));
}

/// Serves the fabric channel of `sess` until either ends.
async fn serve(
    srv: TargetCx,
    chans: Chans,
    s: UnixStream,
    mut buf: BytesMut,
    mut fds: Vec<OwnedFd>,
    sess: Arc<Session>,
    session: u64,
) {
    let engine = sess.peer.clone();
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    let chan = Arc::new(FabricChan {
        tx,
        revokes: Mutex::new(HashMap::new()),
        unsent: std::sync::atomic::AtomicUsize::new(0),
        drained: tokio::sync::Notify::new(),
    });
    if !chans.insert(sess.id, chan.clone()) {
        tracing::warn!(peer = %engine, "second fabric channel for one session refused");
        return;
    }
    for t in fabric_tables(&srv.regions) {
        chan.queue(t);
    }
    let s = Arc::new(s);
    let ws = s.clone();
    let peer = sess.peer.clone();
    let wpeer = peer.clone();
    let wchan = chan.clone();
    let (stop, mut stopped) = oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        let mut flushing = false;
        loop {
            let out = if flushing {
                rx.try_recv().ok()
            } else {
                tokio::select! {
                    biased;
                    o = rx.recv() => o,
                    _ = &mut stopped => {
                        // The channel ends: what is queued (notify acks the application may
                        // have acted on) still goes, then the writer stops.
                        flushing = true;
                        continue;
                    }
                }
            };
            let Some((m, fds)) = out else { break };
            let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            let ok = send_frame(&ws, &m, &borrowed, &wpeer).await.is_ok();
            wchan.sent();
            if !ok {
                break;
            }
        }
        // What is still queued will never be written.
        while rx.try_recv().is_ok() {
            wchan.sent();
        }
    });
    let err = loop {
        let m = tokio::select! {
            m = recv_frame(&s, &mut buf, &mut fds, &peer) => m,
            _ = sess.state.dead() => break Error::PeerLost {
                peer: peer.to_string(),
                cause: "fabric channel: session closed".into(),
            },
        };
        match m {
            Ok(Message::Notify { seq, name, msg }) => {
                chan.send(srv.notifies.receive(&peer, session, seq, name, msg));
            }
            Ok(Message::RevokeAck { rkey }) => {
                let w = lock(&chan.revokes).remove(&rkey);
                for w in w.into_iter().flatten() {
                    let _ = w.send(());
                }
            }
            Ok(m) => {
                break Error::Protocol {
                    peer: peer.to_string(),
                    reason: format!("unexpected {m:?} on the fabric channel"),
                }
            }
            // Already names the peer and the fabric channel (see `chan`).
            Err(e) => break e,
        }
    };
    tracing::debug!(peer = %peer, "fabric channel closed: {err}");
    chans.remove(sess.id);
    // Without its fabric channel the initiator cannot acknowledge revocations: end the link.
    sess.state.kill(err);
    let _ = stop.send(());
    let abort = writer.abort_handle();
    if tokio::time::timeout(FLUSH_BOUND, writer).await.is_err() {
        abort.abort();
    }
}

/// Sends a fresh fabric table (new pool regions' memfds) to every fabric channel.
pub(crate) fn broadcast_tables(srv: &TargetCx, chans: &Chans) {
    for sess in srv.sessions.all() {
        if let Some(chan) = chans.get(sess.id) {
            for t in fabric_tables(&srv.regions) {
                chan.queue(t);
            }
        }
    }
}

/// Tells every same-host initiator that the region with `rkey` is going away and waits (up to
/// a bound) until each has finished its copies into it and unmapped it. A peer whose link dies
/// meanwhile counts as done: its process, or at least its link, no longer touches the region.
pub(crate) async fn revoke(srv: &TargetCx, chans: &Chans, rkey: u64) {
    let mut waits = Vec::new();
    for sess in srv.sessions.all() {
        let Some(chan) = chans.get(sess.id) else {
            continue;
        };
        let (tx, rx) = oneshot::channel();
        lock(&chan.revokes).entry(rkey).or_default().push(tx);
        chan.send(Message::Revoke { rkey });
        waits.push(wait_ack(sess, rx, rkey));
    }
    futures::future::join_all(waits).await;
}

async fn wait_ack(sess: Arc<Session>, rx: oneshot::Receiver<()>, rkey: u64) {
    tokio::select! {
        _ = rx => {}
        _ = sess.state.dead() => {}
        _ = tokio::time::sleep(REVOKE_TIMEOUT) => {
            tracing::warn!(peer = %sess.peer, "no revoke ack for rkey {rkey:#x} within {REVOKE_TIMEOUT:?}; closing the link");
            sess.state.kill(Error::RevokeUnacknowledged {
                peer: sess.peer.to_string(),
                rkey,
                after: REVOKE_TIMEOUT,
            });
        }
    }
}
