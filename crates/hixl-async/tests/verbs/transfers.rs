//! Transfers across processes: verified blocks and notifies, many descriptors, a dropped
//! transfer's backlog, and out-of-range descriptors.

use std::io::Write;
use std::time::{Duration, Instant};

use hixl_async::HostBuffer;
use hixl_core::{Error, OpDesc};

use crate::setup::{checksum, connect, device, engine, pattern, region_bytes, rt};
use crate::target::Target;
use crate::{KV, T};

pub(crate) fn write_read_blocks_verified_across_processes_and_notify_after_data() {
    let Some(dev) = device("write_read_blocks_verified_across_processes") else {
        return;
    };
    let mut t = Target::spawn(&dev);
    rt().block_on(async {
        let e = engine(&dev).await;
        let local = e
            .register(HostBuffer::zeroed(KV).expect("buffer"))
            .expect("register");
        let p = connect(&e, &t.addr).await;
        let kv = p.region("kv").expect("kv in the peer's table");
        assert_eq!((kv.addr, kv.len), t.kv);
        let mut off = 0u64;
        for (i, size) in [16usize << 10, 128 << 10, 2 << 20].into_iter().enumerate() {
            // READ the target's pattern into local memory and check it.
            p.read(&[OpDesc::new(local.addr() + off, kv.addr + off, size as u64)])
                .timeout(T)
                .await
                .expect("read");
            let mut want = vec![0u8; size];
            pattern(1, off, &mut want);
            assert!(
                region_bytes(&local, off, size) == want,
                "READ of {size} bytes"
            );
            // WRITE a new pattern and have the target check its memory.
            let mut data = vec![0u8; size];
            pattern(100 + i as u64, off, &mut data);
            local.write_at(off, &data).expect("fill");
            p.write(&[OpDesc::new(local.addr() + off, kv.addr + off, size as u64)])
                .timeout(T)
                .await
                .expect("write");
            assert_eq!(
                t.sum(off, size as u64),
                checksum(&data),
                "WRITE of {size} bytes"
            );
            off += size as u64;
        }
        // Notify after data: the target reads its memory when the notify arrives.
        let size = 1u64 << 20;
        let mut data = vec![0u8; size as usize];
        pattern(7, off, &mut data);
        local.write_at(off, &data).expect("fill");
        writeln!(t.stdin, "NOTIFY {off} {size}").expect("to target");
        t.stdin.flush().expect("flush");
        p.write(&[OpDesc::new(local.addr() + off, kv.addr + off, size)])
            .timeout(T)
            .await
            .expect("write before notify");
        p.notify("cache_ready", "blocks").await.expect("notify");
        let note = t.expect_line("NOTE");
        assert_eq!(note, format!("cache_ready {}", checksum(&data)));
        e.shutdown(Duration::from_secs(1)).await;
    });
}

pub(crate) fn thousands_of_descriptors_per_call() {
    let Some(dev) = device("thousands_of_descriptors_per_call") else {
        return;
    };
    rt().block_on(async {
        let (a, b) = (engine(&dev).await, engine(&dev).await);
        const N: usize = 5000; // more than the send queue holds: part waits in the backlog
        const B: usize = 1024;
        let target = b
            .register_with(
                HostBuffer::zeroed(N * B).expect("buf"),
                hixl_core::Access::REMOTE_RW,
                Some("t"),
            )
            .expect("register");
        let src = a
            .register(HostBuffer::zeroed(N * B).expect("buf"))
            .expect("register");
        let dst = a
            .register(HostBuffer::zeroed(N * B).expect("buf"))
            .expect("register");
        let mut data = vec![0u8; N * B];
        pattern(3, 0, &mut data);
        src.write_at(0, &data).expect("fill");
        let p = connect(&a, b.local_engine()).await;
        // Descriptor i writes block i to slot N-1-i (a permutation), then reads it back.
        let descs: Vec<OpDesc> = (0..N)
            .map(|i| {
                OpDesc::new(
                    src.addr() + (i * B) as u64,
                    target.addr() + ((N - 1 - i) * B) as u64,
                    B as u64,
                )
            })
            .collect();
        p.write(&descs).timeout(T).await.expect("write");
        for i in [0, 1, N / 2, N - 1] {
            assert!(
                region_bytes(&target, ((N - 1 - i) * B) as u64, B) == data[i * B..(i + 1) * B],
                "block {i}"
            );
        }
        let back: Vec<OpDesc> = (0..N)
            .map(|i| {
                OpDesc::new(
                    dst.addr() + (i * B) as u64,
                    target.addr() + ((N - 1 - i) * B) as u64,
                    B as u64,
                )
            })
            .collect();
        p.read(&back).timeout(T).await.expect("read");
        assert!(region_bytes(&dst, 0, N * B) == data, "read back {N} blocks");
        assert_eq!(a.ops_in_flight(), 0);
    });
}

