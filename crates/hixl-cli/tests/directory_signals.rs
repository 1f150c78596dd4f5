//! `hixl serve --name` under what operators do to it, against a real etcd: SIGTERM (what
//! Kubernetes, systemd and `docker stop` send) and SIGINT, even the instant it is ready, take
//! the entry out at once; names are used exactly as given or refused; `hixl info` finds a peer
//! by name. (Skipped without `etcd` unless HIXL_REQUIRE_ETCD=1.)

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hixl::Engine;
use hixl_cli::child::Target;
use hixl_directory::testing::{available, Etcd};

const TTL: &str = "hixl.DirectoryTtlSec=30";

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hixl"))
}

async fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < within, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    t0.elapsed()
}

/// `hixl serve --name NAME` without `--stdin-control`: only a signal stops it.
fn serve(etcd: &Etcd, name: &str) -> Target {
    Target::spawn_with(
        exe(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--mem",
            "4096",
            "--directory",
            &etcd.url(),
            "--name",
            name,
            "--option",
            TTL,
        ],
    )
    .unwrap_or_else(|e| panic!("serve {name}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_a_signal_the_instant_it_is_ready_withdraw_the_entry_at_once() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let e = Engine::builder("127.0.0.1")
        .option("hixl.Directory", etcd.url())
        .build()
        .await
        .unwrap();
    let d = e.directory().unwrap();
    // SIGTERM after a while: the engine shuts down cleanly (exit 0, not killed by the signal)
    // and its entry goes at once, far inside its 30 s lease.
    let mut t = serve(&etcd, "prefill-term");
    until("listed", Duration::from_secs(5), || {
        d.lookup("prefill-term").is_some()
    })
    .await;
    let st = t.signal(libc::SIGTERM, Duration::from_secs(5)).unwrap();
    assert!(st.success(), "SIGTERM: {st:?}");
    let gone = until("withdrawn", Duration::from_secs(5), || {
        d.lookup("prefill-term").is_none()
    })
    .await;
    assert!(gone < Duration::from_secs(2), "withdrawn after {gone:?}");
    // A signal the instant READY is printed: every engine still goes through its shutdown.
    for i in 0..20 {
        let name = format!("decode-{i}");
        let mut t = serve(&etcd, &name);
        let sig = if i % 2 == 0 {
            libc::SIGINT
        } else {
            libc::SIGTERM
        };
        let st = t.signal(sig, Duration::from_secs(5)).unwrap();
        assert!(
            st.success(),
            "engine {i} on signal {sig}: {st:?} (signal {:?})",
            st.signal()
        );
    }
    // None of them left an entry behind for its lease's 30 s.
    let left = Command::new(exe())
        .args(["peers", "--directory", &etcd.url()])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&left.stdout);
    assert!(listing.starts_with("0 engine(s)"), "{listing}");
    e.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_is_used_as_given_or_refused_naming_it() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    for (name, says) in [
        ("", "cannot be empty"),
        ("  ", "' ' is not allowed"),
        ("prefill-0\t", "'\\t' is not allowed"),
        ("prefill-0\u{85}", "'\\u{85}' is not allowed"),
    ] {
        // (--stdin-control with no input: a name accepted serves, then exits 0 at once)
        let out = Command::new(exe())
            .args(["serve", "--listen", "127.0.0.1:0", "--mem", "4096"])
            .args([
                "--directory",
                &etcd.url(),
                "--name",
                name,
                "--stdin-control",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name:?} was accepted");
        assert!(err.contains(says), "{name:?}: {err}");
    }
    let listing = Command::new(exe())
        .args(["peers", "--directory", &etcd.url()])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.starts_with("0 engine(s)"), "{listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_finds_a_peer_by_name_through_the_directory() {
    if !available() {
        return;
    }
    let etcd = Etcd::start(1);
    let t = serve(&etcd, "prefill-info");
    let out = Command::new(exe())
        .args(["info", "--peer", "prefill-info", "--directory", &etcd.url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("peer prefill-info: "), "{text}");
    drop(t);
}
