//! One transfer of a worker, awaited in one of the ways the workload mixes.

use std::time::{Duration, Instant};

use hixl::{Error, OpDesc, Peer, TransferOp};

use super::lane::Lane;
use super::state::inc;
use super::HANG;

/// How a transfer is awaited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// Awaited (under the hang watchdog).
    Plain,
    /// With `.timeout()` of this many microseconds.
    Tiny(u64),
    /// Dropped: at once (0), or after polling it for up to this many microseconds.
    Drop(u64),
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Tiny(_) => "tiny timeout",
            Mode::Drop(_) => "dropped",
        }
    }
}

pub(super) enum Outcome {
    Done,
    Failed(Error),
    Dropped,
    Hang,
}

/// One descriptor of a worker: remote slot and offset in it, local slot and offset, length.
#[derive(Clone, Copy, Debug)]
pub(super) struct D {
    pub(super) slot: usize,
    pub(super) lslot: usize,
    pub(super) roff: u64,
    pub(super) loff: u64,
    pub(super) len: u64,
}

pub(super) async fn transfer(
    lane: &Lane,
    peer: &Peer,
    op: TransferOp,
    descs: &[OpDesc],
    mode: Mode,
) -> Outcome {
    inc(&lane.stats.submitted, 1);
    inc(&lane.stats.descriptors, descs.len() as u64);
    let r = match mode {
        Mode::Plain => {
            let t0 = Instant::now();
            let r = tokio::time::timeout(HANG, peer.transfer(op, descs)).await;
            lane.stats.latency.record(t0.elapsed());
            r
        }
        Mode::Tiny(us) => {
            inc(&lane.stats.tiny_timeouts, 1);
            let t = peer
                .transfer(op, descs)
                .timeout(Duration::from_micros(us.max(1)));
            tokio::time::timeout(HANG, t).await
        }
        Mode::Drop(us) => {
            let mut t = peer.transfer(op, descs);
            if us == 0 {
                drop(t);
                return Outcome::Dropped;
            }
            match tokio::time::timeout(Duration::from_micros(us), &mut t).await {
                Ok(r) => Ok(r),
                Err(_) => {
                    drop(t);
                    return Outcome::Dropped;
                }
            }
        }
    };
    match r {
        Ok(Ok(())) => Outcome::Done,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(_) => Outcome::Hang,
    }
}
