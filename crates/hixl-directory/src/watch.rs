//! The watch loop: lists the prefix, then watches it from the listing's revision, feeding the
//! cache; on any failure keeps the cache (lookups go on), waits, and lists again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use hixl_core::Result;

use crate::connect::{failed, request};
use crate::shared::Shared;
use crate::sync::lock;

/// Longest wait between two attempts while etcd is unreachable.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Lists the prefix into the cache; returns the revision the listing was taken at.
pub(crate) async fn list(sh: &Shared) -> Result<i64> {
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let r = request(&sh.opts, "listing the engines", || {
        let (mut c, prefix) = (sh.client.clone(), sh.opts.prefix.clone());
        async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
    })
    .await?;
    let rev = r.header().map_or(0, |h| h.revision());
    let listing: Vec<(String, Vec<u8>)> = r
        .kvs()
        .iter()
        .filter_map(|kv| Some((sh.name_of(kv.key())?, kv.value().to_vec())))
        .collect();
    let changes = lock(&sh.cache).reset(listing.iter().map(|(n, v)| (n.as_str(), v.as_slice())));
    sh.emit(changes);
    Ok(rev)
}

/// Runs until the directory is closed.
pub(crate) async fn run(sh: Arc<Shared>, mut listed: Option<i64>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let r = match listed.take() {
            Some(rev) => watch_from(&sh, rev).await,
            None => match list(&sh).await {
                Ok(rev) => watch_from(&sh, rev).await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = r {
            if sh.etcd_up.swap(false, Ordering::SeqCst) {
                tracing::warn!("{e}; lookups are served from the cache until etcd is back");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Watches the prefix from `rev + 1`; returns when the watch fails or is cancelled.
async fn watch_from(sh: &Shared, rev: i64) -> Result<()> {
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let mut stream = request(&sh.opts, "watching the engines", || {
        let (mut c, prefix) = (sh.watcher.clone(), sh.opts.prefix.clone());
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1);
        async move { c.watch(prefix, Some(opts)).await }
    })
    .await?;
    if !sh.etcd_up.swap(true, Ordering::SeqCst) {
        tracing::info!("directory: watching {}", crate::connect::describe(&sh.opts));
    }
    sh.synced.send_replace(true);
    loop {
        let msg = match stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return Err(failed(&sh.opts, "watching", &"etcd ended the watch")),
            Err(e) => return Err(failed(&sh.opts, "watching", &e)),
        };
        if msg.canceled() {
            // Compacted past our revision, or the member lost its leader: list again.
            let why = format!(
                "etcd cancelled the watch ({}; compacted to {})",
                msg.cancel_reason(),
                msg.compact_revision()
            );
            return Err(failed(&sh.opts, "watching", &why));
        }
        let mut changes = Vec::new();
        {
            let mut cache = lock(&sh.cache);
            for ev in msg.events() {
                let Some(kv) = ev.kv() else { continue };
                let Some(name) = sh.name_of(kv.key()) else {
                    continue;
                };
                changes.extend(match ev.event_type() {
                    EventType::Put => cache.put(&name, kv.value()),
                    EventType::Delete => cache.delete(&name),
                });
            }
        }
        sh.emit(changes);
    }
}
