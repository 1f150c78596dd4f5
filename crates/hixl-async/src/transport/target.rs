//! What the target's side of a transport sees: the sessions of connected initiators, the
//! exported regions and the notify inbox; and the map a transport keeps its own per-session
//! state in ([`PerSession`]: the fabric's channel, the verbs queue pair). Narrow handles, so
//! that transports need neither the server nor the engine.

// Part of the transport interface: hooks and kinds that only some transports use (the
// fabric's, verbs'). A build without one of them leaves those unused; the full build
// (`--features verbs`, the fabric being a default) checks every item here for dead code.
#![cfg_attr(not(all(feature = "fabric", feature = "verbs")), allow(dead_code))]

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
}

impl Session {
    pub(crate) fn new(id: u64, peer: Arc<str>, control: mpsc::UnboundedSender<Message>) -> Session {
        Session {
            id,
            peer,
            state: Arc::new(LinkState::new()),
            control,
        }
    }

    /// Hands a frame to the session's driver: a memory table, device keys, a queue-pair
    /// answer, a `Disconnect`. False once the driver has ended.
    pub(crate) fn send(&self, m: &Message) -> bool {
        self.control.send(m.clone()).is_ok()
    }
}

/// What one transport keeps for each session that uses it (the fabric's channel, the verbs
/// queue pair): owned by that transport, by session id.
#[derive(Debug)]
pub(crate) struct PerSession<T> {
    map: Mutex<HashMap<u64, Arc<T>>>,
}

impl<T> Default for PerSession<T> {
    fn default() -> PerSession<T> {
        PerSession {
            map: Mutex::new(HashMap::new()),
        }
    }
}
impl<T> PerSession<T> {
    /// What is kept for session `id`.
    pub(crate) fn get(&self, id: u64) -> Option<Arc<T>> {
        lock(&self.map).get(&id).cloned()
    }

    /// Whether anything is kept for session `id`.
    pub(crate) fn contains(&self, id: u64) -> bool {
        lock(&self.map).contains_key(&id)
    }

    /// Keeps `v` for session `id`; false (and nothing kept) if something is kept already.
    pub(crate) fn insert(&self, id: u64, v: Arc<T>) -> bool {
        let mut m = lock(&self.map);
        if m.contains_key(&id) {
            return false;
        }
        m.insert(id, v);
        true
    }

    /// Drops what is kept for session `id` (outside the lock).
    pub(crate) fn remove(&self, id: u64) {
        let gone = lock(&self.map).remove(&id);
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
pub(crate) struct TargetCx {
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) regions: Arc<Mutex<RegionTable<Arc<RegionInner>>>>,
    pub(crate) notifies: Arc<NotifyQueue>,
    /// What this engine served each initiator, and what it refused.
    pub(crate) served: Arc<crate::served::Served>,
    /// The engine's own tasks (its accept loops and each accepted connection's), which
    /// `Engine::shutdown` joins.
    pub(crate) tasks: TaskTracker,
}
