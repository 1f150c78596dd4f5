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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::{human, CliResult};

mod args;
mod cycle;
mod finish;
mod lane;
mod launch;
mod pattern;
mod report;
mod sampler;
mod segs;
mod state;
mod target;
mod transfer;
mod verify;
mod worker;

pub use args::Args;
use args::Plan;
use cycle::{disconnect, drive};
use lane::{open_lanes, touch, Lane};
use report::{lane_report, LaneReport, Samples};
use sampler::{Probe, Sampler};
use state::{get, inc, lock, Violations};
pub use target::{serve, ServeArgs};
use verify::hex;

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

/// Bytes needed in each target region: every lane's workers' slots in it.
fn region_bytes(lanes: usize, workers: usize, slot_len: u64) -> u64 {
    (lanes * workers * (REMOTE_SLOTS / 2)) as u64 * slot_len
}
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

/// Runs `hixl soak`: checks the arguments, starts the target, opens a lane per transport, runs
/// the lanes' workers and cycles for the duration, then checks the end and reports.
pub async fn run(a: Args) -> CliResult {
    let plan = Plan::new(&a)?;
    let launched = launch::launch(&plan)?;
    let (target, gone) = (launched.target, launched.gone);
    let target_pid = target.pid;
    let v = Arc::new(Violations::default());
    let filled = Arc::new(AtomicUsize::new(0));
    let lanes = open_lanes(&a, &plan, &target.engine, &v, &filled).await?;
    if !a.json {
        println!(
            "hixl soak: {} s, seed {}, transports {}, {} workers each, sizes 1 B..{}, target pid {target_pid}",
            a.duration,
            plan.seed,
            plan.names.join("+"),
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
    let sampler = Sampler::start(
        Probe {
            lanes: lanes.clone(),
            filled,
            samples: Mutex::new(Samples::new()),
            start,
            warmup: (duration / 10).max(Duration::from_secs(1)),
            total_workers: plan.names.len() * a.workers,
            target_pid,
        },
        a.json,
    );
    let progress = crate::progress::Progress::timed("hixl soak", duration, a.json);
    let scratch = drive(&a, &plan, &lanes, launched.receivers, stop_at, &gone, &v).await;
    drop(progress);
    let secs = start.elapsed().as_secs_f64();

    let in_flight = finish::account(&lanes).await;
    if gone.load(Ordering::SeqCst) {
        v.add("the target process exited during the run".into());
    }
    let (samples, taken) = sampler.stop().await;
    drop(scratch);
    let rss = finish::rss_report(&a, &plan, &samples, taken, &v);
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
    finish::conclude(&a, &plan, secs, target_pid, report_lanes, rss, &v)
}
