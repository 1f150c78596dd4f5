//! Timeouts and cancellation under load, over tcp and over the fabric (pool memory mapped by
//! the peer, and plain host memory reached by cross-memory attach).
//!
//! Several tasks post mixed READ/WRITE transfers (one byte to several MiB, one to eight
//! descriptors, 64 KiB parts) between two engines in this process and then await them, drop
//! them at once, drop them after a few polls or a short sleep, or give them a tiny deadline.
//! Every op owns its memory exclusively: the target's region and the initiator's region are
//! cut into page runs, each descriptor gets one run on each side, and the rest of both regions
//! holds a guard pattern. A run of an op that completed is reused; a run of an op that did not
//! is quarantined for the round, since bytes of its abandoned parts may still land there.
//! At the end of a round the checks are:
//! - the initiator's region can be deregistered while abandoned ops are still in flight (it
//!   waits for their leases, within a bound) and nothing lands in it afterwards;
//! - `ops_in_flight()` returns to 0 by itself (no disconnect);
//! - every byte outside quarantined runs holds exactly what the model says (guard, source
//!   data, or what a completed op moved), on both engines;
//! - every byte of a quarantined destination holds its old value or the op's new one;
//! - the target's region deregisters within a bound; the buffers come back and are registered
//!   again for the next round; RSS and open fds do not grow across rounds.
//!
//! The other tests pin down single behaviours: a deadline against a peer that never answers
//! (and deregistration waiting for the timed-out op until the link goes), a deadline on an op
//! queued behind a long one on each transport, and a dropped op queued behind a long one,
//! which must move nothing (ignored on the fabric, where it does: see the tests).
//!
//! `HIXL_CANCEL_SEED` replays a run's decisions (timing still varies), `HIXL_CANCEL_ROUNDS`
//! runs more rounds per transport. The seed is printed at the start of each test.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::FutureExt;
use hixl_async::{Engine, HostBuffer, Peer, Region};
use hixl_core::{Access, Error, OpDesc, RemoteRegion, Status, TransferOp, TransferStatus};

/// Each region's size, on both engines.
const LEN: usize = 32 << 20;
const PAGE: usize = 4096;
/// Concurrent tasks posting ops.
const TASKS: usize = 4;
/// Ops per task per round.
const OPS_PER_TASK: usize = 20;
/// Default rounds per transport (`HIXL_CANCEL_ROUNDS` overrides).
const ROUNDS: usize = 3;
/// Bound on an awaited transfer: past it the test reports a hang instead of waiting forever.
const HANG: Duration = Duration::from_secs(30);
/// Bound on deregistration (it waits for leases: a leaked one hangs it).
const DEREG: Duration = Duration::from_secs(10);
/// How long abandoned ops may take to drain once nothing new is posted.
const GRACE: Duration = Duration::from_secs(5);
/// How late a timed-out transfer may report, on a loaded two-core machine.
const LATE: Duration = Duration::from_secs(1);
const T: Duration = Duration::from_secs(5);
/// How much RSS may grow past its level after the first round (it moves by under 1 MiB over
/// ten rounds; a leaked region would be 32 MiB a round).
const RSS_SLACK_KIB: u64 = 8 << 10;

// ---------------------------------------------------------------------------------------------
// Seeds and randomness.

/// xorshift64*, seeded through splitmix64.
#[derive(Debug, Clone)]
struct Rng(u64);

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(splitmix(seed) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn env_u64(key: &str) -> Option<u64> {
    let v = std::env::var(key).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// The run's seed: `HIXL_CANCEL_SEED`, else the clock.
fn seed(test: &str) -> u64 {
    let s = env_u64("HIXL_CANCEL_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        splitmix(t ^ u64::from(std::process::id()))
    });
    eprintln!("{test}: seed {s:#x} (replay with HIXL_CANCEL_SEED={s:#x})");
    s
}

fn rounds() -> usize {
    env_u64("HIXL_CANCEL_ROUNDS").map_or(ROUNDS, |r| r.max(1) as usize)
}

/// Fills `buf` with bytes drawn from `seed`.
fn fill(buf: &mut [u8], seed: u64) {
    let mut r = Rng::new(seed);
    let mut words = buf.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&r.next().to_le_bytes());
    }
    let last = r.next().to_le_bytes();
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}

/// The tests of this file measure process-wide RSS and fds: they run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Large blocks straight from mmap, always: glibc otherwise raises its mmap threshold after
/// the first large free and serves later MiB-sized buffers from per-thread heaps, whose free
/// space lingers in RSS and blurs the leak check.
fn steady_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only tunes glibc's allocator; any threshold value is valid.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10) };
    }
}

/// Resident set size, after glibc hands its free lists back to the OS (so that it measures
/// live memory rather than the allocator's caches).
fn rss_kib() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases memory that is free in glibc's own heaps.
        unsafe { libc::malloc_trim(0) };
    }
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

async fn wait_idle(e: &Engine, within: Duration) -> bool {
    let end = Instant::now() + within;
    while e.ops_in_flight() > 0 {
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    true
}

// ---------------------------------------------------------------------------------------------
// The engines.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `hixl.Transport=tcp`.
    Tcp,
    /// `hixl.Transport=fabric`, the target's region from its fabric pool (mapped by the peer).
    FabricPool,
    /// `hixl.Transport=fabric`, the target's region plain host memory (cross-memory attach).
    FabricCma,
}

impl Mode {
    fn transport(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::FabricPool | Mode::FabricCma => "fabric",
        }
    }
}

