//! Initialize options: HIXL's string key/value options, parsed into typed, validated values.
//!
//! [`Options`] accepts every key HIXL's `Initialize` accepts (`EnableUseFabricMem`, `BufferPool`,
//! `RdmaTrafficClass`, `RdmaServiceLevel`, `GlobalResourceConfig`, `AutoConnect`,
//! `LocalCommRes`), the ADXL spellings of four of them (`adxl.BufferPool`,
//! `adxl.RdmaTrafficClass`, `adxl.RdmaServiceLevel`, `adxl.LocalCommRes`), and hixl's own
//! extensions under the `hixl.` prefix. Ranges and defaults are HIXL's. Keys are case-sensitive,
//! as in HIXL; values have surrounding whitespace trimmed.
//!
//! Where hixl is stricter than HIXL:
//! - an unknown key, even inside `GlobalResourceConfig`, is an error (HIXL ignores it);
//! - [`Options::from_pairs`] refuses a key given twice (HIXL keeps one silently);
//! - environment fallbacks (`HCCL_RDMA_TC`, `HCCL_RDMA_SL`) are not read by this sans-io module;
//!   an empty RDMA value means "the default", as it does in HIXL when the variable is unset.

mod buffer_pool;
pub mod directory;
mod global;
mod keys;
mod size;
mod transport;

pub use buffer_pool::BufferPool;
pub use directory::DirectoryOptions;
pub use global::{
    ChannelPool, CommResourceConfig, ConnectPool, FabricMemory, GlobalResourceConfig,
    PROTOCOL_DESCS,
};
pub use size::parse_size;
pub use transport::{TcpIo, TransportChoice};

use crate::error::Error;

const DEFAULT_TRAFFIC_CLASS: u64 = 132;
const DEFAULT_SERVICE_LEVEL: u64 = 4;
const MIB: u64 = 1 << 20;
/// `hixl.SpinUs` by default: about the cost of parking and waking a thread on a VM.
pub const DEFAULT_SPIN_US: u64 = 50;

/// Default `hixl.VerbsQpsPerRail` (see docs/benchmarks.md for the measurement behind it).
pub const DEFAULT_QPS_PER_RAIL: u8 = 2;
/// Largest `hixl.VerbsQpsPerRail` (and most queue pairs a target makes for one rail).
pub const MAX_QPS_PER_RAIL: u8 = 16;

/// Default `hixl.VerbsSliceBytes` (see docs/benchmarks.md for the measurement behind it).
pub const DEFAULT_SLICE_BYTES: u64 = 256 * 1024;
/// Shortest `hixl.AuthSecret`.
const MIN_SECRET: usize = 16;
const GIB: u64 = 1 << 30;

