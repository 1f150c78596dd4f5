//! Wire format of the control plane and the TCP data path: length-prefixed frames that decode
//! without panicking on any byte sequence.
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

use bytes::{Buf, BufMut, BytesMut};

use crate::types::{Access, MemKind, RemoteRegion, NOTIFY_MAX_LEN};

/// `"HIXL"` read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"HIXL");
/// Protocol version of this build.
pub const VERSION: u8 = 1;
/// Size of a frame header.
pub const HEADER_LEN: usize = 12;
/// Largest control body accepted (HIXL's control plane allows 4 MB).
pub const MAX_BODY: u32 = 4 << 20;
/// Largest engine name accepted.
pub const MAX_NAME: usize = 256;
/// The `Refuse` reason a server gives an engine that connected to itself (under another of
/// its addresses), so the initiator can report `ConnectToSelf` rather than a generic refusal.
pub const REFUSE_SELF: &str = "connect to self";
/// Largest payload a single data request may announce (1 TiB): anything above is malformed.
pub const MAX_PAYLOAD: u64 = 1 << 40;

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The magic is wrong: not a hixl peer, or the stream lost sync.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// A version this build does not speak.
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    /// An unknown frame type.
    #[error("unknown frame type {0}")]
    BadType(u8),
    /// Reserved flag bits set.
    #[error("reserved flags {0:#06x} set")]
    BadFlags(u16),
    /// A body longer than allowed.
    #[error("frame body of {0} bytes exceeds the limit")]
    TooLong(u32),
    /// The body ended before a field.
    #[error("frame body truncated reading {0}")]
    Truncated(&'static str),
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes after the frame body")]
    Trailing(usize),
    /// A field whose value is out of range.
    #[error("invalid {field}: {value}")]
    BadField {
        /// The field.
        field: &'static str,
        /// The value seen.
        value: u64,
    },
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Frame type.
    pub ty: u8,
    /// Body length.
    pub body_len: u32,
}

impl FrameHeader {
    /// Decodes and checks a header.
    ///
    /// # Errors
    /// [`WireError`] for a short buffer, wrong magic, version, type or flags, or a body over
    /// [`MAX_BODY`].
    pub fn decode(b: &[u8]) -> Result<FrameHeader, WireError> {
        let mut b = b;
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated("header"));
        }
        let magic = b.get_u32_le();
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = b.get_u8();
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        let ty = b.get_u8();
        if !(1..=ty::LAST).contains(&ty) {
            return Err(WireError::BadType(ty));
        }
        let flags = b.get_u16_le();
        if flags != 0 {
            return Err(WireError::BadFlags(flags));
        }
        let body_len = b.get_u32_le();
        if body_len > MAX_BODY {
            return Err(WireError::TooLong(body_len));
        }
        Ok(FrameHeader { ty, body_len })
    }
}

/// Frame type numbers.
pub mod ty {
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
    /// The highest type number.
    pub const LAST: u8 = AUTH_PROOF;
}

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
    /// [`HEARTBEAT_FROM_TARGET`] set, so neither end answers an answer.
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

/// Bit set in the sequence numbers of heartbeats a target originates.
pub const HEARTBEAT_FROM_TARGET: u64 = 1 << 63;

/// Longest nonce or MAC an authentication message may carry.
pub const MAX_AUTH: usize = 64;

/// Longest queue-pair endpoint a `VerbsConnect`/`VerbsAccept` may carry.
pub const MAX_ENDPOINT: usize = 64;

/// Size of the body of a data request frame.
pub const DATA_REQ_BODY: usize = 32;
/// Size of a whole `WriteReq`/`ReadReq` frame.
pub const DATA_REQ_FRAME: usize = HEADER_LEN + DATA_REQ_BODY;
/// Size of a whole `ReadResp` frame.
pub const READ_RESP_FRAME: usize = HEADER_LEN + 20;
/// Size of a whole `Ack` frame.
pub const ACK_FRAME: usize = HEADER_LEN + 12;

fn put_header(out: &mut impl BufMut, ty: u8, body_len: usize) {
    out.put_u32_le(MAGIC);
    out.put_u8(VERSION);
    out.put_u8(ty);
    out.put_u16_le(0);
    out.put_u32_le(body_len as u32);
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u16_le(b.len().min(u16::MAX as usize) as u16);
    out.put_slice(&b[..b.len().min(u16::MAX as usize)]);
}