/// Two engines of one transport, and the buffers they hand back between rounds.
struct Rig {
    mode: Mode,
    target: Engine,
    init: Engine,
    tbuf: Option<HostBuffer>,
    lbuf: Option<HostBuffer>,
}

impl Rig {
    async fn new(mode: Mode) -> Rig {
        Rig::with_streams(mode, 4).await
    }

    /// With `streams` TCP data connections per peer.
    async fn with_streams(mode: Mode, streams: usize) -> Rig {
        let target = Engine::builder("127.0.0.1")
            .option("hixl.Transport", mode.transport())
            .ephemeral_port()
            .build()
            .await
            .expect("target engine");
        let init = Engine::builder("127.0.0.1")
            .option("hixl.Transport", mode.transport())
            .option("hixl.TcpChunkBytes", "64K")
            .option("hixl.TcpStreams", streams.to_string())
            .build()
            .await
            .expect("initiator engine");
        Rig {
            mode,
            target,
            init,
            tbuf: None,
            lbuf: None,
        }
    }

    /// Registers the target's region (named `name`) and the initiator's, as long as and
    /// filled with `tguard` and `lguard` (reusing the buffers of the last round), and
    /// connects.
    async fn setup(
        &mut self,
        name: &str,
        tguard: &[u8],
        lguard: &[u8],
    ) -> (Region, Region, Peer, RemoteRegion) {
        let len = tguard.len();
        let remote = match self.mode {
            Mode::FabricPool => self
                .target
                .register_pooled(len as u64, Access::REMOTE_RW, Some(name))
                .expect("register pooled"),
            Mode::Tcp | Mode::FabricCma => {
                let b = match self.tbuf.take() {
                    Some(b) => b,
                    None => HostBuffer::zeroed(len).expect("buffer"),
                };
                self.target
                    .register_with(b, Access::REMOTE_RW, Some(name))
                    .expect("register target")
            }
        };
        remote.write_at(0, tguard).expect("fill target");
        let b = match self.lbuf.take() {
            Some(b) => b,
            None => HostBuffer::zeroed(lguard.len()).expect("buffer"),
        };
        let local = self.init.register(b).expect("register local");
        local.write_at(0, lguard).expect("fill local");
        let peer = self
            .init
            .connect(self.target.local_engine(), T)
            .await
            .expect("connect");
        let how = peer.transport().to_string();
        assert!(how.starts_with(self.mode.transport()), "{how}");
        match self.mode {
            Mode::FabricPool => assert!(how.contains("1 pool regions mapped"), "{how}"),
            Mode::FabricCma => {
                assert!(how.contains("1 reached by cross-memory attach"), "{how}")
            }
            Mode::Tcp => {}
        }
        let rr = peer
            .region(name)
            .expect("the target's region is in its table");
        assert_eq!(rr.addr, remote.addr());
        (remote, local, peer, rr)
    }
}

// ---------------------------------------------------------------------------------------------
// Memory ownership: page runs, the model of every byte, quarantine.

/// Free page runs of one region: start page → pages.
#[derive(Debug)]
struct Runs {
    free: BTreeMap<usize, usize>,
    pages: usize,
}

impl Runs {
    fn new(pages: usize) -> Runs {
        Runs {
            free: BTreeMap::from([(0, pages)]),
            pages,
        }
    }

    /// A free run of `n` pages: first fit from a random page on.
    fn alloc(&mut self, n: usize, rng: &mut Rng) -> Option<usize> {
        let pivot = rng.below(self.pages as u64) as usize;
        let (s, l) = self
            .free
            .range(pivot..)
            .chain(self.free.range(..pivot))
            .find(|(_, &l)| l >= n)
            .map(|(&s, &l)| (s, l))?;
        self.free.remove(&s);
        if l > n {
            self.free.insert(s + n, l - n);
        }
        Some(s)
    }

