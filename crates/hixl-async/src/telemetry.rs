//! Per-transfer telemetry: every transfer a link posts is counted when its owner sees it end
//! (completed, failed, timed out, or dropped unfinished), with its bytes, descriptors, the time
//! its submission took (post) and the time from post to the end seen (as NIXL's
//! `xferDuration` is measured: post → completion observed). Per link and operation: counters
//! and a duration histogram, read with [`crate::Engine::telemetry`] and rendered as Prometheus
//! text by [`prometheus_text`]; and the last [`RECENT`] transfers of each link as
//! [`TransferRecord`]s ([`crate::Engine::take_transfer_records`]).
//!
//! The cost per transfer is two clock reads and a few relaxed atomic adds; the recent records
//! take one short lock.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hixl_core::TransferOp;

use crate::sync::lock;

/// Upper bounds of the duration histogram's buckets, in seconds (and `+Inf`).
pub const DURATION_BUCKETS: [f64; 20] = [
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How many of its most recent transfers a link keeps as records.
pub const RECENT: usize = 1024;

/// How a transfer ended, as its owner saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Every byte landed.
    Completed,
    /// It failed (the error went to the owner).
    Failed,
    /// Its deadline passed ([`crate::Transfer::timeout`]).
    TimedOut,
    /// Its owner dropped it before it finished.
    Abandoned,
}

impl Outcome {
    /// The label value: `completed`, `failed`, `timed_out`, `abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Abandoned => "abandoned",
        }
    }

    const ALL: [Outcome; 4] = [
        Outcome::Completed,
        Outcome::Failed,
        Outcome::TimedOut,
        Outcome::Abandoned,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

fn op_index(op: TransferOp) -> usize {
    match op {
        TransferOp::Read => 0,
        _ => 1,
    }
}

fn op_name(i: usize) -> &'static str {
    if i == 0 {
        "read"
    } else {
        "write"
    }
}

/// One transfer, as its owner saw it end.
#[derive(Clone, Debug, PartialEq)]
pub struct TransferRecord {
    /// The peer's name.
    pub peer: Arc<str>,
    /// The link's transport (`tcp`, `fabric`, `verbs`).
    pub transport: &'static str,
    /// Read or write.
    pub op: TransferOp,
    /// Bytes the transfer moves (all of its descriptors).
    pub bytes: u64,
    /// Descriptors it was posted with (a strided descriptor counts once).
    pub descriptors: u64,
    /// How long its submission took (validation, batching, handing to the transports).
    pub post: Duration,
    /// From post to the end its owner saw.
    pub duration: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

#[derive(Default)]
struct OpStats {
    ended: [AtomicU64; 4],
    bytes: AtomicU64,
    descriptors: AtomicU64,
    duration_ns: AtomicU64,
    post_ns: AtomicU64,
    /// Per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
}

/// One link's telemetry (shared by its transfers).
pub(crate) struct LinkTelemetry {
    peer: Arc<str>,
    transport: &'static str,
    ops: [OpStats; 2],
    recent: Mutex<VecDeque<TransferRecord>>,
}

impl std::fmt::Debug for LinkTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkTelemetry")
            .field("peer", &self.peer)
            .field("transport", &self.transport)
            .finish()
    }
}

/// The transport's name from a link's description (`fabric (same host: ...)` → `fabric`).
pub(crate) fn transport_name(described: &str) -> &'static str {
    match described.split_whitespace().next() {
        Some("fabric") => "fabric",
        Some("verbs") => "verbs",
        Some("tcp") => "tcp",
        _ => "other",
    }
}

