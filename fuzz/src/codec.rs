//! Frames: encoding one message, and a mirror of a stream reader's frame loop.

use bytes::BytesMut;
use hixl_core::wire::{Message, WireError};

/// The frame of `m`.
pub fn encode(m: &Message) -> Vec<u8> {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    b.to_vec()
}

/// How a reader's frame loop over a byte stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Every byte was consumed by whole frames.
    Clean,
    /// The stream ended inside a frame.
    Partial,
    /// A malformed frame: the reader gives up.
    Broken(WireError),
}

/// The frames a `read_frame` loop decodes from `bytes` (with each frame's end offset), and
/// how the loop ends. Data-request payloads are not skipped (control readers do not).
pub fn decode_all(bytes: &[u8]) -> (Vec<(Message, usize)>, End) {
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    loop {
        match Message::decode(&mut buf) {
            Ok(Some(m)) => out.push((m, bytes.len() - buf.len())),
            Ok(None) if buf.is_empty() => return (out, End::Clean),
            Ok(None) => return (out, End::Partial),
            Err(e) => return (out, End::Broken(e)),
        }
    }
}
