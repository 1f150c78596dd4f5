//! The blocking `Hixl` facade end to end: two instances in one process over 127.0.0.1, driven
//! from plain threads (no tokio runtime in the tests themselves).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hixl_async::blocking::{
    FeatureType, GetTransferStatusArgs, Hixl, TransferReq, FEATURE_NOT_SUPPORTED, FEATURE_SUPPORTED,
};
use hixl_async::HostBuffer;
use hixl_core::{Error, MemDesc, MemKind, OpDesc, RegionId, Status, TransferOp, TransferStatus};

const T: i32 = 5000;
const BLOCK: usize = 64 << 10;

/// A server (ephemeral port) and a client-only engine, both initialized.
fn pair() -> (Hixl, Hixl, String) {
    let server = Hixl::new();
    server.initialize_ephemeral("127.0.0.1", &[]).unwrap();
    let name = server.local_engine().unwrap();
    assert!(name.starts_with("127.0.0.1:"), "{name}");
    let client = Hixl::new();
    client.initialize("127.0.0.1", &[]).unwrap();
    (server, client, name)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 16) as u8)
        .collect()
}

fn descs(local: u64, remote: u64, len: usize) -> Vec<OpDesc> {
    (0..len / BLOCK)
        .map(|i| {
            OpDesc::new(
                local + (i * BLOCK) as u64,
                remote + (i * BLOCK) as u64,
                BLOCK as u64,
            )
        })
        .collect()
}

fn status_of<T: std::fmt::Debug>(r: hixl_core::Result<T>) -> Status {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.status(),
    }
}

/// Polls `get_transfer_status` until terminal (or panics after 10 s).
fn wait_terminal(h: &Hixl, req: TransferReq) -> TransferStatus {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let s = h.get_transfer_status(req).unwrap();
        if s.is_terminal() {
            return s;
        }
        assert!(Instant::now() < end, "request {req:?} still waiting");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn hixl_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Hixl>();
}

#[test]
fn sync_write_and_read_with_raw_and_buffer_registrations() {
    let len = 4 << 20;
    let (server, client, remote) = pair();

    // Server: raw registration of a Vec it keeps alive until deregistration.
    let mut target = vec![0u8; len];
    let tdesc = MemDesc::new(target.as_mut_ptr() as u64, len as u64);
    // SAFETY: `target` outlives the registration (deregistered below, before it is dropped).
    let th = unsafe { server.register_mem(tdesc, MemKind::Host) }.unwrap();
    // SAFETY: as above; same range again.
    let th2 = unsafe { server.register_mem(tdesc, MemKind::Host) }.unwrap();
    assert_eq!(th, th2, "the same (addr, len) gives the same handle");

    // Client: an owned buffer as the write source, a raw Vec as the read destination.
    let (sh, src) = client
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    let mut dst = vec![0u8; len];
    let ddesc = MemDesc::new(dst.as_mut_ptr() as u64, len as u64);
    // SAFETY: `dst` outlives the registration.
    let dh = unsafe { client.register_mem(ddesc, MemKind::Host) }.unwrap();
    assert_ne!(sh, dh);

    client.connect(&remote, T).unwrap();
    let data = pattern(len, 7);
    src.write_at(0, &data).unwrap();

    let w = descs(src.addr(), tdesc.addr, len);
    assert_eq!(w.len(), 64);
    client
        .transfer_sync(&remote, TransferOp::Write, &w, T)
        .unwrap();
    assert!(target == data, "server memory differs after write");

    let r = descs(ddesc.addr, tdesc.addr, len);
    client
        .transfer_sync(&remote, TransferOp::Read, &r, T)
        .unwrap();
    assert!(dst == data, "client memory differs after read");

    // Invalid descriptors are refused as PARAM_INVALID and move nothing.
    let bad = [OpDesc::new(src.addr(), tdesc.addr + len as u64 - 8, 16)];
    assert_eq!(
        status_of(client.transfer_sync(&remote, TransferOp::Write, &bad, T)),
        Status::ParamInvalid
    );
    assert_eq!(
        status_of(client.transfer_sync(&remote, TransferOp::Write, &[], T)),
        Status::ParamInvalid
    );
    // Not connected the other way round.
    assert_eq!(
        status_of(server.transfer_sync("127.0.0.1:1", TransferOp::Read, &r, T)),
        Status::NotConnected
    );

    client.disconnect(&remote, T).unwrap();
    client.deregister_mem(dh).unwrap();
    client.deregister_mem(sh).unwrap();
    server.deregister_mem(th).unwrap();
    // Twice, and unknown handles: SUCCESS.
    server.deregister_mem(th).unwrap();
    server.deregister_mem(RegionId(987_654)).unwrap();
    drop(client);
    drop(server);
    drop((target, dst));
}

