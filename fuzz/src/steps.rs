//! Steps: the pieces of what a harness sends on a connection, and the generic steps of the
//! input format.

use crate::{encode, In};

/// One piece of what a harness sends on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Bytes, written with one `write_all`.
    Bytes(Vec<u8>),
    /// Let the peer run before the next bytes (so it sees them in a separate read).
    Pause,
    /// Attach this many file descriptors to the next bytes (Unix sockets only).
    Fds(u8),
}

/// Tags of the generic steps; targets number their own after [`GENERIC_TAGS`].
pub const TAG_RAW: u8 = 0;
/// A frame built by `arbitrary`.
pub const TAG_MSG: u8 = 1;
/// A frame built by `arbitrary`, cut short.
pub const TAG_CUT: u8 = 2;
/// A frame built by `arbitrary`, with one byte changed.
pub const TAG_FLIP: u8 = 3;
/// A pause.
pub const TAG_PAUSE: u8 = 4;
/// File descriptors for the next bytes.
pub const TAG_FDS: u8 = 5;
/// How many generic tags there are.
pub const GENERIC_TAGS: u8 = 6;

/// Reads the generic step with tag `tag` (< [`GENERIC_TAGS`]).
pub fn generic_step(tag: u8, i: &mut In) -> Option<Step> {
    match tag {
        TAG_RAW => Some(Step::Bytes(i.blob16().to_vec())),
        TAG_MSG => i.msg().map(|m| Step::Bytes(encode(&m))),
        TAG_CUT => {
            let m = i.msg();
            let keep = i.u16() as usize;
            m.map(|m| {
                let b = encode(&m);
                let keep = keep % b.len().max(1);
                Step::Bytes(b[..keep].to_vec())
            })
        }
        TAG_FLIP => {
            let m = i.msg();
            let (at, x) = (i.u16() as usize, i.u8());
            m.map(|m| {
                let mut b = encode(&m);
                let n = b.len();
                if n > 0 {
                    b[at % n] ^= x.max(1);
                }
                Step::Bytes(b)
            })
        }
        TAG_PAUSE => Some(Step::Pause),
        TAG_FDS => Some(Step::Fds(i.u8() % 8)),
        _ => None,
    }
}

/// Concatenation of the bytes of `steps`.
pub fn stream_bytes(steps: &[Step]) -> Vec<u8> {
    let mut v = Vec::new();
    for s in steps {
        if let Step::Bytes(b) = s {
            v.extend_from_slice(b);
        }
    }
    v
}
