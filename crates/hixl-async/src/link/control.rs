//! The control connection's reader and the heartbeat probe.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use hixl_core::wire::Message;
use hixl_core::Error;
use tokio::net::tcp::OwnedReadHalf;

use super::Link;
use crate::frame_io::read_frame;
use crate::transport::sort_table;

/// Probes the peer every heartbeat interval on the control connection and kills the link when
/// nothing (no answer, nor any other frame) has arrived for `interval × miss_limit`.
pub(super) async fn probe(link: Arc<Link>, hb: crate::context::Heartbeat) {
    let mut tick = tokio::time::interval(hb.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = link.state.dead() => return,
        }
        let silent = link.silence();
        if silent > hb.bound() {
            let e = hb.lost(&link.name, silent);
            tracing::warn!(peer = %link.name, "closing link: {e}");
            link.state.kill(e);
            return;
        }
        seq = (seq + 1) & !hixl_core::wire::HEARTBEAT_FROM_TARGET;
        let mut b = BytesMut::with_capacity(24);
        Message::Heartbeat { seq }.encode(&mut b);
        if link.control.send(b).is_err() {
            return;
        }
    }
}

impl Link {
    fn heard(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.last_rx.store(ms, Ordering::Relaxed);
    }

    /// How long the control connection has been silent.
    fn silence(&self) -> Duration {
        let now = self.born.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_rx.load(Ordering::Relaxed)))
    }
}

pub(super) async fn control_reader(mut r: OwnedReadHalf, mut buf: BytesMut, link: Arc<Link>) {
    let mut dead = link.state.subscribe();
    let err = loop {
        let m = tokio::select! {
            m = read_frame(&mut r, &mut buf, &link.name) => m,
            _ = dead.changed() => break None,
        };
        if m.is_ok() {
            link.heard();
        }
        match m {
            Ok(Message::NotifyAck { seq, status }) => {
                let w = link
                    .notify_waiters
                    .lock()
                    .ok()
                    .and_then(|mut w| w.remove(&seq));
                if let Some(w) = w {
                    let _ = w.send(status);
                }
            }
            Ok(Message::MemTable(v)) => {
                let v = sort_table(v);
                for ch in &link.channels {
                    ch.on_table(&v);
                }
                if let Ok(mut t) = link.table.write() {
                    *t = v;
                }
            }
            // The peer's device keys: for the verbs channel, if this link has one.
            Ok(m @ Message::VerbsKeys(_)) => {
                let _ = link.channels.iter().any(|c| c.on_control(&m));
            }
            Ok(Message::Heartbeat { seq }) => {
                // Answer the target's probes; our own answered ones need nothing more.
                if seq & hixl_core::wire::HEARTBEAT_FROM_TARGET != 0 {
                    let mut b = BytesMut::with_capacity(24);
                    Message::Heartbeat { seq }.encode(&mut b);
                    let _ = link.control.send(b);
                }
            }
            Ok(Message::Disconnect { reason }) => {
                break Some(Error::PeerLost {
                    peer: link.name.to_string(),
                    cause: format!("peer disconnected: {reason}"),
                })
            }
            Ok(m) => {
                break Some(Error::Protocol {
                    peer: link.name.to_string(),
                    reason: format!("unexpected {m:?} on the control connection"),
                })
            }
            Err(e) => break Some(e),
        }
    };
    if let Some(e) = err {
        if matches!(e, Error::Protocol { .. }) {
            tracing::warn!(peer = %link.name, "closing link: {e}");
        }
        link.state.kill(e);
    }
    // Pending notifies learn of the death through LinkState::dead().
}
