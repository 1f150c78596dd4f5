//! The model of `Link::establish`.

use hixl_core::auth::Secret;
use hixl_core::wire::Message;
use hixl_core::RemoteRegion;
use hixl_fuzz::decode_all;

use crate::script::Script;
use crate::SECRET;

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Outcome {
    Ok,
    Err,
    /// Either (timing or the fabric decides).
    Either,
}

pub(crate) struct Expect {
    pub(crate) outcome: Outcome,
    /// The table the engine must report on `Ok`.
    pub(crate) table: Option<Vec<RemoteRegion>>,
    /// The session data and fabric hellos must present.
    pub(crate) session: Option<u64>,
    /// Whether a proof the engine had to accept was sent (engines with a secret).
    pub(crate) proved: bool,
}

fn sorted(mut v: Vec<RemoteRegion>) -> Vec<RemoteRegion> {
    v.sort_by_key(|r| r.addr);
    v
}

pub(crate) fn expect(s: &Script, before: &[u8], ni: Option<&[u8]>, fabric_used: bool) -> Expect {
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
    // Data connections open when a transfer first needs them: connect opens none, so how
    // the fake would answer them does not decide its outcome.
    let mut outcome = Outcome::Ok;
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
pub(crate) fn final_table(initial: Vec<RemoteRegion>, after: &[u8]) -> Vec<RemoteRegion> {
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