#[test]
fn async_transfer_status_is_freed_once_terminal() {
    let len = 2 << 20;
    let (server, client, remote) = pair();
    let (_th, target) = server
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    let (_sh, src) = client
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    client.connect(&remote, T).unwrap();
    let data = pattern(len, 3);
    src.write_at(0, &data).unwrap();

    let req = client
        .transfer_async(
            &remote,
            TransferOp::Write,
            &descs(src.addr(), target.addr(), len),
            11,
        )
        .unwrap();
    assert_eq!(wait_terminal(&client, req), TransferStatus::Completed);
    let mut got = vec![0u8; len];
    target.read_at(0, &mut got).unwrap();
    assert!(got == data, "server memory differs after async write");

    // Freed: asking again is PARAM_INVALID, as is an unknown request.
    let e = client.get_transfer_status(req).unwrap_err();
    assert!(
        matches!(e, Error::UnknownRequest { req: r } if r == req.0),
        "{e}"
    );
    assert_eq!(e.status(), Status::ParamInvalid);
    assert_eq!(
        status_of(client.get_transfer_status(TransferReq(424_242))),
        Status::ParamInvalid
    );

    // Errors found at submission are returned at once; nothing stays outstanding.
    let bad = [OpDesc::new(src.addr(), target.addr(), len as u64 + 1)];
    assert_eq!(
        status_of(client.transfer_async(&remote, TransferOp::Write, &bad, 0)),
        Status::ParamInvalid
    );
    assert_eq!(
        status_of(client.transfer_async("127.0.0.1:1", TransferOp::Write, &bad, 0)),
        Status::NotConnected
    );
    assert!(client
        .get_all_transfer_status(GetTransferStatusArgs::default())
        .unwrap()
        .is_empty());

    // Request numbers grow.
    let req2 = client
        .transfer_async(
            &remote,
            TransferOp::Read,
            &descs(src.addr(), target.addr(), len),
            12,
        )
        .unwrap();
    assert!(req2.0 > req.0);
    assert_eq!(wait_terminal(&client, req2), TransferStatus::Completed);
}

