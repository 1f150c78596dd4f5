//! Fuzz target for the initiator's side of a connect: `Link::establish`, the initiator's
//! `authenticate`, the data-connection welcomes, `choose_fabric` / `FabricLink::establish`
//! (fabric tables with real memfds, sealed or not, of any size) and, after the connect,
//! `control_reader` and the fabric reader.
//!
//! A fake target listens on 127.0.0.1 (and on an abstract Unix socket for the fabric). Each
//! input is a script for it: what to answer on the control connection (raw bytes, frames with
//! arbitrary fields, a valid `Welcome`, memory tables, a same-host `FabricInfo` naming the fake
//! fabric socket, auth challenges and valid or forged proofs), how to answer each data
//! connection, and what to send on the fabric channel. One of three real engines connects:
//! tcp only, auto (fabric on), or auto with `hixl.AuthSecret`.
//!
//! The fake stops right after the first memory table until `connect` has returned, so what
//! the engine read before returning is known exactly; the rest of the script is sent after.
//! Invariants:
//! - `connect` (200 ms timeout) returns within 2.2 s and never panics;
//! - an `Ok` connect had a `Welcome` and a memory table, its `Peer::regions()` are exactly that
//!   table sorted by address, and an engine with a secret only accepts a target that sent a
//!   valid proof for its nonce;
//! - every data connection presents the session of the `Welcome`, every fabric hello too;
//! - a handshake the engine must accept (no fabric involved) gives `Ok` (or a timeout);
//! - after the rest of the script and the fake's close, the engine closes the control
//!   connection within 2 s and (tcp transport) the peer's table is the last one the control
//!   reader applied;
//! - every 64th input the process's fd count is checked.
#![no_main]

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use hixl_async::Engine;
use hixl_core::auth::Secret;
use hixl_core::wire::{Channel, FabricRegion, Message, NO_FD};
use hixl_core::{Access, MemKind, RemoteRegion};
use hixl_fabric::HostIdentity;
use hixl_fuzz::{
    decode_all, encode, generic_step, listen_abstract, runtime, send_with_fds, FdWatch, In, Step,
    GENERIC_TAGS,
};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

const SECRET: &str = "hixl-fuzz-shared-secret";
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// How long past its timeout `connect` may take to return.
const CONNECT_SLACK: Duration = Duration::from_secs(2);
/// How long the engine may take to close the control connection after the fake closed it.
const CLOSE_BOUND: Duration = Duration::from_secs(2);

struct Ctx {
    /// tcp, auto, auto with a secret.
    engines: Vec<Engine>,
    listener: Arc<TcpListener>,
    fabric: Arc<UnixListener>,
    fabric_name: String,
    key: String,
    identity: HostIdentity,
    inputs: u64,
    fds: FdWatch,
}