impl LinkTelemetry {
    pub(crate) fn new(peer: Arc<str>, transport: &str) -> LinkTelemetry {
        LinkTelemetry {
            peer,
            transport: transport_name(transport),
            ops: Default::default(),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// Counts one ended transfer.
    fn record(&self, s: &Started, outcome: Outcome, now: Instant) {
        let duration = now.saturating_duration_since(s.posted);
        let o = &self.ops[op_index(s.op)];
        o.ended[outcome.index()].fetch_add(1, Ordering::Relaxed);
        o.bytes.fetch_add(s.bytes, Ordering::Relaxed);
        o.descriptors.fetch_add(s.descriptors, Ordering::Relaxed);
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        o.duration_ns.fetch_add(ns(duration), Ordering::Relaxed);
        o.post_ns.fetch_add(ns(s.post), Ordering::Relaxed);
        let secs = duration.as_secs_f64();
        let b = DURATION_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(DURATION_BUCKETS.len());
        o.buckets[b].fetch_add(1, Ordering::Relaxed);
        let mut r = lock(&self.recent);
        if r.len() >= RECENT {
            r.pop_front();
        }
        r.push_back(TransferRecord {
            peer: self.peer.clone(),
            transport: self.transport,
            op: s.op,
            bytes: s.bytes,
            descriptors: s.descriptors,
            post: s.post,
            duration,
            outcome,
        });
    }

    pub(crate) fn take_recent(&self, out: &mut Vec<TransferRecord>) {
        out.extend(lock(&self.recent).drain(..));
    }

    pub(crate) fn snapshot(&self) -> LinkSnapshot {
        let ops = self
            .ops
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let mut cum = 0u64;
                let buckets = o
                    .buckets
                    .iter()
                    .enumerate()
                    .map(|(j, n)| {
                        cum += n.load(Ordering::Relaxed);
                        (
                            DURATION_BUCKETS.get(j).copied().unwrap_or(f64::INFINITY),
                            cum,
                        )
                    })
                    .collect();
                OpSnapshot {
                    op: op_name(i),
                    ended: Outcome::ALL
                        .iter()
                        .map(|&k| (k, o.ended[k.index()].load(Ordering::Relaxed)))
                        .collect(),
                    bytes: o.bytes.load(Ordering::Relaxed),
                    descriptors: o.descriptors.load(Ordering::Relaxed),
                    duration_sum: Duration::from_nanos(o.duration_ns.load(Ordering::Relaxed)),
                    post_sum: Duration::from_nanos(o.post_ns.load(Ordering::Relaxed)),
                    buckets,
                }
            })
            .collect();
        LinkSnapshot {
            peer: self.peer.to_string(),
            transport: self.transport,
            ops,
            rails: Vec::new(),
        }
    }
}

/// What a transfer carries from its post to its end.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) tele: Arc<LinkTelemetry>,
    pub(crate) op: TransferOp,
    pub(crate) bytes: u64,
    pub(crate) descriptors: u64,
    pub(crate) posted: Instant,
    pub(crate) post: Duration,
}

impl Started {
    /// Counts the transfer as ended now.
    pub(crate) fn end(self, outcome: Outcome) {
        self.tele.record(&self, outcome, Instant::now());
    }
}

/// One operation's counters on one link.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSnapshot {
    /// `read` or `write`.
    pub op: &'static str,
    /// Transfers ended, by outcome.
    pub ended: Vec<(Outcome, u64)>,
    /// Bytes of the ended transfers (whatever their outcome).
    pub bytes: u64,
    /// Their descriptors.
    pub descriptors: u64,
    /// Sum of their durations (post → end seen).
    pub duration_sum: Duration,
    /// Sum of their submission times.
    pub post_sum: Duration,
    /// Cumulative duration histogram: `(upper bound in seconds, transfers at or under it)`,
    /// the last bound `+Inf`.
    pub buckets: Vec<(f64, u64)>,
}

impl OpSnapshot {
    /// Transfers ended, all outcomes.
    pub fn count(&self) -> u64 {
        self.ended.iter().map(|e| e.1).sum()
    }
}

/// One link's counters.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkSnapshot {
    /// The peer's name.
    pub peer: String,
    /// The link's transport.
    pub transport: &'static str,
    /// Read, then write.
    pub ops: Vec<OpSnapshot>,
    /// Its RDMA rails (verbs links only).
    pub rails: Vec<crate::RailInfo>,
}

