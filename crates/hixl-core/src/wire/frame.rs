//! The frame header, and taking whole frames off the front of a byte stream.

use bytes::{Buf, BufMut, BytesMut};

use super::{ty, Message, WireError, HEADER_LEN, MAGIC, MAX_BODY, VERSION};

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

pub(super) fn put_header(out: &mut impl BufMut, ty: u8, body_len: usize) {
    out.put_u32_le(MAGIC);
    out.put_u8(VERSION);
    out.put_u8(ty);
    out.put_u16_le(0);
    out.put_u32_le(body_len as u32);
}

impl Message {
    /// Appends the whole frame (header and body) to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let start = out.len();
        put_header(out, self.ty(), 0);
        self.put_body(out);
        let body_len = (out.len() - start - HEADER_LEN) as u32;
        out[start + 8..start + 12].copy_from_slice(&body_len.to_le_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