/// Typed, validated initialize options. `Default` gives HIXL's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// `EnableUseFabricMem` (`"0"`/`"1"`, default off): FabricMem mode (HIXL: A3 only). Cannot be
    /// combined with an explicitly enabled `BufferPool`. An empty value means off, as in HIXL.
    pub enable_use_fabric_mem: bool,
    /// `BufferPool` / `adxl.BufferPool`: relay buffer pool, default `4:8`. Validated, not used.
    pub buffer_pool: BufferPool,
    /// `RdmaTrafficClass` / `adxl.RdmaTrafficClass`: 0–255, a multiple of 4, default 132.
    pub rdma_traffic_class: u8,
    /// `RdmaServiceLevel` / `adxl.RdmaServiceLevel`: 0–7, default 4.
    pub rdma_service_level: u8,
    /// `GlobalResourceConfig`: JSON object of dotted keys; see [`GlobalResourceConfig`].
    pub global: GlobalResourceConfig,
    /// `AutoConnect` (`"0"`/`"1"`, default off): transfers connect lazily; broken links are
    /// cleaned up automatically.
    pub auto_connect: bool,
    /// `LocalCommRes` / `adxl.LocalCommRes`: the raw JSON string (an object with a string
    /// `"version"`), or `None` when empty or unset.
    pub local_comm_res: Option<String>,
    /// `hixl.Transport` (hixl extension): which data transport to use, default `auto`.
    pub transport: TransportChoice,
    /// `hixl.TcpStreams` (hixl extension): data connections per peer, 1–16, default 4.
    pub tcp_streams: usize,
    /// `hixl.TcpChunkBytes` (hixl extension): TCP chunk size, 4 KiB–1 GiB, default 4 MiB. Accepts
    /// sizes such as `"512K"`, `"2M"`, `"1048576"` (see [`parse_size`]).
    pub tcp_chunk_bytes: u64,
    /// `hixl.TcpIo` (hixl extension): how the initiator's TCP data connections move bytes,
    /// `epoll` (default) or `uring`; see [`TcpIo`].
    pub tcp_io: TcpIo,
    /// `hixl.HeartbeatIntervalMs` (hixl extension): 10–600000 ms, default 1000.
    pub heartbeat_interval_ms: u64,
    /// `hixl.HeartbeatMissLimit` (hixl extension): missed heartbeats before a peer is declared
    /// dead, 1–100, default 5.
    pub heartbeat_miss_limit: u32,
    /// `hixl.HeartbeatIdleMs` (hixl extension): how often a link with nothing in flight
    /// probes its peer, 0–3600000 ms, default 30000; 0, or not above the interval: like a
    /// busy link. A target holds an idle initiator to the period it announces, up to this.
    pub heartbeat_idle_ms: u64,
    /// `hixl.FabricBusyPollUs` (hixl extension): how long an idle fabric copy stream spins
    /// before sleeping, 0–10000 µs, default 0 (an idle engine uses no CPU).
    pub fabric_busy_poll_us: u64,
    /// `hixl.SpinUs` (hixl extension): how long a task awaiting a transfer, and a TCP target
    /// connection between requests, keep polling after their last progress before they park,
    /// 0–1000000 µs, default 50 (about what parking and waking a thread costs, so spinning
    /// never costs more than twice the best choice in hindsight; an idle engine is quiet 50 µs
    /// after its last op). Large values are a busy-poll mode for latency-critical users: a
    /// core per waiting task spins while ops are in flight and, on a target, between requests.
    /// 0 parks at once.
    pub spin_us: u64,
    /// `hixl.VerbsDevices` (hixl extension; `hixl.VerbsDevice` is its one-device spelling): the
    /// RDMA devices a link stripes over, e.g. `mlx5_0,mlx5_1`; empty (the default) takes every
    /// device with an active port. Each reachable (local device, peer device) pair is a rail.
    pub verbs_devices: Vec<String>,
    /// `hixl.VerbsQpsPerRail` (hixl extension): RC queue pairs per rail, 1–16, default
    /// [`DEFAULT_QPS_PER_RAIL`].
    pub verbs_qps_per_rail: u8,
    /// `hixl.VerbsSliceBytes` (hixl extension): an RDMA op longer than this is cut into slices
    /// of this size spread over the rails and their queue pairs, 4 KiB–1 GiB, default
    /// [`DEFAULT_SLICE_BYTES`].
    pub verbs_slice_bytes: u64,
    /// `hixl.VerbsPort` (hixl extension): the device port, 1–255, default 1.
    pub verbs_port: u8,
    /// `hixl.VerbsGidIndex` (hixl extension): source GID index for RoCE, 0–255; unset picks the
    /// port's first RoCE v2 GID.
    pub verbs_gid_index: Option<u8>,
    /// `hixl.VerbsTimeout` (hixl extension): local ACK timeout exponent of the QPs
    /// (4.096 µs × 2^n per try), 1–31, default 14 (~67 ms).
    pub verbs_timeout: u8,
    /// `hixl.VerbsRetryCount` (hixl extension): transport retries before an op fails, 0–7,
    /// default 7.
    pub verbs_retry_count: u8,
    /// `hixl.AuthSecret` (hixl extension): a shared secret (at least 16 bytes) that makes
    /// connect run a mutual HMAC-SHA256 challenge-response before any memory table is sent.
    /// When unset, the engine reads `HIXL_AUTH_SECRET` from the environment at build.
    pub auth_secret: Option<crate::auth::Secret>,
    /// `hixl.Directory`, `hixl.Name`, `hixl.DirectoryPrefix`, `hixl.DirectoryUser`,
    /// `hixl.DirectoryPassword`, `hixl.DirectoryTtlSec` (hixl extensions): publish this engine
    /// under a name in an etcd directory and find peers by name. Unset: by address only.
    pub directory: DirectoryOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            enable_use_fabric_mem: false,
            buffer_pool: BufferPool::default(),
            rdma_traffic_class: DEFAULT_TRAFFIC_CLASS as u8,
            rdma_service_level: DEFAULT_SERVICE_LEVEL as u8,
            global: GlobalResourceConfig::default(),
            auto_connect: false,
            local_comm_res: None,
            transport: TransportChoice::Auto,
            tcp_streams: 4,
            tcp_chunk_bytes: 4 * MIB,
            tcp_io: TcpIo::Epoll,
            heartbeat_interval_ms: 1000,
            heartbeat_miss_limit: 5,
            heartbeat_idle_ms: 30_000,
            fabric_busy_poll_us: 0,
            spin_us: DEFAULT_SPIN_US,
            verbs_devices: Vec::new(),
            verbs_qps_per_rail: DEFAULT_QPS_PER_RAIL,
            verbs_slice_bytes: DEFAULT_SLICE_BYTES,
            verbs_port: 1,
            verbs_gid_index: None,
            verbs_timeout: 14,
            verbs_retry_count: 7,
            auth_secret: None,
            directory: DirectoryOptions::new(),
        }
    }
}

