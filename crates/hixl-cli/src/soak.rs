//! `hixl soak`: a mixed workload against a real target process for a set duration, with every
//! byte verified, every op accounted for, and the memory of both processes watched.
//!
//! The target is this executable run as `hixl soak-serve`: it exports two regions, one from its
//! fabric pool (mapped by same-host initiators) and one of plain heap memory (reached by
//! cross-memory attach), and checks what it is told to check through notifies. This process
//! runs one initiator engine per transport (`hixl.Transport=tcp`, `=fabric`), each with a few
//! workers. Every worker owns disjoint slots of the target's memory and of its engine's local
//! memory, so the bytes every slot should hold are known:
//! - A WRITE fills its source with a pattern of (generation, region, offset in region), so a
//!   byte's value says which write put it there. A completed WRITE is read back at once (if
//!   the link is cut first, the sweep that starts the next cycle reads it).
//! - A completed READ is compared with what the worker's model says the target holds.
//! - Ops that fail, time out or are dropped may still land, or be landing: the target ranges
//!   they write and the local slots they use are tainted (not verified, not reused) until the
//!   engine reports no op in flight (`ops_in_flight() == 0`, seen between steps or at the end
//!   of the cycle): the engine promises that an abandoned op is parked until nothing of it can
//!   move any more. A late landing after that shows up as corruption.
//!
//! Every cycle (about every `--cycle` seconds) a transport's workers pause, its link is cut
//! (at once, under the workers' feet, or after they paused), the engine must drain to
//! `ops_in_flight() == 0`, the target checks ranges of known content and the order of the
//! sequence notifies it received, the link is connected again, and each worker reads all its
//! target memory back (the sweep).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use hixl::{Engine, Error, HostBuffer, OpDesc, Peer, Region, TransferOp};
use hixl_cli::child::Target;
use hixl_cli::fail;
use tokio::sync::{mpsc, watch};

use crate::util::{human, parse_size, CliError, CliResult};

mod pattern;
mod report;
mod segs;
mod target;

use pattern::{check, fill, mix, Rng};
use report::{
    lane_report, mem_of, mib, print_report, proc_mem, LaneReport, Latency, Report, RssReport,
    Sample, Samples,
};
use segs::{Segs, St};
pub use target::{serve, ServeArgs};

/// Names of the target's two regions; the index is the region number in the pattern.
const REGIONS: [&str; 2] = ["soak.pool", "soak.heap"];
/// Remote slots per worker: half in the pool region, half in the heap region.
const REMOTE_SLOTS: usize = 6;
/// Local slots per worker: sources of WRITEs and destinations of READs.
const LOCAL_SLOTS: usize = 6;
/// Descriptors per call at most (the sweep at the start of a cycle uses one per remote slot).
const MAX_BATCH: u64 = 4;
/// A slot holds the largest descriptor at any offset up to this.
const SLOT_PAD: u64 = 4096;
/// Largest piece of a descriptor on the wire (`hixl.TcpChunkBytes`), smaller than the default
/// so that large descriptors become several parts spread over the data connections.
const CHUNK: &str = "1M";
/// A transfer that has not resolved after this long is a hang.
const HANG: Duration = Duration::from_secs(30);
/// The engine-side timeout of a notify, and the watchdog over it.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
const NOTIFY_HANG: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an engine may take to report no op in flight once nothing new is submitted.
const DRAIN: Duration = Duration::from_secs(15);
/// How long a worker may take to finish its step once asked to pause.
const PARK: Duration = Duration::from_secs(60);
/// How long the target may take to answer a sync.
const SYNC_WAIT: Duration = Duration::from_secs(30);
const RSS_EVERY: Duration = Duration::from_millis(250);
/// Ranges of known content the target checks per worker and cycle.
const TARGET_CHECKS: usize = 4;
/// Violations kept in full (all are counted).
const KEEP_VIOLATIONS: usize = 100;
/// Largest range the target checks in one notify.
const MAX_CHECK: u64 = 64 << 20;
/// Open fds a process may gain after the warm-up (a connection's sockets come and go).
const FD_GROWTH: u64 = 16;

/// Arguments of `hixl soak`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds of mixed workload.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Seed of the workload (default: from the clock; printed, so a run can be repeated).
    #[arg(long)]
    pub seed: Option<u64>,
    /// `tcp`, `fabric` or `both` (one initiator engine per transport, against one target).
    #[arg(long, default_value = "both")]
    pub transport: String,
    /// Largest descriptor; sizes are log-uniform from 1 byte up to this.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub max_size: u64,
    /// Concurrent workers per transport, each with its own memory.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Mean seconds between disconnect/reconnect cycles (each lasts 0.5x to 1.5x this).
    #[arg(long, default_value_t = 2.0)]
    pub cycle: f64,
    /// Fail when a process's resident memory (RssAnon, and VmRSS) at the end exceeds its
    /// first sample after the warm-up by more than this. Every buffer is allocated and touched
    /// before that sample, so what may still grow is allocator and queue slack. VmRSS of the
    /// initiator may also swing by the size of its fabric slots in the target's pool (mapped
    /// anew at each reconnect), which is added to its bound.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub max_rss_growth: u64,
    /// One JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
}

// ---------------------------------------------------------------------------------------------
// Shared state of the initiator side.

#[derive(Default)]
struct Violations {
    list: Mutex<Vec<String>>,
    count: AtomicU64,
}

