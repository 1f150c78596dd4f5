//! The arguments of `hixl soak`, and the plan of a run they are checked into.

use hixl_cli::fail;

use super::pattern::mix;
use super::{region_bytes, SLOT_PAD};
use crate::util::{parse_size, CliResult};

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

/// What a run is made of, from valid arguments.
pub(super) struct Plan {
    /// One lane per transport.
    pub(super) names: &'static [&'static str],
    /// Seed of the workload.
    pub(super) seed: u64,
    /// Bytes of a slot: the largest descriptor at any offset up to [`SLOT_PAD`].
    pub(super) slot_len: u64,
    /// Bytes needed in each target region.
    pub(super) per_region: u64,
}

impl Plan {
    /// Checks the arguments and draws the seed when none is given.
    pub(super) fn new(a: &Args) -> CliResult<Plan> {
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
        Ok(Plan {
            names,
            seed,
            slot_len,
            per_region: region_bytes(names.len(), a.workers, slot_len),
        })
    }
}
