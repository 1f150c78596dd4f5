//! The engine over real RDMA verbs (`hixl.Transport=verbs`): run inside the Soft-RoCE guest by
//! `tools/verbs-tests.sh`, with `HIXL_VERBS_DEVICE` naming the device (e.g. `rxe0`). Without it
//! every test prints that it is skipped and returns.
//!
//! The two-process tests re-execute this binary as the target (`target_role`, ignored as a
//! test), which runs an engine with a region named `kv`, announces `HIXL ADDR <engine>` and
//! `HIXL KV <addr> <len>` on stdout and answers `SUM <offset> <len>` and `NOTIFY` on stdin.
#![cfg(feature = "verbs")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hixl_async::{Engine, HostBuffer, Peer, Region};
use hixl_core::{Error, OpDesc, TransferOp};

const DEVICE_VAR: &str = "HIXL_VERBS_DEVICE";
const ROLE_VAR: &str = "HIXL_ENGINE_ROLE";
const KV: usize = 8 << 20;
const T: Duration = Duration::from_secs(30);

fn device(test: &str) -> Option<String> {
    match std::env::var(DEVICE_VAR) {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            eprintln!("{test}: skipped ({DEVICE_VAR} is not set; tools/verbs-tests.sh runs it in the Soft-RoCE guest)");
            None
        }
    }
}

async fn engine(dev: &str) -> Engine {
    Engine::builder("127.0.0.1")
        .ephemeral_port()
        .option("hixl.Transport", "verbs")
        .option("hixl.VerbsDevice", dev)
        .build()
        .await
        .expect("engine with the verbs backend")
}

fn pattern(seed: u64, off: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        let x = (off + i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
        *b = (x >> 29) as u8;
    }
}

fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

fn region_bytes(r: &Region, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    r.read_at(off, &mut v).expect("read region");
    v
}

/// The target role of the two-process tests (run by `Target::spawn`).
#[test]
#[ignore = "the target role of the two-process tests; Target::spawn runs it"]
fn target_role() {
    if std::env::var(ROLE_VAR).as_deref() != Ok("target") {
        return;
    }
    let Some(dev) = device("target_role") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async move {
        let e = engine(&dev).await;
        let mut buf = HostBuffer::zeroed(KV).expect("buffer");
        pattern(1, 0, buf.as_mut_slice());
        let kv = e
            .register_with(buf, hixl_core::Access::REMOTE_RW, Some("kv"))
            .expect("register kv");
        println!("HIXL ADDR {}", e.local_engine());
        println!("HIXL KV {} {}", kv.addr(), kv.len());
        let mut notes = e.notifications();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = rx.recv().await {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["SUM", off, len] => {
                    let (off, len): (u64, usize) =
                        (off.parse().unwrap_or(0), len.parse().unwrap_or(0));
                    println!("HIXL SUM {}", checksum(&region_bytes(&kv, off, len)));
                }
                ["NOTIFY", off, len] => {
                    let (off, len): (u64, usize) =
                        (off.parse().unwrap_or(0), len.parse().unwrap_or(0));
                    let n = tokio::time::timeout(T, notes.next()).await;
                    // Read the memory right when the notify is seen: the data must be there.
                    let sum = checksum(&region_bytes(&kv, off, len));
                    match n {
                        Ok(Some(n)) => {
                            println!("HIXL NOTE {} {sum}", String::from_utf8_lossy(&n.name))
                        }
                        _ => println!("HIXL NOTE none 0"),
                    }
                }
                _ => println!("HIXL ERR {line:?}"),
            }
        }
    });
}

struct Target {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: String,
    kv: (u64, u64),
}

impl Target {
    fn spawn(dev: &str) -> Target {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([
                "target_role",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_VAR, "target")
            .env(DEVICE_VAR, dev)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn target");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut t = Target {
            child,
            stdin,
            stdout,
            addr: String::new(),
            kv: (0, 0),
        };
        t.addr = t.expect_line("ADDR");
        let kv: Vec<u64> = t
            .expect_line("KV")
            .split_whitespace()
            .map(|w| w.parse().expect("KV field"))
            .collect();
        t.kv = (kv[0], kv[1]);
        t
    }

    fn expect_line(&mut self, word: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("read from target");
            assert!(n > 0, "target exited before sending {word}");
            if let Some((_, rest)) = line.trim_end().split_once("HIXL ") {
                let (w, rest) = rest.split_once(' ').unwrap_or((rest, ""));
                assert_eq!(w, word, "target said {line:?}");
                return rest.to_string();
            }
        }
    }

    fn ask(&mut self, cmd: &str, word: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("write to target");
        self.stdin.flush().expect("flush");
        self.expect_line(word)
    }

    fn sum(&mut self, off: u64, len: u64) -> u64 {
        self.ask(&format!("SUM {off} {len}"), "SUM")
            .parse()
            .expect("checksum")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn connect(e: &Engine, addr: &str) -> Peer {
    let p = e.connect(addr, T).await.expect("connect");
    assert!(
        p.transport().starts_with("verbs"),
        "transport: {}",
        p.transport()
    );
    println!("transport: {}", p.transport());
    p
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn write_read_blocks_verified_across_processes_and_notify_after_data() {
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

#[test]
fn thousands_of_descriptors_per_call() {
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

#[test]
fn a_dropped_transfer_posts_nothing_more_from_its_backlog() {
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

#[test]
fn remote_range_outside_the_peers_regions_is_refused_before_posting() {
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

#[test]
fn deregistration_revokes_device_access_and_the_peer_can_reconnect() {
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
            matches!(
                last,
                Error::RemoteOutOfBounds { .. }
                    | Error::PeerLost { .. }
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

#[test]
fn killed_target_fails_in_flight_ops_without_hanging() {
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
                matches!(
                    e,
                    Error::PeerLost { .. } | Error::NotConnected { .. } | Error::Timeout { .. }
                ),
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

#[test]
fn auto_transport_without_a_device_uses_tcp_and_says_why() {
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
