//! The input: the channel, the hello and the steps sent after it.

use hixl_core::wire::Message;
use hixl_fuzz::{generic_step, In, Step, GENERIC_TAGS};

/// What the input says to send.
pub(crate) struct Plan {
    pub(crate) fabric: bool,
    /// TCP: after a control hello, wait for the session loop before sending the rest.
    pub(crate) sync: bool,
    pub(crate) hello: Hello,
    pub(crate) steps: Vec<Step>,
}

pub(crate) enum Hello {
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

pub(crate) fn plan(data: &[u8]) -> Plan {
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
