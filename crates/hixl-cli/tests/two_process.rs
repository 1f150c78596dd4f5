//! Two real OS processes over 127.0.0.1: a `hixl serve` target and an initiator engine here.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use hixl::wire::{Channel, DataReq, Message};
use hixl::{Engine, HostBuffer, OpDesc, Peer, Region, Status};
use hixl_cli::child::Target;
use hixl_cli::util::{checksum, fill_pattern};

const T: Duration = Duration::from_secs(10);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_hixl"))
}

/// How the initiator reaches the target in a test.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// TCP data path (`hixl.Transport=tcp`).
    Tcp,
    /// Same-host fabric; the target's region is plain host memory (cross-memory attach).
    FabricCma,
    /// Same-host fabric; the target's region comes from its fabric pool (a mapped memfd).
    FabricPool,
}

impl Mode {
    fn transport(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::FabricCma | Mode::FabricPool => "fabric",
        }
    }
    fn target_args(self) -> &'static [&'static str] {
        match self {
            Mode::FabricPool => &["--pool"],
            _ => &[],
        }
    }
    fn spawn(self, mem: u64) -> Target {
        Target::spawn(exe(), mem, self.target_args()).unwrap()
    }
    async fn connect(self, e: &Engine, target: &Target) -> Peer {
        let p = e.connect(&target.engine, T).await.unwrap();
        assert!(
            p.transport().starts_with(self.transport()),
            "{self:?}: {}",
            p.transport()
        );
        if let Mode::FabricPool = self {
            assert!(
                p.transport().contains("1 pool regions mapped"),
                "{}",
                p.transport()
            );
        }
        p
    }
}

/// Runs an async test body once per mode.
macro_rules! modes {
    ($body:ident: $($m:ident),+) => {
        mod $body {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[allow(non_snake_case)]
                async fn $m() {
                    super::$body(super::Mode::$m).await
                }
            )+
        }
    };
}

modes!(write_then_read_128mib_in_16k_128k_2m_blocks_verified: Tcp, FabricCma, FabricPool);
modes!(a_thousand_concurrent_transfers: Tcp, FabricPool);
modes!(notify_after_completion_never_overtakes_the_data: Tcp, FabricCma, FabricPool);
modes!(dropped_reads_never_land_in_returned_memory: Tcp, FabricPool);
modes!(peer_killed_mid_transfer_fails_every_pending_op_and_engine_survives: Tcp, FabricCma);

async fn initiator_with(len: usize, transport: &str) -> (Engine, Region) {
    let e = Engine::builder("127.0.0.1")
        .option("hixl.Transport", transport)
        .build()
        .await
        .unwrap();
    let r = e.register(HostBuffer::zeroed(len).unwrap()).unwrap();
    (e, r)
}

async fn initiator(len: usize) -> (Engine, Region) {
    initiator_with(len, "tcp").await
}

fn blocks(local: &Region, remote: u64, len: u64, block: u64) -> Vec<OpDesc> {
    (0..len / block)
        .map(|i| OpDesc::new(local.addr() + i * block, remote + i * block, block))
        .collect()
}

/// Asks the target to checksum its region and says whether it matched.
async fn target_has(peer: &Peer, target: &mut Target, off: u64, len: u64, sum: u64) -> String {
    peer.notify("hixl.verify", format!("{off} {len} {sum}"))
        .await
        .unwrap();
    target.wait_line("VERIFY", T).unwrap()
}

async fn write_then_read_128mib_in_16k_128k_2m_blocks_verified(mode: Mode) {
    const LEN: u64 = 128 << 20;
    let mut target = mode.spawn(LEN);
    let (e, local) = initiator_with(LEN as usize, mode.transport()).await;
    let peer = mode.connect(&e, &target).await;
    let kv = peer.region("kv").unwrap();
    let mut data = vec![0u8; LEN as usize];
    for block in [16 << 10, 128 << 10, 2 << 20] {
        fill_pattern(&mut data, block);
        let sum = checksum(&data);
        local.write_at(0, &data).unwrap();
        let descs = blocks(&local, kv.addr, LEN, block);
        peer.write(&descs)
            .timeout(Duration::from_secs(120))
            .await
            .unwrap();
        let v = target_has(&peer, &mut target, 0, LEN, sum).await;
        assert!(v.starts_with("VERIFY ok"), "block {block}: {v}");
        local.write_at(0, &vec![0u8; LEN as usize]).unwrap();
        peer.read(&descs)
            .timeout(Duration::from_secs(120))
            .await
            .unwrap();
        local.read_at(0, &mut data).unwrap();
        assert_eq!(
            checksum(&data),
            sum,
            "read back with {block}-byte blocks differs"
        );
    }
    target.stop();
}

