//! How long a pull or push may take, and what its end means for memory still being read.

use std::time::Duration;

use hixl_async::Transfer;
use tokio::time::Instant;

/// The deadline of one pull or push, shared by all its transfers (one deadline: a transfer
/// created later does not get a later one), and whether a transfer past it waits for its
/// parts in flight before it resolves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound {
    at: Instant,
    quiesce: bool,
}

impl Bound {
    /// `after` from now (`llm.SyncKvCacheWaitTime` of a pull or push without a lease).
    pub(crate) fn after(after: Duration) -> Bound {
        Bound {
            at: Instant::now() + after,
            quiesce: false,
        }
    }

    /// A leased pull that began at `start`, before it asked for its ticket: it ends by
    /// `start + window`, so inside the owner's window (opened when the owner admitted the
    /// ticket, later), and a transfer past it resolves only once nothing of it moves. Only
    /// then may the ticket go back and the owner reuse the blocks.
    pub(crate) fn leased(start: Instant, window: Duration) -> Bound {
        Bound {
            at: start + window,
            quiesce: true,
        }
    }

    /// What is left of it (zero once it passed).
    pub(crate) fn left(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// `t`, bounded by it.
    pub(crate) fn apply(&self, t: Transfer) -> Transfer {
        let t = t.deadline(self.at);
        if self.quiesce {
            t.quiesce_on_timeout()
        } else {
            t
        }
    }
}