impl Violations {
    fn add(&self, what: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        eprintln!("hixl soak: VIOLATION: {what}");
        let mut l = lock(&self.list);
        if l.len() < KEEP_VIOLATIONS {
            l.push(what);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn inc(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

#[derive(Default)]
struct Stats {
    submitted: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    writes: AtomicU64,
    reads: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    verified_bytes: AtomicU64,
    descriptors: AtomicU64,
    tiny_timeouts: AtomicU64,
    tiny_expired: AtomicU64,
    notifies_sent: AtomicU64,
    notifies_acked: AtomicU64,
    notifies_failed: AtomicU64,
    cut_abrupt: AtomicU64,
    cut_abrupt_fast: AtomicU64,
    cut_graceful: AtomicU64,
    connects: AtomicU64,
    connect_retries: AtomicU64,
    max_drain_us: AtomicU64,
    starved: AtomicU64,
    reclaims: AtomicU64,
    latency: Latency,
    max_in_flight: AtomicU64,
    target_checks: AtomicU64,
    target_seq_received: AtomicU64,
    target_seq_out_of_order: AtomicU64,
    target_bad: AtomicU64,
    target_verified: AtomicU64,
    target_verified_bytes: AtomicU64,
    failed_by_kind: Mutex<BTreeMap<String, u64>>,
    notify_failed_by_kind: Mutex<BTreeMap<String, u64>>,
    examples: Mutex<BTreeMap<String, String>>,
}

/// What became of a generation, for telling what stale bytes are.
#[derive(Clone, Copy, Debug)]
struct Fate {
    gen: u64,
    what: &'static str,
    epoch: u64,
}

struct Slot {
    region: u8,
    /// Offset of the slot in its region.
    base: u64,
    segs: Segs,
}

/// One worker's knowledge of its memory.
struct Model {
    remote: Vec<Slot>,
    local_tainted: [bool; LOCAL_SLOTS],
    history: VecDeque<Fate>,
}

/// What the workers of a lane are to do; the number is the cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Run(u64),
    Pause(u64),
    Stop,
}

/// One transport: its initiator engine, link and workers' models.
struct Lane {
    name: &'static str,
    index: usize,
    workers: usize,
    engine: Engine,
    local: Region,
    target: String,
    /// Start addresses of the target's regions, in [`REGIONS`] order.
    remote: [u64; 2],
    route: Mutex<String>,
    peer: RwLock<Option<Peer>>,
    phase: watch::Sender<Phase>,
    /// The link is being cut: transfers may fail with the link's error.
    cutting: AtomicBool,
    epoch: AtomicU64,
    models: Vec<Mutex<Model>>,
    stats: Stats,
    v: Arc<Violations>,
    gens: Arc<AtomicU64>,
    slot_len: u64,
    max_size: u64,
    filled: Arc<AtomicUsize>,
}

impl Lane {
    /// Region and offset of worker `w`'s remote slot `j`.
    fn place(&self, w: usize, j: usize) -> (u8, u64) {
        let per_region = REMOTE_SLOTS / 2;
        let idx = (self.index * self.workers + w) * per_region + j / 2;
        ((j % 2) as u8, idx as u64 * self.slot_len)
    }

    fn model(&self, w: usize) -> MutexGuard<'_, Model> {
        lock(&self.models[w])
    }

    fn peer(&self) -> Option<Peer> {
        self.peer.read().ok().and_then(|p| p.clone())
    }

    fn violation(&self, what: String) {
        self.v.add(format!("{}: {what}", self.name));
    }
}

/// Bytes needed in each target region.
fn region_bytes(lanes: usize, workers: usize, slot_len: u64) -> u64 {
    (lanes * workers * (REMOTE_SLOTS / 2)) as u64 * slot_len
}

fn kind(e: &Error) -> String {
    let d = format!("{e:?}");
    d.split(|c: char| !c.is_alphanumeric())
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or("Error")
        .to_string()
}

fn count_kind(m: &Mutex<BTreeMap<String, u64>>, k: String) {
    *lock(m).entry(k).or_insert(0) += 1;
}

/// Keeps the first message of each kind of failure, with where it happened.
fn example(m: &Mutex<BTreeMap<String, String>>, k: String, what: impl FnOnce() -> String) {
    lock(m).entry(k).or_insert_with(what);
}

// ---------------------------------------------------------------------------------------------
// Transfers.

/// How a transfer is awaited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Awaited (under the hang watchdog).
    Plain,
    /// With `.timeout()` of this many microseconds.
    Tiny(u64),
    /// Dropped: at once (0), or after polling it for up to this many microseconds.
    Drop(u64),
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Tiny(_) => "tiny timeout",
            Mode::Drop(_) => "dropped",
        }
    }
}

enum Outcome {
    Done,
    Failed(Error),
    Dropped,
    Hang,
}

/// One descriptor of a worker: remote slot and offset in it, local slot and offset, length.
#[derive(Clone, Copy, Debug)]
struct D {
    slot: usize,
    lslot: usize,
    roff: u64,
    loff: u64,
    len: u64,
}

async fn transfer(
    lane: &Lane,
    peer: &Peer,
    op: TransferOp,
    descs: &[OpDesc],
    mode: Mode,
) -> Outcome {
    inc(&lane.stats.submitted, 1);
    inc(&lane.stats.descriptors, descs.len() as u64);
    let r = match mode {
        Mode::Plain => {
            let t0 = Instant::now();
            let r = tokio::time::timeout(HANG, peer.transfer(op, descs)).await;
            lane.stats.latency.record(t0.elapsed());
            r
        }
        Mode::Tiny(us) => {
            inc(&lane.stats.tiny_timeouts, 1);
            let t = peer
                .transfer(op, descs)
                .timeout(Duration::from_micros(us.max(1)));
            tokio::time::timeout(HANG, t).await
        }
        Mode::Drop(us) => {
            let mut t = peer.transfer(op, descs);
            if us == 0 {
                drop(t);
                return Outcome::Dropped;
            }
            match tokio::time::timeout(Duration::from_micros(us), &mut t).await {
                Ok(r) => Ok(r),
                Err(_) => {
                    drop(t);
                    return Outcome::Dropped;
                }
            }
        }
    };
    match r {
        Ok(Ok(())) => Outcome::Done,
        Ok(Err(e)) => Outcome::Failed(e),
        Err(_) => Outcome::Hang,
    }
}

struct Worker {
    lane: Arc<Lane>,
    id: usize,
    rng: Rng,
    scratch: Vec<u8>,
    /// The byte READ destinations are filled with before the READ.
    junk: u8,
    seq: u64,
    steps: usize,
}

/// A draw of [`Worker::step`] for each kind of step: WRITE, READ, notify, dropped, tiny
/// timeout, WRITE and READ at once.
const TOUR: [u64; 6] = [0, 35, 65, 75, 85, 95];

impl Worker {
    fn local_off(&self, d: &D) -> u64 {
        (self.id * LOCAL_SLOTS + d.lslot) as u64 * self.lane.slot_len + d.loff
    }

    fn descs(&self, ds: &[D]) -> Vec<OpDesc> {
        ds.iter()
            .map(|d| {
                let (region, base) = self.lane.place(self.id, d.slot);
                OpDesc::new(
                    self.lane.local.addr() + self.local_off(d),
                    self.lane.remote[region as usize] + base + d.roff,
                    d.len,
                )
            })
            .collect()
    }

