//! The narrow handles an engine's parts are given, instead of the engine: the region table
//! ([`Regions`]), the op table with the completion sink ([`OpsHandle`]), and the settings of
//! control connections ([`EngineConfig`]). A bottom-level module: it imports none of the
//! engine, link, server or transport-task modules.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_core::session::Config;
use hixl_core::RegionTable;

use crate::keep::SharedOps;
use crate::memory::RegionInner;
use crate::sink::Completions;

/// The engine's registered regions (what the TCP target validates requests against, what
/// links resolve local addresses in, what the memory table exports).
pub(crate) type Regions = Arc<Mutex<RegionTable<Arc<RegionInner>>>>;

/// What posts ops and completes their parts: the op table and the completion sink.
#[derive(Debug, Clone)]
pub(crate) struct OpsHandle {
    pub(crate) table: SharedOps,
    /// Where transports hand in finished parts.
    pub(crate) sink: Completions,
}

/// The settings every control connection of the engine uses.
#[derive(Debug)]
pub(crate) struct EngineConfig {
    /// The engine's name (`ip` or `ip:port`).
    pub(crate) name: String,
    /// Liveness of control connections (`hixl.HeartbeatIntervalMs`, `hixl.HeartbeatMissLimit`,
    /// `hixl.HeartbeatIdleMs`).
    pub(crate) heartbeat: Heartbeat,
    /// The shared secret connects are authenticated with (`hixl.AuthSecret` or
    /// `HIXL_AUTH_SECRET`), if any.
    pub(crate) auth: Option<hixl_core::auth::Secret>,
    /// How long awaiting tasks and TCP target connections spin before they park
    /// (`hixl.SpinUs`).
    pub(crate) spin: Duration,
    /// TCP target connections of this engine spinning for their next request now: at most
    /// [`TARGET_SPINNERS`] do, the others park at once (spinners that outnumber the cores
    /// only take turns holding them).
    pub(crate) target_spinners: std::sync::atomic::AtomicUsize,
    /// How the initiator's TCP data connections move bytes (`hixl.TcpIo`, after the probe:
    /// `epoll` where io_uring was asked for and refused).
    pub(crate) tcp_io: hixl_core::options::TcpIo,
    /// Why io_uring was asked for and not given, if it was.
    pub(crate) tcp_io_refused: Option<String>,
}

/// How many TCP target connections of an engine spin at once.
pub(crate) const TARGET_SPINNERS: usize = 1;

impl EngineConfig {
    /// The configuration of a session of this engine (`incarnation`: the engine's).
    pub(crate) fn session(&self, incarnation: u64) -> Config {
        Config {
            secret: self.auth.clone(),
            heartbeat_interval: self.heartbeat.interval,
            heartbeat_miss_limit: self.heartbeat.miss_limit,
            heartbeat_idle: self.heartbeat.idle,
            // Every link of the process probes on the same grid: one timer wake-up per
            // interval serves them all.
            probe_grid: Some(crate::clock::epoch()),
            ..Config::new(self.name.clone(), incarnation)
        }
    }

    /// A fresh authentication nonce when the engine has a secret (zeros otherwise: unused).
    ///
    /// # Errors
    /// The OS could not give randomness.
    pub(crate) fn nonce(&self) -> std::io::Result<[u8; hixl_core::auth::NONCE_LEN]> {
        match &self.auth {
            Some(_) => hixl_core::auth::nonce(),
            None => Ok([0; hixl_core::auth::NONCE_LEN]),
        }
    }
}

/// How often each end of a control connection probes the other, and how many probes may go
/// unanswered before the link is declared dead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heartbeat {
    pub(crate) interval: Duration,
    pub(crate) miss_limit: u32,
    /// The probing period of a link with nothing in flight (`None`: like a busy link).
    pub(crate) idle: Option<Duration>,
}

pub(crate) use crate::rng::random_u64;
