//! The watch loop: lists the prefix page by page, then watches it from the listing's
//! revision, feeding the cache; on any failure (a member that stops answering included) keeps
//! the cache (lookups go on), waits, and lists again through the next member.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, WatchOptions};
use hixl_core::{Error, Result};

use crate::connect::{failed, MAX_MESSAGE};
use crate::shared::Shared;
use crate::sync::lock;

/// Longest wait between two attempts while etcd is unreachable.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Keys one listing read asks for (halved while a page is too large a message): a prefix of
/// any size is listed in pages, never in one message.
const PAGE: i64 = 512;

/// A watch that has said nothing for this long is asked for its progress...
const PROBE_AFTER: Duration = Duration::from_secs(3);
/// ...and is given up (its member is frozen or cut off) when it answers nothing this long.
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// The end of the range of keys under `prefix` (the prefix with its last byte raised).
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Whether `e` is a page too large to be one message.
fn too_large(e: &Error) -> bool {
    e.to_string().contains("message length too large")
}

/// One page of up to `limit` keys from `from` (to the prefix's end) at revision `rev` (0:
/// now); `keys_only` for keys without values.
async fn page(
    sh: &Shared,
    from: &[u8],
    limit: i64,
    rev: i64,
    keys_only: bool,
) -> Result<etcd_client::GetResponse> {
    let mut opts = GetOptions::new()
        .with_range(range_end(sh.opts.prefix.as_bytes()))
        .with_limit(limit)
        .with_revision(rev);
    if keys_only {
        opts = opts.with_keys_only();
    }
    sh.requests.fetch_add(1, Ordering::Relaxed);
    sh.members
        .request("listing the engines", |c| {
            let (from, opts) = (from.to_vec(), opts.clone());
            let mut kv = c.kv_client().max_decoding_message_size(MAX_MESSAGE);
            async move { kv.get(from, Some(opts)).await }
        })
        .await
}

/// Lists the prefix into the cache, page by page at one revision; returns that revision.
/// A value too large to read is skipped and named (the cache reports it unreadable).
pub(crate) async fn list(sh: &Shared) -> Result<i64> {
    let mut from = sh.opts.prefix.as_bytes().to_vec();
    let (mut rev, mut limit) = (0i64, PAGE);
    let mut listing: Vec<(String, Vec<u8>)> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    loop {
        let r = match page(sh, &from, limit, rev, false).await {
            Ok(r) => r,
            Err(e) if too_large(&e) && limit > 1 => {
                limit = (limit / 2).max(1);
                continue;
            }
            Err(e) if too_large(&e) => {
                // One value past any sane size: name its key, skip it.
                let k = page(sh, &from, 1, rev, true).await?;
                let Some(kv) = k.kvs().first() else { break };
                if let Some(name) = sh.name_of(kv.key()) {
                    skipped.push((name, format!("a value too large to read ({e})")));
                }
                from = kv.key().to_vec();
                from.push(0);
                continue;
            }
            Err(e) => return Err(e),
        };
        if rev == 0 {
            rev = r.header().map_or(0, |h| h.revision());
        }
        for kv in r.kvs() {
            if let Some(name) = sh.name_of(kv.key()) {
                listing.push((name, kv.value().to_vec()));
            }
        }
        match r.kvs().last() {
            Some(last) if r.more() => {
                from = last.key().to_vec();
                from.push(0);
                limit = PAGE;
            }
            _ => break,
        }
    }
    let changes = {
        let mut cache = lock(&sh.cache);
        let mut changes = cache.reset(listing.iter().map(|(n, v)| (n.as_str(), v.as_slice())));
        for (name, why) in skipped {
            changes.extend(cache.put_unreadable(&name, why));
        }
        changes
    };
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

/// Watches the prefix from `rev + 1`; returns when the watch fails, is cancelled, or its
/// member stops answering.
async fn watch_from(sh: &Shared, rev: i64) -> Result<()> {
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let mut stream = sh
        .watchers
        .request("watching the engines", |c| {
            let prefix = sh.opts.prefix.clone();
            let opts = WatchOptions::new()
                .with_prefix()
                .with_start_revision(rev + 1);
            let mut w = c.watch_client().max_decoding_message_size(MAX_MESSAGE);
            async move { w.watch(prefix, Some(opts)).await }
        })
        .await?;
    let member = sh.watchers.current();
    if !sh.etcd_up.swap(true, Ordering::SeqCst) {
        tracing::info!("directory: watching {}", crate::connect::describe(&sh.opts));
    }
    sh.synced.send_replace(true);
    let mut probed = false;
    loop {
        let quiet = if probed { PROBE_WAIT } else { PROBE_AFTER };
        let msg = match tokio::time::timeout(quiet, stream.message()).await {
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return Err(failed(&sh.opts, "watching", &"etcd ended the watch")),
            Ok(Err(e)) => return Err(failed(&sh.opts, "watching", &crate::connect::plain(&e))),
            Err(_) if !probed => {
                // Quiet: ask for progress; a live member answers at once.
                probed = true;
                stream
                    .request_progress()
                    .await
                    .map_err(|e| failed(&sh.opts, "watching", &crate::connect::plain(&e)))?;
                continue;
            }
            Err(_) => {
                sh.watchers.failed(member);
                let why = format!(
                    "member {} answered no progress request in {PROBE_WAIT:?}",
                    sh.opts.endpoints.get(member).map_or("?", String::as_str)
                );
                return Err(failed(&sh.opts, "watching", &why));
            }
        };
        probed = false;
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