    /// Up to `k` descriptors on remote and local slots not used yet (local ones untainted).
    fn pick(
        &mut self,
        k: u64,
        used_r: &mut [bool; REMOTE_SLOTS],
        used_l: &mut [bool; LOCAL_SLOTS],
    ) -> Vec<D> {
        let tainted = self.lane.model(self.id).local_tainted;
        let mut rs: Vec<usize> = (0..REMOTE_SLOTS).filter(|&j| !used_r[j]).collect();
        let mut ls: Vec<usize> = (0..LOCAL_SLOTS)
            .filter(|&j| !used_l[j] && !tainted[j])
            .collect();
        self.rng.shuffle(&mut rs);
        self.rng.shuffle(&mut ls);
        let k = (k as usize).min(rs.len()).min(ls.len());
        let slot_len = self.lane.slot_len;
        let max = self.lane.max_size;
        (0..k)
            .map(|i| {
                used_r[rs[i]] = true;
                used_l[ls[i]] = true;
                let len = self.rng.size(max);
                let room = slot_len - len;
                D {
                    slot: rs[i],
                    lslot: ls[i],
                    roff: self.rng.below(room + 1),
                    loff: self.rng.below(room + 1),
                    len,
                }
            })
            .collect()
    }

    /// Fills the local side: a WRITE's source with a fresh generation's pattern (returned),
    /// a READ's destination with a filler byte.
    fn prep(&mut self, op: TransferOp, ds: &[D]) -> u64 {
        let lane = self.lane.clone();
        let gen = if op == TransferOp::Write {
            lane.gens.fetch_add(1, Ordering::Relaxed)
        } else {
            self.junk = (self.rng.next() as u8) | 1;
            0
        };
        for d in ds {
            let len = d.len as usize;
            let at = self.local_off(d);
            let buf = &mut self.scratch[..len];
            if op == TransferOp::Write {
                let (region, base) = lane.place(self.id, d.slot);
                fill(buf, gen, region, base + d.roff);
            } else {
                buf.fill(self.junk);
            }
            if let Err(e) = lane.local.write_at(at, buf) {
                lane.violation(format!("local write_at failed: {e}"));
            }
        }
        gen
    }

    /// Whether a failure is one this workload provokes: a tiny timeout expiring, or the link
    /// being cut by this side. An op cut off by our own disconnect should fail with the link's
    /// cause (NotConnected); a TCP READ whose payload was being received can instead fail with
    /// PeerLost (the socket's reset). Both are accepted, and counted by kind with an example.
    fn expected(&self, e: &Error, mode: Mode) -> bool {
        match e {
            Error::Timeout { .. } => matches!(mode, Mode::Tiny(_)),
            Error::NotConnected { .. } | Error::PeerLost { .. } => {
                self.lane.cutting.load(Ordering::SeqCst)
            }
            _ => false,
        }
    }

    fn remember(&self, gen: u64, what: &'static str) {
        if gen == 0 {
            return;
        }
        let epoch = self.lane.epoch.load(Ordering::Relaxed);
        let mut m = self.lane.model(self.id);
        if m.history.len() >= 512 {
            m.history.pop_front();
        }
        m.history.push_back(Fate { gen, what, epoch });
    }

    /// Accounts for a transfer's outcome and updates the model; a completed READ is verified.
    fn settle(&mut self, op: TransferOp, ds: &[D], gen: u64, mode: Mode, out: Outcome) {
        let lane = self.lane.clone();
        let s = &lane.stats;
        let bytes: u64 = ds.iter().map(|d| d.len).sum();
        let write = op == TransferOp::Write;
        match out {
            Outcome::Done => {
                inc(&s.completed, 1);
                if write {
                    inc(&s.writes, 1);
                    inc(&s.bytes_written, bytes);
                    let mut m = lane.model(self.id);
                    for d in ds {
                        m.remote[d.slot].segs.written(d.roff, d.roff + d.len, gen);
                    }
                    drop(m);
                    self.remember(gen, "completed");
                } else {
                    inc(&s.reads, 1);
                    inc(&s.bytes_read, bytes);
                    for (i, d) in ds.iter().enumerate() {
                        self.verify(d, i, ds.len(), mode);
                    }
                }
            }
            Outcome::Failed(e) => {
                inc(&s.failed, 1);
                count_kind(&s.failed_by_kind, kind(&e));
                let cut = lane.cutting.load(Ordering::SeqCst);
                example(&s.examples, kind(&e), || {
                    format!(
                        "{op} ({}{}): {e} [{}]",
                        mode.name(),
                        if cut { ", link being cut" } else { "" },
                        e.status()
                    )
                });
                let timed_out = matches!(e, Error::Timeout { .. });
                if timed_out && matches!(mode, Mode::Tiny(_)) {
                    inc(&s.tiny_expired, 1);
                }
                if !self.expected(&e, mode) {
                    lane.violation(format!(
                        "{op} of {} descriptors ({bytes} bytes, {}) failed unexpectedly: {e} [{}]",
                        ds.len(),
                        mode.name(),
                        e.status()
                    ));
                }
                // A timed-out op is abandoned: it may still move bytes until it is reaped.
                self.taint(ds, write, timed_out);
                self.remember(gen, if timed_out { "timed out" } else { "failed" });
            }
            Outcome::Hang => {
                inc(&s.failed, 1);
                count_kind(&s.failed_by_kind, "Hang".into());
                lane.violation(format!(
                    "{op} of {} descriptors ({bytes} bytes, {}) did not resolve within {HANG:?}",
                    ds.len(),
                    mode.name()
                ));
                self.taint(ds, write, true);
                self.remember(gen, "hung");
            }
            Outcome::Dropped => {
                inc(&s.dropped, 1);
                self.taint(ds, write, true);
                self.remember(gen, "dropped");
            }
        }
    }

    fn taint(&self, ds: &[D], write: bool, local: bool) {
        let mut m = self.lane.model(self.id);
        for d in ds {
            if write {
                m.remote[d.slot].segs.taint(d.roff, d.roff + d.len);
            }
            if local {
                m.local_tainted[d.lslot] = true;
            }
        }
    }

    /// Compares what a completed READ brought with what the model says the target holds.
    fn verify(&mut self, d: &D, index: usize, n: usize, mode: Mode) {
        let lane = self.lane.clone();
        let len = d.len as usize;
        if let Err(e) = lane
            .local
            .read_at(self.local_off(d), &mut self.scratch[..len])
        {
            lane.violation(format!("local read_at failed: {e}"));
            return;
        }
        let m = lane.model(self.id);
        let slot = &m.remote[d.slot];
        let mut verified = 0;
        for (a, b, st) in slot.segs.query(d.roff, d.roff + d.len) {
            let St::Known(gen) = st else { continue };
            let buf = &self.scratch[(a - d.roff) as usize..(b - d.roff) as usize];
            let Some(i) = check(buf, gen, slot.region, slot.base + a) else {
                verified += b - a;
                continue;
            };
            let pos = slot.base + a + i as u64;
            let got = &buf[i..(i + 8).min(buf.len())];
            let mut want = vec![0u8; got.len()];
            fill(&mut want, gen, slot.region, pos);
            let why = diagnose(got, pos, slot.region, self.junk, &m.history);
            lane.violation(format!(
                "corruption: worker {} READ descriptor {index} of {n} ({} bytes at {}+{:#x}, {}) \
                 first bad byte at {}+{pos:#x}: got {} want {} (generation {gen}); {why}",
                self.id,
                d.len,
                REGIONS[slot.region as usize],
                slot.base + d.roff,
                mode.name(),
                REGIONS[slot.region as usize],
                hex(got),
                hex(&want)
            ));
            break;
        }
        inc(&lane.stats.verified_bytes, verified);
    }

