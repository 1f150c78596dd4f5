//! What a target served, per initiator: the bytes and ops of the TCP data path (the one path
//! on which the target takes part; fabric and verbs peers move bytes without it), and the
//! requests it refused, by operation and reason. Rendered by `Engine::metrics_text`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::lock;
use crate::telemetry::{label_value, metric_head};

/// One initiator's counters (shared by its data connections: atomics, no lock per request).
#[derive(Debug, Default)]
pub(crate) struct PeerServed {
    read_bytes: AtomicU64,
    read_ops: AtomicU64,
    write_bytes: AtomicU64,
    write_ops: AtomicU64,
    /// Refusals by (operation, status name); rare, so a lock.
    refused: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl PeerServed {
    /// A request of `bytes` served.
    pub(crate) fn served(&self, write: bool, bytes: u64) {
        let (b, n) = if write {
            (&self.write_bytes, &self.write_ops)
        } else {
            (&self.read_bytes, &self.read_ops)
        };
        b.fetch_add(bytes, Ordering::Relaxed);
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// A request refused with status `reason`.
    pub(crate) fn refused(&self, write: bool, reason: &'static str) {
        let op = if write { "write" } else { "read" };
        *lock(&self.refused).entry((op, reason)).or_default() += 1;
    }
}

/// Every initiator's counters, by peer name.
#[derive(Debug, Default)]
pub(crate) struct Served {
    peers: Mutex<HashMap<Arc<str>, Arc<PeerServed>>>,
}

impl Served {
    /// The counters of `peer` (made on its first data connection).
    pub(crate) fn peer(&self, peer: &Arc<str>) -> Arc<PeerServed> {
        lock(&self.peers).entry(peer.clone()).or_default().clone()
    }

    /// Appends `hixl_served_bytes_total`, `hixl_served_ops_total` (per peer, transport and
    /// op) and `hixl_refused_total` (per peer, transport, op and reason) to Prometheus text.
    pub(crate) fn prometheus(&self, out: &mut String, engine: &str) {
        let mut peers: Vec<(Arc<str>, Arc<PeerServed>)> = lock(&self.peers)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        peers.sort_by(|a, b| a.0.cmp(&b.0));
        let e = label_value(engine);
        let base = |p: &str, op: &str| {
            format!(
                "engine=\"{e}\",peer=\"{}\",transport=\"tcp\",op=\"{op}\"",
                label_value(p)
            )
        };
        type Pick = fn(&PeerServed) -> [&AtomicU64; 2];
        let series: [(&str, &str, Pick); 2] = [
            (
                "hixl_served_bytes_total",
                "Bytes this engine served to an initiator as a target (TCP data path).",
                |s| [&s.read_bytes, &s.write_bytes],
            ),
            (
                "hixl_served_ops_total",
                "Requests this engine served to an initiator as a target (TCP data path).",
                |s| [&s.read_ops, &s.write_ops],
            ),
        ];
        for (name, help, pick) in series {
            metric_head(out, name, "counter", help);
            for (p, s) in &peers {
                for (op, v) in ["read", "write"].into_iter().zip(pick(s)) {
                    let n = v.load(Ordering::Relaxed);
                    let _ = writeln!(out, "{name}{{{}}} {n}", base(p, op));
                }
            }
        }
        metric_head(
            out,
            "hixl_refused_total",
            "counter",
            "Requests this engine refused as a target, by reason (the status it answered).",
        );
        for (p, s) in &peers {
            for ((op, reason), n) in lock(&s.refused).iter() {
                let _ = writeln!(
                    out,
                    "hixl_refused_total{{{},reason=\"{reason}\"}} {n}",
                    base(p, op)
                );
            }
        }
    }
}
