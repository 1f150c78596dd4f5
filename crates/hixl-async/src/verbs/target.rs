//! The target's side of verbs: the offer (its device), answering an initiator's
//! `VerbsConnect` with a queue pair connected to the initiator's, and the device keys sent
//! before every later memory table.

use std::sync::{Arc, Mutex};

use hixl_core::wire::Message;
use hixl_core::{RegionTable, Status};
use hixl_verbs::QueuePair;

use super::VerbsBackend;
use crate::memory::RegionInner;
use crate::transport::target::{PerSession, Session, TargetCx};

/// The target's end of each session's RC queue pair (kept by the verbs transport). Nothing is
/// posted on it; it lives as long as its session.
pub(crate) type Qps = Arc<PerSession<Mutex<QueuePair>>>;

/// `(rkey, device rkey)` of every exported region registered with the RDMA device.
pub(crate) fn device_keys(r: &RegionTable<Arc<RegionInner>>) -> Vec<(u64, u32)> {
    r.iter()
        .filter(|e| e.access.is_remote())
        .filter_map(|e| Some((e.rkey, e.data.dev_rkey?)))
        .collect()
}

/// Answers an initiator's `VerbsConnect`: a QP connected to its endpoint, then the device
/// keys and our endpoint; or a refusal with the reason.
pub(crate) fn accept(
    backend: Option<&VerbsBackend>,
    qps: &Qps,
    cx: &TargetCx,
    sess: &Session,
    endpoint: &[u8],
) {
    let refuse = |status: Status, reason: String| {
        tracing::info!(peer = %sess.peer, "refusing a queue pair: {reason}");
        sess.send(&Message::VerbsAccept {
            status: status.code(),
            endpoint: Vec::new(),
            reason,
        });
    };
    let Some(v) = backend else {
        return refuse(Status::Unsupported, "this engine has no RDMA device".into());
    };
    if qps.contains(sess.id) {
        return refuse(Status::AlreadyConnected, "a queue pair exists".into());
    }
    match v.accept(&sess.peer, endpoint) {
        Ok(qp) => {
            let ep = qp.endpoint().to_bytes().to_vec();
            if !qps.insert(sess.id, Arc::new(Mutex::new(qp))) {
                return refuse(Status::AlreadyConnected, "a queue pair exists".into());
            }
            // The queue pair goes with the session (a task of its, which its driver joins).
            let (st, qps, id) = (sess.state.clone(), qps.clone(), sess.id);
            sess.state.spawn(async move {
                st.dead().await;
                qps.remove(id);
            });
            let keys = device_keys(&crate::sync::lock(&cx.regions));
            sess.send(&Message::VerbsKeys(keys));
            sess.send(&Message::VerbsAccept {
                status: 0,
                endpoint: ep,
                reason: String::new(),
            });
        }
        Err(e) => refuse(e.status(), e.to_string()),
    }
}
