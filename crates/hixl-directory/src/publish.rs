//! Publishing this engine: claiming its name under a lease (refused while another incarnation
//! holds it), keeping the lease alive, and claiming again after etcd comes back or the entry
//! vanished (lease expired while etcd was away, or the key was deleted).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use hixl_core::{Error, Result};

use crate::connect::{failed, request};
use crate::entry::{Entry, Malformed};
use crate::shared::{PublishState, Shared};
use crate::sync::lock;

/// Writes `entry` under its name with `lease` (granting one if `lease` is 0) unless another
/// incarnation holds the name. Returns the lease.
pub(crate) async fn claim(sh: &Shared, entry: &Entry, lease: i64) -> Result<i64> {
    let o = &sh.opts;
    let lease = if lease != 0 {
        lease
    } else {
        let ttl = o.ttl_sec as i64;
        sh.requests.fetch_add(1, Ordering::Relaxed);
        let r = request(o, "granting a lease", || {
            let mut c = sh.client.clone();
            async move { c.lease_grant(ttl, None).await }
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
    let r = request(o, "reading the name's holder", || {
        let (mut c, k) = (sh.client.clone(), key.clone());
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
    if let Err(e) = request(&sh.opts, "revoking the lease", || {
        let mut c = sh.client.clone();
        async move { c.lease_revoke(lease).await }
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
    let held = request(&sh.opts, "reading the entry to delete", || {
        let (mut c, k) = (sh.client.clone(), key.clone());
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
                tracing::info!(name = %p.entry.name, "directory: published again");
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
                tracing::debug!("publishing again: {e}");
                sh.set_state(0, PublishState::Retrying(e.to_string()));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Keeps `lease` alive: a keep-alive every third of the TTL, whether or not the last one was
/// answered yet (a busy etcd answers late; the lease lives as long as requests reach it).
/// `Err(None)`: the lease is gone (expired or revoked) or the entry vanished; `Err(Some(e))`:
/// etcd failed, or answered nothing for a whole TTL.
async fn keep_lease(sh: &Shared, lease: i64) -> std::result::Result<(), Option<Error>> {
    let o = &sh.opts;
    sh.requests.fetch_add(1, Ordering::Relaxed);
    let (mut keeper, mut stream) = request(o, "keeping the lease alive", || {
        let mut c = sh.client.clone();
        async move { c.lease_keep_alive(lease).await }
    })
    .await
    .map_err(Some)?;
    let ttl = Duration::from_secs(o.ttl_sec);
    let period = ttl / 3;
    let fail = |why: &dyn std::fmt::Display| Some(failed(o, "keeping the lease alive", why));
    let mut answered = tokio::time::Instant::now();
    let mut next = answered + period;
    loop {
        tokio::select! {
            m = stream.message() => match m {
                Ok(Some(m)) if m.ttl() > 0 => {
                    answered = tokio::time::Instant::now();
                    let live = matches!(lock(&sh.publication).as_ref(), Some(p) if p.state == PublishState::Live);
                    if !live {
                        sh.set_state(lease, PublishState::Live);
                    }
                }
                Ok(Some(_)) => return Err(None),
                Ok(None) => return Err(fail(&"the stream ended")),
                Err(e) => return Err(fail(&e)),
            },
            _ = tokio::time::sleep_until(next) => {
                if answered.elapsed() >= ttl {
                    return Err(fail(&format!("no answer for a whole TTL ({ttl:?})")));
                }
                next += period;
                sh.requests.fetch_add(1, Ordering::Relaxed);
                keeper.keep_alive().await.map_err(|e| fail(&e))?;
            }
            _ = sh.entry_gone.notified() => return Err(None),
        }
    }
}
