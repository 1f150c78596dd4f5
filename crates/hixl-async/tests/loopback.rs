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
    pair_over(len, "auto").await
}

/// Target and initiator in this process; `transport` is the initiator's `hixl.Transport`
/// (`auto` picks the fabric, since both are on this host).
async fn pair_over(
    len: usize,
    transport: &str,
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
    let init = Engine::builder("127.0.0.1")
        .option("hixl.Transport", transport)
        .build()
        .await
        .unwrap();
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
async fn bad_input_is_refused_with_named_values_tcp() {
    bad_input_is_refused_with_named_values("tcp").await
}

#[cfg(feature = "fabric")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_named_values_fabric() {
    bad_input_is_refused_with_named_values("fabric").await
}

async fn bad_input_is_refused_with_named_values(transport: &str) {
    let (t, i, _remote, local, peer) = pair_over(1 << 20, transport).await;
    assert!(
        peer.transport().starts_with(transport),
        "{}",
        peer.transport()
    );
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

/// A peer that completes the handshake and then never answers a data request.
async fn stalled_peer() -> String {
    use bytes::BytesMut;
    use hixl_core::wire::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut keep = Vec::new();
        while let Ok((mut s, _)) = l.accept().await {
            let mut b = [0u8; 512];
            let n = s.read(&mut b).await.unwrap_or(0);
            let data = matches!(
                Message::decode(&mut BytesMut::from(&b[..n])),
                Ok(Some(Message::Hello {
                    channel: hixl_core::wire::Channel::Data,
                    ..
                }))
            );
            let mut out = BytesMut::new();
            Message::Welcome {
                engine: "stalled".into(),
                session: 1,
                incarnation: 0x1ca7,
                features: hixl_core::wire::FEATURES,
            }
            .encode(&mut out);
            if !data {
                Message::MemTable(vec![hixl_core::RemoteRegion {
                    addr: 0x10000,
                    len: 1 << 20,
                    rkey: 1,
                    access: hixl_core::Access::REMOTE_RW,
                    kind: hixl_core::MemKind::Host,
                    name: Some("kv".into()),
                }])
                .encode(&mut out);
            }
            let _ = s.write_all(&out).await;
            keep.push(s); // never read again, never answer
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_is_honoured_and_the_abandoned_op_is_reaped_when_the_link_goes() {
    let addr = stalled_peer().await;
    let init = Engine::builder("127.0.0.1").build().await.unwrap();
    let local = init.register(HostBuffer::zeroed(1 << 20).unwrap()).unwrap();
    let peer = init.connect(&addr, T).await.unwrap();
    let t = peer
        .read(&[OpDesc::new(local.addr(), 0x10000, 4096)])
        .timeout(Duration::from_millis(200));
    let e = t.await.unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert_eq!(e.status(), Status::Timeout);
    // The read may still land: the op keeps its lease on `local` until the link proves
    // otherwise, so deregistering must wait for it.
    assert_eq!(init.ops_in_flight(), 1);
    let dereg = tokio::spawn({
        let init = init.clone();
        let local = local.clone();
        async move { init.deregister(&local).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !dereg.is_finished(),
        "deregister returned while a read could still land"
    );
    init.disconnect(&addr).await.unwrap();
    let buf = tokio::time::timeout(T, dereg)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(buf.is_some());
    // the failed part's completion reaches the op table through the reactor, just after
    for _ in 0..200 {
        if init.ops_in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(init.ops_in_flight(), 0, "abandoned op never reaped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_queue_full_is_resource_exhausted_until_drained() {
    let (t, _i, _remote, _local, peer) = pair(4096).await;
    for k in 0..hixl_core::NOTIFY_MAX_PENDING {
        peer.notify("n", k.to_string()).await.unwrap();
    }
    let e = peer.notify("n", "one too many").await.unwrap_err();
    assert!(matches!(e, Error::NotifyQueueFull { .. }), "{e}");
    assert_eq!(e.status(), Status::ResourceExhausted);
    let got = t.take_notifies();
    assert_eq!(got.len(), hixl_core::NOTIFY_MAX_PENDING);
    assert_eq!(got[17].msg, b"17");
    peer.notify("n", "room again").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_after_shutdown_and_registration_rules() {
    let (t, i, _remote, local, peer) = pair(1 << 20).await;
    // same range again: same handle; partial overlap: refused, naming both ranges
    let raw = vec![0u8; 8192];
    let a = raw.as_ptr() as u64;
    // SAFETY: `raw` outlives the engine's use of it (deregistered below).
    let r1 = unsafe {
        i.register_raw(
            hixl_core::MemDesc::new(a, 8192),
            hixl_core::MemKind::Host,
            hixl_core::Access::LOCAL,
            None,
        )
    }
    .unwrap();
    // SAFETY: as above.
    let r2 = unsafe {
        i.register_raw(
            hixl_core::MemDesc::new(a, 8192),
            hixl_core::MemKind::Host,
            hixl_core::Access::LOCAL,
            None,
        )
    }
    .unwrap();
    assert_eq!(r1.id(), r2.id());
    // SAFETY: refused before any use.
    let e = unsafe {
        i.register_raw(
            hixl_core::MemDesc::new(a + 4096, 8192),
            hixl_core::MemKind::Host,
            hixl_core::Access::LOCAL,
            None,
        )
    }
    .unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // SAFETY: refused before any use.
    let e = unsafe {
        i.register_raw(
            hixl_core::MemDesc::new(a, 8192),
            hixl_core::MemKind::Device,
            hixl_core::Access::LOCAL,
            None,
        )
    }
    .unwrap_err();
    assert_eq!(e.status(), Status::Unsupported);
    assert!(i.deregister(&r1).await.unwrap().is_none());
    assert!(
        i.deregister(&r1).await.unwrap().is_none(),
        "second deregister is a no-op"
    );
    drop(raw);
    // the target goes away: the initiator's link reports it, the engine stays usable
    t.shutdown(Duration::from_secs(1)).await;
    for _ in 0..200 {
        if !peer.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !peer.is_connected(),
        "the target's finalize was not noticed"
    );
    let rr = peer.regions()[0].clone();
    let e = peer
        .write(&[OpDesc::new(local.addr(), rr.addr, 16)])
        .await
        .unwrap_err();
    assert!(e.to_string().contains(peer.name()), "{e}");
    i.shutdown(Duration::from_secs(1)).await;
    let e = i
        .transfer(
            peer.name(),
            hixl_core::TransferOp::Write,
            &[OpDesc::new(local.addr(), rr.addr, 16)],
        )
        .await
        .unwrap_err();
    // After shutdown (HIXL's Finalize) every call is refused with FAILED, as HIXL answers.
    assert!(matches!(e, hixl_core::Error::ShutDown { .. }), "{e}");
    assert_eq!(e.status(), Status::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_registered_after_connect_become_visible() {
    let (t, _i, _remote, _local, peer) = pair(4096).await;
    assert_eq!(peer.regions().len(), 1);
    let r = t
        .register_with(
            HostBuffer::zeroed(8192).unwrap(),
            hixl_core::Access::REMOTE_READ,
            Some("late"),
        )
        .unwrap();
    // Synced by its range, as a side that learnt of it out of band does: at once when the
    // table holds it, else after one round trip that brings the update.
    peer.sync_regions(&[(r.addr(), 8192), (r.addr() + 4096, 4096)], T)
        .await
        .unwrap();
    assert_eq!(peer.region("late").map(|x| x.len), Some(8192));
    // A range no region holds is named (by its index) after the sync: nothing was in flight.
    let e = peer
        .sync_regions(&[(r.addr(), 8192), (r.addr() + 4096, 8192)], T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::RemoteOutOfBounds {
                index: 1,
                len: 8192,
                ..
            }
        ),
        "{e}"
    );
    t.deregister(&r).await.unwrap();
    for _ in 0..100 {
        if peer.region("late").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        peer.region("late").is_none(),
        "deregistered region still advertised"
    );
}

/// Served notifies: a handler answers them (its status is the sender's result) on the control
/// connection (tcp) and on the fabric channel; other names still reach the inbox; dropping the
/// service hands its names back to the inbox. The target sees its initiators' liveness.
async fn served_notifies_answer_the_sender(transport: &str) {
    let (t, i, _remote, _local, peer) = pair_over(4096, transport).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let svc = t
        .serve_notifies("svc.", move |n: &hixl_core::Notify| {
            let _ = tx.send((n.link, n.msg.clone()));
            if n.msg == b"yes" {
                Status::Success
            } else {
                Status::ParamInvalid
            }
        })
        .unwrap();
    // overlapping and empty prefixes are refused, naming the prefix
    let e = t.serve_notifies("svc.x", |_: &hixl_core::Notify| Status::Success);
    assert!(e.unwrap_err().to_string().contains("svc.x"));
    let e = t.serve_notifies("sv", |_: &hixl_core::Notify| Status::Success);
    assert!(e.unwrap_err().to_string().contains("\"svc.\""));
    assert!(t
        .serve_notifies("", |_: &hixl_core::Notify| Status::Success)
        .is_err());
    peer.notify("svc.ask", "yes").await.unwrap();
    let e = peer.notify("svc.ask", "no").await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Remote {
                status: Status::ParamInvalid,
                ..
            }
        ),
        "{e}"
    );
    peer.notify("plain", "inbox").await.unwrap();
    let (link, msg) = rx.recv().await.unwrap();
    assert_eq!(msg, b"yes");
    assert_eq!(rx.recv().await.unwrap().1, b"no");
    let inbox = t.take_notifies();
    assert_eq!(inbox.len(), 1, "served notifies never reach the inbox");
    assert_eq!(inbox[0].name, b"plain");
    assert_eq!(inbox[0].link, link, "the handler sees the same link id");
    // served notifies do not use the sender's budget
    for _ in 0..hixl_core::NOTIFY_MAX_PENDING + 10 {
        peer.notify("svc.ask", "yes").await.unwrap();
    }
    drop(svc);
    peer.notify("svc.ask", "no").await.unwrap();
    assert_eq!(t.take_notifies()[0].msg, b"no");
    assert!(t.initiator_connected(link));
    assert!(!t.initiator_connected(link ^ 0xdead_beef));
    i.disconnect(t.local_engine()).await.unwrap();
    let deadline = std::time::Instant::now() + T;
    while t.initiator_connected(link) {
        assert!(
            std::time::Instant::now() < deadline,
            "link still seen alive"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_notifies_answer_the_sender_tcp() {
    served_notifies_answer_the_sender("tcp").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_notifies_answer_the_sender_fabric() {
    served_notifies_answer_the_sender("auto").await
}

/// Strided descriptors: every piece moves, nothing between pieces, both ways; a descriptor is
/// checked once as a whole and refused naming its index and value.
async fn strided_round_trip(transport: &str, pooled: bool) {
    let len = 1 << 20;
    let target = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .build()
        .await
        .unwrap();
    let remote = if pooled {
        target
            .register_pooled(len as u64, hixl_core::Access::REMOTE_RW, Some("kv"))
            .unwrap()
    } else {
        target
            .register_with(
                HostBuffer::zeroed(len).unwrap(),
                hixl_core::Access::REMOTE_RW,
                Some("kv"),
            )
            .unwrap()
    };
    let init = Engine::builder("127.0.0.1")
        .option("hixl.Transport", transport)
        .build()
        .await
        .unwrap();
    let local = init.register(HostBuffer::zeroed(len).unwrap()).unwrap();
    let peer = init.connect(target.local_engine(), T).await.unwrap();
    let rr = peer.region("kv").unwrap();
    // Write: 3000 pieces of 40 bytes, packed locally (stride 40), every 256 bytes remotely;
    // then read them back into every 64 bytes locally, from offset 512 K.
    let (n, piece) = (3000u64, 40u64);
    let data = pattern((n * piece) as usize, 5);
    local.write_at(0, &data).unwrap();
    let w = hixl_core::StridedDesc {
        local_addr: local.addr(),
        remote_addr: rr.addr + 100,
        len: piece,
        local_stride: piece,
        remote_stride: 256,
        count: n,
    };
    peer.transfer_strided(hixl_core::TransferOp::Write, &[w])
        .await
        .unwrap();
    let mut got = vec![0u8; len];
    remote.read_at(0, &mut got).unwrap();
    for i in 0..n as usize {
        let at = 100 + i * 256;
        assert_eq!(&got[at..at + 40], &data[i * 40..i * 40 + 40], "piece {i}");
        assert!(
            got[at + 40..at + 256].iter().all(|&b| b == 0),
            "gap after piece {i}"
        );
    }
    let r = hixl_core::StridedDesc {
        local_addr: local.addr() + (512 << 10),
        remote_addr: rr.addr + 100,
        len: piece,
        local_stride: 64,
        remote_stride: 256,
        count: n,
    };
    peer.transfer_strided(hixl_core::TransferOp::Read, &[r])
        .await
        .unwrap();
    let mut back = vec![0u8; (n * 64) as usize];
    local.read_at(512 << 10, &mut back).unwrap();
    for i in 0..n as usize {
        assert_eq!(
            &back[i * 64..i * 64 + 40],
            &data[i * 40..i * 40 + 40],
            "read piece {i}"
        );
        assert!(back[i * 64 + 40..i * 64 + 64].iter().all(|&b| b == 0));
    }
    // Checked once, as a whole, naming the descriptor: span past the region, overlapping
    // pieces, no pieces. Nothing moves.
    let past = hixl_core::StridedDesc {
        count: len as u64 / 256 + 1,
        ..w
    };
    let overlap = hixl_core::StridedDesc {
        remote_stride: 39,
        ..w
    };
    let none = hixl_core::StridedDesc { count: 0, ..w };
    // Zero-length pieces whose span (15 strides) is not zero: refused as a zero-length plain
    // descriptor is, on every transport (tcp divided by the piece length, the fabric moved
    // nothing and said Ok).
    let empty = hixl_core::StridedDesc {
        len: 0,
        count: 16,
        local_stride: 512,
        remote_stride: 1024,
        ..w
    };
    let empty_one = hixl_core::StridedDesc {
        len: 0,
        count: 1,
        ..w
    };
    let stacked = hixl_core::StridedDesc {
        remote_stride: 0,
        ..w
    };
    for (d, want) in [
        (past, "descriptor 1"),
        (overlap, "strided descriptor 1"),
        (
            stacked,
            "strided descriptor 1: strides 40 (local) and 0 (remote)",
        ),
        (none, "strided descriptor 1: count is 0"),
        (empty, "descriptor 1 has zero length"),
        (empty_one, "descriptor 1 has zero length"),
    ] {
        for op in [hixl_core::TransferOp::Write, hixl_core::TransferOp::Read] {
            let e = peer.transfer_strided(op, &[w, d]).await.unwrap_err();
            assert!(e.to_string().contains(want), "{d:?}: {e}");
            assert_eq!(e.status(), hixl_core::Status::ParamInvalid, "{e}");
        }
    }
    // A refused call leaves the link working.
    peer.transfer_strided(hixl_core::TransferOp::Write, &[w])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_descriptors_over_tcp() {
    strided_round_trip("tcp", false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_descriptors_over_the_fabric_mapped() {
    strided_round_trip("auto", true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_descriptors_over_the_fabric_cma() {
    strided_round_trip("auto", false).await
}

/// Every transfer is counted when it ends, per peer, transport and operation, with its bytes
/// and descriptors; the Prometheus endpoint serves the same over a real HTTP request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_counts_each_transfer_and_serves_prometheus_text() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for transport in ["tcp", "fabric"] {
        let len = 1 << 20;
        let (t, init, _remote, local, peer) = pair_over(len, transport).await;
        let rr = peer.region("kv").unwrap();
        let d = |off: u64, n: u64| OpDesc::new(local.addr() + off, rr.addr + off, n);
        peer.write(&[d(0, 4096), d(8192, 4096)]).await.unwrap();
        peer.read(&[d(0, 65536)]).await.unwrap();
        // refused (outside the peer's region): counted as failed, nothing moved
        let bad = OpDesc::new(local.addr(), rr.addr + len as u64, 16);
        assert!(peer.write(&[bad]).await.is_err());
        // dropped unawaited: it ends as it ended by the time of the drop, or abandoned
        drop(peer.write(&[d(0, 512 << 10)]));

        let tele = init.telemetry();
        assert_eq!(tele.links.len(), 1, "{tele:?}");
        let l = &tele.links[0];
        assert_eq!(
            (l.peer.as_str(), l.transport),
            (t.local_engine(), transport)
        );
        let (read, write) = (&l.ops[0], &l.ops[1]);
        assert_eq!(
            (read.op, read.count(), read.bytes, read.descriptors),
            ("read", 1, 65536, 1)
        );
        assert_eq!((write.op, write.count()), ("write", 3));
        assert_eq!(write.bytes, 4096 * 2 + 16 + (512 << 10));
        let ended = |o: &hixl_async::telemetry::OpSnapshot, k| {
            o.ended.iter().find(|e| e.0 == k).map(|e| e.1).unwrap_or(0)
        };
        use hixl_async::Outcome::*;
        assert_eq!(
            ended(write, Completed) + ended(write, Abandoned),
            2,
            "{write:?}"
        );
        assert_eq!(ended(write, Failed), 1, "{write:?}");
        assert_eq!(read.buckets.last().map(|b| b.1), Some(1));
        assert!(read.duration_sum > Duration::ZERO);
        let recs = init.take_transfer_records();
        assert_eq!(recs.len(), 4, "{recs:?}");
        assert!(recs.iter().all(|r| r.transport == transport));
        assert!(init.take_transfer_records().is_empty());

        let srv = init.serve_metrics("127.0.0.1:0").await.unwrap();
        let mut s = tokio::net::TcpStream::connect(srv.local_addr())
            .await
            .unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        let labels = format!(
            "engine=\"{}\",peer=\"{}\",transport=\"{transport}\",op=\"read\"",
            init.local_engine(),
            t.local_engine()
        );
        for want in [
            format!("hixl_transfer_bytes_total{{{labels}}} 65536"),
            format!("hixl_transfer_duration_seconds_count{{{labels}}} 1"),
            format!("hixl_transfers_total{{{labels},outcome=\"completed\"}} 1"),
            format!("transport=\"{transport}\"}} 1"),
        ] {
            assert!(body.contains(&want), "{want} not in\n{body}");
        }
        // The target's side: one initiator, over the transport in use.
        let tm = t.metrics_text();
        let inbound = format!(
            "hixl_inbound_links{{engine=\"{}\",peer=\"",
            t.local_engine()
        );
        let line = tm.lines().find(|l| l.starts_with(&inbound));
        assert!(
            line.is_some_and(|l| l.ends_with(&format!("transport=\"{transport}\"}} 1"))),
            "{tm}"
        );
        if transport == "tcp" {
            // What the target served over its TCP data path: the one read, all of it.
            let served = |name: &str| {
                tm.lines()
                    .find(|l| l.starts_with(name) && l.contains("op=\"read\""))
                    .map(str::to_owned)
            };
            let bytes = served("hixl_served_bytes_total{");
            assert!(bytes.is_some_and(|l| l.ends_with("} 65536")), "{tm}");
            let ops = served("hixl_served_ops_total{");
            assert!(ops.is_some_and(|l| l.ends_with("} 1")), "{tm}");
        }
        let mut s = tokio::net::TcpStream::connect(srv.local_addr())
            .await
            .unwrap();
        s.write_all(b"GET /other HTTP/1.1\r\n\r\n").await.unwrap();
        let mut other = String::new();
        s.read_to_string(&mut other).await.unwrap();
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    }
}

/// Durations that do not fit an instant (`Duration::MAX` as "no bound") mean "no bound"
/// wherever the API takes one: none panics, and each call does what it does with a finite
/// bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_past_any_instant_mean_no_bound() {
    for transport in ["tcp", "fabric"] {
        let (target, _, remote, _, _) = pair_over(1 << 20, transport).await;
        let init = Engine::builder("127.0.0.1")
            .option("hixl.Transport", transport)
            .build()
            .await
            .unwrap();
        let local = init.register(HostBuffer::zeroed(1 << 20).unwrap()).unwrap();
        let peer = init
            .connect(target.local_engine(), Duration::MAX)
            .await
            .unwrap();
        let rr = peer.region("kv").unwrap();
        local.write_at(0, &pattern(4096, 9)).unwrap();
        peer.write(&[OpDesc::new(local.addr(), rr.addr, 4096)])
            .timeout(Duration::MAX)
            .await
            .unwrap();
        let mut got = vec![0u8; 4096];
        remote.read_at(0, &mut got).unwrap();
        assert_eq!(got, pattern(4096, 9), "{transport}");
        peer.notify_timeout("n", "m", Duration::MAX).await.unwrap();
        init.disconnect_async(target.local_engine(), Duration::MAX)
            .unwrap();
        init.connect_async(target.local_engine(), Duration::MAX)
            .unwrap();
        let deadline = tokio::time::Instant::now() + T;
        while init.async_connect_status(target.local_engine()).ok()
            != Some(hixl_core::AsyncConnectStatus::Connected)
        {
            assert!(tokio::time::Instant::now() < deadline, "{transport}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        init.shutdown(Duration::MAX).await;
        target.shutdown(Duration::MAX).await;
    }
}
