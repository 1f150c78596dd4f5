//! What `hixl soak` measures and prints: latencies, memory samples and their trends, and the
//! report (a summary, or JSON).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use serde::Serialize;

use super::{get, inc, lock, Lane, REGIONS};
use crate::util::human;

/// Latencies of awaited transfers: 8 buckets per power of two of microseconds.
pub(super) struct Latency([AtomicU64; 8 * 40]);

impl Default for Latency {
    fn default() -> Latency {
        Latency(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Latency {
    pub(super) fn bucket(us: u64) -> usize {
        if us < 8 {
            return us as usize;
        }
        let e = 63 - us.leading_zeros() as usize; // 3..
        let sub = ((us >> (e - 3)) & 7) as usize;
        ((e - 2) * 8 + sub).min(8 * 40 - 1)
    }
    /// The upper end of bucket `b`, in microseconds.
    pub(super) fn upper(b: usize) -> u64 {
        if b < 8 {
            return b as u64 + 1;
        }
        let (e, sub) = (b / 8 + 2, (b % 8) as u64);
        ((8 + sub + 1) << (e - 3)) - 1
    }
    pub(super) fn record(&self, d: Duration) {
        inc(&self.0[Self::bucket(d.as_micros() as u64)], 1);
    }
    /// The `p` quantile (0..=1), as the upper end of its bucket, in milliseconds.
    pub(super) fn quantile_ms(&self, p: f64) -> f64 {
        let counts: Vec<u64> = self.0.iter().map(get).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let want = ((total as f64 * p).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::upper(b) as f64 / 1000.0;
            }
        }
        0.0
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Mem {
    pub(super) rss: u64,
    pub(super) anon: u64,
    pub(super) shmem: u64,
    pub(super) vmsize: u64,
    pub(super) fds: u64,
}

/// VmRSS, RssAnon, RssShmem and VmSize of a process from /proc/<pid>/status, and its open fds.
pub(super) fn mem_of(pid: u32) -> Option<Mem> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> Option<u64> {
        let l = s.lines().find(|l| l.starts_with(key))?;
        Some(l.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some(Mem {
        rss: kb("VmRSS:")?,
        anon: kb("RssAnon:").unwrap_or(0),
        shmem: kb("RssShmem:").unwrap_or(0),
        vmsize: kb("VmSize:").unwrap_or(0),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64),
    })
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    pub(super) t: f64,
    pub(super) warm: bool,
    pub(super) me: Mem,
    pub(super) target: Mem,
}

/// Samples kept at most, so that a long soak does not grow its own memory.
pub(super) const KEEP_SAMPLES: usize = 4096;

/// The samples of a run. When full, every other one is dropped (the first, and the first
/// after the warm-up, stay) and from then on only every `stride`-th sample is kept.
pub(super) struct Samples {
    pub(super) v: Vec<Sample>,
    pub(super) stride: u64,
    pub(super) taken: u64,
    pub(super) have_warm: bool,
}

impl Samples {
    pub(super) fn new() -> Samples {
        Samples {
            v: Vec::with_capacity(KEEP_SAMPLES),
            stride: 1,
            taken: 0,
            have_warm: false,
        }
    }

    /// Adds a sample; `last` ones are always kept.
    pub(super) fn push(&mut self, s: Sample, last: bool) {
        self.taken += 1;
        let first_warm = s.warm && !self.have_warm;
        if !last && !first_warm && self.taken % self.stride != 0 {
            return;
        }
        if self.v.len() >= KEEP_SAMPLES {
            let keep = self.v.iter().position(|x| x.warm);
            let mut i = 0;
            self.v.retain(|_| {
                let k = i % 2 == 0 || Some(i) == keep;
                i += 1;
                k
            });
            self.stride *= 2;
        }
        self.have_warm |= s.warm;
        self.v.push(s);
    }
}

/// The course of one figure (bytes, or a count of fds) over the run.
#[derive(Serialize, Debug, Clone, Copy, Default)]
pub(super) struct Trend {
    pub(super) first: u64,
    pub(super) after_warmup: u64,
    pub(super) min: u64,
    pub(super) max: u64,
    pub(super) last: u64,
    /// `last - after_warmup`.
    pub(super) growth: i64,
    /// Least-squares slope over the samples after the warm-up, in units per minute.
    pub(super) per_min: f64,
}

pub(super) fn trend(samples: &[Sample], f: impl Fn(&Sample) -> u64) -> Trend {
    let Some(first) = samples.first() else {
        return Trend::default();
    };
    let warm: Vec<&Sample> = samples.iter().filter(|s| s.warm).collect();
    let base = warm.first().map_or(f(first), |s| f(s));
    let last = samples.last().map_or(0, &f);
    let n = warm.len() as f64;
    let per_min = if warm.len() >= 2 {
        let mt = warm.iter().map(|s| s.t).sum::<f64>() / n;
        let my = warm.iter().map(|s| f(s) as f64).sum::<f64>() / n;
        let sxy: f64 = warm.iter().map(|s| (s.t - mt) * (f(s) as f64 - my)).sum();
        let sxx: f64 = warm.iter().map(|s| (s.t - mt).powi(2)).sum();
        if sxx > 0.0 {
            sxy / sxx * 60.0
        } else {
            0.0
        }
    } else {
        0.0
    };
    Trend {
        first: f(first),
        after_warmup: base,
        min: samples.iter().map(&f).min().unwrap_or(0),
        max: samples.iter().map(&f).max().unwrap_or(0),
        last,
        growth: last as i64 - base as i64,
        per_min,
    }
}

#[derive(Serialize, Debug)]
pub(super) struct LaneReport {
    pub(super) transport: String,
    pub(super) route: String,
    pub(super) workers: usize,
    pub(super) submitted: u64,
    pub(super) completed: u64,
    pub(super) failed: u64,
    pub(super) dropped: u64,
    pub(super) failed_by_kind: BTreeMap<String, u64>,
    pub(super) descriptors: u64,
    pub(super) writes_completed: u64,
    pub(super) reads_completed: u64,
    pub(super) bytes_written: u64,
    pub(super) bytes_read: u64,
    pub(super) bytes_verified: u64,
    pub(super) tiny_timeouts: u64,
    pub(super) tiny_timeouts_expired: u64,
    pub(super) notifies_sent: u64,
    pub(super) notifies_acked: u64,
    pub(super) notifies_failed: u64,
    pub(super) notify_failed_by_kind: BTreeMap<String, u64>,
    /// The first failure of each kind.
    pub(super) failure_examples: BTreeMap<String, String>,
    pub(super) target_seq_received: u64,
    pub(super) target_seq_out_of_order: u64,
    pub(super) target_checks: u64,
    pub(super) target_verified: u64,
    pub(super) target_verified_bytes: u64,
    pub(super) cuts_abrupt: u64,
    pub(super) cuts_abrupt_fast_reconnect: u64,
    pub(super) cuts_graceful: u64,
    pub(super) connects: u64,
    pub(super) connect_retries: u64,
    pub(super) max_drain_ms: f64,
    pub(super) starved_steps: u64,
    pub(super) taint_reclaims: u64,
    pub(super) latency_p50_ms: f64,
    pub(super) latency_p99_ms: f64,
    pub(super) latency_max_ms: f64,
    pub(super) max_ops_in_flight: u64,
    pub(super) ops_in_flight_at_end: usize,
    pub(super) transfers_per_s: f64,
    pub(super) mb_per_s: f64,
}

#[derive(Serialize, Debug)]
pub(super) struct ProcMem {
    pub(super) vmrss: Trend,
    pub(super) rss_anon: Trend,
    pub(super) rss_shmem: Trend,
    pub(super) vmsize: Trend,
    pub(super) fds: Trend,
    /// How much VmRSS and RssAnon may grow after the warm-up.
    pub(super) vmrss_bound: u64,
    pub(super) rss_anon_bound: u64,
}

#[derive(Serialize, Debug)]
pub(super) struct RssReport {
    pub(super) samples: u64,
    pub(super) samples_kept: usize,
    pub(super) every_ms: u64,
    pub(super) warmup_s: f64,
    pub(super) fd_bound: u64,
    pub(super) initiator: ProcMem,
    pub(super) target: ProcMem,
}

pub(super) fn proc_mem(
    samples: &[Sample],
    f: fn(&Sample) -> Mem,
    bound: u64,
    swing: u64,
) -> ProcMem {
    ProcMem {
        vmrss: trend(samples, |s| f(s).rss),
        rss_anon: trend(samples, |s| f(s).anon),
        rss_shmem: trend(samples, |s| f(s).shmem),
        vmsize: trend(samples, |s| f(s).vmsize),
        fds: trend(samples, |s| f(s).fds),
        vmrss_bound: bound + swing,
        rss_anon_bound: bound,
    }
}

#[derive(Serialize, Debug)]
pub(super) struct Report {
    pub(super) ok: bool,
    pub(super) seed: u64,
    pub(super) seconds: f64,
    pub(super) max_size: u64,
    pub(super) target_pid: u32,
    pub(super) region_bytes_each: u64,
    pub(super) lanes: Vec<LaneReport>,
    pub(super) rss: RssReport,
    pub(super) violation_count: u64,
    pub(super) violations: Vec<String>,
}

pub(super) fn lane_report(lane: &Lane, secs: f64, in_flight: usize) -> LaneReport {
    let s = &lane.stats;
    let moved = get(&s.bytes_written) + get(&s.bytes_read);
    LaneReport {
        transport: lane.name.to_string(),
        route: lock(&lane.route).clone(),
        workers: lane.workers,
        submitted: get(&s.submitted),
        completed: get(&s.completed),
        failed: get(&s.failed),
        dropped: get(&s.dropped),
        failed_by_kind: lock(&s.failed_by_kind).clone(),
        descriptors: get(&s.descriptors),
        writes_completed: get(&s.writes),
        reads_completed: get(&s.reads),
        bytes_written: get(&s.bytes_written),
        bytes_read: get(&s.bytes_read),
        bytes_verified: get(&s.verified_bytes),
        tiny_timeouts: get(&s.tiny_timeouts),
        tiny_timeouts_expired: get(&s.tiny_expired),
        notifies_sent: get(&s.notifies_sent),
        notifies_acked: get(&s.notifies_acked),
        notifies_failed: get(&s.notifies_failed),
        notify_failed_by_kind: lock(&s.notify_failed_by_kind).clone(),
        failure_examples: lock(&s.examples).clone(),
        target_seq_received: get(&s.target_seq_received),
        target_seq_out_of_order: get(&s.target_seq_out_of_order),
        target_checks: get(&s.target_checks),
        target_verified: get(&s.target_verified),
        target_verified_bytes: get(&s.target_verified_bytes),
        cuts_abrupt: get(&s.cut_abrupt),
        cuts_abrupt_fast_reconnect: get(&s.cut_abrupt_fast),
        cuts_graceful: get(&s.cut_graceful),
        connects: get(&s.connects),
        connect_retries: get(&s.connect_retries),
        max_drain_ms: get(&s.max_drain_us) as f64 / 1000.0,
        starved_steps: get(&s.starved),
        taint_reclaims: get(&s.reclaims),
        latency_p50_ms: s.latency.quantile_ms(0.5),
        latency_p99_ms: s.latency.quantile_ms(0.99),
        latency_max_ms: s.latency.quantile_ms(1.0),
        max_ops_in_flight: get(&s.max_in_flight),
        ops_in_flight_at_end: in_flight,
        transfers_per_s: get(&s.completed) as f64 / secs,
        mb_per_s: moved as f64 / secs / 1e6,
    }
}

pub(super) fn kinds(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

pub(super) fn print_trend(who: &str, t: &Trend) {
    println!(
        "  {who:<20} first {}, after warm-up {}, min {}, max {}, last {} ({:+.1} MiB; trend {:+.2} MiB/min)",
        mib(t.first),
        mib(t.after_warmup),
        mib(t.min),
        mib(t.max),
        mib(t.last),
        t.growth as f64 / 1048576.0,
        t.per_min / 1048576.0
    );
}

pub(super) fn print_mem(who: &str, m: &ProcMem) {
    print_trend(&format!("{who} VmRSS"), &m.vmrss);
    print_trend(&format!("{who} RssAnon"), &m.rss_anon);
    print_trend(&format!("{who} RssShmem"), &m.rss_shmem);
    print_trend(&format!("{who} VmSize"), &m.vmsize);
    println!(
        "  {:<20} first {}, after warm-up {}, max {}, last {}",
        format!("{who} open fds"),
        m.fds.first,
        m.fds.after_warmup,
        m.fds.max,
        m.fds.last
    );
}

pub(super) fn print_report(r: &Report) {
    println!(
        "hixl soak: {:.1} s, seed {}, sizes 1 B..{}, target pid {} ({} in each of {} and {})",
        r.seconds,
        r.seed,
        human(r.max_size),
        r.target_pid,
        human(r.region_bytes_each),
        REGIONS[0],
        REGIONS[1]
    );
    for l in &r.lanes {
        println!("{} ({} workers): {}", l.transport, l.workers, l.route);
        println!(
            "  transfers: submitted {} = completed {} + failed {} + dropped {}; {:.0}/s, {:.1} MB/s",
            l.submitted, l.completed, l.failed, l.dropped, l.transfers_per_s, l.mb_per_s
        );
        println!(
            "  {} descriptors; {} WRITEs ({}) and {} READs ({}) completed; {} verified by READs",
            l.descriptors,
            l.writes_completed,
            human(l.bytes_written),
            l.reads_completed,
            human(l.bytes_read),
            human(l.bytes_verified)
        );
        println!(
            "  awaited transfers: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (bucket upper ends)",
            l.latency_p50_ms, l.latency_p99_ms, l.latency_max_ms
        );
        println!(
            "  failed by kind: {}; tiny timeouts {} ({} expired); taints of dropped and timed-out ops ended {} times when the engine drained ({} waits for it)",
            kinds(&l.failed_by_kind),
            l.tiny_timeouts,
            l.tiny_timeouts_expired,
            l.taint_reclaims,
            l.starved_steps
        );
        for (k, e) in &l.failure_examples {
            println!("    first {k}: {e}");
        }
        println!(
            "  notifies: {} sent, {} acked, {} failed ({}); the target received {}, {} out of order",
            l.notifies_sent,
            l.notifies_acked,
            l.notifies_failed,
            kinds(&l.notify_failed_by_kind),
            l.target_seq_received,
            l.target_seq_out_of_order
        );
        println!(
            "  target checked {} ranges ({}) after the data's notifies",
            l.target_verified,
            human(l.target_verified_bytes)
        );
        println!(
            "  cuts: {} abrupt, {} abrupt with at-once reconnect, {} graceful; {} connects ({} retries); longest drain after a cut {:.1} ms; most ops in flight (sampled) {}; in flight at the end {}",
            l.cuts_abrupt,
            l.cuts_abrupt_fast_reconnect,
            l.cuts_graceful,
            l.connects,
            l.connect_retries,
            l.max_drain_ms,
            l.max_ops_in_flight,
            l.ops_in_flight_at_end
        );
    }
    println!(
        "memory ({} samples every {} ms; warm-up {:.1} s; growth bounds: initiator VmRSS +{}, RssAnon +{}; target VmRSS +{}, RssAnon +{}; fds +{}):",
        r.rss.samples,
        r.rss.every_ms,
        r.rss.warmup_s,
        mib(r.rss.initiator.vmrss_bound),
        mib(r.rss.initiator.rss_anon_bound),
        mib(r.rss.target.vmrss_bound),
        mib(r.rss.target.rss_anon_bound),
        r.rss.fd_bound
    );
    print_mem("initiator", &r.rss.initiator);
    print_mem("target", &r.rss.target);
    if r.ok {
        println!("OK");
    } else {
        println!("FAILED: {} violation(s)", r.violation_count);
        for v in &r.violations {
            println!("  - {v}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_are_ordered_and_tight() {
        let mut last = 0;
        for us in [0u64, 1, 7, 8, 9, 15, 16, 100, 1000, 12345, 1 << 30] {
            let b = Latency::bucket(us);
            assert!(b >= last, "{us}");
            assert!(Latency::upper(b) >= us, "{us}: upper {}", Latency::upper(b));
            assert!(
                Latency::upper(b) <= us + us / 8 + 1,
                "{us}: upper {}",
                Latency::upper(b)
            );
            last = b;
        }
        let l = Latency::default();
        for ms in 1..=100 {
            l.record(Duration::from_millis(ms));
        }
        let p50 = l.quantile_ms(0.5);
        assert!((50.0..=57.0).contains(&p50), "{p50}");
    }

    #[test]
    fn samples_stay_bounded_and_keep_the_baseline() {
        let mut s = Samples::new();
        let at = |t: f64, warm: bool| Sample {
            t,
            warm,
            me: Mem::default(),
            target: Mem::default(),
        };
        for i in 0..100_000u64 {
            s.push(at(i as f64, i >= 777), false);
            assert!(s.v.len() <= KEEP_SAMPLES);
        }
        s.push(at(1e9, true), true);
        assert_eq!(s.v.first().map(|x| x.t), Some(0.0));
        assert_eq!(s.v.iter().find(|x| x.warm).map(|x| x.t), Some(777.0));
        assert_eq!(s.v.last().map(|x| x.t), Some(1e9));
        assert!(s.v.windows(2).all(|w| w[0].t < w[1].t));
        assert_eq!(s.taken, 100_001);
    }
}
