//! Arbitrary messages: `Arbitrary` mirrors of every [`Message`] variant and of the structures
//! in them.

use hixl_core::wire::{Channel, DataReq, FabricRegion, Message, StridedReq};
use hixl_core::{Access, MemKind, RemoteRegion};
use libfuzzer_sys::arbitrary::{self, Arbitrary};

/// A region of a memory table, from arbitrary fields (invalid ones included: zero length,
/// wrapping ranges, unknown access bits or kinds, over-long names).
#[derive(Arbitrary, Debug, Clone)]
pub struct FRegion {
    /// Start.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Key.
    pub rkey: u64,
    /// Access bits.
    pub access: u8,
    /// Kind code.
    pub kind: bool,
    /// Name.
    pub name: Option<String>,
}

impl FRegion {
    /// As a [`RemoteRegion`].
    pub fn region(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
            access: Access::from_bits(self.access),
            kind: if self.kind {
                MemKind::Device
            } else {
                MemKind::Host
            },
            name: self.name.clone(),
        }
    }
}

/// A data request's fields.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct FReq {
    /// Request id.
    pub id: u64,
    /// Region key.
    pub rkey: u64,
    /// Address.
    pub addr: u64,
    /// Length.
    pub len: u64,
}

impl From<FReq> for DataReq {
    fn from(r: FReq) -> DataReq {
        DataReq {
            id: r.id,
            rkey: r.rkey,
            addr: r.addr,
            len: r.len,
        }
    }
}

/// A strided data request with arbitrary fields.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct FStrided {
    /// Id.
    pub id: u64,
    /// Key.
    pub rkey: u64,
    /// First piece.
    pub addr: u64,
    /// Bytes per piece.
    pub len: u64,
    /// Distance.
    pub stride: u64,
    /// Pieces.
    pub count: u64,
}

impl From<FStrided> for StridedReq {
    fn from(r: FStrided) -> StridedReq {
        StridedReq {
            id: r.id,
            rkey: r.rkey,
            addr: r.addr,
            len: r.len,
            stride: r.stride,
            count: r.count,
        }
    }
}

/// Every message of the protocol with arbitrary field values. Encoding one gives a
/// well-framed message; its body may still be invalid (e.g. a name over the limit).
#[derive(Arbitrary, Debug, Clone)]
#[allow(missing_docs)]
pub enum FMsg {
    Hello {
        engine: String,
        channel: u8,
        session: u64,
    },
    Welcome {
        engine: String,
        session: u64,
        incarnation: u64,
    },
    Refuse {
        status: u32,
        reason: String,
    },
    MemTable(Vec<FRegion>),
    Notify {
        seq: u64,
        name: Vec<u8>,
        msg: Vec<u8>,
    },
    NotifyAck {
        seq: u64,
        status: u32,
    },
    Heartbeat {
        seq: u64,
    },
    Disconnect {
        reason: String,
    },
    WriteReq(FReq),
    ReadReq(FReq),
    WriteStridedReq(FStrided),
    ReadStridedReq(FStrided),
    ReadResp {
        id: u64,
        status: u32,
        len: u64,
    },
    Ack {
        id: u64,
        status: u32,
    },
    FabricInfo {
        boot_id: String,
        mnt_ns: u64,
        pid: u32,
        uid: u32,
        socket: String,
    },
    FabricTable(Vec<(u64, u64, u64, u32)>),
    Revoke {
        rkey: u64,
    },
    RevokeAck {
        rkey: u64,
    },
    VerbsInfo {
        device: String,
    },
    VerbsConnect {
        endpoint: Vec<u8>,
    },
    VerbsAccept {
        status: u32,
        endpoint: Vec<u8>,
        reason: String,
    },
    VerbsKeys(Vec<(u64, u32)>),
    AuthChallenge {
        nonce: Vec<u8>,
    },
    AuthResponse {
        nonce: Vec<u8>,
        mac: Vec<u8>,
    },
    AuthProof {
        mac: Vec<u8>,
    },
}

impl FMsg {
    /// The message.
    pub fn into_message(self) -> Message {
        match self {
            FMsg::Hello {
                engine,
                channel,
                session,
            } => Message::Hello {
                engine,
                channel: match channel % 3 {
                    0 => Channel::Control,
                    1 => Channel::Data,
                    _ => Channel::Fabric,
                },
                session,
            },
            FMsg::Welcome {
                engine,
                session,
                incarnation,
            } => Message::Welcome {
                engine,
                session,
                incarnation,
            },
            FMsg::Refuse { status, reason } => Message::Refuse { status, reason },
            FMsg::MemTable(v) => Message::MemTable(v.iter().map(FRegion::region).collect()),
            FMsg::Notify { seq, name, msg } => Message::Notify { seq, name, msg },
            FMsg::NotifyAck { seq, status } => Message::NotifyAck { seq, status },
            FMsg::Heartbeat { seq } => Message::Heartbeat { seq },
            FMsg::Disconnect { reason } => Message::Disconnect { reason },
            FMsg::WriteReq(r) => Message::WriteReq(r.into()),
            FMsg::ReadReq(r) => Message::ReadReq(r.into()),
            FMsg::WriteStridedReq(r) => Message::WriteStridedReq(r.into()),
            FMsg::ReadStridedReq(r) => Message::ReadStridedReq(r.into()),
            FMsg::ReadResp { id, status, len } => Message::ReadResp { id, status, len },
            FMsg::Ack { id, status } => Message::Ack { id, status },
            FMsg::FabricInfo {
                boot_id,
                mnt_ns,
                pid,
                uid,
                socket,
            } => Message::FabricInfo {
                boot_id,
                mnt_ns,
                pid,
                uid,
                socket,
            },
            FMsg::FabricTable(v) => Message::FabricTable(
                v.into_iter()
                    .map(|(rkey, addr, len, fd_index)| FabricRegion {
                        rkey,
                        addr,
                        len,
                        fd_index,
                    })
                    .collect(),
            ),
            FMsg::Revoke { rkey } => Message::Revoke { rkey },
            FMsg::RevokeAck { rkey } => Message::RevokeAck { rkey },
            FMsg::VerbsInfo { device } => Message::VerbsInfo { device },
            FMsg::VerbsConnect { endpoint } => Message::VerbsConnect { endpoint },
            FMsg::VerbsAccept {
                status,
                endpoint,
                reason,
            } => Message::VerbsAccept {
                status,
                endpoint,
                reason,
            },
            FMsg::VerbsKeys(v) => Message::VerbsKeys(v),
            FMsg::AuthChallenge { nonce } => Message::AuthChallenge { nonce },
            FMsg::AuthResponse { nonce, mac } => Message::AuthResponse { nonce, mac },
            FMsg::AuthProof { mac } => Message::AuthProof { mac },
        }
    }
}
