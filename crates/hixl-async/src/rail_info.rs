//! What a link says of its RDMA rails ([`crate::Peer::rails`], `hixl info --peer`, the
//! metrics, `hixl bench`): each rail's pairing, state and counters.

use std::fmt::Write as _;

use crate::telemetry::{label_value, Telemetry};

/// One rail of a verbs link: one of our devices paired with one of the peer's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailInfo {
    /// The rail's number on the link.
    pub index: usize,
    /// Our device.
    pub local: String,
    /// The peer's device.
    pub remote: String,
    /// Why these two were paired (same subnet, or by position).
    pub why: String,
    /// The MTU both ends agreed on (the smaller of their active MTUs), in bytes.
    pub mtu: u32,
    /// Its RC queue pairs.
    pub qps: usize,
    /// Whether it takes slices now.
    pub up: bool,
    /// `up`, or paused with the cause and when it is probed back.
    pub state: String,
    /// Bytes of slices that landed on it.
    pub bytes: u64,
    /// Slices that landed on it.
    pub ops: u64,
    /// Slices that failed on it (each placed again elsewhere unless final).
    pub errors: u64,
    /// Times it was paused.
    pub pauses: u64,
}

impl std::fmt::Display for RailInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rail {} {} -> {} (peer): {}; mtu {}, {} QPs, {}; {} bytes in {} slices, {} errors, {} pauses",
            self.index,
            self.local,
            self.remote,
            self.state,
            self.mtu,
            self.qps,
            self.why,
            self.bytes,
            self.ops,
            self.errors,
            self.pauses
        )
    }
}

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
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
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