    fn release(&mut self, mut s: usize, mut n: usize) {
        if let Some((&ps, &pl)) = self.free.range(..s).next_back() {
            assert!(ps + pl <= s, "run {s}+{n} released twice");
            if ps + pl == s {
                self.free.remove(&ps);
                s = ps;
                n += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(s + n)) {
            self.free.remove(&(s + n));
            n += nl;
        }
        self.free.insert(s, n);
    }
}

/// One region: what every byte must hold, and its free runs.
#[derive(Debug)]
struct Side {
    model: Vec<u8>,
    runs: Runs,
}

/// A destination range of an op that did not complete: each byte holds its old value (which
/// the model keeps, since the range is not reused in the round) or the op's (drawn from
/// `seed`).
#[derive(Debug)]
struct Quarantined {
    op: u64,
    on_target: bool,
    off: usize,
    len: usize,
    seed: u64,
}

#[derive(Debug)]
struct Model {
    target: Side,
    local: Side,
    quarantine: Vec<Quarantined>,
}

impl Model {
    fn side(&mut self, on_target: bool) -> &mut Side {
        if on_target {
            &mut self.target
        } else {
            &mut self.local
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Offsets of the descriptor's ranges in the local and the target region.
    loff: usize,
    roff: usize,
    len: usize,
    /// The page runs holding them.
    lrun: (usize, usize),
    rrun: (usize, usize),
}

fn pages_for(bytes: usize) -> usize {
    bytes.div_ceil(PAGE)
}

/// A run for each side; the range starts 0–63 bytes into its run and is followed by at least
/// one guard byte, so a neighbour's stray byte cannot hide in another op's range.
fn alloc_piece(m: &mut Model, len: usize, rng: &mut Rng) -> Option<Piece> {
    let pad = |rng: &mut Rng| {
        if rng.chance(25) {
            0
        } else {
            rng.range(1, 63) as usize
        }
    };
    let (lpad, rpad) = (pad(rng), pad(rng));
    let (lp, rp) = (pages_for(lpad + len + 1), pages_for(rpad + len + 1));
    let l = m.local.runs.alloc(lp, rng)?;
    let Some(r) = m.target.runs.alloc(rp, rng) else {
        m.local.runs.release(l, lp);
        return None;
    };
    Some(Piece {
        loff: l * PAGE + lpad,
        roff: r * PAGE + rpad,
        len,
        lrun: (l, lp),
        rrun: (r, rp),
    })
}

fn release(m: &mut Model, p: &Piece) {
    m.local.runs.release(p.lrun.0, p.lrun.1);
    m.target.runs.release(p.rrun.0, p.rrun.1);
}

// ---------------------------------------------------------------------------------------------
// One op.

/// How an op is treated after it is posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum How {
    /// Awaited to completion.
    Await,
    /// Dropped right after creation.
    DropNow,
    /// Polled 0–7 times (yielding in between), then dropped if not ready.
    PollsThenDrop,
    /// Polled once with `now_or_never`, dropped if not ready.
    NowOrNever,
    /// Under `tokio::time::timeout` of a few µs–ms, dropped when that elapses.
    TokioTimeout,
    /// Not polled for a short sleep, then dropped.
    SleepThenDrop,
    /// `.timeout(d)` with d of 1 µs–5 ms.
    Deadline,
    /// Polled, left alone for a while, then awaited to completion.
    PauseThenAwait,
    /// One descriptor out of the peer's bounds: refused as a whole, nothing moves.
    Invalid,
}

impl How {
    fn pick(rng: &mut Rng) -> How {
        match rng.below(100) {
            0..=24 => How::Await,
            25..=39 => How::DropNow,
            40..=51 => How::PollsThenDrop,
            52..=56 => How::NowOrNever,
            57..=69 => How::TokioTimeout,
            70..=75 => How::SleepThenDrop,
            76..=88 => How::Deadline,
            89..=95 => How::PauseThenAwait,
            _ => How::Invalid,
        }
    }
}

/// What came of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fate {
    Completed,
    /// Dropped or timed out before it was seen to complete.
    Abandoned,
    Refused,
    NoSpace,
}

/// Counts of (how, fate) and of what landed in quarantined ranges.
#[derive(Debug, Default)]
struct Tally {
    ops: BTreeMap<(How, Fate), u64>,
    /// Quarantined destination ranges: untouched, fully written, partly written.
    untouched: u64,
    landed: u64,
    partial: u64,
    /// Abandoned ops still in flight when the round's last op had been posted.
    in_flight_at_end: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        for (k, v) in &other.ops {
            *self.ops.entry(*k).or_default() += v;
        }
        self.untouched += other.untouched;
        self.landed += other.landed;
        self.partial += other.partial;
        self.in_flight_at_end += other.in_flight_at_end;
    }

    fn report(&self, what: &str) -> String {
        let mut s = format!("{what}:");
        for ((h, f), n) in &self.ops {
            s.push_str(&format!(" {h:?}/{f:?}={n}"));
        }
        let total: u64 = self.ops.values().sum();
        s.push_str(&format!(
            "; {total} ops; quarantined ranges: {} untouched, {} fully landed, {} partly landed; {} ops in flight after the last post",
            self.untouched, self.landed, self.partial, self.in_flight_at_end
        ));
        s
    }
}

/// What every task of a round shares.
struct Cx {
    seed: u64,
    peer: Peer,
    remote: Region,
    local: Region,
    rr: RemoteRegion,
    model: Mutex<Model>,
    tally: Mutex<Tally>,
}

impl Cx {
    fn model(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, how: How, fate: Fate) {
        let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        *t.ops.entry((how, fate)).or_default() += 1;
    }

    /// The region a piece's source or destination is in (`true`: the target's).
    fn region(&self, on_target: bool) -> &Region {
        if on_target {
            &self.remote
        } else {
            &self.local
        }
    }
}

/// Per-task buffers, reused from op to op (so that allocations do not blur the RSS check).
#[derive(Debug, Default)]
struct Scratch {
    data: Vec<u8>,
    got: Vec<u8>,
}

impl Scratch {
    /// `len` bytes drawn from `seed`.
    fn draw(&mut self, len: usize, seed: u64) -> &[u8] {
        Scratch::draw_into(&mut self.data, len, seed)
    }

    fn draw_into(buf: &mut Vec<u8>, len: usize, seed: u64) -> &[u8] {
        buf.resize(len, 0);
        fill(&mut buf[..len], seed);
        &buf[..len]
    }
}

/// Bytes from 1 to 4 MiB, log-uniform, and now and then up to 6 MiB.
fn op_size(rng: &mut Rng) -> usize {
    if rng.chance(4) {
        return rng.range(4 << 20, 6 << 20) as usize;
    }
    let bits = rng.range(0, 22);
    rng.range(1, 1 << bits) as usize
}

/// `total` bytes in `n` non-empty pieces.
fn split(total: usize, n: usize, rng: &mut Rng) -> Vec<usize> {
    let n = n.clamp(1, total);
    let mut cuts: Vec<usize> = (0..n - 1)
        .map(|_| rng.range(1, total as u64 - 1) as usize)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for c in cuts {
        out.push(c - at);
        at = c;
    }
    out.push(total - at);
    out
}

/// Fails the test with the op's identity (the seed is printed at the start).
fn expect_ok(cx: &Cx, id: u64, r: hixl_core::Result<()>) {
    if let Err(e) = r {
        panic!(
            "op {id} (seed {:#x}) failed although nothing was injected: {e:?}",
            cx.seed
        );
    }
}

