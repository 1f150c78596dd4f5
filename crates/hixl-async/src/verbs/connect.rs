//! Verbs as a [`Transport`]: when both engines have active RDMA devices, the link's rails are
//! connected over the control connection during the handshake — our devices paired with the
//! peer's ([`hixl_verbs::pair`]), then per rail a `VerbsConnect` with our queue pairs'
//! endpoints, the peer's device keys (`VerbsKeys`, once), and a `VerbsAccept` with its
//! endpoints. A rail that cannot be connected starts paused (its keeper probes it back); the
//! link needs one rail up.

use std::sync::Arc;
use std::time::Instant;

use hixl_core::wire::Message;
use hixl_core::{RegionTable, Result};
use hixl_verbs::{NicInfo, QueuePair};

use super::channel::VerbsChannel;
use super::health::Health;
use super::keeper::accepted;
use super::link::{Connected, VerbsLink};
use super::rail::Rail;
use super::VerbsBackend;
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
            Ok((backend, remote)) => Box::pin(open(backend, remote, cx)),
            Err(why) => Box::pin(std::future::ready(Ok(Err(why)))),
        }
    }

    fn completions(&self) -> Option<Arc<dyn hixl_core::CompletionSource>> {
        let s: Arc<dyn hixl_core::CompletionSource> = self.backend.as_ref()?.source.clone();
        Some(s)
    }

    fn device(&self) -> Option<std::result::Result<String, String>> {
        Some(match &self.backend {
            Some(v) => Ok(v.names()),
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
            Ok(mrs) => Ok(Some(DeviceMr {
                lkeys: mrs.iter().map(|m| m.lkey()).collect(),
                rkeys: mrs.iter().map(|m| m.rkey()).collect(),
                numa: super::numa_of(desc.addr),
                _keep: Box::new(mrs),
            })),
            Err(e) if v.forced => Err(e),
            Err(e) => {
                tracing::warn!(
                    "registering {:#x}+{} with {}: {e}; its transfers use another transport",
                    desc.addr,
                    desc.len,
                    v.names()
                );
                Ok(None)
            }
        }
    }

    fn offer(&self) -> Option<Message> {
        let v = self.backend.as_ref()?;
        Some(Message::VerbsInfo {
            devices: NicInfo::encode_list(&v.infos()),
        })
    }

    fn on_control(&self, cx: &TargetCx, sess: &Session, m: &Message) -> bool {
        match m {
            Message::VerbsConnect {
                rail,
                device,
                endpoints,
            } => {
                let ask = super::target::Ask {
                    rail: *rail,
                    device: *device,
                    endpoints,
                };
                super::target::accept(self.backend.as_deref(), &self.qps, cx, sess, ask);
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
    /// The backend and the devices the peer offers, or why verbs cannot serve the peer.
    fn eligible(
        &self,
        cx: &Negotiation<'_>,
    ) -> std::result::Result<(&Arc<VerbsBackend>, Vec<NicInfo>), Declined> {
        let Some(backend) = &self.backend else {
            return Err(Declined::NoDevice(self.why.clone()));
        };
        let devices = cx
            .offers
            .iter()
            .find_map(|m| match m {
                Message::VerbsInfo { devices } => Some(devices),
                _ => None,
            })
            .ok_or(Declined::PeerLacks(TransportKind::Verbs))?;
        let remote = NicInfo::decode_list(devices)
            .map_err(|e| Declined::Setup(format!("the peer's device list: {e}")))?;
        Ok((backend, remote))
    }
}

/// Connects the rails of a link to the peer of `cx`, whose devices are `remote`.
async fn open(
    backend: &Arc<VerbsBackend>,
    remote: Vec<NicInfo>,
    cx: &mut Negotiation<'_>,
) -> Result<std::result::Result<Opened, Declined>> {
    let name = cx.peer;
    let pairing = hixl_verbs::pair(&backend.infos(), &remote);
    if pairing.rails.is_empty() {
        let why: Vec<String> = pairing
            .unpaired
            .iter()
            .map(|(i, w)| format!("{}: {w}", backend.nics[*i].info.name))
            .collect();
        return Ok(Err(Declined::Setup(format!(
            "no device of ours reaches one of the peer's ({})",
            why.join("; ")
        ))));
    }
    let k = backend.qps_per_rail;
    // Per rail: our queue pairs, asked for; or why not.
    let mut mine: Vec<std::result::Result<Vec<QueuePair>, String>> = Vec::new();
    let mut asked = 0;
    for (i, p) in pairing.rails.iter().enumerate() {
        let nic = &backend.nics[p.local];
        let qps = match (0..k)
            .map(|_| nic.initiator_qp(name))
            .collect::<Result<Vec<_>>>()
        {
            Ok(q) => q,
            Err(e) => {
                mine.push(Err(format!("creating queue pairs: {e}")));
                continue;
            }
        };
        cx.control
            .send(Message::VerbsConnect {
                rail: u32::try_from(i).unwrap_or(u32::MAX),
                device: u32::try_from(p.remote).unwrap_or(u32::MAX),
                endpoints: qps.iter().flat_map(|q| q.endpoint().to_bytes()).collect(),
            })
            .await?;
        asked += 1;
        mine.push(Ok(qps));
    }
    let mut keys = Vec::new();
    let mut answers: Vec<Option<Message>> = vec![None; mine.len()];
    while asked > 0 {
        match cx.control.recv().await? {
            Message::VerbsKeys(v) => keys.extend(v),
            m @ Message::VerbsAccept { rail, .. } => {
                let slot = usize::try_from(rail)
                    .ok()
                    .and_then(|r| answers.get_mut(r))
                    .filter(|a| a.is_none());
                let Some(slot) = slot else {
                    return Err(unexpected(name, &m, "an answer for a rail asked for once"));
                };
                *slot = Some(m);
                asked -= 1;
            }
            m => return Err(unexpected(name, &m, "verbs accept")),
        }
    }
    let now = Instant::now();
    let mut rails = Vec::new();
    for (i, ((plan, qps), answer)) in pairing.rails.into_iter().zip(mine).zip(answers).enumerate() {
        let nic = &backend.nics[plan.local];
        let rname = format!("{}->{}", nic.info.name, remote[plan.remote].name);
        let connected = qps.and_then(|mut qps| {
            let m = answer.ok_or_else(|| "not asked".to_owned())?;
            let eps = accepted(name, m, qps.len()).map_err(|e| e.to_string())?;
            for (q, ep) in qps.iter_mut().zip(&eps) {
                q.connect(ep)
                    .map_err(|e| format!("connecting a queue pair: {e}"))?;
            }
            Ok(qps)
        });
        let (qps, health) = match connected {
            Ok(qps) => (qps.into_iter().map(Some).collect(), Health::up(now)),
            Err(why) => {
                tracing::warn!(peer = %name, "RDMA rail {i} {rname} starts paused: {why}");
                ((0..k).map(|_| None).collect(), Health::paused(now, why))
            }
        };
        rails.push(Rail::new(i, plan, rname, nic.info.numa, qps, health));
    }
    if !rails.iter().any(Rail::is_up) {
        let v: Vec<String> = rails.iter().map(|r| r.describe(now)).collect();
        return Ok(Err(Declined::Refused(v.join("; "))));
    }
    for (i, w) in &pairing.unpaired {
        tracing::info!(peer = %name, "RDMA device {} has no rail: {w}", backend.nics[*i].info.name);
    }
    let c = Connected {
        rails,
        remote,
        keys,
    };
    let link = VerbsLink::start(backend, cx.sink, cx.state.clone(), name.clone(), c);
    let describe = link.describe.clone();
    Ok(Ok(Opened {
        channel: Arc::new(VerbsChannel { link }),
        describe,
    }))
}