#[test]
fn get_all_transfer_status_orders_limits_and_echoes_user_data() {
    let len = 1 << 20;
    let (server, client, remote) = pair();
    let (_th, target) = server
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    let (_sh, src) = client
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    client.connect(&remote, T).unwrap();
    let d = descs(src.addr(), target.addr(), len);

    // Without skip_waiting and max 1: always the oldest outstanding request, in order.
    let reqs: Vec<TransferReq> = (0..3)
        .map(|k| {
            client
                .transfer_async(&remote, TransferOp::Write, &d, 100 + k)
                .unwrap()
        })
        .collect();
    let one = GetTransferStatusArgs {
        max_query_count: 1,
        skip_waiting: false,
    };
    let mut done = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while done.len() < 3 {
        assert!(Instant::now() < end, "requests still waiting: {done:?}");
        let v = client.get_all_transfer_status(one).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        let r = v[0];
        let k = done.len();
        assert_eq!(r.req, reqs[k], "oldest outstanding request first");
        assert_eq!(r.user_data, 100 + k as u64);
        if r.status.is_terminal() {
            assert_eq!(r.status, TransferStatus::Completed);
            done.push(r.req);
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(client
        .get_all_transfer_status(GetTransferStatusArgs::default())
        .unwrap()
        .is_empty());
    for r in &reqs {
        assert_eq!(
            status_of(client.get_transfer_status(*r)),
            Status::ParamInvalid
        );
    }

    // skip_waiting with max 2: never a waiting entry, at most 2, ascending within a call,
    // user_data echoed, each request reported exactly once.
    let reqs: Vec<TransferReq> = (0..6)
        .map(|k| {
            client
                .transfer_async(&remote, TransferOp::Write, &d, 1000 + k)
                .unwrap()
        })
        .collect();
    let args = GetTransferStatusArgs {
        max_query_count: 2,
        skip_waiting: true,
    };
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while seen.len() < reqs.len() {
        assert!(Instant::now() < end, "seen only {seen:?}");
        let v = client.get_all_transfer_status(args).unwrap();
        assert!(v.len() <= 2, "{v:?}");
        assert!(v.windows(2).all(|w| w[0].req < w[1].req), "{v:?}");
        for r in v {
            assert_eq!(r.status, TransferStatus::Completed);
            let k = reqs
                .iter()
                .position(|q| *q == r.req)
                .expect("a request we submitted");
            assert_eq!(r.user_data, 1000 + k as u64);
            assert!(!seen.contains(&r.req), "{:?} reported twice", r.req);
            seen.push(r.req);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let zero = GetTransferStatusArgs {
        max_query_count: 0,
        skip_waiting: false,
    };
    assert!(client.get_all_transfer_status(zero).unwrap().is_empty());
    assert!(client
        .get_all_transfer_status(GetTransferStatusArgs::default())
        .unwrap()
        .is_empty());
}

#[test]
fn notifies_are_delivered_then_cleared() {
    let (server, client, remote) = pair();
    assert_eq!(
        status_of(client.send_notify(&remote, "cache_ready", "block_0", T)),
        Status::NotConnected
    );
    client.connect(&remote, T).unwrap();
    client
        .send_notify(&remote, "cache_ready", "block_0", T)
        .unwrap();
    client
        .send_notify(&remote, b"n2".as_slice(), vec![1u8, 2, 3], T)
        .unwrap();
    let n = server.get_notifies().unwrap();
    assert_eq!(n.len(), 2, "{n:?}");
    assert_eq!(n[0].name, b"cache_ready");
    assert_eq!(n[0].msg, b"block_0");
    assert_eq!(n[1].name, b"n2");
    assert_eq!(n[1].msg, vec![1u8, 2, 3]);
    assert!(
        server.get_notifies().unwrap().is_empty(),
        "get_notifies clears"
    );
    assert!(client.get_notifies().unwrap().is_empty());

    // Limits: 1024 bytes each.
    client
        .send_notify(&remote, vec![b'n'; 1024], vec![b'm'; 1024], T)
        .unwrap();
    let e = client
        .send_notify(&remote, vec![b'n'; 1025], "m", T)
        .unwrap_err();
    assert!(matches!(e, Error::NotifyTooLong { .. }), "{e}");
    assert_eq!(e.status(), Status::ParamInvalid);
    assert_eq!(
        status_of(client.send_notify(&remote, "n", vec![b'm'; 1025], T)),
        Status::ParamInvalid
    );
    assert_eq!(server.get_notifies().unwrap().len(), 1);

    // A full queue (4096 undrained) gives RESOURCE_EXHAUSTED; draining makes room.
    for k in 0..hixl_core::NOTIFY_MAX_PENDING {
        client.send_notify(&remote, "q", k.to_string(), T).unwrap();
    }
    let e = client.send_notify(&remote, "q", "over", T).unwrap_err();
    assert!(matches!(e, Error::NotifyQueueFull { .. }), "{e}");
    assert_eq!(e.status(), Status::ResourceExhausted);
    let n = server.get_notifies().unwrap();
    assert_eq!(n.len(), hixl_core::NOTIFY_MAX_PENDING);
    assert_eq!(n[4095].msg, b"4095");
    client.send_notify(&remote, "q", "again", T).unwrap();
    assert_eq!(server.get_notifies().unwrap().len(), 1);
}

#[test]
fn calls_before_initialize_and_after_finalize_fail() {
    fn all_fail(h: &Hixl) {
        let remote = "127.0.0.1:9";
        let d = [OpDesc::new(1, 1, 1)];
        let checks: Vec<(&str, Status)> = vec![
            ("connect", status_of(h.connect(remote, T))),
            ("disconnect", status_of(h.disconnect(remote, T))),
            ("deregister", status_of(h.deregister_mem(RegionId(1)))),
            (
                "register_buffer",
                status_of(h.register_buffer(HostBuffer::zeroed(4096).unwrap())),
            ),
            (
                "register_mem",
                // SAFETY: never registered (the call fails before touching the engine).
                status_of(unsafe { h.register_mem(MemDesc::new(0x1000, 16), MemKind::Host) }),
            ),
            (
                "transfer_sync",
                status_of(h.transfer_sync(remote, TransferOp::Write, &d, T)),
            ),
            (
                "transfer_async",
                status_of(h.transfer_async(remote, TransferOp::Write, &d, 0)),
            ),
            (
                "get_transfer_status",
                status_of(h.get_transfer_status(TransferReq(1))),
            ),
            (
                "get_all_transfer_status",
                status_of(h.get_all_transfer_status(GetTransferStatusArgs::default())),
            ),
            ("send_notify", status_of(h.send_notify(remote, "a", "b", T))),
            ("get_notifies", status_of(h.get_notifies())),
            ("engine", status_of(h.engine())),
        ];
        for (call, s) in checks {
            assert_eq!(s, Status::Failed, "{call}");
            assert_eq!(s.code(), 503_900, "{call}");
        }
        assert_eq!(h.local_engine(), None);
    }

    let h = Hixl::new();
    all_fail(&h);
    assert!(matches!(h.engine(), Err(Error::NotInitialized)));
    h.finalize(); // no-op when not initialized

    h.initialize_ephemeral("127.0.0.1", &[]).unwrap();
    let first = h.local_engine().unwrap();
    // Repeated initialize: a no-op keeping the running engine.
    h.initialize("127.0.0.1:1", &[]).unwrap();
    assert_eq!(h.local_engine().unwrap(), first);
    h.finalize();
    all_fail(&h);
    h.finalize();

    // A new initialize after finalize starts a new engine.
    h.initialize("127.0.0.1", &[]).unwrap();
    assert_eq!(h.local_engine().as_deref(), Some("127.0.0.1"));
    assert!(h.get_notifies().unwrap().is_empty());
}

#[test]
fn initialize_errors_are_reported() {
    let h = Hixl::new();
    assert_eq!(
        status_of(h.initialize("not-an-ip", &[])),
        Status::ParamInvalid
    );
    assert_eq!(
        status_of(h.initialize("127.0.0.1", &[("NoSuchOption", "1")])),
        Status::ParamInvalid
    );
    assert_eq!(
        h.local_engine(),
        None,
        "a failed initialize leaves it uninitialized"
    );
    h.initialize("127.0.0.1", &[]).unwrap();
}

#[test]
fn timeouts_links_and_handles() {
    let (server, client, remote) = pair();
    for t in [0, -1, i32::MIN] {
        assert_eq!(
            status_of(client.connect(&remote, t)),
            Status::ParamInvalid,
            "{t}"
        );
        assert_eq!(
            status_of(client.disconnect(&remote, t)),
            Status::ParamInvalid,
            "{t}"
        );
        assert_eq!(
            status_of(client.transfer_sync(&remote, TransferOp::Read, &[], t)),
            Status::ParamInvalid,
            "{t}"
        );
        assert_eq!(
            status_of(client.send_notify(&remote, "a", "b", t)),
            Status::ParamInvalid,
            "{t}"
        );
    }
    assert_eq!(
        status_of(client.disconnect(&remote, T)),
        Status::NotConnected
    );
    client.connect(&remote, T).unwrap();
    let e = client.connect(&remote, T).unwrap_err();
    assert_eq!(e.status(), Status::AlreadyConnected);
    assert_eq!(e.status().code(), 103_903);
    // Connecting to yourself and to an address without a port are invalid.
    assert_eq!(status_of(server.connect(&remote, T)), Status::ParamInvalid);
    assert_eq!(
        status_of(client.connect("127.0.0.1", T)),
        Status::ParamInvalid
    );
    client.disconnect(&remote, T).unwrap();
    let e = client.disconnect(&remote, T).unwrap_err();
    assert_eq!(e.status(), Status::NotConnected);
    assert_eq!(e.status().code(), 103_902);
    assert_eq!(
        status_of(client.disconnect("127.0.0.1:1", T)),
        Status::NotConnected
    );
    // Reconnect after disconnect works.
    client.connect(&remote, T).unwrap();
    client.deregister_mem(RegionId(u64::MAX)).unwrap();
    // Device memory cannot be registered without a device runtime.
    let mut v = vec![0u8; 64];
    // SAFETY: `v` outlives this call, and the registration is refused.
    let r =
        unsafe { client.register_mem(MemDesc::new(v.as_mut_ptr() as u64, 64), MemKind::Device) };
    assert_eq!(status_of(r), Status::Unsupported);
    // SAFETY: a null descriptor is refused before anything is registered.
    let r = unsafe { client.register_mem(MemDesc::new(0, 64), MemKind::Host) };
    assert_eq!(status_of(r), Status::ParamInvalid);
}

#[test]
fn capabilities() {
    // AutoConnect works (tests/pool.rs: transfers connect lazily with `AutoConnect=1`), and
    // callers such as Mooncake probe it here before relying on it.
    assert_eq!(
        Hixl::get_capability(FeatureType::AutoConnect).unwrap(),
        FEATURE_SUPPORTED
    );
    assert_eq!(Hixl::get_capability(0).unwrap(), 1);
    assert_eq!(
        Hixl::get_capability(FeatureType::ClientServerComm).unwrap(),
        FEATURE_SUPPORTED
    );
    assert_eq!(Hixl::get_capability(1).unwrap(), 1);
    assert_eq!(Hixl::get_capability(2).unwrap(), FEATURE_NOT_SUPPORTED);
    assert_eq!(Hixl::get_capability(i32::MAX).unwrap(), 0);
    assert_eq!(status_of(Hixl::get_capability(-1)), Status::ParamInvalid);
    assert_eq!(
        status_of(Hixl::get_capability(i32::MIN)),
        Status::ParamInvalid
    );
}

#[test]
fn blocking_calls_inside_a_runtime_are_refused_not_panicking() {
    let (server, client, remote) = pair();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (call, r) in [
            ("connect", client.connect(&remote, T)),
            ("send_notify", client.send_notify(&remote, "a", "b", T)),
            ("deregister_mem", client.deregister_mem(RegionId(1))),
            ("disconnect", client.disconnect(&remote, T)),
            (
                "transfer_sync",
                client.transfer_sync(&remote, TransferOp::Write, &[OpDesc::new(1, 1, 1)], T),
            ),
            ("initialize", Hixl::new().initialize("127.0.0.1", &[])),
        ] {
            let e = r.unwrap_err();
            assert_eq!(e.status(), Status::ParamInvalid, "{call}");
            assert!(e.to_string().contains("tokio runtime"), "{call}: {e}");
        }
        // Non-blocking calls work.
        assert!(server.get_notifies().unwrap().is_empty());
        assert_eq!(Hixl::get_capability(1).unwrap(), 1);
    });
    // Still usable from a plain thread afterwards.
    client.connect(&remote, T).unwrap();
    // Dropping (= finalize) inside a runtime does not panic.
    rt.block_on(async move {
        drop(client);
        server.finalize();
        assert_eq!(server.local_engine(), None);
    });
}

#[test]
fn shared_between_threads() {
    let len = 1 << 20;
    let (server, client, remote) = pair();
    let (_th, target) = server
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    let (_sh, src) = client
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    client.connect(&remote, T).unwrap();
    let data = pattern(len, 9);
    src.write_at(0, &data).unwrap();
    let client = Arc::new(client);
    let quarter = len / 4;
    let handles: Vec<_> = (0..4)
        .map(|k| {
            let (client, remote) = (client.clone(), remote.clone());
            let (l, r) = (
                src.addr() + (k * quarter) as u64,
                target.addr() + (k * quarter) as u64,
            );
            std::thread::spawn(move || {
                for _ in 0..5 {
                    client
                        .transfer_sync(&remote, TransferOp::Write, &descs(l, r, quarter), T)
                        .unwrap();
                    let req = client
                        .transfer_async(&remote, TransferOp::Write, &descs(l, r, quarter), k as u64)
                        .unwrap();
                    assert_eq!(wait_terminal(&client, req), TransferStatus::Completed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut got = vec![0u8; len];
    target.read_at(0, &mut got).unwrap();
    assert!(got == data);
}

#[test]
fn outstanding_async_requests_are_capped() {
    use hixl_async::blocking::MAX_OUTSTANDING_REQUESTS;
    let (server, client, remote) = pair();
    let (_th, target) = server
        .register_buffer(HostBuffer::zeroed(1 << 20).unwrap())
        .unwrap();
    let (_sh, src) = client
        .register_buffer(HostBuffer::zeroed(1 << 20).unwrap())
        .unwrap();
    client.connect(&remote, T).unwrap();
    let d = [OpDesc::new(src.addr(), target.addr(), 4096)];
    let reqs: Vec<TransferReq> = (0..MAX_OUTSTANDING_REQUESTS)
        .map(|k| {
            client
                .transfer_async(&remote, TransferOp::Write, &d, k as u64)
                .unwrap()
        })
        .collect();
    let e = client
        .transfer_async(&remote, TransferOp::Write, &d, 0)
        .unwrap_err();
    assert!(matches!(e, Error::ResourceExhausted { .. }), "{e}");
    assert_eq!(e.status(), Status::ResourceExhausted);
    // Reading one terminal status frees a slot.
    assert_eq!(wait_terminal(&client, reqs[0]), TransferStatus::Completed);
    let extra = client
        .transfer_async(&remote, TransferOp::Write, &d, 7)
        .unwrap();
    assert_eq!(
        status_of(client.transfer_async(&remote, TransferOp::Write, &d, 0)),
        Status::ResourceExhausted
    );
    for r in reqs[1..].iter().chain([&extra]) {
        assert_eq!(wait_terminal(&client, *r), TransferStatus::Completed);
    }
    assert!(client
        .get_all_transfer_status(GetTransferStatusArgs::default())
        .unwrap()
        .is_empty());
    assert_eq!(client.engine().unwrap().ops_in_flight(), 0);
}

#[test]
fn disconnect_fails_outstanding_requests_which_are_then_freed() {
    let len = 32 << 20;
    let (server, client, remote) = pair();
    let (_th, target) = server
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    let (_sh, src) = client
        .register_buffer(HostBuffer::zeroed(len).unwrap())
        .unwrap();
    client.connect(&remote, T).unwrap();
    let d = descs(src.addr(), target.addr(), len);
    let reqs: Vec<TransferReq> = (0..8)
        .map(|k| {
            client
                .transfer_async(&remote, TransferOp::Write, &d, k)
                .unwrap()
        })
        .collect();
    client.disconnect(&remote, T).unwrap();
    // Whatever had not landed fails; every request ends and is freed once read.
    let mut failed = 0;
    for r in &reqs {
        match wait_terminal(&client, *r) {
            TransferStatus::Completed => {}
            TransferStatus::Failed => failed += 1,
            s => panic!("unexpected {s:?}"),
        }
        assert_eq!(
            status_of(client.get_transfer_status(*r)),
            Status::ParamInvalid
        );
    }
    assert!(
        failed > 0,
        "256 MiB should not all land before the disconnect"
    );
    let end = Instant::now() + Duration::from_secs(10);
    while client.engine().unwrap().ops_in_flight() > 0 {
        assert!(Instant::now() < end, "ops still in flight after disconnect");
        std::thread::sleep(Duration::from_millis(5));
    }
}
