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
