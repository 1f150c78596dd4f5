//! [`Directory`]: the engine's handle on the directory: its watched cache, its publication,
//! lookups, and the stream of changes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hixl_core::options::DirectoryOptions;
use hixl_core::{Error, Result};
use tokio::sync::{broadcast, watch, Notify};
use tokio::task::JoinHandle;

use crate::cache::{Cache, Change};
use crate::connect::{describe, failed, Members};
use crate::entry::{Entry, Malformed};
use crate::publish;
use crate::shared::{Publication, PublishState, Shared};
use crate::sync::lock;

/// A directory of engines in etcd: this engine's entry (if it publishes one), and a cache of
/// every live entry under the prefix, kept current by a watch. The directory is never in the
/// data path: when etcd is unreachable, lookups are served from the cache and the entry is
/// published again when etcd is back. Dropping the handle stops its tasks (the entry then
/// expires with its lease); [`Directory::close`] deletes the entry at once.
#[derive(Debug)]
pub struct Directory {
    sh: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Directory {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

impl Directory {
    /// Connects to etcd, lists the entries under the prefix and starts watching them.
    ///
    /// # Errors
    /// [`Error::Directory`] naming the endpoints when etcd cannot be reached or refuses (bad
    /// credentials); [`Error::InvalidOption`] for a user without a password.
    pub async fn open(opts: &DirectoryOptions) -> Result<Directory> {
        if !opts.is_enabled() {
            return Err(Error::InvalidOption {
                key: "hixl.Directory".into(),
                value: String::new(),
                reason: "no directory configured (etcd://host:port,...)".into(),
            });
        }
        let (changes, _) = broadcast::channel(1024);
        let sh = Arc::new(Shared {
            opts: opts.clone(),
            members: Members::new(opts)?,
            watchers: Members::new(opts)?,
            cache: Mutex::new(Cache::default()),
            changes,
            synced: watch::channel(false).0,
            etcd_up: AtomicBool::new(true),
            publication: Mutex::new(None),
            entry_gone: Notify::new(),
            requests: AtomicU64::new(0),
            publish_failures: AtomicU64::new(0),
        });
        let rev = crate::watch::list(&sh).await?;
        let d = Directory {
            tasks: Mutex::new(vec![tokio::spawn(crate::watch::run(sh.clone(), Some(rev)))]),
            sh,
        };
        Ok(d)
    }

    /// Publishes `entry` under its name, under a lease of `hixl.DirectoryTtlSec` kept alive
    /// until [`Directory::close`] (or the process dies: then it expires within the TTL).
    ///
    /// # Errors
    /// [`Error::NameTaken`] naming the live holder when another incarnation holds the name;
    /// [`Error::Directory`] when etcd fails; [`Error::InvalidParam`] if already publishing.
    pub async fn publish(&self, entry: Entry) -> Result<()> {
        if lock(&self.sh.publication).is_some() {
            return Err(Error::InvalidParam {
                what: format!("this directory handle already publishes {:?}", entry.name),
            });
        }
        let lease = publish::claim(&self.sh, &entry, 0).await?;
        *lock(&self.sh.publication) = Some(Publication {
            entry,
            lease,
            state: PublishState::Live,
        });
        lock(&self.tasks).push(tokio::spawn(publish::keep(self.sh.clone())));
        Ok(())
    }

    /// Replaces the published entry with `entry` (same name and incarnation; e.g. a new
    /// memory-table digest). If etcd is away, the keeper publishes it when etcd is back.
    pub async fn update(&self, entry: Entry) {
        let lease = {
            let mut p = lock(&self.sh.publication);
            let Some(p) = p.as_mut() else { return };
            if p.entry.name != entry.name || p.entry.incarnation != entry.incarnation {
                return;
            }
            p.entry = entry.clone();
            p.lease
        };
        let key = self.sh.key_of(&entry.name);
        let put = etcd_client::TxnOp::put(
            key.clone(),
            entry.encode(),
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        );
        let txn = etcd_client::Txn::new()
            .when([etcd_client::Compare::lease(
                key,
                etcd_client::CompareOp::Equal,
                lease,
            )])
            .and_then([put]);
        match self.sh.txn("updating the entry", txn).await {
            Ok(r) if r.succeeded() => {}
            Ok(_) => self.sh.entry_gone.notify_one(),
            Err(e) => tracing::warn!("{e}; the keeper publishes it when etcd is back"),
        }
    }

    /// Deletes this engine's entry at once (revoking its lease) and stops watching.
    pub async fn close(&self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        let p = lock(&self.sh.publication).take();
        if let Some(p) = p {
            publish::withdraw(&self.sh, &p.entry, p.lease).await;
        }
    }

    /// The live entry named `name`, from the cache (no round trip).
    pub fn lookup(&self, name: &str) -> Option<Entry> {
        lock(&self.sh.cache).get(name).cloned()
    }

    /// The entry named `name`: from the cache, else asked of etcd (the cache may not have
    /// seen a brand-new entry yet).
    ///
    /// # Errors
    /// [`Error::UnknownName`]; [`Error::Directory`] naming the key for an entry hixl cannot
    /// read, or when etcd fails and the cache does not have it.
    pub async fn resolve(&self, name: &str) -> Result<Entry> {
        if let Some(e) = self.lookup(name) {
            return Ok(e);
        }
        self.resolve_cold(name).await
    }

    /// The entry named `name`, asked of etcd (one round trip; the cache is not consulted).
    ///
    /// # Errors
    /// As [`Directory::resolve`].
    pub async fn resolve_cold(&self, name: &str) -> Result<Entry> {
        let o = &self.sh.opts;
        let key = self.sh.key_of(name);
        self.sh.requests.fetch_add(1, Ordering::Relaxed);
        let r = self
            .sh
            .members
            .request("looking up a name", |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await?;
        let Some(kv) = r.kvs().first() else {
            return Err(Error::UnknownName {
                name: name.to_owned(),
                directory: describe(o),
            });
        };
        Entry::decode(name, kv.value())
            .map_err(|Malformed(why)| failed(o, &format!("reading {}", self.sh.key_of(name)), &why))
    }

    /// Why the value under `name`'s key cannot be read, if the cache holds one it cannot.
    pub fn malformed(&self, name: &str) -> Option<String> {
        lock(&self.sh.cache).malformed(name).map(str::to_owned)
    }

    /// Every key under the prefix hixl cannot read, with why, from the cache.
    pub fn unreadable(&self) -> Vec<(String, String)> {
        let c = lock(&self.sh.cache);
        c.unreadable()
            .map(|(n, w)| (n.to_owned(), w.to_owned()))
            .collect()
    }

    /// How many live entries the cache holds.
    pub fn len(&self) -> usize {
        lock(&self.sh.cache).len()
    }

    /// Whether the cache holds no live entry.
    pub fn is_empty(&self) -> bool {
        lock(&self.sh.cache).is_empty()
    }

    /// Every live entry, by name, from the cache.
    pub fn entries(&self) -> Vec<Entry> {
        lock(&self.sh.cache).entries().cloned().collect()
    }

    /// Changes as the watch sees them (a receiver that lags past 1024 changes loses the
    /// oldest; [`Directory::entries`] is always current).
    pub fn changes(&self) -> broadcast::Receiver<Change> {
        self.sh.changes.subscribe()
    }

    /// This engine's publication, if it publishes one.
    pub fn publication(&self) -> Option<Publication> {
        lock(&self.sh.publication).clone()
    }

    /// Whether etcd answered the watch last time (the cache is being kept current).
    pub fn etcd_reachable(&self) -> bool {
        self.sh.etcd_up.load(Ordering::SeqCst)
    }

    /// Attempts to publish this engine's entry again that failed so far (etcd away, refusing,
    /// or an expired token it could not renew); while they go on the publication's state is
    /// `Retrying` with the last error.
    pub fn publish_failures(&self) -> u64 {
        self.sh.publish_failures.load(Ordering::Relaxed)
    }

    /// etcd requests made through this handle so far (calls, stream opens, keep-alives).
    pub fn requests(&self) -> u64 {
        self.sh.requests.load(Ordering::Relaxed)
    }

    /// `etcd://a:2379,b:2379 under /hixl/engines/`.
    pub fn describe(&self) -> String {
        describe(&self.sh.opts)
    }
}
