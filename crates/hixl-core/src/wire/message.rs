//! The messages of the protocol and the types they carry.

use crate::types::RemoteRegion;

/// What a new TCP connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The control connection of a link: handshake, memory table, notifies, heartbeats.
    Control,
    /// A data connection of an established link, bound to it by the session id.
    Data,
    /// The same-host fabric channel of a link (a Unix socket that carries memfds).
    Fabric,
}

/// How a same-host peer reaches one exported region: through a shared mapping of the memfd
/// sent alongside (`fd_index`), or with cross-memory attach into the exporter's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricRegion {
    /// The region's rkey (matches the memory table).
    pub rkey: u64,
    /// Start address in the exporter.
    pub addr: u64,
    /// Length.
    pub len: u64,
    /// Index of the region's memfd among the fds sent with the message, or [`NO_FD`] for
    /// memory reached with process_vm_readv/writev.
    pub fd_index: u32,
}

/// [`FabricRegion::fd_index`] of a region without a memfd.
pub const NO_FD: u32 = u32::MAX;

/// A data-path request: move `len` bytes at `addr` of the region with `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataReq {
    /// Request id, echoed in the answer.
    pub id: u64,
    /// Key of the target region.
    pub rkey: u64,
    /// Target address.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// A strided data-path request: `count` pieces of `len` bytes, piece `i` at
/// `addr + i × stride` of the region with `rkey`. The payload (a write's, or a read's answer)
/// is the pieces back to back: `len × count` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedReq {
    /// Request id, echoed in the answer.
    pub id: u64,
    /// Key of the target region.
    pub rkey: u64,
    /// First piece's target address.
    pub addr: u64,
    /// Bytes per piece.
    pub len: u64,
    /// Distance between pieces.
    pub stride: u64,
    /// Pieces, 1..=[`MAX_STRIDED_PIECES`].
    pub count: u64,
}

/// Pieces of one strided request at most.
pub const MAX_STRIDED_PIECES: u64 = 1024;

impl StridedReq {
    /// Payload bytes: `len × count` (checked at decode to fit [`super::MAX_PAYLOAD`]).
    pub fn bytes(&self) -> u64 {
        self.len.saturating_mul(self.count)
    }
}

/// Every message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// First frame on every connection, from the connecting side.
    Hello {
        /// The sender's engine address (`ip` or `ip:port`).
        engine: String,
        /// What the connection is for.
        channel: Channel,
        /// For data channels, the session the target handed out in `Welcome`.
        session: u64,
    },
    /// The target accepts a control connection.
    Welcome {
        /// The target's engine address.
        engine: String,
        /// Session id that data connections must present.
        session: u64,
        /// The target engine's incarnation: random per engine start, so that a target
        /// restarted on the same address is told apart from the one before.
        incarnation: u64,
    },
    /// The target refuses a connection.
    Refuse {
        /// HIXL status code.
        status: u32,
        /// Why.
        reason: String,
    },
    /// The regions the sender makes remotely accessible.
    MemTable(Vec<RemoteRegion>),
    /// A notify from initiator to target.
    Notify {
        /// Sequence number, echoed in the ack.
        seq: u64,
        /// Name (≤ 1024 bytes).
        name: Vec<u8>,
        /// Message (≤ 1024 bytes).
        msg: Vec<u8>,
    },
    /// The target's answer to a notify.
    NotifyAck {
        /// Sequence number of the notify.
        seq: u64,
        /// HIXL status code (`RESOURCE_EXHAUSTED` when the queue is full).
        status: u32,
    },
    /// Liveness probe on a control connection, answered with a heartbeat of the same
    /// sequence number. Both ends probe, each at its own interval: the target's probes have
    /// [`HEARTBEAT_FROM_TARGET`](super::HEARTBEAT_FROM_TARGET) set, so neither end answers an
    /// answer.
    Heartbeat {
        /// Sequence number.
        seq: u64,
    },
    /// Orderly close of a link.
    Disconnect {
        /// Why.
        reason: String,
    },
    /// Write the payload that follows into target memory.
    WriteReq(DataReq),
    /// Read target memory.
    ReadReq(DataReq),
    /// Write the payload that follows into the pieces of target memory.
    WriteStridedReq(StridedReq),
    /// Read the pieces of target memory (answered by one `ReadResp` of their bytes).
    ReadStridedReq(StridedReq),
    /// Answer to a `ReadReq`; a payload of `len` bytes follows when `status` is 0.
    ReadResp {
        /// Request id.
        id: u64,
        /// HIXL status code.
        status: u32,
        /// Payload length.
        len: u64,
    },
    /// Answer to a `WriteReq`, sent after the payload is in target memory.
    Ack {
        /// Request id.
        id: u64,
        /// HIXL status code.
        status: u32,
    },
    /// The target's host identity and fabric socket, so a same-host initiator can use the
    /// fabric backend.
    FabricInfo {
        /// `/proc/sys/kernel/random/boot_id`.
        boot_id: String,
        /// Inode of the mount namespace.
        mnt_ns: u64,
        /// Process id (for cross-memory attach).
        pid: u32,
        /// User id.
        uid: u32,
        /// Abstract Unix socket name of the fabric channel.
        socket: String,
    },
    /// How the regions of the memory table are reached over the fabric (memfds ride along).
    FabricTable(Vec<FabricRegion>),
    /// The target is deregistering the region with this rkey: stop using it, finish what is
    /// in flight, unmap, then answer `RevokeAck`.
    Revoke {
        /// The region's rkey.
        rkey: u64,
    },
    /// The initiator no longer touches the region.
    RevokeAck {
        /// The region's rkey.
        rkey: u64,
    },
    /// The target has an active RDMA device and offers the verbs transport (sent before the
    /// memory table).
    VerbsInfo {
        /// The device's name, for the initiator's log and `Peer::transport`.
        device: String,
    },
    /// The initiator asks for an RC queue pair connected to its own.
    VerbsConnect {
        /// The initiator's queue-pair endpoint (`hixl_verbs::QpEndpoint`, ≤ 64 bytes).
        endpoint: Vec<u8>,
    },
    /// The target's answer to `VerbsConnect`.
    VerbsAccept {
        /// HIXL status code: 0 when the QP is connected and `endpoint` is the target's.
        status: u32,
        /// The target's queue-pair endpoint (empty on refusal).
        endpoint: Vec<u8>,
        /// Why not, on refusal.
        reason: String,
    },
    /// Device keys of the sender's exported regions: `(rkey of the memory table, the memory
    /// region's device rkey)`. Sent on verbs links before every memory table.
    VerbsKeys(Vec<(u64, u32)>),
    /// A target with a shared secret challenges a new control connection (before `Welcome`);
    /// see [`crate::auth`].
    AuthChallenge {
        /// The target's nonce.
        nonce: Vec<u8>,
    },
    /// The initiator's answer: its nonce and MAC (both empty when it has no secret).
    AuthResponse {
        /// The initiator's nonce.
        nonce: Vec<u8>,
        /// HMAC-SHA256 over both nonces.
        mac: Vec<u8>,
    },
    /// The target's proof that it knows the secret too.
    AuthProof {
        /// HMAC-SHA256 over both nonces, with the target's label.
        mac: Vec<u8>,
    },
}

