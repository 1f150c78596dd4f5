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
//! - every data connection presents the session of the `Welcome`, every fabric hello too (a
//!   connect opens no data connection: they open with the first transfer);
//! - a handshake the engine must accept (no fabric involved) gives `Ok` (or a timeout);
//! - after the rest of the script and the fake's close, the engine closes the control
//!   connection within 2 s and (tcp transport) the peer's table is the last one the control
//!   reader applied;
//! - every 64th input the process's fd count is checked.
#![no_main]

#[path = "initiator_handshake/fake.rs"]
mod fake;
#[path = "initiator_handshake/model.rs"]
mod model;
#[path = "initiator_handshake/script.rs"]
mod script;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hixl_async::Engine;
use hixl_core::wire::{Channel, Message};
use hixl_fabric::HostIdentity;
use hixl_fuzz::{decode_all, listen_abstract, runtime, FdWatch};
use libfuzzer_sys::fuzz_target;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use fake::{control_server, fabric_server, lock, workaround, Shared};
use model::{expect, final_table, Outcome};
use script::script;

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