    async fn notify(&mut self, peer: &Peer) {
        let lane = self.lane.clone();
        self.seq += 1;
        let msg = format!("{}.{} {}", lane.name, self.id, self.seq);
        inc(&lane.stats.notifies_sent, 1);
        let r = tokio::time::timeout(
            NOTIFY_HANG,
            peer.notify_timeout("soak.seq", msg, NOTIFY_TIMEOUT),
        )
        .await;
        match r {
            Ok(Ok(())) => inc(&lane.stats.notifies_acked, 1),
            Ok(Err(e)) => {
                inc(&lane.stats.notifies_failed, 1);
                count_kind(&lane.stats.notify_failed_by_kind, kind(&e));
                let cut = lane.cutting.load(Ordering::SeqCst);
                example(&lane.stats.examples, format!("notify {}", kind(&e)), || {
                    format!(
                        "notify{}: {e} [{}]",
                        if cut { " (link being cut)" } else { "" },
                        e.status()
                    )
                });
                let lost = matches!(e, Error::NotConnected { .. } | Error::PeerLost { .. });
                if !(lost && lane.cutting.load(Ordering::SeqCst)) {
                    lane.violation(format!("notify failed unexpectedly: {e} [{}]", e.status()));
                }
            }
            Err(_) => {
                inc(&lane.stats.notifies_failed, 1);
                count_kind(&lane.stats.notify_failed_by_kind, "Hang".into());
                lane.violation(format!("notify did not resolve within {NOTIFY_HANG:?}"));
            }
        }
    }

    /// One transfer, and for a WRITE that completed (however it was awaited) its read-back.
    /// `false` when no local slot is free.
    async fn batch(&mut self, peer: &Peer, op: TransferOp, mode: Mode) -> bool {
        let k = 1 + self.rng.below(MAX_BATCH);
        let ds = self.pick(k, &mut [false; REMOTE_SLOTS], &mut [false; LOCAL_SLOTS]);
        if ds.is_empty() {
            return false;
        }
        let gen = self.prep(op, &ds);
        let out = transfer(&self.lane.clone(), peer, op, &self.descs(&ds), mode).await;
        let done = matches!(out, Outcome::Done);
        self.settle(op, &ds, gen, mode, out);
        if done && op == TransferOp::Write {
            self.read_back(peer, &ds).await;
        }
        true
    }

    async fn read_back(&mut self, peer: &Peer, ds: &[D]) {
        self.prep(TransferOp::Read, ds);
        let out = transfer(
            &self.lane.clone(),
            peer,
            TransferOp::Read,
            &self.descs(ds),
            Mode::Plain,
        )
        .await;
        self.settle(TransferOp::Read, ds, 0, Mode::Plain, out);
    }

    /// A WRITE and a READ of the same worker in flight at once, on distinct slots.
    async fn pair(&mut self, peer: &Peer) -> bool {
        let (mut ur, mut ul) = ([false; REMOTE_SLOTS], [false; LOCAL_SLOTS]);
        let k1 = 1 + self.rng.below(2);
        let k2 = 1 + self.rng.below(2);
        let w = self.pick(k1, &mut ur, &mut ul);
        let r = self.pick(k2, &mut ur, &mut ul);
        if w.is_empty() || r.is_empty() {
            return false;
        }
        let gen = self.prep(TransferOp::Write, &w);
        self.prep(TransferOp::Read, &r);
        let lane = self.lane.clone();
        let (wd, rd) = (self.descs(&w), self.descs(&r));
        let (ow, or) = tokio::join!(
            transfer(&lane, peer, TransferOp::Write, &wd, Mode::Plain),
            transfer(&lane, peer, TransferOp::Read, &rd, Mode::Plain)
        );
        let done = matches!(ow, Outcome::Done);
        self.settle(TransferOp::Write, &w, gen, Mode::Plain, ow);
        self.settle(TransferOp::Read, &r, 0, Mode::Plain, or);
        if done {
            self.read_back(peer, &w).await;
        }
        true
    }

    /// Ends this worker's taints once its engine has nothing in flight: every op this worker
    /// dropped or abandoned has then been reaped, so the engine promises it touches nothing
    /// any more. Called between steps only (the worker has no op of its own in flight).
    fn reclaim(&mut self) {
        let lane = self.lane.clone();
        let mut m = lane.model(self.id);
        if !m.local_tainted.iter().any(|&t| t) && !m.remote.iter().any(|s| s.segs.tainted()) {
            return;
        }
        if lane.engine.ops_in_flight() != 0 {
            return;
        }
        for s in &mut m.remote {
            s.segs.settle();
        }
        m.local_tainted = [false; LOCAL_SLOTS];
        inc(&lane.stats.reclaims, 1);
    }

    async fn step(&mut self, peer: &Peer) -> bool {
        self.reclaim();
        let op = if self.rng.below(2) == 0 {
            TransferOp::Write
        } else {
            TransferOp::Read
        };
        // The first steps visit every kind once, so that even a short run covers them all.
        let pick = match TOUR.get(self.steps) {
            Some(&p) => p,
            None => self.rng.below(100),
        };
        self.steps += 1;
        match pick {
            0..=34 => self.batch(peer, TransferOp::Write, Mode::Plain).await,
            35..=64 => self.batch(peer, TransferOp::Read, Mode::Plain).await,
            65..=74 => {
                self.notify(peer).await;
                true
            }
            75..=84 => {
                let us = match self.rng.below(3) {
                    0 => 0,
                    _ => 1 + self.rng.below(2000),
                };
                self.batch(peer, op, Mode::Drop(us)).await
            }
            85..=94 => {
                let us = 1 + self.rng.below(300);
                self.batch(peer, op, Mode::Tiny(us)).await
            }
            _ => self.pair(peer).await,
        }
    }

