//! What the target's side of a transport sees: the sessions of connected initiators (each
//! with a slot per transport for what that transport keeps for it: the fabric's channel, the
//! verbs queue pair), the exported regions and the notify inbox. Narrow handles, so that
//! transports need neither the server nor the engine.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hixl_core::wire::Message;
use hixl_core::RegionTable;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::link_state::LinkState;
use crate::memory::RegionInner;
use crate::notify::NotifyQueue;
use crate::sync::lock;

/// One connected initiator, as the target sees it.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) id: u64,
    pub(crate) peer: Arc<str>,
    pub(crate) state: Arc<LinkState>,
    /// To the session's driver, which sends each through the sans-io session.
    control: mpsc::UnboundedSender<Message>,
    /// What each transport keeps for this initiator, by transport kind.
    slots: Mutex<Vec<(&'static str, Arc<dyn Any + Send + Sync>)>>,
}

impl Session {
    pub(crate) fn new(id: u64, peer: Arc<str>, control: mpsc::UnboundedSender<Message>) -> Session {
        Session {
            id,
            peer,
            state: Arc::new(LinkState::new()),
            control,
            slots: Mutex::new(Vec::new()),
        }
    }

    /// Hands a frame to the session's driver: a memory table, device keys, a queue-pair
    /// answer, a `Disconnect`. False once the driver has ended.
    pub(crate) fn send(&self, m: &Message) -> bool {
        self.control.send(m.clone()).is_ok()
    }

    /// The transport serving this initiator besides TCP's control (`fabric`, `verbs`), or
    /// `tcp`: for telemetry.
    pub(crate) fn transport(&self) -> &'static str {
        let s = lock(&self.slots);
        if s.iter().any(|(k, _)| *k == "fabric") {
            "fabric"
        } else if s.iter().any(|(k, _)| *k == "verbs") {
            "verbs"
        } else {
            "tcp"
        }
    }

    /// What transport `kind` keeps for this session, if anything of type `T`.
    #[allow(dead_code)]
    pub(crate) fn slot<T: Any + Send + Sync>(&self, kind: &str) -> Option<Arc<T>> {
        let s = lock(&self.slots);
        let (_, v) = s.iter().find(|(k, _)| *k == kind)?;
        v.clone().downcast::<T>().ok()
    }

    /// Whether transport `kind` keeps something for this session (verbs asks).
    #[allow(dead_code)]
    pub(crate) fn has_slot(&self, kind: &str) -> bool {
        lock(&self.slots).iter().any(|(k, _)| *k == kind)
    }

    /// Keeps `v` for transport `kind`; false (and nothing kept) if it keeps something already.
    #[allow(dead_code)]
    pub(crate) fn set_slot(&self, kind: &'static str, v: Arc<dyn Any + Send + Sync>) -> bool {
        let mut s = lock(&self.slots);
        if s.iter().any(|(k, _)| *k == kind) {
            return false;
        }
        s.push((kind, v));
        true
    }

    /// Drops what transport `kind` keeps for this session.
    #[allow(dead_code)]
    pub(crate) fn clear_slot(&self, kind: &str) {
        let gone = {
            let mut s = lock(&self.slots);
            s.iter()
                .position(|(k, _)| *k == kind)
                .map(|i| s.swap_remove(i))
        };
        drop(gone);
    }
}

/// The sessions of every connected initiator, by session id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<u64, Arc<Session>>>,
}

impl Sessions {
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Session>> {
        lock(&self.map).get(&id).cloned()
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        lock(&self.map).contains_key(&id)
    }

    pub(crate) fn all(&self) -> Vec<Arc<Session>> {
        lock(&self.map).values().cloned().collect()
    }

    pub(crate) fn insert(&self, s: Arc<Session>) {
        lock(&self.map).insert(s.id, s);
    }

    pub(crate) fn remove(&self, id: u64) -> Option<Arc<Session>> {
        lock(&self.map).remove(&id)
    }

    pub(crate) fn drain(&self) -> Vec<Arc<Session>> {
        lock(&self.map).drain().map(|(_, v)| v).collect()
    }
}

/// The target's handles a transport serves its peers with.
#[derive(Debug, Clone)]
#[allow(dead_code)] // a build without the fabric reads only the sessions
pub(crate) struct TargetCx {
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) regions: Arc<Mutex<RegionTable<Arc<RegionInner>>>>,
    pub(crate) notifies: Arc<NotifyQueue>,
    /// The engine's own tasks (its accept loops and each accepted connection's), which
    /// `Engine::shutdown` joins.
    pub(crate) tasks: TaskTracker,
}
