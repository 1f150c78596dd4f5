//! Fabric mode: a raw control handshake, then the stream on the engine's fabric socket.

use hixl_core::wire::{Channel, Message};
use hixl_core::Status;
use hixl_fuzz::{
    connect_abstract, decode_all, handshake, read_to_end_unix, write_steps_unix, ReadEnd, Step,
};

use crate::model::{compare, fabric_model, Model, Want};
use crate::plan::{Hello, Plan};
use crate::{Ctx, CLOSE_BOUND, PEER};

pub(crate) async fn run_fabric(ctx: &Ctx, p: &Plan) -> Model {
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
                features: hixl_core::wire::FEATURES,
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
        Some(Message::Hello { engine, channel: Channel::Fabric, session, ..  })
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
