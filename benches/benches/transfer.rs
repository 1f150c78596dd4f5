//! Criterion benches of whole transfers: two engines in one process over 127.0.0.1 on a tokio
//! multi-thread runtime with 2 workers, timing `Peer::write` / `Peer::read` from post to
//! completion.
//!
//! Shapes, each for WRITE and READ, with throughput in payload bytes per call:
//! - `4KiB`: one 4 KiB descriptor (batch 1), dominated by per-op latency;
//! - `64KiB`, `1MiB`: one descriptor of that size;
//! - `16x64KiB`: sixteen 64 KiB descriptors in one call.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hixl_async::{Engine, HostBuffer, Peer, Region};
use hixl_core::{Access, OpDesc, TransferOp};

/// Size of the registered buffer on each side: room for the largest shape.
const BUF: usize = 1 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The two engines, the initiator's registered buffer, the remote region's address and the
/// peer handle. The target's region is kept alive by the target engine.
struct Pair {
    target: Engine,
    init: Engine,
    _remote: Region,
    local: Region,
    remote_addr: u64,
    peer: Peer,
}

async fn pair() -> Pair {
    let target = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .build()
        .await
        .unwrap();
    let remote = target
        .register_with(
            HostBuffer::zeroed(BUF).unwrap(),
            Access::REMOTE_RW,
            Some("kv"),
        )
        .unwrap();
    let init = Engine::builder("127.0.0.1").build().await.unwrap();
    let local = init.register(HostBuffer::zeroed(BUF).unwrap()).unwrap();
    local.write_at(0, &vec![0xa5; BUF]).unwrap();
    let peer = init
        .connect(target.local_engine(), CONNECT_TIMEOUT)
        .await
        .unwrap();
    let remote_addr = peer.region("kv").unwrap().addr;
    Pair {
        target,
        init,
        _remote: remote,
        local,
        remote_addr,
        peer,
    }
}

/// `count` descriptors of `len` bytes each, laid end to end from offset 0 on both sides.
fn descs(p: &Pair, count: usize, len: usize) -> Vec<OpDesc> {
    (0..count)
        .map(|i| {
            let off = (i * len) as u64;
            OpDesc::new(p.local.addr() + off, p.remote_addr + off, len as u64)
        })
        .collect()
}

fn transfers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let p = rt.block_on(pair());
    let shapes: [(&str, usize, usize); 4] = [
        ("4KiB", 1, 4 << 10),
        ("64KiB", 1, 64 << 10),
        ("1MiB", 1, 1 << 20),
        ("16x64KiB", 16, 64 << 10),
    ];
    for (op, name) in [(TransferOp::Write, "write"), (TransferOp::Read, "read")] {
        let mut g = c.benchmark_group(format!("transfer/{name}"));
        for (shape, count, len) in shapes {
            let d = descs(&p, count, len);
            g.throughput(Throughput::Bytes((count * len) as u64));
            g.bench_with_input(BenchmarkId::from_parameter(shape), &d, |b, d| {
                let peer = &p.peer;
                b.to_async(&rt)
                    .iter(|| async move { peer.transfer(op, d).await.unwrap() })
            });
        }
        g.finish();
    }
    assert_eq!(p.init.ops_in_flight(), 0);
    rt.block_on(async {
        p.init.shutdown(Duration::from_secs(1)).await;
        p.target.shutdown(Duration::from_secs(1)).await;
    });
}

criterion_group! {
    name = benches;
    // No HTML plots: drawing them takes longer than measuring. Numbers print to stdout.
    config = Criterion::default()
        .without_plots()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = transfers
}
criterion_main!(benches);
