//! A lane: one transport's initiator engine, its link to the target and the models of its
//! workers' memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use hixl::{Engine, HostBuffer, Peer, Region};
use hixl_cli::fail;
use tokio::sync::watch;

use super::args::{Args, Plan};
use super::segs::Segs;
use super::state::{lock, Stats, Violations};
use super::{CHUNK, CONNECT_TIMEOUT, LOCAL_SLOTS, REGIONS, REMOTE_SLOTS};
use crate::util::CliResult;

/// What became of a generation, for telling what stale bytes are.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fate {
    pub(super) gen: u64,
    pub(super) what: &'static str,
    pub(super) epoch: u64,
}

pub(super) struct Slot {
    pub(super) region: u8,
    /// Offset of the slot in its region.
    pub(super) base: u64,
    pub(super) segs: Segs,
}

/// One worker's knowledge of its memory.
pub(super) struct Model {
    pub(super) remote: Vec<Slot>,
    pub(super) local_tainted: [bool; LOCAL_SLOTS],
    pub(super) history: VecDeque<Fate>,
}

/// What the workers of a lane are to do; the number is the cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Run(u64),
    Pause(u64),
    Stop,
}

/// One transport: its initiator engine, link and workers' models.
pub(super) struct Lane {
    pub(super) name: &'static str,
    pub(super) index: usize,
    pub(super) workers: usize,
    pub(super) engine: Engine,
    pub(super) local: Region,
    pub(super) target: String,
    /// Start addresses of the target's regions, in [`REGIONS`] order.
    pub(super) remote: [u64; 2],
    pub(super) route: Mutex<String>,
    pub(super) peer: RwLock<Option<Peer>>,
    pub(super) phase: watch::Sender<Phase>,
    /// The link is being cut: transfers may fail with the link's error.
    pub(super) cutting: AtomicBool,
    pub(super) epoch: AtomicU64,
    pub(super) models: Vec<Mutex<Model>>,
    pub(super) stats: Stats,
    pub(super) v: Arc<Violations>,
    pub(super) gens: Arc<AtomicU64>,
    pub(super) slot_len: u64,
    pub(super) max_size: u64,
    pub(super) filled: Arc<AtomicUsize>,
}

impl Lane {
    /// Region and offset of worker `w`'s remote slot `j`.
    pub(super) fn place(&self, w: usize, j: usize) -> (u8, u64) {
        let per_region = REMOTE_SLOTS / 2;
        let idx = (self.index * self.workers + w) * per_region + j / 2;
        ((j % 2) as u8, idx as u64 * self.slot_len)
    }

    pub(super) fn model(&self, w: usize) -> MutexGuard<'_, Model> {
        lock(&self.models[w])
    }

    pub(super) fn peer(&self) -> Option<Peer> {
        self.peer.read().ok().and_then(|p| p.clone())
    }

    pub(super) fn violation(&self, what: String) {
        self.v.add(format!("{}: {what}", self.name));
    }
}

/// Builds one lane per transport of the plan: its engine and local memory (touched, so that
/// it is resident before the baseline), its first link to the target and its workers' models.
pub(super) async fn open_lanes(
    a: &Args,
    plan: &Plan,
    target: &str,
    v: &Arc<Violations>,
    filled: &Arc<AtomicUsize>,
) -> CliResult<Vec<Arc<Lane>>> {
    let (slot_len, per_region) = (plan.slot_len, plan.per_region);
    let gens = Arc::new(AtomicU64::new(1));
    let mut lanes = Vec::new();
    for (index, &name) in plan.names.iter().enumerate() {
        let engine = Engine::builder("127.0.0.1")
            .option("hixl.Transport", name)
            .option("hixl.TcpChunkBytes", CHUNK)
            .build()
            .await?;
        let local_len = (a.workers * LOCAL_SLOTS) as u64 * slot_len;
        let local = engine.register(HostBuffer::zeroed(local_len as usize)?)?;
        touch(&local)?;
        let peer = engine
            .connect(target, CONNECT_TIMEOUT)
            .await
            .map_err(|e| fail!("{name}: cannot connect to the target: {e} [{}]", e.status()))?;
        let remote = remote_regions(&peer, per_region)?;
        let (phase, _) = watch::channel(Phase::Run(0));
        let lane = Lane {
            name,
            index,
            workers: a.workers,
            engine,
            local,
            target: target.to_string(),
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
        let models = models(&lane);
        lanes.push(Arc::new(Lane { models, ..lane }));
    }
    Ok(lanes)
}

/// Start addresses of the target's regions, in [`REGIONS`] order, each checked to hold
/// `per_region` bytes.
fn remote_regions(peer: &Peer, per_region: u64) -> CliResult<[u64; 2]> {
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
    Ok(remote)
}

/// The models of a new lane's workers: each remote slot in its place, its content unknown.
fn models(lane: &Lane) -> Vec<Mutex<Model>> {
    (0..lane.workers)
        .map(|w| {
            Mutex::new(Model {
                remote: (0..REMOTE_SLOTS)
                    .map(|j| {
                        let (region, base) = lane.place(w, j);
                        Slot {
                            region,
                            base,
                            segs: Segs::new(lane.slot_len),
                        }
                    })
                    .collect(),
                local_tainted: [false; LOCAL_SLOTS],
                history: VecDeque::new(),
            })
        })
        .collect()
}

/// Writes every page of a region once, so that its memory is resident before the baseline.
pub(super) fn touch(r: &Region) -> CliResult {
    let zero = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < r.len() {
        let n = (r.len() - off).min(zero.len() as u64) as usize;
        r.write_at(off, &zero[..n])?;
        off += n as u64;
    }
    Ok(())
}