    /// Every remote slot whole: written with a fresh generation and read back (`fill`), or
    /// read and verified against the model (the sweep at the start of each cycle).
    async fn whole(&mut self, peer: &Peer, fill: bool) {
        let tainted = self.lane.model(self.id).local_tainted;
        let free: Vec<usize> = (0..LOCAL_SLOTS).filter(|&j| !tainted[j]).collect();
        let ds: Vec<D> = (0..REMOTE_SLOTS)
            .zip(free)
            .map(|(slot, lslot)| D {
                slot,
                lslot,
                roff: 0,
                loff: 0,
                len: self.lane.slot_len,
            })
            .collect();
        if ds.is_empty() {
            return;
        }
        if fill {
            let gen = self.prep(TransferOp::Write, &ds);
            let out = transfer(
                &self.lane.clone(),
                peer,
                TransferOp::Write,
                &self.descs(&ds),
                Mode::Plain,
            )
            .await;
            let done = matches!(out, Outcome::Done);
            self.settle(TransferOp::Write, &ds, gen, Mode::Plain, out);
            if done {
                self.read_back(peer, &ds).await;
            }
        } else {
            self.read_back(peer, &ds).await;
        }
    }

    /// Runs until told to stop; returns the scratch buffer, so that the memory figures at the
    /// end are not lowered by its release.
    async fn run(mut self, parked: mpsc::UnboundedSender<u64>) -> Vec<u8> {
        let mut rx = self.lane.phase.subscribe();
        let mut first = true;
        let mut fresh = true;
        loop {
            let phase = *rx.borrow_and_update();
            match phase {
                Phase::Stop => break,
                Phase::Pause(cycle) => {
                    let _ = parked.send(cycle);
                    // Until the phase moves on (to the next cycle's Run, or straight to its
                    // Pause if this task was not scheduled in between).
                    while *rx.borrow_and_update() == phase {
                        if rx.changed().await.is_err() {
                            return self.scratch;
                        }
                    }
                    fresh = true;
                    continue;
                }
                Phase::Run(_) => {}
            }
            let Some(peer) = self.lane.peer() else {
                if rx.changed().await.is_err() {
                    return self.scratch;
                }
                continue;
            };
            if fresh {
                self.whole(&peer, first).await;
                if first {
                    self.lane.filled.fetch_add(1, Ordering::SeqCst);
                }
                first = false;
                fresh = false;
                continue;
            }
            if !self.step(&peer).await {
                // Every local slot is tainted: wait until the engine has reaped the abandoned
                // ops (or the cycle ends).
                inc(&self.lane.stats.starved, 1);
                let lane = self.lane.clone();
                let drained = async {
                    while lane.engine.ops_in_flight() != 0 {
                        tokio::time::sleep(Duration::from_micros(200)).await;
                    }
                };
                tokio::select! {
                    r = rx.changed() => if r.is_err() {
                        return self.scratch;
                    },
                    _ = drained => {}
                }
            }
            // The pattern work is CPU-bound: let the engine's tasks and other workers run.
            tokio::task::yield_now().await;
        }
        if first {
            self.lane.filled.fetch_add(1, Ordering::SeqCst);
        }
        self.scratch
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// Says what unexpected bytes are: the READ's filler, zeroes, or a known generation's.
fn diagnose(got: &[u8], pos: u64, region: u8, junk: u8, history: &VecDeque<Fate>) -> String {
    if got.iter().all(|&b| b == junk) {
        return format!(
            "the bytes are the filler ({junk:#04x}) written before the READ: the READ reported success without landing them"
        );
    }
    let mut want = vec![0u8; got.len()];
    for f in history.iter().rev() {
        fill(&mut want, f.gen, region, pos);
        if want == got {
            return format!(
                "the bytes are generation {}'s, a WRITE that {} in cycle {}",
                f.gen, f.what, f.epoch
            );
        }
    }
    if got.iter().all(|&b| b == 0) {
        return "the bytes are zeroes".into();
    }
    "the bytes match none of this worker's last 512 WRITEs".into()
}

// ---------------------------------------------------------------------------------------------
// The cycle: pause, cut, drain, check at the target, reconnect.

#[derive(Clone, Copy, Debug)]
enum Cut {
    /// Disconnect under the workers' feet, wait for them, drain, reconnect.
    Abrupt,
    /// Disconnect under the workers' feet and reconnect at once, then wait and drain.
    AbruptFast,
    /// Wait for the workers, drain, check, then disconnect and reconnect an idle link.
    Graceful,
}

async fn connect(lane: &Lane) -> bool {
    let mut last = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            inc(&lane.stats.connect_retries, 1);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match lane.engine.connect(&lane.target, CONNECT_TIMEOUT).await {
            Ok(p) => {
                inc(&lane.stats.connects, 1);
                let now: Vec<Option<u64>> = REGIONS
                    .iter()
                    .map(|n| p.region(n).map(|r| r.addr))
                    .collect();
                if now != lane.remote.map(Some) {
                    lane.violation(format!(
                        "the target's table changed across a reconnect: {now:?} vs {:?}",
                        lane.remote
                    ));
                }
                if !p.transport().starts_with(lane.name) {
                    lane.violation(format!("reconnected over {}", p.transport()));
                }
                *lock(&lane.route) = p.transport().to_string();
                if let Ok(mut g) = lane.peer.write() {
                    *g = Some(p);
                }
                return true;
            }
            Err(e) => last = format!("{e} [{}]", e.status()),
        }
    }
    lane.violation(format!("cannot reconnect to the target: {last}"));
    false
}

async fn disconnect(lane: &Lane) {
    if let Ok(mut g) = lane.peer.write() {
        *g = None;
    }
    if let Err(e) = lane.engine.disconnect(&lane.target).await {
        lane.violation(format!("disconnect failed: {e}"));
    }
}

/// Waits until the engine has no op in flight.
async fn drain(lane: &Lane, after: &str) {
    let start = Instant::now();
    loop {
        let n = lane.engine.ops_in_flight();
        if n == 0 {
            let us = start.elapsed().as_micros() as u64;
            lane.stats.max_drain_us.fetch_max(us, Ordering::Relaxed);
            return;
        }
        if start.elapsed() > DRAIN {
            lane.violation(format!(
                "{n} ops still in flight {DRAIN:?} after {after} with nothing new submitted"
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Asks the target to check ranges of known content and to report the sequence notifies it
/// saw, then checks its answer. The workers are parked and nothing is in flight.
async fn target_check(lane: &Lane, lines: &mut mpsc::UnboundedReceiver<String>, n: u64) {
    let Some(peer) = lane.peer() else {
        lane.violation("no link for the target check".into());
        return;
    };
    let mut ranges = Vec::new();
    for w in 0..lane.workers {
        let m = lane.model(w);
        let mut known: Vec<(u8, u64, u64, u64)> = m
            .remote
            .iter()
            .flat_map(|s| {
                s.segs
                    .known()
                    .map(|(a, b, g)| (s.region, s.base + a, b - a, g))
            })
            .collect();
        known.sort_by_key(|r| std::cmp::Reverse(r.2));
        ranges.extend(known.into_iter().take(TARGET_CHECKS));
    }
    let send = |name: &'static str, msg: String| {
        let peer = peer.clone();
        async move {
            match tokio::time::timeout(NOTIFY_HANG, peer.notify_timeout(name, msg, NOTIFY_TIMEOUT))
                .await
            {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e} [{}]", e.status())),
                Err(_) => Err(format!("no answer within {NOTIFY_HANG:?}")),
            }
        }
    };
    for (region, pos, len, gen) in &ranges {
        let len = (*len).min(lane.slot_len);
        let msg = format!("{} {region} {pos} {len} {gen}", lane.name);
        if let Err(e) = send("soak.verify", msg).await {
            lane.violation(format!("verify notify failed on an idle link: {e}"));
            return;
        }
        inc(&lane.stats.target_checks, 1);
    }
    if let Err(e) = send("soak.sync", format!("{} {n}", lane.name)).await {
        lane.violation(format!("sync notify failed on an idle link: {e}"));
        return;
    }
    let deadline = tokio::time::Instant::now() + SYNC_WAIT;
    let line = loop {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Ok(Some(l)) if l.contains(" SYNC ") && field(&l, "n") == Some(n) => break l,
            Ok(Some(l)) if l.contains(" SYNC ") => {}
            Ok(Some(l)) => lane.violation(format!("target: {l}")),
            Ok(None) => {
                lane.violation("the target exited".into());
                return;
            }
            Err(_) => {
                lane.violation(format!(
                    "the target did not answer sync {n} in {SYNC_WAIT:?}"
                ));
                return;
            }
        }
    };
    let s = &lane.stats;
    let received = field(&line, "seq_received").unwrap_or(0);
    let (acked, sent) = (get(&s.notifies_acked), get(&s.notifies_sent));
    if received < acked || received > sent {
        lane.violation(format!(
            "the target received {received} sequence notifies, but {acked} were acked and {sent} sent"
        ));
    }
    s.target_seq_received.store(received, Ordering::Relaxed);
    let bad = field(&line, "bad").unwrap_or(0);
    if bad > s.target_bad.swap(bad, Ordering::Relaxed) {
        lane.violation(format!(
            "the target could not use {bad} soak notifies so far (see its BAD lines)"
        ));
    }
    s.target_seq_out_of_order.store(
        field(&line, "seq_out_of_order").unwrap_or(0),
        Ordering::Relaxed,
    );
    s.target_verified
        .store(field(&line, "verified").unwrap_or(0), Ordering::Relaxed);
    s.target_verified_bytes.store(
        field(&line, "verified_bytes").unwrap_or(0),
        Ordering::Relaxed,
    );
}

async fn wait_parked(lane: &Lane, parked: &mut mpsc::UnboundedReceiver<u64>, cycle: u64) {
    let deadline = tokio::time::Instant::now() + PARK;
    let mut n = 0;
    while n < lane.workers {
        match tokio::time::timeout_at(deadline, parked.recv()).await {
            Ok(Some(c)) if c == cycle => n += 1,
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(_) => {
                lane.violation(format!(
                    "{} of {} workers did not finish their step within {PARK:?} of the pause",
                    lane.workers - n,
                    lane.workers
                ));
                return;
            }
        }
    }
}

async fn controller(
    lane: Arc<Lane>,
    mut parked: mpsc::UnboundedReceiver<u64>,
    mut lines: mpsc::UnboundedReceiver<String>,
    mut rng: Rng,
    stop_at: tokio::time::Instant,
    cycle: Duration,
    gone: Arc<AtomicBool>,
) {
    let mut n = 0u64;
    loop {
        let wait = cycle.mul_f64(0.5 + rng.below(1000) as f64 / 1000.0);
        let until = (tokio::time::Instant::now() + wait).min(stop_at);
        tokio::time::sleep_until(until).await;
        let stopping = until >= stop_at || gone.load(Ordering::SeqCst);
        let cut = match (stopping, rng.below(3)) {
            (true, _) => Cut::Graceful,
            (false, 0) => Cut::Abrupt,
            (false, 1) => Cut::AbruptFast,
            _ => Cut::Graceful,
        };
        lane.phase.send_replace(Phase::Pause(n));
        let mut up = true;
        match cut {
            Cut::Abrupt | Cut::AbruptFast => {
                lane.cutting.store(true, Ordering::SeqCst);
                disconnect(&lane).await;
                if let Cut::AbruptFast = cut {
                    inc(&lane.stats.cut_abrupt_fast, 1);
                    up = connect(&lane).await;
                } else {
                    inc(&lane.stats.cut_abrupt, 1);
                }
                if let Cut::Abrupt = cut {
                    // Without a link nothing new is posted: time how long the engine takes
                    // to resolve what was in flight.
                    tokio::join!(
                        wait_parked(&lane, &mut parked, n),
                        drain(&lane, "a disconnect under load")
                    );
                } else {
                    wait_parked(&lane, &mut parked, n).await;
                }
                drain(&lane, "a disconnect under load").await;
                if let Cut::Abrupt = cut {
                    up = connect(&lane).await;
                }
            }
            Cut::Graceful => {
                wait_parked(&lane, &mut parked, n).await;
                drain(&lane, "the workers paused").await;
            }
        }
        if up {
            target_check(&lane, &mut lines, n).await;
        }
        if gone.load(Ordering::SeqCst) {
            up = false;
        }
        if let (Cut::Graceful, false, true) = (cut, stopping, up) {
            inc(&lane.stats.cut_graceful, 1);
            // A second connect to a linked peer is refused and leaves the link as it was.
            match lane.engine.connect(&lane.target, CONNECT_TIMEOUT).await {
                Err(Error::AlreadyConnected { .. }) => {}
                Ok(_) => lane.violation("a second connect to a linked peer succeeded".into()),
                Err(e) => lane.violation(format!(
                    "a second connect to a linked peer failed with {e} instead of ALREADY_CONNECTED"
                )),
            }
            if lane.peer().is_some_and(|p| !p.is_connected()) {
                lane.violation("a refused second connect took the link down".into());
            }
            disconnect(&lane).await;
            up = connect(&lane).await;
        }
        for w in 0..lane.workers {
            let mut m = lane.model(w);
            for s in &mut m.remote {
                s.segs.settle();
            }
            m.local_tainted = [false; LOCAL_SLOTS];
        }
        lane.epoch.fetch_add(1, Ordering::Relaxed);
        lane.cutting.store(false, Ordering::SeqCst);
        if stopping || !up {
            lane.phase.send_replace(Phase::Stop);
            return;
        }
        n += 1;
        lane.phase.send_replace(Phase::Run(n));
    }
}

// ---------------------------------------------------------------------------------------------
// The initiator process.

/// Runs `hixl soak`.
pub async fn run(a: Args) -> CliResult {
    if !(a.duration.is_finite() && a.duration > 0.0 && a.duration <= 1e6) {
        return Err(fail!("--duration must be > 0 s, got {}", a.duration));
    }
    if !(a.cycle.is_finite() && a.cycle >= 0.05) {
        return Err(fail!("--cycle must be at least 0.05 s, got {}", a.cycle));
    }
    if a.max_size == 0 || a.max_size > (64 << 20) {
        return Err(fail!("--max-size must be 1..=64M, got {}", a.max_size));
    }
    if !(1..=16).contains(&a.workers) {
        return Err(fail!("--workers must be 1..=16, got {}", a.workers));
    }
    let names: &[&'static str] = match a.transport.as_str() {
        "tcp" => &["tcp"],
        "fabric" => &["fabric"],
        "both" => &["tcp", "fabric"],
        t => return Err(fail!("--transport must be tcp, fabric or both, not {t:?}")),
    };
    let seed = a.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        mix(t ^ u64::from(std::process::id()))
    });
    let slot_len = a.max_size + SLOT_PAD;
    let per_region = region_bytes(names.len(), a.workers, slot_len);
    let exe: PathBuf = std::env::current_exe()?;
    let mut target = Target::spawn_with(
        &exe,
        &[
            "soak-serve",
            "--mem",
            &per_region.to_string(),
            "--max-check",
            &slot_len.to_string(),
        ],
    )?;
    let target_pid = target.pid;
    let v = Arc::new(Violations::default());

    // Target lines "SOAK tag=<transport> ..." go to that transport's controller.
    let gone = Arc::new(AtomicBool::new(false));
    let mut routes = HashMap::new();
    let mut receivers = Vec::new();
    for n in names {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        routes.insert(n.to_string(), tx);
        receivers.push(rx);
    }
    {
        let lines = target.take_lines();
        let gone = gone.clone();
        std::thread::spawn(move || {
            for l in lines.iter() {
                let tag = l
                    .strip_prefix("SOAK tag=")
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("");
                match routes.get(tag) {
                    Some(tx) => {
                        let _ = tx.send(l);
                    }
                    None if l.starts_with("SOAK ") => eprintln!("hixl soak: target: {l}"),
                    None => {}
                }
            }
            gone.store(true, Ordering::SeqCst);
        });
    }

    let gens = Arc::new(AtomicU64::new(1));
    let filled = Arc::new(AtomicUsize::new(0));
    let mut lanes = Vec::new();
    for (index, &name) in names.iter().enumerate() {
        let engine = Engine::builder("127.0.0.1")
            .option("hixl.Transport", name)
            .option("hixl.TcpChunkBytes", CHUNK)
            .build()
            .await?;
        let local_len = (a.workers * LOCAL_SLOTS) as u64 * slot_len;
        let local = engine.register(HostBuffer::zeroed(local_len as usize)?)?;
        touch(&local)?;
        let peer = engine
            .connect(&target.engine, CONNECT_TIMEOUT)
            .await
            .map_err(|e| fail!("{name}: cannot connect to the target: {e} [{}]", e.status()))?;
        let mut remote = [0u64; 2];
        for (i, n) in REGIONS.iter().enumerate() {
            let r = peer
                .region(n)
                .ok_or_else(|| fail!("the target exported no region {n}"))?;
            if r.len < per_region {
                return Err(fail!(
                    "the target's {n} has {} bytes, not {per_region}",
                    r.len
                ));
            }
            remote[i] = r.addr;
        }
        let (phase, _) = watch::channel(Phase::Run(0));
        let lane = Lane {
            name,
            index,
            workers: a.workers,
            engine,
            local,
            target: target.engine.clone(),
            remote,
            route: Mutex::new(peer.transport().to_string()),
            peer: RwLock::new(Some(peer)),
            phase,
            cutting: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            models: Vec::new(),
            stats: Stats {
                connects: AtomicU64::new(1),
                ..Stats::default()
            },
            v: v.clone(),
            gens: gens.clone(),
            slot_len,
            max_size: a.max_size,
            filled: filled.clone(),
        };
        let models = (0..a.workers)
            .map(|w| {
                Mutex::new(Model {
                    remote: (0..REMOTE_SLOTS)
                        .map(|j| {
                            let (region, base) = lane.place(w, j);
                            Slot {
                                region,
                                base,
                                segs: Segs::new(slot_len),
                            }
                        })
                        .collect(),
                    local_tainted: [false; LOCAL_SLOTS],
                    history: VecDeque::new(),
                })
            })
            .collect();
        lanes.push(Arc::new(Lane { models, ..lane }));
    }
    if !a.json {
        println!(
            "hixl soak: {} s, seed {seed}, transports {}, {} workers each, sizes 1 B..{}, target pid {target_pid}",
            a.duration,
            names.join("+"),
            a.workers,
            human(a.max_size)
        );
        for l in &lanes {
            println!("  {}: {}", l.name, lock(&l.route));
        }
    }

    let start = Instant::now();
    let duration = Duration::from_secs_f64(a.duration);
    let stop_at = tokio::time::Instant::now() + duration;
    let warmup = (duration / 10).max(Duration::from_secs(1));
    let total_workers = names.len() * a.workers;

    // Memory and in-flight samples.
    let samples = Arc::new(Mutex::new(Samples::new()));
    let sampling = Arc::new(AtomicBool::new(true));
    let sample = {
        let (lanes, filled, samples) = (lanes.clone(), filled.clone(), samples.clone());
        move |last: bool| {
            for l in &lanes {
                l.stats
                    .max_in_flight
                    .fetch_max(l.engine.ops_in_flight() as u64, Ordering::Relaxed);
            }
            let warm = filled.load(Ordering::SeqCst) >= total_workers && start.elapsed() >= warmup;
            let s = Sample {
                t: start.elapsed().as_secs_f64(),
                warm,
                me: mem_of(std::process::id()).unwrap_or_default(),
                target: mem_of(target_pid).unwrap_or_default(),
            };
            lock(&samples).push(s, last);
        }
    };
    let sampler = {
        let (sampling, sample, lanes) = (sampling.clone(), sample.clone(), lanes.clone());
        let json = a.json;
        tokio::spawn(async move {
            let mut i = 0u64;
            while sampling.load(Ordering::SeqCst) {
                sample(false);
                i += 1;
                if !json && i % 40 == 0 {
                    let mut line = format!("  {:>5.0} s:", start.elapsed().as_secs_f64());
                    for l in &lanes {
                        let s = &l.stats;
                        let _ = write!(
                            line,
                            " {} {} done {} failed {} dropped;",
                            l.name,
                            get(&s.completed),
                            get(&s.failed),
                            get(&s.dropped)
                        );
                    }
                    if let Some(m) = mem_of(std::process::id()) {
                        let _ = write!(line, " RSS {}", mib(m.rss));
                    }
                    if let Some(m) = mem_of(target_pid) {
                        let _ = write!(line, ", target {}", mib(m.rss));
                    }
                    println!("{line}");
                    let _ = std::io::stdout().flush();
                }
                tokio::time::sleep(RSS_EVERY).await;
            }
        })
    };

    let mut controllers = Vec::new();
    let mut workers = Vec::new();
    for (lane, lines) in lanes.iter().zip(receivers) {
        let (ptx, prx) = mpsc::unbounded_channel();
        for id in 0..a.workers {
            let w = Worker {
                lane: lane.clone(),
                id,
                rng: Rng::new(seed ^ mix((lane.index * 1000 + id + 1) as u64)),
                // Non-zero, so that every page is resident before the warm-up ends.
                scratch: vec![0x5Au8; slot_len as usize],
                junk: 0x5A,
                seq: 0,
                steps: 0,
            };
            workers.push(tokio::spawn(w.run(ptx.clone())));
        }
        controllers.push(tokio::spawn(controller(
            lane.clone(),
            prx,
            lines,
            Rng::new(seed ^ mix(0xC0DE + lane.index as u64)),
            stop_at,
            Duration::from_secs_f64(a.cycle),
            gone.clone(),
        )));
    }
    // Each controller's waits are bounded; this only guards against a bug in this command.
    let bound = duration + Duration::from_secs(600);
    for c in controllers {
        if tokio::time::timeout(bound, c).await.is_err() {
            v.add(format!("a cycle controller did not end within {bound:?}"));
        }
    }
    let mut scratch = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        match tokio::time::timeout(PARK, w).await {
            Ok(Ok(buf)) => scratch.push(buf),
            Ok(Err(e)) => v.add(format!("worker {i} failed: {e}")),
            Err(_) => v.add(format!("worker {i} did not stop within {PARK:?}")),
        }
    }
    let secs = start.elapsed().as_secs_f64();