pub(crate) fn a_dropped_transfer_posts_nothing_more_from_its_backlog() {
    let Some(dev) = device("a_dropped_transfer_posts_nothing_more_from_its_backlog") else {
        return;
    };
    rt().block_on(async {
        let (a, b) = (engine(&dev).await, engine(&dev).await);
        const N: usize = 8000; // the send queue takes 2048; the rest waits in the backlog
        const B: usize = 1024;
        let target = b
            .register_with(
                HostBuffer::zeroed(N * B).expect("buf"),
                hixl_core::Access::REMOTE_RW,
                Some("t"),
            )
            .expect("register");
        let src = a
            .register(HostBuffer::zeroed(N * B).expect("buf"))
            .expect("register");
        let mut data = vec![0u8; N * B];
        pattern(5, 0, &mut data);
        src.write_at(0, &data).expect("fill");
        let p = connect(&a, b.local_engine()).await;
        let descs: Vec<OpDesc> = (0..N)
            .map(|i| {
                OpDesc::new(
                    src.addr() + (i * B) as u64,
                    target.addr() + (i * B) as u64,
                    B as u64,
                )
            })
            .collect();
        drop(p.write(&descs));
        let deadline = Instant::now() + T;
        while a.ops_in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(a.ops_in_flight(), 0, "the abandoned op is reaped");
        let landed = (0..N)
            .filter(|&i| region_bytes(&target, (i * B) as u64, B) == data[i * B..(i + 1) * B])
            .count();
        println!("{landed} of {N} blocks landed before the drop took effect");
        assert!(
            landed < N,
            "requests still in the backlog were posted after the drop"
        );
        // The link is fine: a new transfer completes.
        p.write(&descs[..16])
            .timeout(T)
            .await
            .expect("write after the drop");
        assert!(p.is_connected());
    });
}

pub(crate) fn remote_range_outside_the_peers_regions_is_refused_before_posting() {
    let Some(dev) = device("remote_range_outside_the_peers_regions") else {
        return;
    };
    rt().block_on(async {
        let (a, b) = (engine(&dev).await, engine(&dev).await);
        let target = b
            .register_with(
                HostBuffer::zeroed(1 << 20).expect("buf"),
                hixl_core::Access::REMOTE_RW,
                Some("t"),
            )
            .expect("register");
        let src = a
            .register(HostBuffer::zeroed(1 << 20).expect("buf"))
            .expect("register");
        let p = connect(&a, b.local_engine()).await;
        let bad = OpDesc::new(src.addr(), target.addr() + (1 << 20) - 100, 4096);
        let good = OpDesc::new(src.addr(), target.addr(), 4096);
        let e = p
            .write(&[good, bad])
            .timeout(T)
            .await
            .expect_err("out of bounds");
        assert!(
            matches!(e, Error::RemoteOutOfBounds { index: 1, .. }),
            "{e:?}"
        );
        // Nothing was posted, so the QP is still fine.
        p.write(&[good]).timeout(T).await.expect("link still works");
        assert!(p.is_connected());
    });
}

/// Strided descriptors over verbs: each checked once by its spans, its pieces posted as work
/// requests of the batch's one chain (more than the send queue holds: part waits in the
/// backlog); every piece and every gap checked both ways.
pub(crate) fn strided_descriptors_as_one_chain() {
    let Some(dev) = device("strided_descriptors_as_one_chain") else {
        return;
    };
    rt().block_on(async {
        let (a, b) = (engine(&dev).await, engine(&dev).await);
        // 3000 pieces of 100 bytes: packed locally, every 512 bytes at the target.
        const N: u64 = 3000;
        const P: u64 = 100;
        const S: u64 = 512;
        let target = b
            .register_with(
                HostBuffer::zeroed((N * S) as usize).expect("buf"),
                hixl_core::Access::REMOTE_RW,
                Some("t"),
            )
            .expect("register");
        let src = a
            .register(HostBuffer::zeroed((N * P) as usize).expect("buf"))
            .expect("register");
        let dst = a
            .register(HostBuffer::zeroed((N * S) as usize).expect("buf"))
            .expect("register");
        let mut data = vec![0u8; (N * P) as usize];
        pattern(5, 0, &mut data);
        src.write_at(0, &data).expect("fill");
        let p = connect(&a, b.local_engine()).await;
        let w = hixl_core::StridedDesc {
            local_addr: src.addr(),
            remote_addr: target.addr(),
            len: P,
            local_stride: P,
            remote_stride: S,
            count: N,
        };
        p.transfer_strided(hixl_core::TransferOp::Write, &[w])
            .timeout(T)
            .await
            .expect("strided write");
        let got = region_bytes(&target, 0, (N * S) as usize);
        for i in 0..N as usize {
            let at = i * S as usize;
            assert!(
                got[at..at + P as usize] == data[i * P as usize..(i + 1) * P as usize],
                "piece {i}"
            );
            assert!(
                got[at + P as usize..at + S as usize]
                    .iter()
                    .all(|&x| x == 0),
                "gap {i}"
            );
        }
        // Back into every 512 bytes locally.
        let r = hixl_core::StridedDesc {
            local_addr: dst.addr(),
            local_stride: S,
            ..w
        };
        p.transfer_strided(hixl_core::TransferOp::Read, &[r])
            .timeout(T)
            .await
            .expect("strided read");
        let back = region_bytes(&dst, 0, (N * S) as usize);
        assert!(back == got, "read back");
        // A span past the region: refused before anything is posted.
        let past = hixl_core::StridedDesc { count: N + 1, ..w };
        let e = p
            .transfer_strided(hixl_core::TransferOp::Write, &[past])
            .await
            .expect_err("span past the region");
        assert!(e.to_string().contains("descriptor 0"), "{e}");
        assert_eq!(a.ops_in_flight(), 0);
    });
}
