//! Fuzz target for a live engine's control plane, target side: `Server::handle` (the hello),
//! `serve_control` (notifies, heartbeats, disconnects, verbs requests and everything else on
//! a control connection) and the fabric channel's handler (`fabric/server.rs`: its hello,
//! notifies, revoke acks, file descriptors that come along).
//!
//! One engine per process listens on 127.0.0.1 with three exported regions (a heap buffer, a
//! fabric-pool buffer and a read-only buffer). Each input is a stream of raw bytes and of
//! frames built from arbitrary fields, written to a fresh connection after an optional hello;
//! then the connection is shut down and read to its end.
//!
//! - TCP mode: the stream goes to a new control connection. The engine's answers are checked
//!   against a model of the handler: `Welcome`, `FabricInfo` and the memory table after a
//!   valid hello, then a `NotifyAck` per notify, an answer per initiator heartbeat, a refused
//!   `VerbsAccept` per `VerbsConnect`, until the first frame the handler must stop at. A data
//!   hello with an unknown session is refused. The received notifies must be exactly the
//!   model's.
//! - Fabric mode: a raw control handshake first (for a session and the fabric socket), then
//!   the stream (file descriptors attached where the input says) goes to the engine's fabric
//!   socket. The answers must be a prefix of the fabric table followed by notify acks, and the
//!   received notifies exactly the model's.
//!
//! Every input: no panic, the engine closes the connection within 10 s of ours, its answers
//! are well-formed frames. Every 64th input: a real client engine (tcp, then auto, in turn)
//! connects, writes 1 KiB into the exported region, reads it back and compares; the process's
//! fd count stays bounded.
#![no_main]

use std::sync::Mutex;
use std::time::Duration;

use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::wire::{self, Channel, Message, NO_FD};
use hixl_core::{Access, MemKind, Notify, RemoteRegion, Status, NOTIFY_MAX_PENDING};
use hixl_fuzz::{
    connect_abstract, decode_all, generic_step, handshake, read_to_end, read_to_end_unix, runtime,
    write_steps, write_steps_unix, FdWatch, In, Prober, ReadEnd, Step, GENERIC_TAGS,
};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The engine name raw initiators use in their hellos.
const PEER: &str = "127.0.0.1:9";
/// How long the engine may keep a connection open after we closed our side.
const CLOSE_BOUND: Duration = Duration::from_secs(10);

struct Ctx {
    engine: Engine,
    addr: String,
    kv: Region,
    table: Vec<RemoteRegion>,
    probers: Vec<Prober>,
    inputs: u64,
    fds: FdWatch,
}

fn remote(r: &Region, name: Option<&str>) -> RemoteRegion {
    RemoteRegion {
        addr: r.addr(),
        len: r.len(),
        rkey: r.rkey(),
        access: r.access(),
        kind: MemKind::Host,
        name: name.map(str::to_owned),
    }
}

async fn setup() -> Ctx {
    let engine = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .build()
        .await
        .expect("harness setup: target engine");
    let kv = engine
        .register_with(
            HostBuffer::zeroed(64 << 10).expect("harness setup: buffer"),
            Access::REMOTE_RW,
            Some("kv"),
        )
        .expect("harness setup: register kv");
    let pool = engine
        .register_pooled(64 << 10, Access::REMOTE_RW, Some("pool"))
        .expect("harness setup: register pool");
    let ro = engine
        .register_with(
            HostBuffer::zeroed(4096).expect("harness setup: buffer"),
            Access::REMOTE_READ,
            Some("ro"),
        )
        .expect("harness setup: register ro");
    let mut table = vec![
        remote(&kv, Some("kv")),
        remote(&pool, Some("pool")),
        remote(&ro, Some("ro")),
    ];
    table.sort_by_key(|r| r.addr);
    // The regions live as long as the engine (the process).
    std::mem::forget((pool, ro));
    let addr = engine.local_engine().to_string();
    let probers = vec![
        Prober::new(&[("hixl.Transport", "tcp")]).await,
        Prober::new(&[]).await,
    ];
    Ctx {
        engine,
        addr,
        kv,
        table,
        probers,
        inputs: 0,
        fds: FdWatch::default(),
    }
}