/// Posts one random op and treats it as `how` says (random when `None`; a given `how` also
/// makes the op large).
async fn one_op(cx: &Cx, rng: &mut Rng, scratch: &mut Scratch, id: u64, how: Option<How>) {
    let write = rng.chance(50);
    let op = if write {
        TransferOp::Write
    } else {
        TransferOp::Read
    };
    let total = match how {
        None => op_size(rng),
        Some(_) => rng.range(4 << 20, 6 << 20) as usize,
    };
    let n = if rng.chance(50) {
        1
    } else {
        rng.range(2, 8) as usize
    };
    let lens = split(total, n, rng);
    let how = how.unwrap_or_else(|| How::pick(rng));
    // Runs for every descriptor, or none.
    let pieces = {
        let mut m = cx.model();
        let mut got: Vec<Piece> = Vec::with_capacity(lens.len());
        for &len in &lens {
            match alloc_piece(&mut m, len, rng) {
                Some(p) => got.push(p),
                None => {
                    for p in &got {
                        release(&mut m, p);
                    }
                    drop(m);
                    cx.count(how, Fate::NoSpace);
                    return;
                }
            }
        }
        got
    };
    // Source data in place, and in the model. Each piece's bytes are drawn from a seed, so
    // they can be drawn again instead of being kept.
    let seeds: Vec<u64> = pieces.iter().map(|_| rng.next()).collect();
    // (source on the target?, source offset, destination offset)
    let ends = |p: &Piece| {
        if write {
            (false, p.loff, p.roff)
        } else {
            (true, p.roff, p.loff)
        }
    };
    for (p, &seed) in pieces.iter().zip(&seeds) {
        let (src_t, so, _) = ends(p);
        let d = scratch.draw(p.len, seed);
        cx.model().side(src_t).model[so..so + p.len].copy_from_slice(d);
        cx.region(src_t)
            .write_at(so as u64, d)
            .expect("write source");
    }
    let mut descs: Vec<OpDesc> = pieces
        .iter()
        .map(|p| {
            OpDesc::new(
                cx.local.addr() + p.loff as u64,
                cx.rr.addr + p.roff as u64,
                p.len as u64,
            )
        })
        .collect();

    let fate = if how == How::Invalid {
        let at = rng.below(descs.len() as u64 + 1) as usize;
        let bad = OpDesc::new(cx.local.addr(), cx.rr.addr + cx.rr.len - 8, 16);
        descs.insert(at, bad);
        let mut t = cx.peer.transfer(op, &descs);
        assert_eq!(t.status(), TransferStatus::Failed);
        match (&mut t).now_or_never() {
            Some(Err(Error::RemoteOutOfBounds { .. })) => {}
            other => panic!("op {id}: a descriptor out of bounds gave {other:?}"),
        }
        Fate::Refused
    } else {
        let mut t = cx.peer.transfer(op, &descs);
        let st = t.status();
        if !matches!(st, TransferStatus::Waiting | TransferStatus::Completed) {
            let r = (&mut t).now_or_never();
            panic!(
                "op {id} (seed {:#x}, {op:?} of {lens:?} bytes, {descs:x?}, remote region {:#x}+{:#x}, local {:#x}+{:#x}): fresh transfer is {st:?}: {r:?}",
                cx.seed,
                cx.rr.addr,
                cx.rr.len,
                cx.local.addr(),
                cx.local.len()
            );
        }
        match how {
            How::Await => match tokio::time::timeout(HANG, &mut t).await {
                Ok(r) => {
                    expect_ok(cx, id, r);
                    assert_eq!(t.status(), TransferStatus::Completed);
                    Fate::Completed
                }
                Err(_) => panic!("op {id} (seed {:#x}) hung for {HANG:?}", cx.seed),
            },
            How::DropNow => {
                drop(t);
                Fate::Abandoned
            }
            How::PollsThenDrop => {
                let k = rng.below(8);
                let mut done = None;
                for _ in 0..k {
                    if let Poll::Ready(r) = futures::poll!(&mut t) {
                        done = Some(r);
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                match done {
                    Some(r) => {
                        expect_ok(cx, id, r);
                        Fate::Completed
                    }
                    None => {
                        drop(t);
                        Fate::Abandoned
                    }
                }
            }
            How::NowOrNever => match (&mut t).now_or_never() {
                Some(r) => {
                    expect_ok(cx, id, r);
                    Fate::Completed
                }
                None => {
                    drop(t);
                    Fate::Abandoned
                }
            },
            How::TokioTimeout => {
                let d = Duration::from_micros(rng.range(1, 3000));
                match tokio::time::timeout(d, &mut t).await {
                    Ok(r) => {
                        expect_ok(cx, id, r);
                        Fate::Completed
                    }
                    Err(_) => {
                        drop(t);
                        Fate::Abandoned
                    }
                }
            }
            How::SleepThenDrop => {
                tokio::time::sleep(Duration::from_micros(rng.range(1, 2000))).await;
                drop(t);
                Fate::Abandoned
            }
            How::Deadline => {
                let d = Duration::from_micros(rng.range(1, 5000));
                let started = Instant::now();
                let mut t = t.timeout(d);
                let r = tokio::time::timeout(HANG, &mut t)
                    .await
                    .unwrap_or_else(|_| panic!("op {id} with deadline {d:?} hung"));
                match r {
                    Ok(()) => {
                        assert_eq!(t.status(), TransferStatus::Completed);
                        Fate::Completed
                    }
                    Err(Error::Timeout { after, .. }) => {
                        let took = started.elapsed();
                        assert_eq!(after, d, "op {id}");
                        assert!(took >= d, "op {id}: timed out after {took:?} < {d:?}");
                        assert!(
                            took < d + LATE,
                            "op {id}: deadline {d:?} reported after {took:?}"
                        );
                        assert_eq!(t.status(), TransferStatus::TimedOut, "op {id}");
                        Fate::Abandoned
                    }
                    Err(e) => panic!("op {id} (seed {:#x}) with a deadline: {e:?}", cx.seed),
                }
            }
            How::PauseThenAwait => {
                let mut done = None;
                for _ in 0..rng.below(4) {
                    if let Poll::Ready(r) = futures::poll!(&mut t) {
                        done = Some(r);
                        break;
                    }
                }
                let d = Duration::from_micros(rng.range(1, 1000));
                let r = match done {
                    Some(r) => r,
                    None => match tokio::time::timeout(d, &mut t).await {
                        Ok(r) => r,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_micros(rng.range(1, 2000))).await;
                            tokio::time::timeout(HANG, &mut t)
                                .await
                                .unwrap_or_else(|_| panic!("op {id} hung"))
                        }
                    },
                };
                expect_ok(cx, id, r);
                Fate::Completed
            }
            How::Invalid => unreachable!(),
        }
    };
    cx.count(how, fate);

    match fate {
        Fate::Completed | Fate::Refused => {
            // The destination holds the data now (or, refused, what it held before).
            for (p, &seed) in pieces.iter().zip(&seeds) {
                let (src_t, _, dof) = ends(p);
                let Scratch { data, got } = &mut *scratch;
                got.resize(p.len, 0);
                cx.region(!src_t)
                    .read_at(dof as u64, got)
                    .expect("read destination");
                if fate == Fate::Completed {
                    Scratch::draw_into(data, p.len, seed);
                } else {
                    data.clear();
                    data.extend_from_slice(&cx.model().side(!src_t).model[dof..dof + p.len]);
                }
                let want = &data[..p.len];
                if got[..] != *want {
                    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                    panic!(
                        "op {id} (seed {:#x}, {op:?} {how:?} {fate:?}): destination {} offset {dof}+{i} of {} holds {:#04x}, expected {:#04x}",
                        cx.seed,
                        if src_t { "local" } else { "target" },
                        p.len,
                        got[i],
                        want[i]
                    );
                }
                let mut m = cx.model();
                if fate == Fate::Completed {
                    m.side(!src_t).model[dof..dof + p.len].copy_from_slice(want);
                }
                release(&mut m, p);
            }
        }
        Fate::Abandoned => {
            let mut m = cx.model();
            for (p, &seed) in pieces.iter().zip(&seeds) {
                let (src_t, _, dof) = ends(p);
                m.quarantine.push(Quarantined {
                    op: id,
                    on_target: !src_t,
                    off: dof,
                    len: p.len,
                    seed,
                });
            }
        }
        Fate::NoSpace => unreachable!(),
    }
}

