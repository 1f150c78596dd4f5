//! The one declaration of the protocol's messages: frame type numbers, fields and their
//! bounds. [`super::declare`] generates the enum, [`super::ty`], the encoder and the decoder
//! from it (and, with the `arbitrary` feature, the fuzzers' generator).
//!
//! Frame type numbers are part of the wire: a message is only ever added at the end, and
//! the layout of `Hello` (1) and `Refuse` (3) before their last field is the same in every
//! version (see [`super::version`]).

use super::codec::{Blob, Entries, Payload, Text};
use super::declare::messages;
#[allow(unused_imports)] // in the docs of the generated enum
use super::{Channel, HEARTBEAT_FROM_TARGET};
use super::{
    DataReq, FabricRegion, StridedReq, MAX_AUTH, MAX_ENDPOINTS, MAX_NAME, MAX_VERBS_DEVICES,
    NO_LIMIT,
};
use crate::types::{RemoteRegion, NOTIFY_MAX_LEN};

messages! {
    /// First frame on every connection, from the connecting side. Its frame header carries
    /// the sender's wire version ([`super::VERSION`]).
    1 => HELLO, Hello {
        /// The sender's engine address (`ip` or `ip:port`).
        engine: String => Text(MAX_NAME),
        /// What the connection is for.
        channel: Channel,
        /// For data channels, the session the target handed out in `Welcome`; for a control
        /// channel, the sender's incarnation.
        session: u64,
        /// The optional parts of the protocol the sender speaks ([`super::feature`]).
        features: u64,
    },
    /// The target accepts a connection.
    2 => WELCOME, Welcome {
        /// The target's engine address.
        engine: String => Text(MAX_NAME),
        /// Session id that data connections must present.
        session: u64,
        /// The target engine's incarnation: random per engine start, so that a target
        /// restarted on the same address is told apart from the one before.
        incarnation: u64,
        /// The optional parts of the protocol the target speaks ([`super::feature`]): the
        /// link uses those both ends announced.
        features: u64,
    },
    /// The target refuses a connection.
    3 => REFUSE, Refuse {
        /// HIXL status code.
        status: u32,
        /// Why.
        reason: String => Text(NO_LIMIT),
    },
    /// The regions the sender makes remotely accessible.
    4 => MEM_TABLE, MemTable(regions: Vec<RemoteRegion> => Entries(28)),
    /// A notify from initiator to target.
    5 => NOTIFY, Notify {
        /// Sequence number, echoed in the ack.
        seq: u64,
        /// Name (≤ 1024 bytes).
        name: Vec<u8> => Blob(NOTIFY_MAX_LEN),
        /// Message (≤ 1024 bytes).
        msg: Vec<u8> => Blob(NOTIFY_MAX_LEN),
    },
    /// The target's answer to a notify.
    6 => NOTIFY_ACK, NotifyAck {
        /// Sequence number of the notify.
        seq: u64,
        /// HIXL status code (`RESOURCE_EXHAUSTED` when the queue is full).
        status: u32,
    },
    /// Liveness probe on a control connection, answered with a heartbeat of the same
    /// sequence number. Both ends probe, each at its own interval: the target's probes have
    /// [`HEARTBEAT_FROM_TARGET`] set, so neither end answers an answer.
    7 => HEARTBEAT, Heartbeat {
        /// Sequence number.
        seq: u64,
    },
    /// Orderly close of a link.
    8 => DISCONNECT, Disconnect {
        /// Why.
        reason: String => Text(NO_LIMIT),
    },
    /// Write the payload that follows into target memory.
    9 => WRITE_REQ, WriteReq(req: DataReq),
    /// Read target memory.
    10 => READ_REQ, ReadReq(req: DataReq),
    /// Answer to a `ReadReq`; a payload of `len` bytes follows when `status` is 0.
    11 => READ_RESP, ReadResp {
        /// Request id.
        id: u64,
        /// HIXL status code.
        status: u32,
        /// Payload length.
        len: u64 => Payload,
    },
    /// Answer to a `WriteReq`, sent after the payload is in target memory.
    12 => ACK, Ack {
        /// Request id.
        id: u64,
        /// HIXL status code.
        status: u32,
    },
    /// The target's host identity and fabric socket, so a same-host initiator can use the
    /// fabric backend.
    13 => FABRIC_INFO, FabricInfo {
        /// `/proc/sys/kernel/random/boot_id`.
        boot_id: String => Text(MAX_NAME),
        /// Inode of the mount namespace.
        mnt_ns: u64,
        /// Process id (for cross-memory attach).
        pid: u32,
        /// User id.
        uid: u32,
        /// Abstract Unix socket name of the fabric channel.
        socket: String => Text(MAX_NAME),
    },
    /// How the regions of the memory table are reached over the fabric (memfds ride along).
    14 => FABRIC_TABLE, FabricTable(regions: Vec<FabricRegion> => Entries(28)),
    /// The target is deregistering the region with this rkey: stop using it, finish what is
    /// in flight, unmap, then answer `RevokeAck`.
    15 => REVOKE, Revoke {
        /// The region's rkey.
        rkey: u64,
    },
    /// The initiator no longer touches the region.
    16 => REVOKE_ACK, RevokeAck {
        /// The region's rkey.
        rkey: u64,
    },
    /// The target has active RDMA devices and offers the verbs transport (sent before the
    /// memory table): each device's name, GID, subnet, active MTU and NUMA node
    /// (`hixl_verbs::NicInfo::encode_list`), in the order its rails name them.
    17 => VERBS_INFO, VerbsInfo {
        /// The encoded device list.
        devices: Vec<u8> => Blob(MAX_VERBS_DEVICES),
    },
    /// The initiator asks for rail `rail`: RC queue pairs on the target's device `device`,
    /// connected to the initiator's. Sent at connect for every rail, and again for a rail that
    /// failed and is probed back (the target then replaces that rail's queue pairs).
    18 => VERBS_CONNECT, VerbsConnect {
        /// The initiator's rail number.
        rail: u32,
        /// Index of the target's device in its `VerbsInfo`.
        device: u32,
        /// The initiator's queue-pair endpoints (`hixl_verbs::QpEndpoint`, 32 bytes each).
        endpoints: Vec<u8> => Blob(MAX_ENDPOINTS),
    },
    /// The target's answer to `VerbsConnect`.
    19 => VERBS_ACCEPT, VerbsAccept {
        /// The rail it answers.
        rail: u32,
        /// HIXL status code: 0 when the queue pairs are connected and `endpoints` are the
        /// target's, in the order of the initiator's.
        status: u32,
        /// The target's queue-pair endpoints (empty on refusal).
        endpoints: Vec<u8> => Blob(MAX_ENDPOINTS),
        /// Why not, on refusal.
        reason: String => Text(MAX_NAME),
    },
    /// Device keys of the sender's exported regions: `(rkey of the memory table, device index
    /// in its VerbsInfo, the memory region's rkey on that device)`. Sent on verbs links before
    /// every memory table.
    20 => VERBS_KEYS, VerbsKeys(keys: Vec<(u64, u32, u32)> => Entries(16)),
    /// A target with a shared secret challenges a new control connection (before `Welcome`);
    /// see [`crate::auth`].
    21 => AUTH_CHALLENGE, AuthChallenge {
        /// The target's nonce.
        nonce: Vec<u8> => Blob(MAX_AUTH),
    },
    /// The initiator's answer: its nonce and MAC (both empty when it has no secret).
    22 => AUTH_RESPONSE, AuthResponse {
        /// The initiator's nonce.
        nonce: Vec<u8> => Blob(MAX_AUTH),
        /// HMAC-SHA256 over both nonces.
        mac: Vec<u8> => Blob(MAX_AUTH),
    },
    /// The target's proof that it knows the secret too.
    23 => AUTH_PROOF, AuthProof {
        /// HMAC-SHA256 over both nonces, with the target's label.
        mac: Vec<u8> => Blob(MAX_AUTH),
    },
    /// Write the payload that follows into the pieces of target memory.
    24 => WRITE_STRIDED_REQ, WriteStridedReq(req: StridedReq),
    /// Read the pieces of target memory (answered by one `ReadResp` of their bytes).
    25 => READ_STRIDED_REQ, ReadStridedReq(req: StridedReq),
}