/// The engine's links' counters at one moment ([`crate::Engine::telemetry`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Telemetry {
    /// One per link that is up.
    pub links: Vec<LinkSnapshot>,
}

/// `v` escaped for a Prometheus label value.
pub fn label_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn float(v: f64) -> String {
    if v.is_infinite() {
        "+Inf".to_string()
    } else {
        format!("{v}")
    }
}

/// Appends a series' `# HELP` and `# TYPE` lines to Prometheus text.
pub fn metric_head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Renders telemetry in the Prometheus text exposition format (version 0.0.4): per peer,
/// transport and operation, `hixl_transfers_total{outcome}`, `hixl_transfer_bytes_total`,
/// `hixl_transfer_descriptors_total`, `hixl_transfer_post_seconds_total` and the histogram
/// `hixl_transfer_duration_seconds`; `engine` labels every series.
pub fn prometheus_text(engine: &str, t: &Telemetry) -> String {
    let mut out = String::new();
    let head = metric_head;
    let e = label_value(engine);
    let base = |l: &LinkSnapshot, o: &OpSnapshot| {
        format!(
            "engine=\"{e}\",peer=\"{}\",transport=\"{}\",op=\"{}\"",
            label_value(&l.peer),
            l.transport,
            o.op
        )
    };
    let each = || {
        t.links
            .iter()
            .flat_map(|l| l.ops.iter().map(move |o| (l, o)))
    };
    head(
        &mut out,
        "hixl_transfers_total",
        "counter",
        "Transfers ended, by how (completed, failed, timed_out, abandoned).",
    );
    for (l, o) in each() {
        for (k, n) in &o.ended {
            let _ = writeln!(
                out,
                "hixl_transfers_total{{{},outcome=\"{}\"}} {n}",
                base(l, o),
                k.as_str()
            );
        }
    }
    for (name, help, f) in [
        (
            "hixl_transfer_bytes_total",
            "Bytes of the transfers ended.",
            (|o: &OpSnapshot| o.bytes.to_string()) as fn(&OpSnapshot) -> String,
        ),
        (
            "hixl_transfer_descriptors_total",
            "Descriptors of the transfers ended.",
            |o: &OpSnapshot| o.descriptors.to_string(),
        ),
        (
            "hixl_transfer_post_seconds_total",
            "Time spent submitting the transfers ended.",
            |o: &OpSnapshot| float(o.post_sum.as_secs_f64()),
        ),
    ] {
        head(&mut out, name, "counter", help);
        for (l, o) in each() {
            let _ = writeln!(out, "{name}{{{}}} {}", base(l, o), f(o));
        }
    }
    head(
        &mut out,
        "hixl_transfer_duration_seconds",
        "histogram",
        "From a transfer's post to the end its owner saw.",
    );
    for (l, o) in each() {
        let b = base(l, o);
        for (le, n) in &o.buckets {
            let _ = writeln!(
                out,
                "hixl_transfer_duration_seconds_bucket{{{b},le=\"{}\"}} {n}",
                float(*le)
            );
        }
        let _ = writeln!(
            out,
            "hixl_transfer_duration_seconds_sum{{{b}}} {}",
            float(o.duration_sum.as_secs_f64())
        );
        let _ = writeln!(
            out,
            "hixl_transfer_duration_seconds_count{{{b}}} {}",
            o.count()
        );
    }
    out
}

