//! Writes the seed corpus of the `frame_decode` target: one small valid frame of every message
//! type, encoded by hixl-core itself. Run from `fuzz/`: `cargo run --example gen_corpus`.

use std::path::Path;

use bytes::BytesMut;
use hixl_core::wire::{Channel, DataReq, Message};
use hixl_core::{Access, MemKind, RemoteRegion};

fn main() -> std::io::Result<()> {
    let req = DataReq {
        id: 1,
        rkey: 0x1234_5678_9abc_def0,
        addr: 0x7f00_0000_1000,
        len: 4096,
    };
    let region = |addr: u64, name: Option<&str>, kind: MemKind| RemoteRegion {
        addr,
        len: 1 << 20,
        rkey: addr ^ 0x5555,
        access: Access::REMOTE_RW,
        kind,
        name: name.map(str::to_owned),
    };
    let seeds: Vec<(&str, Vec<Message>)> = vec![
        (
            "hello_control",
            vec![Message::Hello {
                engine: "127.0.0.1:26000".into(),
                channel: Channel::Control,
                session: 0,
                features: hixl_core::wire::FEATURES,
            }],
        ),
        (
            "hello_data",
            vec![Message::Hello {
                engine: "[::1]:26001".into(),
                channel: Channel::Data,
                session: 0xfeed,
                features: hixl_core::wire::FEATURES,
            }],
        ),
        (
            "welcome",
            vec![Message::Welcome {
                engine: "10.0.0.2:26000".into(),
                session: 0xfeed,
                incarnation: 0x1ca7,
                features: hixl_core::wire::FEATURES,
            }],
        ),
        (
            "refuse",
            vec![Message::Refuse {
                status: 103900,
                reason: "already connected".into(),
            }],
        ),
        ("mem_table_empty", vec![Message::MemTable(vec![])]),
        (
            "mem_table_two",
            vec![Message::MemTable(vec![
                region(0x10_0000, Some("kv"), MemKind::Host),
                region(0x40_0000, None, MemKind::Device),
            ])],
        ),
        (
            "notify",
            vec![Message::Notify {
                seq: 3,
                name: b"cache_ready".to_vec(),
                msg: b"block_0".to_vec(),
            }],
        ),
        ("notify_ack", vec![Message::NotifyAck { seq: 3, status: 0 }]),
        ("heartbeat", vec![Message::Heartbeat { seq: 9 }]),
        (
            "disconnect",
            vec![Message::Disconnect {
                reason: "engine finalized".into(),
            }],
        ),
        ("write_req", vec![Message::WriteReq(req)]),
        ("read_req", vec![Message::ReadReq(req)]),
        (
            "read_resp",
            vec![Message::ReadResp {
                id: 1,
                status: 0,
                len: 4096,
            }],
        ),
        ("ack", vec![Message::Ack { id: 1, status: 0 }]),
        // A short conversation: several frames back to back, as a reader sees them.
        (
            "stream_control",
            vec![
                Message::Hello {
                    engine: "127.0.0.1".into(),
                    channel: Channel::Control,
                    session: 0,
                    features: hixl_core::wire::FEATURES,
                },
                Message::Heartbeat { seq: 1 },
                Message::NotifyAck { seq: 1, status: 0 },
                Message::Disconnect {
                    reason: "bye".into(),
                },
            ],
        ),
        (
            "stream_data",
            vec![
                Message::ReadReq(req),
                Message::Ack { id: 2, status: 0 },
                Message::ReadResp {
                    id: 3,
                    status: 103901,
                    len: 0,
                },
            ],
        ),
    ];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/frame_decode");
    std::fs::create_dir_all(&dir)?;
    for (name, msgs) in seeds {
        let mut b = BytesMut::new();
        for m in &msgs {
            m.encode(&mut b);
        }
        assert!(b.len() < 1024, "{name} is {} bytes", b.len());
        std::fs::write(dir.join(name), &b[..])?;
    }
    Ok(())
}
