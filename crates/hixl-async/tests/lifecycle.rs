//! The engine's lifecycle, as a new user meets it: calls after `shutdown`, transfers in flight
//! when their engine is dropped or shut down, the identity of links that share an engine name,
//! a fabric table too large for one message. Real engines over real loopback sockets and
//! real shared-memory mappings.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use hixl_async::{Engine, HostBuffer, Peer, Region, Transfer};
use hixl_core::{Access, Error, OpDesc, RemoteRegion, Status, NOTIFY_MAX_PENDING};
use tokio::sync::Barrier;

const T: Duration = Duration::from_secs(5);
/// Every transfer in flight must have resolved this long after its engine went away.
const RESOLVE_WITHIN: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tcp,
    /// The target's region from its fabric pool, mapped by the initiator.
    FabricPool,
    /// The target's region plain host memory, reached by cross-memory attach.
    FabricHeap,
}

impl Mode {
    fn transport(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::FabricPool | Mode::FabricHeap => "fabric",
        }
    }
}

async fn server(mode: Mode) -> Engine {
    Engine::builder("127.0.0.1")
        .option("hixl.Transport", mode.transport())
        .ephemeral_port()
        .build()
        .await
        .expect("target engine")
}

async fn client(mode: Mode) -> Engine {
    Engine::builder("127.0.0.1")
        .option("hixl.Transport", mode.transport())
        .build()
        .await
        .expect("initiator engine")
}

/// A target region of `len` bytes named `kv`, as `mode` reaches it.
fn target_region(target: &Engine, mode: Mode, len: usize) -> Region {
    match mode {
        Mode::FabricPool => target
            .register_pooled(len as u64, Access::REMOTE_RW, Some("kv"))
            .expect("register pooled"),
        Mode::Tcp | Mode::FabricHeap => target
            .register_with(
                HostBuffer::zeroed(len).expect("buffer"),
                Access::REMOTE_RW,
                Some("kv"),
            )
            .expect("register"),
    }
}

struct Rig {
    target: Engine,
    init: Engine,
    local: Region,
    peer: Peer,
    remote: RemoteRegion,
    _tregion: Region,
}

async fn rig(mode: Mode, len: usize) -> Rig {
    let target = server(mode).await;
    let tregion = target_region(&target, mode, len);
    let init = client(mode).await;
    let local = init
        .register(HostBuffer::zeroed(len).expect("buffer"))
        .expect("register local");
    local.write_at(0, &vec![0xA5; len]).expect("fill local");
    let peer = init
        .connect(target.local_engine(), T)
        .await
        .expect("connect");
    assert!(
        peer.transport().starts_with(mode.transport()),
        "{}",
        peer.transport()
    );
    let remote = peer.region("kv").expect("kv exported");
    Rig {
        target,
        init,
        local,
        peer,
        remote,
        _tregion: tregion,
    }
}

/// `n` writes of `each` bytes (the whole region split), posted at once.
fn post_writes(r: &Rig, n: usize, each: usize) -> Vec<Transfer> {
    (0..n)
        .map(|i| {
            let off = (i * each) as u64;
            r.peer.write(&[OpDesc::new(
                r.local.addr() + off,
                r.remote.addr + off,
                each as u64,
            )])
        })
        .collect()
}

/// Every transfer resolves, with success or with an error of the link's end (never hangs).
async fn all_resolve(ts: Vec<Transfer>, mode: Mode, how: &str) -> (usize, usize) {
    let n = ts.len();
    let results = tokio::time::timeout(RESOLVE_WITHIN, join_all(ts))
        .await
        .unwrap_or_else(|_| {
            panic!("{mode:?}: transfers in flight did not all resolve after {how}")
        });
    let failed: Vec<&Error> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    for e in &failed {
        assert!(
            matches!(
                e.status(),
                Status::Failed | Status::NotConnected | Status::Timeout
            ),
            "{mode:?}: unexpected failure after {how}: {e}"
        );
    }
    (n - failed.len(), failed.len())
}

