//! The engine's side of the RDMA verbs backend: its devices (each with a protection domain and
//! a completion queue), memory regions on every device for registered memory, and the links to
//! peers reached over verbs, each striped over rails.
//!
//! **Rails.** A link holds one rail per pair of our device and the peer's that can reach each
//! other ([`hixl_verbs::pair`]: same subnet; by position when no device shares one), each with
//! `hixl.VerbsQpsPerRail` RC queue pairs. A descriptor longer than `hixl.VerbsSliceBytes` is
//! cut into slices; every slice goes to the queue pair with the fewest bytes outstanding among
//! the rails that are up (those on the NUMA node of the local memory first, when the host
//! says), so small ops land on one rail and large ones on all of them ([`stripe`]).
//!
//! **Leases.** A work request names local memory by lkey; the device touches it until the
//! request's completion is polled. Each slice is one part of its op, and the op table holds
//! the lease on the op's local regions until its last part has been drained, whether the
//! transfer's future is still waiting, was dropped or timed out. Remote memory needs no
//! lease: the peer's device refuses a request once the region's memory region is deregistered.
//!
//! **Failure.** A queue pair whose work request failed is in the error state, and so is its
//! rail: the rail is paused ([`health`]), its queue pairs are dropped (what they had
//! outstanding comes back flushed), and every slice it held, queued or in flight, is placed on
//! the remaining rails. The link's keeper ([`keeper`]) pauses a rail whose port goes down and
//! probes paused rails back. A slice fails only when no rail is left (the error names each
//! rail and what happened to it) or when the device refused the op itself (a remote access
//! error); a slice of an op whose owner went away is never placed again.

pub(crate) mod channel;
pub(crate) mod connect;
pub(crate) mod health;
pub(crate) mod keeper;
pub(crate) mod link;
pub(crate) mod rail;
pub(crate) mod source;
pub(crate) mod stripe;
pub(crate) mod target;

use std::sync::Arc;

use hixl_core::options::TransportChoice;
use hixl_core::{Error, Options, Result};
use hixl_verbs::{
    Context, Cq, Device, MemoryRegion, NicInfo, PortState, ProtectionDomain, QpConfig, QpEndpoint,
    QueuePair,
};

use self::source::VerbsSource;

/// Send-queue room per rail, shared by its queue pairs (clamped to the device's `max_qp_wr`).
const SEND_QUEUE: u32 = 2048;
/// Completion-queue entries per device (clamped to the device's `max_cqe`).
const CQ_ENTRIES: u32 = 1 << 17;

/// One device the engine uses.
pub(crate) struct Nic {
    pub(crate) ctx: Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: Cq,
    /// What the peers are told of it.
    pub(crate) info: NicInfo,
    /// Config of initiator QPs on it.
    pub(crate) cfg: QpConfig,
}

impl Nic {
    fn open(name: &str, o: &Options, qps_per_rail: u32) -> hixl_verbs::Result<Nic> {
        let ctx = Context::open(name)?;
        let limits = ctx.limits();
        let pd = ProtectionDomain::new(&ctx)?;
        let cq = Cq::new(&ctx, CQ_ENTRIES.min(limits.max_cqe))?;
        let mut cfg = QpConfig::from_options(o);
        cfg.max_send_wr = (SEND_QUEUE / qps_per_rail).max(64).min(limits.max_qp_wr);
        // Fail at build, not at the first connect, for a port without an active MTU or a
        // GID index the port does not have; its endpoint says what the peers are told.
        let probe = QueuePair::new(&pd, &cq, target_config(&cfg))?;
        let ep = probe.endpoint();
        drop(probe);
        Ok(Nic {
            info: NicInfo::probe(ctx.name(), ep.gid, ep.mtu),
            ctx,
            pd,
            cq,
            cfg,
        })
    }

