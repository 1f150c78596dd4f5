//! The directory under faults an operator meets, against real etcd processes: a frozen
//! member, large values and a prefix of 50k entries, an auth token etcd forgot, one that
//! expired. (Skipped without `etcd` unless HIXL_REQUIRE_ETCD=1.)

use std::time::Duration;

use etcd_client::{Client, Txn, TxnOp};
use hixl_core::options::DirectoryOptions;
use hixl_core::Options;
use hixl_directory::testing::{available, Etcd};
use hixl_directory::{incarnation_hex, table_digest, Directory, Entry, PublishState};

fn opts(url: &str, ttl: u64) -> DirectoryOptions {
    let ttl = ttl.to_string();
    Options::from_pairs([("hixl.Directory", url), ("hixl.DirectoryTtlSec", &ttl)])
        .unwrap()
        .directory
}

fn entry(name: &str, inc: u64) -> Entry {
    Entry {
        v: hixl_directory::ENTRY_VERSION,
        name: name.into(),
        incarnation: incarnation_hex(inc),
        addrs: vec!["127.0.0.1:26000".into()],
        transports: vec!["tcp".into()],
        table_digest: table_digest([]),
        wire: 3,
    }
}

async fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let t0 = tokio::time::Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The create revision of `name`'s key (a new one means the entry vanished and came back).
async fn created(c: &mut Client, name: &str) -> Option<i64> {
    let r = c.get(format!("/hixl/engines/{name}"), None).await.unwrap();
    r.kvs().first().map(|kv| kv.create_revision())
}

/// One member of three frozen in turn (SIGSTOP, as a stuck disk or a GC pause), each for
/// longer than the lease's TTL: the live engine's entry never vanishes (its key keeps its
/// create revision), and new handles open and publish within the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_stalls_nothing_and_no_live_entry_vanishes() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(3);
    let ttl = 4;
    let live = Directory::open(&opts(&etcd.url(), ttl)).await.unwrap();
    live.publish(entry("prefill-live", 1)).await.unwrap();
    let eps: Vec<String> = etcd.url()[7..]
        .split(',')
        .map(|e| format!("http://{e}"))
        .collect();
    for i in 0..3 {
        // etcd's own client, on the members that stay up, to read the key's revision.
        let up: Vec<&String> = (0..3).filter(|&j| j != i).map(|j| &eps[j]).collect();
        let mut reader = Client::connect(up, None).await.unwrap();
        let before = created(&mut reader, "prefill-live").await;
        assert!(
            before.is_some(),
            "member {i}: not published before the freeze"
        );
        etcd.freeze(i);
        // New engines come and go through the frozen member's turn in the rotation.
        for k in 0..3 {
            let t0 = tokio::time::Instant::now();
            let d = Directory::open(&opts(&etcd.url(), ttl))
                .await
                .unwrap_or_else(|e| panic!("member {i} frozen, open {k}: {e}"));
            let name = format!("decode-{i}-{k}");
            d.publish(entry(&name, 10 + k))
                .await
                .unwrap_or_else(|e| panic!("member {i} frozen, publish {k}: {e}"));
            assert!(
                t0.elapsed() < Duration::from_secs(3),
                "member {i} frozen: open and publish took {:?}",
                t0.elapsed()
            );
            d.close().await;
        }
        // Past a whole TTL and more: the live entry was kept alive through another member.
        tokio::time::sleep(Duration::from_secs(ttl + 2)).await;
        let after = created(&mut reader, "prefill-live").await;
        assert_eq!(before, after, "member {i} frozen: the live entry vanished");
        assert_eq!(
            live.publication().unwrap().state,
            PublishState::Live,
            "member {i}"
        );
        etcd.thaw(i);
        etcd.wait_ready();
    }
    // The live handle's own cache, its watch moved off each frozen member in turn.
    until(10, "the live handle lists itself", || {
        live.lookup("prefill-live").is_some()
    })
    .await;
    live.close().await;
}

