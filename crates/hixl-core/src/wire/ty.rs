//! Frame type numbers.

/// [`super::Message::Hello`]
pub const HELLO: u8 = 1;
/// [`super::Message::Welcome`]
pub const WELCOME: u8 = 2;
/// [`super::Message::Refuse`]
pub const REFUSE: u8 = 3;
/// [`super::Message::MemTable`]
pub const MEM_TABLE: u8 = 4;
/// [`super::Message::Notify`]
pub const NOTIFY: u8 = 5;
/// [`super::Message::NotifyAck`]
pub const NOTIFY_ACK: u8 = 6;
/// [`super::Message::Heartbeat`]
pub const HEARTBEAT: u8 = 7;
/// [`super::Message::Disconnect`]
pub const DISCONNECT: u8 = 8;
/// [`super::Message::WriteReq`]
pub const WRITE_REQ: u8 = 9;
/// [`super::Message::ReadReq`]
pub const READ_REQ: u8 = 10;
/// [`super::Message::ReadResp`]
pub const READ_RESP: u8 = 11;
/// [`super::Message::Ack`]
pub const ACK: u8 = 12;
/// [`super::Message::FabricInfo`]
pub const FABRIC_INFO: u8 = 13;
/// [`super::Message::FabricTable`]
pub const FABRIC_TABLE: u8 = 14;
/// [`super::Message::Revoke`]
pub const REVOKE: u8 = 15;
/// [`super::Message::RevokeAck`]
pub const REVOKE_ACK: u8 = 16;
/// [`super::Message::VerbsInfo`]
pub const VERBS_INFO: u8 = 17;
/// [`super::Message::VerbsConnect`]
pub const VERBS_CONNECT: u8 = 18;
/// [`super::Message::VerbsAccept`]
pub const VERBS_ACCEPT: u8 = 19;
/// [`super::Message::VerbsKeys`]
pub const VERBS_KEYS: u8 = 20;
/// [`super::Message::AuthChallenge`]
pub const AUTH_CHALLENGE: u8 = 21;
/// [`super::Message::AuthResponse`]
pub const AUTH_RESPONSE: u8 = 22;
/// [`super::Message::AuthProof`]
pub const AUTH_PROOF: u8 = 23;
/// [`super::Message::WriteStridedReq`]
pub const WRITE_STRIDED_REQ: u8 = 24;
/// [`super::Message::ReadStridedReq`]
pub const READ_STRIDED_REQ: u8 = 25;
/// The highest type number.
pub const LAST: u8 = READ_STRIDED_REQ;
