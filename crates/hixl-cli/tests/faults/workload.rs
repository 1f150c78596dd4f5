//! The workload: workers that write slots and read them back while a fault is injected.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hixl::{Error, OpDesc, Peer, Region};

use crate::patterns::{pattern, splitmix};
use crate::{LOCAL_BG, REMOTE_BG, WORKERS};

/// Slots of `descs` descriptors of `dlen` bytes, with `gap` guard bytes around each, then
/// optionally one `big` range; the last two slots are kept for health checks and probes.
/// The initiator's region is twice as large: write sources at the target's offsets, then
/// read-back buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) descs: u64,
    pub(crate) dlen: u64,
    pub(crate) gap: u64,
    pub(crate) slots: u64,
    pub(crate) big: u64,
}

impl Layout {
    pub(crate) fn slot_len(&self) -> u64 {
        self.descs * (self.dlen + self.gap) + self.gap
    }
    pub(crate) fn big_off(&self) -> u64 {
        self.slots * self.slot_len() + self.gap
    }
    /// The target's region size.
    pub(crate) fn mem(&self) -> u64 {
        self.big_off() + self.big + self.gap
    }
    pub(crate) fn ranges(&self, slot: u64) -> Vec<u64> {
        (0..self.descs)
            .map(|j| slot * self.slot_len() + self.gap + j * (self.dlen + self.gap))
            .collect()
    }
    pub(crate) fn health_slot(&self) -> u64 {
        self.slots - 1
    }
    /// For single transfers probing a failed link: never used by workers nor health checks,
    /// so a late landing there cannot race a check.
    pub(crate) fn probe_slot(&self) -> u64 {
        self.slots - 2
    }
}

/// What may be in one slot's ranges: any of these patterns, byte by byte.
#[derive(Clone, Debug)]
pub(crate) struct Fate {
    /// In the target's region.
    pub(crate) remote: Vec<u64>,
    /// In the initiator's write-source ranges (only ever filled by this side).
    pub(crate) src: Vec<u64>,
    /// In the initiator's read-back ranges.
    pub(crate) dst: Vec<u64>,
    /// A transfer on the slot failed: its bytes may still land, so it is not used again.
    pub(crate) poisoned: bool,
}

impl Fate {
    pub(crate) fn new() -> Fate {
        Fate {
            remote: vec![REMOTE_BG],
            src: vec![LOCAL_BG],
            dst: vec![LOCAL_BG],
            poisoned: false,
        }
    }
}

/// One transfer's outcome.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) write: bool,
    pub(crate) bytes: u64,
    /// Since the phase started.
    pub(crate) posted: Duration,
    pub(crate) took: Duration,
    pub(crate) err: Option<Error>,
}

impl Op {
    pub(crate) fn end(&self) -> Duration {
        self.posted + self.took
    }
}

/// Everything a phase of workers needs.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) peer: Peer,
    pub(crate) local: Region,
    pub(crate) kv: u64,
    pub(crate) lay: Layout,
    pub(crate) start: Instant,
    /// Workers post no new transfer after this (since `start`).
    pub(crate) stop_at: Duration,
    pub(crate) timeout: Duration,
    pub(crate) seed: u64,
    /// Transfers posted and not finished yet.
    pub(crate) outstanding: Arc<AtomicU64>,
    /// Transfers posted so far.
    pub(crate) posted: Arc<AtomicU64>,
}

pub(crate) fn descs(c: &Ctx, slot: u64, local_base: u64) -> Vec<OpDesc> {
    c.lay
        .ranges(slot)
        .into_iter()
        .map(|o| OpDesc::new(c.local.addr() + local_base + o, c.kv + o, c.lay.dlen))
        .collect()
}

