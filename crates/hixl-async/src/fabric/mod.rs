//! The engine's side of the same-host fabric backend: its pool, copy engine and identity, the
//! fabric channel that exports memfds to same-host initiators, and the initiator's view of a
//! peer reached over the fabric.

pub(crate) mod chan;
pub(crate) mod channel;
pub(crate) mod client;
pub(crate) mod connect;
pub(crate) mod server;

use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;
use std::time::Duration;

use hixl_core::options::TransportChoice;
use hixl_core::{Error, Options, Result};
use hixl_fabric::{CopyEngine, FabricPool, HostIdentity};

/// Copy-engine submission ring size: HIXL answers RESOURCE_EXHAUSTED past its stream
/// resources; so do we, past this many queued parts.
const RING: usize = 1 << 16;

/// What an engine with the fabric backend owns.
pub(crate) struct FabricBackend {
    pub(crate) pool: FabricPool,
    pub(crate) copy: Arc<CopyEngine>,
    /// The engine's op table, which holds the memory of the copies the copy engine runs
    /// (`rawio::PartRange`): declared after `copy`, so that when the backend goes, its streams
    /// are joined (each finishes the copy it runs) before the op table can go. (`copy` is not
    /// shared beyond the backend.)
    _ops: crate::keep::SharedOps,
    pub(crate) identity: HostIdentity,
    /// Abstract Unix socket name of this engine's fabric channel.
    pub(crate) socket: String,
    /// `EnableUseFabricMem=1`: map peers' buffers at their own addresses.
    pub(crate) unified: bool,
    /// `hixl.Transport=fabric`: refuse peers the fabric cannot reach instead of using TCP.
    pub(crate) forced: bool,
}

impl std::fmt::Debug for FabricBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricBackend")
            .field("socket", &self.socket)
            .field("unified", &self.unified)
            .field("streams", &self.copy.streams())
            .finish_non_exhaustive()
    }
}

impl FabricBackend {
    /// The backend the options ask for, or `None` with `hixl.Transport=tcp` or `verbs`.
    pub(crate) fn new(
        options: &Options,
        instance: u64,
        ops: &crate::keep::SharedOps,
    ) -> Result<Option<FabricBackend>> {
        if matches!(
            options.transport,
            TransportChoice::Tcp | TransportChoice::Verbs
        ) {
            return Ok(None);
        }
        let fm = &options.global.fabric_memory;
        let capacity = u64::from(fm.max_capacity_tb) << 40;
        let unified = options.enable_use_fabric_mem;
        let window =
            (unified && fm.start_address_tb > 0).then(|| u64::from(fm.start_address_tb) << 40);
        let pool = FabricPool::new(capacity, window)?;
        let busy = Duration::from_micros(options.fabric_busy_poll_us);
        let copy = CopyEngine::with_ring_capacity(fm.task_stream_num as usize, busy, RING)
            .map_err(|e| Error::io("starting fabric copy engines", e))?;
        let identity =
            HostIdentity::current().map_err(|e| Error::io("reading host identity", e))?;
        // Peers of our uid may attach to us (Yama ptrace_scope 1 admits only ancestors): a
        // peer that maps our fabric memory is trusted with it already.
        if let Err(e) = hixl_fabric::permit_cma_from(None) {
            tracing::info!("cannot allow cross-memory attach from peers: {e}");
        }
        Ok(Some(FabricBackend {
            pool,
            copy: Arc::new(copy),
            _ops: ops.clone(),
            identity,
            socket: format!("hixl-fabric-{}-{instance:016x}", std::process::id()),
            unified,
            forced: options.transport == TransportChoice::Fabric,
        }))
    }

    /// Binds the fabric channel's listening socket.
    pub(crate) fn listen(&self) -> Result<tokio::net::UnixListener> {
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(self.socket.as_bytes())
            .map_err(|e| Error::io("naming the fabric socket", e))?;
        let l = std::os::unix::net::UnixListener::bind_addr(&addr)
            .map_err(|e| Error::io(format!("binding fabric socket @{}", self.socket), e))?;
        l.set_nonblocking(true)
            .map_err(|e| Error::io("fabric socket", e))?;
        tokio::net::UnixListener::from_std(l).map_err(|e| Error::io("fabric socket", e))
    }
}

/// Connects to a peer's fabric channel by its abstract name.
pub(crate) fn connect(socket: &str) -> std::io::Result<tokio::net::UnixStream> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(socket.as_bytes())?;
    let s = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    s.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(s)
}