/// Encodes a data request frame on the stack (the hot path allocates nothing).
pub fn encode_data_req(write: bool, r: &DataReq) -> [u8; DATA_REQ_FRAME] {
    let mut a = [0u8; DATA_REQ_FRAME];
    let mut b = &mut a[..];
    put_header(
        &mut b,
        if write { ty::WRITE_REQ } else { ty::READ_REQ },
        DATA_REQ_BODY,
    );
    b.put_u64_le(r.id);
    b.put_u64_le(r.rkey);
    b.put_u64_le(r.addr);
    b.put_u64_le(r.len);
    a
}

/// Encodes a `ReadResp` frame on the stack.
pub fn encode_read_resp(id: u64, status: u32, len: u64) -> [u8; READ_RESP_FRAME] {
    let mut a = [0u8; READ_RESP_FRAME];
    let mut b = &mut a[..];
    put_header(&mut b, ty::READ_RESP, 20);
    b.put_u64_le(id);
    b.put_u32_le(status);
    b.put_u64_le(len);
    a
}

/// Encodes an `Ack` frame on the stack.
pub fn encode_ack(id: u64, status: u32) -> [u8; ACK_FRAME] {
    let mut a = [0u8; ACK_FRAME];
    let mut b = &mut a[..];
    put_header(&mut b, ty::ACK, 12);
    b.put_u64_le(id);
    b.put_u32_le(status);
    a
}

