//! The directory against a real etcd (started on free loopback ports; skipped without `etcd`
//! unless HIXL_REQUIRE_ETCD=1).

use std::time::Duration;

use hixl_core::options::DirectoryOptions;
use hixl_core::{Error, Options};
use hixl_directory::testing::{available, Etcd};
use hixl_directory::{incarnation_hex, table_digest, Change, Directory, Entry, PublishState};

fn opts(url: &str, ttl: u64) -> DirectoryOptions {
    let ttl = ttl.to_string();
    Options::from_pairs([("hixl.Directory", url), ("hixl.DirectoryTtlSec", &ttl)])
        .unwrap()
        .directory
}

fn entry(name: &str, inc: u64, port: u16) -> Entry {
    Entry {
        v: hixl_directory::ENTRY_VERSION,
        name: name.into(),
        incarnation: incarnation_hex(inc),
        addrs: vec![format!("127.0.0.1:{port}")],
        transports: vec!["tcp".into()],
        table_digest: table_digest([]),
        wire: 3,
    }
}

/// Waits (up to `secs`) until `f` holds.
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

#[tokio::test]
async fn publish_lookup_watch_close() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let o = opts(&etcd.url(), 5);
    let a = Directory::open(&o).await.unwrap();
    let b = Directory::open(&o).await.unwrap();
    let mut changes = b.changes();
    a.publish(entry("prefill-0", 1, 26000)).await.unwrap();
    // The watcher sees it without a round trip; a cold lookup reads etcd.
    match changes.recv().await.unwrap() {
        Change::Added(e) => assert_eq!(e.name, "prefill-0"),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.lookup("prefill-0").unwrap().incarnation_id(), 1);
    assert_eq!(
        b.resolve_cold("prefill-0").await.unwrap().addrs,
        ["127.0.0.1:26000"]
    );
    let e = b.resolve("nobody").await.unwrap_err();
    assert!(matches!(e, Error::UnknownName { .. }), "{e}");
    assert!(
        e.to_string().contains("nobody") && e.to_string().contains(&etcd.url()[7..]),
        "{e}"
    );
    // Updating the digest reaches the watcher as an update of the same incarnation.
    let mut e2 = entry("prefill-0", 1, 26000);
    e2.table_digest = table_digest([(4096, 8192)]);
    a.update(e2.clone()).await;
    assert!(matches!(changes.recv().await.unwrap(), Change::Updated(e) if e == e2));
    // A clean close deletes the entry at once (no TTL wait).
    a.close().await;
    assert!(matches!(changes.recv().await.unwrap(), Change::Removed(e) if e.name == "prefill-0"));
    assert!(b.lookup("prefill-0").is_none());
}

#[tokio::test]
async fn a_second_live_claim_is_refused_naming_the_holder() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let o = opts(&etcd.url(), 5);
    let a = Directory::open(&o).await.unwrap();
    let b = Directory::open(&o).await.unwrap();
    a.publish(entry("decode-1", 0xaa, 26001)).await.unwrap();
    let e = b.publish(entry("decode-1", 0xbb, 26002)).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::NameTaken { .. }), "{msg}");
    assert!(
        msg.contains("decode-1")
            && msg.contains("00000000000000aa")
            && msg.contains("127.0.0.1:26001"),
        "{msg}"
    );
    // The holder is untouched.
    assert_eq!(
        b.resolve_cold("decode-1").await.unwrap().incarnation_id(),
        0xaa
    );
}

#[tokio::test]
async fn a_dropped_handle_expires_with_its_lease_and_the_name_is_free_again() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let o = opts(&etcd.url(), 2);
    let watcher = Directory::open(&o).await.unwrap();
    let a = Directory::open(&o).await.unwrap();
    a.publish(entry("p", 1, 26000)).await.unwrap();
    until(5, "watcher sees p", || watcher.lookup("p").is_some()).await;
    // Dropping without close is what a killed process leaves: keep-alives stop.
    drop(a);
    let t0 = tokio::time::Instant::now();
    until(10, "p expires", || watcher.lookup("p").is_none()).await;
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "gone after {took:?} with a TTL of 2 s"
    );
    let c = Directory::open(&o).await.unwrap();
    c.publish(entry("p", 2, 26003)).await.unwrap();
}

