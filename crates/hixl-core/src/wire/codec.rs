//! How the fields of a message body are written and read: the [`Field`] types, which encode
//! one way everywhere, and the codecs a message declaration names for fields that need a
//! bound ([`Text`], [`Blob`], [`Payload`], [`Entries`]).
//!
//! Reading refuses anything that is not exactly valid and names the field it was reading.

use bytes::{Buf, BufMut, BytesMut};

use super::MAX_STRIDED_PIECES;
use super::{Channel, DataReq, FabricRegion, StridedReq, WireError, MAX_NAME, MAX_PAYLOAD};
use crate::types::{Access, MemKind, RemoteRegion};

/// The unread rest of a frame body.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    fn need(&self, n: usize, what: &'static str) -> Result<(), WireError> {
        if self.0.len() < n {
            Err(WireError::Truncated(what))
        } else {
            Ok(())
        }
    }
    pub(super) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        self.need(1, what)?;
        Ok(self.0.get_u8())
    }
    pub(super) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        self.need(4, what)?;
        Ok(self.0.get_u32_le())
    }
    pub(super) fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        self.need(8, what)?;
        Ok(self.0.get_u64_le())
    }
    fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], WireError> {
        self.need(2, what)?;
        let n = self.0.get_u16_le() as usize;
        if n > max {
            return Err(bad(what, n as u64));
        }
        self.need(n, what)?;
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn string(&mut self, what: &'static str, max: usize) -> Result<String, WireError> {
        let b = self.bytes(what, max)?;
        String::from_utf8(b.to_vec()).map_err(|_| bad(what, b.len() as u64))
    }
}

fn bad(field: &'static str, value: u64) -> WireError {
    WireError::BadField { field, value }
}

/// Length-prefixed bytes (u16 length; longer input is cut at 65,535 bytes, which every
/// bound the decoder applies is below).
fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    let b = &b[..b.len().min(u16::MAX as usize)];
    out.put_u16_le(b.len() as u16);
    out.put_slice(b);
}

/// A value with one encoding wherever it appears.
pub(super) trait Field: Sized {
    /// Appends the value.
    fn put(&self, out: &mut BytesMut);
    /// Reads one, refusing an invalid value (`what` names the field in errors).
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, WireError>;
}

/// How a declared field is written and read.
pub(super) trait Codec<T> {
    /// Appends `v`.
    fn put(&self, v: &T, out: &mut BytesMut);
    /// Reads one.
    fn get(&self, r: &mut Reader<'_>, what: &'static str) -> Result<T, WireError>;
}

/// The field's own encoding ([`Field`]): the default.
pub(super) struct Plain;

impl<T: Field> Codec<T> for Plain {
    fn put(&self, v: &T, out: &mut BytesMut) {
        v.put(out)
    }
    fn get(&self, r: &mut Reader<'_>, what: &'static str) -> Result<T, WireError> {
        T::get(r, what)
    }
}

/// UTF-8 text of at most `.0` bytes.
pub(super) struct Text(pub(super) usize);

impl Codec<String> for Text {
    fn put(&self, v: &String, out: &mut BytesMut) {
        put_bytes(out, v.as_bytes())
    }
    fn get(&self, r: &mut Reader<'_>, what: &'static str) -> Result<String, WireError> {
        r.string(what, self.0)
    }
}

/// Bytes, at most `.0` of them.
pub(super) struct Blob(pub(super) usize);