async fn a_thousand_concurrent_transfers(mode: Mode) {
    let mut target = mode.spawn(4 << 20);
    let (e, local) = initiator_with(4 << 20, mode.transport()).await;
    let mut data = vec![0u8; 4 << 20];
    fill_pattern(&mut data, 99);
    local.write_at(0, &data).unwrap();
    let peer = mode.connect(&e, &target).await;
    let kv = peer.region("kv").unwrap();
    let futs: Vec<_> = (0..1000u64)
        .map(|i| {
            let off = (i % 1024) * 4096;
            peer.write(&[OpDesc::new(local.addr() + off, kv.addr + off, 4096)])
        })
        .collect();
    for r in futures::future::join_all(futs).await {
        r.unwrap();
    }
    let v = target_has(
        &peer,
        &mut target,
        0,
        1000 * 4096,
        checksum(&data[..1000 * 4096]),
    )
    .await;
    assert!(v.starts_with("VERIFY ok"), "{v}");
    assert_eq!(e.ops_in_flight(), 0);
    target.stop();
}

async fn notify_after_completion_never_overtakes_the_data(mode: Mode) {
    let mut target = mode.spawn(8 << 20);
    let (e, local) = initiator_with(8 << 20, mode.transport()).await;
    let peer = mode.connect(&e, &target).await;
    let kv = peer.region("kv").unwrap();
    let mut data = vec![0u8; 8 << 20];
    for round in 0..20u64 {
        fill_pattern(&mut data, round + 1);
        local.write_at(0, &data).unwrap();
        peer.write(&blocks(&local, kv.addr, 8 << 20, 256 << 10))
            .await
            .unwrap();
        // The target checks its memory when the notify arrives.
        let v = target_has(&peer, &mut target, 0, 8 << 20, checksum(&data)).await;
        assert!(v.starts_with("VERIFY ok"), "round {round}: {v}");
    }
    target.stop();
}

async fn dropped_reads_never_land_in_returned_memory(mode: Mode) {
    let target = mode.spawn(64 << 20);
    let (e, local) = initiator_with(64 << 20, mode.transport()).await;
    let peer = mode.connect(&e, &target).await;
    let kv = peer.region("kv").unwrap();
    for _ in 0..8 {
        drop(peer.read(&blocks(&local, kv.addr, 64 << 20, 64 << 10)));
    }
    // Deregistering waits until no op can touch the region, then hands the buffer back.
    let mut buf = e
        .deregister(&local)
        .await
        .unwrap()
        .expect("owned buffer comes back");
    buf.as_mut_slice().fill(0xAB);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        buf.as_slice().iter().all(|&b| b == 0xAB),
        "a late read landed in returned memory"
    );
    // abandoned ops are reaped, and the engine keeps working
    for _ in 0..100 {
        if e.ops_in_flight() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(e.ops_in_flight(), 0, "abandoned ops leaked");
    let local = e.register(buf).unwrap();
    peer.write(&[OpDesc::new(local.addr(), kv.addr, 1 << 20)])
        .await
        .unwrap();
    target.stop();
}

async fn peer_killed_mid_transfer_fails_every_pending_op_and_engine_survives(mode: Mode) {
    let mut target = mode.spawn(256 << 20);
    let (e, local) = initiator_with(256 << 20, mode.transport()).await;
    let peer = mode.connect(&e, &target).await;
    let kv = peer.region("kv").unwrap();
    let futs: Vec<_> = (0..8u64)
        .map(|i| {
            let off = i * (32 << 20);
            let d: Vec<OpDesc> = (0..2048u64)
                .map(|k| {
                    OpDesc::new(
                        local.addr() + off + k * 16384,
                        kv.addr + off + k * 16384,
                        16384,
                    )
                })
                .collect();
            peer.write(&d)
        })
        .collect();
    // Killed while the writes are under way (posted when created: 256 MiB in flight), not
    // after a guess at how long they take.
    assert!(e.ops_in_flight() > 0, "the writes are in flight");
    target.kill();
    let results = tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(futs))
        .await
        .expect("pending transfers hung after the peer died");
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert!(failed > 0, "no transfer noticed the peer's death");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            r.to_string().contains(&target.engine),
            "error does not name the peer: {r}"
        );
    }
    // Copies into a dead process fail at once (ESRCH); the link itself is declared dead when
    // the control connection reports the close, a moment later.
    for _ in 0..500 {
        if !peer.is_connected() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !peer.is_connected(),
        "the link to a killed peer still looks up"
    );
    let e2 = peer
        .write(&[OpDesc::new(local.addr(), kv.addr, 4096)])
        .await
        .unwrap_err();
    assert!(e2.to_string().contains(&target.engine), "{e2}");
    // the engine is still usable: reconnect to a fresh target
    let target2 = mode.spawn(1 << 20);
    let p2 = e.connect(&target2.engine, T).await.unwrap();
    let kv2 = p2.region("kv").unwrap();
    p2.write(&[OpDesc::new(local.addr(), kv2.addr, 1 << 20)])
        .await
        .unwrap();
    e.disconnect(&target.engine).await.unwrap();
    target2.stop();
}

