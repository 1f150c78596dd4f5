//! The TCP data path's three drivers give the same bytes: the submitting task (sends a free
//! connection's parts itself), the awaiting task (spins, sending and receiving on its own
//! thread) and the connections' tasks (which take over when the socket blocks or nobody
//! spins). `hixl.SpinUs` picks the mix: 0 leaves all waiting to the tasks, 50 (the default)
//! mixes them, a large value keeps the waiter spinning through whole transfers.

use std::time::Duration;

use hixl_async::{Engine, HostBuffer};
use hixl_core::{Access, OpDesc};

const T: Duration = Duration::from_secs(10);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(29)
                .wrapping_add(seed ^ (i >> 11) as u8)
        })
        .collect()
}

/// Checks that `e` moves its TCP bytes as `io` asks: an engine given `uring` where the kernel
/// refuses io_uring runs epoll (the test then says so, and fails with `HIXL_REQUIRE_URING`).
fn uses(e: &Engine, io: &str) {
    let (got, why) = e.tcp_io();
    if got.as_str() == io {
        return;
    }
    let why = why.unwrap_or("no reason given");
    assert!(
        std::env::var_os("HIXL_REQUIRE_URING").is_none(),
        "asked for hixl.TcpIo={io}, got {}: {why}",
        got.as_str()
    );
    eprintln!("asked for hixl.TcpIo={io}, runs {}: {why}", got.as_str());
}

/// A TCP initiator moving its bytes as `io` asks, spinning `spin` µs (`hixl.SpinUs`).
async fn tcp_initiator(io: &str, spin: &str) -> Engine {
    let init = Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .option("hixl.SpinUs", spin)
        .option("hixl.TcpIo", io)
        .build()
        .await
        .unwrap();
    uses(&init, io);
    init
}

/// A target engine (`hixl.SpinUs` = `spin`) with a zeroed region `kv` of `len` bytes.
async fn kv_target(len: usize, spin: &str) -> (Engine, hixl_async::Region) {
    let target = Engine::builder("127.0.0.1")
        .ephemeral_port()
        .option("hixl.SpinUs", spin)
        .build()
        .await
        .unwrap();
    let remote = target
        .register_with(
            HostBuffer::zeroed(len).unwrap(),
            Access::REMOTE_RW,
            Some("kv"),
        )
        .unwrap();
    (target, remote)
}

async fn mixed_ops_agree(spin: &str) {
    mixed_ops_agree_with(spin, "epoll").await;
}

