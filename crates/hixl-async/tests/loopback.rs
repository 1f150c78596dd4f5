//! Two engines in one process over 127.0.0.1: the API's behaviour end to end.

use std::time::Duration;

use futures::StreamExt;
use hixl_async::{Engine, HostBuffer};
use hixl_core::{Error, OpDesc, Status, TransferStatus};

const T: Duration = Duration::from_secs(5);

async fn pair(
    len: usize,
) -> (
    Engine,
    Engine,
    hixl_async::Region,
    hixl_async::Region,
    hixl_async::Peer,
) {
    let target = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .build()
        .await
        .unwrap();
    let remote = target
        .register_with(
            HostBuffer::zeroed(len).unwrap(),
            hixl_core::Access::REMOTE_RW,
            Some("kv"),
        )
        .unwrap();
    let init = Engine::builder("127.0.0.1").build().await.unwrap();
    let local = init.register(HostBuffer::zeroed(len).unwrap()).unwrap();
    let peer = init.connect(target.local_engine(), T).await.unwrap();
    (target, init, remote, local, peer)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_round_trip() {
    let len = 8 << 20;
    let (_t, _i, remote, local, peer) = pair(len).await;
    let rr = peer.region("kv").unwrap();
    assert_eq!(rr.len, len as u64);
    let data = pattern(len, 7);
    local.write_at(0, &data).unwrap();
    let block = 128 << 10;
    let descs: Vec<OpDesc> = (0..len / block)
        .map(|i| {
            OpDesc::new(
                local.addr() + (i * block) as u64,
                rr.addr + (i * block) as u64,
                block as u64,
            )
        })
        .collect();
    peer.write(&descs).await.unwrap();
    let mut got = vec![0u8; len];
    remote.read_at(0, &mut got).unwrap();
    assert!(got == data, "remote memory differs after write");
    local.write_at(0, &vec![0u8; len]).unwrap();
    peer.read(&descs).await.unwrap();
    local.read_at(0, &mut got).unwrap();
    assert!(got == data, "local memory differs after read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_arrives_after_data() {
    let (t, _i, remote, local, peer) = pair(1 << 20).await;
    let rr = peer.region("kv").unwrap();
    local.write_at(0, &[42u8; 4096]).unwrap();
    let mut notes = t.notifications();
    peer.write(&[OpDesc::new(local.addr(), rr.addr, 4096)])
        .await
        .unwrap();
    peer.notify("cache_ready", "block_0").await.unwrap();
    let n = notes.next().await.unwrap();
    assert_eq!(n.name, b"cache_ready");
    let mut b = [0u8; 4096];
    remote.read_at(0, &mut b).unwrap();
    assert_eq!(b, [42u8; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_named_values() {
    let (t, i, _remote, local, peer) = pair(1 << 20).await;
    let rr = peer.region("kv").unwrap();
    // remote out of bounds
    let e = peer
        .write(&[OpDesc::new(local.addr(), rr.addr + rr.len - 10, 20)])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::RemoteOutOfBounds { .. }), "{e}");
    assert_eq!(e.status(), Status::ParamInvalid);
    // local unregistered
    let e = peer
        .write(&[OpDesc::new(0x10, rr.addr, 20)])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::LocalUnregistered { .. }), "{e}");
    // zero length / null
    assert!(matches!(
        peer.write(&[OpDesc::new(local.addr(), rr.addr, 0)]).await,
        Err(Error::ZeroLength { .. })
    ));
    assert!(matches!(
        peer.write(&[OpDesc::new(local.addr(), 0, 1)]).await,
        Err(Error::NullAddress { .. })
    ));
    // duplicate connect
    let e = i.connect(t.local_engine(), T).await.unwrap_err();
    assert_eq!(e.status(), Status::AlreadyConnected);
    // connect to self
    let e = t.connect(t.local_engine(), T).await.unwrap_err();
    assert!(matches!(e, Error::ConnectToSelf { .. }), "{e}");
    // unknown peer
    let e = i
        .transfer("127.0.0.1:1", hixl_core::TransferOp::Write, &[])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Status::NotConnected);
    // notify too long
    let e = peer.notify(vec![b'x'; 1025], "m").await.unwrap_err();
    assert!(matches!(e, Error::NotifyTooLong { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_transfers_and_status() {
    let (_t, _i, _remote, local, peer) = pair(4 << 20).await;
    let rr = peer.region("kv").unwrap();
    let mut v = Vec::new();
    for k in 0..1000u64 {
        let off = (k % 1024) * 4096;
        v.push(peer.write(&[OpDesc::new(local.addr() + off, rr.addr + off, 4096)]));
    }
    let st = v[999].status();
    assert!(matches!(
        st,
        TransferStatus::Waiting | TransferStatus::Completed
    ));
    for r in futures::future::join_all(v).await {
        r.unwrap();
    }
}