async fn setup() -> Ctx {
    let mut engines = Vec::new();
    for opts in [
        &[("hixl.Transport", "tcp")][..],
        &[][..],
        &[("hixl.AuthSecret", SECRET)][..],
    ] {
        let mut b = Engine::builder("127.0.0.1");
        for (k, v) in opts {
            b = b.option(*k, *v);
        }
        engines.push(b.build().await.expect("harness setup: initiator engine"));
    }
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("harness setup: fake target listener");
    let key = listener
        .local_addr()
        .expect("harness setup: listener address")
        .to_string();
    let fabric_name = format!("hixl-fuzz-fake-{}", std::process::id());
    let fabric = listen_abstract(&fabric_name).expect("harness setup: fake fabric socket");
    Ctx {
        engines,
        listener: Arc::new(listener),
        fabric: Arc::new(fabric),
        fabric_name,
        key,
        identity: HostIdentity::current().expect("harness setup: host identity"),
        inputs: 0,
        fds: FdWatch::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// Scripts.

/// One action of the fake on the control connection.
#[derive(Debug, Clone)]
enum Act {
    Step(Step),
    /// Wait for the engine's `AuthResponse`, then send a proof for it: valid, or forged.
    Proof {
        valid: bool,
    },
}

/// How the fake answers one data connection.
#[derive(Debug, Clone)]
enum DataReply {
    Welcome,
    Bytes(Vec<u8>),
    /// A welcome with bytes after it.
    WelcomeTrailing(Vec<u8>),
    /// Close without answering.
    Close,
}

/// One action of the fake on the fabric channel.
#[derive(Debug)]
enum FAct {
    Step(Step),
    /// A fabric table with the memfds it names (created for the input).
    Table(Vec<FabricRegion>, Vec<OwnedFd>),
}

struct Script {
    engine: usize,
    control: Vec<Act>,
    data: Vec<DataReply>,
    fabric: Vec<FAct>,
}

fn region(i: &mut In) -> RemoteRegion {
    let addr = match i.u8() % 3 {
        0 => u64::from(i.u16()) << 12,
        1 => 0x7f00_0000_0000 + (u64::from(i.u16()) << 16),
        _ => i.u64(),
    };
    let len = match i.u8() % 3 {
        0 => u64::from(i.u16()) + 1,
        1 => u64::from(i.u16()),
        _ => i.u64(),
    };
    let rkey = i.u64();
    let access = Access::from_bits(i.u8());
    let kind = if i.u8() & 1 == 0 {
        MemKind::Host
    } else {
        MemKind::Device
    };
    let name = match i.u8() % 3 {
        0 => None,
        _ => Some(String::from_utf8_lossy(i.blob8()).into_owned()),
    };
    RemoteRegion {
        addr,
        len,
        rkey,
        access,
        kind,
        name,
    }
}

fn memfd(size: u64, sealed: bool) -> Option<OwnedFd> {
    // SAFETY: plain syscalls; the name is a NUL-terminated literal and the returned fd is
    // owned by the OwnedFd from here on.
    unsafe {
        let fd = libc::memfd_create(
            c"hixl-fuzz".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        if fd < 0 {
            return None;
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
            return None;
        }
        if sealed && libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) != 0 {
            return None;
        }
        Some(fd)
    }
}

fn script(ctx: &Ctx, data: &[u8]) -> Script {
    let mut top = In(data);
    let engine = usize::from(top.u8() % 3);
    let mut c = In(top.blob16());
    let mut d = In(top.blob16());
    let mut f = In(top.0);

    let fake_name = ctx.key.clone();
    let mut control = Vec::new();
    let mut first_table: Vec<RemoteRegion> = Vec::new();
    while !c.is_empty() && control.len() < 64 {
        let tag = c.u8() % (GENERIC_TAGS + 6);
        let act = match tag {
            t if t < GENERIC_TAGS => generic_step(t, &mut c).map(Act::Step),
            6 => Some(Act::Step(Step::Bytes(encode(&Message::Welcome {
                engine: fake_name.clone(),
                session: c.u64(),
                incarnation: 0x1ca7,
            })))),
            7 => {
                let n = c.u8() % 6;
                let t: Vec<RemoteRegion> = (0..n).map(|_| region(&mut c)).collect();
                if first_table.is_empty() {
                    first_table = t.clone();
                }
                Some(Act::Step(Step::Bytes(encode(&Message::MemTable(t)))))
            }
            8 => {
                let sel = c.u8();
                let id = &ctx.identity;
                Some(Act::Step(Step::Bytes(encode(&Message::FabricInfo {
                    boot_id: id.boot_id.clone(),
                    mnt_ns: id.mnt_ns,
                    pid: if sel & 2 == 0 {
                        id.pid as u32
                    } else {
                        u32::MAX
                    },
                    uid: id.uid,
                    socket: if sel & 1 == 0 {
                        ctx.fabric_name.clone()
                    } else {
                        "hixl-fuzz-no-such-socket".into()
                    },
                }))))
            }
            9 => {
                let seed = c.u8();
                let nonce = (0..32).map(|k| seed.wrapping_add(k)).collect();
                Some(Act::Step(Step::Bytes(encode(&Message::AuthChallenge {
                    nonce,
                }))))
            }
            10 => Some(Act::Proof {
                valid: c.u8() & 1 == 0,
            }),
            _ => Some(Act::Step(Step::Bytes(encode(&Message::Refuse {
                status: c.u32(),
                reason: String::from_utf8_lossy(c.blob8()).into_owned(),
            })))),
        };
        control.extend(act);
    }

    let mut data_replies = Vec::new();
    while !d.is_empty() && data_replies.len() < 8 {
        data_replies.push(match d.u8() % 5 {
            0 => DataReply::Welcome,
            1 => DataReply::Bytes(d.blob8().to_vec()),
            2 => DataReply::Bytes(d.msg().map(|m| encode(&m)).unwrap_or_default()),
            3 => DataReply::WelcomeTrailing(d.blob8().to_vec()),
            _ => DataReply::Close,
        });
    }

    let mut fabric = Vec::new();
    while !f.is_empty() && fabric.len() < 32 {
        let tag = f.u8() % (GENERIC_TAGS + 3);
        let act = match tag {
            t if t < GENERIC_TAGS => generic_step(t, &mut f).map(FAct::Step),
            6 => {
                let n = f.u8() % 4;
                let mut regions = Vec::new();
                let mut fds = Vec::new();
                for _ in 0..n {
                    let base = if first_table.is_empty() {
                        None
                    } else {
                        Some(first_table[usize::from(f.u8()) % first_table.len()].clone())
                    };
                    let (rkey, addr, len) = match (f.u8() % 2, &base) {
                        (0, Some(b)) => (b.rkey, b.addr, b.len.clamp(1, 1 << 20)),
                        _ => (f.u64(), u64::from(f.u16()) << 12, u64::from(f.u16()) + 1),
                    };
                    let fd_index = match f.u8() % 4 {
                        0 => NO_FD,
                        1 => f.u32(),
                        _ => {
                            let size = match f.u8() % 3 {
                                0 => len,
                                1 => len.saturating_sub(1).max(1),
                                _ => u64::from(f.u16()) * 16,
                            }
                            .min(1 << 20);
                            match memfd(size, f.u8() % 4 != 0) {
                                Some(fd) => {
                                    fds.push(fd);
                                    (fds.len() - 1) as u32
                                }
                                None => NO_FD,
                            }
                        }
                    };
                    regions.push(FabricRegion {
                        rkey,
                        addr,
                        len,
                        fd_index,
                    });
                }
                Some(FAct::Table(regions, fds))
            }
            7 => {
                let rkey = match first_table.first() {
                    Some(r) if f.u8() & 1 == 0 => r.rkey,
                    _ => f.u64(),
                };
                Some(FAct::Step(Step::Bytes(encode(&Message::Revoke { rkey }))))
            }
            _ => Some(FAct::Step(Step::Bytes(encode(&Message::NotifyAck {
                seq: f.u64(),
                status: f.u32(),
            })))),
        };
        fabric.extend(act);
    }
    Script {
        engine,
        control,
        data: data_replies,
        fabric,
    }
}

// ---------------------------------------------------------------------------------------------
// The fake target.

/// What the fake saw and did.
#[derive(Default, Debug)]
struct Report {
    /// The engine's control hello.
    hello: Option<Message>,
    /// Everything sent on the control connection before `connect` returned.
    before: Vec<u8>,
    /// Everything sent after.
    after: Vec<u8>,
    /// Frames the engine sent on the control connection.
    from_engine: Vec<Message>,
    /// Whether the engine closed the control connection within the bound (after the fake's
    /// close).
    engine_closed: Option<bool>,
    /// Whether the link's writer task visibly started (its first heartbeat came) before the
    /// rest of the script was sent (workaround mode only).
    writer_started: bool,
    /// Data hellos, in order.
    data_hellos: Vec<Option<Message>>,
    /// Fabric hellos.
    fabric_hellos: Vec<Option<Message>>,
}

type Shared = Arc<Mutex<Report>>;

fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Report> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

async fn read_one(s: &mut (impl AsyncReadExt + Unpin), within: Duration) -> Option<Message> {
    let mut b = BytesMut::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match Message::decode(&mut b) {
            Ok(Some(m)) => return Some(m),
            Ok(None) => {}
            Err(_) => return None,
        }
        match tokio::time::timeout_at(deadline, s.read_buf(&mut b)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return None,
        }
    }
}

/// Reads the engine's control frames into the report; signals each `AuthResponse` and each
/// engine heartbeat.
async fn engine_reader(
    mut r: tokio::net::tcp::OwnedReadHalf,
    rep: Shared,
    auth: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    beat: tokio::sync::watch::Sender<bool>,
) -> bool {
    let mut b = BytesMut::new();
    loop {
        loop {
            match Message::decode(&mut b) {
                Ok(Some(m)) => {
                    let nonce = match &m {
                        Message::AuthResponse { nonce, .. } => Some(nonce.clone()),
                        _ => None,
                    };
                    let is_beat = matches!(m, Message::Heartbeat { .. });
                    lock(&rep).from_engine.push(m);
                    if let Some(n) = nonce {
                        let _ = auth.send(n);
                    }
                    if is_beat {
                        beat.send_replace(true);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    panic!("invariant violated: the engine sent a malformed control frame: {e}")
                }
            }
        }
        match r.read_buf(&mut b).await {
            Ok(n) if n > 0 => {}
            // EOF or reset: the engine closed.
            _ => return true,
        }
    }
}

/// Answers data connections in order, then holds them open.
async fn data_server(
    l: Arc<TcpListener>,
    replies: Vec<DataReply>,
    name: String,
    rep: Shared,
    hold: Arc<Mutex<Vec<TcpStream>>>,
) {
    let mut k = 0;
    loop {
        let Ok((mut s, _)) = l.accept().await else {
            return;
        };
        let _ = s.set_nodelay(true);
        let hello = read_one(&mut s, Duration::from_secs(1)).await;
        lock(&rep).data_hellos.push(hello.clone());
        let session = match hello {
            Some(Message::Hello { session, .. }) => session,
            _ => 0,
        };
        let welcome = encode(&Message::Welcome {
            engine: name.clone(),
            session,
            incarnation: 0x1ca7,
        });
        let reply = replies.get(k).cloned().unwrap_or(DataReply::Welcome);
        k += 1;
        match reply {
            DataReply::Welcome => {
                let _ = s.write_all(&welcome).await;
            }
            DataReply::Bytes(b) => {
                let _ = s.write_all(&b).await;
            }
            DataReply::WelcomeTrailing(b) => {
                let mut w = welcome;
                w.extend_from_slice(&b);
                let _ = s.write_all(&w).await;
            }
            DataReply::Close => continue,
        }
        hold.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

/// Serves fabric channels with the script, then holds them open.
async fn fabric_server(
    l: Arc<UnixListener>,
    acts: Vec<FAct>,
    rep: Shared,
    hold: Arc<Mutex<Vec<UnixStream>>>,
) {
    let mut acts = Some(acts);
    loop {
        let Ok((s, _)) = l.accept().await else {
            return;
        };
        let mut b = BytesMut::new();
        let mut tmp = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let hello = loop {
            match Message::decode(&mut b) {
                Ok(Some(m)) => break Some(m),
                Ok(None) => {}
                Err(_) => break None,
            }
            if tokio::time::timeout_at(deadline, s.readable())
                .await
                .is_err()
            {
                break None;
            }
            match s.try_read(&mut tmp) {
                Ok(0) => break None,
                Ok(n) => b.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break None,
            }
        };
        lock(&rep).fabric_hellos.push(hello);
        // The script goes to the first channel only.
        let acts = acts.take().unwrap_or_default();
        // With the workaround, a channel whose script holds no whole first frame is closed
        // after it: a connect left waiting for a fabric table would time out, and a connect
        // abandoned after its data connections were opened leaks them (see artifacts-found/).
        let mut all = Vec::new();
        for a in &acts {
            match a {
                FAct::Step(Step::Bytes(b)) => all.extend_from_slice(b),
                FAct::Table(t, _) => all.extend(encode(&Message::FabricTable(t.clone()))),
                FAct::Step(_) => {}
            }
        }
        let close = workaround() && decode_all(&all).0.is_empty();
        for a in acts {
            match a {
                FAct::Step(Step::Bytes(b)) if !b.is_empty() => {
                    if send_with_fds(&s, &b, &[]).await.is_err() {
                        break;
                    }
                }
                FAct::Step(Step::Pause) => tokio::task::yield_now().await,
                FAct::Step(_) => {}
                FAct::Table(t, fds) => {
                    let b = encode(&Message::FabricTable(t));
                    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                    if send_with_fds(&s, &b, &borrowed).await.is_err() {
                        break;
                    }
                }
            }
        }
        if close {
            hixl_fuzz::shutdown_write(&s);
        }
        hold.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

/// Whether the first frame in `bytes` is an auth challenge.
fn challenged(bytes: &[u8]) -> bool {
    matches!(
        decode_all(bytes).0.first(),
        Some((Message::AuthChallenge { .. }, _))
    )
}

/// The index of the end of the first memory table in `bytes`, if one is complete there.
fn first_table_end(bytes: &[u8]) -> Option<usize> {
    let (frames, _) = decode_all(bytes);
    frames
        .iter()
        .find(|(m, _)| matches!(m, Message::MemTable(_)))
        .map(|(_, e)| *e)
}

/// Runs the control script on the engine's control connection: everything up to the end of
/// the first memory table, then (once `connect` returned) the rest, then a close.
#[allow(clippy::too_many_arguments)]
async fn control_server(
    l: Arc<TcpListener>,
    acts: Vec<Act>,
    rep: Shared,
    returned: tokio::sync::oneshot::Receiver<()>,
    data_replies: Vec<DataReply>,
    name: String,
    hold: Arc<Mutex<Vec<TcpStream>>>,
) {
    // The engine's control connection: the first one that says hello.
    let (s, hello) = loop {
        let Ok((mut s, _)) = l.accept().await else {
            return;
        };
        let _ = s.set_nodelay(true);
        if let Some(h) = read_one(&mut s, Duration::from_secs(1)).await {
            break (s, h);
        }
    };
    lock(&rep).hello = Some(hello);
    let data = tokio::spawn(data_server(
        l.clone(),
        data_replies,
        name,
        rep.clone(),
        hold.clone(),
    ));
    let (r, mut w) = s.into_split();
    let (auth_tx, mut auth_rx) = tokio::sync::mpsc::unbounded_channel();
    let (beat_tx, mut beat_rx) = tokio::sync::watch::channel(false);
    let reader = tokio::spawn(engine_reader(r, rep.clone(), auth_tx, beat_tx));

    let mut sent: Vec<u8> = Vec::new();
    let mut rest: Vec<Vec<u8>> = Vec::new();
    let mut cut = false;
    for a in acts {
        let bytes = match a {
            Act::Step(Step::Bytes(b)) => b,
            Act::Step(Step::Pause) => {
                if !cut {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            Act::Step(Step::Fds(_)) => continue,
            Act::Proof { valid } => {
                // The challenge the engine answered is the first frame it read.
                let nt = match decode_all(&sent).0.first() {
                    Some((Message::AuthChallenge { nonce }, _)) => nonce.clone(),
                    _ => Vec::new(),
                };
                // Only a challenged engine answers: wait for it then (it answers at once).
                let ni = if cut || !challenged(&sent) {
                    None
                } else {
                    tokio::time::timeout(Duration::from_millis(300), auth_rx.recv())
                        .await
                        .ok()
                        .flatten()
                };
                let secret = Secret::new(SECRET);
                let mac = match ni {
                    Some(ni) if valid => secret.target_mac(&nt, &ni).to_vec(),
                    // A reflected initiator MAC: the right secret, the wrong label.
                    Some(ni) => secret.initiator_mac(&nt, &ni).to_vec(),
                    None => vec![0; 32],
                };
                encode(&Message::AuthProof { mac })
            }
        };
        if cut {
            rest.push(bytes);
            continue;
        }
        let mut all = sent.clone();
        all.extend_from_slice(&bytes);
        // The report learns of bytes before the engine can read them: `connect` may return
        // as soon as they are written.
        match first_table_end(&all) {
            Some(end) => {
                let k = end - sent.len();
                sent.extend_from_slice(&bytes[..k]);
                lock(&rep).before = sent.clone();
                let _ = w.write_all(&bytes[..k]).await;
                rest.push(bytes[k..].to_vec());
                cut = true;
            }
            None => {
                sent.extend_from_slice(&bytes);
                lock(&rep).before = sent.clone();
                if w.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        }
    }
    if !cut {
        // No memory table: the engine cannot connect. Close so it learns at once.
        let _ = w.shutdown().await;
    }
    let _ = returned.await;
    if cut {
        if workaround() {
            // Let the link's writer task start before anything can end the link (it is the
            // one that sends the engine's heartbeat probes).
            let beat = tokio::time::timeout(Duration::from_secs(1), beat_rx.wait_for(|b| *b)).await;
            lock(&rep).writer_started = matches!(beat, Ok(Ok(_)));
        }
        let mut after = Vec::new();
        for b in rest {
            if w.write_all(&b).await.is_err() {
                break;
            }
            after.extend_from_slice(&b);
        }
        lock(&rep).after = after;
        let _ = w.shutdown().await;
    }
    let closed = tokio::time::timeout(CLOSE_BOUND, reader).await;
    lock(&rep).engine_closed = Some(matches!(closed, Ok(Ok(true))));
    data.abort();
    drop(w);
}

/// `HIXL_FUZZ_WORKAROUND=1`: wait for the link's first heartbeat before ending the link (a
/// known engine race would otherwise leave the control connection open).
fn workaround() -> bool {
    static W: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *W.get_or_init(|| std::env::var_os("HIXL_FUZZ_WORKAROUND").is_some())
}

// ---------------------------------------------------------------------------------------------
// The model of `Link::establish`.

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    Ok,
    Err,
    /// Either (timing or the fabric decides).
    Either,
}

struct Expect {
    outcome: Outcome,
    /// The table the engine must report on `Ok`.
    table: Option<Vec<RemoteRegion>>,
    /// The session data and fabric hellos must present.
    session: Option<u64>,
    /// Whether a proof the engine had to accept was sent (engines with a secret).
    proved: bool,
}

fn sorted(mut v: Vec<RemoteRegion>) -> Vec<RemoteRegion> {
    v.sort_by_key(|r| r.addr);
    v
}

fn expect(s: &Script, before: &[u8], ni: Option<&[u8]>, fabric_used: bool) -> Expect {
    let secret = (s.engine == 2).then(|| Secret::new(SECRET));
    let (frames, _) = decode_all(before);
    let mut it = frames.into_iter().map(|(m, _)| m);
    let err = Expect {
        outcome: Outcome::Err,
        table: None,
        session: None,
        proved: false,
    };
    let mut proved = false;
    let first = match (it.next(), &secret) {
        (None, _) => return err,
        (Some(Message::AuthChallenge { nonce: nt }), Some(sec)) => match (it.next(), ni) {
            (Some(Message::AuthProof { mac }), Some(ni)) if sec.verify_target(&nt, ni, &mac) => {
                proved = true;
                it.next()
            }
            _ => return err,
        },
        (Some(Message::AuthChallenge { .. }), None) => return err,
        (Some(Message::Welcome { .. }), Some(_)) => return err,
        (m, _) => m,
    };
    let session = match first {
        Some(Message::Welcome { session, .. }) => session,
        _ => return err,
    };
    let table = loop {
        match it.next() {
            Some(Message::MemTable(v)) => break sorted(v),
            Some(Message::FabricInfo { .. } | Message::VerbsInfo { .. }) => {}
            _ => return err,
        }
    };
    // Four data connections (hixl.TcpStreams defaults to 4), each welcomed or not.
    let mut outcome = Outcome::Ok;
    for k in 0..4 {
        match s.data.get(k).cloned().unwrap_or(DataReply::Welcome) {
            DataReply::Welcome => {}
            DataReply::Bytes(b) => {
                let (f, _) = decode_all(&b);
                let alone = matches!(f.as_slice(), [(Message::Welcome { .. }, e)] if *e == b.len());
                if !alone {
                    outcome = Outcome::Err;
                    break;
                }
            }
            // Whether the trailing bytes come in the same read is up to the kernel.
            DataReply::WelcomeTrailing(b) if !b.is_empty() => outcome = Outcome::Either,
            DataReply::WelcomeTrailing(_) => {}
            DataReply::Close => {
                outcome = Outcome::Err;
                break;
            }
        }
    }
    if fabric_used && outcome == Outcome::Ok {
        outcome = Outcome::Either;
    }
    Expect {
        outcome,
        table: Some(table),
        session: Some(session),
        proved,
    }
}

/// The table `control_reader` ends with: the last memory table before the frame it stops at.
fn final_table(initial: Vec<RemoteRegion>, after: &[u8]) -> Vec<RemoteRegion> {
    let (frames, _) = decode_all(after);
    let mut t = initial;
    for (m, _) in frames {
        match m {
            Message::MemTable(v) => t = sorted(v),
            Message::NotifyAck { .. } | Message::VerbsKeys(_) | Message::Heartbeat { .. } => {}
            _ => break,
        }
    }
    t
}

// ---------------------------------------------------------------------------------------------

async fn run(ctx: &mut Ctx, data: &[u8]) {
    ctx.inputs += 1;
    let mut s = script(ctx, data);
    let fabric_acts = std::mem::take(&mut s.fabric);
    // Connections left from earlier inputs (e.g. a data connection opened just before a
    // connect timed out) are dropped.
    while let Ok(Ok(_)) = tokio::time::timeout(Duration::ZERO, ctx.listener.accept()).await {}
    while let Ok(Ok(_)) = tokio::time::timeout(Duration::ZERO, ctx.fabric.accept()).await {}

    let rep: Shared = Arc::default();
    let hold_tcp: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let hold_unix: Arc<Mutex<Vec<UnixStream>>> = Arc::default();
    let (ret_tx, ret_rx) = tokio::sync::oneshot::channel();
    let fake_name = ctx.key.clone();
    let control = tokio::spawn(control_server(
        ctx.listener.clone(),
        s.control.clone(),
        rep.clone(),
        ret_rx,
        s.data.clone(),
        fake_name,
        hold_tcp.clone(),
    ));
    let fabric = tokio::spawn(fabric_server(
        ctx.fabric.clone(),
        fabric_acts,
        rep.clone(),
        hold_unix.clone(),
    ));

    let engine = ctx.engines[s.engine].clone();
    let t0 = std::time::Instant::now();
    let r = tokio::time::timeout(
        CONNECT_TIMEOUT + CONNECT_SLACK,
        engine.connect(&ctx.key, CONNECT_TIMEOUT),
    )
    .await;
    let r = match r {
        Ok(r) => r,
        Err(_) => panic!(
            "invariant violated: connect with a {CONNECT_TIMEOUT:?} timeout did not return within {:?}",
            CONNECT_TIMEOUT + CONNECT_SLACK
        ),
    };
    let before = lock(&rep).before.clone();
    let ni = lock(&rep).from_engine.iter().find_map(|m| match m {
        Message::AuthResponse { nonce, .. } => Some(nonce.clone()),
        _ => None,
    });
    let fabric_used = !lock(&rep).fabric_hellos.is_empty();
    let e = expect(&s, &before, ni.as_deref(), fabric_used);
    let mut peer_table = None;
    match &r {
        Ok(peer) => {
            assert!(
                e.outcome != Outcome::Err,
                "invariant violated: connect succeeded on a handshake it must refuse (engine {}): the target sent {:?}",
                s.engine,
                decode_all(&before).0
            );
            if s.engine == 2 {
                assert!(
                    e.proved,
                    "invariant violated: an engine with a secret accepted a target that proved nothing"
                );
            }
            let want = e.table.clone().unwrap_or_default();
            let got = peer.regions();
            assert!(
                got == want,
                "invariant violated: Peer::regions() is not the memory table the target sent, sorted:\n got  {got:?}\n want {want:?}"
            );
            peer_table = Some((want, peer.transport().starts_with("tcp")));
        }
        Err(err) => {
            let timeout = matches!(err, hixl_core::Error::Timeout { .. });
            assert!(
                e.outcome != Outcome::Ok || timeout,
                "invariant violated: connect failed on a handshake it must accept: {err} (the target sent {:?})",
                decode_all(&before).0
            );
        }
    }
    let t1 = t0.elapsed();
    let _ = ret_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), control).await;
    if std::env::var_os("HIXL_FUZZ_TIMING").is_some() {
        eprintln!(
            "connect {t1:?} total {:?} ok={} {:?}",
            t0.elapsed(),
            r.is_ok(),
            decode_all(&lock(&rep).before)
        );
    }
    let rep = std::mem::take(&mut *lock(&rep));

    // What the engine said on each connection.
    match &rep.hello {
        Some(Message::Hello {
            engine: name,
            channel: Channel::Control,
            ..
        }) if name == engine.local_engine() => {}
        other => panic!("invariant violated: the engine's control hello was {other:?}"),
    }
    if let Some(session) = e.session {
        for h in rep.data_hellos.iter().chain(&rep.fabric_hellos) {
            let ok = matches!(h, Some(Message::Hello { session: s, channel, .. })
                if *s == session && *channel != Channel::Control);
            assert!(
                ok,
                "invariant violated: a data or fabric hello {h:?} does not carry the welcome's session {session:#x}"
            );
        }
    }
    if let Some((initial, tcp)) = peer_table {
        if let Ok(peer) = &r {
            // With the workaround, a link that died before its writer task ran (e.g. of a bad
            // fabric frame) is the known race: not checked.
            assert!(
                rep.engine_closed == Some(true) || workaround() && !rep.writer_started,
                "invariant violated: the engine kept the control connection open {CLOSE_BOUND:?} after the target closed it (link error: {:?})",
                peer.error()
            );
            if tcp {
                let want = final_table(initial, &rep.after);
                let got = peer.regions();
                assert!(
                    got == want,
                    "invariant violated: after the control reader ran, Peer::regions() is not the last table it received:\n got  {got:?}\n want {want:?}"
                );
            }
        }
        let _ = engine.disconnect(&ctx.key).await;
    }
    drop(r);
    fabric.abort();
    hold_tcp.lock().unwrap_or_else(|e| e.into_inner()).clear();
    hold_unix.lock().unwrap_or_else(|e| e.into_inner()).clear();

    if ctx.inputs % 64 == 1 {
        ctx.fds.check();
    }
}

static CTX: Mutex<Option<Ctx>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut g = CTX.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    if g.is_none() {
        *g = Some(rt.block_on(setup()));
    }
    if let Some(ctx) = g.as_mut() {
        let trace = std::env::var_os("HIXL_FUZZ_TRACE").is_some();
        let before = if trace { hixl_fuzz::open_fds() } else { 0 };
        rt.block_on(run(ctx, data));
        if trace {
            std::thread::sleep(Duration::from_millis(20));
            let after = hixl_fuzz::open_fds();
            if after > before {
                eprintln!("fds {before} -> {after} after input {data:02x?}");
            }
        }
    }
});