fn frame(m: &Message) -> Vec<u8> {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    b.to_vec()
}

/// Reads one message; bytes after it stay in `buf` for the next call.
fn read_msg(s: &mut TcpStream, buf: &mut BytesMut) -> Message {
    loop {
        if let Some(m) = Message::decode(buf).unwrap() {
            return m;
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&tmp[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_only_that_connection() {
    let target = Target::spawn(exe(), 1 << 20, &[]).unwrap();
    let (e, local) = initiator(1 << 20).await;
    let peer = e.connect(&target.engine, T).await.unwrap();
    let kv = peer.region("kv").unwrap();
    let engine = target.engine.clone();
    tokio::task::spawn_blocking(move || {
        // garbage instead of a hello
        let mut s = TcpStream::connect(&engine).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let mut b = [0u8; 16];
        assert_eq!(
            s.read(&mut b).unwrap_or(0),
            0,
            "target should close a garbage connection"
        );
        // a data connection for a session that does not exist
        let mut s = TcpStream::connect(&engine).unwrap();
        s.write_all(&frame(&Message::Hello {
            engine: "127.0.0.1".into(),
            channel: Channel::Data,
            session: 42,
            features: hixl::wire::FEATURES,
        }))
        .unwrap();
        match read_msg(&mut s, &mut BytesMut::new()) {
            Message::Refuse { status, .. } => assert_eq!(status, Status::NotConnected.code()),
            m => panic!("expected a refusal, got {m:?}"),
        }
    })
    .await
    .unwrap();
    // the real link is unaffected
    peer.write(&[OpDesc::new(local.addr(), kv.addr, 1 << 20)])
        .await
        .unwrap();
    target.stop();
}

/// Speaks the protocol by hand to send what a correct initiator never would: requests outside
/// the exported region or with a wrong rkey. The target must refuse them before a byte moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_refuses_out_of_bounds_and_wrong_rkey_before_a_byte_moves() {
    let mut target = Target::spawn(exe(), 1 << 20, &["--metrics", "127.0.0.1:0"]).unwrap();
    let metrics = target
        .wait_line("METRICS", T)
        .unwrap()
        .trim_start_matches("METRICS http://")
        .trim_end_matches("/metrics")
        .to_string();
    let engine = target.engine.clone();
    let (table, statuses) = tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(&engine).unwrap();
        c.write_all(&frame(&Message::Hello {
            engine: "127.0.0.1".into(),
            channel: Channel::Control,
            session: 7,
            features: hixl::wire::FEATURES,
        }))
        .unwrap();
        let mut cb = BytesMut::new();
        let Message::Welcome { session, .. } = read_msg(&mut c, &mut cb) else {
            panic!("no welcome")
        };
        let table = loop {
            match read_msg(&mut c, &mut cb) {
                Message::MemTable(t) => break t,
                Message::FabricInfo { .. } => continue, // a same-host offer we do not take up
                m => panic!("expected the memory table, got {m:?}"),
            }
        };
        let r = table[0].clone();
        let mut d = TcpStream::connect(&engine).unwrap();
        d.write_all(&frame(&Message::Hello {
            engine: "127.0.0.1".into(),
            channel: Channel::Data,
            session,
            features: hixl::wire::FEATURES,
        }))
        .unwrap();
        let mut db = BytesMut::new();
        assert!(matches!(read_msg(&mut d, &mut db), Message::Welcome { .. }));
        let payload = vec![0xEEu8; 8192];
        let bad = [
            DataReq {
                id: 1,
                rkey: r.rkey,
                addr: r.addr + r.len - 4096,
                len: 8192,
            }, // past the end
            DataReq {
                id: 2,
                rkey: r.rkey ^ 0x55,
                addr: r.addr,
                len: 8192,
            }, // wrong rkey
            DataReq {
                id: 3,
                rkey: r.rkey,
                addr: r.addr - 4096,
                len: 8192,
            }, // before the start
        ];
        let mut statuses = Vec::new();
        for q in bad {
            d.write_all(&frame(&Message::WriteReq(q))).unwrap();
            d.write_all(&payload).unwrap();
            match read_msg(&mut d, &mut db) {
                Message::Ack { id, status } => {
                    assert_eq!(id, q.id);
                    statuses.push(status);
                }
                m => panic!("expected an ack, got {m:?}"),
            }
        }
        d.write_all(&frame(&Message::ReadReq(DataReq {
            id: 4,
            rkey: r.rkey,
            addr: r.addr + r.len,
            len: 1,
        })))
        .unwrap();
        match read_msg(&mut d, &mut db) {
            Message::ReadResp { status, len, .. } => {
                assert_eq!(len, 0);
                statuses.push(status)
            }
            m => panic!("expected a read response, got {m:?}"),
        }
        (table, statuses)
    })
    .await
    .unwrap();
    assert!(
        statuses.iter().all(|&s| s == Status::ParamInvalid.code()),
        "{statuses:?}"
    );
    // The target counts what it refused, by op and the status it answered.
    let body = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(&metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body
    })
    .await
    .unwrap();
    for (op, n) in [("write", 3), ("read", 1)] {
        let tail = format!("op=\"{op}\",reason=\"PARAM_INVALID\"}} {n}");
        assert!(
            body.lines()
                .any(|l| l.starts_with("hixl_refused_total{") && l.ends_with(&tail)),
            "{tail} not in\n{body}"
        );
    }
    // nothing landed: the region is still all zeroes
    let (e, _local) = initiator(4096).await;
    let peer = e.connect(&target.engine, T).await.unwrap();
    let zeros = vec![0u8; table[0].len as usize];
    let v = target_has(&peer, &mut target, 0, table[0].len, checksum(&zeros)).await;
    assert!(
        v.starts_with("VERIFY ok"),
        "refused writes changed target memory: {v}"
    );
    target.stop();
}

