//! The target's side of verbs: answering an initiator's `VerbsConnect` for one of its rails
//! with queue pairs on the device it names, connected to the initiator's (a rail asked for
//! again — probed back after a failure — gets new ones, the old ones dropped), and the device
//! keys sent once before the first answer and before every later memory table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hixl_core::options::MAX_QPS_PER_RAIL;
use hixl_core::wire::Message;
use hixl_core::{RegionTable, Status};
use hixl_verbs::{QueuePair, MAX_NICS};

use super::keeper::decode_endpoints;
use super::VerbsBackend;
use crate::memory::RegionInner;
use crate::sync::lock;
use crate::transport::target::{PerSession, Session, TargetCx};

/// Rails one initiator may ask for (one per pair of devices at most).
const MAX_RAILS: u32 = (MAX_NICS * MAX_NICS) as u32;

/// The target's queue pairs of each session, by the initiator's rail number. Nothing is
/// posted on them; they live as long as their session (or until their rail is asked again).
pub(crate) type Qps = Arc<PerSession<Mutex<HashMap<u32, Vec<QueuePair>>>>>;

/// `(rkey, device index, device rkey)` of every exported region registered with the RDMA
/// devices, for every device.
pub(crate) fn device_keys(r: &RegionTable<Arc<RegionInner>>) -> Vec<(u64, u32, u32)> {
    r.iter()
        .filter(|e| e.access.is_remote())
        .flat_map(|e| {
            let keys = e.data.dev_rkeys.clone().unwrap_or_else(|| Arc::new([]));
            let rkey = e.rkey;
            (0..keys.len()).map(move |d| (rkey, u32::try_from(d).unwrap_or(u32::MAX), keys[d]))
        })
        .collect()
}

/// An initiator's `VerbsConnect`.
pub(crate) struct Ask<'a> {
    pub(crate) rail: u32,
    pub(crate) device: u32,
    pub(crate) endpoints: &'a [u8],
}

/// Answers an initiator's `VerbsConnect`: queue pairs connected to its endpoints, then (the
/// first time for this session) the device keys, and our endpoints; or a refusal naming why.
pub(crate) fn accept(
    backend: Option<&VerbsBackend>,
    qps: &Qps,
    cx: &TargetCx,
    sess: &Session,
    ask: Ask<'_>,
) {
    let rail = ask.rail;
    let refuse = |status: Status, reason: String| {
        tracing::info!(peer = %sess.peer, "refusing queue pairs for rail {rail}: {reason}");
        sess.send(&Message::VerbsAccept {
            rail,
            status: status.code(),
            endpoints: Vec::new(),
            reason,
        });
    };
    let Some(v) = backend else {
        return refuse(Status::Unsupported, "this engine has no RDMA device".into());
    };
    if rail >= MAX_RAILS {
        return refuse(
            Status::ParamInvalid,
            format!("rail {rail} is out of range (at most {MAX_RAILS} rails)"),
        );
    }
    let Some(nic) = usize::try_from(ask.device).ok().and_then(|d| v.nics.get(d)) else {
        return refuse(
            Status::ParamInvalid,
            format!(
                "device {} is not one of this engine's {} RDMA devices ({})",
                ask.device,
                v.nics.len(),
                v.names()
            ),
        );
    };
    let remote = match decode_endpoints(ask.endpoints, 0) {
        Ok(r) if r.len() <= usize::from(MAX_QPS_PER_RAIL) => r,
        Ok(r) => {
            return refuse(
                Status::ParamInvalid,
                format!(
                    "{} queue pairs asked for, at most {MAX_QPS_PER_RAIL}",
                    r.len()
                ),
            )
        }
        Err(why) => return refuse(Status::ParamInvalid, why),
    };
    let made = remote
        .iter()
        .map(|ep| nic.accept(&sess.peer, ep))
        .collect::<hixl_core::Result<Vec<_>>>();
    let new = match made {
        Ok(q) => q,
        Err(e) => return refuse(e.status(), e.to_string()),
    };
    let endpoints = new.iter().flat_map(|q| q.endpoint().to_bytes()).collect();
    let first = match qps.get(sess.id) {
        Some(m) => {
            // A rail asked for again: the old queue pairs go (outside the lock).
            let old = lock(&m).insert(rail, new);
            drop(old);
            false
        }
        None => {
            let m = Arc::new(Mutex::new(HashMap::from([(rail, new)])));
            if !qps.insert(sess.id, m) {
                return refuse(Status::Failed, "queue pairs were being made".into());
            }
            // The queue pairs go with the session (a task of its, which its driver joins).
            let (st, qps, id) = (sess.state.clone(), qps.clone(), sess.id);
            sess.state.spawn(async move {
                st.dead().await;
                qps.remove(id);
            });
            true
        }
    };
    if first {
        let keys = device_keys(&lock(&cx.regions));
        sess.send(&Message::VerbsKeys(keys));
    }
    sess.send(&Message::VerbsAccept {
        rail,
        status: 0,
        endpoints,
        reason: String::new(),
    });
}
