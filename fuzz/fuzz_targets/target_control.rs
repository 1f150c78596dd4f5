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

#[path = "target_control/fabric.rs"]
mod fabric;
#[path = "target_control/model.rs"]
mod model;
#[path = "target_control/plan.rs"]
mod plan;
#[path = "target_control/tcp.rs"]
mod tcp;

use std::sync::Mutex;
use std::time::Duration;

use hixl_async::{Engine, HostBuffer, Region};
use hixl_core::{Access, MemKind, RemoteRegion};
use hixl_fuzz::{runtime, FdWatch, Prober};
use libfuzzer_sys::fuzz_target;

use fabric::run_fabric;
use plan::plan;
use tcp::run_tcp;

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
        // A synced input waits for the session loop's first heartbeat, which the target
        // sends after one and a half silent periods: 30 ms here instead of 1.5 s at the
        // default interval (the replay of the corpus paid that per input). The silence bound
        // stays 2 s, far above any input's own pauses.
        .option("hixl.HeartbeatIntervalMs", "20")
        .option("hixl.HeartbeatMissLimit", "100")
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