/// What the input says to send.
struct Plan {
    fabric: bool,
    /// TCP: after a control hello, wait for the session loop before sending the rest.
    sync: bool,
    hello: Hello,
    steps: Vec<Step>,
}

enum Hello {
    /// A valid hello for the channel.
    Valid,
    /// A valid hello with this engine name.
    Named(String),
    /// No hello: the steps are the first bytes.
    Missing,
    /// TCP: a data hello with this session. Fabric: a hello with a wrong session.
    Session(u64),
    /// TCP: a fabric hello. Fabric: a hello with another engine name.
    Other,
    /// Some other first frame.
    Frame(Message),
}

fn plan(data: &[u8]) -> Plan {
    let mut i = In(data);
    let b0 = i.u8();
    let hello = match (b0 >> 1) % 6 {
        0 => Hello::Valid,
        1 => Hello::Missing,
        2 => Hello::Named(String::from_utf8_lossy(i.blob8()).into_owned()),
        3 => Hello::Session(i.u64()),
        4 => Hello::Other,
        _ => i.msg().map_or(Hello::Missing, Hello::Frame),
    };
    let mut steps = Vec::new();
    while !i.is_empty() && steps.len() < 256 {
        let tag = i.u8() % GENERIC_TAGS;
        if let Some(s) = generic_step(tag, &mut i) {
            steps.push(s);
        }
    }
    Plan {
        fabric: b0 & 1 == 1,
        sync: b0 & 0x80 != 0,
        hello,
        steps,
    }
}

/// One expected answer; `None` fields are not compared.
#[derive(Debug)]
enum Want {
    Welcome,
    FabricInfo,
    Table,
    NotifyAck { seq: u64, status: u32 },
    Heartbeat(u64),
    VerbsRefused,
    Refuse(Status),
    FabricTable,
}

struct Model {
    answers: Vec<Want>,
    notifies: Vec<Notify>,
    /// Whether "nothing happened" (no answer, no notify) is acceptable too.
    or_nothing: bool,
}

impl Model {
    fn new() -> Model {
        Model {
            answers: Vec::new(),
            notifies: Vec::new(),
            or_nothing: false,
        }
    }
}

/// What `serve_control` does with the frames after a valid hello from `peer`, in order.
fn control_model(frames: impl Iterator<Item = Message>, peer: &str, m: &mut Model) {
    for f in frames {
        match f {
            Message::Notify { seq, name, msg } => {
                let ok = m.notifies.len() < NOTIFY_MAX_PENDING;
                if ok {
                    m.notifies.push(Notify {
                        from: peer.to_string(),
                        // The engine's id of the connection: not predictable, not compared.
                        link: 0,
                        name,
                        msg,
                    });
                }
                let status = if ok {
                    Status::Success
                } else {
                    Status::ResourceExhausted
                };
                m.answers.push(Want::NotifyAck {
                    seq,
                    status: status.code(),
                });
            }
            Message::Heartbeat { seq } => {
                if seq & wire::HEARTBEAT_FROM_TARGET == 0 {
                    m.answers.push(Want::Heartbeat(seq));
                }
            }
            Message::VerbsConnect { .. } => m.answers.push(Want::VerbsRefused),
            // A disconnect, or any other frame, ends the session.
            _ => break,
        }
    }
}

/// What the fabric channel's handler does with the frames after a valid fabric hello.
fn fabric_model(frames: impl Iterator<Item = Message>, peer: &str, m: &mut Model) {
    m.answers.push(Want::FabricTable);
    for f in frames {
        match f {
            Message::Notify { seq, name, msg } => {
                let ok = m.notifies.len() < NOTIFY_MAX_PENDING;
                if ok {
                    m.notifies.push(Notify {
                        from: peer.to_string(),
                        // The engine's id of the connection: not predictable, not compared.
                        link: 0,
                        name,
                        msg,
                    });
                }
                let status = if ok {
                    Status::Success
                } else {
                    Status::ResourceExhausted
                };
                m.answers.push(Want::NotifyAck {
                    seq,
                    status: status.code(),
                });
            }
            Message::RevokeAck { .. } => {}
            _ => break,
        }
    }
}