/// The target deregisters a pooled region while this initiator is writing into it: copies in
/// flight finish, the target's deregister returns only after this side acknowledged, and later
/// accesses fail with an error that names the range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_revocation_while_mid_transfer() {
    let mut target = Mode::FabricPool.spawn(64 << 20);
    let (e, local) = initiator_with(64 << 20, "fabric").await;
    let peer = Mode::FabricPool.connect(&e, &target).await;
    let kv = peer.region("kv").unwrap();
    let writes: Vec<_> = (0..8)
        .map(|_| peer.write(&blocks(&local, kv.addr, 64 << 20, 64 << 10)))
        .collect();
    peer.notify("hixl.deregister", "").await.unwrap();
    let results = tokio::time::timeout(T, futures::future::join_all(writes))
        .await
        .expect("transfers hung across a revocation");
    let line = target.wait_line("DEREGISTERED", T).unwrap();
    assert_eq!(line, "DEREGISTERED ok");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(r.to_string().contains("0x"), "unclear error: {r}");
    }
    for _ in 0..200 {
        if peer.region("kv").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let err = peer
        .write(&[OpDesc::new(local.addr(), kv.addr, 4096)])
        .await
        .unwrap_err();
    assert!(
        matches!(err, hixl::Error::RemoteOutOfBounds { .. }),
        "after revocation: {err}"
    );
    assert!(peer.is_connected(), "revocation must not cost the link");
    target.stop();
}

/// With `EnableUseFabricMem=1` on both sides a pooled region is mapped at the same address in
/// the initiator; when that address is taken here, translation is used instead. Both move the
/// right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_unified_va_and_translated_mappings() {
    for taken in [false, true] {
        let mut target = Target::spawn(
            exe(),
            8 << 20,
            &["--pool", "--option", "EnableUseFabricMem=1"],
        )
        .unwrap();
        let e = Engine::builder("127.0.0.1")
            .option("hixl.Transport", "fabric")
            .option("EnableUseFabricMem", "1")
            .build()
            .await
            .unwrap();
        // Our own pool region takes the window's first address: the peer's must be translated.
        let _squat = taken.then(|| {
            e.register_pooled(8 << 20, hixl::Access::LOCAL, None)
                .unwrap()
        });
        let local = e.register(HostBuffer::zeroed(8 << 20).unwrap()).unwrap();
        let peer = e.connect(&target.engine, T).await.unwrap();
        let want = if taken {
            "1 of them translated"
        } else {
            "0 of them translated"
        };
        assert!(peer.transport().contains(want), "{}", peer.transport());
        let kv = peer.region("kv").unwrap();
        assert_eq!(
            kv.addr,
            40 << 40,
            "the target's pool starts the unified window"
        );
        let mut data = vec![0u8; 8 << 20];
        fill_pattern(&mut data, 5 + taken as u64);
        local.write_at(0, &data).unwrap();
        peer.write(&blocks(&local, kv.addr, 8 << 20, 1 << 20))
            .await
            .unwrap();
        let v = target_has(&peer, &mut target, 0, 8 << 20, checksum(&data)).await;
        assert!(v.starts_with("VERIFY ok"), "taken={taken}: {v}");
        target.stop();
    }
}

