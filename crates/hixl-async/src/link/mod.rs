//! The initiator's side of a link to one peer: handshake, the peer's memory table, data
//! connections, notifies, and the `Peer` handle users hold.

mod control;
mod driver;
mod establish;
mod notify;
mod peer;
pub(crate) mod submit;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use hixl_core::{Error, RemoteRegion, Token};
use tokio::sync::mpsc;

pub(crate) use establish::{LinkCx, LinkParams};
pub use peer::Peer;

use crate::link_state::LinkState;
use crate::transport::{PeerChannel, Withdraw};

/// Tokens of a link's ops, so that the channel pool can tell a busy link from an idle one and
/// the link's death can cancel its copies still queued on the copy engine. Finished ops are
/// pruned only when the list has doubled since the last prune: amortized O(1) per submit, and
/// the op table is not locked on every submission.
#[derive(Debug, Default)]
struct TokenLog {
    tokens: Vec<Token>,
    prune_at: usize,
}

impl TokenLog {
    fn record(&mut self, token: Token, ops: &Mutex<crate::keep::Ops>) {
        if self.tokens.len() >= self.prune_at {
            let o = crate::sync::lock(ops);
            self.tokens.retain(|&t| o.phase(t).is_some());
            self.prune_at = (self.tokens.len() * 2).max(64);
        }
        self.tokens.push(token);
    }
}

/// Milliseconds since the first call in this process (a clock links can be compared by).
fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// The region of `table` (sorted by address) that holds `[addr, addr + len)`, if one does.
fn holding(table: &[RemoteRegion], addr: u64, len: u64) -> Option<&RemoteRegion> {
    let i = table.partition_point(|r| r.addr <= addr);
    i.checked_sub(1)
        .and_then(|i| table.get(i))
        .filter(|r| r.contains(addr, len))
}

/// What the initiator keeps per connected peer.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) name: Arc<str>,
    pub(crate) state: Arc<LinkState>,
    table: RwLock<Vec<RemoteRegion>>,
    /// The link's driver, which owns the control connection and its session.
    driver: mpsc::UnboundedSender<driver::Command>,
    /// Notifies waiting for their ack.
    notifies_waiting: AtomicUsize,
    /// Whether the driver knows that work may be in flight: set by the first submit on an
    /// idle link (which then tells the driver, see [`Link::working`]), cleared by the driver
    /// when the link turns idle. One command per idle-to-active transition, none per op.
    work_seen: AtomicBool,
    /// The transports' channels to the peer, in the order the transport policy chose (the
    /// chosen transport's, then TCP's, which reaches everything); a descriptor goes to the
    /// first that reaches it.
    channels: Vec<Arc<dyn PeerChannel>>,
    /// Every op of the link: for [`Link::in_flight`], and so that the link's death can cancel its
    /// copies still queued on the copy engine.
    tokens: Mutex<TokenLog>,
    /// When the link was last used for a transfer or notify (`now_ms`).
    last_used: AtomicU64,
    /// Which transport serves this peer, and why.
    transport: String,
    /// Its transfers' counters and recent records.
    pub(crate) telemetry: Arc<crate::telemetry::LinkTelemetry>,
    /// The peer engine's incarnation, from its `Welcome`.
    pub(crate) incarnation: u64,
    /// The engine's op table and completion sink, and its regions (local ranges of ops).
    ops: crate::context::OpsHandle,
    regions: crate::context::Regions,
    /// How long a transfer of this link spins before it parks (`hixl.SpinUs`).
    spin: std::time::Duration,
}

impl Link {
    /// Marks the link used now.
    fn touch(&self) {
        self.last_used.store(now_ms(), Ordering::Relaxed);
    }

    /// When the link was last used (for least-recently-used eviction).
    pub(crate) fn last_used(&self) -> u64 {
        self.last_used.load(Ordering::Relaxed)
    }

    /// Whether an op of this link may still touch memory or wait for an answer (posted,
    /// waited on or abandoned with parts outstanding): such a link is never evicted. Takes the
    /// token log, then the op table, the order [`TokenLog::record`] takes them in: the caller
    /// holds neither.
    pub(crate) fn in_flight(&self) -> bool {
        if self.notifies_waiting.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let t = crate::sync::lock(&self.tokens);
        let ops = crate::sync::lock(&self.ops.table);
        Self::any_in_flight(&t, &ops)
    }

    fn any_in_flight(t: &TokenLog, ops: &crate::keep::Ops) -> bool {
        use hixl_core::Phase;
        t.tokens.iter().any(|&t| {
            matches!(
                ops.phase(t),
                Some(Phase::Staged | Phase::Posted | Phase::Waiting | Phase::Abandoned)
            )
        })
    }