    // The end: nothing may stay in flight, and every op is accounted for.
    let mut in_flight = Vec::new();
    for l in &lanes {
        let deadline = Instant::now() + Duration::from_secs(10);
        while l.engine.ops_in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let n = l.engine.ops_in_flight();
        if n > 0 {
            l.violation(format!("{n} ops in flight 10 s after the end"));
        }
        in_flight.push(n);
        let s = &l.stats;
        let (sub, done, failed, dropped) = (
            get(&s.submitted),
            get(&s.completed),
            get(&s.failed),
            get(&s.dropped),
        );
        if sub != done + failed + dropped {
            l.violation(format!(
                "submitted {sub} != completed {done} + failed {failed} + dropped {dropped}"
            ));
        }
    }
    if gone.load(Ordering::SeqCst) {
        v.add("the target process exited during the run".into());
    }
    sampling.store(false, Ordering::SeqCst);
    let _ = sampler.await;
    sample(true);
    let (samples, taken) = {
        let g = lock(&samples);
        (g.v.clone(), g.taken)
    };
    drop(scratch);
    // The fabric initiator maps the target's pool: VmRSS counts the pages of its slots there
    // that it touched since the last reconnect, so it swings by up to their size.
    let swing = if names.contains(&"fabric") {
        region_bytes(1, a.workers, slot_len)
    } else {
        0
    };
    let rss = RssReport {
        samples: taken,
        samples_kept: samples.len(),
        every_ms: RSS_EVERY.as_millis() as u64,
        warmup_s: samples.iter().find(|s| s.warm).map_or(-1.0, |s| s.t),
        fd_bound: FD_GROWTH,
        initiator: proc_mem(&samples, |s| s.me, a.max_rss_growth, swing),
        target: proc_mem(&samples, |s| s.target, a.max_rss_growth, 0),
    };
    if !samples.iter().any(|s| s.warm) {
        v.add("no memory sample after the warm-up (run longer)".into());
    }
    for (who, m) in [("initiator", &rss.initiator), ("target", &rss.target)] {
        for (what, t, bound) in [
            ("VmRSS", &m.vmrss, m.vmrss_bound),
            ("RssAnon", &m.rss_anon, m.rss_anon_bound),
        ] {
            if t.growth > bound as i64 {
                v.add(format!(
                    "{who} {what} grew from {} after the warm-up to {} at the end (bound +{})",
                    mib(t.after_warmup),
                    mib(t.last),
                    mib(bound)
                ));
            }
        }
        if m.fds.growth > FD_GROWTH as i64 {
            v.add(format!(
                "{who} open fds grew from {} after the warm-up to {} at the end (bound +{FD_GROWTH})",
                m.fds.after_warmup, m.fds.last
            ));
        }
    }

