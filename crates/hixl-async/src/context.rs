//! State every task and handle of one engine shares: the region and op tables, the
//! completion sink, notifies, the transports, heartbeat and authentication settings.
//! A bottom-level module: it imports none of the link, server or transport-task modules.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_core::region::OsRkeys;
use hixl_core::RegionTable;

use crate::memory::RegionInner;
use crate::notify::NotifyQueue;
use crate::sink::Completions;

/// State shared by the engine's tasks and handles.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) regions: Arc<Mutex<RegionTable<Arc<RegionInner>>>>,
    pub(crate) ops: crate::keep::SharedOps,
    /// Where transports hand in finished parts.
    pub(crate) sink: Completions,
    pub(crate) notifies: Arc<NotifyQueue>,
    /// The transports besides TCP, in the order the transport policy tries them.
    pub(crate) transports: Vec<Arc<dyn crate::transport::Transport>>,
    /// Liveness of control connections (`hixl.HeartbeatIntervalMs`, `hixl.HeartbeatMissLimit`).
    pub(crate) heartbeat: Heartbeat,
    /// The shared secret connects are authenticated with (`hixl.AuthSecret` or
    /// `HIXL_AUTH_SECRET`), if any.
    pub(crate) auth: Option<hixl_core::auth::Secret>,
}

/// How often each end of a control connection probes the other, and how many probes may go
/// unanswered before the link is declared dead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heartbeat {
    pub(crate) interval: Duration,
    pub(crate) miss_limit: u32,
}

/// A random u64 from the OS CSPRNG.
pub(crate) fn random_u64() -> u64 {
    use hixl_core::region::RkeySource;
    OsRkeys.next_rkey()
}
