//! What the directory's tasks and its handle share: the client, the cache, the publication.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

use hixl_core::options::DirectoryOptions;
use tokio::sync::{broadcast, watch, Notify};

use crate::cache::{Cache, Change};
use crate::connect::Members;
use crate::entry::Entry;
use crate::sync::lock;

/// How the engine's own entry stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishState {
    /// Published, its lease kept alive.
    Live,
    /// etcd cannot be reached (or refused): the keeper retries; links are unaffected.
    Retrying(String),
    /// While etcd was away, another incarnation took the name; this engine stopped
    /// publishing it.
    Lost(String),
}

/// This engine's publication: the entry, the lease it lives under, how it stands.
#[derive(Debug, Clone)]
pub struct Publication {
    /// What is published.
    pub entry: Entry,
    /// The etcd lease the entry lives under (0 while none is granted).
    pub lease: i64,
    /// How it stands.
    pub state: PublishState,
}

/// What the tasks and the handle share.
pub(crate) struct Shared {
    pub(crate) opts: DirectoryOptions,
    /// The etcd members, for requests and keep-alives.
    pub(crate) members: Members,
    /// Second connections for the watch alone: a flood of watch events must never hold
    /// keep-alives and lookups up behind HTTP/2 flow control.
    pub(crate) watchers: Members,
    pub(crate) cache: Mutex<Cache>,
    pub(crate) changes: broadcast::Sender<Change>,
    /// `true` once the watch is established (the cache is current).
    pub(crate) synced: watch::Sender<bool>,
    /// Whether etcd answered last time the watch loop asked.
    pub(crate) etcd_up: AtomicBool,
    pub(crate) publication: Mutex<Option<Publication>>,
    /// Wakes the keeper: the watch saw this engine's entry go.
    pub(crate) entry_gone: Notify,
    /// etcd requests this handle made (unary calls, stream opens, keep-alives).
    pub(crate) requests: AtomicU64,
    /// Attempts to publish the entry again that failed.
    pub(crate) publish_failures: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("opts", &self.opts)
            .field("entries", &lock(&self.cache).len())
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn key_of(&self, name: &str) -> String {
        format!("{}{name}", self.opts.prefix)
    }

    /// The name a key under the prefix stands for.
    pub(crate) fn name_of(&self, key: &[u8]) -> Option<String> {
        let rest = key.strip_prefix(self.opts.prefix.as_bytes())?;
        Some(String::from_utf8_lossy(rest).into_owned())
    }

    pub(crate) fn emit(&self, changes: Vec<Change>) {
        for ch in changes {
            let ours = lock(&self.publication).as_ref().is_some_and(|p| {
                p.entry.name == ch.name()
                    && match &ch {
                        Change::Removed(_) => true,
                        Change::Replaced { new, .. }
                        | Change::Added(new)
                        | Change::Updated(new) => new.incarnation != p.entry.incarnation,
                    }
            });
            if ours {
                self.entry_gone.notify_one();
            }
            let _ = self.changes.send(ch);
        }
    }

    /// Runs `txn` (see [`Members::request`]), counted among this handle's requests.
    pub(crate) async fn txn(
        &self,
        what: &str,
        txn: etcd_client::Txn,
    ) -> hixl_core::Result<etcd_client::TxnResponse> {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.members
            .request(what, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
    }

    pub(crate) fn set_state(&self, lease: i64, state: PublishState) {
        if let Some(p) = lock(&self.publication).as_mut() {
            p.lease = lease;
            p.state = state;
        }
    }
}