#[cfg(test)]
pub(super) mod tests {
    use bytes::BytesMut;

    use super::*;
    use crate::types::{Access, MemKind};

    /// One message of every type (and of some types several), as encoded and decoded by the
    /// tests of the wire modules.
    pub(in crate::wire) fn samples() -> Vec<Message> {
        vec![
            Message::Hello {
                engine: "127.0.0.1:9000".into(),
                channel: Channel::Control,
                session: 0,
            },
            Message::Hello {
                engine: "[::1]:1".into(),
                channel: Channel::Data,
                session: 77,
            },
            Message::Welcome {
                engine: "10.0.0.1:2".into(),
                session: 5,
                incarnation: 0x1ca7,
            },
            Message::Refuse {
                status: 103900,
                reason: "no".into(),
            },
            Message::MemTable(vec![RemoteRegion {
                addr: 0x1000,
                len: 4096,
                rkey: 0xdead_beef,
                access: Access::REMOTE_RW,
                kind: MemKind::Host,
                name: Some("kv".into()),
            }]),
            Message::MemTable(vec![]),
            Message::Notify {
                seq: 3,
                name: b"cache_ready".to_vec(),
                msg: b"block_0".to_vec(),
            },
            Message::NotifyAck { seq: 3, status: 0 },
            Message::Heartbeat { seq: 9 },
            Message::Disconnect {
                reason: "bye".into(),
            },
            Message::WriteReq(DataReq {
                id: 1,
                rkey: 2,
                addr: 3,
                len: 4,
            }),
            Message::ReadReq(DataReq {
                id: 1,
                rkey: 2,
                addr: 3,
                len: 4,
            }),
            Message::WriteStridedReq(StridedReq {
                id: 1,
                rkey: 2,
                addr: 3,
                len: 4,
                stride: 8,
                count: 5,
            }),
            Message::ReadStridedReq(StridedReq {
                id: 1,
                rkey: 2,
                addr: 3,
                len: 4,
                stride: 4,
                count: 1024,
            }),
            Message::ReadResp {
                id: 1,
                status: 0,
                len: 4,
            },
            Message::Ack { id: 1, status: 0 },
            Message::FabricInfo {
                boot_id: "b1c2".into(),
                mnt_ns: 4026531841,
                pid: 42,
                uid: 0,
                socket: "hixl-42-7".into(),
            },
            Message::FabricTable(vec![FabricRegion {
                rkey: 9,
                addr: 0x1000,
                len: 4096,
                fd_index: NO_FD,
            }]),
            Message::Revoke { rkey: 9 },
            Message::RevokeAck { rkey: 9 },
            Message::VerbsInfo {
                device: "rxe0".into(),
            },
            Message::VerbsConnect {
                endpoint: vec![1; 32],
            },
            Message::VerbsAccept {
                status: 0,
                endpoint: vec![2; 32],
                reason: String::new(),
            },
            Message::VerbsAccept {
                status: 8,
                endpoint: vec![],
                reason: "no queue pair".into(),
            },
            Message::VerbsKeys(vec![(9, 0x1234), (u64::MAX, u32::MAX)]),
            Message::VerbsKeys(vec![]),
            Message::AuthChallenge { nonce: vec![3; 32] },
            Message::AuthResponse {
                nonce: vec![4; 32],
                mac: vec![5; 32],
            },
            Message::AuthResponse {
                nonce: vec![],
                mac: vec![],
            },
            Message::AuthProof { mac: vec![6; 32] },
        ]
    }

    #[test]
    fn round_trip_every_message() {
        for m in samples() {
            let mut b = BytesMut::new();
            m.encode(&mut b);
            let got = Message::decode(&mut b).unwrap().unwrap();
            assert_eq!(got, m);
            assert!(b.is_empty());
        }
    }
}
