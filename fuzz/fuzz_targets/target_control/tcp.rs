//! TCP mode: the stream on a new control connection.

use hixl_core::wire::{self, Channel, Message, WireError};
use hixl_core::Status;
use hixl_fuzz::{decode_all, read_to_end, write_steps, End, ReadEnd, Step};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::model::{compare, control_model, Model, Want};
use crate::plan::{Hello, Plan};
use crate::{Ctx, CLOSE_BOUND, PEER};

pub(crate) async fn run_tcp(ctx: &Ctx, p: &Plan) -> Model {
    let mut steps = Vec::new();
    let mut model = Model::new();
    let hello = match &p.hello {
        Hello::Valid => Some(Message::Hello {
            engine: PEER.into(),
            channel: Channel::Control,
            session: 1,
            features: hixl_core::wire::FEATURES,
        }),
        Hello::Named(n) => Some(Message::Hello {
            engine: n.clone(),
            channel: Channel::Control,
            session: 1,
            features: hixl_core::wire::FEATURES,
        }),
        Hello::Missing => None,
        Hello::Session(s) => Some(Message::Hello {
            engine: PEER.into(),
            channel: Channel::Data,
            session: *s,
            features: hixl_core::wire::FEATURES,
        }),
        Hello::Other => Some(Message::Hello {
            engine: PEER.into(),
            channel: Channel::Fabric,
            session: 1,
            features: hixl_core::wire::FEATURES,
        }),
        Hello::Frame(m) => Some(m.clone()),
    };
    if let Some(h) = hello {
        steps.push(Step::Bytes(hixl_fuzz::encode(&h)));
    }
    steps.extend(p.steps.iter().cloned());
    let bytes = hixl_fuzz::stream_bytes(&steps);
    let (frames, stop) = decode_all(&bytes);
    // A first frame of another wire version is answered with a refusal in its framing, and
    // the connection closed.
    let foreign = match (&frames[..], &stop) {
        ([], End::Broken(WireError::BadVersion(v))) => Some(*v),
        _ => None,
    };
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
    if let Some(v) = foreign {
        let want = wire::version_refusal(v);
        assert!(
            got[..] == want[..] || (end != ReadEnd::Eof && want.starts_with(&got)),
            "invariant violated: a first frame of wire {v} was answered with {got:?}, not the refusal {want:?}"
        );
        return model;
    }
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