impl Message {
    /// Appends the whole frame (header and body) to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        put_header(out, 0, 0);
        let body_start = out.len();
        let t = match self {
            Message::Hello {
                engine,
                channel,
                session,
            } => {
                put_bytes(out, engine.as_bytes());
                out.put_u8(match channel {
                    Channel::Control => 0,
                    Channel::Data => 1,
                    Channel::Fabric => 2,
                });
                out.put_u64_le(*session);
                ty::HELLO
            }
            Message::Welcome { engine, session } => {
                put_bytes(out, engine.as_bytes());
                out.put_u64_le(*session);
                ty::WELCOME
            }
            Message::Refuse { status, reason } => {
                out.put_u32_le(*status);
                put_bytes(out, reason.as_bytes());
                ty::REFUSE
            }
            Message::MemTable(regions) => {
                out.put_u32_le(regions.len() as u32);
                for r in regions {
                    out.put_u64_le(r.addr);
                    out.put_u64_le(r.len);
                    out.put_u64_le(r.rkey);
                    out.put_u8(r.access.bits());
                    out.put_u8(r.kind.code());
                    put_bytes(out, r.name.as_deref().unwrap_or("").as_bytes());
                }
                ty::MEM_TABLE
            }
            Message::Notify { seq, name, msg } => {
                out.put_u64_le(*seq);
                put_bytes(out, name);
                put_bytes(out, msg);
                ty::NOTIFY
            }
            Message::NotifyAck { seq, status } => {
                out.put_u64_le(*seq);
                out.put_u32_le(*status);
                ty::NOTIFY_ACK
            }
            Message::Heartbeat { seq } => {
                out.put_u64_le(*seq);
                ty::HEARTBEAT
            }
            Message::Disconnect { reason } => {
                put_bytes(out, reason.as_bytes());
                ty::DISCONNECT
            }
            Message::WriteReq(r) | Message::ReadReq(r) => {
                out.put_u64_le(r.id);
                out.put_u64_le(r.rkey);
                out.put_u64_le(r.addr);
                out.put_u64_le(r.len);
                if matches!(self, Message::WriteReq(_)) {
                    ty::WRITE_REQ
                } else {
                    ty::READ_REQ
                }
            }
            Message::ReadResp { id, status, len } => {
                out.put_u64_le(*id);
                out.put_u32_le(*status);
                out.put_u64_le(*len);
                ty::READ_RESP
            }
            Message::Ack { id, status } => {
                out.put_u64_le(*id);
                out.put_u32_le(*status);
                ty::ACK
            }
            Message::FabricInfo {
                boot_id,
                mnt_ns,
                pid,
                uid,
                socket,
            } => {
                put_bytes(out, boot_id.as_bytes());
                out.put_u64_le(*mnt_ns);
                out.put_u32_le(*pid);
                out.put_u32_le(*uid);
                put_bytes(out, socket.as_bytes());
                ty::FABRIC_INFO
            }
            Message::FabricTable(v) => {
                out.put_u32_le(v.len() as u32);
                for r in v {
                    out.put_u64_le(r.rkey);
                    out.put_u64_le(r.addr);
                    out.put_u64_le(r.len);
                    out.put_u32_le(r.fd_index);
                }
                ty::FABRIC_TABLE
            }
            Message::Revoke { rkey } => {
                out.put_u64_le(*rkey);
                ty::REVOKE
            }
            Message::RevokeAck { rkey } => {
                out.put_u64_le(*rkey);
                ty::REVOKE_ACK
            }
            Message::VerbsInfo { device } => {
                put_bytes(out, device.as_bytes());
                ty::VERBS_INFO
            }
            Message::VerbsConnect { endpoint } => {
                put_bytes(out, endpoint);
                ty::VERBS_CONNECT
            }
            Message::VerbsAccept {
                status,
                endpoint,
                reason,
            } => {
                out.put_u32_le(*status);
                put_bytes(out, endpoint);
                put_bytes(out, reason.as_bytes());
                ty::VERBS_ACCEPT
            }
            Message::AuthChallenge { nonce } => {
                put_bytes(out, nonce);
                ty::AUTH_CHALLENGE
            }
            Message::AuthResponse { nonce, mac } => {
                put_bytes(out, nonce);
                put_bytes(out, mac);
                ty::AUTH_RESPONSE
            }
            Message::AuthProof { mac } => {
                put_bytes(out, mac);
                ty::AUTH_PROOF
            }
            Message::VerbsKeys(v) => {
                out.put_u32_le(v.len() as u32);
                for (rkey, dev) in v {
                    out.put_u64_le(*rkey);
                    out.put_u32_le(*dev);
                }
                ty::VERBS_KEYS
            }
        };
        let body_len = (out.len() - body_start) as u32;
        out[start + 5] = t;
        out[start + 8..start + 12].copy_from_slice(&body_len.to_le_bytes());
    }

    /// Decodes the body of a frame of type `ty`.
    ///
    /// # Errors
    /// [`WireError`] for any body that is not exactly a valid message of that type.
    pub fn decode_body(ty: u8, body: &[u8]) -> Result<Message, WireError> {
        let mut r = Reader(body);
        let m = match ty {
            ty::HELLO => {
                let engine = r.string("engine", MAX_NAME)?;
                let channel = match r.u8("channel")? {
                    0 => Channel::Control,
                    1 => Channel::Data,
                    2 => Channel::Fabric,
                    v => {
                        return Err(WireError::BadField {
                            field: "channel",
                            value: v.into(),
                        })
                    }
                };
                let session = r.u64("session")?;
                Message::Hello {
                    engine,
                    channel,
                    session,
                }
            }
            ty::WELCOME => Message::Welcome {
                engine: r.string("engine", MAX_NAME)?,
                session: r.u64("session")?,
            },
            ty::REFUSE => Message::Refuse {
                status: r.u32("status")?,
                reason: r.string("reason", u16::MAX as usize)?,
            },
            ty::MEM_TABLE => {
                let n = r.u32("region count")?;
                // 28 bytes is the smallest region entry: a count larger than the body allows
                // is refused before anything is allocated for it.
                if u64::from(n) * 28 > r.0.len() as u64 {
                    return Err(WireError::BadField {
                        field: "region count",
                        value: n.into(),
                    });
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let addr = r.u64("region addr")?;
                    let len = r.u64("region len")?;
                    let rkey = r.u64("region rkey")?;
                    let access = r.u8("region access")?;
                    if access > 3 {
                        return Err(WireError::BadField {
                            field: "region access",
                            value: access.into(),
                        });
                    }
                    let kind = r.u8("region kind")?;
                    let kind = MemKind::from_code(kind).ok_or(WireError::BadField {
                        field: "region kind",
                        value: kind.into(),
                    })?;
                    if len == 0 || addr.checked_add(len).is_none() {
                        return Err(WireError::BadField {
                            field: "region len",
                            value: len,
                        });
                    }
                    let name = r.string("region name", MAX_NAME)?;
                    v.push(RemoteRegion {
                        addr,
                        len,
                        rkey,
                        access: Access::from_bits(access),
                        kind,
                        name: (!name.is_empty()).then_some(name),
                    });
                }
                Message::MemTable(v)
            }
            ty::NOTIFY => Message::Notify {
                seq: r.u64("seq")?,
                name: r.bytes("notify name", NOTIFY_MAX_LEN)?.to_vec(),
                msg: r.bytes("notify msg", NOTIFY_MAX_LEN)?.to_vec(),
            },
            ty::NOTIFY_ACK => Message::NotifyAck {
                seq: r.u64("seq")?,
                status: r.u32("status")?,
            },
            ty::HEARTBEAT => Message::Heartbeat { seq: r.u64("seq")? },
            ty::DISCONNECT => Message::Disconnect {
                reason: r.string("reason", u16::MAX as usize)?,
            },
            ty::WRITE_REQ | ty::READ_REQ => {
                let req = DataReq {
                    id: r.u64("id")?,
                    rkey: r.u64("rkey")?,
                    addr: r.u64("addr")?,
                    len: r.u64("len")?,
                };
                if req.len == 0 || req.len > MAX_PAYLOAD {
                    return Err(WireError::BadField {
                        field: "len",
                        value: req.len,
                    });
                }
                if ty == ty::WRITE_REQ {
                    Message::WriteReq(req)
                } else {
                    Message::ReadReq(req)
                }
            }
            ty::READ_RESP => {
                let id = r.u64("id")?;
                let status = r.u32("status")?;
                let len = r.u64("len")?;
                if len > MAX_PAYLOAD {
                    return Err(WireError::BadField {
                        field: "len",
                        value: len,
                    });
                }
                Message::ReadResp { id, status, len }
            }
            ty::ACK => Message::Ack {
                id: r.u64("id")?,
                status: r.u32("status")?,
            },
            ty::FABRIC_INFO => Message::FabricInfo {
                boot_id: r.string("boot id", MAX_NAME)?,
                mnt_ns: r.u64("mount namespace")?,
                pid: r.u32("pid")?,
                uid: r.u32("uid")?,
                socket: r.string("fabric socket", MAX_NAME)?,
            },
            ty::FABRIC_TABLE => {
                let n = r.u32("fabric region count")?;
                if u64::from(n) * 28 > r.0.len() as u64 {
                    return Err(WireError::BadField {
                        field: "fabric region count",
                        value: n.into(),
                    });
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let fr = FabricRegion {
                        rkey: r.u64("fabric rkey")?,
                        addr: r.u64("fabric addr")?,
                        len: r.u64("fabric len")?,
                        fd_index: r.u32("fabric fd index")?,
                    };
                    if fr.len == 0 || fr.addr.checked_add(fr.len).is_none() {
                        return Err(WireError::BadField {
                            field: "fabric len",
                            value: fr.len,
                        });
                    }
                    v.push(fr);
                }
                Message::FabricTable(v)
            }
            ty::REVOKE => Message::Revoke {
                rkey: r.u64("rkey")?,
            },
            ty::REVOKE_ACK => Message::RevokeAck {
                rkey: r.u64("rkey")?,
            },
            ty::VERBS_INFO => Message::VerbsInfo {
                device: r.string("verbs device", MAX_NAME)?,
            },
            ty::VERBS_CONNECT => Message::VerbsConnect {
                endpoint: r.bytes("endpoint", MAX_ENDPOINT)?.to_vec(),
            },
            ty::VERBS_ACCEPT => Message::VerbsAccept {
                status: r.u32("status")?,
                endpoint: r.bytes("endpoint", MAX_ENDPOINT)?.to_vec(),
                reason: r.string("reason", MAX_NAME)?,
            },
            ty::AUTH_CHALLENGE => Message::AuthChallenge {
                nonce: r.bytes("nonce", MAX_AUTH)?.to_vec(),
            },
            ty::AUTH_RESPONSE => Message::AuthResponse {
                nonce: r.bytes("nonce", MAX_AUTH)?.to_vec(),
                mac: r.bytes("mac", MAX_AUTH)?.to_vec(),
            },
            ty::AUTH_PROOF => Message::AuthProof {
                mac: r.bytes("mac", MAX_AUTH)?.to_vec(),
            },
            ty::VERBS_KEYS => {
                let n = r.u32("verbs key count")?;
                if u64::from(n) * 12 > r.0.len() as u64 {
                    return Err(WireError::BadField {
                        field: "verbs key count",
                        value: n.into(),
                    });
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push((r.u64("verbs rkey")?, r.u32("device rkey")?));
                }
                Message::VerbsKeys(v)
            }
            other => return Err(WireError::BadType(other)),
        };
        if !r.0.is_empty() {
            return Err(WireError::Trailing(r.0.len()));
        }
        Ok(m)
    }

    /// Takes one whole frame off the front of `buf`, if one is there.
    ///
    /// Returns `Ok(None)` when more bytes are needed. Payloads that follow data frames are not
    /// consumed: the caller moves them itself.
    ///
    /// # Errors
    /// [`WireError`] for a malformed header or body; the stream is then unusable.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Message>, WireError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let h = FrameHeader::decode(&buf[..HEADER_LEN])?;
        let total = HEADER_LEN + h.body_len as usize;
        if buf.len() < total {
            return Ok(None);
        }
        let frame = buf.split_to(total);
        Message::decode_body(h.ty, &frame[HEADER_LEN..]).map(Some)
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn need(&self, n: usize, what: &'static str) -> Result<(), WireError> {
        if self.0.len() < n {
            Err(WireError::Truncated(what))
        } else {
            Ok(())
        }
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        self.need(1, what)?;
        Ok(self.0.get_u8())
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        self.need(4, what)?;
        Ok(self.0.get_u32_le())
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        self.need(8, what)?;
        Ok(self.0.get_u64_le())
    }
    fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], WireError> {
        self.need(2, what)?;
        let n = self.0.get_u16_le() as usize;
        if n > max {
            return Err(WireError::BadField {
                field: what,
                value: n as u64,
            });
        }
        self.need(n, what)?;
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn string(&mut self, what: &'static str, max: usize) -> Result<String, WireError> {
        let b = self.bytes(what, max)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::BadField {
            field: what,
            value: b.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Message> {
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

    #[test]
    fn stack_encoders_match() {
        let r = DataReq {
            id: 9,
            rkey: 8,
            addr: 7,
            len: 6,
        };
        let mut b = BytesMut::new();
        Message::WriteReq(r).encode(&mut b);
        assert_eq!(&b[..], &encode_data_req(true, &r)[..]);
        b.clear();
        Message::ReadResp {
            id: 1,
            status: 2,
            len: 3,
        }
        .encode(&mut b);
        assert_eq!(&b[..], &encode_read_resp(1, 2, 3)[..]);
        b.clear();
        Message::Ack { id: 1, status: 2 }.encode(&mut b);
        assert_eq!(&b[..], &encode_ack(1, 2)[..]);
    }

    #[test]
    fn partial_frames_wait_for_more() {
        let mut whole = BytesMut::new();
        Message::Heartbeat { seq: 1 }.encode(&mut whole);
        for cut in 0..whole.len() {
            let mut b = BytesMut::from(&whole[..cut]);
            assert_eq!(Message::decode(&mut b), Ok(None));
        }
    }

    #[test]
    fn malformed_headers() {
        let mut good = BytesMut::new();
        Message::Heartbeat { seq: 1 }.encode(&mut good);
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert!(matches!(
            Message::decode(&mut bad),
            Err(WireError::BadMagic(_))
        ));
        let mut bad = good.clone();
        bad[4] = 9;
        assert!(matches!(
            Message::decode(&mut bad),
            Err(WireError::BadVersion(9))
        ));
        let mut bad = good.clone();
        bad[5] = 200;
        assert!(matches!(
            Message::decode(&mut bad),
            Err(WireError::BadType(200))
        ));
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
        assert!(matches!(
            Message::decode(&mut bad),
            Err(WireError::TooLong(_))
        ));
        let mut bad = good.clone();
        bad.extend_from_slice(&[0; 3]);
        bad[8..12].copy_from_slice(&11u32.to_le_bytes());
        assert!(matches!(
            Message::decode(&mut bad),
            Err(WireError::Trailing(3))
        ));
    }

    #[test]
    fn oversized_counts_and_lengths_are_refused() {
        let mut b = BytesMut::new();
        put_header(&mut b, ty::MEM_TABLE, 4);
        b.put_u32_le(u32::MAX);
        assert!(Message::decode(&mut b).is_err());
        let mut b = BytesMut::new();
        Message::WriteReq(DataReq {
            id: 1,
            rkey: 1,
            addr: 1,
            len: MAX_PAYLOAD + 1,
        })
        .encode(&mut b);
        assert!(Message::decode(&mut b).is_err());
        let mut b = BytesMut::new();
        Message::Notify {
            seq: 1,
            name: vec![b'x'; 1025],
            msg: vec![],
        }
        .encode(&mut b);
        assert!(Message::decode(&mut b).is_err());
    }

    proptest! {
        #[test]
        fn never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut b = BytesMut::from(&bytes[..]);
            let _ = Message::decode(&mut b);
        }

        // Valid header, random body: exercises every body decoder.
        #[test]
        fn never_panics_on_random_bodies(t in 1u8..=ty::LAST, body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut b = BytesMut::new();
            put_header(&mut b, t, body.len());
            b.extend_from_slice(&body);
            let _ = Message::decode(&mut b);
        }

        // Any single corruption of a valid frame is either rejected or still decodes.
        #[test]
        fn mutation_never_panics(idx in 0usize..18, pos in any::<usize>(), val in any::<u8>()) {
            let all = samples();
            let m = &all[idx % all.len()];
            let mut b = BytesMut::new();
            m.encode(&mut b);
            let p = pos % b.len();
            b[p] = val;
            let _ = Message::decode(&mut b);
        }
    }
}