fn is_shut_down(r: Result<impl std::fmt::Debug, Error>, what: &str) {
    match r {
        Err(e @ Error::ShutDown { .. }) => {
            assert_eq!(e.status(), Status::Failed, "{what}: {e}");
            assert!(e.to_string().contains("shut down"), "{what}: {e}");
        }
        other => panic!("{what} after shutdown: expected ShutDown, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_every_call_fails_with_shut_down() {
    for mode in [Mode::Tcp, Mode::FabricPool] {
        let r = rig(mode, 1 << 20).await;
        r.init.shutdown(Duration::from_millis(100)).await;
        assert!(r.init.is_shut_down());
        // Nothing new starts...
        is_shut_down(r.init.connect(r.target.local_engine(), T).await, "connect");
        is_shut_down(
            r.init.register(HostBuffer::zeroed(4096).expect("buffer")),
            "register",
        );
        is_shut_down(
            r.init.register_pooled(4096, Access::REMOTE_RW, None),
            "register_pooled",
        );
        is_shut_down(
            r.init
                .transfer(
                    r.target.local_engine(),
                    hixl_core::TransferOp::Write,
                    &[OpDesc::new(r.local.addr(), r.remote.addr, 4096)],
                )
                .await,
            "engine.transfer",
        );
        is_shut_down(
            r.init.connect_async(r.target.local_engine(), T),
            "connect_async",
        );
        // ...and the link shutdown closed answers with its cause, at once.
        let w = tokio::time::timeout(
            T,
            r.peer
                .write(&[OpDesc::new(r.local.addr(), r.remote.addr, 1 << 20)]),
        )
        .await
        .expect("a write on a link closed by shutdown resolves");
        is_shut_down(w, "a write on the closed link");
        let n = tokio::time::timeout(T, r.peer.notify("n", "m"))
            .await
            .expect("a notify on a closed link resolves");
        is_shut_down(n, "a notify on the closed link");
        // Buffers still come back, and a second shutdown is harmless.
        let b = r.init.deregister(&r.local).await.expect("deregister");
        assert_eq!(b.map(|b| b.len()), Some(1 << 20));
        r.init.shutdown(Duration::from_millis(1)).await;
        assert_eq!(r.init.ops_in_flight(), 0, "{mode:?}");
    }
}

/// Transfers in flight when their engine goes away: all resolve, over every transport.
async fn in_flight_resolve(mode: Mode, end: &str) {
    const N: usize = 16;
    const EACH: usize = 4 << 20;
    let r = rig(mode, N * EACH).await;
    let ts = post_writes(&r, N, EACH);
    let Rig {
        target,
        init,
        local,
        peer,
        remote,
        _tregion,
    } = r;
    match end {
        "drop" => drop(init),
        _ => {
            init.shutdown(Duration::from_millis(1)).await;
            drop(init);
        }
    }
    let (ok, failed) = all_resolve(ts, mode, end).await;
    eprintln!("{mode:?} after {end}: {ok} landed, {failed} failed");
    drop((local, peer, remote));
    target.shutdown(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_in_flight_resolve_when_their_engine_is_dropped() {
    for mode in [Mode::FabricPool, Mode::FabricHeap, Mode::Tcp] {
        in_flight_resolve(mode, "drop").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_in_flight_resolve_after_a_shutdown_with_a_short_grace() {
    for mode in [Mode::FabricPool, Mode::FabricHeap, Mode::Tcp] {
        in_flight_resolve(mode, "shutdown(1 ms)").await;
    }
}

/// A server whose request tasks await transfers can shut down: the tasks end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_tasks_awaiting_transfers_end_when_the_engine_shuts_down() {
    let r = rig(Mode::FabricPool, 64 << 20).await;
    // Shut down once every task has a write under way.
    let running = Arc::new(Barrier::new(5));
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let (peer, l, rm) = (r.peer.clone(), r.local.addr(), r.remote.addr);
            let running = running.clone();
            tokio::spawn(async move {
                let off = i as u64 * (16 << 20);
                let mut first = true;
                loop {
                    let d = [OpDesc::new(l + off, rm + off, 16 << 20)];
                    let w = peer.write(&d);
                    if std::mem::take(&mut first) {
                        running.wait().await;
                    }
                    if let Err(e) = w.await {
                        return e;
                    }
                }
            })
        })
        .collect();
    running.wait().await;
    r.init.shutdown(Duration::from_millis(1)).await;
    let ends = tokio::time::timeout(RESOLVE_WITHIN, join_all(tasks))
        .await
        .expect("request tasks ended after shutdown");
    for e in ends {
        let e = e.expect("task");
        assert_eq!(e.status(), Status::Failed, "{e}");
    }
}

/// Two client-only engines on one host are both named by their IP: each link still has its
/// own identity and its own notify budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_client_engines_sharing_a_name_have_their_own_links_and_budgets() {
    for mode in [Mode::Tcp, Mode::FabricPool] {
        let target = server(mode).await;
        let _r = target_region(&target, mode, 4096);
        let a = client(mode).await;
        let b = client(mode).await;
        assert_eq!(a.local_engine(), b.local_engine(), "both named by their IP");
        let pa = a.connect(target.local_engine(), T).await.expect("a");
        let pb = b.connect(target.local_engine(), T).await.expect("b");
        // A fills its budget and leaves it undrained.
        for chunk in 0..NOTIFY_MAX_PENDING / 256 {
            let sent =
                join_all((0..256).map(|i| pa.notify("a", format!("{}", chunk * 256 + i)))).await;
            assert!(sent.iter().all(|r| r.is_ok()), "{mode:?}: {sent:?}");
        }
        match pa.notify("a", "one too many").await {
            Err(e) => assert_eq!(e.status(), Status::ResourceExhausted, "{mode:?}: {e}"),
            Ok(()) => panic!("{mode:?}: A's budget was not enforced"),
        }
        // B is not charged for A's backlog.
        pb.notify("b", "first").await.unwrap_or_else(|e| {
            panic!("{mode:?}: B's first notify was refused because of A's backlog: {e}")
        });
        let got = target.take_notifies();
        assert_eq!(got.len(), NOTIFY_MAX_PENDING + 1, "{mode:?}");
        let link_a = got[0].link;
        let from_b: Vec<_> = got.iter().filter(|n| n.name == b"b").collect();
        assert_eq!(from_b.len(), 1, "{mode:?}");
        assert_eq!(from_b[0].from, got[0].from, "{mode:?}: same engine name");
        assert_ne!(from_b[0].link, link_a, "{mode:?}: links told apart");
        assert!(
            got.iter()
                .filter(|n| n.name == b"a")
                .all(|n| n.link == link_a),
            "{mode:?}: one link id for all of A's notifies"
        );
        // Drained, A's budget is back.
        pa.notify("a", "again").await.expect("after the drain");
        drop((pa, pb));
        a.shutdown(Duration::from_millis(10)).await;
        b.shutdown(Duration::from_millis(10)).await;
        target.shutdown(Duration::from_millis(10)).await;
    }
}

/// More pool regions than one message can carry memfds for (253): `connect` returns with all
/// of them mapped, and forced fabric sends none over TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_fabric_maps_every_region_of_a_table_split_over_several_messages() {
    for count in [253usize, 300, 600] {
        let target = server(Mode::FabricPool).await;
        let regions: Vec<Region> = (0..count)
            .map(|i| {
                target
                    .register_pooled(4096, Access::REMOTE_RW, Some(&format!("r{i}")))
                    .expect("register pooled")
            })
            .collect();
        let init = client(Mode::FabricPool).await;
        let local = init
            .register(HostBuffer::zeroed(4096).expect("buffer"))
            .expect("register local");
        let peer = init
            .connect(target.local_engine(), T)
            .await
            .expect("connect");
        let how = peer.transport().to_string();
        assert!(
            how.contains(&format!("{count} pool regions mapped")),
            "{count} regions: {how}"
        );
        assert!(!how.contains("over tcp"), "{count} regions: {how}");
        // The last region is reached over the fabric: written, then read back from the target.
        let last = peer
            .region(&format!("r{}", count - 1))
            .expect("last region");
        local.write_at(0, &[0x5A; 4096]).expect("fill");
        peer.write(&[OpDesc::new(local.addr(), last.addr, 4096)])
            .await
            .expect("write to the last region");
        let mut back = vec![0u8; 4096];
        regions[count - 1].read_at(0, &mut back).expect("read back");
        assert!(back.iter().all(|&b| b == 0x5A), "{count} regions");
        init.shutdown(Duration::from_millis(10)).await;
        target.shutdown(Duration::from_millis(10)).await;
    }
}

/// A target restarted on the same port while writes stream to it is a new link: the writes in
/// flight on the old one resolve, the old handle stays dead, and nothing of the old link (its
/// memory table, keys or fabric mappings) is used for the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_restarted_on_its_port_mid_stream_is_a_new_link() {
    const LEN: usize = 8 << 20;
    for mode in [Mode::Tcp, Mode::FabricPool] {
        let t1 = server(mode).await;
        let r1 = target_region(&t1, mode, LEN);
        r1.write_at(0, &vec![0x11; LEN]).expect("fill r1");
        let addr = t1.local_engine().to_string();
        let port = t1.listen_addr().expect("listening").port();
        let init = Engine::builder("127.0.0.1")
            .option("hixl.Transport", mode.transport())
            .option("AutoConnect", "1")
            .build()
            .await
            .expect("initiator");
        let local = init
            .register(HostBuffer::zeroed(LEN).expect("buffer"))
            .expect("register local");
        local.write_at(0, &vec![0xA5; LEN]).expect("fill local");
        let p1 = init.connect(&addr, T).await.expect("connect");
        let kv1 = p1.region("kv").expect("kv");
        // The target goes once each stream has landed a write (and streams on).
        let landed_one = Arc::new(Barrier::new(3));
        let streams: Vec<_> = (0..2u64)
            .map(|i| {
                let (p, l, r) = (p1.clone(), local.addr(), kv1.addr);
                let landed_one = landed_one.clone();
                tokio::spawn(async move {
                    let mut landed = 0u32;
                    loop {
                        let off = i * (4 << 20);
                        match p.write(&[OpDesc::new(l + off, r + off, 1 << 20)]).await {
                            Ok(()) => landed += 1,
                            Err(e) => return (landed, e),
                        }
                        if landed == 1 {
                            landed_one.wait().await;
                        }
                    }
                })
            })
            .collect();
        landed_one.wait().await;
        t1.shutdown(Duration::from_millis(10)).await;
        drop(t1);
        let ends = tokio::time::timeout(RESOLVE_WITHIN, join_all(streams))
            .await
            .expect("the streams' writes resolved when the target went away");
        for e in ends {
            let (landed, e) = e.expect("task");
            assert!(landed > 0, "{mode:?}: the stream ran before the restart");
            assert!(
                matches!(e.status(), Status::Failed | Status::NotConnected),
                "{mode:?}: {e}"
            );
        }
        // The new incarnation, on the same port (r1 stays alive, so its memory is not reused).
        let mut tries = 0;
        let t2 = loop {
            let b = Engine::builder(format!("127.0.0.1:{port}"))
                .option("hixl.Transport", mode.transport());
            match b.build().await {
                Ok(e) => break e,
                Err(e) if tries < 150 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("port {port} not free again: {e}"),
            }
        };
        let r2 = target_region(&t2, mode, LEN / 2);
        assert!(!p1.is_connected(), "{mode:?}: the old handle stays dead");
        let stale = p1.write(&[OpDesc::new(local.addr(), kv1.addr, 4096)]).await;
        assert!(stale.is_err(), "{mode:?}: a write on the old link");
        let p2 = init.peer_or_connect(&addr).await.expect("reconnect");
        let kv2 = p2.region("kv").expect("kv of the new incarnation");
        assert_ne!(kv2.rkey, kv1.rkey, "{mode:?}: new keys");
        assert_ne!(
            p2.incarnation(),
            p1.incarnation(),
            "{mode:?}: the handshake tells the new incarnation from the old"
        );
        assert_eq!(kv2.len, (LEN / 2) as u64, "{mode:?}: the new table");
        if mode == Mode::FabricPool {
            assert!(
                p2.transport().contains("1 pool regions mapped"),
                "{}",
                p2.transport()
            );
        }
        let disjoint = kv1.addr + kv1.len <= kv2.addr || kv2.addr + kv2.len <= kv1.addr;
        if disjoint {
            // An address of the old table is checked against the new one, not the old.
            match init
                .transfer(
                    &addr,
                    hixl_core::TransferOp::Write,
                    &[OpDesc::new(local.addr(), kv1.addr, 4096)],
                )
                .await
            {
                Err(e) => assert_eq!(e.status(), Status::ParamInvalid, "{mode:?}: {e}"),
                Ok(()) => panic!("{mode:?}: a write to the old incarnation's region landed"),
            }
        }
        p2.write(&[OpDesc::new(local.addr(), kv2.addr, kv2.len)])
            .await
            .expect("write to the new incarnation");
        let mut back = vec![0u8; LEN / 2];
        r2.read_at(0, &mut back).expect("read r2");
        assert!(back.iter().all(|&b| b == 0xA5), "{mode:?}");
        // The old region holds only its own bytes or the stream's.
        let mut old = vec![0u8; LEN];
        r1.read_at(0, &mut old).expect("read r1");
        assert!(old.iter().all(|&b| b == 0x11 || b == 0xA5), "{mode:?}");
        init.shutdown(Duration::from_millis(10)).await;
        t2.shutdown(Duration::from_millis(10)).await;
    }
}

