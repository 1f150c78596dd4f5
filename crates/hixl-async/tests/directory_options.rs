//! An engine's directory options, refused before anything starts (no etcd needed).

use hixl_async::Engine;
use hixl_core::Error;

#[tokio::test]
async fn a_name_without_a_directory_is_refused() {
    let e = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .option("hixl.Name", "prefill-0")
        .build()
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::InvalidOption { .. }), "{msg}");
    assert!(
        msg.contains("hixl.Name") && msg.contains("hixl.Directory"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_unreachable_directory_is_named_and_nothing_listens() {
    // Port 1 on loopback: nothing listens, the connect is refused at once.
    let e = Engine::builder("127.0.0.1:0")
        .option("hixl.Directory", "etcd://127.0.0.1:1")
        .option("hixl.Name", "prefill-0")
        .build()
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Directory { .. }), "{msg}");
    assert!(msg.contains("etcd://127.0.0.1:1"), "{msg}");
    // in words, not the client's debug text
    assert!(msg.contains("Connection refused"), "{msg}");
    assert!(!msg.contains("tonic::") && !msg.contains("Os {"), "{msg}");
}

#[tokio::test]
async fn connect_named_needs_a_directory() {
    let engine = Engine::builder("127.0.0.1").build().await.unwrap();
    let e = engine
        .connect_named("prefill-0", std::time::Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("needs a directory"), "{e}");
    // Without a directory a bare word stays an address, refused as one.
    let e = engine
        .connect("prefill-0", std::time::Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidAddress { .. }), "{e}");
}

/// The publication's state and its failed attempts are in the engine's metrics: live, then,
/// with etcd gone, retrying with the failures counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publication_and_its_failures_are_in_the_metrics() {
    if !hixl_directory::testing::available() {
        return;
    }
    let mut etcd = hixl_directory::testing::Etcd::start(1);
    let e = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .option("hixl.Directory", etcd.url())
        .option("hixl.Name", "prefill-m")
        .option("hixl.DirectoryTtlSec", "2")
        .build()
        .await
        .unwrap();
    let line = |m: &str, series: &str| {
        m.lines()
            .find(|l| l.starts_with(series))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let m = e.metrics_text();
    let published = line(&m, "hixl_directory_published{");
    assert!(
        published.ends_with("name=\"prefill-m\",state=\"live\"} 1"),
        "{m}"
    );
    assert!(
        line(&m, "hixl_directory_publish_failures_total{").ends_with("} 0"),
        "{m}"
    );
    etcd.kill(0);
    let t0 = std::time::Instant::now();
    loop {
        let m = e.metrics_text();
        let failures = line(&m, "hixl_directory_publish_failures_total{");
        if line(&m, "hixl_directory_published{").ends_with("state=\"retrying\"} 0")
            && !failures.ends_with("} 0")
        {
            break;
        }
        assert!(t0.elapsed().as_secs() < 30, "{m}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    e.shutdown(std::time::Duration::from_millis(200)).await;
}
