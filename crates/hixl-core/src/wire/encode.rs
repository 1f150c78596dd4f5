//! Encoding of messages into frames.

use bytes::{BufMut, BytesMut};

use super::frame::put_header;
use super::{ty, Channel, Message};

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u16_le(b.len().min(u16::MAX as usize) as u16);
    out.put_slice(&b[..b.len().min(u16::MAX as usize)]);
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
            Message::Welcome {
                engine,
                session,
                incarnation,
            } => {
                put_bytes(out, engine.as_bytes());
                out.put_u64_le(*session);
                out.put_u64_le(*incarnation);
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
            Message::WriteStridedReq(r) | Message::ReadStridedReq(r) => {
                out.put_u64_le(r.id);
                out.put_u64_le(r.rkey);
                out.put_u64_le(r.addr);
                out.put_u64_le(r.len);
                out.put_u64_le(r.stride);
                out.put_u64_le(r.count);
                if matches!(self, Message::WriteStridedReq(_)) {
                    ty::WRITE_STRIDED_REQ
                } else {
                    ty::READ_STRIDED_REQ
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
}
