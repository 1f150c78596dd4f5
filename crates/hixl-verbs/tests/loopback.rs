//! Verbs against a real device (Soft-RoCE in the guest of tools/softroce-vm.sh): two RC QPs of
//! one process connected to each other. Skipped unless HIXL_VERBS_DEVICE names a device.

mod common;

use std::time::Duration;

use common::{assert_all_ok, checksum, connected_pair, filled, tok, wait};
use hixl_core::{Access, CompletionSource, Status};
use hixl_verbs::{
    query_devices, GidType, MemoryRegion, PortState, QpConfig, QpState, RemoteRange, VerbsError,
    WorkRequest,
};

const T: Duration = Duration::from_secs(60);

#[test]
fn device_query_lists_ports_and_gids() {
    let dev = require_device!("device_query_lists_ports_and_gids");
    let all = query_devices().expect("query devices");
    let info = all.iter().find(|d| d.name == dev).expect("device listed");
    print!("{info}");
    let port = info.active_port().expect("an active port");
    assert_eq!(port.state, PortState::Active);
    assert!(port.active_mtu.is_some() && port.max_msg_size >= 1 << 20);
    assert!(
        port.gids.iter().any(|g| g.gid_type == GidType::RoceV2),
        "{:?}",
        port.gids
    );
    assert!(info.to_string().contains("RoCE v2"));
}

#[test]
fn write_then_read_blocks_verified() {
    let dev = require_device!("write_then_read_blocks_verified");
    let (a, mut qa, b, _qb) = connected_pair(&dev, QpConfig::default(), QpConfig::default());
    const TOTAL: usize = 4 << 20;
    let mut src = a.buffer(TOTAL);
    let mut back = a.buffer(TOTAL);
    let dst = b.buffer(TOTAL);
    for (round, block) in [16usize << 10, 128 << 10, 2 << 20].into_iter().enumerate() {
        src.write_at(0, &filled(src.len(), round as u64 + 1))
            .unwrap();
        back.fill(0);
        let n = TOTAL / block;
        let ops = |read: bool| -> Vec<WorkRequest> {
            (0..n)
                .map(|i| {
                    let off = (i * block) as u64;
                    let local = if read {
                        back.local(off, block as u64)
                    } else {
                        src.local(off, block as u64)
                    };
                    let remote = dst.remote().at(off, block as u64).expect("inside");
                    let f = if read {
                        WorkRequest::read
                    } else {
                        WorkRequest::write
                    };
                    f(tok(i as u64), local.expect("inside"), remote)
                })
                .collect()
        };
        let writes = ops(false);
        // SAFETY: src and dst stay registered and untouched until the completions are drained.
        let wrs = unsafe { qa.post_chain(&writes) }.expect("post writes");
        assert_eq!(wrs, n);
        assert_all_ok(&wait(&a.cq, n, T), 0..n as u64);
        assert_eq!(
            checksum(&dst.to_vec()),
            checksum(&src.to_vec()),
            "{block}-byte writes"
        );
        let reads = ops(true);
        // SAFETY: as above; back is not read until the completions are drained.
        unsafe { qa.post_chain(&reads) }.expect("post reads");
        assert_all_ok(&wait(&a.cq, n, T), 0..n as u64);
        assert_eq!(
            checksum(&back.to_vec()),
            checksum(&src.to_vec()),
            "{block}-byte reads"
        );
        println!("{block}-byte blocks: {n} writes and {n} reads verified");
    }
}