    /// An op was posted and recorded: on an idle link, tells the driver at once (its session
    /// probes and arms the active bound); otherwise one load.
    fn working(&self) {
        if !self.work_seen.load(Ordering::Relaxed) && !self.work_seen.swap(true, Ordering::AcqRel) {
            let _ = self.driver.send(driver::Command::Working);
        }
    }

    /// The driver's side of [`Link::working`], when the session is about to turn the link
    /// idle: whether work is still in flight. The flag is cleared before looking, so that a
    /// submit the look misses finds it clear and sends [`driver::Command::Working`].
    fn still_working(&self) -> bool {
        self.work_seen.swap(false, Ordering::AcqRel);
        let busy = self.in_flight();
        if busy {
            self.work_seen.store(true, Ordering::Release);
        }
        busy
    }

    /// Which transport serves this peer, and why.
    /// Its channels' RDMA rails.
    pub(crate) fn rails(&self) -> Vec<crate::RailInfo> {
        self.channels.iter().flat_map(|c| c.rails()).collect()
    }

    pub(crate) fn transport(&self) -> &str {
        &self.transport
    }

    /// The peer's remotely accessible regions, in address order.
    pub(crate) fn regions(&self) -> Vec<RemoteRegion> {
        crate::sync::read(&self.table).clone()
    }

    /// Takes the peer's new table.
    fn set_table(&self, v: Vec<RemoteRegion>) {
        *crate::sync::write(&self.table) = v;
    }

    /// The index of the first `(addr, len)` range no region of the peer's table holds.
    pub(crate) fn first_missing(&self, ranges: &[(u64, u64)]) -> Option<usize> {
        let t = crate::sync::read(&self.table);
        ranges
            .iter()
            .position(|&(addr, len)| holding(&t, addr, len).is_none())
    }

    /// A barrier on the control connection: resolves once every memory table the peer sent
    /// before it answered a probe sent now is this link's table, so that a region the peer
    /// registered before this call is in the table unless the peer no longer exports it.
    pub(crate) async fn sync_table(&self, timeout: std::time::Duration) -> hixl_core::Result<()> {
        let deadline = crate::clock::deadline_after(timeout);
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self
            .driver
            .send(driver::Command::Sync { reply: tx })
            .is_err()
        {
            return Err(self.lost("link closed"));
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(self.lost("link closed")),
            Err(_) => Err(Error::Timeout {
                what: "a table sync",
                peer: self.name.to_string(),
                after: timeout,
            }),
        }
    }

    fn lost(&self, cause: &str) -> Error {
        self.state.error().unwrap_or_else(|| Error::PeerLost {
            peer: self.name.to_string(),
            cause: cause.into(),
        })
    }

    /// Orderly close with `cause` as the link's error (what later uses of it report): the
    /// driver tells the peer why and ends the link.
    pub(crate) fn close_because(&self, reason: &str, cause: Error) {
        self.state.doom(cause.clone());
        let close = driver::Command::Close {
            reason: reason.into(),
        };
        if self.driver.send(close).is_err() {
            self.state.kill(cause); // the driver has ended already
        }
    }

    /// Resolves once the link has ended and every task of it (its driver, the control
    /// writer, the data connections, the channels' tasks) has been joined.
    pub(crate) async fn closed(&self) {
        self.state.joined().await;
    }

    /// Orderly close: tells the peer, then ends every task of the link. In-flight ops fail.
    pub(crate) fn close(&self, reason: &str) {
        self.close_because(
            reason,
            Error::NotConnected {
                peer: self.name.to_string(),
            },
        );
    }
}

impl Withdraw for Link {
    fn peer(&self) -> &str {
        &self.name
    }

    fn withdraw(&self, token: Token) {
        let e = Error::Cancelled {
            what: "a transport part",
        };
        for ch in &self.channels {
            ch.withdraw(token, &e);
        }
    }

    fn progress(&self) -> bool {
        let mut moved = false;
        for ch in &self.channels {
            moved |= ch.progress();
        }
        // Completions other threads posted (a copy stream's, a CQ's) are drained here rather
        // than by a reactor woken for them.
        moved | (self.ops.sink.drain() > 0)
    }

    fn spinning(&self, on: bool) {
        for ch in &self.channels {
            ch.spinning(on);
        }
    }

    fn nudge(&self) {
        for ch in &self.channels {
            ch.nudge();
        }
    }

    fn spin(&self) -> std::time::Duration {
        self.spin
    }
}