impl Codec<Vec<u8>> for Blob {
    fn put(&self, v: &Vec<u8>, out: &mut BytesMut) {
        put_bytes(out, v)
    }
    fn get(&self, r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u8>, WireError> {
        Ok(r.bytes(what, self.0)?.to_vec())
    }
}

/// A payload length: at most [`MAX_PAYLOAD`].
pub(super) struct Payload;

impl Codec<u64> for Payload {
    fn put(&self, v: &u64, out: &mut BytesMut) {
        out.put_u64_le(*v)
    }
    fn get(&self, r: &mut Reader<'_>, what: &'static str) -> Result<u64, WireError> {
        let len = r.u64(what)?;
        if len > MAX_PAYLOAD {
            return Err(bad(what, len));
        }
        Ok(len)
    }
}

/// A u32 count then that many entries, each at least `.0` bytes on the wire: a count larger
/// than the body can hold is refused before anything is allocated for it.
pub(super) struct Entries(pub(super) u64);

impl<T: Field> Codec<Vec<T>> for Entries {
    fn put(&self, v: &Vec<T>, out: &mut BytesMut) {
        out.put_u32_le(v.len() as u32);
        for e in v {
            e.put(out);
        }
    }
    fn get(&self, r: &mut Reader<'_>, what: &'static str) -> Result<Vec<T>, WireError> {
        let n = r.u32(what)?;
        if u64::from(n) * self.0 > r.0.len() as u64 {
            return Err(bad(what, n.into()));
        }
        (0..n).map(|_| T::get(r, what)).collect()
    }
}

impl Field for u8 {
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(*self)
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<u8, WireError> {
        r.u8(what)
    }
}

impl Field for u32 {
    fn put(&self, out: &mut BytesMut) {
        out.put_u32_le(*self)
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<u32, WireError> {
        r.u32(what)
    }
}

impl Field for u64 {
    fn put(&self, out: &mut BytesMut) {
        out.put_u64_le(*self)
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<u64, WireError> {
        r.u64(what)
    }
}

impl Field for Channel {
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(match self {
            Channel::Control => 0,
            Channel::Data => 1,
            Channel::Fabric => 2,
        })
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Channel, WireError> {
        match r.u8(what)? {
            0 => Ok(Channel::Control),
            1 => Ok(Channel::Data),
            2 => Ok(Channel::Fabric),
            v => Err(bad(what, v.into())),
        }
    }
}

impl Field for DataReq {
    fn put(&self, out: &mut BytesMut) {
        for v in [self.id, self.rkey, self.addr, self.len] {
            out.put_u64_le(v);
        }
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<DataReq, WireError> {
        let req = DataReq {
            id: r.u64("id")?,
            rkey: r.u64("rkey")?,
            addr: r.u64("addr")?,
            len: r.u64("len")?,
        };
        if req.len == 0 || req.len > MAX_PAYLOAD {
            return Err(bad("len", req.len));
        }
        Ok(req)
    }
}

impl Field for StridedReq {
    fn put(&self, out: &mut BytesMut) {
        let StridedReq {
            id,
            rkey,
            addr,
            len,
            stride,
            count,
        } = *self;
        for v in [id, rkey, addr, len, stride, count] {
            out.put_u64_le(v);
        }
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<StridedReq, WireError> {
        let req = StridedReq {
            id: r.u64("id")?,
            rkey: r.u64("rkey")?,
            addr: r.u64("addr")?,
            len: r.u64("len")?,
            stride: r.u64("stride")?,
            count: r.u64("count")?,
        };
        if req.len == 0 || req.len > MAX_PAYLOAD {
            return Err(bad("len", req.len));
        }
        if req.count == 0 || req.count > MAX_STRIDED_PIECES {
            return Err(bad("count", req.count));
        }
        // Both bounded above: len × count cannot overflow.
        if req.len * req.count > MAX_PAYLOAD {
            return Err(bad("len", req.len));
        }
        // The span's overflow and the pieces' overlap are the target's to refuse (with a
        // status, the stream staying in frame): the payload size is sound.
        Ok(req)
    }
}

impl Field for RemoteRegion {
    fn put(&self, out: &mut BytesMut) {
        out.put_u64_le(self.addr);
        out.put_u64_le(self.len);
        out.put_u64_le(self.rkey);
        out.put_u8(self.access.bits());
        out.put_u8(self.kind.code());
        put_bytes(out, self.name.as_deref().unwrap_or("").as_bytes());
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<RemoteRegion, WireError> {
        let addr = r.u64("region addr")?;
        let len = r.u64("region len")?;
        let rkey = r.u64("region rkey")?;
        let access = r.u8("region access")?;
        if access > Access::REMOTE_RW.bits() {
            return Err(bad("region access", access.into()));
        }
        let kind = r.u8("region kind")?;
        let kind = MemKind::from_code(kind).ok_or(bad("region kind", kind.into()))?;
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(bad("region len", len));
        }
        let name = r.string("region name", MAX_NAME)?;
        Ok(RemoteRegion {
            addr,
            len,
            rkey,
            access: Access::from_bits(access),
            kind,
            name: (!name.is_empty()).then_some(name),
        })
    }
}

impl Field for FabricRegion {
    fn put(&self, out: &mut BytesMut) {
        out.put_u64_le(self.rkey);
        out.put_u64_le(self.addr);
        out.put_u64_le(self.len);
        out.put_u32_le(self.fd_index);
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<FabricRegion, WireError> {
        let fr = FabricRegion {
            rkey: r.u64("fabric rkey")?,
            addr: r.u64("fabric addr")?,
            len: r.u64("fabric len")?,
            fd_index: r.u32("fabric fd index")?,
        };
        if fr.len == 0 || fr.addr.checked_add(fr.len).is_none() {
            return Err(bad("fabric len", fr.len));
        }
        Ok(fr)
    }
}

impl Field for (u64, u32, u32) {
    fn put(&self, out: &mut BytesMut) {
        out.put_u64_le(self.0);
        out.put_u32_le(self.1);
        out.put_u32_le(self.2);
    }
    fn get(r: &mut Reader<'_>, _: &'static str) -> Result<(u64, u32, u32), WireError> {
        Ok((
            r.u64("verbs rkey")?,
            r.u32("device index")?,
            r.u32("device rkey")?,
        ))
    }
}