/// Four values of 1.4 MB under the prefix (each within etcd's limits, together past gRPC's
/// 4 MiB message) and 50k small entries: listings are paged, every real entry is read, and
/// the large values are skipped and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_and_50k_entries_are_listed_in_pages() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let ep = format!("http://{}", &etcd.url()[7..]);
    let mut c = Client::connect([ep], None).await.unwrap();
    let big = vec![b'x'; 1_400_000];
    for i in 0..4 {
        c.put(format!("/hixl/engines/huge-{i}"), big.clone(), None)
            .await
            .unwrap();
    }
    const N: u64 = 50_000;
    let mut n = 0;
    while n < N {
        // etcd takes at most 128 operations a transaction.
        let ops: Vec<TxnOp> = (n..(n + 128).min(N))
            .map(|k| {
                let name = format!("e-{k:05}");
                TxnOp::put(
                    format!("/hixl/engines/{name}"),
                    entry(&name, k + 1).encode(),
                    None,
                )
            })
            .collect();
        n += ops.len() as u64;
        c.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    let d = Directory::open(&opts(&etcd.url(), 10)).await.unwrap();
    assert_eq!(d.len(), N as usize);
    assert_eq!(d.lookup("e-49999").unwrap().incarnation_id(), N);
    let bad = d.unreadable();
    assert_eq!(bad.len(), 4, "{bad:?}");
    for (name, why) in &bad {
        assert!(name.starts_with("huge-"), "{name}");
        assert!(why.contains("1400000 bytes"), "{name}: {why}");
    }
    // A publication and a lookup still work beside them.
    d.publish(entry("prefill-0", 7)).await.unwrap();
    assert_eq!(
        d.resolve_cold("prefill-0").await.unwrap().incarnation_id(),
        7
    );
}

/// etcd with auth on, and tokens that expire after 2 s unused (`--auth-token-ttl`, 300 s by
/// default).
fn etcd_with_auth(ttl: u64) -> (Etcd, DirectoryOptions) {
    etcd_with_auth_flags(ttl, &["--auth-token-ttl=2"])
}

fn etcd_with_auth_flags(ttl: u64, flags: &[&str]) -> (Etcd, DirectoryOptions) {
    let etcd = Etcd::start_with(1, flags);
    let ep = etcd.url()[7..].to_owned();
    let ctl = |args: &[&str]| etcdctl(&ep, args);
    ctl(&["user", "add", "root:rootpw"]);
    ctl(&["user", "add", "hixl:s3cret-pw"]);
    ctl(&["role", "add", "engines"]);
    ctl(&[
        "role",
        "grant-permission",
        "engines",
        "--prefix=true",
        "readwrite",
        "/hixl/engines/",
    ]);
    ctl(&["user", "grant-role", "hixl", "engines"]);
    ctl(&["--user", "root:rootpw", "auth", "enable"]);
    let mut o = opts(&etcd.url(), ttl);
    o.user = Some("hixl".into());
    o.password = Some("s3cret-pw".into());
    (etcd, o)
}

fn etcdctl(ep: &str, args: &[&str]) {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", ep])
        .args(args)
        .output()
        .expect("etcdctl runs (Debian's etcd-client)");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// With auth on and tokens of a 2 s TTL, an engine idle but for its keep-alive stream for
/// longer than that publishes again when its entry goes (deleted here, as an operator or a
/// lost lease would). (etcd 3.4 here keeps such a token alive, so this does not by itself
/// show an expired token renewed; the restart below does show a forgotten one renewed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_deleted_under_an_idle_authenticated_engine_is_republished() {
    if !available() {
        return;
    }
    // A lease of 30 s: its keep-alives go every 10 s, leaving the token unused past its TTL.
    let (etcd, o) = etcd_with_auth(30);
    let d = Directory::open(&o).await.unwrap();
    d.publish(entry("prefill-auth", 3)).await.unwrap();
    let reader = Directory::open(&o).await.unwrap();
    until(5, "listed", || reader.lookup("prefill-auth").is_some()).await;
    // Unused for longer than its TTL, the publisher's token expires.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let ep = etcd.url()[7..].to_owned();
    etcdctl(
        &ep,
        &["--user", "root:rootpw", "del", "/hixl/engines/prefill-auth"],
    );
    until(10, "republished with a fresh token", || {
        reader.lookup("prefill-auth").is_some()
            && d.publication()
                .is_some_and(|p| p.state == PublishState::Live)
    })
    .await;
}

