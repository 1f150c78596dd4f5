//! [`Peer`]: the handle users hold on a connected peer.

use std::sync::Arc;
use std::time::Duration;

use hixl_core::{Error, OpDesc, RemoteRegion, Result, StridedDesc, TransferOp};

use super::Link;
use crate::transfer::Transfer;

/// A connected peer (the initiator's view): its memory table, transfers and notifies.
#[derive(Debug, Clone)]
pub struct Peer {
    pub(crate) link: Arc<Link>,
}

impl Peer {
    /// The peer's engine address.
    pub fn name(&self) -> &str {
        &self.link.name
    }

    /// The peer engine's incarnation: a random id it drew when it started, carried by the
    /// handshake. A peer restarted on the same address has a new one (and is a new link:
    /// nothing of the old link is used for it).
    pub fn incarnation(&self) -> u64 {
        self.link.incarnation
    }

    /// Which transport serves this peer and why, e.g. `fabric (same host: ...)` or
    /// `tcp (the peer is on another host ...)`.
    pub fn transport(&self) -> &str {
        self.link.transport()
    }

    /// The link's RDMA rails when verbs serves it (empty otherwise): each of our devices
    /// paired with one of the peer's, why, the MTU agreed, whether it is up, and its counters.
    pub fn rails(&self) -> Vec<crate::RailInfo> {
        self.link.rails()
    }

    /// Whether the link is up.
    pub fn is_connected(&self) -> bool {
        !self.link.state.is_dead()
    }

    /// Why the link went down, if it did.
    pub fn error(&self) -> Option<Error> {
        self.link.state.error()
    }

    /// The regions the peer made remotely accessible, in address order. Kept current: the
    /// peer pushes its table again whenever it registers or deregisters memory.
    pub fn regions(&self) -> Vec<RemoteRegion> {
        self.link.regions()
    }

    /// Makes sure the peer's memory table is current for `(addr, len)` ranges: returns at
    /// once when the table holds every one; otherwise syncs the table with the peer (one
    /// round trip on the control connection, within `timeout`; `Duration::MAX`: no bound) and
    /// looks again.
    ///
    /// The peer's table reaches this side over the control connection, pushed when the peer
    /// registers memory: by the time the peer's register call returns, the update is on its
    /// way but may not have arrived. A side that learns of a new region another way (the
    /// peer's KV cache table, a serving engine's request parameters) calls this before its
    /// transfer instead of having it refused. After the sync, every region the peer
    /// registered before it answered is in the table: a range still missing is truly outside
    /// what the peer exports (no update was in flight).
    ///
    /// # Errors
    /// [`Error::RemoteOutOfBounds`] naming the first range (by its index) still missing after
    /// the sync; [`Error::Timeout`] when the peer did not answer within `timeout`; the link's
    /// error when it is down.
    pub async fn sync_regions(&self, ranges: &[(u64, u64)], timeout: Duration) -> Result<()> {
        if self.link.first_missing(ranges).is_none() {
            return Ok(());
        }
        self.link.sync_table(timeout).await?;
        match self.link.first_missing(ranges) {
            None => Ok(()),
            Some(index) => {
                let (addr, len) = ranges.get(index).copied().unwrap_or_default();
                Err(Error::RemoteOutOfBounds {
                    peer: self.link.name.to_string(),
                    addr,
                    len,
                    index,
                })
            }
        }
    }

    /// The peer's region registered under `name`.
    pub fn region(&self, name: &str) -> Option<RemoteRegion> {
        self.link
            .regions()
            .into_iter()
            .find(|r| r.name.as_deref() == Some(name))
    }

    /// Posts a transfer. Every descriptor is checked first (local range registered, remote
    /// range inside a region the peer exported with the needed access); if any fails, nothing
    /// moves and the returned future resolves with that error.
    pub fn transfer(&self, op: TransferOp, descs: &[OpDesc]) -> Transfer {
        self.post(op, descs)
    }

    /// Submits, and gives the transfer what its telemetry needs.
    fn post<D: crate::link::submit::Desc>(&self, op: TransferOp, descs: &[D]) -> Transfer {
        let posted = std::time::Instant::now();
        let t = match self.link.submit(op, descs) {
            Ok(t) => Transfer::posted(self.link.ops.table.clone(), t, self.link.clone()),
            Err(e) => Transfer::failed(self.link.ops.table.clone(), e, self.link.name.clone()),
        };
        t.with_telemetry(crate::telemetry::Started {
            tele: self.link.telemetry.clone(),
            op,
            bytes: descs.iter().fold(0u64, |a, d| a.saturating_add(d.bytes())),
            descriptors: descs.len() as u64,
            post: posted.elapsed(),
            posted,
        })
    }

    /// Posts a transfer of strided descriptors ([`StridedDesc`]): each is checked once, by
    /// its spans, and moves as one operation where the transport has one (the fabric: one
    /// strided copy, or one cross-memory-attach call per 1024 pieces); otherwise as its
    /// pieces. Same rules as [`Peer::transfer`] otherwise.
    pub fn transfer_strided(&self, op: TransferOp, descs: &[StridedDesc]) -> Transfer {
        self.post(op, descs)
    }

    /// `transfer(TransferOp::Read, descs)`: remote → local.
    pub fn read(&self, descs: &[OpDesc]) -> Transfer {
        self.transfer(TransferOp::Read, descs)
    }

    /// `transfer(TransferOp::Write, descs)`: local → remote.
    pub fn write(&self, descs: &[OpDesc]) -> Transfer {
        self.transfer(TransferOp::Write, descs)
    }

    /// Sends a notify (name and msg ≤ 1024 bytes each) and waits up to 1 s for the ack.
    ///
    /// A notify sent after a transfer completed is observed by the peer after that transfer's
    /// bytes are in its memory: a transfer completes only once the peer has placed the data.
    ///
    /// # Errors
    /// [`Error::NotifyTooLong`], [`Error::NotifyQueueFull`] when the peer has 4096 of ours
    /// undrained, [`Error::Timeout`], or the link's failure.
    pub async fn notify(&self, name: impl AsRef<[u8]>, msg: impl AsRef<[u8]>) -> Result<()> {
        self.notify_timeout(name, msg, Duration::from_secs(1)).await
    }

    /// [`Peer::notify`] with an explicit timeout.
    ///
    /// # Errors
    /// As [`Peer::notify`].
    pub async fn notify_timeout(
        &self,
        name: impl AsRef<[u8]>,
        msg: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> Result<()> {
        self.link.notify(name.as_ref(), msg.as_ref(), timeout).await
    }
}