/// Checks `mem` (one whole region) against the model: quarantined ranges byte by byte (old
/// or new value), everything else exactly.
fn verify(what: &str, seed: u64, mem: &[u8], m: &mut Model, on_target: bool, tally: &mut Tally) {
    let mut model = std::mem::take(&mut m.side(on_target).model);
    let mut new = Vec::new();
    for q in m.quarantine.iter().filter(|q| q.on_target == on_target) {
        let got = &mem[q.off..q.off + q.len];
        let before = &model[q.off..q.off + q.len];
        let new = Scratch::draw_into(&mut new, q.len, q.seed);
        // (A range whose old and new bytes coincide, e.g. a one-byte one, counts as landed.)
        if got == new {
            tally.landed += 1;
        } else if got == before {
            tally.untouched += 1;
        } else {
            tally.partial += 1;
            for (i, ((g, b), n)) in got.iter().zip(before).zip(new).enumerate() {
                assert!(
                    g == b || g == n,
                    "{what} (seed {seed:#x}): byte {} of abandoned op {}'s destination holds {g:#04x}, neither the old {b:#04x} nor the new {n:#04x}",
                    q.off + i,
                    q.op
                );
            }
        }
        model[q.off..q.off + q.len].copy_from_slice(got);
    }
    if mem != &model[..] {
        let bad: Vec<usize> = mem
            .iter()
            .zip(&model)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i)
            .collect();
        let i = bad[0];
        panic!(
            "{what} (seed {seed:#x}): {} bytes outside live ops changed; first at offset {i} (page {}): {:#04x}, expected {:#04x}; last at {}",
            bad.len(),
            i / PAGE,
            mem[i],
            model[i],
            bad[bad.len() - 1]
        );
    }
    m.side(on_target).model = model;
}

// ---------------------------------------------------------------------------------------------
// Rounds.

