//! Decoding of frame bodies into messages, refusing anything that is not exactly valid.

use bytes::Buf;

use super::{
    ty, Channel, DataReq, FabricRegion, Message, StridedReq, WireError, MAX_AUTH, MAX_ENDPOINT,
    MAX_NAME, MAX_PAYLOAD, MAX_STRIDED_PIECES,
};
use crate::types::{Access, MemKind, RemoteRegion, NOTIFY_MAX_LEN};

impl Message {
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
                incarnation: r.u64("incarnation")?,
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
            ty::WRITE_STRIDED_REQ | ty::READ_STRIDED_REQ => {
                let req = StridedReq {
                    id: r.u64("id")?,
                    rkey: r.u64("rkey")?,
                    addr: r.u64("addr")?,
                    len: r.u64("len")?,
                    stride: r.u64("stride")?,
                    count: r.u64("count")?,
                };
                if req.len == 0 || req.len > MAX_PAYLOAD {
                    return Err(WireError::BadField {
                        field: "len",
                        value: req.len,
                    });
                }
                if req.count == 0 || req.count > MAX_STRIDED_PIECES {
                    return Err(WireError::BadField {
                        field: "count",
                        value: req.count,
                    });
                }
                // Both bounded above: len × count cannot overflow.
                if req.len * req.count > MAX_PAYLOAD {
                    return Err(WireError::BadField {
                        field: "len",
                        value: req.len,
                    });
                }
                // The span's overflow and the pieces' overlap are the target's to refuse
                // (with a status, the stream staying in frame): the payload size is sound.
                if ty == ty::WRITE_STRIDED_REQ {
                    Message::WriteStridedReq(req)
                } else {
                    Message::ReadStridedReq(req)
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
    use bytes::{BufMut, BytesMut};
    use proptest::prelude::*;

    use super::super::frame::put_header;
    use super::super::message::tests::samples;
    use super::*;

    #[test]
    fn strided_requests_with_bad_sizes_are_refused_by_field() {
        let req = |len: u64, count: u64| {
            let mut b = BytesMut::new();
            Message::ReadStridedReq(StridedReq {
                id: 1,
                rkey: 2,
                addr: 3,
                len,
                stride: len,
                count,
            })
            .encode(&mut b);
            Message::decode(&mut b)
        };
        assert!(matches!(req(8, 1024), Ok(Some(_))));
        for (len, count, field) in [
            (8, 0, "count"),
            (8, MAX_STRIDED_PIECES + 1, "count"),
            (0, 4, "len"),
            (MAX_PAYLOAD / 4 + 1, 4, "len"),
        ] {
            match req(len, count) {
                Err(WireError::BadField { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{len} x {count}: {other:?}"),
            }
        }
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
