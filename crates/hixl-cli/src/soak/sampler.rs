//! Samples of both processes' memory and of the ops in flight, taken every [`RSS_EVERY`]
//! while the lanes run, with a progress line every 40 samples.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::lane::Lane;
use super::report::{mem_of, mib, Sample, Samples};
use super::state::{get, lock};
use super::RSS_EVERY;

/// What a sample looks at.
pub(super) struct Probe {
    /// The lanes, whose engines' ops in flight are recorded.
    pub(super) lanes: Vec<Arc<Lane>>,
    /// Workers that have filled their memory once.
    pub(super) filled: Arc<AtomicUsize>,
    /// The samples so far.
    pub(super) samples: Mutex<Samples>,
    /// When the run started.
    pub(super) start: Instant,
    /// How long after the start samples are not yet warm.
    pub(super) warmup: Duration,
    /// Workers of all lanes.
    pub(super) total_workers: usize,
    /// The target's process id.
    pub(super) target_pid: u32,
}

impl Probe {
    /// Takes one sample; `last` ones are always kept.
    fn sample(&self, last: bool) {
        for l in &self.lanes {
            l.stats
                .max_in_flight
                .fetch_max(l.engine.ops_in_flight() as u64, Ordering::Relaxed);
        }
        let warm = self.filled.load(Ordering::SeqCst) >= self.total_workers
            && self.start.elapsed() >= self.warmup;
        let s = Sample {
            t: self.start.elapsed().as_secs_f64(),
            warm,
            me: mem_of(std::process::id()).unwrap_or_default(),
            target: mem_of(self.target_pid).unwrap_or_default(),
        };
        lock(&self.samples).push(s, last);
    }

    /// The progress line: each lane's op counts and both processes' resident memory.
    fn progress(&self) {
        let mut line = format!("  {:>5.0} s:", self.start.elapsed().as_secs_f64());
        for l in &self.lanes {
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
        if let Some(m) = mem_of(self.target_pid) {
            let _ = write!(line, ", target {}", mib(m.rss));
        }
        println!("{line}");
        let _ = std::io::stdout().flush();
    }
}

/// The task that samples until stopped.
pub(super) struct Sampler {
    probe: Arc<Probe>,
    sampling: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling; with `json`, without progress lines.
    pub(super) fn start(probe: Probe, json: bool) -> Sampler {
        let probe = Arc::new(probe);
        let sampling = Arc::new(AtomicBool::new(true));
        let task = {
            let (sampling, probe) = (sampling.clone(), probe.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while sampling.load(Ordering::SeqCst) {
                    probe.sample(false);
                    i += 1;
                    if !json && i % 40 == 0 {
                        probe.progress();
                    }
                    tokio::time::sleep(RSS_EVERY).await;
                }
            })
        };
        Sampler {
            probe,
            sampling,
            task,
        }
    }

    /// Stops sampling, takes the last sample, and returns the samples kept and the number
    /// taken.
    pub(super) async fn stop(self) -> (Vec<Sample>, u64) {
        self.sampling.store(false, Ordering::SeqCst);
        let _ = self.task.await;
        self.probe.sample(true);
        let g = lock(&self.probe.samples);
        (g.v.clone(), g.taken)
    }
}