#[test]
fn thousands_of_work_requests_in_chains() {
    let dev = require_device!("thousands_of_work_requests_in_chains");
    let cfg = QpConfig {
        max_send_wr: 2048,
        signal_every: 128,
        ..QpConfig::default()
    };
    let (a, mut qa, b, _qb) = connected_pair(&dev, cfg, QpConfig::default());
    const OPS: usize = 4096;
    const SIZE: usize = 256;
    const CHAIN: usize = 1024;
    let mut src = a.buffer(OPS * SIZE);
    src.write_at(0, &filled(src.len(), 42)).unwrap();
    let back = a.buffer(OPS * SIZE);
    let dst = b.buffer(OPS * SIZE);
    for read in [false, true] {
        let ops: Vec<WorkRequest> = (0..OPS)
            .map(|i| {
                let off = (i * SIZE) as u64;
                let remote = dst.remote().at(off, SIZE as u64).expect("inside");
                if read {
                    WorkRequest::read(
                        tok(i as u64),
                        back.local(off, SIZE as u64).expect("inside"),
                        remote,
                    )
                } else {
                    WorkRequest::write(
                        tok(i as u64),
                        src.local(off, SIZE as u64).expect("inside"),
                        remote,
                    )
                }
            })
            .collect();
        let mut out = Vec::new();
        let mut full = 0;
        for chain in ops.chunks(CHAIN) {
            loop {
                // SAFETY: the buffers outlive the completions drained below.
                match unsafe { qa.post_chain(chain) } {
                    Ok(n) => {
                        assert_eq!(n, chain.len());
                        break;
                    }
                    Err(VerbsError::SendQueueFull { .. }) => {
                        full += 1;
                        a.cq.wait_for(&mut out, 1, T);
                    }
                    Err(e) => panic!("post: {e}"),
                }
            }
        }
        let left = OPS - out.len();
        a.cq.wait_for(&mut out, left, T);
        assert_all_ok(&out, 0..OPS as u64);
        assert_eq!(qa.outstanding(), 0);
        println!(
            "{OPS} {} in chains of {CHAIN}: send queue full {full} times",
            if read { "reads" } else { "writes" }
        );
    }
    assert_eq!(checksum(&dst.to_vec()), checksum(&src.to_vec()));
    assert_eq!(checksum(&back.to_vec()), checksum(&src.to_vec()));
}

#[test]
fn ops_above_max_message_size_are_split() {
    let dev = require_device!("ops_above_max_message_size_are_split");
    let cfg = QpConfig {
        max_message_size: Some(64 << 10),
        ..QpConfig::default()
    };
    let (a, mut qa, b, _qb) = connected_pair(&dev, cfg, QpConfig::default());
    assert_eq!(qa.max_message_size(), 64 << 10);
    const LEN: u64 = 1 << 20;
    let mut src = a.buffer(LEN as usize);
    src.write_at(0, &filled(src.len(), 7)).unwrap();
    let back = a.buffer(LEN as usize);
    let dst = b.buffer(LEN as usize);
    let remote = dst.remote().at(0, LEN).expect("inside");
    let w = [WorkRequest::write(
        tok(1),
        src.local(0, LEN).expect("inside"),
        remote,
    )];
    // SAFETY: buffers outlive the drained completions.
    let n = unsafe { qa.post_chain(&w) }.expect("post");
    assert_eq!(n, 16, "1 MiB in 64 KiB pieces");
    assert_all_ok(&wait(&a.cq, 1, T), [1]);
    let r = [WorkRequest::read(
        tok(2),
        back.local(0, LEN).expect("inside"),
        remote,
    )];
    // SAFETY: as above.
    let n = unsafe { qa.post_chain(&r) }.expect("post");
    assert_eq!(n, 16);
    assert_all_ok(&wait(&a.cq, 1, T), [2]);
    assert_eq!(checksum(&dst.to_vec()), checksum(&src.to_vec()));
    assert_eq!(checksum(&back.to_vec()), checksum(&src.to_vec()));
}