/// With auth on and JWT tokens that expire 2 s after they were issued, however much they are
/// used (etcd's `--auth-token jwt,...,ttl=2s`): once the handles' tokens have expired (seen
/// when a client that authenticated after them is refused), a handle that only read reads
/// again (its token renewed: without the renewal this fails, "invalid auth token"), and the
/// publisher's entry, deleted, is published again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_jwt_is_renewed_and_the_entry_republished() {
    if !available() {
        return;
    }
    let fx = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let jwt = format!(
        "--auth-token=jwt,pub-key={fx}/jwt-test-key.pub.pem,priv-key={fx}/jwt-test-key.pem,sign-method=RS256,ttl=2s"
    );
    let (etcd, o) = etcd_with_auth_flags(60, &[&jwt]);
    let d = Directory::open(&o).await.unwrap();
    d.publish(entry("prefill-jwt", 5)).await.unwrap();
    let reader = Directory::open(&o).await.unwrap();
    until(5, "listed", || reader.lookup("prefill-jwt").is_some()).await;
    let cold = Directory::open(&o).await.unwrap();
    cold.resolve_cold("prefill-jwt").await.unwrap();
    // A client that authenticates after the publisher did, and never renews its token: once
    // etcd refuses it, the publisher's older token has expired too.
    let ep = etcd.url()[7..].to_owned();
    let mut probe = Client::connect(
        [format!("http://{ep}")],
        Some(etcd_client::ConnectOptions::new().with_user("hixl", "s3cret-pw")),
    )
    .await
    .unwrap();
    let t0 = tokio::time::Instant::now();
    while probe.get("/hixl/engines/prefill-jwt", None).await.is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the JWT never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A handle that only read, with the token it authenticated with when it opened: a
    // request now needs it renewed.
    let e = cold.resolve_cold("prefill-jwt").await;
    assert!(e.is_ok(), "a read with an expired token: {e:?}");
    // The key's create revision tells the entry published again from the one deleted.
    let mut root = Client::connect(
        [format!("http://{ep}")],
        Some(
            etcd_client::ConnectOptions::new()
                .with_user("root", "rootpw")
                .with_auto_token_refresh(true),
        ),
    )
    .await
    .unwrap();
    let first = created(&mut root, "prefill-jwt").await.expect("published");
    root.delete("/hixl/engines/prefill-jwt", None)
        .await
        .unwrap();
    let t0 = tokio::time::Instant::now();
    loop {
        let again = created(&mut root, "prefill-jwt").await;
        if again.is_some_and(|r| r > first) && reader.lookup("prefill-jwt").is_some() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not republished: {:?}",
            d.publication().map(|p| p.state)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With etcd auth on, etcd restarted (its tokens forgotten) while an engine publishes: the
/// engine authenticates again and publishes again; the failures meanwhile are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auth_token_etcd_forgot_is_renewed_and_the_entry_republished() {
    if !available() {
        return;
    }
    let (mut etcd, o) = etcd_with_auth(2);
    let d = Directory::open(&o).await.unwrap();
    d.publish(entry("prefill-auth", 3)).await.unwrap();
    // Down until publishing again has failed (seen, and counted); the token the client
    // holds means nothing to the new process.
    etcd.kill(0);
    until(20, "the publication says it is retrying", || {
        d.publication()
            .is_some_and(|p| matches!(p.state, PublishState::Retrying(_)))
    })
    .await;
    etcd.restart(0);
    until(20, "the publication is live again", || {
        d.publication()
            .is_some_and(|p| p.state == PublishState::Live)
    })
    .await;
    assert!(d.publish_failures() > 0);
    // etcd keeps leases across a restart, and a keep-alive needs no permission: revoke the
    // lease (as an operator, or an expiry, would) so that the engine must grant a new one,
    // a request that checks its token.
    let old = d.publication().unwrap().lease;
    let ep = etcd.url()[7..].to_owned();
    etcdctl(
        &ep,
        &[
            "--user",
            "root:rootpw",
            "lease",
            "revoke",
            &format!("{old:x}"),
        ],
    );
    let reader = Directory::open(&o).await.unwrap();
    until(20, "republished under a new lease", || {
        reader.lookup("prefill-auth").is_some()
            && d.publication()
                .is_some_and(|p| p.state == PublishState::Live && p.lease != old)
    })
    .await;
}

/// A quiet watch on a live member is probed for progress and kept: no list or watch is
/// opened again while nothing changes (a member that answers no probe would be left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_watch_on_a_live_member_is_kept() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let d = Directory::open(&opts(&etcd.url(), 10)).await.unwrap();
    // The listing, then the watch.
    until(5, "watching", || d.requests() >= 2).await;
    let before = d.requests();
    // Past two probes (one every 3 s of quiet).
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(d.etcd_reachable());
    assert_eq!(d.requests(), before, "the watch was opened again");
}