/// A running `/metrics` endpoint ([`crate::Engine::serve_metrics`]); dropping it stops it.
#[derive(Debug)]
pub struct MetricsServer {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// The address it listens on (the real port when asked for port 0).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `GET /metrics` (Prometheus text) on `listener`, rendering `render()` per request;
/// anything else gets 404. One request per connection, read up to 8 KiB within 5 s.
pub(crate) fn serve_metrics(
    listener: tokio::net::TcpListener,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> std::io::Result<MetricsServer> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = listener.local_addr()?;
    let render = Arc::new(render);
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let render = render.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut n = 0;
                let read = tokio::time::timeout(Duration::from_secs(5), async {
                    while n < buf.len() {
                        match s.read(&mut buf[n..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k,
                        }
                        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                })
                .await;
                if read.is_err() {
                    return;
                }
                let head = String::from_utf8_lossy(&buf[..n]);
                let mut words = head.split_whitespace();
                let (method, path) = (words.next(), words.next());
                let (status, body, kind) = match (method, path) {
                    (Some("GET"), Some(p)) if p == "/metrics" || p.starts_with("/metrics?") => (
                        "200 OK",
                        render(),
                        "text/plain; version=0.0.4; charset=utf-8",
                    ),
                    _ => (
                        "404 Not Found",
                        "hixl serves GET /metrics only\n".to_string(),
                        "text/plain",
                    ),
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(MetricsServer { addr, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(t: &Arc<LinkTelemetry>, op: TransferOp, bytes: u64, ago: Duration) -> Started {
        Started {
            tele: t.clone(),
            op,
            bytes,
            descriptors: 2,
            posted: Instant::now() - ago,
            post: Duration::from_micros(3),
        }
    }

    #[test]
    fn ended_transfers_are_counted_bucketed_and_rendered() {
        let t = Arc::new(LinkTelemetry::new(
            Arc::from("10.0.0.2:9000"),
            "fabric (same host: boot id and mount namespace match)",
        ));
        started(&t, TransferOp::Read, 4096, Duration::from_micros(300)).end(Outcome::Completed);
        started(&t, TransferOp::Read, 8192, Duration::from_millis(30)).end(Outcome::Failed);
        started(&t, TransferOp::Write, 1 << 20, Duration::from_secs(20)).end(Outcome::Abandoned);
        let s = t.snapshot();
        assert_eq!(s.transport, "fabric");
        let read = &s.ops[0];
        assert_eq!(
            (read.op, read.count(), read.bytes, read.descriptors),
            ("read", 2, 12288, 4)
        );
        assert!(read.ended.contains(&(Outcome::Failed, 1)));
        // 300 µs lands in the 500 µs bucket, 30 ms in the 50 ms one; cumulative after.
        let at = |le: f64| read.buckets.iter().find(|b| b.0 == le).map(|b| b.1);
        assert_eq!(
            (at(2.5e-4), at(5e-4), at(2.5e-2), at(5e-2)),
            (Some(0), Some(1), Some(1), Some(2))
        );
        assert_eq!(s.ops[1].buckets.last(), Some(&(f64::INFINITY, 1)));
        let mut recs = Vec::new();
        t.take_recent(&mut recs);
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[2].outcome, Outcome::Abandoned);
        assert!(recs[1].duration >= Duration::from_millis(30));
        t.take_recent(&mut recs);
        assert_eq!(recs.len(), 3, "records are taken once");

        let text = prometheus_text("e\"1", &Telemetry { links: vec![s] });
        let l = "engine=\"e\\\"1\",peer=\"10.0.0.2:9000\",transport=\"fabric\",op=\"read\"";
        for want in [
            format!("hixl_transfers_total{{{l},outcome=\"completed\"}} 1"),
            format!("hixl_transfer_bytes_total{{{l}}} 12288"),
            format!("hixl_transfer_duration_seconds_bucket{{{l},le=\"+Inf\"}} 2"),
            format!("hixl_transfer_duration_seconds_count{{{l}}} 2"),
            "# TYPE hixl_transfer_duration_seconds histogram".to_string(),
        ] {
            assert!(text.contains(&want), "{want} not in\n{text}");
        }
    }

    #[test]
    fn the_recent_records_are_bounded() {
        let t = Arc::new(LinkTelemetry::new(Arc::from("p"), "tcp (forced)"));
        for i in 0..RECENT + 10 {
            started(&t, TransferOp::Write, i as u64, Duration::ZERO).end(Outcome::Completed);
        }
        let mut recs = Vec::new();
        t.take_recent(&mut recs);
        assert_eq!(recs.len(), RECENT);
        assert_eq!(recs[0].bytes, 10, "the oldest went first");
        assert_eq!(t.snapshot().ops[1].count(), (RECENT + 10) as u64);
    }
}
