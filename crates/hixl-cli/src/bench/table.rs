//! The table `hixl bench comm` prints (or its JSON lines), and the peaks after it.

use serde::Serialize;

use crate::util::{human, CliResult};

/// One measured case.
#[derive(Serialize, Debug, Clone)]
pub struct CaseResult {
    pub(crate) bench: &'static str,
    pub(crate) transport: String,
    pub(crate) op: String,
    pub(crate) block_bytes: u64,
    pub(crate) batch: u64,
    pub(crate) bytes_per_call: u64,
    pub(crate) calls: u64,
    pub(crate) gbps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) baseline: &'static str,
    pub(crate) baseline_gbps: Option<f64>,
    pub(crate) ratio_to_baseline: Option<f64>,
    pub(crate) initiator_peak_rss_mib: Option<f64>,
    pub(crate) target_peak_rss_mib: Option<f64>,
    pub(crate) registered_mib_each_side: f64,
}

/// The header of the table of cases.
pub(super) fn print_header() {
    println!(
        "{:<9} {:<5} {:>8} {:>6} {:>7} {:>8} {:>10} {:>10} {:>13} {:>6}",
        "transport",
        "op",
        "block",
        "batch",
        "calls",
        "GB/s",
        "p50",
        "p99",
        "baseline GB/s",
        "ratio"
    );
}

/// Fewer calls than this make the p99 the slowest call, which the table marks.
pub(super) const FEW: u64 = 100;

/// A latency in µs as the table prints it: in ms from 10 ms.
fn latency(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.1} us")
    }
}

/// One case: a JSON object, or a row of the table.
pub(super) fn print_case(r: &CaseResult, json: bool) -> CliResult {
    if json {
        println!("{}", crate::util::json_line(r)?);
    } else {
        println!(
            "{:<9} {:<5} {:>8} {:>6} {:>7} {:>8.2} {:>10} {:>10} {:>13} {:>6}",
            r.transport,
            r.op,
            human(r.block_bytes),
            r.batch,
            r.calls,
            r.gbps,
            latency(r.p50_us),
            format!(
                "{}{}",
                latency(r.p99_us),
                if r.calls < FEW { "*" } else { "" }
            ),
            r.baseline_gbps
                .map(|b| format!("{b:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.ratio_to_baseline
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
        );
    }
    Ok(())
}

/// The peak memory of both processes over all cases.
pub(super) fn print_peaks(results: &[CaseResult], mem: u64) {
    let peak =
        |f: fn(&CaseResult) -> Option<f64>| results.iter().filter_map(f).fold(0.0f64, f64::max);
    println!(
        "peak RSS during hixl transfers (sampled every 2 ms): initiator {:.1} MiB, target {:.1} MiB; each registers {}",
        peak(|r| r.initiator_peak_rss_mib),
        peak(|r| r.target_peak_rss_mib),
        human(mem)
    );
}
