//! Initialize and finalize, capabilities, threads and runtimes: what the object allows when.

use std::sync::Arc;

use hixl_async::blocking::{
    FeatureType, GetTransferStatusArgs, Hixl, TransferReq, FEATURE_NOT_SUPPORTED, FEATURE_SUPPORTED,
};
use hixl_async::HostBuffer;
use hixl_core::{Error, MemDesc, MemKind, OpDesc, RegionId, Status, TransferOp, TransferStatus};

use crate::pair::{descs, pair, pattern, status_of, wait_terminal};
use crate::T;

pub(crate) fn hixl_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Hixl>();
}

pub(crate) fn calls_before_initialize_and_after_finalize_fail() {
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

pub(crate) fn initialize_errors_are_reported() {
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

pub(crate) fn capabilities() {
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

pub(crate) fn blocking_calls_inside_a_runtime_are_refused_not_panicking() {
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

pub(crate) fn shared_between_threads() {
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
