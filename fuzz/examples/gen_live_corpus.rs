//! Writes the seed corpus of the live-engine targets (`target_control`, `target_data`,
//! `initiator_handshake`, `auth_handshake`, `initiator_data`) in the input format of `hixl_fuzz::In`. Run from
//! `fuzz/`: `cargo run --example gen_live_corpus` (stable is fine).

use std::path::Path;

use hixl_core::wire::{Channel, Message, HEARTBEAT_FROM_TARGET};
use hixl_core::{Access, MemKind, RemoteRegion};
use hixl_fuzz::{Out, TAG_CUT, TAG_FDS, TAG_MSG, TAG_PAUSE, TAG_RAW};

fn raw(o: &mut Out, msgs: &[Message]) {
    o.u8(TAG_RAW).blob16(&Out::frames(msgs));
}

fn notify(seq: u64, name: &str) -> Message {
    Message::Notify {
        seq,
        name: name.as_bytes().to_vec(),
        msg: b"block_0".to_vec(),
    }
}

fn seeds_control() -> Vec<(&'static str, Vec<u8>)> {
    // First byte: bit 0 = fabric channel, bits 1-3 = hello choice (0 valid, 1 none, 2 named,
    // 3 data hello / wrong session, 4 fabric hello over TCP / other engine, 5 arbitrary frame),
    // bit 7 = wait for the session loop after the hello.
    const SYNC: u8 = 0x80;
    let mut v = Vec::new();
    let mut o = Out::default();
    o.u8(SYNC);
    raw(
        &mut o,
        &[
            notify(1, "cache_ready"),
            Message::Heartbeat { seq: 7 },
            Message::Heartbeat {
                seq: HEARTBEAT_FROM_TARGET | 1,
            },
            Message::Disconnect {
                reason: "bye".into(),
            },
        ],
    );
    v.push(("notify_heartbeat_disconnect", o.0));

    let mut o = Out::default();
    o.u8(SYNC);
    raw(
        &mut o,
        &[
            Message::VerbsConnect {
                endpoint: vec![1; 32],
            },
            notify(2, "after_verbs"),
        ],
    );
    o.u8(TAG_PAUSE);
    raw(&mut o, &[Message::MemTable(vec![])]);
    v.push(("verbs_connect_then_unexpected", o.0));

    let mut o = Out::default();
    o.u8(SYNC);
    let frame = Out::frames(&[notify(3, "cut")]);
    o.u8(TAG_RAW).blob16(&frame[..frame.len() - 3]);
    v.push(("partial_notify", o.0));

    let mut o = Out::default();
    o.u8(1 << 1);
    o.u8(TAG_RAW).blob16(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    v.push(("no_hello_http", o.0));

    let mut o = Out::default();
    o.u8(2 << 1 | SYNC).blob8(b"10.0.0.1:26000");
    raw(&mut o, &[notify(4, "named")]);
    v.push(("named_peer_notify", o.0));

    let mut o = Out::default();
    o.u8(3 << 1).u64(0xfeed);
    v.push(("data_hello_unknown_session", o.0));

    let mut o = Out::default();
    o.u8(4 << 1);
    v.push(("fabric_hello_over_tcp", o.0));

    let mut o = Out::default();
    o.u8(5 << 1 | SYNC);
    o.blob8(&[0, 0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    v.push(("arbitrary_first_frame", o.0));

    let mut o = Out::default();
    o.u8(SYNC);
    o.u8(TAG_MSG)
        .blob8(&[5, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 2, 0, 97, 98]);
    o.u8(TAG_CUT).blob8(&[4, 0, 0, 0, 1, 2, 3]).u16(20);
    v.push(("arbitrary_frames", o.0));

    let mut o = Out::default();
    o.u8(1);
    raw(
        &mut o,
        &[
            notify(1, "fabric"),
            Message::RevokeAck { rkey: 5 },
            notify(2, "fabric2"),
        ],
    );
    v.push(("fabric_notify_revoke_ack", o.0));

    let mut o = Out::default();
    o.u8(1 | 3 << 1).u64(0x1234);
    v.push(("fabric_wrong_session", o.0));

    let mut o = Out::default();
    o.u8(1);
    o.u8(TAG_PAUSE);
    o.u8(TAG_FDS).u8(2);
    raw(&mut o, &[notify(9, "with_fds")]);
    v.push(("fabric_notify_with_fds", o.0));

    let mut o = Out::default();
    o.u8(1 | 4 << 1);
    v.push(("fabric_other_engine", o.0));
    v
}

/// target_data's op encoding.
struct DataOps(Out);

impl DataOps {
    fn new(hello: u8) -> DataOps {
        let mut o = Out::default();
        o.u8(hello);
        DataOps(o)
    }
    /// Target kinds: 0 in w (off), 1 near w's start (signed), 2 near w's end (signed),
    /// 3 in r, 4 in l, 5 in d (stale), 6 raw (rkey, addr), 7 wrong rkey.
    fn target(&mut self, kind: u8, off: i16) -> &mut Self {
        self.0.u8(kind).u16(off as u16);
        self
    }
    /// Len kinds: 0 u8, 1 u16, 2 to w's end, 3 raw u64, 4 to w's end + 1.
    fn len16(&mut self, n: u16) -> &mut Self {
        self.0.u8(1).u16(n);
        self
    }
    /// Payload modes: 0 whole, 1 short (then a u16 length), 2 none; then a pattern seed.
    fn write(&mut self, id: u16, kind: u8, off: i16, len: u16, payload: u8) -> &mut Self {
        self.0.u8(0).u16(id);
        self.target(kind, off);
        self.len16(len);
        self.0.u8(payload);
        if payload == 1 {
            self.0.u16(10);
        }
        self.0.u8(0x31);
        self
    }
    fn read(&mut self, id: u16, kind: u8, off: i16, len: u16) -> &mut Self {
        self.0.u8(1).u16(id);
        self.target(kind, off);
        self.len16(len)
    }
}

fn seeds_data() -> Vec<(&'static str, Vec<u8>)> {
    let mut v = Vec::new();
    let mut d = DataOps::new(0);
    d.write(1, 0, 100, 64, 0).read(2, 0, 100, 64);
    v.push(("write_read", d.0 .0));

    let mut d = DataOps::new(0);
    d.write(1, 1, -1, 2, 0)
        .write(2, 2, -1, 2, 0)
        .write(3, 2, -1, 1, 0)
        .read(4, 1, -1, 2)
        .read(5, 2, -2, 2);
    // To the end exactly, and one past it.
    d.0.u8(1).u16(6).u8(0).u16(40000).u8(2);
    d.0.u8(1).u16(7).u8(0).u16(40000).u8(4);
    v.push(("edges", d.0 .0));

    let mut d = DataOps::new(0);
    d.write(1, 3, 0, 16, 0)
        .read(2, 3, 0, 16)
        .write(3, 4, 0, 16, 0)
        .read(4, 4, 0, 16)
        .write(5, 5, 0, 16, 0)
        .read(6, 5, 0, 16)
        .write(7, 7, 0, 16, 0);
    v.push(("readonly_local_stale_wrongkey", d.0 .0));

    let mut d = DataOps::new(0);
    d.write(1, 0, 0, 1000, 1);
    v.push(("short_payload", d.0 .0));

    let mut d = DataOps::new(0);
    d.0.u8(2).u8(100).u8(9);
    d.read(1, 0, 0, 8);
    v.push(("many_acks", d.0 .0));

    let mut d = DataOps::new(0);
    d.write(1, 0, 8, 8, 0);
    d.0.u8(3 + TAG_RAW).blob16(&[0x55; 44]);
    d.read(2, 0, 8, 8);
    v.push(("garbage_mid_stream", d.0 .0));

    let mut d = DataOps::new(0);
    d.write(1, 0, 8, 8, 0);
    d.0.u8(3 + TAG_RAW)
        .blob16(&Out::frames(&[Message::Heartbeat { seq: 1 }]));
    v.push(("control_frame_on_data", d.0 .0));

    let mut d = DataOps::new(1);
    d.0.u64(5);
    d.write(1, 0, 0, 4, 0);
    v.push(("wrong_session", d.0 .0));

    let mut d = DataOps::new(2);
    d.read(1, 0, 0, 4);
    v.push(("wrong_engine", d.0 .0));

    let mut d = DataOps::new(3);
    d.write(1, 0, 0, 4, 0).read(2, 0, 0, 4);
    v.push(("hello_with_requests", d.0 .0));

    let mut d = DataOps::new(0);
    // A refused write announcing 1 TiB (drained until EOF), after a raw-addressed read.
    d.0.u8(1).u16(1).u8(6).u64(1).u64(0x1000).u8(3).u64(4096);
    d.0.u8(0)
        .u16(2)
        .u8(6)
        .u64(1)
        .u64(0x1000)
        .u8(3)
        .u64(1 << 40)
        .u8(2);
    v.push(("huge_refused_write", d.0 .0));

    let mut d = DataOps::new(0);
    d.0.u8(0).u16(1).u8(0).u16(0).u8(0).u8(0).u8(2);
    v.push(("zero_length", d.0 .0));
    v
}

fn region(o: &mut Out, page: u16, len: u16, rkey: u64, name: Option<&[u8]>) {
    o.u8(0).u16(page).u8(0).u16(len).u64(rkey).u8(3).u8(0);
    match name {
        Some(n) => {
            o.u8(1).blob8(n);
        }
        None => {
            o.u8(0);
        }
    }
}

fn seeds_initiator() -> Vec<(&'static str, Vec<u8>)> {
    // Control tags after the generic ones: 6 Welcome, 7 MemTable, 8 same-host FabricInfo,
    // 9 AuthChallenge, 10 proof, 11 Refuse.
    const WELCOME: u8 = 6;
    const TABLE: u8 = 7;
    const FABRIC_INFO: u8 = 8;
    const CHALLENGE: u8 = 9;
    const PROOF: u8 = 10;
    const REFUSE: u8 = 11;
    // Fabric tags after the generic ones: 6 FabricTable, 7 Revoke, 8 NotifyAck.
    const FTABLE: u8 = 6;
    const REVOKE: u8 = 7;
    fn input(engine: u8, control: &Out, data: &Out, fabric: &Out) -> Vec<u8> {
        let mut o = Out::default();
        o.u8(engine).blob16(&control.0).blob16(&data.0);
        o.0.extend_from_slice(&fabric.0);
        o.0
    }
    fn welcome_table(c: &mut Out) {
        c.u8(WELCOME).u64(0x5e55);
        c.u8(TABLE).u8(2);
        region(c, 0x20, 4096, 11, Some(b"kv"));
        region(c, 0x10, 100, 12, None);
    }
    let none = Out::default();
    let mut v = Vec::new();

    let mut c = Out::default();
    welcome_table(&mut c);
    let after = Out::frames(&[
        Message::Heartbeat {
            seq: HEARTBEAT_FROM_TARGET | 1,
        },
        Message::MemTable(vec![RemoteRegion {
            addr: 0x40_0000,
            len: 64,
            rkey: 13,
            access: Access::REMOTE_READ,
            kind: MemKind::Host,
            name: Some("late".into()),
        }]),
        Message::Disconnect {
            reason: "bye".into(),
        },
    ]);
    c.u8(TAG_RAW).blob16(&after);
    v.push(("tcp_ok_then_updates", input(0, &c, &none, &none)));

    let mut c = Out::default();
    c.u8(WELCOME).u64(7).u8(FABRIC_INFO).u8(0).u8(TABLE).u8(1);
    region(&mut c, 0x20, 4096, 21, Some(b"pool"));
    let mut f = Out::default();
    // One region: the table's (pick 0), a memfd of its size, sealed.
    f.u8(FTABLE).u8(1).u8(0).u8(0).u8(2).u8(0).u8(1);
    f.u8(REVOKE).u8(0);
    v.push(("auto_fabric_memfd_revoke", input(1, &c, &none, &f)));

    let mut f = Out::default();
    f.u8(FTABLE).u8(1).u8(0).u8(0).u8(2).u8(0).u8(0);
    v.push(("auto_fabric_unsealed_memfd", input(1, &c, &none, &f)));

    let mut f = Out::default();
    f.u8(FTABLE).u8(1).u8(0).u8(0).u8(2).u8(1).u8(1);
    v.push(("auto_fabric_short_memfd", input(1, &c, &none, &f)));

    let mut f = Out::default();
    f.u8(FTABLE)
        .u8(2)
        .u8(0)
        .u8(0)
        .u8(0)
        .u8(0)
        .u8(0)
        .u8(1)
        .u32(7);
    v.push(("auto_fabric_cma_and_bad_index", input(1, &c, &none, &f)));

    let mut c = Out::default();
    c.u8(WELCOME).u64(7).u8(FABRIC_INFO).u8(1).u8(TABLE).u8(1);
    region(&mut c, 0x20, 4096, 21, None);
    v.push(("auto_fabric_socket_missing", input(1, &c, &none, &none)));

    let mut c = Out::default();
    c.u8(CHALLENGE).u8(1).u8(PROOF).u8(0);
    welcome_table(&mut c);
    v.push(("auth_valid_proof", input(2, &c, &none, &none)));

    let mut c = Out::default();
    c.u8(CHALLENGE).u8(1).u8(PROOF).u8(1);
    welcome_table(&mut c);
    v.push(("auth_reflected_proof", input(2, &c, &none, &none)));

    let mut c = Out::default();
    welcome_table(&mut c);
    v.push(("auth_target_without_secret", input(2, &c, &none, &none)));

    let mut c = Out::default();
    c.u8(CHALLENGE).u8(1);
    welcome_table(&mut c);
    v.push(("challenge_without_secret", input(0, &c, &none, &none)));

    let mut c = Out::default();
    c.u8(REFUSE).u32(103_902).blob8(b"no");
    v.push(("refused", input(0, &c, &none, &none)));

    let mut c = Out::default();
    welcome_table(&mut c);
    let mut d = Out::default();
    d.u8(0).u8(1).blob8(&Out::frames(&[Message::Refuse {
        status: 103_902,
        reason: "no session".into(),
    }]));
    v.push(("data_refused", input(0, &c, &d, &none)));

    let mut d = Out::default();
    d.u8(3).blob8(b"x");
    v.push(("data_welcome_trailing", input(0, &c, &d, &none)));

    let mut d = Out::default();
    d.u8(0).u8(0).u8(4);
    v.push(("data_closed", input(0, &c, &d, &none)));

    let mut c = Out::default();
    c.u8(TAG_RAW).blob16(&Out::frames(&[
        Message::Welcome {
            engine: "10.0.0.1:1".into(),
            session: 3,
            incarnation: 0x1ca7,
            features: hixl_core::wire::FEATURES,
        },
        Message::VerbsInfo {
            device: "rxe0".into(),
        },
        Message::MemTable(vec![]),
    ]));
    v.push(("verbs_info_empty_table", input(0, &c, &none, &none)));

    let mut c = Out::default();
    c.u8(TAG_MSG)
        .blob8(&[1, 0, 0, 0, 3, b'a', b'b', b'c', 1, 2, 3, 4, 5, 6, 7, 8]);
    v.push(("arbitrary_frame", input(1, &c, &none, &none)));
    v
}

fn seeds_auth() -> Vec<(&'static str, Vec<u8>)> {
    // First byte: bit 0 = wait for the session loop after an accepted response. Tags after the
    // generic ones: 6 AuthResponse (kind, seed), 7 Notify (seq, name).
    const RESP: u8 = 6;
    const NOTIFY: u8 = 7;
    let kinds = [
        "valid",
        "target_label",
        "short_nonce",
        "swapped_nonces",
        "empty_mac",
        "short_mac",
        "other_secret",
        "flipped_bit",
    ];
    let mut v = Vec::new();
    for (k, name) in kinds.iter().enumerate() {
        let mut o = Out::default();
        o.u8(1).u8(RESP).u8(k as u8).u8(9);
        o.u8(NOTIFY).u8(1).blob8(b"after_auth");
        v.push((*name, o.0));
    }
    let mut o = Out::default();
    o.u8(1).u8(NOTIFY).u8(1).blob8(b"before_auth");
    o.u8(RESP).u8(0).u8(9);
    v.push(("notify_before_response", o.0));
    let mut o = Out::default();
    o.u8(1);
    raw(
        &mut o,
        &[Message::Hello {
            engine: "127.0.0.1:5".into(),
            channel: Channel::Control,
            session: 2,
            features: hixl_core::wire::FEATURES,
        }],
    );
    v.push(("hello_again", o.0));
    let mut o = Out::default();
    o.u8(0)
        .u8(TAG_RAW)
        .blob16(b"HIXL\x01\x16\x00\x00\xff\xff\xff\x00");
    v.push(("oversized_response_header", o.0));
    v
}

fn seeds_initiator_data() -> Vec<(&'static str, Vec<u8>)> {
    // First byte: how many transfers (each: kind byte, even = write; local offset, remote
    // offset, length - 1 as u16), then the fake's script: 0 answer, 1 refuse (status),
    // 2 wrong id (xor), 3 wrong length (u16), 4 refused read with a payload (status, u8 len),
    // 5 the other kind of answer, 6 raw bytes, 7 arbitrary frame, 8 pause, 9 close.
    fn ops(o: &mut Out, list: &[(bool, u16, u16, u16)]) {
        o.u8(list.len() as u8);
        for &(write, local, remote, len) in list {
            o.u8(if write { 0 } else { 1 })
                .u16(local)
                .u16(remote)
                .u16(len - 1);
        }
    }
    let mut v = Vec::new();
    let wr = [(true, 0, 0, 100), (false, 200, 0, 100)];
    let mut o = Out::default();
    ops(&mut o, &wr);
    o.u8(0).u8(0);
    v.push(("write_read_answered", o.0));

    let mut o = Out::default();
    ops(&mut o, &[(false, 0, 0, 10000)]);
    o.u8(0).u8(8).u8(0).u8(0);
    v.push(("three_parts", o.0));

    let mut o = Out::default();
    ops(&mut o, &wr);
    o.u8(1).u32(103_900).u8(1).u32(103_900);
    v.push(("refused", o.0));

    let mut o = Out::default();
    ops(&mut o, &[(false, 0, 0, 64)]);
    o.u8(2).u64(1);
    v.push(("wrong_id", o.0));

    let mut o = Out::default();
    ops(&mut o, &[(false, 0, 0, 64)]);
    o.u8(3).u16(5);
    v.push(("wrong_len", o.0));

    // (A refused read that announces a payload, script step 4, is the reproducer in
    // artifacts-found/initiator_data-refused-read-with-payload: not a seed while it hangs.)

    let mut o = Out::default();
    ops(&mut o, &wr);
    o.u8(5).u8(5);
    v.push(("wrong_kind", o.0));

    let mut o = Out::default();
    ops(&mut o, &[(false, 0, 0, 10000)]);
    o.u8(0).u8(9);
    v.push(("close_mid_transfer", o.0));

    let mut o = Out::default();
    ops(&mut o, &[(true, 0, 0, 8)]);
    o.u8(6).blob8(&hixl_core::wire::encode_ack(999, 0));
    o.u8(0);
    v.push(("unsolicited_ack", o.0));

    let mut o = Out::default();
    ops(&mut o, &[(false, 0, 0, 8)]);
    o.u8(6).blob8(b"HIXL\x01\x0b\x00\x00\x14\x00\x00\x00");
    v.push(("raw_partial_answer", o.0));
    v
}

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, seeds) in [
        ("target_control", seeds_control()),
        ("target_data", seeds_data()),
        ("initiator_handshake", seeds_initiator()),
        ("auth_handshake", seeds_auth()),
        ("initiator_data", seeds_initiator_data()),
    ] {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds {
            assert!(
                bytes.len() < 1024,
                "{target}/{name} is {} bytes",
                bytes.len()
            );
            std::fs::write(dir.join(name), bytes)?;
        }
    }
    Ok(())
}