#[test]
fn out_of_bounds_remote_range_fails_the_qp_flushes_the_rest_and_reconnects() {
    let dev =
        require_device!("out_of_bounds_remote_range_fails_the_qp_flushes_the_rest_and_reconnects");
    let (a, mut qa, b, _qb) = connected_pair(&dev, QpConfig::default(), QpConfig::default());
    qa.set_peer_name("peer-b");
    let src = a.buffer(64 << 10);
    let dst = b.buffer(64 << 10);
    let r = dst.remote();
    // 8 KiB from 60 KiB: 4 KiB past the end of the peer's region.
    let past_end = RemoteRange {
        addr: r.addr + (60 << 10),
        rkey: r.rkey,
    };
    let ops = [
        WorkRequest::write(tok(1), src.local(0, 8 << 10).expect("inside"), past_end),
        WorkRequest::write(
            tok(2),
            src.local(0, 4 << 10).expect("inside"),
            r.at(0, 4 << 10).expect("inside"),
        ),
    ];
    // SAFETY: buffers outlive the drained completions.
    unsafe { qa.post_chain(&ops) }.expect("post");
    let out = wait(&a.cq, 2, T);
    let e1 = out
        .iter()
        .find(|(t, _)| *t == tok(1))
        .and_then(|(_, r)| r.as_ref().err())
        .expect("op 1 fails");
    println!("op 1: {e1}");
    assert!(e1.to_string().contains("remote access error"), "{e1}");
    assert!(e1.to_string().contains("peer-b"), "{e1}");
    assert_eq!(e1.status(), Status::ParamInvalid);
    let e2 = out
        .iter()
        .find(|(t, _)| *t == tok(2))
        .and_then(|(_, r)| r.as_ref().err())
        .expect("op 2 flushed");
    println!("op 2: {e2}");
    assert!(
        e2.to_string().contains("flushed") && e2.to_string().contains("remote access error"),
        "{e2}"
    );
    assert_eq!(qa.state().expect("query qp"), QpState::Error);
    assert!(qa
        .failure()
        .is_some_and(|f| f.contains("remote access error")));
    // Posting to a failed QP is accepted and flushed, never hangs.
    let again = [WorkRequest::write(
        tok(3),
        src.local(0, 4 << 10).expect("inside"),
        r.at(0, 4 << 10).expect("inside"),
    )];
    // SAFETY: as above.
    unsafe { qa.post_chain(&again) }.expect("post to a QP in error");
    let out = wait(&a.cq, 1, T);
    assert!(out[0]
        .1
        .as_ref()
        .is_err_and(|e| e.to_string().contains("flushed")));
    // Reconnecting = new QPs on the same CQs (the failed ones gave their reservations back).
    let (cap_a, cap_b) = (a.cq.capacity(), b.cq.capacity());
    drop((qa, _qb));
    assert_eq!((a.cq.unreserved(), b.cq.unreserved()), (cap_a, cap_b));
    let mut qa = a.qp(QpConfig::default());
    let mut qb = b.qp(QpConfig::default());
    let (ea, eb) = (qa.endpoint(), qb.endpoint());
    qa.connect(&eb).expect("reconnect a");
    qb.connect(&ea).expect("reconnect b");
    // SAFETY: as above.
    unsafe { qa.post_chain(&again) }.expect("post after reconnect");
    assert_all_ok(&wait(&a.cq, 1, T), [3]);
    assert_eq!(qa.state().expect("query qp"), QpState::ReadyToSend);
}

#[test]
fn wrong_rkey_is_refused_by_the_device() {
    let dev = require_device!("wrong_rkey_is_refused_by_the_device");
    let (a, mut qa, b, _qb) = connected_pair(&dev, QpConfig::default(), QpConfig::default());
    let src = a.buffer(4096);
    let dst = b.buffer(4096);
    let wrong = RemoteRange {
        addr: dst.remote().addr,
        rkey: dst.remote().rkey ^ 0x80,
    };
    let ops = [WorkRequest::read(
        tok(9),
        src.local(0, 4096).expect("inside"),
        wrong,
    )];
    // SAFETY: buffers outlive the drained completions.
    unsafe { qa.post_chain(&ops) }.expect("post");
    let out = wait(&a.cq, 1, T);
    let e = out[0].1.as_ref().expect_err("wrong rkey must fail");
    assert!(e.to_string().contains("remote access error"), "{e}");
    assert_eq!(qa.state().expect("query qp"), QpState::Error);
}