async fn mixed_ops_agree_with(spin: &str, io: &str) {
    let len = 24 << 20;
    let (target, remote) = kv_target(len, spin).await;
    let init = Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .option("hixl.SpinUs", spin)
        .option("hixl.TcpIo", io)
        // Small chunks: one op becomes parts on every data connection.
        .option("hixl.TcpChunkBytes", "1M")
        .build()
        .await
        .unwrap();
    uses(&init, io);
    let local = init.register(HostBuffer::zeroed(len).unwrap()).unwrap();
    let peer = init.connect(target.local_engine(), T).await.unwrap();
    let rr = peer.region("kv").unwrap();
    // Sizes on both sides of the submitter's inline budget and of the chunk size, at
    // disjoint offsets: (offset, length).
    let sizes = [1usize, 4096, 65_536, 300 << 10, 1 << 20, 3 << 20, 8 << 20];
    let mut at = Vec::new();
    let mut off = 0usize;
    for s in sizes {
        at.push((off, s));
        off += s + 4096;
    }
    assert!(off <= len);
    for round in 0..3u8 {
        // Writes of fresh bytes, all in flight at once.
        let data = pattern(len, round);
        local.write_at(0, &data).unwrap();
        let writes: Vec<_> = at
            .iter()
            .map(|&(o, l)| {
                peer.write(&[OpDesc::new(
                    local.addr() + o as u64,
                    rr.addr + o as u64,
                    l as u64,
                )])
            })
            .collect();
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
        let mut got = vec![0u8; len];
        remote.read_at(0, &mut got).unwrap();
        for &(o, l) in &at {
            assert!(
                got[o..o + l] == data[o..o + l],
                "spin {spin}, round {round}: remote bytes differ at {o}+{l}"
            );
        }
        // Reads back into a cleared buffer, with a write to elsewhere in between.
        local.write_at(0, &vec![0u8; len]).unwrap();
        let reads: Vec<_> = at
            .iter()
            .map(|&(o, l)| {
                peer.read(&[OpDesc::new(
                    local.addr() + o as u64,
                    rr.addr + o as u64,
                    l as u64,
                )])
            })
            .collect();
        for r in futures::future::join_all(reads).await {
            r.unwrap();
        }
        local.read_at(0, &mut got).unwrap();
        for &(o, l) in &at {
            assert!(
                got[o..o + l] == data[o..o + l],
                "spin {spin}, round {round}: local bytes differ at {o}+{l} after read"
            );
        }
        // Reads and writes interleaved on one connection, all in flight at once: answers
        // must be matched in the order the requests went out. Reads fetch the first half
        // (which holds `data`), writes store the second half's fresh bytes.
        let half = (len / 2) as u64;
        let fresh = pattern(len / 2, round.wrapping_add(100));
        local.write_at(half, &fresh).unwrap();
        local.write_at(0, &vec![0u8; len / 2]).unwrap();
        // A large write first fills the socket, so the small ops queue behind it and go out
        // gathered, reads next to writes.
        let (big_off, big_len) = (4u64 << 20, 6u64 << 20);
        let big = peer.write(&[OpDesc::new(
            local.addr() + half + big_off,
            rr.addr + half + big_off,
            big_len,
        )]);
        let mixed: Vec<_> = (0..64u64)
            .map(|i| {
                let (o, l) = (i * 65_536, 4096 + (i % 3) * 20_000);
                if i % 2 == 0 {
                    peer.read(&[OpDesc::new(local.addr() + o, rr.addr + o, l)])
                } else {
                    peer.write(&[OpDesc::new(local.addr() + half + o, rr.addr + half + o, l)])
                }
            })
            .collect();
        for r in futures::future::join_all(mixed).await {
            r.unwrap();
        }
        big.await.unwrap();
        local.read_at(0, &mut got).unwrap();
        let mut theirs = vec![0u8; len];
        remote.read_at(0, &mut theirs).unwrap();
        let (bo, bl) = (big_off as usize, big_len as usize);
        assert!(
            theirs[len / 2 + bo..len / 2 + bo + bl] == fresh[bo..bo + bl],
            "spin {spin}, round {round}: the large write differs"
        );
        for i in 0..64usize {
            let (o, l) = (i * 65_536, 4096 + (i % 3) * 20_000);
            if i % 2 == 0 {
                assert!(
                    got[o..o + l] == theirs[o..o + l],
                    "spin {spin}, round {round}: mixed read {i} differs"
                );
            } else {
                let h = len / 2;
                assert!(
                    theirs[h + o..h + o + l] == fresh[o..o + l],
                    "spin {spin}, round {round}: mixed write {i} differs"
                );
            }
        }
        // One call with many small descriptors (headers coalesced), read then write.
        let descs: Vec<OpDesc> = (0..200u64)
            .map(|i| OpDesc::new(local.addr() + i * 8192, rr.addr + i * 8192, 512))
            .collect();
        peer.read(&descs).await.unwrap();
        peer.write(&descs).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_only() {
    mixed_ops_agree("0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_spin() {
    mixed_ops_agree("50").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_poll() {
    mixed_ops_agree("1000000").await;
}

#[tokio::test(flavor = "current_thread")]
async fn one_thread_default_spin() {
    mixed_ops_agree("50").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_tasks_only() {
    mixed_ops_agree_with("0", "uring").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_default_spin() {
    mixed_ops_agree_with("50", "uring").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uring_busy_poll() {
    mixed_ops_agree_with("1000000", "uring").await;
}

#[tokio::test(flavor = "current_thread")]
async fn uring_one_thread_default_spin() {
    mixed_ops_agree_with("50", "uring").await;
}

/// A target with a region `kv` of `data`'s length and an initiator (`hixl.TcpIo` = `io`)
/// whose region as long holds `data`, connected; the descriptors of 32 writes of a 32nd of
/// it each, each to its offset.
struct Big {
    target: Engine,
    remote: hixl_async::Region,
    init: Engine,
    _local: hixl_async::Region,
    peer: hixl_async::Peer,
    descs: Vec<OpDesc>,
}

const BLOCK: usize = 1 << 20;
const BLOCKS: usize = 32;

async fn big(io: &str, data: &[u8]) -> Big {
    let len = data.len();
    let block = len / BLOCKS;
    let (target, remote) = kv_target(len, "50").await;
    let init = tcp_initiator(io, "50").await;
    let mut src = HostBuffer::zeroed(len).unwrap();
    src.as_mut_slice().copy_from_slice(data);
    let local = init.register(src).unwrap();
    let peer = init.connect(target.local_engine(), T).await.unwrap();
    let rr = peer.region("kv").unwrap();
    let descs = (0..BLOCKS as u64)
        .map(|i| {
            let off = i * block as u64;
            OpDesc::new(local.addr() + off, rr.addr + off, block as u64)
        })
        .collect();
    Big {
        target,
        remote,
        init,
        _local: local,
        peer,
        descs,
    }
}

/// Batches of large writes spread over every data connection, with the waiter spinning and
/// then parking while sends still wait for room in the socket: whoever stops driving hands
/// the sends in flight to the connection's task (with io_uring, its driver reaps them).
async fn large_batches(io: &str) {
    batches(io, BLOCK, 20).await;
}

/// Many batches of 32 writes of `block` bytes, each round bounded, and the bytes checked.
async fn batches(io: &str, block: usize, rounds: usize) {
    let data = pattern(block * BLOCKS, 3);
    let b = big(io, &data).await;
    for round in 0..rounds {
        tokio::time::timeout(T, b.peer.write(&b.descs))
            .await
            .unwrap_or_else(|_| panic!("round {round}: a 32 x {block} B write over {io} hung"))
            .unwrap();
    }
    let mut got = vec![0u8; data.len()];
    b.remote.read_at(0, &mut got).unwrap();
    assert!(got == data, "bytes differ after the writes over {io}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_epoll() {
    large_batches("epoll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_uring() {
    large_batches("uring").await;
}

/// Batches of 64 KiB writes: their acks come back while later writes are still being sent,
/// and are received ahead of their parts (with the ack before them) when those are queued
/// for their answer only after the receive. The connection's reader must take them from
/// what it received ahead, as no readiness edge will announce them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn medium_batches_epoll() {
    batches("epoll", 64 << 10, 5000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn medium_batches_uring() {
    batches("uring", 64 << 10, 2000).await;
}

/// The target goes away while large writes are in flight (sends waiting for socket room in
/// the ring, with io_uring): every write resolves, none hangs, and the initiator shuts down
/// cleanly afterwards.
async fn target_gone_mid_write(io: &str) {
    let data = pattern(BLOCK * BLOCKS, 5);
    let b = big(io, &data).await;
    let writes: Vec<_> = (0..4)
        .map(|_| {
            let (peer, descs) = (b.peer.clone(), b.descs.clone());
            tokio::spawn(async move { peer.write(&descs).await })
        })
        .collect();
    // The target leaves once bytes of the writes have landed (observed, not slept for).
    let t0 = std::time::Instant::now();
    let mut first = [0u8; 1];
    loop {
        b.remote.read_at(0, &mut first).unwrap();
        if first[0] == data[0] {
            break;
        }
        assert!(t0.elapsed() < T, "no byte of the writes over {io} landed");
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    b.target.shutdown(Duration::from_millis(100)).await;
    let mut landed = 0;
    for w in writes {
        let r = tokio::time::timeout(T, w)
            .await
            .unwrap_or_else(|_| panic!("a write over {io} did not resolve after the target left"))
            .unwrap();
        // Landed before the target left, or failed because the link went: nothing else.
        match r {
            Ok(()) => landed += 1,
            Err(e) => assert!(
                e.is_link_lost() || matches!(e, hixl_core::Error::NotConnected { .. }),
                "a write over {io} failed with {e} when its target left"
            ),
        }
    }
    // A write that says it landed did: every byte of it is in the target's memory.
    if landed > 0 {
        let mut got = vec![0u8; data.len()];
        b.remote.read_at(0, &mut got).unwrap();
        assert!(
            got == data,
            "{landed} writes over {io} said they landed; the bytes differ"
        );
    }
    drop(b.target);
    assert_eq!(b.init.ops_in_flight(), 0);
    b.init.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_gone_mid_write_epoll() {
    target_gone_mid_write("epoll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_gone_mid_write_uring() {
    target_gone_mid_write("uring").await;
}

/// A data connection's tasks start with its first transfer. A link that dies before any
/// transfer (the target shut down, then the link seen dead; or the first transfers posted in
/// the same instant as the shutdown) still resolves every transfer, with the link's error
/// or landed, and leaves nothing in flight.
async fn first_transfer_on_a_dying_link(io: &str, wait_dead: bool) {
    let b = big(io, &pattern(BLOCK * BLOCKS, 7)).await;
    let gone = {
        let t = b.target.clone();
        tokio::spawn(async move { t.shutdown(Duration::from_millis(100)).await })
    };
    if wait_dead {
        let t0 = std::time::Instant::now();
        while b.peer.is_connected() {
            assert!(t0.elapsed() < T, "the link outlived its target");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let writes: Vec<_> = (0..4)
        .map(|i| {
            let (peer, descs) = (b.peer.clone(), b.descs.clone());
            // Small ops (one connection) and wide ones (every connection).
            let descs = if i % 2 == 0 {
                descs[..1].to_vec()
            } else {
                descs
            };
            tokio::spawn(async move { peer.write(&descs).await })
        })
        .collect();
    for w in writes {
        let r = tokio::time::timeout(T, w)
            .await
            .unwrap_or_else(|_| panic!("a first write over {io} did not resolve"))
            .unwrap();
        if wait_dead {
            assert!(r.is_err(), "a write on a dead link over {io} succeeded");
        }
    }
    gone.await.unwrap();
    assert_eq!(b.init.ops_in_flight(), 0);
    b.init.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_transfer_on_a_dead_link_epoll() {
    first_transfer_on_a_dying_link("epoll", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_transfer_on_a_dead_link_uring() {
    first_transfer_on_a_dying_link("uring", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_transfer_as_the_link_dies_epoll() {
    for _ in 0..5 {
        first_transfer_on_a_dying_link("epoll", false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_transfer_as_the_link_dies_uring() {
    for _ in 0..5 {
        first_transfer_on_a_dying_link("uring", false).await;
    }
}

/// Strided requests on the wire: pieces of sizes around the read-ahead stage (16 KiB) and the
/// gather bounds, many per request and several requests per descriptor (more than
/// `MAX_STRIDED_PIECES`, and past the chunk size), in flight together with plain ops over
/// every data connection; both sides' strides differ. Every piece and every gap is checked.
async fn strided_requests(io: &str, spin: &str) {
    let len = 32 << 20;
    let (target, remote) = kv_target(len, spin).await;
    let init = Engine::builder("127.0.0.1")
        .option("hixl.Transport", "tcp")
        .option("hixl.SpinUs", spin)
        .option("hixl.TcpIo", io)
        .option("hixl.TcpChunkBytes", "256K")
        .build()
        .await
        .unwrap();
    uses(&init, io);
    let local = init.register(HostBuffer::zeroed(len).unwrap()).unwrap();
    let peer = init.connect(target.local_engine(), T).await.unwrap();
    let rr = peer.region("kv").unwrap();
    // (piece, count, local stride, remote stride), each case at its own offsets.
    let cases: [(u64, u64, u64, u64); 5] = [
        (1, 3000, 3, 2),
        (40, 2500, 64, 256),
        (4096, 300, 4096, 8192),
        (20_000, 40, 20_480, 30_000),
        (100_000, 5, 100_000, 150_000),
    ];
    for (round, write) in [(0u8, true), (1, false), (2, true)] {
        let mut descs = Vec::new();
        let mut at = 0u64;
        let mut expect = Vec::new();
        for (k, &(piece, count, ls, rs)) in cases.iter().enumerate() {
            let (lbase, rbase) = (at, at + 3);
            let data = pattern((piece * count) as usize, round ^ k as u8);
            for i in 0..count {
                let src = &data[(i * piece) as usize..((i + 1) * piece) as usize];
                if write {
                    local.write_at(lbase + i * ls, src).unwrap();
                } else {
                    remote.write_at(rbase + i * rs, src).unwrap();
                }
            }
            descs.push(hixl_core::StridedDesc {
                local_addr: local.addr() + lbase,
                remote_addr: rr.addr + rbase,
                len: piece,
                local_stride: ls,
                remote_stride: rs,
                count,
            });
            expect.push((lbase, rbase, piece, count, ls, rs, data));
            at += (count * ls.max(rs)).next_multiple_of(4096) + 4096;
        }
        // A plain op in flight beside them.
        let plain = OpDesc::new(local.addr() + at, rr.addr + at, 3 << 20);
        let op = if write {
            hixl_core::TransferOp::Write
        } else {
            hixl_core::TransferOp::Read
        };
        let (a, b) = tokio::join!(
            peer.transfer_strided(op, &descs),
            peer.transfer(op, &[plain])
        );
        a.unwrap();
        b.unwrap();
        for (lbase, rbase, piece, count, ls, rs, data) in expect {
            let (side, base, stride) = if write {
                (&remote, rbase, rs)
            } else {
                (&local, lbase, ls)
            };
            let mut got = vec![0u8; (count * stride) as usize];
            side.read_at(base, &mut got).unwrap();
            for i in 0..count as usize {
                let at = i * stride as usize;
                let want = &data[i * piece as usize..(i + 1) * piece as usize];
                assert!(
                    &got[at..at + piece as usize] == want,
                    "{io} spin {spin} round {round}: piece {i} of {piece} bytes differs"
                );
                if i + 1 < count as usize {
                    // Nothing ever writes between pieces, on either side.
                    let gap = &got[at + piece as usize..at + stride as usize];
                    assert!(
                        gap.iter().all(|&x| x == 0),
                        "{io} round {round}: gap {i} written"
                    );
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_requests_epoll() {
    strided_requests("epoll", "50").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_requests_epoll_tasks_only() {
    strided_requests("epoll", "0").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_requests_uring() {
    strided_requests("uring", "50").await
}

/// Waits for `t` by asking its status only (as HIXL's `GetTransferStatus` pollers do), never
/// awaiting it.
async fn by_status(t: &hixl_async::Transfer, what: &str) {
    let start = std::time::Instant::now();
    loop {
        match t.status() {
            hixl_core::TransferStatus::Completed => return,
            hixl_core::TransferStatus::Waiting => {
                assert!(start.elapsed() < T, "{what}: still waiting after {T:?}");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            s => panic!("{what}: {s:?}"),
        }
    }
}

/// Transfers whose owners do not spin for them still complete, with spinning on: a submitter
/// that sends its op itself leaves the answer to its owner's spin, so an owner that only asks
/// the status (never awaits), and one whose spin ends before the answer comes, must hand it
/// over to the connection's reader.
async fn unspun_owners(io: &str) {
    let len = 16 << 20;
    let (target, remote) = kv_target(len, "50").await;
    // Spinning on, with a quiet period of 1 µs: a spin ends as soon as the socket blocks.
    let init = tcp_initiator(io, "1").await;
    let local = init.register(HostBuffer::zeroed(len).unwrap()).unwrap();
    let data = pattern(len, 7);
    local.write_at(0, &data).unwrap();
    let peer = init.connect(target.local_engine(), T).await.unwrap();
    let rr = peer.region("kv").unwrap();
    // Writes and reads of sizes the submitter sends whole, asked by status only.
    let mut off = 0u64;
    for l in [1u64, 4096, 65_536, 200 << 10] {
        let w = peer.write(&[OpDesc::new(local.addr() + off, rr.addr + off, l)]);
        by_status(&w, &format!("write of {l} B")).await;
        let mut got = vec![0u8; l as usize];
        remote.read_at(off, &mut got).unwrap();
        assert!(
            got == data[off as usize..(off + l) as usize],
            "write of {l} B"
        );
        // Read it back over the next bytes of the local region (the next write's source
        // starts past them).
        let back = off + l;
        let r = peer.read(&[OpDesc::new(local.addr() + back, rr.addr + off, l)]);
        by_status(&r, &format!("read of {l} B")).await;
        let mut mine = vec![0u8; l as usize];
        local.read_at(back, &mut mine).unwrap();
        assert!(mine == got, "read of {l} B");
        off = back + l;
    }
    // Polled once (its spin ends when the socket blocks, long before 8 MiB are
    // acknowledged), then awaited: the reader takes the answers over when the spin stops.
    // A run whose one poll finished the op (the target kept pace, the socket never blocked)
    // proves nothing and is retried.
    local.write_at(0, &data).unwrap();
    let big = 8u64 << 20;
    let mut left_pending = false;
    for _ in 0..20 {
        remote.write_at(big, &vec![0u8; big as usize]).unwrap();
        let mut w = peer.write(&[OpDesc::new(local.addr(), rr.addr + big, big)]);
        if futures::poll!(&mut w).is_ready() {
            continue;
        }
        left_pending = true;
        tokio::time::sleep(Duration::from_millis(50)).await;
        tokio::time::timeout(T, w).await.unwrap().unwrap();
        let mut got = vec![0u8; big as usize];
        remote.read_at(big, &mut got).unwrap();
        assert!(got == data[..big as usize], "8 MiB write");
        break;
    }
    assert!(left_pending, "every 8 MiB write finished in its first poll");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspun_owners_epoll() {
    unspun_owners("epoll").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspun_owners_uring() {
    unspun_owners("uring").await;
}
