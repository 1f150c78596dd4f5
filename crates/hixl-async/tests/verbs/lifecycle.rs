//! Registration and link lifecycle: revocation on deregistration and reconnect, a killed
//! target, and the tcp fallback without a device.

use std::time::{Duration, Instant};

use hixl_async::{Engine, HostBuffer};
use hixl_core::{Error, OpDesc, TransferOp};

use crate::setup::{checksum, connect, device, engine, pattern, region_bytes, rt};
use crate::target::Target;
use crate::{DEVICE_VAR, KV, T};

pub(crate) fn deregistration_revokes_device_access_and_the_peer_can_reconnect() {
    let Some(dev) = device("deregistration_revokes_device_access") else {
        return;
    };
    rt().block_on(async {
        let (a, b) = (engine(&dev).await, engine(&dev).await);
        const LEN: usize = 4 << 20;
        let target = b
            .register_with(
                HostBuffer::zeroed(LEN).expect("buf"),
                hixl_core::Access::REMOTE_RW,
                Some("t"),
            )
            .expect("register");
        let src = a
            .register(HostBuffer::zeroed(LEN).expect("buf"))
            .expect("register");
        let mut ones = vec![0u8; LEN];
        pattern(9, 0, &mut ones);
        src.write_at(0, &ones).expect("fill");
        let p = connect(&a, b.local_engine()).await;
        let (taddr, saddr) = (target.addr(), src.addr());
        // A stream of WRITEs into the region while it is deregistered.
        // Writes completed so far: the region is deregistered only after the first one, so
        // that the stream is known to be flowing when the deregistration hits it.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let writer = {
            let (p, done) = (p.clone(), done.clone());
            tokio::spawn(async move {
                let (mut ok, mut failed, mut last) = (0, 0, None);
                let mut until = Instant::now() + Duration::from_secs(3);
                while Instant::now() < until {
                    let descs: Vec<OpDesc> = (0..4)
                        .map(|i| {
                            OpDesc::new(
                                saddr + i * (LEN as u64 / 4),
                                taddr + i * (LEN as u64 / 4),
                                LEN as u64 / 4,
                            )
                        })
                        .collect();
                    match p.write(&descs).timeout(T).await {
                        Ok(()) => {
                            ok += 1;
                            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Err(e) => {
                            failed += 1;
                            last = Some(e);
                        }
                    }
                    if ok == 0 && failed == 0 {
                        // A slow guest: keep going until the first write is through.
                        until = until.max(Instant::now() + Duration::from_secs(1));
                    }
                }
                (ok, failed, last)
            })
        };
        let deadline = Instant::now() + T;
        while done.load(std::sync::atomic::Ordering::SeqCst) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let buf = b
            .deregister(&target)
            .await
            .expect("deregister")
            .expect("owned buffer back");
        let sum = checksum(buf.as_slice());
        // The initiator keeps trying for a while: nothing may land in the returned memory.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            checksum(buf.as_slice()),
            sum,
            "memory changed after deregistration"
        );
        let (ok, failed, last) = writer.await.expect("writer");
        println!("writes: {ok} completed, {failed} failed; last error: {last:?}");
        assert!(ok > 0 && failed > 0, "{ok} ok, {failed} failed");
        let last = last.expect("an error");
        assert!(
            last.is_link_lost()
                || matches!(
                    last,
                    Error::RemoteOutOfBounds { .. }
                        | Error::NotConnected { .. }
                        | Error::Remote { .. }
                ),
            "{last:?}"
        );
        // Whether a write hit the revoked region on the device (the QP failed and the link
        // closed) or the updated table refused it first, the peer can be used again.
        let t2 = b
            .register_with(
                HostBuffer::zeroed(1 << 20).expect("buf"),
                hixl_core::Access::REMOTE_RW,
                Some("t2"),
            )
            .expect("register");
        let p = if p.is_connected() {
            // A write the device refused paused the rail it hit (its queue pair is in the
            // error state); the link's keeper probes it back with new queue pairs.
            let deadline = Instant::now() + T;
            while !p.rails().iter().all(|r| r.up) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            for r in p.rails() {
                println!("  {r}");
            }
            p
        } else {
            println!("link closed by the device's refusal: {:?}", p.error());
            connect(&a, b.local_engine()).await
        };
        let deadline = Instant::now() + T;
        while p.region("t2").is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        p.write(&[OpDesc::new(saddr, t2.addr(), 1 << 20)])
            .timeout(T)
            .await
            .expect("write after reconnect");
        assert!(region_bytes(&t2, 0, 1 << 20) == ones[..1 << 20]);
    });
}