#[tokio::test]
async fn etcd_restart_keeps_the_cache_and_republishes() {
    if !available() {
        return;
    }
    let mut etcd = Etcd::start(1);
    let o = opts(&etcd.url(), 3);
    let a = Directory::open(&o).await.unwrap();
    let b = Directory::open(&o).await.unwrap();
    a.publish(entry("p", 1, 26000)).await.unwrap();
    until(5, "b sees p", || b.lookup("p").is_some()).await;
    etcd.kill(0);
    // Lookups go on from the cache; the publication says it is retrying.
    until(15, "a notices etcd is gone", || {
        matches!(a.publication().unwrap().state, PublishState::Retrying(_))
    })
    .await;
    assert!(b.lookup("p").is_some());
    assert!(b.resolve("p").await.is_ok());
    // Down longer than the TTL: the lease may have expired; either way it is published again.
    tokio::time::sleep(Duration::from_secs(4)).await;
    etcd.restart(0);
    until(20, "a publishes again", || {
        a.publication().unwrap().state == PublishState::Live
    })
    .await;
    until(20, "b's watch is back", || b.etcd_reachable()).await;
    let c = Directory::open(&o).await.unwrap();
    assert_eq!(c.resolve_cold("p").await.unwrap().incarnation_id(), 1);
}

#[tokio::test]
async fn one_member_of_three_killed_changes_nothing() {
    if !available() {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter("hixl_directory=debug")
        .with_test_writer()
        .try_init();
    let mut etcd = Etcd::start(3);
    let o = opts(&etcd.url(), 3);
    let a = Directory::open(&o).await.unwrap();
    let b = Directory::open(&o).await.unwrap();
    a.publish(entry("p", 1, 26000)).await.unwrap();
    until(5, "b sees p", || b.lookup("p").is_some()).await;
    etcd.kill(0);
    // New publications and cold lookups still work; the lease is kept past its TTL.
    let c = Directory::open(&o).await.unwrap();
    c.publish(entry("q", 2, 26001)).await.unwrap();
    until(10, "b sees q", || b.lookup("q").is_some()).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(b.resolve_cold("p").await.unwrap().incarnation_id(), 1);
    assert_eq!(a.publication().unwrap().state, PublishState::Live);
}

#[tokio::test]
async fn bad_input_is_refused_and_named() {
    if !available() {
        return;
    }
    // Nothing listens there.
    let o = opts("etcd://127.0.0.1:1", 5);
    let e = Directory::open(&o).await.unwrap_err();
    assert!(
        matches!(e, Error::Directory { .. }) && e.to_string().contains("127.0.0.1:1"),
        "{e}"
    );
    // A malformed entry written by someone else: skipped by the cache, named on lookup.
    let etcd = Etcd::start(1);
    let o = opts(&etcd.url(), 5);
    let d = Directory::open(&o).await.unwrap();
    let status = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &etcd.url()[7..],
            "put",
            "/hixl/engines/evil",
            "{\"v\":1,\"rkeys\":[7]}",
        ])
        .status()
        .expect("etcdctl runs (Debian's etcd-client)");
    assert!(status.success());
    until(5, "the cache saw it", || d.malformed("evil").is_some()).await;
    assert!(d.lookup("evil").is_none() && d.entries().is_empty());
    let e = d.resolve("evil").await.unwrap_err().to_string();
    assert!(
        e.contains("/hixl/engines/evil") && e.contains("not a hixl entry"),
        "{e}"
    );
}

#[tokio::test]
async fn etcd_users_are_honoured_and_a_refusal_is_named() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let ep = etcd.url()[7..].to_owned();
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &ep])
            .args(args)
            .output()
            .expect("etcdctl runs (Debian's etcd-client)");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
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
    let with = |user: &str, pw: &str| {
        let mut o = opts(&etcd.url(), 5);
        o.user = Some(user.into());
        o.password = Some(pw.into());
        o
    };
    // The right user publishes and looks up.
    let d = Directory::open(&with("hixl", "s3cret-pw")).await.unwrap();
    d.publish(entry("p", 1, 26000)).await.unwrap();
    assert_eq!(d.resolve_cold("p").await.unwrap().incarnation_id(), 1);
    // A wrong password, or no user at all, is refused with etcd's reason; the password is
    // never shown.
    let e = Directory::open(&with("hixl", "wrong-pw"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("authentication failed") && !e.contains("wrong-pw"),
        "{e}"
    );
    let e = Directory::open(&opts(&etcd.url(), 5))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("user name is empty") || e.contains("permission denied"),
        "{e}"
    );
}

#[tokio::test]
async fn a_close_right_after_etcd_returns_deletes_the_entry() {
    if !available() {
        return;
    }
    let mut etcd = Etcd::start(1);
    let o = opts(&etcd.url(), 10);
    let a = Directory::open(&o).await.unwrap();
    a.publish(entry("p", 1, 26000)).await.unwrap();
    etcd.kill(0);
    until(15, "a notices etcd is gone", || {
        matches!(a.publication().unwrap().state, PublishState::Retrying(_))
    })
    .await;
    // etcd keeps the entry and its 10 s lease across the restart; the handle closes before
    // its keeper has taken the lease back.
    etcd.restart(0);
    a.close().await;
    let b = Directory::open(&o).await.unwrap();
    let e = b.resolve_cold("p").await.unwrap_err();
    assert!(matches!(e, Error::UnknownName { .. }), "{e}");
}