/// A notify its receiver saw is never reported failed to its sender because the receiver
/// closed its engine right after seeing it. On the fabric the ack travels on the fabric
/// channel and the goodbye on the control connection: the target sends what the channel
/// queued before the goodbye, and the initiator waits a moment for acks still on their way
/// instead of failing the notify with the goodbye.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_seen_by_a_receiver_that_closes_at_once_succeeds() {
    use futures::StreamExt;
    for mode in [Mode::Tcp, Mode::FabricPool] {
        for round in 0..40 {
            let target = server(mode).await;
            let init = client(mode).await;
            let peer = init
                .connect(target.local_engine(), T)
                .await
                .expect("connect");
            let mut seen = target.notifications();
            let receiver = tokio::spawn(async move {
                let n = seen.next().await.expect("a notify");
                // Close the moment the notify is seen.
                target.shutdown(Duration::from_secs(1)).await;
                n
            });
            let sent = peer.notify("done", format!("request-{round}")).await;
            let n = tokio::time::timeout(T, receiver)
                .await
                .expect("the receiver saw the notify")
                .expect("join");
            assert_eq!(n.msg, format!("request-{round}").into_bytes());
            assert!(
                sent.is_ok(),
                "{mode:?} round {round}: the receiver saw the notify, yet its sender got {sent:?}"
            );
            init.shutdown(Duration::from_millis(100)).await;
        }
    }
}