pub(crate) fn killed_target_fails_in_flight_ops_without_hanging() {
    let Some(dev) = device("killed_target_fails_in_flight_ops") else {
        return;
    };
    let mut t = Target::spawn(&dev);
    rt().block_on(async {
        let e = engine(&dev).await;
        let local = e
            .register(HostBuffer::zeroed(KV).expect("buffer"))
            .expect("register");
        let p = connect(&e, &t.addr).await;
        let kv = p.region("kv").expect("kv");
        let mut tasks = Vec::new();
        for k in 0..4u64 {
            let p = p.clone();
            let (l, r) = (local.addr() + k * (2 << 20), kv.addr + k * (2 << 20));
            tasks.push(tokio::spawn(async move {
                let mut results = Vec::new();
                loop {
                    let op = if k % 2 == 0 {
                        TransferOp::Write
                    } else {
                        TransferOp::Read
                    };
                    let started = Instant::now();
                    let r = p
                        .transfer(op, &[OpDesc::new(l, r, 2 << 20)])
                        .timeout(T)
                        .await;
                    let failed = r.is_err();
                    results.push((r, started.elapsed()));
                    if failed {
                        return results;
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let killed = Instant::now();
        t.child.kill().expect("kill target");
        let _ = t.child.wait();
        for task in tasks {
            let results = tokio::time::timeout(T + Duration::from_secs(5), task)
                .await
                .expect("ops resolve after the kill (no hang)")
                .expect("task");
            let (last, took) = results.last().expect("at least one op");
            let e = last.as_ref().expect_err("the last op failed");
            println!(
                "{} ops completed, then: {e} (after {took:?}; {:?} after the kill)",
                results.len() - 1,
                killed.elapsed()
            );
            assert!(
                e.is_link_lost() || matches!(e, Error::NotConnected { .. } | Error::Timeout { .. }),
                "{e:?}"
            );
        }
        assert!(!p.is_connected());
        assert_eq!(e.ops_in_flight(), 0, "every op resolved");
        // The initiator is healthy: a fresh target can be reached.
        let t2 = Target::spawn(&dev);
        let p2 = connect(&e, &t2.addr).await;
        let kv2 = p2.region("kv").expect("kv");
        p2.read(&[OpDesc::new(local.addr(), kv2.addr, 1 << 20)])
            .timeout(T)
            .await
            .expect("read from a new target");
        let mut want = vec![0u8; 1 << 20];
        pattern(1, 0, &mut want);
        assert!(region_bytes(&local, 0, 1 << 20) == want);
    });
}

pub(crate) fn auto_transport_without_a_device_uses_tcp_and_says_why() {
    // Runs everywhere: on a machine without RDMA `auto` must fall back, and name the reason.
    if std::env::var(DEVICE_VAR).is_ok() {
        return;
    }
    rt().block_on(async {
        let a = Engine::builder("127.0.0.1")
            .ephemeral_port()
            .option("hixl.Transport", "tcp")
            .build()
            .await
            .expect("engine");
        let b = Engine::builder("127.0.0.1").build().await.expect("engine");
        let why = b.verbs_status().expect_err("no device here");
        assert!(!why.is_empty());
        let p = b.connect(a.local_engine(), T).await.expect("connect");
        assert!(p.transport().contains("not verbs"), "{}", p.transport());
        let forced = Engine::builder("127.0.0.1")
            .option("hixl.Transport", "verbs")
            .build()
            .await
            .expect_err("no device");
        assert!(
            forced.to_string().contains("hixl.Transport=verbs"),
            "{forced}"
        );
    });
}
