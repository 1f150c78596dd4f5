//! Fuzz target for hixl-core's frame codec: arbitrary bytes through `FrameHeader::decode`,
//! `Message::decode` (repeatedly, as a stream reader would) and `Message::decode_body`, with a
//! round-trip invariant on every message that decodes.
//!
//! Invariants checked:
//! - nothing panics, and `Message::decode` either consumes a whole frame or leaves the buffer
//!   untouched (`Ok(None)` / `Err`), so a reader loop always makes progress;
//! - a header that decodes has a known type and a body within `MAX_BODY`;
//! - every decoded message re-encodes to exactly the bytes it was decoded from (the encoding is
//!   canonical), and those bytes decode back to an equal message with nothing left over;
//! - the allocation-free encoders of the data path (`encode_data_req`, `encode_strided_req`,
//!   `encode_read_resp`, `encode_ack`) agree byte for byte with `Message::encode`.
#![no_main]

use bytes::BytesMut;
use hixl_core::wire::{
    self, encode_ack, encode_data_req, encode_read_resp, encode_strided_req, FrameHeader, Message,
    HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

/// Re-encodes `m` and checks it against `frame` (the exact bytes it was decoded from, header
/// included) and against a second decode.
fn check_round_trip(m: &Message, frame: &[u8]) {
    let mut enc = BytesMut::new();
    m.encode(&mut enc);
    assert_eq!(
        &enc[..],
        frame,
        "re-encoding {m:?} does not give back the bytes it was decoded from"
    );
    let mut again = enc.clone();
    match Message::decode(&mut again) {
        Ok(Some(m2)) => assert_eq!(&m2, m, "decode(encode(m)) != m"),
        other => panic!("re-encoded {m:?} does not decode: {other:?}"),
    }
    assert!(
        again.is_empty(),
        "{} bytes left after re-decoding {m:?}",
        again.len()
    );

    // The data path's stack encoders must agree with the general encoder.
    match m {
        Message::WriteReq(r) => assert_eq!(&encode_data_req(true, r)[..], &enc[..]),
        Message::ReadReq(r) => assert_eq!(&encode_data_req(false, r)[..], &enc[..]),
        Message::WriteStridedReq(r) => assert_eq!(&encode_strided_req(true, r)[..], &enc[..]),
        Message::ReadStridedReq(r) => assert_eq!(&encode_strided_req(false, r)[..], &enc[..]),
        Message::ReadResp { id, status, len } => {
            assert_eq!(&encode_read_resp(*id, *status, *len)[..], &enc[..])
        }
        Message::Ack { id, status } => assert_eq!(&encode_ack(*id, *status)[..], &enc[..]),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    // 1. The header decoder on its own.
    if let Ok(h) = FrameHeader::decode(data) {
        assert!(data.len() >= HEADER_LEN);
        assert!((1..=wire::ty::LAST).contains(&h.ty), "header type {}", h.ty);
        assert!(
            h.body_len <= wire::MAX_BODY,
            "header body_len {}",
            h.body_len
        );
    }

    // 2. A stream reader's loop: take frames off the front until more bytes are needed or the
    //    stream is declared broken. Payloads after data frames are not skipped, so they are
    //    parsed as the next frame, which is exactly what a desynchronised peer would send.
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        match Message::decode(&mut buf) {
            Ok(Some(m)) => {
                let used = before.len() - buf.len();
                assert!(used >= HEADER_LEN, "decoded {m:?} from {used} bytes");
                assert_eq!(
                    &before[used..],
                    &buf[..],
                    "decode disturbed the bytes after the frame"
                );
                let h = FrameHeader::decode(&before[..HEADER_LEN])
                    .expect("a frame that decodes has a valid header");
                assert_eq!(used, HEADER_LEN + h.body_len as usize);
                check_round_trip(&m, &before[..used]);
            }
            Ok(None) => {
                assert_eq!(buf, before, "Ok(None) must not consume bytes");
                break;
            }
            Err(_) => break,
        }
    }

    // 3. The body decoders directly: first byte is the type, the rest the body. This skips the
    //    magic/version hurdle so the fuzzer spends its time in the body parsers.
    //    Bodies over `MAX_BODY` cannot be framed, so they are left to the stream path above.
    if let Some((&ty, body)) = data.split_first() {
        if body.len() > wire::MAX_BODY as usize {
            return;
        }
        if let Ok(m) = Message::decode_body(ty, body) {
            let mut frame = BytesMut::new();
            frame.extend_from_slice(&wire::MAGIC.to_le_bytes());
            frame.extend_from_slice(&[wire::VERSION, ty, 0, 0]);
            frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
            frame.extend_from_slice(body);
            check_round_trip(&m, &frame);
        }
    }
});