    let report_lanes: Vec<LaneReport> = lanes
        .iter()
        .zip(&in_flight)
        .map(|(l, &n)| lane_report(l, secs, n))
        .collect();
    for l in &lanes {
        disconnect(l).await;
        l.engine.shutdown(Duration::from_secs(1)).await;
    }
    target.stop();

    let count = v.count.load(Ordering::Relaxed);
    let report = Report {
        ok: count == 0,
        seed,
        seconds: secs,
        max_size: a.max_size,
        target_pid,
        region_bytes_each: per_region,
        lanes: report_lanes,
        rss,
        violation_count: count,
        violations: lock(&v.list).clone(),
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| CliError(e.to_string()))?
        );
    } else {
        print_report(&report);
    }
    if count > 0 {
        let first = report.violations.first().cloned().unwrap_or_default();
        return Err(fail!(
            "soak failed: {count} violation(s); the first: {first}"
        ));
    }
    Ok(())
}

/// Writes every page of a region once, so that its memory is resident before the baseline.
fn touch(r: &Region) -> CliResult {
    let zero = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < r.len() {
        let n = (r.len() - off).min(zero.len() as u64) as usize;
        r.write_at(off, &zero[..n])?;
        off += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse() {
        let l = "SOAK tag=tcp SYNC n=3 seq_received=10 verified=2";
        assert_eq!(field(l, "n"), Some(3));
        assert_eq!(field(l, "seq_received"), Some(10));
        assert_eq!(field(l, "missing"), None);
    }
}