    /// Whether the port the QPs use is active (an error counts as not).
    pub(crate) fn port_up(&self) -> std::result::Result<(), String> {
        match self.ctx.port_state(self.cfg.port) {
            Ok(PortState::Active) => Ok(()),
            Ok(s) => Err(format!(
                "port {} of {} is {s}",
                self.cfg.port, self.info.name
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// An initiator QP (RESET state until connected).
    pub(crate) fn initiator_qp(&self, peer: &str) -> Result<QueuePair> {
        let mut qp = QueuePair::new(&self.pd, &self.cq, self.cfg.clone())?;
        qp.set_peer_name(peer);
        Ok(qp)
    }

    /// A target QP connected to the initiator's `remote`.
    pub(crate) fn accept(&self, peer: &str, remote: &QpEndpoint) -> Result<QueuePair> {
        let mut qp = QueuePair::new(&self.pd, &self.cq, target_config(&self.cfg))?;
        qp.set_peer_name(peer);
        qp.connect(remote)?;
        Ok(qp)
    }
}

/// What an engine with the verbs backend owns.
pub(crate) struct VerbsBackend {
    pub(crate) nics: Vec<Nic>,
    pub(crate) source: Arc<VerbsSource>,
    /// `hixl.Transport=verbs`: refuse peers verbs cannot reach instead of using TCP.
    pub(crate) forced: bool,
    /// `hixl.VerbsQpsPerRail`.
    pub(crate) qps_per_rail: usize,
    /// `hixl.VerbsSliceBytes`.
    pub(crate) slice_bytes: u64,
}

impl std::fmt::Debug for VerbsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsBackend")
            .field("devices", &self.names())
            .field("forced", &self.forced)
            .finish_non_exhaustive()
    }
}

impl VerbsBackend {
    /// The backend the options ask for. `Ok((None, why))` when verbs is not wanted or (with
    /// `auto`) no device is usable; an error only when `hixl.Transport=verbs` cannot be met.
    pub(crate) fn new(o: &Options) -> Result<(Option<VerbsBackend>, String)> {
        match o.transport {
            TransportChoice::Tcp | TransportChoice::Fabric => {
                return Ok((None, format!("hixl.Transport={}", o.transport.as_str())))
            }
            TransportChoice::Auto | TransportChoice::Verbs => {}
        }
        let forced = o.transport == TransportChoice::Verbs;
        match Self::open(o, forced) {
            Ok(b) => {
                let why = format!("devices {}", b.names());
                Ok((Some(b), why))
            }
            Err(e) if forced => Err(Error::Unsupported {
                what: format!("hixl.Transport=verbs, but no RDMA device is usable: {e}"),
            }),
            Err(e) => {
                tracing::debug!("verbs backend off: {e}");
                Ok((None, e.to_string()))
            }
        }
    }

    fn open(o: &Options, forced: bool) -> hixl_verbs::Result<VerbsBackend> {
        let k = u32::from(o.verbs_qps_per_rail.max(1));
        let nics = if o.verbs_devices.is_empty() {
            // Every device with an active port; one that fails to open is logged and skipped.
            let mut v = Vec::new();
            let mut skipped = Vec::new();
            for d in Device::list()? {
                match d.query() {
                    Ok(i) if i.active_port().is_some() => match Nic::open(d.name(), o, k) {
                        Ok(n) => v.push(n),
                        Err(e) => skipped.push(format!("{}: {e}", d.name())),
                    },
                    Ok(_) => skipped.push(format!("{}: no active port", d.name())),
                    Err(e) => skipped.push(format!("{}: {e}", d.name())),
                }
            }
            if v.is_empty() {
                return Err(hixl_verbs::VerbsError::NoActiveDevice {
                    available: skipped.join("; "),
                });
            }
            if !skipped.is_empty() {
                tracing::info!("RDMA devices not used: {}", skipped.join("; "));
            }
            v
        } else {
            // Named devices: each must work.
            o.verbs_devices
                .iter()
                .map(|d| Nic::open(d, o, k))
                .collect::<hixl_verbs::Result<Vec<_>>>()?
        };
        let source = VerbsSource::new(nics.iter().map(|n| n.cq.clone()).collect())?;
        Ok(VerbsBackend {
            nics,
            source: Arc::new(source),
            forced,
            qps_per_rail: k as usize,
            slice_bytes: o.verbs_slice_bytes.max(4096),
        })
    }

    /// The devices' names, comma-separated.
    pub(crate) fn names(&self) -> String {
        let v: Vec<&str> = self.nics.iter().map(|n| n.info.name.as_str()).collect();
        v.join(",")
    }

    /// What the peers are told of our devices.
    pub(crate) fn infos(&self) -> Vec<NicInfo> {
        self.nics.iter().map(|n| n.info.clone()).collect()
    }

    /// Registers `[addr, addr+len)` with every device: one memory region each, in device order.
    ///
    /// # Safety
    /// The memory stays mapped until the returned regions are dropped and every work request
    /// naming them has completed (the engine drops them in deregistration, after its leases).
    pub(crate) unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        access: hixl_core::Access,
    ) -> Result<Vec<MemoryRegion>> {
        let len = usize::try_from(len).map_err(|_| Error::TooLarge {
            what: "region",
            len,
            max: usize::MAX as u64,
        })?;
        self.nics
            .iter()
            .map(|n| {
                // SAFETY: this function's contract.
                unsafe { MemoryRegion::register(&n.pd, addr as *mut u8, len, access) }
                    .map_err(Error::from)
            })
            .collect()
    }
}

/// Targets post nothing on their QPs: one send-queue slot, so that many initiators fit in
/// the completion queue.
fn target_config(cfg: &QpConfig) -> QpConfig {
    QpConfig {
        max_send_wr: 1,
        ..cfg.clone()
    }
}

/// The NUMA node of the page at `addr` (`get_mempolicy` with `MPOL_F_NODE | MPOL_F_ADDR`),
/// or `None` when the kernel does not say.
pub(crate) fn numa_of(addr: u64) -> Option<u32> {
    const MPOL_F_NODE: libc::c_ulong = 1;
    const MPOL_F_ADDR: libc::c_ulong = 2;
    let mut node: libc::c_int = -1;
    // SAFETY: node is a valid out-pointer; no node mask is asked for (null, 0); the kernel
    // only looks up the page at addr (faulting it in if it was never touched) and writes node.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr as *mut libc::c_void,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    (rc == 0)
        .then_some(node)
        .and_then(|n| u32::try_from(n).ok())
}
