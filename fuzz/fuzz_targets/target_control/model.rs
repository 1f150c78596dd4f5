//! The model of the control and fabric handlers, and the comparison of the engine's answers
//! with it.

use hixl_core::wire::{self, Message, NO_FD};
use hixl_core::{Notify, RemoteRegion, Status, NOTIFY_MAX_PENDING};
use hixl_fuzz::{decode_all, ReadEnd};

use crate::Ctx;

/// One expected answer; `None` fields are not compared.
#[derive(Debug)]
pub(crate) enum Want {
    Welcome,
    FabricInfo,
    Table,
    NotifyAck { seq: u64, status: u32 },
    Heartbeat(u64),
    VerbsRefused,
    Refuse(Status),
    FabricTable,
}

pub(crate) struct Model {
    pub(crate) answers: Vec<Want>,
    pub(crate) notifies: Vec<Notify>,
    /// Whether "nothing happened" (no answer, no notify) is acceptable too.
    pub(crate) or_nothing: bool,
}

impl Model {
    pub(crate) fn new() -> Model {
        Model {
            answers: Vec::new(),
            notifies: Vec::new(),
            or_nothing: false,
        }
    }
}

/// What `serve_control` does with the frames after a valid hello from `peer`, in order.
pub(crate) fn control_model(frames: impl Iterator<Item = Message>, peer: &str, m: &mut Model) {
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
pub(crate) fn fabric_model(frames: impl Iterator<Item = Message>, peer: &str, m: &mut Model) {
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
        (
            Want::Welcome,
            Message::Welcome {
                engine, session, ..
            },
        ) => *engine == ctx.engine.local_engine() && *session != 0,
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
                status, endpoints, ..
            },
        ) => *status == Status::Unsupported.code() && endpoints.is_empty(),
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
pub(crate) fn compare(
    ctx: &Ctx,
    what: &str,
    model: &Model,
    got: &[u8],
    end: ReadEnd,
    prefix_only: bool,
) {
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