/// Writes slot `slot` with pattern `seed`, then reads it back into the second half of the
/// local region and checks it. Updates `fate` and records each transfer in `ops`.
pub(crate) async fn write_and_read_back(
    c: &Ctx,
    slot: u64,
    seed: u64,
    fate: &mut Fate,
    ops: &mut Vec<Op>,
) {
    let (lay, mem) = (c.lay, c.lay.mem());
    let bytes = lay.descs * lay.dlen;
    for o in lay.ranges(slot) {
        c.local
            .write_at(o, &pattern(seed, o, lay.dlen as usize))
            .unwrap();
    }
    fate.src = vec![seed];
    let posted = c.start.elapsed();
    c.outstanding.fetch_add(1, Ordering::SeqCst);
    c.posted.fetch_add(1, Ordering::SeqCst);
    let r = c.peer.write(&descs(c, slot, 0)).timeout(c.timeout).await;
    c.outstanding.fetch_sub(1, Ordering::SeqCst);
    ops.push(Op {
        write: true,
        bytes,
        posted,
        took: c.start.elapsed() - posted,
        err: r.err(),
    });
    if ops.last().is_some_and(|o| o.err.is_some()) {
        fate.remote.push(seed);
        fate.poisoned = true;
        return;
    }
    fate.remote = vec![seed];
    let junk = !seed;
    for o in lay.ranges(slot) {
        c.local
            .write_at(mem + o, &pattern(junk, o, lay.dlen as usize))
            .unwrap();
    }
    fate.dst = vec![junk];
    let posted = c.start.elapsed();
    c.outstanding.fetch_add(1, Ordering::SeqCst);
    c.posted.fetch_add(1, Ordering::SeqCst);
    let r = c.peer.read(&descs(c, slot, mem)).timeout(c.timeout).await;
    c.outstanding.fetch_sub(1, Ordering::SeqCst);
    ops.push(Op {
        write: false,
        bytes,
        posted,
        took: c.start.elapsed() - posted,
        err: r.err(),
    });
    if ops.last().is_some_and(|o| o.err.is_some()) {
        fate.dst.push(seed);
        fate.poisoned = true;
        return;
    }
    for o in lay.ranges(slot) {
        let mut got = vec![0u8; lay.dlen as usize];
        c.local.read_at(mem + o, &mut got).unwrap();
        let want = pattern(seed, o, lay.dlen as usize);
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "a completed write+read of slot {slot} moved wrong bytes: offset {} is {:#04x}, expected {:#04x}",
                o + i as u64,
                got[i],
                want[i]
            );
        }
    }
    fate.dst = vec![seed];
}

/// One worker: loops over its own slots (every `WORKERS`-th one) until `stop_at`.
pub(crate) async fn worker(c: Ctx, k: u64) -> (Vec<Op>, BTreeMap<u64, Fate>) {
    let mine: Vec<u64> = (0..c.lay.probe_slot())
        .filter(|s| s % WORKERS == k)
        .collect();
    let mut fates: BTreeMap<u64, Fate> = BTreeMap::new();
    let mut ops = Vec::new();
    let mut next = 0usize;
    for iter in 0u64.. {
        if c.start.elapsed() >= c.stop_at {
            break;
        }
        let Some(slot) = (0..mine.len())
            .map(|i| mine[(next + i) % mine.len()])
            .find(|s| !fates.get(s).is_some_and(|f| f.poisoned))
        else {
            break; // every slot of this worker has had a failure
        };
        next = mine.iter().position(|&s| s == slot).unwrap_or(0) + 1;
        let seed = splitmix(c.seed ^ (k << 40) ^ iter);
        let fate = fates.entry(slot).or_insert_with(Fate::new);
        write_and_read_back(&c, slot, seed, fate, &mut ops).await;
    }
    (ops, fates)
}

/// The outcome of a phase of workers, with the fault injected during it.
pub(crate) struct Phase {
    pub(crate) ops: Vec<Op>,
    pub(crate) fates: BTreeMap<u64, Fate>,
    /// When the fault was injected.
    pub(crate) fault: Option<FaultTimes>,
    /// Wall time of the phase.
    pub(crate) took: Duration,
}

type Action = Box<dyn FnOnce() + Send>;

/// When a fault was injected, since the phase start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FaultTimes {
    /// The target was paused (every thread stopped).
    pub(crate) paused: Duration,
    /// The fault action started.
    pub(crate) began: Duration,
    /// The fault action had taken effect.
    pub(crate) done: Duration,
}

