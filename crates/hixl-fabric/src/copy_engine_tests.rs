//! Tests of the copy engine: real threads, real copies, the reactor's drain/arm/poll protocol.

use super::*;

/// Guard against a hang, not a measurement: generous for a loaded 2-core machine.
const WAIT_MS: i32 = 20_000;

fn poll_readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout_ms) == 1 }
}

/// The reactor's turn, repeated until `want` more completions are in `out`: drain, arm,
/// drain, park on the fd.
fn collect(src: &dyn CompletionSource, out: &mut Vec<PartResult>, want: usize) {
    let goal = out.len() + want;
    while out.len() < goal {
        if src.drain(out) > 0 {
            continue;
        }
        src.arm();
        if src.drain(out) > 0 {
            src.disarm();
            continue;
        }
        assert!(
            poll_readable(src.fd(), WAIT_MS),
            "no completion within the guard time"
        );
    }
}

fn memcpy(token: u64, src: &[u8], dst: &mut [u8], off: usize, len: usize) -> CopyOp {
    CopyOp {
        token: Token(token),
        kind: CopyKind::Memcpy {
            src: src[off..].as_ptr() as u64,
            dst: dst[off..].as_mut_ptr() as u64,
            len: len as u64,
        },
        keep: None,
    }
}

fn many_memcpys(streams: usize, busy_poll: Duration) {
    // A small ring so that batches of 1000 often find it full.
    let eng = CopyEngine::with_ring_capacity(streams, busy_poll, 1024).unwrap();
    assert_eq!(eng.streams(), streams);
    let src: Vec<u8> = (0..(3 << 20) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let mut dst = vec![0u8; src.len()];
    let mut ops = Vec::new();
    let (mut off, mut i) = (0usize, 0u64);
    while off < src.len() {
        let len = (1 + (i as usize * 37) % 900).min(src.len() - off);
        ops.push(memcpy(i, &src, &mut dst, off, len));
        off += len;
        i += 1;
    }
    let total = ops.len();
    let mut seen = vec![0u32; total];
    let mut out = Vec::new();
    let mut pending = ops;
    while !pending.is_empty() {
        let batch: Vec<CopyOp> = pending.drain(..pending.len().min(1000)).collect();
        // SAFETY: src and dst outlive every completion: all are collected below before they drop,
        // and dst is not read until then.
        let mut r = unsafe { eng.submit(batch) };
        while let Err((e, back)) = r {
            assert!(matches!(e, Error::ResourceExhausted { .. }));
            collect(&eng, &mut out, 1);
            // SAFETY: as above.
            r = unsafe { eng.submit(back) };
        }
    }
    let done = out.len();
    collect(&eng, &mut out, total - done);
    for (t, r) in &out {
        r.as_ref().unwrap();
        seen[t.0 as usize] += 1;
    }
    assert!(
        seen.iter().all(|&c| c == 1),
        "every op completes exactly once"
    );
    assert_eq!(eng.queued(), 0);
    assert!(dst == src);
}

#[test]
fn memcpys_on_one_stream() {
    many_memcpys(1, Duration::ZERO);
}

#[test]
fn memcpys_on_four_streams() {
    many_memcpys(4, Duration::ZERO);
}

#[test]
fn memcpys_with_busy_polling_streams() {
    many_memcpys(2, Duration::from_micros(200));
}

#[test]
fn a_split_op_spreads_over_streams_and_completes_per_part() {
    let eng = CopyEngine::new(4, Duration::ZERO).unwrap();
    let src = vec![9u8; 8 << 20];
    let mut dst = vec![0u8; 8 << 20];
    let whole = CopyKind::Memcpy {
        src: src.as_ptr() as u64,
        dst: dst.as_mut_ptr() as u64,
        len: src.len() as u64,
    };
    let parts = whole.split(64 << 10);
    assert_eq!(parts.len(), 128);
    assert_eq!(parts.iter().map(CopyKind::len).sum::<u64>(), whole.len());
    let n = parts.len();
    let ops = parts
        .into_iter()
        .map(|kind| CopyOp::new(Token(7), kind))
        .collect();
    // SAFETY: src/dst outlive the completions collected below.
    unsafe { eng.submit(ops) }.unwrap();
    let mut out = Vec::new();
    collect(&eng, &mut out, n);
    assert!(out.iter().all(|(t, r)| *t == Token(7) && r.is_ok()));
    assert!(dst.iter().all(|&b| b == 9));
    // Edge cases of split.
    let empty = CopyKind::Memcpy {
        src: 1,
        dst: 2,
        len: 0,
    };
    assert_eq!(empty.split(10), vec![empty]);
    let odd = CopyKind::CmaRead {
        pid: 1,
        local: 100,
        remote: 200,
        len: 25,
    };
    let p = odd.split(10);
    assert_eq!(p.len(), 3);
    assert_eq!(
        p[2],
        CopyKind::CmaRead {
            pid: 1,
            local: 120,
            remote: 220,
            len: 5
        }
    );
    assert_eq!(odd.split(0).len(), 25);
}

#[test]
fn eventfd_signals_only_after_arm() {
    let eng = CopyEngine::new(1, Duration::ZERO).unwrap();
    let cq = eng.completions();
    let src = [1u8; 64];
    let mut dst = [0u8; 64];
    // Not armed: the completion arrives silently.
    // SAFETY: src/dst outlive the completion, drained below.
    unsafe { eng.submit(vec![memcpy(1, &src, &mut dst, 0, 64)]) }.unwrap();
    let mut out = Vec::new();
    while cq.is_empty() {
        std::thread::yield_now();
    }
    assert!(!cq.is_rung(), "a completion before arm must not ring");
    assert_eq!(eng.drain(&mut out), 1);
    // Armed: the next completion makes the fd readable.
    eng.arm();
    assert!(!cq.is_rung());
    // SAFETY: as above.
    unsafe { eng.submit(vec![memcpy(2, &src, &mut dst, 0, 64)]) }.unwrap();
    assert!(poll_readable(eng.fd(), WAIT_MS));
    assert_eq!(eng.drain(&mut out), 1);
    // The ring consumed the arm: later completions are silent until the next arm.
    eng.arm();
    eng.arm(); // re-arming consumes nothing new and stays armed
    assert!(!cq.is_rung());
    eng.disarm();
    // SAFETY: as above.
    unsafe { eng.submit(vec![memcpy(3, &src, &mut dst, 0, 64)]) }.unwrap();
    while cq.is_empty() {
        std::thread::yield_now();
    }
    assert!(!cq.is_rung(), "disarmed");
    assert_eq!(eng.drain(&mut out), 1);
    assert_eq!(out.iter().map(|(t, _)| t.0).collect::<Vec<_>>(), [1, 2, 3]);
}

fn op(t: u64) -> CopyOp {
    CopyOp {
        token: Token(t),
        kind: CopyKind::Memcpy {
            src: 0,
            dst: 0,
            len: 0,
        },
        keep: None,
    }
}

#[test]
fn a_full_ring_hands_the_ops_back() {
    let eng = CopyEngine::start(0, Duration::ZERO, 4).unwrap();
    // SAFETY: zero-length ops touch no memory; with no streams nothing runs anyway.
    unsafe {
        eng.submit(vec![op(1), op(2), op(3)]).unwrap();
        let (e, back) = eng.submit(vec![op(4), op(5)]).unwrap_err();
        assert!(matches!(e, Error::ResourceExhausted { .. }));
        assert_eq!(e.status(), hixl_core::Status::ResourceExhausted);
        assert!(
            e.to_string().contains("2 parts submitted, 3 of 4 queued"),
            "{e}"
        );
        let tokens: Vec<Token> = back.iter().map(|o| o.token).collect();
        assert_eq!(tokens, vec![Token(4), Token(5)]);
        eng.submit(vec![op(4)]).unwrap();
        eng.submit(Vec::new()).unwrap();
    }
    assert_eq!(eng.queued(), 4);
}

#[test]
fn cancelled_and_dropped_ops_complete_once_with_errors() {
    let eng = CopyEngine::start(0, Duration::ZERO, 64).unwrap();
    let cq = eng.completions();
    // SAFETY: zero-length ops touch no memory.
    unsafe { eng.submit((0..10).map(op).collect()) }.unwrap();
    let lost = Error::PeerLost {
        peer: "p".into(),
        cause: "killed".into(),
    };
    cq.arm();
    assert_eq!(eng.cancel_queued(|t| t.0 % 2 == 0, &lost), 5);
    assert!(cq.is_rung(), "cancellations ring an armed queue");
    assert_eq!(eng.queued(), 5);
    assert_eq!(eng.cancel_queued(|t| t.0 == 100, &lost), 0);
    let mut out = Vec::new();
    assert_eq!(cq.drain(&mut out), 5);
    assert!(out
        .iter()
        .all(|(t, r)| t.0 % 2 == 0 && matches!(r, Err(Error::PeerLost { .. }))));
    drop(eng);
    assert_eq!(cq.drain(&mut out), 5);
    let mut seen: Vec<u64> = out.iter().map(|(t, _)| t.0).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    for (t, r) in &out[5..] {
        let e = r.as_ref().unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(e.to_string().contains("shut down"), "{t:?}: {e}");
    }
}

#[test]
fn dropping_a_running_engine_finishes_or_cancels_every_op() {
    let eng = CopyEngine::new(2, Duration::ZERO).unwrap();
    let cq = eng.completions();
    let src = vec![3u8; 1 << 20];
    let mut dst = vec![0u8; 1 << 20];
    let ops: Vec<CopyOp> = (0..256)
        .map(|i| memcpy(i, &src, &mut dst, i as usize * 4096, 4096))
        .collect();
    // SAFETY: src/dst outlive the engine, whose drop runs or cancels every op.
    unsafe { eng.submit(ops) }.unwrap();
    drop(eng);
    let mut out = Vec::new();
    assert_eq!(cq.drain(&mut out), 256);
    let mut seen = vec![0; 256];
    for (t, r) in &out {
        seen[t.0 as usize] += 1;
        let off = t.0 as usize * 4096;
        if r.is_ok() {
            assert!(dst[off..off + 4096].iter().all(|&b| b == 3));
        }
    }
    assert!(seen.iter().all(|&c| c == 1));
}

#[test]
fn failures_complete_with_context() {
    let eng = CopyEngine::new(1, Duration::ZERO).unwrap();
    let me = std::process::id() as i32;
    let mut buf = [0u8; 16];
    let ops = vec![
        CopyOp {
            token: Token(1),
            kind: CopyKind::Memcpy {
                src: 0,
                dst: buf.as_mut_ptr() as u64,
                len: 16,
            },
            keep: None,
        },
        CopyOp {
            token: Token(2),
            kind: CopyKind::CmaRead {
                pid: me,
                local: buf.as_mut_ptr() as u64,
                remote: 16,
                len: 16,
            },
            keep: None,
        },
        CopyOp {
            token: Token(3),
            kind: CopyKind::CmaWrite {
                pid: i32::MAX,
                local: buf.as_ptr() as u64,
                remote: 16,
                len: 16,
            },
            keep: None,
        },
    ];
    // SAFETY: buf outlives the completions; the null memcpy is refused before any access and
    // the CMA ops touch buf only through the kernel.
    unsafe { eng.submit(ops) }.unwrap();
    let mut out = Vec::new();
    collect(&eng, &mut out, 3);
    out.sort_by_key(|(t, _)| t.0);
    let msgs: Vec<String> = out
        .iter()
        .map(|(_, r)| r.as_ref().unwrap_err().to_string())
        .collect();
    assert!(msgs[0].contains("null"), "{}", msgs[0]);
    assert!(
        msgs[1].contains(&format!("pid {me}")) && msgs[1].contains("0x10"),
        "{}",
        msgs[1]
    );
    assert!(
        msgs[2].contains("process_vm_writev") && msgs[2].contains(&i32::MAX.to_string()),
        "{}",
        msgs[2]
    );
}

#[test]
fn cma_ops_against_this_process() {
    let eng = CopyEngine::new(2, Duration::ZERO).unwrap();
    let me = std::process::id() as i32;
    let remote: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    let mut local = vec![0u8; remote.len()];
    let mut back = vec![0u8; remote.len()];
    let ops = vec![
        CopyOp {
            token: Token(1),
            kind: CopyKind::CmaRead {
                pid: me,
                local: local.as_mut_ptr() as u64,
                remote: remote.as_ptr() as u64,
                len: 100_000,
            },
            keep: None,
        },
        CopyOp {
            token: Token(2),
            kind: CopyKind::CmaWrite {
                pid: me,
                local: remote.as_ptr() as u64,
                remote: back.as_mut_ptr() as u64,
                len: 100_000,
            },
            keep: None,
        },
    ];
    // SAFETY: all three buffers outlive the completions collected below.
    unsafe { eng.submit(ops) }.unwrap();
    let mut out = Vec::new();
    collect(&eng, &mut out, 2);
    assert!(out.iter().all(|(_, r)| r.is_ok()));
    assert!(local == remote && back == remote);
}

#[test]
fn stream_counts_are_checked() {
    for bad in [0, MAX_STREAMS + 1] {
        let e = CopyEngine::new(bad, Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
    let e = CopyEngine::with_ring_capacity(1, Duration::ZERO, 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CopyEngine>();
}

/// A `keep` that counts its drop and takes the completion queue's lock while dropping, so a
/// drop under that lock would deadlock the test.
struct Keep(Arc<CompletionQueue>, Arc<AtomicUsize>);

impl Drop for Keep {
    fn drop(&mut self) {
        let _ = self.0.len();
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn keeps_drop_before_their_completion_and_outside_locks() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let idle = CopyEngine::start(0, Duration::ZERO, 8).unwrap();
    let cq = idle.completions();
    let keep = |cq: &Arc<CompletionQueue>| -> Option<Box<dyn std::any::Any + Send>> {
        Some(Box::new(Keep(Arc::clone(cq), Arc::clone(&dropped))))
    };
    let mut ops = vec![op(1), op(2)];
    for o in &mut ops {
        o.keep = keep(&cq);
    }
    // SAFETY: zero-length ops touch no memory.
    unsafe { idle.submit(ops) }.unwrap();
    let lost = Error::PeerLost {
        peer: "p".into(),
        cause: "gone".into(),
    };
    assert_eq!(idle.cancel_queued(|t| t.0 == 1, &lost), 1);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    drop(idle);
    assert_eq!(dropped.load(Ordering::SeqCst), 2);
    assert_eq!(cq.len(), 2);

    let eng = CopyEngine::new(1, Duration::ZERO).unwrap();
    let cq = eng.completions();
    let src = [5u8; 32];
    let mut dst = [0u8; 32];
    let mut o = memcpy(3, &src, &mut dst, 0, 32);
    o.keep = keep(&cq);
    // SAFETY: src/dst outlive the completion collected below.
    unsafe { eng.submit(vec![o]) }.unwrap();
    let mut out = Vec::new();
    collect(&eng, &mut out, 1);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        3,
        "dropped before the completion was posted"
    );
    assert_eq!(dst, src);
}

/// A strided op moves exactly its pieces (by memcpy and by cross-memory attach to this very
/// process), splits into ops of whole pieces, and touches no byte between pieces.
#[test]
fn strided_ops_move_exactly_their_pieces() {
    let eng = CopyEngine::new(2, Duration::ZERO).unwrap();
    let src: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8 + 1).collect();
    // 100 pieces of 48 bytes: source every 512 bytes, destination every 64.
    let (len, count, ss, ds) = (48u64, 100u64, 512u64, 64u64);
    let check = |dst: &[u8]| {
        for i in 0..count as usize {
            let (s, d) = (i * ss as usize, i * ds as usize);
            assert_eq!(
                &dst[d..d + len as usize],
                &src[s..s + len as usize],
                "piece {i}"
            );
            assert!(
                dst[d + len as usize..d + ds as usize]
                    .iter()
                    .all(|&b| b == 0),
                "gap {i}"
            );
        }
    };
    let mut dst = vec![0u8; 8192];
    let kind = CopyKind::StridedMemcpy {
        src: src.as_ptr() as u64,
        dst: dst.as_mut_ptr() as u64,
        len,
        src_stride: ss,
        dst_stride: ds,
        count,
    };
    assert_eq!(kind.len(), len * count);
    // Parts of whole pieces: 4 pieces (192 bytes) fit in 200.
    let parts = kind.split(200);
    assert_eq!(parts.len(), 25);
    assert_eq!(parts.iter().map(CopyKind::len).sum::<u64>(), kind.len());
    let n = parts.len();
    let ops = parts
        .into_iter()
        .map(|k| CopyOp::new(Token(3), k))
        .collect();
    // SAFETY: src/dst outlive the completions collected below.
    unsafe { eng.submit(ops) }.unwrap();
    let mut out = Vec::new();
    collect(&eng, &mut out, n);
    assert!(out.iter().all(|(t, r)| *t == Token(3) && r.is_ok()));
    check(&dst);
    // Cross-memory attach, read and write, against this process (1100 pieces: two syscalls).
    let pid = std::process::id() as i32;
    let count = 1100u64;
    let big: Vec<u8> = (0..count * ss).map(|i| (i % 239) as u8 + 1).collect();
    let mut got = vec![0u8; (count * ds) as usize];
    let read = CopyKind::StridedCma {
        pid,
        local: got.as_mut_ptr() as u64,
        remote: big.as_ptr() as u64,
        len,
        local_stride: ds,
        remote_stride: ss,
        count,
        write: false,
    };
    // SAFETY: both buffers outlive the call; no reference to `got` is used meanwhile.
    unsafe { execute(read) }.unwrap();
    let mut back = vec![0u8; big.len()];
    let write = CopyKind::StridedCma {
        pid,
        local: got.as_ptr() as u64,
        remote: back.as_mut_ptr() as u64,
        len,
        local_stride: ds,
        remote_stride: ss,
        count,
        write: true,
    };
    // SAFETY: as above.
    unsafe { execute(write) }.unwrap();
    for i in 0..count as usize {
        let (s, d) = (i * ss as usize, i * ds as usize);
        assert_eq!(
            &got[d..d + len as usize],
            &big[s..s + len as usize],
            "cma read piece {i}"
        );
        assert_eq!(
            &back[s..s + len as usize],
            &big[s..s + len as usize],
            "cma write piece {i}"
        );
        assert!(back[s + len as usize..s + ss as usize]
            .iter()
            .all(|&b| b == 0));
    }
    // Overflowing spans are refused, naming the op.
    let bad = CopyKind::StridedMemcpy {
        src: u64::MAX - 10,
        dst: 1,
        len: 4,
        src_stride: 8,
        dst_stride: 8,
        count: 3,
    };
    // SAFETY: refused before any byte is touched.
    let e = unsafe { execute(bad) }.unwrap_err();
    assert!(e.to_string().contains("3 x 4 bytes"), "{e}");
}
