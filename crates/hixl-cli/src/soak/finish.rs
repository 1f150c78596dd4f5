//! The end of a run: nothing may stay in flight, every op is accounted for, memory stayed
//! within its bounds; then the report.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hixl_cli::fail;

use super::args::{Args, Plan};
use super::lane::Lane;
use super::region_bytes;
use super::report::{mib, print_report, proc_mem, LaneReport, Report, RssReport, Sample};
use super::state::{get, lock, Violations};
use super::{FD_GROWTH, RSS_EVERY};
use crate::util::CliResult;

/// Waits (up to 10 s) for each lane's engine to have nothing in flight, and checks that
/// every op submitted completed, failed or was dropped. Returns the ops still in flight.
pub(super) async fn account(lanes: &[Arc<Lane>]) -> Vec<usize> {
    let mut in_flight = Vec::new();
    for l in lanes {
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
    in_flight
}

/// The memory report of both processes, with a violation for each bound exceeded.
pub(super) fn rss_report(
    a: &Args,
    plan: &Plan,
    samples: &[Sample],
    taken: u64,
    v: &Violations,
) -> RssReport {
    // The fabric initiator maps the target's pool: VmRSS counts the pages of its slots there
    // that it touched since the last reconnect, so it swings by up to their size.
    let swing = if plan.names.contains(&"fabric") {
        region_bytes(1, a.workers, plan.slot_len)
    } else {
        0
    };
    let rss = RssReport {
        samples: taken,
        samples_kept: samples.len(),
        every_ms: RSS_EVERY.as_millis() as u64,
        warmup_s: samples.iter().find(|s| s.warm).map_or(-1.0, |s| s.t),
        fd_bound: FD_GROWTH,
        initiator: proc_mem(samples, |s| s.me, a.max_rss_growth, swing),
        target: proc_mem(samples, |s| s.target, a.max_rss_growth, 0),
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
    rss
}

/// Prints the report (JSON or the summary); an error when anything was violated.
pub(super) fn conclude(
    a: &Args,
    plan: &Plan,
    secs: f64,
    target_pid: u32,
    lanes: Vec<LaneReport>,
    rss: RssReport,
    v: &Violations,
) -> CliResult {
    let count = v.count.load(Ordering::Relaxed);
    let report = Report {
        ok: count == 0,
        seed: plan.seed,
        seconds: secs,
        max_size: a.max_size,
        target_pid,
        region_bytes_each: plan.per_region,
        lanes,
        rss,
        violation_count: count,
        violations: lock(&v.list).clone(),
    };
    if a.json {
        println!("{}", crate::util::json_line(&report)?);
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