/// An initiator that may not attach to the target's process (another uid, no CAP_SYS_PTRACE)
/// is told so at connect: with `auto` the target's heap region goes over TCP and transfers
/// work; with `fabric` forced, connect refuses with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_without_cma_permission_falls_back_or_refuses() {
    // Run our binary as nobody; it must be reachable for that user.
    let copy = std::env::temp_dir().join(format!("hixl-nobody-{}", std::process::id()));
    std::fs::copy(exe(), &copy).unwrap();
    let _ = std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    let target = Target::spawn(exe(), 1 << 20, &[]).unwrap();
    let run = |transport: &str| {
        std::process::Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(&copy)
            .args([
                "bench",
                "comm",
                "--target",
                &target.engine,
                "--transport",
                transport,
            ])
            .args(["--blocks", "64K", "--batch", "4", "--duration", "0.1"])
            .env("HIXL_LOG", "off")
            .output()
    };
    let auto = match run("auto") {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: cannot run setpriv here: {e}");
            return;
        }
    };
    let out =
        String::from_utf8_lossy(&auto.stdout).to_string() + &String::from_utf8_lossy(&auto.stderr);
    if out.contains("setpriv:") {
        eprintln!("skipped: setpriv cannot drop privileges here: {out}");
        let _ = std::fs::remove_file(&copy);
        return;
    }
    assert!(auto.status.success(), "{out}");
    assert!(
        out.contains("host regions over tcp") && out.contains("EPERM"),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.starts_with("auto ")),
        "no measured case: {out}"
    );
    let forced = run("fabric").unwrap();
    let out = String::from_utf8_lossy(&forced.stderr).to_string();
    assert!(!forced.status.success());
    assert!(
        out.contains("UNSUPPORTED") && out.contains("EPERM"),
        "{out}"
    );
    let _ = std::fs::remove_file(&copy);
    target.stop();
}

/// `hixl serve --metrics` serves Prometheus text over real HTTP: the initiator connected from
/// another process, per transport; and this side's engine counts its transfers to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_metrics_shows_the_initiator_and_its_transfers() {
    for mode in [Mode::Tcp, Mode::FabricPool] {
        let mut target = Target::spawn(
            exe(),
            1 << 20,
            &[mode.target_args(), &["--metrics", "127.0.0.1:0"]].concat(),
        )
        .unwrap();
        let url = target.wait_line("METRICS", T).unwrap();
        let addr = url
            .trim_start_matches("METRICS http://")
            .trim_end_matches("/metrics")
            .to_string();
        let (e, local) = initiator_with(1 << 20, mode.transport()).await;
        let peer = mode.connect(&e, &target).await;
        let rr = peer.region("kv").unwrap();
        peer.write(&blocks(&local, rr.addr, 1 << 20, 64 << 10))
            .await
            .unwrap();
        let scrape = || {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            let mut body = String::new();
            s.read_to_string(&mut body).unwrap();
            body
        };
        let body = scrape();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        let line = body
            .lines()
            .find(|l| l.starts_with("hixl_inbound_links{"))
            .unwrap_or_default();
        assert!(
            line.ends_with(&format!("transport=\"{}\"}} 1", mode.transport())),
            "{mode:?}: {body}"
        );
        let mine = e.metrics_text();
        let want = format!(
            "hixl_transfer_bytes_total{{engine=\"{}\",peer=\"{}\",transport=\"{}\",op=\"write\"}} {}",
            e.local_engine(),
            target.engine,
            mode.transport(),
            1 << 20
        );
        assert!(mine.contains(&want), "{want} not in\n{mine}");
        let desc = format!(
            "hixl_transfer_descriptors_total{{engine=\"{}\",peer=\"{}\",transport=\"{}\",op=\"write\"}} 16",
            e.local_engine(),
            target.engine,
            mode.transport()
        );
        assert!(mine.contains(&desc), "{desc} not in\n{mine}");
        drop(peer);
        e.shutdown(T).await;
    }
}