#[test]
fn deregistered_region_rkey_is_refused_by_the_device() {
    let dev = require_device!("deregistered_region_rkey_is_refused_by_the_device");
    let (a, mut qa, b, _qb) = connected_pair(&dev, QpConfig::default(), QpConfig::default());
    let mut src = a.buffer(4096);
    src.write_at(0, &filled(src.len(), 3)).unwrap();
    let mut mem = vec![0u8; 4096];
    // SAFETY: mem outlives the region and every op naming it (both end in this function).
    let mr =
        unsafe { MemoryRegion::register(&b.pd, mem.as_mut_ptr(), mem.len(), Access::REMOTE_RW) }
            .expect("register");
    let remote = mr.remote().at(0, 4096).expect("inside");
    let ops = [WorkRequest::write(
        tok(1),
        src.local(0, 4096).expect("inside"),
        remote,
    )];
    // SAFETY: src and mem stay valid until the completion is drained.
    unsafe { qa.post_chain(&ops) }.expect("post");
    assert_all_ok(&wait(&a.cq, 1, T), [1]);
    assert_eq!(
        checksum(&mem),
        checksum(&src.to_vec()),
        "accepted while registered"
    );
    drop(mr);
    mem.fill(0);
    let ops = [WorkRequest::write(
        tok(2),
        src.local(0, 4096).expect("inside"),
        remote,
    )];
    // SAFETY: as above; the device must refuse the stale rkey.
    unsafe { qa.post_chain(&ops) }.expect("post");
    let out = wait(&a.cq, 1, T);
    let e = out[0].1.as_ref().expect_err("stale rkey must fail");
    println!("after deregistration: {e}");
    assert!(e.to_string().contains("remote access error"), "{e}");
    assert!(
        mem.iter().all(|&x| x == 0),
        "nothing written after deregistration"
    );
}

#[test]
fn completion_channel_fd_becomes_readable_after_arm() {
    let dev = require_device!("completion_channel_fd_becomes_readable_after_arm");
    let (a, mut qa, b, _qb) = connected_pair(&dev, QpConfig::default(), QpConfig::default());
    let src = a.buffer(4096);
    let dst = b.buffer(4096);
    // SAFETY: F_GETFL on the CQ's own open fd.
    let fl = unsafe { libc::fcntl(a.cq.fd(), libc::F_GETFL) };
    assert!(
        fl >= 0 && fl & libc::O_NONBLOCK != 0,
        "channel fd is non-blocking"
    );
    let mut out = Vec::new();
    assert_eq!(a.cq.drain(&mut out), 0);
    a.cq.arm();
    assert_eq!(
        a.cq.drain(&mut out),
        0,
        "the second poll of the reactor's turn"
    );
    assert!(!a.cq.wait_readable(Duration::ZERO), "nothing posted yet");
    let ops = [WorkRequest::write(
        tok(5),
        src.local(0, 4096).expect("inside"),
        dst.remote().at(0, 4096).expect("inside"),
    )];
    // SAFETY: buffers outlive the drained completion.
    unsafe { qa.post_chain(&ops) }.expect("post");
    assert!(
        a.cq.wait_readable(T),
        "a completion after arm makes the fd readable"
    );
    assert_eq!(a.cq.drain(&mut out), 1);
    assert_all_ok(&out, [5]);
    a.cq.arm();
    assert!(
        !a.cq.wait_readable(Duration::from_millis(50)),
        "arm consumed the delivered event"
    );
    a.cq.disarm();
}

