//! Notifies, timeouts, links and handles.

use hixl_core::{Error, MemDesc, MemKind, RegionId, Status, TransferOp};

use crate::pair::{pair, status_of};
use crate::T;

pub(crate) fn notifies_are_delivered_then_cleared() {
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

pub(crate) fn timeouts_links_and_handles() {
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
