//! Publishing this engine: claiming its name under a lease (refused while another incarnation
//! holds it), keeping the lease alive, and claiming again after etcd comes back or the entry
//! vanished (lease expired while etcd was away, or the key was deleted).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use hixl_core::{Error, Result};

use crate::connect::failed;
use crate::entry::{Entry, Malformed};
use crate::shared::{PublishState, Shared};
use crate::sync::lock;

/// How often a publication that keeps failing is reported again.
const REPORT_EVERY: Duration = Duration::from_secs(30);

/// Writes `entry` under its name with `lease` (granting one if `lease` is 0) unless another
/// incarnation holds the name. Returns the lease.
pub(crate) async fn claim(sh: &Shared, entry: &Entry, lease: i64) -> Result<i64> {
    let o = &sh.opts;
    let lease = if lease != 0 {
        lease
    } else {
        let ttl = o.ttl_sec as i64;
        sh.requests.fetch_add(1, Ordering::Relaxed);
        let r = sh
            .members
            .request("granting a lease", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        r.id()
    };
    let key = sh.key_of(&entry.name);
    let put = TxnOp::put(
        key.clone(),
        entry.encode(),
        Some(PutOptions::new().with_lease(lease)),
    );
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([put.clone()]);
    if sh.txn("publishing", txn).await?.succeeded() {
        return Ok(lease);
    }
    // Someone holds the key: ours from before (a lease lost while etcd was away, or this
    // engine's earlier publish), or another engine.
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let r = sh
        .members
        .request("reading the name's holder", |mut c| {
            let k = key.clone();
            async move { c.get(k, None).await }
        })
        .await?;
    let Some(kv) = r.kvs().first() else {
        return Err(failed(
            o,
            "publishing",
            &"the name's holder vanished; retrying",
        ));
    };
    match Entry::decode(&entry.name, kv.value()) {
        Ok(h) if h.incarnation == entry.incarnation => {
            // Ours: move it under the current lease, if it still is ours.
            let mod_rev = kv.mod_revision();
            let txn = Txn::new()
                .when([Compare::mod_revision(key, CompareOp::Equal, mod_rev)])
                .and_then([put]);
            if sh.txn("publishing", txn).await?.succeeded() {
                Ok(lease)
            } else {
                Err(failed(
                    o,
                    "publishing",
                    &"the entry changed meanwhile; retrying",
                ))
            }
        }
        held => {
            revoke(sh, lease).await;
            let holder = match held {
                Ok(h) => h.describe(),
                Err(Malformed(why)) => format!("an entry hixl cannot read ({why})"),
            };
            Err(Error::NameTaken {
                name: entry.name.clone(),
                holder,
            })
        }
    }
}

/// Revokes `lease` (deleting the entry under it at once); a failure only costs the TTL.
pub(crate) async fn revoke(sh: &Shared, lease: i64) {
    if lease == 0 {
        return;
    }
    sh.requests.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = sh
        .members
        .request("revoking the lease", |mut c| async move {
            c.lease_revoke(lease).await
        })
        .await
    {
        tracing::warn!("{e}; the entry expires with its lease instead");
    }
}

/// Takes `entry` out of the directory: revokes `lease`, and deletes the key if it still holds
/// this incarnation (under a lease this handle lost track of while etcd was away, say) —
/// never another engine's entry. A failure only costs the TTL.
pub(crate) async fn withdraw(sh: &Shared, entry: &Entry, lease: i64) {
    revoke(sh, lease).await;
    let key = sh.key_of(&entry.name);
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let held = sh
        .members
        .request("reading the entry to delete", |mut c| {
            let k = key.clone();
            async move { c.get(k, None).await }
        })
        .await;
    let Ok(held) = held else { return };
    let Some(kv) = held.kvs().first() else { return };
    let ours =
        Entry::decode(&entry.name, kv.value()).is_ok_and(|e| e.incarnation == entry.incarnation);
    if ours {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(key, None)]);
        if let Err(e) = sh.txn("deleting the entry", txn).await {
            tracing::warn!("{e}; the entry expires with its lease instead");
        }
    }
}

