//! Fuzz target for the target side of authentication (`Server::authenticate`): an engine
//! with `hixl.AuthSecret` answers a control hello with a challenge; the input is what the
//! initiator sends next: `AuthResponse`s with valid MACs (computed with
//! `hixl_core::auth::Secret` over the engine's real nonce), MACs with the wrong label, the
//! wrong secret, swapped nonces, short or empty MACs, nonces of the wrong length, any other
//! frame, raw bytes; followed by notifies and anything else.
//!
//! Invariants:
//! - the first answer to a valid control hello is an `AuthChallenge` with a 32-byte nonce;
//! - `Welcome`, `FabricInfo` and the memory table are sent if and only if the first frame after
//!   the challenge is an `AuthResponse` with a 32-byte nonce and a valid initiator MAC for it,
//!   and then right after an `AuthProof` that is valid for both nonces;
//! - any other first frame gets a `Refuse` (or, for a broken stream, nothing) and no notify of
//!   the connection is ever queued; after a valid response the notifies that follow are;
//! - no panic; the connection is closed within 10 s of ours.
#![no_main]

use std::sync::Mutex;
use std::time::Duration;

use bytes::BytesMut;
use hixl_async::{Engine, HostBuffer};
use hixl_core::auth::{Secret, NONCE_LEN};
use hixl_core::wire::{self, Channel, Message};
use hixl_core::{Access, Notify, Status};
use hixl_fuzz::{
    decode_all, encode, generic_step, read_to_end, runtime, write_steps, In, ReadEnd, Step,
    GENERIC_TAGS,
};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "hixl-fuzz-shared-secret";
const PEER: &str = "127.0.0.1:5";
const CLOSE_BOUND: Duration = Duration::from_secs(10);

struct Ctx {
    engine: Engine,
    addr: String,
    inputs: u64,
    fds: hixl_fuzz::FdWatch,
}

async fn setup() -> Ctx {
    let engine = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .option("hixl.AuthSecret", SECRET)
        // A synced input waits for the session loop's first heartbeat, which the target
        // sends after one and a half silent periods: 30 ms here instead of 1.5 s at the
        // default interval (the replay of the corpus paid that per input). The silence bound
        // stays 2 s, far above any input's own pauses.
        .option("hixl.HeartbeatIntervalMs", "20")
        .option("hixl.HeartbeatMissLimit", "100")
        .build()
        .await
        .expect("harness setup: target engine");
    engine
        .register_with(
            HostBuffer::zeroed(4096).expect("harness setup: buffer"),
            Access::REMOTE_RW,
            Some("kv"),
        )
        .expect("harness setup: register kv");
    let addr = engine.local_engine().to_string();
    Ctx {
        engine,
        addr,
        inputs: 0,
        fds: hixl_fuzz::FdWatch::default(),
    }
}

/// A step whose bytes depend on the engine's nonce.
enum Act {
    Step(Step),
    /// An `AuthResponse` built from the challenge's nonce.
    Response {
        kind: u8,
        seed: u8,
    },
}

fn nonce(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|k| seed.wrapping_mul(3).wrapping_add(k as u8))
        .collect()
}

fn response(kind: u8, seed: u8, nt: &[u8]) -> Message {
    let s = Secret::new(SECRET);
    let ni = nonce(seed, NONCE_LEN);
    let (nonce, mac) = match kind % 8 {
        0 => (ni.clone(), s.initiator_mac(nt, &ni).to_vec()),
        1 => (ni.clone(), s.target_mac(nt, &ni).to_vec()),
        2 => {
            let short = nonce(seed, NONCE_LEN - 1);
            let mac = s.initiator_mac(nt, &short).to_vec();
            (short, mac)
        }
        3 => (ni.clone(), s.initiator_mac(&ni, nt).to_vec()),
        4 => (ni, Vec::new()),
        5 => (ni.clone(), s.initiator_mac(nt, &ni)[..16].to_vec()),
        6 => (
            ni.clone(),
            Secret::new("another-secret-of-16")
                .initiator_mac(nt, &ni)
                .to_vec(),
        ),
        _ => {
            let mut mac = s.initiator_mac(nt, &ni).to_vec();
            let at = usize::from(seed) % mac.len();
            mac[at] ^= 1;
            (ni, mac)
        }
    };
    Message::AuthResponse { nonce, mac }
}

