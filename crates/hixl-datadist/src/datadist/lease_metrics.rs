//! The leases a cluster granted, counted for its metrics: granted, and ended by reason; with
//! the live count from the lease table, rendered as Prometheus text beside the engine's.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use hixl_async::telemetry::{label_value, metric_head};

use crate::lease::LeaseEnd;

/// Counters of the leases this cluster granted.
#[derive(Debug, Default)]
pub(crate) struct LeaseCounts {
    granted: AtomicU64,
    /// By [`LeaseEnd`], in [`REASONS`] order.
    ended: [AtomicU64; 4],
}

/// The reasons, as the series label them.
const REASONS: [(LeaseEnd, &str); 4] = [
    (LeaseEnd::Done, "done"),
    (LeaseEnd::Expired, "expired"),
    (LeaseEnd::LinkDown, "link_down"),
    (LeaseEnd::Revoked, "revoked"),
];

impl LeaseCounts {
    pub(crate) fn granted(&self) {
        self.granted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ended(&self, why: LeaseEnd) {
        if let Some(i) = REASONS.iter().position(|(r, _)| *r == why) {
            self.ended[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `hixl_leases_live` (gauge), `hixl_leases_granted_total` and `hixl_leases_ended_total`
    /// by reason, labelled with `engine` and `cluster`.
    pub(crate) fn prometheus(&self, out: &mut String, engine: &str, cluster: u64, live: usize) {
        let l = format!("engine=\"{}\",cluster=\"{cluster}\"", label_value(engine));
        let (granted, live) = (self.granted.load(Ordering::Relaxed), live as u64);
        let single = [
            (
                "hixl_leases_live",
                "gauge",
                "Leases this cluster granted that are live.",
                live,
            ),
            (
                "hixl_leases_granted_total",
                "counter",
                "Leases this cluster granted.",
                granted,
            ),
        ];
        for (name, kind, help, v) in single {
            metric_head(out, name, kind, help);
            let _ = writeln!(out, "{name}{{{l}}} {v}");
        }
        let name = "hixl_leases_ended_total";
        metric_head(
            out,
            name,
            "counter",
            "Leases this cluster granted that ended, by reason.",
        );
        for ((_, reason), n) in REASONS.iter().zip(&self.ended) {
            let n = n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{{l},reason=\"{reason}\"}} {n}");
        }
    }
}
