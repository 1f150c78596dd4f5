//! `hixl bench links`: a small count of real client engines connect to one target in the
//! process, move 64 KiB each way, and the report accounts for every one of them.

use std::process::Command;

#[test]
fn bench_links_reports_every_link() {
    let out = Command::new(env!("CARGO_BIN_EXE_hixl"))
        .args([
            "bench",
            "links",
            "--peers",
            "1,8",
            "--idle",
            "0.2",
            "--settle",
            "0.2",
            "--timeout",
            "20",
            "--json",
        ])
        .output()
        .expect("run hixl bench links");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for (row, n) in rows.iter().zip([1u64, 8]) {
        assert_eq!(row["bench"], "links");
        assert_eq!(row["peers"], n);
        assert_eq!(row["connected"], n, "{row}");
        assert_eq!(row["failed"], 0, "{row}");
        assert_eq!(
            row["transfers_ok"], n,
            "every link moved its bytes both ways: {row}"
        );
        let p50 = row["connect_p50_ms"].as_f64().expect("p50");
        let p99 = row["connect_p99_ms"].as_f64().expect("p99");
        let max = row["connect_max_ms"].as_f64().expect("max");
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{row}");
        // Measured right after connect: a TCP link holds its control connection on each end,
        // and at most one more descriptor a side (data connections open with the first
        // transfer that needs them).
        let fds = row["fds_per_link"].as_f64().expect("fds");
        assert!((2.0..=4.0).contains(&fds), "{row}");
        assert!(row["idle_cpu_percent"].as_f64().expect("cpu") >= 0.0);
        assert!(row["hold_cpu_percent"].as_f64().expect("cpu") >= 0.0);
    }
}

#[test]
fn bench_links_refuses_bad_counts_naming_them() {
    let out = Command::new(env!("CARGO_BIN_EXE_hixl"))
        .args(["bench", "links", "--peers", "4,zero"])
        .output()
        .expect("run hixl bench links");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"zero\""), "{err}");
}
