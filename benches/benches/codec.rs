//! Criterion benches of the wire codec (`hixl_core::wire`): the data-request header sent for
//! every transfer part, and two control messages, a 64-region MemTable and a Notify.
//!
//! Decode benches feed the frame through the same path a reader does: `FrameHeader::decode`
//! and `Message::decode_body` on a borrowed slice (`decode_slice`), or `Message::decode` on a
//! reused `BytesMut` that is refilled with the frame each iteration (`decode_stream`, which
//! includes that copy).

use std::hint::black_box;
use std::time::Duration;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hixl_core::wire::{encode_data_req, DataReq, FrameHeader, Message, HEADER_LEN};
use hixl_core::{Access, MemKind, RemoteRegion};

/// Regions in the MemTable benches.
const REGIONS: u64 = 64;

fn encoded(m: &Message) -> BytesMut {
    let mut b = BytesMut::new();
    m.encode(&mut b);
    b
}

/// Benches encode and both decode paths of one message under `group`.
fn bench_message(c: &mut Criterion, group: &str, m: &Message) {
    let frame = encoded(m);
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Bytes(frame.len() as u64));
    g.bench_function("encode", |b| {
        let mut out = BytesMut::with_capacity(frame.len());
        b.iter(|| {
            out.clear();
            black_box(m).encode(&mut out);
            black_box(out.len())
        })
    });
    g.bench_function("decode_slice", |b| {
        b.iter(|| {
            let f = black_box(&frame[..]);
            let h = FrameHeader::decode(&f[..HEADER_LEN]).unwrap();
            Message::decode_body(h.ty, &f[HEADER_LEN..]).unwrap()
        })
    });
    g.bench_function("decode_stream", |b| {
        let mut buf = BytesMut::with_capacity(frame.len());
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(black_box(&frame[..]));
            Message::decode(&mut buf).unwrap().unwrap()
        })
    });
    g.finish();
    // The benches above only mean something if the frame round-trips.
    assert_eq!(
        Message::decode(&mut frame.clone()).unwrap().as_ref(),
        Some(m)
    );
}

fn data_req(c: &mut Criterion) {
    let r = DataReq {
        id: 0x1_0000_0042,
        rkey: 0x9e37_79b9_7f4a_7c15,
        addr: 0x7f12_3456_0000,
        len: 64 << 10,
    };
    let m = Message::WriteReq(r);
    c.bench_function("codec/data_req/encode_stack", |b| {
        b.iter(|| encode_data_req(true, black_box(&r)))
    });
    bench_message(c, "codec/data_req", &m);
}

fn mem_table(c: &mut Criterion) {
    let regions = (0..REGIONS)
        .map(|i| RemoteRegion {
            addr: 0x7f00_0000_0000 + (i << 24),
            len: 1 << 24,
            rkey: 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1),
            access: Access::REMOTE_RW,
            kind: if i % 2 == 0 {
                MemKind::Host
            } else {
                MemKind::Device
            },
            name: Some(format!("kv_cache_layer_{i}")),
        })
        .collect();
    bench_message(c, "codec/mem_table_64", &Message::MemTable(regions));
}

fn notify(c: &mut Criterion) {
    let m = Message::Notify {
        seq: 12345,
        name: b"cache_ready".to_vec(),
        msg: br#"{"request_id":"7f3a","blocks":[0,1,2,3,4,5,6,7]}"#.to_vec(),
    };
    bench_message(c, "codec/notify", &m);
}

criterion_group! {
    name = benches;
    // No HTML plots: drawing them takes longer than measuring. Numbers print to stdout.
    config = Criterion::default()
        .without_plots()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = data_req, mem_table, notify
}
criterion_main!(benches);