#[test]
fn dropping_a_qp_with_work_outstanding_still_reports_every_op() {
    let dev = require_device!("dropping_a_qp_with_work_outstanding_still_reports_every_op");
    let (a, mut qa, b, _qb) = connected_pair(&dev, QpConfig::default(), QpConfig::default());
    let capacity = a.cq.capacity();
    const N: usize = 64;
    let src = a.buffer(N * 16384);
    let dst = b.buffer(N * 16384);
    let ops: Vec<WorkRequest> = (0..N)
        .map(|i| {
            let off = (i * 16384) as u64;
            WorkRequest::write(
                tok(i as u64),
                src.local(off, 16384).expect("inside"),
                dst.remote().at(off, 16384).expect("inside"),
            )
        })
        .collect();
    // SAFETY: the buffers outlive the drained completions (the QP is parked until then).
    unsafe { qa.post_chain(&ops) }.expect("post");
    drop(qa);
    let out = wait(&a.cq, N, T);
    let mut seen: Vec<u64> = out.iter().map(|(t, _)| t.0).collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..N as u64).collect::<Vec<_>>(),
        "every op reported once"
    );
    let failed = out.iter().filter(|(_, r)| r.is_err()).count();
    println!(
        "dropped with {N} ops in flight: {} completed, {failed} flushed",
        N - failed
    );
    assert_eq!(
        a.cq.unreserved(),
        capacity,
        "the parked QP was destroyed after its flush"
    );
}

#[test]
fn a_chain_larger_than_the_free_send_queue_is_refused_before_posting() {
    let dev = require_device!("a_chain_larger_than_the_free_send_queue_is_refused_before_posting");
    let cfg = QpConfig {
        max_send_wr: 16,
        ..QpConfig::default()
    };
    let (a, mut qa, b, _qb) = connected_pair(&dev, cfg, QpConfig::default());
    let src = a.buffer(17 * 64);
    let dst = b.buffer(17 * 64);
    let ops: Vec<WorkRequest> = (0..17u64)
        .map(|i| {
            WorkRequest::write(
                tok(i),
                src.local(i * 64, 64).expect("inside"),
                dst.remote().at(i * 64, 64).expect("inside"),
            )
        })
        .collect();
    // SAFETY: buffers outlive the drained completions.
    let e = unsafe { qa.post_chain(&ops) }.expect_err("17 WRs do not fit in 16");
    assert!(
        matches!(
            e,
            VerbsError::SendQueueFull {
                needed: 17,
                capacity: 16,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.status(), Status::ResourceExhausted);
    assert_eq!(qa.outstanding(), 0);
    // SAFETY: as above.
    unsafe { qa.post_chain(&ops[..16]) }.expect("16 fit");
    assert_all_ok(&wait(&a.cq, 16, T), 0..16);
}

#[test]
fn posting_before_connect_is_refused_and_leaves_nothing_outstanding() {
    let dev = require_device!("posting_before_connect_is_refused_and_leaves_nothing_outstanding");
    let a = common::Side::open(&dev, 2048);
    let mut qa = a.qp(QpConfig::default());
    assert_eq!(qa.state().expect("query"), QpState::Reset);
    let src = a.buffer(4096);
    let ops = [WorkRequest::write(
        tok(1),
        src.local(0, 4096).expect("inside"),
        RemoteRange {
            addr: 0x1000,
            rkey: 1,
        },
    )];
    // SAFETY: nothing is posted to a QP in RESET; if it were, src outlives the drain below.
    let r = unsafe { qa.post_chain(&ops) };
    println!("post in RESET: {r:?}");
    match r {
        Err(VerbsError::Post {
            failed_wr: 0,
            reported_ops: 0,
            ..
        }) => assert_eq!(qa.outstanding(), 0),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => {
            // Some providers queue WRs in RESET and flush them; then the op must still report.
            let out = wait(&a.cq, 1, T);
            assert!(out[0].1.is_err());
        }
    }
}
