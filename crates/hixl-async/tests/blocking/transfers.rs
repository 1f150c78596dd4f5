//! Transfers: sync and async, request status tracking and its limits.

use std::time::{Duration, Instant};

use hixl_async::blocking::{GetTransferStatusArgs, TransferReq};
use hixl_async::HostBuffer;
use hixl_core::{Error, MemDesc, MemKind, OpDesc, RegionId, Status, TransferOp, TransferStatus};

use crate::pair::{descs, pair, pattern, status_of, wait_terminal};
use crate::T;

pub(crate) fn sync_write_and_read_with_raw_and_buffer_registrations() {
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

pub(crate) fn async_transfer_status_is_freed_once_terminal() {
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

pub(crate) fn get_all_transfer_status_orders_limits_and_echoes_user_data() {
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

pub(crate) fn outstanding_async_requests_are_capped() {
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

pub(crate) fn disconnect_fails_outstanding_requests_which_are_then_freed() {
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