fn plan(data: &[u8]) -> (bool, Vec<Act>) {
    let mut i = In(data);
    let sync = i.u8() & 1 == 1;
    let mut acts = Vec::new();
    while !i.is_empty() && acts.len() < 64 {
        let tag = i.u8() % (GENERIC_TAGS + 2);
        let a = match tag {
            t if t < GENERIC_TAGS => generic_step(t, &mut i).map(Act::Step),
            6 => Some(Act::Response {
                kind: i.u8(),
                seed: i.u8(),
            }),
            _ => Some(Act::Step(Step::Bytes(encode(&Message::Notify {
                seq: u64::from(i.u8()),
                name: i.blob8().to_vec(),
                msg: b"m".to_vec(),
            })))),
        };
        acts.extend(a);
    }
    (sync, acts)
}

async fn run(ctx: &mut Ctx, data: &[u8]) {
    ctx.inputs += 1;
    let (sync, acts) = plan(data);
    let s = tokio::net::TcpStream::connect(&ctx.addr)
        .await
        .unwrap_or_else(|e| {
            panic!("invariant violated: the engine stopped accepting connections: {e}")
        });
    let _ = s.set_nodelay(true);
    let (mut r, mut w) = s.into_split();
    let hello = Message::Hello {
        engine: PEER.into(),
        channel: Channel::Control,
        session: 1,
        features: hixl_core::wire::FEATURES,
    };
    let _ = w.write_all(&encode(&hello)).await;
    let mut b = BytesMut::new();
    let nt = loop {
        match Message::decode(&mut b) {
            Ok(Some(Message::AuthChallenge { nonce })) if nonce.len() == NONCE_LEN => break nonce,
            Ok(Some(m)) => panic!(
                "invariant violated: an engine with a secret answered a valid hello with {m:?}"
            ),
            Ok(None) => {}
            Err(e) => panic!("invariant violated: malformed answer to a hello: {e}"),
        }
        match tokio::time::timeout(CLOSE_BOUND, r.read_buf(&mut b)).await {
            Ok(Ok(n)) if n > 0 => {}
            other => panic!("invariant violated: no challenge after a valid hello: {other:?}"),
        }
    };
    assert!(
        b.is_empty(),
        "invariant violated: bytes after the challenge"
    );
    let steps: Vec<Step> = acts
        .into_iter()
        .map(|a| match a {
            Act::Step(s) => s,
            Act::Response { kind, seed } => Step::Bytes(encode(&response(kind, seed, &nt))),
        })
        .collect();
    let bytes = hixl_fuzz::stream_bytes(&steps);
    let (frames, _) = decode_all(&bytes);
    let secret = Secret::new(SECRET);
    // What `authenticate` decides on the first frame.
    let first = frames.first().map(|(m, e)| (m.clone(), *e));
    let (accepted, refused, ni) = match &first {
        Some((Message::AuthResponse { nonce, mac }, _)) => {
            let ok = !mac.is_empty()
                && nonce.len() == NONCE_LEN
                && secret.verify_initiator(&nt, nonce, mac);
            (ok, !ok, nonce.clone())
        }
        Some(_) => (false, true, Vec::new()),
        // EOF or a broken frame: the connection is dropped without an answer.
        None => (false, false, Vec::new()),
    };
    let mut notifies = Vec::new();
    if accepted {
        for (m, _) in frames.iter().skip(1) {
            match m {
                Message::Notify { seq: _, name, msg } => notifies.push(Notify {
                    from: PEER.into(),
                    // The engine's id of the connection: not predictable, not compared.
                    link: 0,
                    name: name.clone(),
                    msg: msg.clone(),
                }),
                Message::Heartbeat { .. } | Message::VerbsConnect { .. } => {}
                _ => break,
            }
        }
    }
    // With the workaround, a session's loop is let start before anything can end it.
    let wait = accepted && (sync || workaround());
    let (head, tail) = match (&first, wait) {
        (Some((_, end)), true) => split(&steps, *end),
        _ => (Vec::new(), steps),
    };
    let limit = 64 * 1024 + 64 * bytes.len();
    let mut got = Vec::new();
    let mut head_ok = true;
    if wait {
        for st in &head {
            if let Step::Bytes(x) = st {
                head_ok &= w.write_all(x).await.is_ok();
            }
        }
        let mut buf = vec![0u8; 4096];
        loop {
            let started = decode_all(&got).0.iter().any(|(m, _)| {
                matches!(m, Message::Heartbeat { seq } if seq & wire::HEARTBEAT_FROM_TARGET != 0)
            });
            if started {
                break;
            }
            match tokio::time::timeout(CLOSE_BOUND, r.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
    }
    let (wrote, (more, end)) = tokio::join!(
        write_steps(&mut w, &tail),
        read_to_end(&mut r, limit, CLOSE_BOUND)
    );
    let end = hixl_fuzz::read_end(end, wrote && head_ok);
    got.extend_from_slice(&more);
    assert!(
        end != ReadEnd::Timeout,
        "invariant violated: the engine kept an authenticating connection open {CLOSE_BOUND:?} after the initiator closed its side; it answered {:?}",
        decode_all(&got)
    );
    let (answers, _) = decode_all(&got);
    let answers: Vec<Message> = answers
        .into_iter()
        .map(|(m, _)| m)
        .filter(|m| !matches!(m, Message::Heartbeat { .. }))
        .collect();
    let reveals = answers.iter().any(|m| {
        matches!(
            m,
            Message::Welcome { .. } | Message::MemTable(_) | Message::FabricInfo { .. }
        )
    });
    if !accepted {
        assert!(
            !reveals,
            "invariant violated: the engine sent {answers:?} to an initiator that did not prove the secret (first frame {:?})",
            first.map(|f| f.0)
        );
        let ok = match answers.as_slice() {
            [] => !refused || end == ReadEnd::Reset,
            [Message::Refuse { status, .. }] => refused && *status == Status::Failed.code(),
            _ => false,
        };
        assert!(
            ok,
            "invariant violated: a failed authentication was answered with {answers:?} (first frame {:?}, {end:?})",
            first.map(|f| f.0)
        );
    } else {
        let proof_ok = matches!(answers.first(), Some(Message::AuthProof { mac })
            if secret.verify_target(&nt, &ni, mac));
        let rest_ok = matches!(
            &answers.get(1..4),
            Some([
                Message::Welcome { .. },
                Message::FabricInfo { .. },
                Message::MemTable(_)
            ])
        );
        assert!(
            (proof_ok && rest_ok) || (end == ReadEnd::Reset && answers.len() < 4),
            "invariant violated: a valid authentication was answered with {answers:?}"
        );
    }
    let mut queued = ctx.engine.take_notifies();
    for n in &mut queued {
        n.link = 0;
    }
    assert!(
        queued == notifies,
        "invariant violated: the engine queued notifies {queued:?}; expected {notifies:?} (authenticated: {accepted})"
    );
    if ctx.inputs % 64 == 1 {
        ctx.fds.check();
    }
}

fn split(steps: &[Step], at: usize) -> (Vec<Step>, Vec<Step>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut off = 0;
    for st in steps {
        match st {
            Step::Bytes(x) if off >= at => b.push(Step::Bytes(x.clone())),
            Step::Bytes(x) if off + x.len() <= at => a.push(Step::Bytes(x.clone())),
            Step::Bytes(x) => {
                a.push(Step::Bytes(x[..at - off].to_vec()));
                b.push(Step::Bytes(x[at - off..].to_vec()));
            }
            other if off >= at => b.push(other.clone()),
            other => a.push(other.clone()),
        }
        if let Step::Bytes(x) = st {
            off += x.len();
        }
    }
    (a, b)
}

fn workaround() -> bool {
    static W: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *W.get_or_init(|| std::env::var_os("HIXL_FUZZ_WORKAROUND").is_some())
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