impl FaultTimes {
    /// Transfers outstanding when the fault struck.
    pub(crate) fn in_flight<'a>(&self, p: &'a Phase) -> Vec<&'a Op> {
        p.ops
            .iter()
            .filter(|o| o.posted < self.began && o.end() > self.began)
            .collect()
    }
    /// Transfers posted while the target was paused, before the fault: it cannot have
    /// answered them, so they must fail.
    pub(crate) fn unanswered<'a>(&self, p: &'a Phase) -> Vec<&'a Op> {
        p.ops
            .iter()
            .filter(|o| o.posted > self.paused && o.posted < self.began)
            .collect()
    }
    /// Transfers posted once the fault was in effect.
    pub(crate) fn after<'a>(&self, p: &'a Phase) -> Vec<&'a Op> {
        p.ops.iter().filter(|o| o.posted > self.done).collect()
    }
}

/// A fault to inject during a phase.
pub(crate) struct Fault {
    /// When, since the phase start.
    pub(crate) at: Duration,
    /// The target process, paused around the action.
    pub(crate) pid: u32,
    pub(crate) action: Action,
    /// Whether to resume the target afterwards (not after killing it: its pid may be reused).
    pub(crate) resume: bool,
}

pub(crate) fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).unwrap();
    // SAFETY: kill(2) only sends a signal, to a child process this test started and still owns.
    let r = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        r,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Waits until every thread of `pid` has stopped: SIGSTOP takes effect only once a thread of
/// the target handles it, and on a loaded machine its other threads may run (and answer
/// transfers) meanwhile.
pub(crate) fn wait_stopped(pid: u32) {
    let t0 = Instant::now();
    loop {
        let tasks: Vec<char> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
            .filter_map(|st| st.rsplit_once(')')?.1.trim_start().chars().next())
            .collect();
        if !tasks.is_empty() && tasks.iter().all(|&c| c == 'T' || c == 't') {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the target did not stop: thread states {tasks:?}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Injects `f` while transfers are certainly in flight: a cut or a kill that lands between
/// two transfers of a fast link would prove nothing, so the target is first paused (SIGSTOP)
/// until every worker has a transfer outstanding that the target cannot have answered (a
/// transfer outstanding at the pause may have its answer already in our socket, unread on a
/// loaded machine: such a one completes within moments, and its worker posts another), then
/// the action runs, then the target resumes (SIGCONT).
pub(crate) fn inject(
    start: Instant,
    counters: &(Arc<AtomicU64>, Arc<AtomicU64>),
    f: Fault,
) -> FaultTimes {
    let (outstanding, posted) = counters;
    signal(f.pid, libc::SIGSTOP);
    wait_stopped(f.pid);
    let paused = start.elapsed();
    let before = posted.load(Ordering::SeqCst);
    let t0 = Instant::now();
    // Every worker outstanding, and either one posted since the pause or none finished for
    // 100 ms (an answer already in our socket is read well within that).
    let mut full_since: Option<Instant> = None;
    while t0.elapsed() < Duration::from_secs(2) {
        if outstanding.load(Ordering::SeqCst) < WORKERS {
            full_since = None;
        } else if posted.load(Ordering::SeqCst) != before
            || full_since.get_or_insert_with(Instant::now).elapsed() >= Duration::from_millis(100)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let began = start.elapsed();
    (f.action)();
    let done = start.elapsed();
    if f.resume {
        signal(f.pid, libc::SIGCONT);
    }
    FaultTimes {
        paused,
        began,
        done,
    }
}

/// Runs `WORKERS` workers until `c.stop_at`, injecting `fault` (if any) meanwhile.
pub(crate) async fn run_phase(c: Ctx, fault: Option<Fault>) -> Phase {
    let workers: Vec<_> = (0..WORKERS)
        .map(|k| tokio::spawn(worker(c.clone(), k)))
        .collect();
    let (start, counters) = (c.start, (c.outstanding.clone(), c.posted.clone()));
    let fault = async move {
        let f = fault?;
        tokio::time::sleep_until((start + f.at).into()).await;
        Some(
            tokio::task::spawn_blocking(move || inject(start, &counters, f))
                .await
                .unwrap(),
        )
    };
    let (results, fault) = futures::future::join(futures::future::join_all(workers), fault).await;
    let mut ops = Vec::new();
    let mut fates = BTreeMap::new();
    for r in results {
        let (o, f) = r.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        ops.extend(o);
        fates.extend(f);
    }
    Phase {
        ops,
        fates,
        fault,
        took: start.elapsed(),
    }
}