async fn round(rig: &mut Rig, seed: u64, r: usize, rng: &mut Rng) -> Tally {
    let name = format!("kv{r}");
    let mut tguard = vec![0u8; LEN];
    let mut lguard = vec![0u8; LEN];
    fill(&mut tguard, rng.next());
    fill(&mut lguard, rng.next());
    let (remote, local, peer, rr) = rig.setup(&name, &tguard, &lguard).await;
    let model = Model {
        target: Side {
            model: tguard,
            runs: Runs::new(LEN / PAGE),
        },
        local: Side {
            model: lguard,
            runs: Runs::new(LEN / PAGE),
        },
        quarantine: Vec::new(),
    };
    let cx = Arc::new(Cx {
        seed,
        peer: peer.clone(),
        remote: remote.clone(),
        local: local.clone(),
        rr,
        model: Mutex::new(model),
        tally: Mutex::new(Tally::default()),
    });
    let tasks: Vec<_> = (0..TASKS)
        .map(|k| {
            let cx = cx.clone();
            let mut rng = Rng::new(rng.next());
            tokio::spawn(async move {
                let mut scratch = Scratch::default();
                let first = ((r * TASKS + k) * OPS_PER_TASK) as u64;
                for i in 0..OPS_PER_TASK as u64 {
                    one_op(&cx, &mut rng, &mut scratch, first + i, None).await;
                }
            })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    // A last large op dropped at once, so that deregistration meets an abandoned op in
    // flight on every transport.
    let last = ((r + 1) * TASKS * OPS_PER_TASK + r) as u64;
    one_op(&cx, rng, &mut Scratch::default(), last, Some(How::DropNow)).await;
    let cx = Arc::try_unwrap(cx).unwrap_or_else(|_| panic!("tasks still hold the round"));
    let mut tally = cx.tally.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut m = cx.model.into_inner().unwrap_or_else(|p| p.into_inner());
    tally.in_flight_at_end = rig.init.ops_in_flight() as u64;

    let what = format!("{:?} round {r}", rig.mode);
    // One region is deregistered while abandoned ops may still be in flight: deregistration
    // waits for their leases (within a bound), and once it has returned nothing may land in
    // the buffer any more. The initiator's region first in even rounds, the target's in odd
    // ones (for pool memory, whose buffer goes back to the pool rather than to us, the
    // target's memory is checked before it is deregistered).
    let target_first = r % 2 == 1 && rig.mode != Mode::FabricPool;
    let mut tbuf = None;
    if target_first {
        let b = dereg_within(&rig.target, &remote, &what, seed)
            .await
            .expect("the target's buffer comes back");
        verify(
            &format!("{what}, target"),
            seed,
            b.as_slice(),
            &mut m,
            true,
            &mut tally,
        );
        tbuf = Some(b);
    }
    let lbuf = dereg_within(&rig.init, &local, &what, seed)
        .await
        .expect("the initiator's buffer comes back");
    verify(
        &format!("{what}, initiator"),
        seed,
        lbuf.as_slice(),
        &mut m,
        false,
        &mut tally,
    );
    assert!(
        wait_idle(&rig.init, GRACE).await,
        "{what} (seed {seed:#x}): {} ops still in flight {GRACE:?} after the last was posted",
        rig.init.ops_in_flight()
    );
    assert_eq!(rig.target.ops_in_flight(), 0);
    assert!(
        lbuf.as_slice() == &m.local.model[..],
        "{what} (seed {seed:#x}): the initiator's buffer changed after its deregistration returned"
    );
    match &tbuf {
        Some(b) => assert!(
            b.as_slice() == &m.target.model[..],
            "{what} (seed {seed:#x}): the target's buffer changed after its deregistration returned"
        ),
        None => {
            let mut tmem = vec![0u8; LEN];
            remote.read_at(0, &mut tmem).expect("read target");
            verify(
                &format!("{what}, target"),
                seed,
                &tmem,
                &mut m,
                true,
                &mut tally,
            );
            drop(tmem);
            tbuf = dereg_within(&rig.target, &remote, &what, seed).await;
        }
    }
    drop(m);
    match rig.mode {
        Mode::FabricPool => assert!(tbuf.is_none(), "pool memory goes back to the pool"),
        Mode::Tcp | Mode::FabricCma => {
            let b = tbuf.expect("the target's buffer comes back");
            assert_eq!(b.len(), LEN);
            rig.tbuf = Some(b);
        }
    }
    assert_eq!(lbuf.len(), LEN);
    rig.lbuf = Some(lbuf);
    rig.init.disconnect(peer.name()).await.expect("disconnect");
    tally
}

/// Deregisters `region`, failing the test past [`DEREG`] (a leaked lease hangs it).
async fn dereg_within(e: &Engine, region: &Region, what: &str, seed: u64) -> Option<HostBuffer> {
    tokio::time::timeout(DEREG, e.deregister(region))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{what} (seed {seed:#x}): deregistering {}'s region hung for {DEREG:?}: a lease leaked",
                e.local_engine()
            )
        })
        .expect("deregister")
}

/// Registers again after the last round and moves 1 MiB both ways.
async fn reregister_works(rig: &mut Rig, rng: &mut Rng) {
    let mut tguard = vec![0u8; 2 << 20];
    let mut lguard = vec![0u8; 2 << 20];
    fill(&mut tguard, rng.next());
    fill(&mut lguard, rng.next());
    rig.tbuf = None;
    rig.lbuf = None;
    let (remote, local, peer, rr) = rig.setup("again", &tguard, &lguard).await;
    let d = OpDesc::new(local.addr(), rr.addr, 1 << 20);
    peer.write(&[d]).timeout(T).await.expect("write");
    let mut got = vec![0u8; 1 << 20];
    remote.read_at(0, &mut got).expect("read");
    assert!(got[..] == lguard[..1 << 20]);
    let d = OpDesc::new(local.addr() + (1 << 20), rr.addr + (1 << 20), 1 << 20);
    peer.read(&[d]).timeout(T).await.expect("read");
    local.read_at(1 << 20, &mut got).expect("read");
    assert!(got[..] == tguard[1 << 20..]);
    rig.init.deregister(&local).await.expect("dereg");
    rig.target.deregister(&remote).await.expect("dereg");
    rig.init.disconnect(peer.name()).await.expect("disconnect");
}

fn randomized(mode: Mode) {
    let _serial = serial();
    let test = format!("randomized cancellation over {mode:?}");
    let seed = seed(&test);
    let rounds = rounds();
    let started = Instant::now();
    steady_malloc();
    runtime().block_on(async move {
        let mut rng = Rng::new(seed ^ splitmix(mode as u64));
        let mut rig = Rig::new(mode).await;
        let mut total = Tally::default();
        // RSS and open fds after each round may not grow past round 0's (RSS by a little
        // slack; a leaked region would be 32 MiB a round).
        let (mut rss0, mut fds0) = (0u64, 0usize);
        for r in 0..rounds {
            let t = round(&mut rig, seed, r, &mut rng).await;
            eprintln!("{}", t.report(&format!("{mode:?} round {r}")));
            total.add(&t);
            if r == 0 {
                // Sockets of the closed link go away asynchronously.
                tokio::time::sleep(Duration::from_millis(200)).await;
                (rss0, fds0) = (rss_kib(), open_fds());
            }
            let (rss, mut fds) = (rss_kib(), open_fds());
            let end = Instant::now() + Duration::from_secs(2);
            while fds > fds0 && Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(10)).await;
                fds = open_fds();
            }
            eprintln!("{mode:?} round {r}: RSS {rss} KiB, {fds} fds");
            assert!(
                fds <= fds0,
                "{mode:?} (seed {seed:#x}): {fds} fds open after round {r}, {fds0} after round 0"
            );
            assert!(
                rss <= rss0 + RSS_SLACK_KIB,
                "{mode:?} (seed {seed:#x}): RSS {rss} KiB after round {r}, {rss0} KiB after round 0"
            );
        }
        reregister_works(&mut rig, &mut rng).await;
        eprintln!("{}", total.report(&format!("{mode:?} total")));
    });
    eprintln!("{test}: {rounds} rounds in {:?}", started.elapsed());
}

