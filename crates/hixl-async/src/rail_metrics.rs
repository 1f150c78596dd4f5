//! The rails of verbs links in the metrics: their series in Prometheus text.

use std::fmt::Write as _;

use crate::rail_info::RailInfo;
use crate::telemetry::{label_value, metric_head, Telemetry};

/// A series: name, type, help, and its value for one rail.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&RailInfo) -> u64,
);

/// Appends the rails' series to Prometheus text: `hixl_rail_up` (gauge) and
/// `hixl_rail_bytes_total`, `hixl_rail_ops_total`, `hixl_rail_errors_total`,
/// `hixl_rail_pauses_total` per engine, peer, rail and device pair.
pub(crate) fn prometheus(out: &mut String, engine: &str, t: &Telemetry) {
    if t.links.iter().all(|l| l.rails.is_empty()) {
        return;
    }
    let e = label_value(engine);
    let series: [Series; 5] = [
        (
            "hixl_rail_up",
            "gauge",
            "Whether the RDMA rail takes slices.",
            |r| u64::from(r.up),
        ),
        (
            "hixl_rail_bytes_total",
            "counter",
            "Bytes of slices that landed on the RDMA rail.",
            |r| r.bytes,
        ),
        (
            "hixl_rail_ops_total",
            "counter",
            "Slices that landed on the RDMA rail.",
            |r| r.ops,
        ),
        (
            "hixl_rail_errors_total",
            "counter",
            "Slices that failed on the RDMA rail.",
            |r| r.errors,
        ),
        (
            "hixl_rail_pauses_total",
            "counter",
            "Times the RDMA rail was paused.",
            |r| r.pauses,
        ),
    ];
    for (name, kind, help, value) in series {
        metric_head(out, name, kind, help);
        for l in &t.links {
            for r in &l.rails {
                let _ = writeln!(
                    out,
                    "{name}{{engine=\"{e}\",peer=\"{}\",rail=\"{}\",local=\"{}\",remote=\"{}\"}} {}",
                    label_value(&l.peer),
                    r.index,
                    label_value(&r.local),
                    label_value(&r.remote),
                    value(r)
                );
            }
        }
    }
}