/// Keeps the publication alive until the directory is closed: keep-alives every third of the
/// TTL; on failure retries (the lease may outlive an etcd restart); when the lease is gone or
/// the entry vanished, claims the name again.
pub(crate) async fn keep(sh: Arc<Shared>) {
    let mut backoff = Duration::from_millis(100);
    // When the current streak of failed publications began, and when it was last reported.
    let mut failing: Option<(tokio::time::Instant, tokio::time::Instant)> = None;
    loop {
        let Some(p) = lock(&sh.publication).clone() else {
            return;
        };
        if matches!(p.state, PublishState::Lost(_)) {
            return;
        }
        let r = if p.lease == 0 {
            Err(None)
        } else {
            keep_lease(&sh, p.lease).await
        };
        // The lease is gone, or etcd failed (the lease may still live: claim with it, and
        // should that fail too, with a new one next time).
        let lease = match r {
            Ok(()) => continue,
            Err(Some(e)) => {
                tracing::debug!("{e}");
                p.lease
            }
            Err(None) => 0,
        };
        match claim(&sh, &p.entry, lease).await {
            Ok(l) => {
                backoff = Duration::from_millis(100);
                sh.set_state(l, PublishState::Live);
                match failing.take() {
                    Some((since, _)) => tracing::warn!(
                        name = %p.entry.name,
                        "directory: published again, after failing for {:?}",
                        since.elapsed()
                    ),
                    None => tracing::info!(name = %p.entry.name, "directory: published again"),
                }
            }
            Err(Error::NameTaken { holder, .. }) => {
                tracing::error!(
                    name = %p.entry.name,
                    "directory: the name was taken while etcd was away, by {holder}; \
                     this engine no longer publishes it"
                );
                sh.set_state(0, PublishState::Lost(holder));
                return;
            }
            Err(e) => {
                sh.publish_failures.fetch_add(1, Ordering::Relaxed);
                let now = tokio::time::Instant::now();
                // Said at once, then every 30 s while it lasts: an engine that cannot publish
                // is unreachable by name, which an operator must see.
                match &mut failing {
                    Some((_, said)) if now.duration_since(*said) < REPORT_EVERY => {
                        tracing::debug!("publishing again: {e}");
                    }
                    Some((since, said)) => {
                        tracing::warn!(name = %p.entry.name, "directory: not published for {:?}: {e}", since.elapsed());
                        *said = now;
                    }
                    None => {
                        tracing::warn!(name = %p.entry.name, "directory: cannot publish: {e}; retrying");
                        failing = Some((now, now));
                    }
                }
                sh.set_state(0, PublishState::Retrying(e.to_string()));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Keeps `lease` alive: a keep-alive every third of the TTL, whether or not the last one was
/// answered yet (a busy etcd answers late; the lease lives as long as requests reach it).
/// A keep-alive the member leaves unanswered for a sixth of the TTL (at most 2 s) ends the
/// stream, and the keeper goes on through the next member, well inside the TTL: a frozen
/// member must not let a healthy engine's entry expire.
/// `Err(None)`: the lease is gone (expired or revoked) or the entry vanished; `Err(Some(e))`:
/// etcd failed, or the member stopped answering.
async fn keep_lease(sh: &Shared, lease: i64) -> std::result::Result<(), Option<Error>> {
    let o = &sh.opts;
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let (mut keeper, mut stream) = sh
        .members
        .request("keeping the lease alive", |mut c| async move {
            c.lease_keep_alive(lease).await
        })
        .await
        .map_err(Some)?;
    let member = sh.members.current();
    let ttl = Duration::from_secs(o.ttl_sec);
    let period = ttl / 3;
    let answer_within = (ttl / 6).clamp(Duration::from_millis(300), Duration::from_secs(2));
    let fail = |why: &dyn std::fmt::Display| Some(failed(o, "keeping the lease alive", why));
    let now = tokio::time::Instant::now();
    let mut next = now + period;
    // Since when a keep-alive waits for its answer (opening the stream sent the first).
    let mut waiting = Some(now);
    loop {
        let overdue = waiting.map_or(next + period, |w| w + answer_within);
        tokio::select! {
            m = stream.message() => match m {
                Ok(Some(m)) if m.ttl() > 0 => {
                    waiting = None;
                    let live = matches!(lock(&sh.publication).as_ref(), Some(p) if p.state == PublishState::Live);
                    if !live {
                        sh.set_state(lease, PublishState::Live);
                    }
                }
                Ok(Some(_)) => return Err(None),
                Ok(None) => return Err(fail(&"the stream ended")),
                Err(e) => return Err(fail(&crate::connect::plain(&e))),
            },
            _ = tokio::time::sleep_until(next) => {
                next += period;
                sh.requests.fetch_add(1, Ordering::Relaxed);
                keeper.keep_alive().await.map_err(|e| fail(&crate::connect::plain(&e)))?;
                waiting.get_or_insert_with(tokio::time::Instant::now);
            }
            _ = tokio::time::sleep_until(overdue), if waiting.is_some() => {
                sh.members.failed(member);
                let why = format!(
                    "member {} left a keep-alive unanswered for {answer_within:?}",
                    o.endpoints.get(member).map_or("?", String::as_str)
                );
                return Err(fail(&why));
            }
            _ = sh.entry_gone.notified() => return Err(None),
        }
    }
}
