//! Wire format of the control plane and the TCP data path: length-prefixed frames that decode
//! without panicking on any byte sequence. The messages are declared once, in `message.rs`;
//! how two engines of different versions tell each other so is in [`version`](self::VERSION).
//!
//! Every frame starts with a 12-byte header:
//!
//! ```text
//! magic u32 = "HIXL" | version u8 | type u8 | flags u16 = 0 | body_len u32
//! ```
//!
//! followed by `body_len` bytes of body (all integers little-endian). `WriteReq` and a
//! successful `ReadResp` are followed by their payload, whose length is in the body and which is
//! not counted in `body_len`: the payload goes between socket and registered memory without a
//! staging copy.

mod body;
mod codec;
mod data;
mod declare;
mod error;
mod frame;
mod message;
#[cfg(test)]
mod tests;
mod version;

pub use body::{Channel, DataReq, FabricRegion, StridedReq, MAX_STRIDED_PIECES, NO_FD};
pub use data::{
    encode_ack, encode_data_req, encode_read_resp, encode_strided_req, ACK_FRAME, DATA_REQ_BODY,
    DATA_REQ_FRAME, READ_RESP_FRAME, STRIDED_REQ_BODY, STRIDED_REQ_FRAME,
};
pub use error::WireError;
pub use frame::FrameHeader;
pub use message::{ty, Message};
pub use version::{feature, refused_version, version_refusal, FEATURES, VERSION};

/// `"HIXL"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HIXL");
/// Size of a frame header.
pub const HEADER_LEN: usize = 12;
/// Largest control body accepted (HIXL's control plane allows 4 MB).
pub const MAX_BODY: u32 = 4 << 20;
/// Largest engine name accepted.
pub const MAX_NAME: usize = 256;
/// The bound of a text whose only limit is its u16 length (a refusal's or disconnect's reason).
const NO_LIMIT: usize = u16::MAX as usize;
/// The `Refuse` reason a server gives an engine that connected to itself (under another of
/// its addresses), so the initiator can report `ConnectToSelf` rather than a generic refusal.
pub const REFUSE_SELF: &str = "connect to self";
/// Largest payload a single data request may announce (1 TiB): anything above is malformed.
pub const MAX_PAYLOAD: u64 = 1 << 40;

/// Bit set in the sequence numbers of heartbeats a target originates.
pub const HEARTBEAT_FROM_TARGET: u64 = 1 << 63;

/// Where an initiator's heartbeat carries its probing period: bits 32 to 62 of the sequence
/// number hold, in milliseconds (at most [`HEARTBEAT_PERIOD_MAX_MS`]), the longest it will
/// stay silent before its next probe; the low 32 bits count. 0 (what an older initiator
/// sends) announces nothing. A heartbeat is answered with its sequence number unchanged, so
/// a peer that does not read the period still answers correctly: no version change.
pub const HEARTBEAT_PERIOD_SHIFT: u32 = 32;

/// The longest period a heartbeat can announce (31 bits of milliseconds, about 24 days).
pub const HEARTBEAT_PERIOD_MAX_MS: u64 = (1 << 31) - 1;

/// Longest nonce or MAC an authentication message may carry.
pub const MAX_AUTH: usize = 64;

/// Most queue-pair endpoints a `VerbsConnect`/`VerbsAccept` may carry (16 queue pairs of 32
/// bytes each, with room to spare).
pub const MAX_ENDPOINTS: usize = 1024;

/// Longest encoded device list a `VerbsInfo` may carry (32 devices with room to spare).
pub const MAX_VERBS_DEVICES: usize = 4096;