fn check_answer(ctx: &Ctx, want: &Want, got: &Message, fabric_regions: &[RemoteRegion]) -> bool {
    match (want, got) {
        (Want::Welcome, Message::Welcome { engine, session, .. }) => {
            *engine == ctx.engine.local_engine() && *session != 0
        }
        (Want::FabricInfo, Message::FabricInfo { pid, socket, .. }) => {
            *pid == std::process::id() && !socket.is_empty()
        }
        (Want::Table, Message::MemTable(t)) => *t == ctx.table,
        (Want::NotifyAck { seq, status }, Message::NotifyAck { seq: s, status: st }) => {
            seq == s && status == st
        }
        (Want::Heartbeat(seq), Message::Heartbeat { seq: s }) => seq == s,
        (
            Want::VerbsRefused,
            Message::VerbsAccept {
                status, endpoint, ..
            },
        ) => *status == Status::Unsupported.code() && endpoint.is_empty(),
        (Want::Refuse(st), Message::Refuse { status, .. }) => *status == st.code(),
        (Want::FabricTable, Message::FabricTable(t)) => {
            // The exported regions, each with a memfd exactly when it is a pool region.
            let mut got: Vec<_> = t.iter().map(|r| (r.rkey, r.addr, r.len)).collect();
            let mut want: Vec<_> = fabric_regions
                .iter()
                .map(|r| (r.rkey, r.addr, r.len))
                .collect();
            got.sort_unstable();
            want.sort_unstable();
            let fds_ok = t.iter().all(|r| {
                let pooled = fabric_regions
                    .iter()
                    .any(|x| x.rkey == r.rkey && x.name.as_deref() == Some("pool"));
                (r.fd_index != NO_FD) == pooled
            });
            got == want && fds_ok
        }
        _ => false,
    }
}

/// Compares the engine's answers with the model: all of them after an orderly close, a prefix
/// after a reset (bytes in flight may be lost) or when `prefix_only`.
fn compare(ctx: &Ctx, what: &str, model: &Model, got: &[u8], end: ReadEnd, prefix_only: bool) {
    let (frames, stop) = decode_all(got);
    if end == ReadEnd::Eof {
        assert!(
            stop == hixl_fuzz::End::Clean,
            "invariant violated: the engine's answers on the {what} are not whole valid frames: {stop:?} after {frames:?}"
        );
    }
    let frames: Vec<Message> = frames
        .into_iter()
        .map(|(m, _)| m)
        // The target's own liveness probes come at any time.
        .filter(
            |m| !matches!(m, Message::Heartbeat { seq } if seq & wire::HEARTBEAT_FROM_TARGET != 0),
        )
        .collect();
    let exact = end == ReadEnd::Eof && !prefix_only;
    let ok = frames.len() <= model.answers.len()
        && (!exact || frames.len() == model.answers.len())
        && frames
            .iter()
            .zip(&model.answers)
            .all(|(g, w)| check_answer(ctx, w, g, &ctx.table));
    assert!(
        ok,
        "invariant violated: the engine's answers on the {what} differ from the handler's model ({}):\n got  {frames:?}\n want {:?}",
        if exact { "exact" } else { "prefix" },
        model.answers
    );
}

