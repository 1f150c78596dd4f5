//! The fixed-size frames of the data path, encoded on the stack (the hot path allocates
//! nothing).

use bytes::BufMut;

use super::frame::put_header;
use super::{ty, DataReq, StridedReq, HEADER_LEN};

/// Size of the body of a data request frame.
pub const DATA_REQ_BODY: usize = 32;
/// Size of a whole `WriteReq`/`ReadReq` frame.
pub const DATA_REQ_FRAME: usize = HEADER_LEN + DATA_REQ_BODY;
/// Size of the body of a strided data request frame.
pub const STRIDED_REQ_BODY: usize = 48;
/// Size of a whole `WriteStridedReq`/`ReadStridedReq` frame.
pub const STRIDED_REQ_FRAME: usize = HEADER_LEN + STRIDED_REQ_BODY;
/// Size of a whole `ReadResp` frame.
pub const READ_RESP_FRAME: usize = HEADER_LEN + 20;
/// Size of a whole `Ack` frame.
pub const ACK_FRAME: usize = HEADER_LEN + 12;

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

/// Encodes a strided data request frame on the stack.
pub fn encode_strided_req(write: bool, r: &StridedReq) -> [u8; STRIDED_REQ_FRAME] {
    let mut a = [0u8; STRIDED_REQ_FRAME];
    let mut b = &mut a[..];
    put_header(
        &mut b,
        if write {
            ty::WRITE_STRIDED_REQ
        } else {
            ty::READ_STRIDED_REQ
        },
        STRIDED_REQ_BODY,
    );
    b.put_u64_le(r.id);
    b.put_u64_le(r.rkey);
    b.put_u64_le(r.addr);
    b.put_u64_le(r.len);
    b.put_u64_le(r.stride);
    b.put_u64_le(r.count);
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

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;
    use crate::wire::Message;

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
        let s = StridedReq {
            id: 9,
            rkey: 8,
            addr: 7,
            len: 6,
            stride: 10,
            count: 3,
        };
        b.clear();
        Message::ReadStridedReq(s).encode(&mut b);
        assert_eq!(&b[..], &encode_strided_req(false, &s)[..]);
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
}
