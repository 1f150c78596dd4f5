//! Verbs as a [`Transport`]: when both engines have an active RDMA device, an RC queue pair is
//! connected over the control connection during the handshake — `VerbsConnect` with our
//! endpoint, the peer's device keys (`VerbsKeys`), then `VerbsAccept` with its endpoint.

use std::collections::HashMap;
use std::sync::Arc;

use hixl_core::wire::Message;
use hixl_core::{RegionTable, Result};

use super::channel::VerbsChannel;
use super::{Connected, VerbsBackend, VerbsLink};
use crate::frame_io::unexpected;
use crate::memory::{DeviceMr, RegionInner};
use crate::transport::target::{Session, TargetCx};
use crate::transport::{BoxFuture, Declined, Negotiation, Opened, Transport, TransportKind};

/// The engine's verbs transport: its backend, or why it has none.
#[derive(Debug)]
pub(crate) struct VerbsTransport {
    pub(crate) backend: Option<Arc<VerbsBackend>>,
    pub(crate) why: String,
    /// The target's end of each session's queue pair.
    pub(crate) qps: super::target::Qps,
}

impl Transport for VerbsTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Verbs
    }

    fn forced(&self) -> bool {
        self.backend.as_ref().is_some_and(|b| b.forced)
    }

    fn connect<'a>(
        &'a self,
        cx: &'a mut Negotiation<'_>,
    ) -> BoxFuture<'a, Result<std::result::Result<Opened, Declined>>> {
        // A peer verbs cannot serve is declined without boxing the opening's future.
        match self.eligible(cx) {
            Ok((backend, peer_device)) => Box::pin(self.open(backend, peer_device, cx)),
            Err(why) => Box::pin(std::future::ready(Ok(Err(why)))),
        }
    }

    fn completions(&self) -> Option<Arc<dyn hixl_core::CompletionSource>> {
        let s: Arc<dyn hixl_core::CompletionSource> = self.backend.as_ref()?.source.clone();
        Some(s)
    }

    fn device(&self) -> Option<std::result::Result<String, String>> {
        Some(match &self.backend {
            Some(v) => Ok(v.device.clone()),
            None => Err(self.why.clone()),
        })
    }

    /// A failure is an error with `hixl.Transport=verbs`; with `auto` the region is served over
    /// the other transports (and the failure is logged).
    unsafe fn register(
        &self,
        desc: hixl_core::MemDesc,
        access: hixl_core::Access,
    ) -> Result<Option<DeviceMr>> {
        let Some(v) = &self.backend else {
            return Ok(None);
        };
        if desc.addr == 0 || desc.len == 0 {
            return Ok(None); // refused by the region table with its own error
        }
        // SAFETY: this function's contract: the memory stays valid until the registration is
        // dropped (deregistration drops it after the region's leases are gone and before the
        // memory is handed back; a dropped region drops it before its owned memory).
        match unsafe { v.register(desc.addr, desc.len, access) } {
            Ok(mr) => {
                let keys = (mr.lkey(), mr.rkey());
                Ok(Some(DeviceMr {
                    _keep: Box::new(mr),
                    keys,
                }))
            }
            Err(e) if v.forced => Err(e),
            Err(e) => {
                tracing::warn!(
                    "registering {:#x}+{} with {}: {e}; its transfers use another transport",
                    desc.addr,
                    desc.len,
                    v.device
                );
                Ok(None)
            }
        }
    }

    fn offer(&self) -> Option<Message> {
        let v = self.backend.as_ref()?;
        Some(Message::VerbsInfo {
            device: v.device.clone(),
        })
    }

    fn on_control(&self, cx: &TargetCx, sess: &Session, m: &Message) -> bool {
        match m {
            Message::VerbsConnect { endpoint } => {
                super::target::accept(self.backend.as_deref(), &self.qps, cx, sess, endpoint);
                true
            }
            _ => false,
        }
    }

    fn before_table(
        &self,
        sess: &Session,
        regions: &RegionTable<Arc<RegionInner>>,
    ) -> Option<Message> {
        self.qps
            .contains(sess.id)
            .then(|| Message::VerbsKeys(super::target::device_keys(regions)))
    }

    fn serves(&self, id: u64) -> bool {
        self.qps.contains(id)
    }
}

impl VerbsTransport {
    /// The backend and the device the peer offers, or why verbs cannot serve the peer.
    fn eligible(
        &self,
        cx: &Negotiation<'_>,
    ) -> std::result::Result<(&Arc<VerbsBackend>, String), Declined> {
        let Some(backend) = &self.backend else {
            return Err(Declined::NoDevice(self.why.clone()));
        };
        let peer_device = cx
            .offers
            .iter()
            .find_map(|m| match m {
                Message::VerbsInfo { device } => Some(device.clone()),
                _ => None,
            })
            .ok_or(Declined::PeerLacks(TransportKind::Verbs))?;
        Ok((backend, peer_device))
    }

    async fn open(
        &self,
        backend: &Arc<VerbsBackend>,
        peer_device: String,
        cx: &mut Negotiation<'_>,
    ) -> Result<std::result::Result<Opened, Declined>> {
        let name = cx.peer;
        let mut qp = match backend.initiator_qp(name) {
            Ok(q) => q,
            Err(e) => return Ok(Err(Declined::Setup(format!("creating a queue pair: {e}")))),
        };
        let connect = Message::VerbsConnect {
            endpoint: qp.endpoint().to_bytes().to_vec(),
        };
        cx.control.send(connect).await?;
        let mut keys = HashMap::new();
        let remote = loop {
            match cx.control.recv().await? {
                Message::VerbsKeys(v) => keys.extend(v),
                Message::VerbsAccept {
                    status: 0,
                    endpoint,
                    ..
                } => break hixl_verbs::QpEndpoint::from_bytes(&endpoint)?,
                Message::VerbsAccept { reason, .. } => return Ok(Err(Declined::Refused(reason))),
                m => return Err(unexpected(name, &m, "verbs accept")),
            }
        };
        if let Err(e) = qp.connect(&remote) {
            // The peer's QP is connected to ours; it is dropped with the session.
            return Ok(Err(Declined::Setup(format!(
                "connecting the queue pair: {e}"
            ))));
        }
        let c = Connected {
            qp,
            remote,
            peer_device,
            keys,
        };
        let link = VerbsLink::start(backend, cx.sink, cx.state.clone(), name.clone(), c);
        let describe = link.describe.clone();
        Ok(Ok(Opened {
            channel: Arc::new(VerbsChannel { link }),
            describe,
        }))
    }
}