async fn run_tcp(ctx: &Ctx, p: &Plan) -> Model {
    let mut steps = Vec::new();
    let mut model = Model::new();
    let hello = match &p.hello {
        Hello::Valid => Some(Message::Hello {
            engine: PEER.into(),
            channel: Channel::Control,
            session: 1,
        }),
        Hello::Named(n) => Some(Message::Hello {
            engine: n.clone(),
            channel: Channel::Control,
            session: 1,
        }),
        Hello::Missing => None,
        Hello::Session(s) => Some(Message::Hello {
            engine: PEER.into(),
            channel: Channel::Data,
            session: *s,
        }),
        Hello::Other => Some(Message::Hello {
            engine: PEER.into(),
            channel: Channel::Fabric,
            session: 1,
        }),
        Hello::Frame(m) => Some(m.clone()),
    };
    if let Some(h) = hello {
        steps.push(Step::Bytes(hixl_fuzz::encode(&h)));
    }
    steps.extend(p.steps.iter().cloned());
    let bytes = hixl_fuzz::stream_bytes(&steps);
    let (frames, _) = decode_all(&bytes);
    let hello_end = frames.first().map(|(_, e)| *e);
    let mut frames = frames.into_iter().map(|(m, _)| m);
    let mut control = false;
    match frames.next() {
        Some(Message::Hello {
            engine,
            channel: Channel::Control,
            ..
        }) => {
            control = true;
            model
                .answers
                .extend([Want::Welcome, Want::FabricInfo, Want::Table]);
            control_model(frames, &engine, &mut model);
        }
        Some(Message::Hello {
            channel: Channel::Data,
            ..
        }) => model.answers.push(Want::Refuse(Status::NotConnected)),
        _ => {}
    }

    let s = tokio::net::TcpStream::connect(&ctx.addr)
        .await
        .unwrap_or_else(|e| {
            panic!("invariant violated: the engine stopped accepting connections: {e}")
        });
    let _ = s.set_nodelay(true);
    let (mut r, mut w) = s.into_split();
    let limit = 64 * 1024 + 64 * bytes.len();
    // Sync: send the hello alone and wait until the session's loop runs (its first heartbeat
    // has come through its writer task) before sending the rest.
    let mut head = Vec::new();
    let mut head_ok = true;
    if let (true, Some(at), true) = (control, hello_end, p.sync || workaround()) {
        let (first, rest) = split_steps(&steps, at);
        steps = rest;
        for st in &first {
            if let Step::Bytes(b) = st {
                head_ok &= w.write_all(b).await.is_ok();
            }
        }
        let deadline = tokio::time::Instant::now() + CLOSE_BOUND;
        let mut buf = vec![0u8; 4096];
        loop {
            let (f, _) = decode_all(&head);
            let started = f.iter().any(|(m, _)| matches!(m, Message::Heartbeat { seq } if seq & wire::HEARTBEAT_FROM_TARGET != 0));
            if started {
                break;
            }
            match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
                Ok(_) => break,
                Err(_) => panic!(
                    "invariant violated: no session loop within {CLOSE_BOUND:?} of a valid hello; answered {:?}",
                    decode_all(&head)
                ),
            }
        }
    }
    let (wrote, (got, end)) = tokio::join!(
        write_steps(&mut w, &steps),
        read_to_end(&mut r, limit, CLOSE_BOUND)
    );
    let end = hixl_fuzz::read_end(end, wrote && head_ok);
    head.extend_from_slice(&got);
    let got = head;
    assert!(
        end != ReadEnd::Timeout,
        "invariant violated: the engine kept a control connection open {CLOSE_BOUND:?} after the initiator closed its side; it answered {:?}",
        decode_all(&got)
    );
    compare(ctx, "control connection", &model, &got, end, false);
    model
}

/// `steps` split at byte offset `at` of their concatenated bytes.
fn split_steps(steps: &[Step], at: usize) -> (Vec<Step>, Vec<Step>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut off = 0;
    for st in steps {
        match st {
            Step::Bytes(x) if off >= at => {
                b.push(Step::Bytes(x.clone()));
                off += x.len();
            }
            Step::Bytes(x) if off + x.len() <= at => {
                a.push(Step::Bytes(x.clone()));
                off += x.len();
            }
            Step::Bytes(x) => {
                let k = at - off;
                a.push(Step::Bytes(x[..k].to_vec()));
                b.push(Step::Bytes(x[k..].to_vec()));
                off += x.len();
            }
            other if off >= at => b.push(other.clone()),
            other => a.push(other.clone()),
        }
    }
    (a, b)
}

/// `HIXL_FUZZ_WORKAROUND=1`: always wait for the session loop after a valid control hello
/// before sending more (avoids a known engine race, so fuzzing can go on past it).
fn workaround() -> bool {
    static W: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *W.get_or_init(|| std::env::var_os("HIXL_FUZZ_WORKAROUND").is_some())
}

