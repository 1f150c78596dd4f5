//! Reliable-connected queue pairs: creation on a protection domain and completion queue, the
//! RESET → INIT → RTR → RTS transitions from a peer's [`QpEndpoint`], and the QP's state.
//! Posting lives in `post.rs`.

use std::fmt;

use hixl_core::{Access, Options};

use crate::attr::{LinkLayer, Mtu, PortInfo};
use crate::cq::{destroy_qp, Cq};
use crate::endpoint::QpEndpoint;
use crate::error::{Result, VerbsError};
use crate::mr::{access_flags, ProtectionDomain};
use crate::send_queue::SendQueue;
use crate::sys;

/// How a QP is created and connected. `Default` matches HIXL's defaults (traffic class 132,
/// service level 4) with a 7-retry, ~67 ms transport timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// Port number (from 1).
    pub port: u8,
    /// Source GID index; `None` picks the port's first RoCE v2 GID, else its first GID.
    pub gid_index: Option<u8>,
    /// Send queue depth: work requests (after splitting) outstanding at once.
    pub max_send_wr: u32,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout per try (1..=31; 0 means "wait
    /// forever" in the verbs spec and is refused here).
    pub timeout: u8,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR` (0..=7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (0..=7, 7 = forever); one-sided ops never need receives.
    pub rnr_retry: u8,
    /// GRH traffic class (HIXL option `RdmaTrafficClass`; DSCP × 4 on RoCE v2).
    pub traffic_class: u8,
    /// Service level (HIXL option `RdmaServiceLevel`; 0..=15).
    pub service_level: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// RDMA READs in flight per direction (clamped to the device's limits).
    pub max_rd_atomic: u8,
    /// What the peer may do to this side's memory through this QP.
    pub remote_access: Access,
    /// Split ops above this many bytes (`None`: the port's `max_msg_sz`; a larger value is
    /// clamped to it).
    pub max_message_size: Option<u32>,
    /// Signal every Nth work request of a chain as well as its last one (0: only the last).
    pub signal_every: u32,
    /// Initial send PSN (`None`: random).
    pub psn: Option<u32>,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            port: 1,
            gid_index: None,
            max_send_wr: 1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            traffic_class: 132,
            service_level: 4,
            hop_limit: 64,
            max_rd_atomic: 16,
            remote_access: Access::REMOTE_RW,
            max_message_size: None,
            signal_every: 0,
            psn: None,
        }
    }
}

impl QpConfig {
    /// The defaults with the engine's options applied: `RdmaTrafficClass`,
    /// `RdmaServiceLevel`, `hixl.VerbsPort`, `hixl.VerbsGidIndex`, `hixl.VerbsTimeout` and
    /// `hixl.VerbsRetryCount`.
    pub fn from_options(o: &Options) -> QpConfig {
        QpConfig {
            traffic_class: o.rdma_traffic_class,
            service_level: o.rdma_service_level,
            port: o.verbs_port,
            gid_index: o.verbs_gid_index,
            timeout: o.verbs_timeout,
            retry_cnt: o.verbs_retry_count,
            ..QpConfig::default()
        }
    }

    fn validate(&self, max_qp_wr: u32) -> Result<()> {
        let bad = |what, reason: String| Err(VerbsError::Invalid { what, reason });
        if self.max_send_wr == 0 || self.max_send_wr > max_qp_wr {
            return bad(
                "max_send_wr",
                format!("{} is not in 1..={max_qp_wr}", self.max_send_wr),
            );
        }
        if self.timeout == 0 || self.timeout > 31 {
            return bad("timeout", format!("{} is not in 1..=31", self.timeout));
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return bad(
                "retry_cnt/rnr_retry",
                format!("{}/{} exceed 7", self.retry_cnt, self.rnr_retry),
            );
        }
        if self.service_level > 15 {
            return bad(
                "service_level",
                format!("{} exceeds 15", self.service_level),
            );
        }
        if self.psn.is_some_and(|p| p > 0xff_ffff) {
            return bad("psn", "wider than 24 bits".into());
        }
        Ok(())
    }
}

/// Queue pair state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created, or reset.
    Reset,
    /// Initialised: port and access set.
    Init,
    /// Ready to receive: connected to the peer.
    ReadyToReceive,
    /// Ready to send: work requests may be posted.
    ReadyToSend,
    /// Send queue drained.
    SendQueueDrained,
    /// Send queue error (not used by RC).
    SendQueueError,
    /// Error: a work request failed (or the QP was failed by hand); everything posted is
    /// flushed. The QP must be destroyed (or reset) and connected again.
    Error,
    /// A code this build does not know.
    Other(u32),
}

impl QpState {
    fn from_code(c: u32) -> QpState {
        use sys::ibv_qp_state as s;
        match c {
            s::IBV_QPS_RESET => QpState::Reset,
            s::IBV_QPS_INIT => QpState::Init,
            s::IBV_QPS_RTR => QpState::ReadyToReceive,
            s::IBV_QPS_RTS => QpState::ReadyToSend,
            s::IBV_QPS_SQD => QpState::SendQueueDrained,
            s::IBV_QPS_SQE => QpState::SendQueueError,
            s::IBV_QPS_ERR => QpState::Error,
            c => QpState::Other(c),
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QpState::Reset => f.write_str("RESET"),
            QpState::Init => f.write_str("INIT"),
            QpState::ReadyToReceive => f.write_str("RTR"),
            QpState::ReadyToSend => f.write_str("RTS"),
            QpState::SendQueueDrained => f.write_str("SQD"),
            QpState::SendQueueError => f.write_str("SQE"),
            QpState::Error => f.write_str("ERR"),
            QpState::Other(c) => write!(f, "state {c}"),
        }
    }
}

/// A reliable-connected queue pair (`ibv_qp`, `IBV_QPT_RC`) for one-sided RDMA WRITE/READ.
///
/// Methods that change the QP or post to it take `&mut self`: one poster per QP is enforced by
/// the borrow checker, which is what lets [`QueuePair::post_chain`] reuse its scratch arrays
/// and keep the send-queue shadow in posting order without a lock around the doorbell.
///
/// Dropping a QP with work still outstanding moves it to the error state and parks it in its
/// completion queue until the flushed completions have been drained, so every posted op still
/// gets its one completion.
pub struct QueuePair {
    pub(crate) qp: *mut sys::ibv_qp,
    pub(crate) qpn: u32,
    pub(crate) cq: Cq,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cfg: QpConfig,
    port: PortInfo,
    gid: [u8; 16],
    gid_index: u8,
    psn: u32,
    pub(crate) max_msg: u32,
    pub(crate) wrs: Vec<sys::ibv_send_wr>,
    pub(crate) sges: Vec<sys::ibv_sge>,
}

// SAFETY: the QP is a kernel handle whose verbs are thread-safe; the scratch arrays hold raw
// pointers only between filling and ibv_post_send inside one &mut call.
unsafe impl Send for QueuePair {}
// SAFETY: &QueuePair methods only query (ibv_query_qp) or read immutable fields.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &format_args!("{:#x}", self.qpn))
            .field("device", &self.pd.context().name())
            .field("port", &self.port.port)
            .field("gid_index", &self.gid_index)
            .finish()
    }
}

fn modify(
    qp: *mut sys::ibv_qp,
    attr: &mut sys::ibv_qp_attr,
    mask: u32,
    what: &'static str,
    dev: &str,
) -> Result<()> {
    // SAFETY: qp is live (owned by the caller's QueuePair); attr is a valid ibv_qp_attr whose
    // fields named by mask are set.
    let rc = unsafe { sys::ibv_modify_qp(qp, attr, mask as libc::c_int) };
    if rc != 0 {
        return Err(VerbsError::verb(what, dev, sys::error_from_rc(rc)));
    }
    Ok(())
}

fn zeroed_attr() -> sys::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain data (integers and nested structs of integers/arrays); all
    // zero is a valid value.
    unsafe { std::mem::zeroed() }
}

impl QueuePair {
    /// Creates an RC QP in the RESET state, reserving `max_send_wr + 1` entries of `cq` (given
    /// back when the QP is destroyed).
    ///
    /// # Errors
    /// [`VerbsError::Invalid`] for a bad config, a port without an active MTU or (on Ethernet)
    /// without a GID; [`VerbsError::CompletionQueueFull`]; the errno of `ibv_create_qp`.
    pub fn new(pd: &ProtectionDomain, cq: &Cq, cfg: QpConfig) -> Result<QueuePair> {
        let ctx = pd.context();
        cfg.validate(ctx.limits().max_qp_wr)?;
        let port = ctx.port(cfg.port)?;
        let max_msg = cfg
            .max_message_size
            .map_or(port.max_msg_size, |m| m.min(port.max_msg_size));
        if max_msg == 0 || port.active_mtu.is_none() {
            return Err(VerbsError::Invalid {
                what: "port",
                reason: format!(
                    "port {} of {} has no usable MTU/message size",
                    cfg.port,
                    ctx.name()
                ),
            });
        }
        let gid_index = cfg.gid_index.or_else(|| port.default_gid_index());
        let gid = gid_index
            .and_then(|i| port.gids.iter().find(|g| g.index == i))
            .map(|g| g.gid);
        let (gid_index, gid) = match (gid_index, gid) {
            (Some(i), Some(g)) => (i, g),
            _ if port.link_layer != LinkLayer::Ethernet => (0, [0; 16]),
            _ => {
                return Err(VerbsError::Invalid {
                    what: "gid_index",
                    reason: format!(
                        "port {} of {} has no GID {:?} (RoCE needs one; populated: {:?})",
                        cfg.port,
                        ctx.name(),
                        cfg.gid_index,
                        port.gids.iter().map(|g| g.index).collect::<Vec<_>>()
                    ),
                })
            }
        };
        let reserve = cfg.max_send_wr + 1;
        cq.reserve(reserve)?;
        // SAFETY: ibv_qp_init_attr is plain data; zero is valid (null pointers, no SRQ).
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.raw();
        init.recv_cq = cq.raw();
        init.cap.max_send_wr = cfg.max_send_wr;
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: pd and cq are live and belong to the same context; init is fully set.
        let qp = unsafe { sys::ibv_create_qp(pd.raw(), &mut init) };
        if qp.is_null() {
            let e = sys::last_error();
            cq.unreserve(reserve);
            return Err(VerbsError::verb("ibv_create_qp", ctx.name(), e));
        }
        // SAFETY: non-null result of ibv_create_qp.
        let qpn = unsafe { (*qp).qp_num };
        let psn = cfg.psn.unwrap_or_else(random_psn);
        cq.attach(qpn, SendQueue::new(qpn, cfg.max_send_wr as usize), reserve);
        tracing::debug!(
            qpn,
            device = ctx.name(),
            gid_index,
            max_msg,
            "created RC QP"
        );
        Ok(QueuePair {
            qp,
            qpn,
            cq: cq.clone(),
            pd: pd.clone(),
            port,
            gid,
            gid_index,
            psn,
            max_msg,
            cfg,
            wrs: Vec::new(),
            sges: Vec::new(),
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Largest work request; [`QueuePair::post_chain`] splits longer ops.
    pub fn max_message_size(&self) -> u32 {
        self.max_msg
    }

    /// Names the peer in the errors this QP's completions produce.
    pub fn set_peer_name(&mut self, peer: &str) {
        if let Some(a) = self.cq.lock().queues.get_mut(&self.qpn) {
            a.sq.set_peer(peer);
        }
    }

    /// Work requests posted and not yet accounted for by a drained completion.
    pub fn outstanding(&self) -> usize {
        self.cq
            .lock()
            .queues
            .get(&self.qpn)
            .map_or(0, |a| a.sq.outstanding())
    }

    /// The first failure a completion reported on this QP, if any.
    pub fn failure(&self) -> Option<String> {
        self.cq
            .lock()
            .queues
            .get(&self.qpn)
            .and_then(|a| a.sq.failure().map(str::to_owned))
    }

    /// What the peer needs to connect to this QP.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qpn: self.qpn,
            psn: self.psn,
            gid: self.gid,
            lid: self.port.lid,
            gid_index: self.gid_index,
            mtu: self.port.active_mtu.unwrap_or(Mtu::M1024),
        }
    }

    /// RESET → INIT: binds the port and grants the configured remote access.
    ///
    /// # Errors
    /// The errno of `ibv_modify_qp`.
    pub fn to_init(&mut self) -> Result<()> {
        let mut a = zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.cfg.port;
        a.qp_access_flags = access_flags(self.cfg.remote_access);
        use sys::ibv_qp_attr_mask as m;
        let mask = m::IBV_QP_STATE.0
            | m::IBV_QP_PKEY_INDEX.0
            | m::IBV_QP_PORT.0
            | m::IBV_QP_ACCESS_FLAGS.0;
        modify(
            self.qp,
            &mut a,
            mask,
            "ibv_modify_qp(INIT)",
            self.pd.context().name(),
        )
    }

    /// INIT → RTR against the peer's endpoint: path MTU (the smaller of both), GRH with the
    /// peer's GID, traffic class and hop limit, service level, the peer's QPN and PSN.
    ///
    /// # Errors
    /// The errno of `ibv_modify_qp` (`EINVAL` for an unreachable GID or a bad GID index).
    pub fn to_rtr(&mut self, remote: &QpEndpoint) -> Result<()> {
        let local_mtu = self.port.active_mtu.unwrap_or(Mtu::M1024);
        let lim = self.pd.context().limits();
        let mut a = zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = local_mtu.min(remote.mtu).code();
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = clamp_rd(self.cfg.max_rd_atomic, lim.max_qp_rd_atom);
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = self.cfg.service_level;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = self.cfg.port;
        if remote.gid != [0; 16] || self.port.link_layer == LinkLayer::Ethernet {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = self.gid_index;
            a.ah_attr.grh.hop_limit = self.cfg.hop_limit;
            a.ah_attr.grh.traffic_class = self.cfg.traffic_class;
        }
        use sys::ibv_qp_attr_mask as m;
        let mask = m::IBV_QP_STATE.0
            | m::IBV_QP_AV.0
            | m::IBV_QP_PATH_MTU.0
            | m::IBV_QP_DEST_QPN.0
            | m::IBV_QP_RQ_PSN.0
            | m::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | m::IBV_QP_MIN_RNR_TIMER.0;
        modify(
            self.qp,
            &mut a,
            mask,
            "ibv_modify_qp(RTR)",
            self.pd.context().name(),
        )
    }

    /// RTR → RTS: ACK timeout, retry counts, this side's PSN, READs in flight.
    ///
    /// # Errors
    /// The errno of `ibv_modify_qp`.
    pub fn to_rts(&mut self) -> Result<()> {
        let lim = self.pd.context().limits();
        let mut a = zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.timeout = self.cfg.timeout;
        a.retry_cnt = self.cfg.retry_cnt;
        a.rnr_retry = self.cfg.rnr_retry;
        a.sq_psn = self.psn;
        a.max_rd_atomic = clamp_rd(self.cfg.max_rd_atomic, lim.max_qp_init_rd_atom);
        use sys::ibv_qp_attr_mask as m;
        let mask = m::IBV_QP_STATE.0
            | m::IBV_QP_TIMEOUT.0
            | m::IBV_QP_RETRY_CNT.0
            | m::IBV_QP_RNR_RETRY.0
            | m::IBV_QP_SQ_PSN.0
            | m::IBV_QP_MAX_QP_RD_ATOMIC.0;
        modify(
            self.qp,
            &mut a,
            mask,
            "ibv_modify_qp(RTS)",
            self.pd.context().name(),
        )
    }

    /// [`QueuePair::to_init`], [`QueuePair::to_rtr`] and [`QueuePair::to_rts`] in one go.
    ///
    /// # Errors
    /// As the three steps.
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<()> {
        self.to_init()?;
        self.to_rtr(remote)?;
        self.to_rts()
    }

    /// Moves the QP to the error state: everything outstanding completes flushed.
    ///
    /// # Errors
    /// The errno of `ibv_modify_qp`.
    pub fn set_error(&mut self) -> Result<()> {
        let mut a = zeroed_attr();
        a.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        let mask = sys::ibv_qp_attr_mask::IBV_QP_STATE.0;
        modify(
            self.qp,
            &mut a,
            mask,
            "ibv_modify_qp(ERR)",
            self.pd.context().name(),
        )
    }

    /// The QP's current state as the device reports it (`ibv_query_qp`).
    ///
    /// # Errors
    /// The errno of `ibv_query_qp`.
    pub fn state(&self) -> Result<QpState> {
        let mut a = zeroed_attr();
        // SAFETY: plain data; zero is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live; a and init are valid out-pointers.
        let rc = unsafe {
            sys::ibv_query_qp(
                self.qp,
                &mut a,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(VerbsError::verb(
                "ibv_query_qp",
                self.pd.context().name(),
                sys::error_from_rc(rc),
            ));
        }
        Ok(QpState::from_code(a.qp_state))
    }
}

fn clamp_rd(want: u8, device_max: u32) -> u8 {
    want.clamp(1, u8::try_from(device_max.max(1)).unwrap_or(u8::MAX))
}

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::getrandom(&mut b).is_err() {
        // Any PSN works; randomness only guards against stale packets of an earlier QP.
        return 0x1234;
    }
    u32::from_le_bytes(b) & 0xff_ffff
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if self.outstanding() > 0 {
            // Flush what is outstanding so that its completions arrive and the drain can
            // destroy the parked QP; the device stops touching the memory on the flush.
            if let Err(e) = self.set_error() {
                tracing::warn!(qpn = self.qpn, "dropping a QP with work outstanding: {e}");
            }
        }
        if self.cq.detach_or_park(self.qpn, self.qp, &self.pd) {
            destroy_qp(self.qp, self.qpn);
        }
    }
}
