//! A verbs link's keeper: a task of the link that pauses a rail whose port went down and
//! probes paused rails back once their cooldown has passed and their port is up — new queue
//! pairs, a `VerbsConnect` for the rail on the control connection, the peer's `VerbsAccept`,
//! connected, up.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hixl_core::wire::Message;
use hixl_core::{Error, Result};
use hixl_verbs::{QpEndpoint, QueuePair, ENDPOINT_LEN};

use super::link::VerbsLink;
use crate::sync::lock;

/// How often the ports of rails that are up are checked.
const TICK: Duration = Duration::from_secs(1);
/// How long a probe waits for the peer's answer.
const ANSWER: Duration = Duration::from_secs(5);

/// Runs until the link dies or is dropped.
pub(crate) async fn run(link: Weak<VerbsLink>) {
    loop {
        let Some(l) = link.upgrade() else {
            return;
        };
        if l.state.error().is_some() {
            return;
        }
        l.check_ports();
        for r in 0..l.rails.len() {
            l.probe(r).await;
        }
        let now = Instant::now();
        let next = l
            .rails
            .iter()
            .filter_map(|r| lock(&r.health).due())
            .map(|d| d.saturating_duration_since(now))
            .fold(TICK, Duration::min);
        let (wake, state) = (l.wake.clone(), l.state.clone());
        drop(l);
        tokio::select! {
            _ = tokio::time::sleep(next) => {}
            _ = wake.notified() => {}
            _ = state.dead() => return,
        }
    }
}

impl VerbsLink {
    /// Pauses every rail that is up whose port is not active.
    fn check_ports(&self) {
        let mut touched = Vec::new();
        let mut fails = Vec::new();
        for r in &self.rails {
            if !r.is_up() {
                continue;
            }
            if let Err(why) = self.backend.nics[r.plan.local].port_up() {
                self.rail_broken(r.index, why, &mut touched, &mut fails);
            }
        }
        if !touched.is_empty() || !fails.is_empty() {
            // pump_all posts every queue pair's backlog, the touched ones among them.
            self.report(fails);
            self.pump_all();
        }
    }

    /// Probes rail `r` back if it is paused, due, and its port is up.
    async fn probe(&self, r: usize) {
        let rail = &self.rails[r];
        let now = Instant::now();
        if !lock(&rail.health).due().is_some_and(|d| d <= now) {
            return;
        }
        if let Err(why) = self.backend.nics[rail.plan.local].port_up() {
            // Still down: wait another cooldown.
            let mut h = lock(&rail.health);
            if h.start_probe(now) {
                h.pause(now, why);
            }
            return;
        }
        if !lock(&rail.health).start_probe(now) {
            return;
        }
        match self.reconnect(r).await {
            Ok(qps) => {
                for (slot, qp) in rail.slots.iter().zip(qps) {
                    lock(slot).qp = Some(qp);
                }
                lock(&rail.health).resume(Instant::now());
                rail.up.store(true, Ordering::Release);
                tracing::info!(peer = %self.peer, "RDMA rail {r} {} is back", rail.name);
                self.pump_all();
            }
            Err(e) => {
                tracing::info!(peer = %self.peer, "RDMA rail {r} {}: probe failed: {e}", rail.name);
                lock(&rail.health).pause(Instant::now(), format!("probe failed: {e}"));
            }
        }
    }

    /// New queue pairs for rail `r`, connected to the peer's new ones.
    async fn reconnect(&self, r: usize) -> Result<Vec<QueuePair>> {
        let rail = &self.rails[r];
        let nic = &self.backend.nics[rail.plan.local];
        let mut qps = (0..rail.slots.len())
            .map(|_| nic.initiator_qp(&self.peer))
            .collect::<Result<Vec<_>>>()?;
        let endpoints = qps.iter().flat_map(|q| q.endpoint().to_bytes()).collect();
        let rail_id = u32::try_from(r).unwrap_or(u32::MAX);
        let (tx, rx) = tokio::sync::oneshot::channel();
        lock(&self.answers).insert(rail_id, tx);
        let sent = self.send_control(Message::VerbsConnect {
            rail: rail_id,
            device: u32::try_from(rail.plan.remote).unwrap_or(u32::MAX),
            endpoints,
        });
        let lost = |cause: &str| Error::PeerLost {
            peer: self.peer.to_string(),
            cause: cause.to_owned(),
        };
        if !sent {
            lock(&self.answers).remove(&rail_id);
            return Err(lost("the control connection is closed"));
        }
        // Bounded, and never past the link's death (its tasks end with it).
        let waited = tokio::select! {
            r = tokio::time::timeout(ANSWER, rx) => Some(r),
            _ = self.state.dead() => None,
        };
        let answer = match waited {
            Some(Ok(Ok(m))) => m,
            Some(Ok(Err(_))) | None => {
                lock(&self.answers).remove(&rail_id);
                return Err(lost("the link closed during the probe"));
            }
            Some(Err(_)) => {
                lock(&self.answers).remove(&rail_id);
                return Err(lost("the peer did not answer the probe within 5 s"));
            }
        };
        let remote = accepted(&self.peer, answer, qps.len())?;
        for (qp, ep) in qps.iter_mut().zip(&remote) {
            qp.connect(ep)?;
        }
        Ok(qps)
    }
}

/// The peer's endpoints from its `VerbsAccept`, `n` of them, or why not.
pub(crate) fn accepted(peer: &str, m: Message, n: usize) -> Result<Vec<QpEndpoint>> {
    match m {
        Message::VerbsAccept {
            status: 0,
            endpoints,
            ..
        } => decode_endpoints(&endpoints, n).map_err(|why| Error::Protocol {
            peer: peer.to_owned(),
            reason: why,
        }),
        Message::VerbsAccept { reason, .. } => Err(Error::PeerLost {
            peer: peer.to_owned(),
            cause: format!("the peer refused the queue pairs: {reason}"),
        }),
        m => Err(Error::Protocol {
            peer: peer.to_owned(),
            reason: format!("expected a verbs accept, got {m:?}"),
        }),
    }
}

/// `n` endpoints (`n == 0`: any number from 1) from their concatenated bytes.
pub(crate) fn decode_endpoints(b: &[u8], n: usize) -> std::result::Result<Vec<QpEndpoint>, String> {
    if b.is_empty() || b.len() % ENDPOINT_LEN != 0 || (n != 0 && b.len() != n * ENDPOINT_LEN) {
        return Err(format!(
            "{} bytes of queue-pair endpoints, expected {} of {ENDPOINT_LEN} bytes",
            b.len(),
            if n == 0 {
                "a whole number".to_owned()
            } else {
                n.to_string()
            }
        ));
    }
    b.chunks(ENDPOINT_LEN)
        .map(|c| QpEndpoint::from_bytes(c).map_err(|e| e.to_string()))
        .collect()
}

/// Keeps `Arc` out of the signature of callers that only have a `Weak`.
pub(crate) fn spawn(link: &Arc<VerbsLink>) {
    let weak = Arc::downgrade(link);
    link.state.spawn(run(weak));
}