fn invalid(key: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidOption {
        key: key.to_owned(),
        value: value.to_owned(),
        reason: reason.into(),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::error::Result;

    pub(super) fn opts(pairs: &[(&str, &str)]) -> Result<Options> {
        Options::from_pairs(pairs.iter().copied())
    }

    /// The fields of an `InvalidOption`; panics on any other error.
    pub(super) fn invalid_parts(e: Error) -> (String, String, String) {
        match e {
            Error::InvalidOption { key, value, reason } => (key, value, reason),
            other => panic!("expected InvalidOption, got {other:?}"),
        }
    }

    /// `set(key, value)` fails with `InvalidOption` naming `key` and `value`; returns the reason.
    pub(super) fn set_err(key: &str, value: &str) -> String {
        let err = Options::default().set(key, value).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(key) && msg.contains(&format!("{value:?}")),
            "{msg}"
        );
        let (k, v, reason) = invalid_parts(err);
        assert_eq!((k.as_str(), v.as_str()), (key, value));
        reason
    }

    #[test]
    fn defaults_match_hixl() {
        let o = Options::default();
        assert!(!o.enable_use_fabric_mem && !o.auto_connect);
        assert_eq!(
            o.buffer_pool,
            BufferPool {
                count: 4,
                size_mb: 8
            }
        );
        assert!(o.buffer_pool.is_enabled() && !BufferPool::DISABLED.is_enabled());
        assert_eq!((o.rdma_traffic_class, o.rdma_service_level), (132, 4));
        assert_eq!(
            (o.local_comm_res.as_deref(), o.transport),
            (None, TransportChoice::Auto)
        );
        assert_eq!((o.tcp_streams, o.tcp_chunk_bytes), (4, 4 * MIB));
        assert_eq!((o.heartbeat_interval_ms, o.heartbeat_miss_limit), (1000, 5));
        assert_eq!(o.heartbeat_idle_ms, 30_000);
        assert_eq!(o.global, GlobalResourceConfig::default());
        assert_eq!(opts(&[]).unwrap(), o);
    }
}
