//! The link's driver: one task that owns the link's control connection and its sans-io
//! [`InitiatorSession`], and ends the link.
//!
//! It feeds the session the frames read from the control connection, the passing of time
//! and the link's commands (notifies, acks that arrived over a transport's channel, an
//! orderly close), and carries out what the session asks for: frames to write (a notify goes
//! over the first channel when that channel carries notifies), table updates and device keys
//! to hand to the link and its channels, acks to hand to the waiting notifies. When the
//! session ends, for whatever reason, the driver kills the link with the session's cause,
//! closes the link's channels (failing what they have not started), resolves every waiting
//! notify, and joins every task of the link before it returns.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::BytesMut;
use hixl_core::session::Event;
use hixl_core::wire::Message;
use hixl_core::{Error, Result, Token};
use tokio::sync::{mpsc, oneshot};

use super::control::Control;
use super::Link;
use crate::clock::{now, sleep_until};
use crate::frame_io::{read_frame, write_frames};
use crate::transport::sort_table;

/// What the link's handles ask of its driver.
pub(super) enum Command {
    /// Send a notify; `reply` gets its ack (or the link's cause).
    Notify {
        name: Vec<u8>,
        msg: Vec<u8>,
        reply: oneshot::Sender<Result<()>>,
    },
    /// The first op was submitted on an idle link (see `Link::working`).
    Working,
    /// A notify sent over a transport's channel was acked there.
    Acked { seq: u64, status: u32 },
    /// Orderly close: tell the peer why, then end the link (its cause is already fixed).
    Close { reason: String },
    /// A barrier on the control connection (`InitiatorSession::sync`): `reply` resolves once
    /// every memory table the peer sent before it answered is this link's table.
    Sync { reply: oneshot::Sender<Result<()>> },
    /// A transport message for the peer (a verbs rail's `VerbsConnect`).
    Transport(hixl_core::wire::Message),
}