#[test]
fn random_drops_and_deadlines_under_load_tcp() {
    randomized(Mode::Tcp);
}

#[cfg(feature = "fabric")]
#[test]
fn random_drops_and_deadlines_under_load_fabric_pool() {
    randomized(Mode::FabricPool);
}

#[cfg(feature = "fabric")]
#[test]
fn random_drops_and_deadlines_under_load_fabric_cma() {
    randomized(Mode::FabricCma);
}

// ---------------------------------------------------------------------------------------------
// Deadlines.

/// A peer that never answers: the deadline alone ends the wait, at the deadline.
#[test]
fn deadline_is_honoured_against_a_peer_that_never_answers() {
    let _serial = serial();
    runtime().block_on(async {
        let (addr, _task) = common::silent_target(1, Duration::from_secs(30)).await;
        let init = Engine::builder("127.0.0.1")
            .option("hixl.Transport", "tcp")
            .option("hixl.TcpStreams", "1")
            .option("hixl.HeartbeatIntervalMs", "60000")
            .build()
            .await
            .expect("initiator");
        let local = init
            .register(HostBuffer::zeroed(1 << 20).expect("buf"))
            .expect("register");
        let peer = init.connect(&addr, T).await.expect("connect");
        for (k, ms) in [1u64, 20, 100].into_iter().enumerate() {
            let d = Duration::from_millis(ms);
            let desc = OpDesc::new(local.addr() + k as u64 * 4096, common::SILENT_ADDR, 4096);
            let started = Instant::now();
            let mut t = peer.read(&[desc]).timeout(d);
            assert_eq!(t.status(), TransferStatus::Waiting);
            let e = (&mut t).await.expect_err("nobody answers");
            let took = started.elapsed();
            assert!(
                matches!(e, Error::Timeout { after, .. } if after == d),
                "{e:?}"
            );
            assert_eq!(e.status(), Status::Timeout);
            assert_eq!(t.status(), TransferStatus::TimedOut);
            assert!(took >= d, "timed out after {took:?}, before {d:?}");
            assert!(
                took < d + Duration::from_millis(250),
                "deadline {d:?} reported after {took:?}"
            );
            // The read may still be answered: the op keeps its lease.
            assert_eq!(init.ops_in_flight(), k + 1);
        }
        // Only the link's death proves the reads can no longer land.
        let dereg = tokio::spawn({
            let (init, local) = (init.clone(), local.clone());
            async move { init.deregister(&local).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !dereg.is_finished(),
            "deregister returned under live leases"
        );
        init.disconnect(&addr).await.expect("disconnect");
        let buf = tokio::time::timeout(DEREG, dereg)
            .await
            .expect("deregister after the link closed")
            .expect("join")
            .expect("deregister");
        assert!(buf.is_some());
        assert!(
            wait_idle(&init, GRACE).await,
            "abandoned reads never reaped"
        );
    });
}

/// Memory for the ordered-op tests: a long op `A` and, queued behind it, a short op `B`.
const A_LEN: usize = 32 << 20;
const B_LEN: usize = 1 << 20;

/// Engines of `mode` with `A_LEN + B_LEN` bytes on each side, guard-filled, connected (over
/// tcp by one data connection, so that `B` is queued behind all of `A`).
async fn queued_rig(mode: Mode, rng: &mut Rng) -> (Rig, Region, Region, Peer, RemoteRegion) {
    let mut rig = Rig::with_streams(mode, 1).await;
    let mut tguard = vec![0u8; A_LEN + B_LEN];
    let mut lguard = vec![0u8; A_LEN + B_LEN];
    fill(&mut tguard, rng.next());
    fill(&mut lguard, rng.next());
    let (remote, local, peer, rr) = rig.setup("kv", &tguard, &lguard).await;
    (rig, remote, local, peer, rr)
}

/// A deadline on an op queued behind a long one (so it cannot have finished): `Timeout` at
/// the deadline, status `TimedOut`; the long op completes; the abandoned op drains by itself
/// and its destination holds old or new bytes only.
async fn deadline_behind_a_long_op(mode: Mode) {
    let mut rng = Rng::new(seed(&format!("deadline behind a long op over {mode:?}")));
    let (rig, remote, local, peer, rr) = queued_rig(mode, &mut rng).await;
    let mut before = vec![0u8; B_LEN];
    remote
        .read_at(A_LEN as u64, &mut before)
        .expect("read target");
    let mut new = vec![0u8; B_LEN];
    local.read_at(A_LEN as u64, &mut new).expect("read local");
    let a = peer.write(&[OpDesc::new(local.addr(), rr.addr, A_LEN as u64)]);
    let d = Duration::from_micros(300);
    let started = Instant::now();
    let mut b = peer
        .write(&[OpDesc::new(
            local.addr() + A_LEN as u64,
            rr.addr + A_LEN as u64,
            B_LEN as u64,
        )])
        .timeout(d);
    let e = (&mut b).await.expect_err("queued behind 32 MiB");
    let took = started.elapsed();
    assert!(
        matches!(e, Error::Timeout { after, .. } if after == d),
        "{e:?}"
    );
    assert_eq!(b.status(), TransferStatus::TimedOut);
    assert!(
        took >= d && took < d + LATE,
        "deadline {d:?} after {took:?}"
    );
    drop(b);
    a.timeout(HANG).await.expect("the long op completes");
    assert!(
        wait_idle(&rig.init, GRACE).await,
        "the timed-out op never drained"
    );
    let mut got = vec![0u8; B_LEN];
    remote.read_at(A_LEN as u64, &mut got).expect("read target");
    let changed = got.iter().zip(&before).filter(|(g, o)| g != o).count();
    for (i, ((g, o), n)) in got.iter().zip(&before).zip(&new).enumerate() {
        assert!(g == o || g == n, "byte {i} of the timed-out op: {g:#x}");
    }
    eprintln!(
        "{mode:?}: timed out after {took:?}; {changed} of {B_LEN} bytes of it changed by the end"
    );
    tokio::time::timeout(DEREG, rig.init.deregister(&local))
        .await
        .expect("deregister in time")
        .expect("deregister");
}

#[test]
fn deadline_behind_a_long_op_tcp() {
    let _serial = serial();
    runtime().block_on(deadline_behind_a_long_op(Mode::Tcp));
}

#[cfg(feature = "fabric")]
#[test]
fn deadline_behind_a_long_op_fabric_pool() {
    let _serial = serial();
    runtime().block_on(deadline_behind_a_long_op(Mode::FabricPool));
}

#[cfg(feature = "fabric")]
#[test]
fn deadline_behind_a_long_op_fabric_cma() {
    let _serial = serial();
    runtime().block_on(deadline_behind_a_long_op(Mode::FabricCma));
}

/// An op dropped while all its parts are still queued behind a long op moves no byte: "parts
/// not yet sent are never sent". Returns how many of its destination bytes changed (its data
/// is random: were it all to land, about 1 byte in 256 would still read unchanged).
async fn dropped_while_queued(mode: Mode) -> usize {
    let mut rng = Rng::new(seed(&format!("dropped while queued over {mode:?}")));
    let (rig, remote, local, peer, rr) = queued_rig(mode, &mut rng).await;
    let mut before = vec![0u8; B_LEN];
    remote
        .read_at(A_LEN as u64, &mut before)
        .expect("read target");
    let a = peer.write(&[OpDesc::new(local.addr(), rr.addr, A_LEN as u64)]);
    let b = peer.write(&[OpDesc::new(
        local.addr() + A_LEN as u64,
        rr.addr + A_LEN as u64,
        B_LEN as u64,
    )]);
    assert_eq!(b.status(), TransferStatus::Waiting);
    drop(b);
    a.timeout(HANG).await.expect("the long op completes");
    assert!(
        wait_idle(&rig.init, GRACE).await,
        "the dropped op never drained"
    );
    let mut got = vec![0u8; B_LEN];
    remote.read_at(A_LEN as u64, &mut got).expect("read target");
    let changed = got.iter().zip(&before).filter(|(g, o)| g != o).count();
    tokio::time::timeout(DEREG, rig.init.deregister(&local))
        .await
        .expect("deregister in time")
        .expect("deregister");
    changed
}

#[test]
fn a_dropped_op_queued_behind_another_sends_nothing_tcp() {
    let _serial = serial();
    let changed = runtime().block_on(dropped_while_queued(Mode::Tcp));
    assert_eq!(changed, 0, "bytes of a dropped, never-started op landed");
}

#[cfg(feature = "fabric")]
#[test]
fn a_dropped_op_queued_behind_another_copies_nothing_fabric_pool() {
    let _serial = serial();
    let changed = runtime().block_on(dropped_while_queued(Mode::FabricPool));
    assert_eq!(
        changed, 0,
        "{changed} of {B_LEN} bytes of a dropped op whose copies had not started landed"
    );
}

#[cfg(feature = "fabric")]
#[test]
fn a_dropped_op_queued_behind_another_copies_nothing_fabric_cma() {
    let _serial = serial();
    let changed = runtime().block_on(dropped_while_queued(Mode::FabricCma));
    assert_eq!(
        changed, 0,
        "{changed} of {B_LEN} bytes of a dropped op whose copies had not started landed"
    );
}
