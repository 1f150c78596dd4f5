//! Engines by name through a real etcd: `hixl serve --name` targets in their own processes,
//! an engine here that finds them through the directory. (Skipped without `etcd` unless
//! HIXL_REQUIRE_ETCD=1.)

use std::path::Path;
use std::time::{Duration, Instant};

use hixl::{Access, Engine, Error, HostBuffer, OpDesc, TransferOp};
use hixl_cli::child::Target;
use hixl_cli::util::{checksum, fill_pattern};
use hixl_directory::testing::{available, Etcd};

const T: Duration = Duration::from_secs(10);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hixl"))
}

/// A `hixl serve` published as `name`, with a lease of `ttl` seconds.
fn serve(etcd: &Etcd, name: &str, ttl: u64) -> Result<Target, String> {
    let url = etcd.url();
    let ttl = format!("hixl.DirectoryTtlSec={ttl}");
    Target::spawn(
        exe(),
        1 << 20,
        &["--directory", &url, "--name", name, "--option", &ttl],
    )
    .map_err(|e| e.0)
}

async fn until(what: &str, secs: u64, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t0.elapsed()
}

/// Writes a pattern into the peer's region `kv` and has the target verify it.
async fn write_verified(e: &Engine, peer: &str, target: &mut Target, seed: u64) {
    let mut buf = HostBuffer::zeroed(64 << 10).unwrap();
    fill_pattern(buf.as_mut_slice(), seed);
    let sum = checksum(buf.as_slice());
    let local = e.register_with(buf, Access::LOCAL, None).unwrap();
    let p = e.peer_or_connect(peer).await.unwrap();
    let remote = p.region("kv").unwrap();
    e.transfer(
        peer,
        TransferOp::Write,
        &[OpDesc::new(local.addr(), remote.addr, 64 << 10)],
    )
    .await
    .unwrap();
    p.notify("hixl.verify", format!("0 {} {sum}", 64 << 10))
        .await
        .unwrap();
    let v = target.wait_line("VERIFY", T).unwrap();
    assert!(v.contains("ok"), "{v}");
    e.deregister(&local).await.unwrap();
}

fn peers_listing(etcd: &Etcd) -> String {
    let out = std::process::Command::new(exe())
        .args(["peers", "--directory", &etcd.url()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_find_each_other_by_name_through_etcd() {
    if !available() {
        return;
    }
    let mut etcd = Etcd::start(1);
    let mut p0 = serve(&etcd, "prefill-0", 2).unwrap();
    let inc0 = p0.ready_field("incarnation").unwrap().to_owned();
    // The initiator: AutoConnect, and a heartbeat slow enough that only the directory can
    // tell it the peer was replaced.
    let e = Engine::builder("127.0.0.1")
        .option("hixl.Directory", etcd.url())
        .option("AutoConnect", "1")
        .option("hixl.HeartbeatMissLimit", "60")
        .build()
        .await
        .unwrap();
    let d = e.directory().unwrap();
    until("the cache has prefill-0", 5, || {
        d.lookup("prefill-0").is_some()
    })
    .await;

    // Connect by name: the same link as by address, to the incarnation the entry names.
    let peer = e.connect_named("prefill-0", T).await.unwrap();
    assert_eq!(format!("{:016x}", peer.incarnation()), inc0);
    assert_eq!(peer.name(), p0.engine);
    write_verified(&e, "prefill-0", &mut p0, 1).await;
    let listing = peers_listing(&etcd);
    assert!(
        listing.contains("prefill-0") && listing.contains(&inc0),
        "{listing}"
    );

    // A second live engine cannot take the name; the refusal names the holder.
    let dup = std::process::Command::new(exe())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--mem",
            "4096",
            "--directory",
            &etcd.url(),
        ])
        .args(["--name", "prefill-0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&dup.stderr);
    assert!(!dup.status.success(), "{err}");
    assert!(
        err.contains("\"prefill-0\" is taken") && err.contains(&inc0),
        "{err}"
    );
    let e2 = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .option("hixl.Directory", etcd.url())
        .option("hixl.Name", "prefill-0")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(e2, Error::NameTaken { .. }), "{e2}");
    assert!(
        e2.to_string().contains(&inc0) && e2.to_string().contains(&p0.engine),
        "{e2}"
    );

    // Frozen (SIGSTOP): its lease expires, a new incarnation takes the name, and the link to
    // the old one ends with a reason that says so; AutoConnect reaches the new one.
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(p0.pid as i32, libc::SIGSTOP) };
    let gone = until("the frozen entry expires", 10, || {
        d.lookup("prefill-0").is_none()
    })
    .await;
    assert!(
        gone < Duration::from_secs(5),
        "expired after {gone:?} with a TTL of 2 s"
    );
    let mut p1 = serve(&etcd, "prefill-0", 10).unwrap();
    let inc1 = p1.ready_field("incarnation").unwrap().to_owned();
    assert_ne!(inc0, inc1);
    until("the link to the replaced engine ends", 5, || {
        !peer.is_connected()
    })
    .await;
    let why = peer.error().unwrap().to_string();
    assert!(
        why.contains("replaced") && why.contains(&inc1) && why.contains(&inc0),
        "{why}"
    );
    write_verified(&e, "prefill-0", &mut p1, 2).await;
    let now = e.peer("prefill-0").unwrap();
    assert_eq!(format!("{:016x}", now.incarnation()), inc1);
    p0.kill();

    // etcd down: the link and its transfers carry on; a new engine still resolves the name
    // from the cache of... its own directory cannot open, but this one's cache serves.
    etcd.kill(0);
    write_verified(&e, "prefill-0", &mut p1, 3).await;
    e.disconnect("prefill-0").await.unwrap();
    let again = e.connect_named("prefill-0", T).await.unwrap();
    assert_eq!(format!("{:016x}", again.incarnation()), inc1);
    etcd.restart(0);
    // The target republishes (its lease of 10 s may have lived through): it is listed.
    let t0 = Instant::now();
    loop {
        let l = peers_listing(&etcd);
        if l.contains(&inc1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "not republished: {l}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A clean shutdown deletes the entry at once, well inside its 10 s lease.
    until("the watch is back", 20, || d.etcd_reachable()).await;
    until("the cache has it", 20, || d.lookup("prefill-0").is_some()).await;
    p1.stop();
    let gone = until("the entry is deleted", 5, || {
        d.lookup("prefill-0").is_none()
    })
    .await;
    assert!(gone < Duration::from_secs(2), "deleted after {gone:?}");
    let e3 = e.connect_named("prefill-0", T).await.unwrap_err();
    assert!(matches!(e3, Error::UnknownName { .. }), "{e3}");
    e.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_engine_disappears_within_its_lease() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let mut t = serve(&etcd, "decode-0", 2).unwrap();
    let e = Engine::builder("127.0.0.1")
        .option("hixl.Directory", etcd.url())
        .build()
        .await
        .unwrap();
    let d = e.directory().unwrap();
    until("listed", 5, || d.lookup("decode-0").is_some()).await;
    t.kill(); // SIGKILL: no goodbye, no revoke
    let gone = until("expired", 10, || d.lookup("decode-0").is_none()).await;
    // The lease's TTL is 2 s, plus etcd's expiry check (every 500 ms).
    assert!(gone < Duration::from_secs(4), "gone after {gone:?}");
    let listing = peers_listing(&etcd);
    assert!(listing.starts_with("0 engine(s)"), "{listing}");
    e.shutdown(Duration::from_secs(1)).await;
}