async fn run_fabric(ctx: &Ctx, p: &Plan) -> Model {
    let hs = handshake(&ctx.addr, PEER).await;
    let Some(sock) = hs.fabric_socket.clone() else {
        panic!("invariant violated: the engine (fabric backend on) offered no fabric socket");
    };
    let mut model = Model::new();
    let hello = match &p.hello {
        Hello::Valid => Some((PEER.to_string(), hs.session)),
        Hello::Named(n) => Some((n.clone(), hs.session)),
        Hello::Missing | Hello::Frame(_) => None,
        Hello::Session(s) => Some((PEER.to_string(), *s)),
        Hello::Other => Some(("127.0.0.1:8".to_string(), hs.session)),
    };
    let mut steps = Vec::new();
    match (&p.hello, &hello) {
        (_, Some((engine, session))) => {
            steps.push(Step::Bytes(hixl_fuzz::encode(&Message::Hello {
                engine: engine.clone(),
                channel: Channel::Fabric,
                session: *session,
            })))
        }
        (Hello::Frame(m), None) => steps.push(Step::Bytes(hixl_fuzz::encode(m))),
        _ => {}
    }
    steps.extend(p.steps.iter().cloned());
    // Descriptors that arrive while the hello is read make the engine drop the channel. One
    // read may take in the hello and any number of segments after it, descriptors included,
    // so with descriptors anywhere in the stream either outcome is allowed.
    let bytes = hixl_fuzz::stream_bytes(&steps);
    let (frames, _) = decode_all(&bytes);
    let mut early_fds = false;
    let mut pending = false;
    for s in &steps {
        match s {
            Step::Fds(n) if *n > 0 => pending = true,
            Step::Bytes(b) if !b.is_empty() => early_fds |= pending,
            _ => {}
        }
    }
    let mut frames = frames.into_iter().map(|(m, _)| m);
    let first = frames.next();
    let accepted = matches!(
        &first,
        Some(Message::Hello { engine, channel: Channel::Fabric, session })
            if engine == PEER && *session == hs.session
    );
    if accepted {
        fabric_model(frames, PEER, &mut model);
    } else if matches!(
        &first,
        Some(Message::Hello {
            channel: Channel::Fabric,
            ..
        })
    ) {
        model.answers.push(Want::Refuse(Status::NotConnected));
    }

    let s = connect_abstract(&sock).unwrap_or_else(|e| {
        panic!("invariant violated: the engine's fabric socket @{sock} refuses connections: {e}")
    });
    let limit = 64 * 1024 + 64 * bytes.len();
    let (wrote, (got, end, fds)) = tokio::join!(
        write_steps_unix(&s, &steps),
        read_to_end_unix(&s, limit, CLOSE_BOUND)
    );
    let end = hixl_fuzz::read_end(end, wrote);
    assert!(
        end != ReadEnd::Timeout,
        "invariant violated: the engine kept a fabric channel open {CLOSE_BOUND:?} after the initiator closed its side; it answered {:?}",
        decode_all(&got)
    );
    drop(fds);
    // The hello may have been dropped for descriptors that came with it.
    model.or_nothing = early_fds;
    // The handler aborts its writer when the channel ends: answers may be cut short.
    compare(ctx, "fabric channel", &model, &got, end, true);
    drop(hs);
    model
}

async fn run(ctx: &mut Ctx, data: &[u8]) {
    ctx.inputs += 1;
    let p = plan(data);
    if std::env::var_os("HIXL_FUZZ_TRACE").is_some() {
        eprintln!("fabric {} sync {} steps {:?}", p.fabric, p.sync, p.steps);
    }
    let model = if p.fabric {
        run_fabric(ctx, &p).await
    } else {
        run_tcp(ctx, &p).await
    };
    // The connection is closed: every notify the handler accepted is queued.
    // Link ids are the engine's own (random), so they are not compared; all of one run's
    // notifies come on one link.
    let mut got = ctx.engine.take_notifies();
    if let Some(first) = got.first().map(|n| n.link) {
        assert!(
            got.iter().all(|n| n.link == first),
            "notifies of one connection carry different link ids: {got:?}"
        );
    }
    for n in &mut got {
        n.link = 0;
    }
    assert!(
        got == model.notifies || model.or_nothing && got.is_empty(),
        "invariant violated: the engine queued notifies {got:?}, the handler's model {:?}",
        model.notifies
    );

    if ctx.inputs % 64 == 1 {
        let which = ((ctx.inputs / 64) % ctx.probers.len() as u64) as usize;
        let addr = ctx.addr.clone();
        let (at, pattern) = ctx.probers[which].check(&addr, "kv").await;
        let mut mem = vec![0u8; pattern.len()];
        ctx.kv
            .read_at(at - ctx.kv.addr(), &mut mem)
            .expect("harness setup: reading kv");
        assert!(
            mem == pattern,
            "invariant violated: a normal write did not land in the target's memory"
        );
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
        rt.block_on(run(ctx, data));
    }
});
