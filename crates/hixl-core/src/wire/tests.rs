//! Tests of the wire as a whole: every message round-trips, and no byte sequence panics the
//! decoder.

use bytes::{BufMut, BytesMut};
use proptest::prelude::*;

use super::frame::put_header;
use super::*;
use crate::types::{Access, MemKind, RemoteRegion};

/// One message of every type (and of some types several), as encoded and decoded by the
/// tests of the wire modules.
pub(super) fn samples() -> Vec<Message> {
    vec![
        Message::Hello {
            engine: "127.0.0.1:9000".into(),
            channel: Channel::Control,
            session: 0,
            features: FEATURES,
        },
        Message::Hello {
            engine: "[::1]:1".into(),
            channel: Channel::Data,
            session: 77,
            features: u64::MAX,
        },
        Message::Welcome {
            engine: "10.0.0.1:2".into(),
            session: 5,
            incarnation: 0x1ca7,
            features: 0,
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
            devices: vec![7; 60],
        },
        Message::VerbsConnect {
            rail: 1,
            device: 0,
            endpoints: vec![1; 64],
        },
        Message::VerbsAccept {
            rail: 1,
            status: 0,
            endpoints: vec![2; 64],
            reason: String::new(),
        },
        Message::VerbsAccept {
            rail: 0,
            status: 8,
            endpoints: vec![],
            reason: "no queue pair".into(),
        },
        Message::VerbsKeys(vec![(9, 0, 0x1234), (u64::MAX, 1, u32::MAX)]),
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
fn the_samples_hold_every_type() {
    let mut seen: Vec<u8> = samples().iter().map(Message::ty).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (1..=ty::LAST).collect::<Vec<_>>());
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
    fn mutation_never_panics(idx in 0usize..64, pos in any::<usize>(), val in any::<u8>()) {
        let all = samples();
        let m = &all[idx % all.len()];
        let mut b = BytesMut::new();
        m.encode(&mut b);
        let p = pos % b.len();
        b[p] = val;
        let _ = Message::decode(&mut b);
    }
}

#[test]
fn another_protocols_first_bytes_are_named() {
    let said = |b: &[u8; 4]| WireError::BadMagic(u32::from_le_bytes(*b)).to_string();
    assert!(said(b"HTTP").contains("speaks HTTP"), "{}", said(b"HTTP"));
    assert!(said(b"GET ").contains("speaks HTTP"));
    assert!(said(b"SSH-").contains("speaks SSH"));
    assert!(said(&[0x16, 0x03, 0x01, 0x02]).contains("speaks TLS"));
    let other = said(&[1, 2, 3, 4]);
    assert!(
        other.starts_with("bad magic 0x04030201") && other.contains("not a hixl peer"),
        "{other}"
    );
}
