//! The typed error of every hixl call; each variant maps onto exactly one HIXL [`Status`].

use std::sync::Arc;
use std::time::Duration;

use crate::status::Status;

/// Result alias used across hixl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which side of a transfer descriptor an address belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The initiator's own memory.
    Local,
    /// The peer's memory.
    Remote,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Remote => "remote",
        })
    }
}

/// Everything that can go wrong in hixl. Each variant names the offending value.
///
/// `Error` is `Clone` so that one failure (a dead peer, say) can resolve many pending transfers.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call was made before `initialize` (blocking facade) or after `finalize`.
    #[error("engine is not initialized (call initialize first, and not after finalize)")]
    NotInitialized,
    /// A call on an engine after its `shutdown` (HIXL's `Finalize`) began.
    /// Maps to FAILED, as HIXL answers calls after `Finalize`.
    /// Also the cause of every op still in flight on a link that shutdown or dropping the
    /// engine closed.
    #[error("engine {engine} is shut down ({what})")]
    ShutDown {
        /// The engine's name.
        engine: String,
        /// What was refused or ended: `"connect refused"`, `"register refused"`, ...
        what: &'static str,
    },
    /// Work of a transfer withdrawn before it started, because the transfer was dropped or
    /// timed out (or its connect was abandoned). Only the op's owner, already gone, could see it.
    #[error("{what} was withdrawn: its transfer was dropped or timed out first")]
    Cancelled {
        /// What was withdrawn (`"a TCP part"`, `"a fabric copy"`, ...).
        what: &'static str,
    },
    /// A state that cannot happen: a bug in hixl (a lock poisoned where recovering it would
    /// not be sound, a region missing right after its registration). The call fails; no
    /// completion is dropped (poisoned locks are recovered, see ARCHITECTURE.md, "Locks and
    /// poisoning").
    #[error("internal error: {what} (a bug in hixl; please report it)")]
    Internal {
        /// What failed.
        what: &'static str,
    },
    /// A transfer call without a descriptor.
    #[error("a transfer needs at least one descriptor")]
    NoDescriptors,
    /// A sans-io session command given in a phase that does not take it (a driver's
    /// mistake): `command` is the command, `needs` what it waits for.
    #[error("{command} is not valid now: {needs}")]
    SessionOutOfPhase {
        /// The command, e.g. "a transport offer".
        command: &'static str,
        /// What it needs first, e.g. "it goes before the first memory table".
        needs: &'static str,
    },
    /// A session command naming an rkey or notify the session does not wait on.
    #[error("{what} {id:#x} is not pending")]
    SessionNotPending {
        /// "rkey" (a revocation) or "notify" (a notify's answer).
        what: &'static str,
        /// The rkey or sequence number.
        id: u64,
    },
    /// A revocation of an rkey the session is revoking already.
    #[error("rkey {rkey:#x} is already being revoked")]
    AlreadyRevoking {
        /// The rkey.
        rkey: u64,
    },
    /// A session command handed a message of a kind it does not take.
    #[error("{command} does not take {frame}")]
    SessionWrongMessage {
        /// The command.
        command: &'static str,
        /// The message given (its short form).
        frame: String,
    },
    /// A frame that the wire cannot carry intact (a field over the decoder's limits).
    #[error("{frame} cannot be sent intact{}", .source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Unsendable {
        /// The frame (its short form).
        frame: String,
        /// The decoder's objection, when it had one.
        #[source]
        source: Option<crate::wire::WireError>,
    },
    /// An option key that HIXL and hixl do not know.
    #[error("unknown option key {key:?}")]
    UnknownOption {
        /// The key as given.
        key: String,
    },
    /// An option value outside its range or of the wrong form.
    #[error("option {key:?} has invalid value {value:?}: {reason}")]
    InvalidOption {
        /// The key.
        key: String,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The engine address is not `ip`, `ip:port`, `[ipv6]` or `[ipv6]:port`.
    #[error("invalid engine address {addr:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A timeout of zero or less (HIXL: PARAM_INVALID).
    #[error("timeout must be > 0 ms, got {millis} ms")]
    InvalidTimeout {
        /// The timeout as given, in milliseconds.
        millis: i64,
    },
    /// A memory descriptor or transfer descriptor with a null address.
    #[error("{side} address of descriptor {index} is null")]
    NullAddress {
        /// Which address.
        side: Side,
        /// Index of the descriptor in the call (0 for a registration).
        index: usize,
    },
    /// A memory descriptor or transfer descriptor of zero length.
    #[error("descriptor {index} has zero length")]
    ZeroLength {
        /// Index of the descriptor in the call (0 for a registration).
        index: usize,
    },
    /// `addr + len` overflows the address space.
    #[error("range {addr:#x}+{len} overflows the address space")]
    RangeOverflow {
        /// Start address.
        addr: u64,
        /// Length in bytes.
        len: u64,
    },
    /// A registration overlaps an existing region of the same kind: partly, or wholly where
    /// the caller asked for a region of its own ([`Overlap`](Error::Overlap) is never returned
    /// for the identical range by a plain registration, which gets the existing handle).
    #[error("region {addr:#x}+{len} overlaps registered region {existing_addr:#x}+{existing_len}")]
    Overlap {
        /// Start of the new region.
        addr: u64,
        /// Length of the new region.
        len: u64,
        /// Start of the region it overlaps.
        existing_addr: u64,
        /// Length of the region it overlaps.
        existing_len: u64,
    },
    /// A local range of a transfer is not inside one registered region.
    #[error("local range {addr:#x}+{len} of descriptor {index} is not inside a registered region")]
    LocalUnregistered {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// Descriptor index.
        index: usize,
    },
    /// A remote range of a transfer is not inside a region the peer made remotely accessible.
    #[error(
        "remote range {addr:#x}+{len} of descriptor {index} is outside the regions {peer} exported"
    )]
    RemoteOutOfBounds {
        /// The peer.
        peer: String,
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// Descriptor index.
        index: usize,
    },
    /// The region does not grant the access an operation needs.
    #[error("region {addr:#x}+{len} does not allow {need}")]
    AccessDenied {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
        /// The access that was needed (`remote read`, `remote write`).
        need: &'static str,
    },
    /// A memory kind this build cannot register (device memory without a device runtime).
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported, and why.
        what: String,
    },
    /// Connecting an engine to its own address.
    #[error("cannot connect engine {engine} to itself")]
    ConnectToSelf {
        /// The engine address.
        engine: String,
    },
    /// The peer speaks another version of the wire protocol (it refused this engine's
    /// hello, or answered in its own version): the two cannot talk.
    #[error("peer {peer} speaks hixl wire {theirs}, this engine {ours}")]
    WireVersion {
        /// The peer.
        peer: String,
        /// Its wire version.
        theirs: u8,
        /// This engine's ([`crate::wire::VERSION`]).
        ours: u8,
    },
    /// No link to this peer.
    #[error("not connected to {peer}")]
    NotConnected {
        /// The peer.
        peer: String,
    },
    /// A link to this peer already exists.
    #[error("already connected to {peer}")]
    AlreadyConnected {
        /// The peer.
        peer: String,
    },
    /// An operation did not finish within its timeout.
    #[error("{what} with {peer} timed out after {after:?}")]
    Timeout {
        /// The operation (`connect`, `transfer`, `notify`...).
        what: &'static str,
        /// The peer.
        peer: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// A notify name or message longer than 1024 bytes.
    #[error("notify {field} is {len} bytes, the limit is {max}")]
    NotifyTooLong {
        /// `name` or `msg`.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer already holds the maximum number of undrained notifies from us.
    #[error("{peer} has {limit} notifies pending; it must drain them before more are accepted")]
    NotifyQueueFull {
        /// The peer.
        peer: String,
        /// The limit.
        limit: usize,
    },
    /// Some bounded resource is exhausted.
    #[error("resource exhausted: {what}")]
    ResourceExhausted {
        /// Which resource.
        what: String,
    },
    /// The link to a peer broke (the peer died, the socket was reset, a disconnect raced).
    #[error("link to {peer} lost: {cause}")]
    PeerLost {
        /// The peer.
        peer: String,
        /// Why.
        cause: String,
    },
    /// Mutual authentication with a peer failed: a wrong or missing shared secret on either
    /// side, or a peer that could not prove it knows the secret.
    #[error("authentication with {peer} failed: {reason}")]
    AuthFailed {
        /// The peer.
        peer: String,
        /// What did not match, and what to check.
        reason: String,
    },
    /// The peer refused a request with a status.
    #[error("{peer} refused the request: {status}: {message}")]
    Remote {
        /// The peer.
        peer: String,
        /// The status it answered.
        status: Status,
        /// Its explanation.
        message: String,
    },
    /// The peer sent bytes that are not a valid frame.
    #[error("protocol error from {peer}: {reason}")]
    Protocol {
        /// The peer.
        peer: String,
        /// What was wrong.
        reason: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: Arc<std::io::Error>,
    },
    /// A transfer request handle that is unknown or was already reaped.
    #[error("unknown transfer request {req}")]
    UnknownRequest {
        /// The handle.
        req: u64,
    },
    /// The connection to a peer failed with an OS error (a reset, a broken pipe).
    #[error("link to {peer} lost: {what}: {source}")]
    ConnectionLost {
        /// The peer.
        peer: String,
        /// What was being done (`"reading a frame"`, `"fabric channel send"`, ...).
        what: &'static str,
        /// The OS error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A transport below the link (an RDMA queue pair, a copy engine, the fabric channel)
    /// failed; `source` is the transport's own error.
    #[error("link to {peer} lost: {kind}: {source}")]
    Transport {
        /// The peer.
        peer: String,
        /// Which transport, and what failed (`"RDMA work request"`, `"fabric copy"`, ...).
        kind: &'static str,
        /// The transport's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The peer answered no heartbeat for `silent_ms`.
    #[error(
        "link to {peer} lost: no heartbeat answer for {silent_ms} ms ({probes} probes at \
         {interval_ms} ms intervals missed; the peer is dead or the network is cut)"
    )]
    HeartbeatLost {
        /// The peer.
        peer: String,
        /// How long the link was silent, in milliseconds.
        silent_ms: u64,
        /// Probes missed.
        probes: u32,
        /// The probing period in force, in milliseconds: the interval, or the idle period of
        /// a link with nothing in flight.
        interval_ms: u64,
    },
    /// The channel pool closed an idle link to make room.
    #[error(
        "link to {peer} lost: evicted by the channel pool (an idle link, closed to make room; \
         transfers through the engine reconnect)"
    )]
    Evicted {
        /// The peer.
        peer: String,
    },
    /// The peer did not acknowledge a revocation in time, so the link was closed.
    #[error("link to {peer} lost: no acknowledgement of the revocation of rkey {rkey:#x} within {after:?}")]
    RevokeUnacknowledged {
        /// The peer.
        peer: String,
        /// The revoked region's rkey.
        rkey: u64,
        /// How long the target waited.
        after: Duration,
    },
    /// A length over a limit (a buffer, a region, a region name).
    #[error("{what} of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// What is too large (`"host buffer"`, `"region name"`, ...).
        what: &'static str,
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// One op of a transfer needs more RDMA work requests than the send queue holds.
    #[error(
        "a {len}-byte op needs {work_requests} work requests; the send queue holds {capacity}"
    )]
    OpTooLarge {
        /// The op's length.
        len: u64,
        /// Work requests it needs.
        work_requests: u64,
        /// The send queue's depth.
        capacity: usize,
    },
    /// A range is not inside the region it must lie in.
    #[error("range {addr:#x}+{len} is outside region {region_addr:#x}+{region_len}")]
    OutsideRegion {
        /// Start of the range.
        addr: u64,
        /// Its length.
        len: u64,
        /// Start of the region.
        region_addr: u64,
        /// Length of the region.
        region_len: u64,
    },
    /// An offset range past the end of a region (a region's own accessors).
    #[error("range {offset}+{len} is outside a {region_len}-byte region")]
    OffsetOutOfBounds {
        /// Offset into the region.
        offset: u64,
        /// Length of the range (1 for a single address).
        len: u64,
        /// Length of the region.
        region_len: u64,
    },
    /// An access through a region handle after its deregistration.
    #[error("region {addr:#x} was deregistered")]
    Deregistered {
        /// Start of the region.
        addr: u64,
    },
    /// An rkey that names no registered region.
    #[error("rkey {rkey:#x} names no registered region")]
    UnknownRkey {
        /// The rkey.
        rkey: u64,
    },
    /// A negative feature type (HIXL's `GetCapability`).
    #[error("feature type {feature} is negative")]
    InvalidFeature {
        /// The feature as given.
        feature: i32,
    },
    /// A blocking call made from inside a tokio runtime.
    #[error(
        "Hixl::{call} blocks and cannot be called from inside a tokio runtime (it would have \
         to nest block_on); use the async Engine (Hixl::engine) there, or call from a thread \
         outside the runtime"
    )]
    InsideRuntime {
        /// The blocking call.
        call: &'static str,
    },
    /// A call that spawns work made outside a tokio runtime.
    #[error("{what} needs a tokio runtime")]
    NoRuntime {
        /// What needed it (`"auto-connect"`).
        what: &'static str,
    },
    /// A task doing work for a call ended without an answer (it panicked or its runtime
    /// shut down).
    #[error("the {what} task ended: {source}")]
    TaskEnded {
        /// Which task (`"auto-connect"`).
        what: &'static str,
        /// Why it ended.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// A transfer future polled again after it resolved.
    #[error("transfer with {peer} polled after it finished")]
    AlreadyFinished {
        /// The peer.
        peer: String,
    },
    /// A device refused a parameter (an RDMA verb's argument, a QP endpoint, a local range
    /// outside its memory region); `source` is the device layer's error.
    #[error("{what}: {source}")]
    Device {
        /// What was refused.
        what: &'static str,
        /// The device layer's error.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// Another live engine holds the name this engine asked the directory for.
    #[error("the name {name:?} is taken in the directory: held by {holder}")]
    NameTaken {
        /// The name.
        name: String,
        /// Who holds it: its incarnation and addresses.
        holder: String,
    },
    /// No live engine of that name is in the directory.
    #[error("no engine named {name:?} in the directory {directory}")]
    UnknownName {
        /// The name looked up.
        name: String,
        /// The directory (endpoints and prefix).
        directory: String,
    },
    /// The directory (etcd) could not be reached or refused a request, or holds an entry
    /// hixl cannot read.
    #[error("directory {what}: {reason}")]
    Directory {
        /// The directory (endpoints and prefix), and what was being done.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// Any other invalid parameter.
    #[error("invalid parameter: {what}")]
    InvalidParam {
        /// What is invalid.
        what: String,
    },
}

impl Error {
    /// An [`Error::ConnectionLost`]: the connection to `peer` failed with `source` while
    /// doing `what`.
    pub fn connection_lost(peer: &str, what: &'static str, source: std::io::Error) -> Error {
        Error::ConnectionLost {
            peer: peer.to_string(),
            what,
            source: Arc::new(source),
        }
    }

    /// An [`Error::Transport`]: the transport `kind` below the link to `peer` failed.
    pub fn transport(
        peer: &str,
        kind: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Transport {
            peer: peer.to_string(),
            kind,
            source: Arc::new(source),
        }
    }

    /// The error below a [`Error::Transport`], [`Error::Device`] or [`Error::TaskEnded`], as
    /// the layer that failed produced it, to downcast to its type (`hixl_verbs::VerbsError`,
    /// ...). [`std::error::Error::source`] gives the same error behind its `Arc`.
    pub fn layer_source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Error::Transport { source, .. }
            | Error::Device { source, .. }
            | Error::TaskEnded { source, .. } => Some(&**source),
            _ => None,
        }
    }

    /// Wraps an OS error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }

    /// Checks a HIXL-style millisecond timeout (`> 0`) and converts it.
    ///
    /// # Errors
    /// [`Error::InvalidTimeout`] for zero or negative values.
    pub fn check_timeout_ms(millis: i64) -> Result<Duration> {
        if millis <= 0 {
            return Err(Error::InvalidTimeout { millis });
        }
        Ok(Duration::from_millis(millis as u64))
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