/// Runs the link until it ends; every task of the link has ended when this returns.
pub(super) async fn run(link: Arc<Link>, c: Control, mut cmds: mpsc::UnboundedReceiver<Command>) {
    let Control {
        mut session,
        stream,
        mut buf,
        peer,
        later,
    } = c;
    let (mut r, w) = stream.into_split();
    let (wtx, wrx) = mpsc::unbounded_channel::<BytesMut>();
    link.state
        .spawn(write_frames(w, wrx, link.state.clone(), peer.clone()));
    let mut dead = link.state.subscribe();
    let mut waiters: HashMap<u64, oneshot::Sender<Result<()>>> = HashMap::new();
    let mut syncs: HashMap<u64, oneshot::Sender<Result<()>>> = HashMap::new();
    for e in later {
        on_event(&link, &mut session, &mut waiters, e);
    }
    loop {
        while let Some(m) = session.poll_transmit() {
            transmit(&link, &wtx, m);
        }
        while let Some(e) = session.poll_event() {
            // A notify the closing session fails may have been acked on a channel already,
            // its ack queued or on the way (see below): it is settled after the loop, by that
            // ack or else by the link's cause.
            if let Event::NotifyAcked { result: Err(_), .. } = &e {
                if session.is_closed() {
                    continue;
                }
            }
            // The table events before it were applied already: events come in order.
            if let Event::Synced { seq } = e {
                if let Some(w) = syncs.remove(&seq) {
                    let _ = w.send(Ok(()));
                }
                continue;
            }
            on_event(&link, &mut session, &mut waiters, e);
        }
        if session.is_closed() {
            break;
        }
        let deadline = session.poll_timeout();
        tokio::select! {
            biased;
            _ = dead.changed() => {
                // Killed from elsewhere: a data connection or a channel failed. (Acks a channel
                // read before it failed are still queued: they are settled after the loop.)
                let cause = link.state.error().unwrap_or_else(|| link.lost("link closed"));
                session.connection_lost(cause);
            }
            c = cmds.recv() => match c {
                Some(Command::Notify { name, msg, reply }) => {
                    // Waiters that gave up (timed out) no longer hold a place.
                    waiters.retain(|&seq, w| {
                        let keep = !w.is_closed();
                        if !keep {
                            session.cancel_notify(seq);
                        }
                        keep
                    });
                    match session.notify(now(), &name, &msg) {
                        Ok(seq) => {
                            waiters.insert(seq, reply);
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                Some(Command::Working) => session.work_in_flight(now()),
                Some(Command::Acked { seq, status }) => {
                    let _ = session.handle_frame(now(), Message::NotifyAck { seq, status });
                }
                Some(Command::Close { reason }) => session.disconnect(&reason),
                Some(Command::Transport(m)) => {
                    if let Err(e) = session.send_transport(m) {
                        tracing::debug!(peer = %peer, "a transport message was not sent: {e}");
                    }
                }
                Some(Command::Sync { reply }) => {
                    syncs.retain(|_, w| !w.is_closed());
                    match session.sync(now()) {
                        Ok(seq) => {
                            syncs.insert(seq, reply);
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                None => session.disconnect("link dropped"),
            },
            m = read_frame(&mut r, &mut buf, &peer) => match m {
                Ok(m) => {
                    let _ = session.handle_frame(now(), m);
                }
                Err(e) => session.connection_lost(e),
            },
            _ = sleep_until(deadline) => {
                let now = now();
                // Before the link goes idle (probing every hixl.HeartbeatIdleMs), the op
                // table says whether ops are still in flight; once per active spell, not per
                // op.
                if session.turns_idle(now) && link.still_working() {
                    session.work_in_flight(now);
                }
                session.handle_timeout(now);
            }
        }
    }
    // The session's last frame (a Disconnect) reaches the writer before the death does.
    while let Some(m) = session.poll_transmit() {
        transmit(&link, &wtx, m);
    }
    // The session ended by a goodbye (the peer's or ours), not by a failure: notifies the peer
    // acked on a channel (the fabric's, whose socket is not this connection's) may still be on
    // their way, sent before the goodbye. They are awaited a moment before the rest fail.
    let settle = |c: Command, waiters: &mut HashMap<u64, oneshot::Sender<Result<()>>>| match c {
        Command::Acked { seq, status } => {
            if let Some(w) = waiters.remove(&seq) {
                let _ = w.send(hixl_core::session::notify_ack_result(&peer, status));
            }
        }
        Command::Notify { reply, .. } | Command::Sync { reply } => {
            let _ = reply.send(Err(link.lost("link closed")));
        }
        _ => {}
    };
    // Acks a channel read already are queued: they count, whatever ended the session.
    while let Ok(c) = cmds.try_recv() {
        settle(c, &mut waiters);
    }
    if goodbye(&link) && !waiters.is_empty() {
        let until = tokio::time::Instant::now() + LATE_ACKS;
        while !waiters.is_empty() {
            match tokio::time::timeout_at(until, cmds.recv()).await {
                Ok(Some(c)) => settle(c, &mut waiters),
                Ok(None) | Err(_) => break,
            }
        }
    }
    let cause = link
        .state
        .error()
        .or_else(|| session.error().cloned())
        .unwrap_or_else(|| link.lost("link closed"));
    match cause {
        Error::Protocol { .. } => tracing::warn!(peer = %peer, "closing link: {cause}"),
        Error::NotConnected { .. } => tracing::debug!(peer = %peer, "link closed"),
        _ => tracing::info!(peer = %peer, "closing link: {cause}"),
    }
    link.state.kill(cause.clone());
    for (_, w) in waiters.drain().chain(syncs.drain()) {
        let _ = w.send(Err(cause.clone()));
    }
    // Work not yet started on the channels fails with the link's cause; the devices flush
    // the rest.
    if !link.channels.is_empty() {
        let tokens: HashSet<Token> = crate::sync::lock(&link.tokens)
            .tokens
            .iter()
            .copied()
            .collect();
        for ch in &link.channels {
            ch.close(&cause, &tokens);
        }
    }
    drop(wtx);
}

/// Whether the link's session is ending by a goodbye (the peer's or ours, not a failure) on
/// a link whose notifies travel on a channel.
fn goodbye(link: &Link) -> bool {
    link.state.error().is_none() && link.channels.first().is_some_and(|c| c.carries_notifies())
}

/// How long a link closed by a goodbye waits for notify acks still coming on a channel.
const LATE_ACKS: std::time::Duration = std::time::Duration::from_millis(200);

/// Writes a frame: a notify over the first channel when it carries notifies, anything else
/// (and notifies without such a channel) on the control connection.
fn transmit(link: &Link, wtx: &mpsc::UnboundedSender<BytesMut>, m: Message) {
    if let (Message::Notify { .. }, Some(ch)) = (&m, link.channels.first()) {
        match ch.send_notify(m.clone()) {
            Some(true) => return,
            Some(false) => {
                link.state
                    .kill(link.lost("the channel that carries notifies closed"));
                return;
            }
            None => {}
        }
    }
    let mut b = BytesMut::with_capacity(64);
    m.encode(&mut b);
    let _ = wtx.send(b);
}

fn on_event(
    link: &Link,
    session: &mut hixl_core::session::InitiatorSession,
    waiters: &mut HashMap<u64, oneshot::Sender<Result<()>>>,
    e: Event,
) {
    match e {
        Event::NotifyAcked { seq, result } => {
            if let Some(w) = waiters.remove(&seq) {
                let _ = w.send(result);
            }
        }
        Event::Table(v) | Event::TableUpdated(v) => {
            let v = sort_table(v);
            for ch in &link.channels {
                ch.on_table(&v);
            }
            link.set_table(v);
        }
        // The peer's device keys: for the verbs channel, if this link has one.
        Event::TransportMessage(m) => {
            let _ = link.channels.iter().any(|c| c.on_control(&m));
        }
        // The target validates every TCP op against its own table, and the channels that
        // reach its memory directly revoke over their own connections: nothing of ours
        // needs to be waited for.
        Event::Revoked { rkey } => {
            let _ = session.revoke_ack(rkey);
        }
        Event::Closed(_)
        | Event::Authenticated
        | Event::Welcomed { .. }
        | Event::TransportOffer(_)
        | Event::NotifyReceived(_)
        | Event::NotifyOffered { .. }
        | Event::Synced { .. }
        | Event::RevokeAcked { .. } => {}
    }
}
