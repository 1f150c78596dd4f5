//! What two engines agree on before anything else: the wire version and the optional parts
//! of the protocol each speaks.
//!
//! Every frame header carries the sender's [`VERSION`]; a decoder refuses a frame of another
//! version ([`WireError::BadVersion`](super::WireError::BadVersion)). So that engines of
//! different versions can always tell each other so, three things are the same in every
//! version: the frame header, the type numbers of `Hello` (1) and `Refuse` (3), and the body
//! of `Refuse` (a u32 status, then a u16-length reason). A target whose first frame from a
//! peer is of another version answers it with [`version_refusal`]: a `Refuse` in the *peer's*
//! framing, status `UNSUPPORTED`, whose reason names both versions, then closes; the
//! initiator reads it (or any answer framed in another version) as
//! [`Error::WireVersion`](crate::Error::WireVersion): `peer … speaks hixl wire 3, this engine 2`.
//!
//! Within one version, optional parts are announced as [`feature`] bits in `Hello` and
//! `Welcome`; a link uses a part only when both ends announced it, and unknown bits are
//! ignored, so adding one needs no new version.

use bytes::BytesMut;

use super::{ty, Message, HEADER_LEN, MAGIC};
use crate::Status;

/// Wire version of this build. 2: `Hello` and `Welcome` carry [`feature`] bits, and a
/// target answers a peer of another version with [`version_refusal`] (1 closed the socket).
/// 3: the verbs messages carry rails (every device in `VerbsInfo`, a rail and its queue
/// pairs per `VerbsConnect`/`VerbsAccept`, a device index per `VerbsKeys` entry).
pub const VERSION: u8 = 3;

/// Optional parts of the protocol, as bits of `Hello::features` and `Welcome::features`.
pub mod feature {
    /// Strided data requests (`WriteStridedReq`, `ReadStridedReq`): without it, an initiator
    /// sends each piece of a strided descriptor as its own request.
    pub const STRIDED: u64 = 1 << 0;
}

/// The parts this build speaks.
pub const FEATURES: u64 = feature::STRIDED;

/// How a [`version_refusal`]'s reason begins; what follows is the target's version.
const REASON_PREFIX: &str = "the target speaks hixl wire ";

/// The whole `Refuse` frame a target sends a peer whose first frame is of wire `peer`:
/// framed in the peer's version, so that an engine of any version reads it.
pub fn version_refusal(peer: u8) -> BytesMut {
    let mut b = BytesMut::new();
    Message::Refuse {
        status: Status::Unsupported.code(),
        reason: format!(
            "{REASON_PREFIX}{VERSION}, the connecting engine hixl wire {peer}: they cannot talk"
        ),
    }
    .encode(&mut b);
    debug_assert_eq!(b[5], ty::REFUSE);
    debug_assert_eq!(u32::from_le_bytes([b[0], b[1], b[2], b[3]]), MAGIC);
    if b.len() >= HEADER_LEN {
        b[4] = peer;
    }
    b
}

/// The target's version, when `status` and `reason` are a [`version_refusal`]'s.
pub fn refused_version(status: u32, reason: &str) -> Option<u8> {
    if status != Status::Unsupported.code() {
        return None;
    }
    let rest = reason.strip_prefix(REASON_PREFIX)?;
    rest.split(',').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::super::{FrameHeader, WireError};
    use super::*;

    /// A control `Hello` of wire 1, as an engine of release 0.2 sends it: engine
    /// `10.0.0.1:26000`, channel control, incarnation 7, no features field.
    const HELLO_V1: [u8; 37] = [
        b'H', b'I', b'X', b'L', 1, 1, 0, 0, 25, 0, 0, 0, // header: v1, HELLO, 25 bytes
        14, 0, b'1', b'0', b'.', b'0', b'.', b'0', b'.', b'1', b':', b'2', b'6', b'0', b'0',
        b'0', // engine
        0,    // channel: control
        7, 0, 0, 0, 0, 0, 0, 0, // session (incarnation)
    ];

    #[test]
    fn a_hello_of_wire_1_is_refused_in_wire_1() {
        let hello = &HELLO_V1[..];
        assert_eq!(
            FrameHeader::decode(hello),
            Err(WireError::BadVersion(1)),
            "this build refuses wire 1 frames"
        );
        let r = version_refusal(1);
        // A wire-1 reader checks magic, version 1, type and flags, then decodes the body.
        assert_eq!(&r[..6], &[b'H', b'I', b'X', b'L', 1, ty::REFUSE]);
        let body_len = u32::from_le_bytes([r[8], r[9], r[10], r[11]]) as usize;
        assert_eq!(r.len(), HEADER_LEN + body_len);
        let m = Message::decode_body(ty::REFUSE, &r[HEADER_LEN..]).unwrap();
        let Message::Refuse { status, reason } = m else {
            panic!("not a refusal: {m:?}");
        };
        assert_eq!(status, Status::Unsupported.code());
        assert!(
            reason.contains("hixl wire 3") && reason.contains("hixl wire 1"),
            "{reason}"
        );
        assert_eq!(refused_version(status, &reason), Some(VERSION));
    }

    #[test]
    fn only_version_refusals_parse() {
        let unsupported = Status::Unsupported.code();
        assert_eq!(
            refused_version(unsupported, "the target speaks hixl wire 3, x"),
            Some(3)
        );
        assert_eq!(
            refused_version(Status::Failed.code(), "the target speaks hixl wire 3, x"),
            None
        );
        assert_eq!(refused_version(unsupported, "no"), None);
        assert_eq!(
            refused_version(unsupported, "the target speaks hixl wire x, y"),
            None
        );
    }
}
