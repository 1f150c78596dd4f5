//! `hixl soak` as CI runs it: a short mixed workload against a real target process, over tcp
//! and fabric, with every byte verified and every op accounted for.
//!
//! `HIXL_SOAK_SECS=600 cargo test --release -p hixl-cli --test soak -- --nocapture` runs it
//! for longer.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

fn secs() -> f64 {
    std::env::var("HIXL_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| s.is_finite() && *s > 0.0)
        .unwrap_or(5.0)
}

fn drain(r: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = r {
            let _ = r.read_to_string(&mut s);
        }
        s
    })
}

/// Runs `hixl args...` to its end (killed past `limit`): exit success, stdout, stderr.
fn run(args: &[&str], limit: Duration) -> (bool, String, String) {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_hixl"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hixl");
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for hixl") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "hixl {args:?} still running after {limit:?}\nstderr:\n{}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

#[test]
fn mixed_workload_over_tcp_and_fabric_stays_correct_and_flat() {
    let secs = secs();
    let limit = Duration::from_secs_f64(secs) + Duration::from_secs(300);
    let d = secs.to_string();
    // Descriptors up to 2 MiB (two parts of hixl.TcpChunkBytes=1M): a debug build spends most
    // of a short run writing and checking patterns, and the default 4 MiB would leave few steps.
    let args = [
        "soak",
        "--duration",
        &d,
        "--seed",
        "7",
        "--max-size",
        "2M",
        "--json",
    ];
    let (ok, out, err) = run(&args, limit);
    let report: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("no JSON report ({e}):\n{out}\nstderr:\n{err}"));
    assert!(
        ok && report["ok"] == Value::Bool(true),
        "soak failed:\n{}\nstderr:\n{err}",
        serde_json::to_string_pretty(&report["violations"]).unwrap_or_default()
    );
    let lanes = report["lanes"].as_array().expect("lanes");
    let names: Vec<&str> = lanes
        .iter()
        .filter_map(|l| l["transport"].as_str())
        .collect();
    assert_eq!(names, ["tcp", "fabric"]);
    for l in lanes {
        let t = &l["transport"];
        assert_eq!(
            u(l, "submitted"),
            u(l, "completed") + u(l, "failed") + u(l, "dropped"),
            "{t}: accounting"
        );
        assert!(
            l["route"]
                .as_str()
                .is_some_and(|r| r.starts_with(t.as_str().unwrap_or("?"))),
            "{t}: served by {}",
            l["route"]
        );
        assert!(
            u(l, "writes_completed") > 0 && u(l, "reads_completed") > 0,
            "{t}: {l}"
        );
        assert!(u(l, "bytes_verified") > 0, "{t}: nothing verified: {l}");
        assert!(
            u(l, "target_verified") > 0,
            "{t}: the target checked nothing: {l}"
        );
        assert!(u(l, "notifies_acked") > 0, "{t}: no notify: {l}");
        assert!(
            u(l, "target_seq_received") >= u(l, "notifies_acked"),
            "{t}: acked notifies missing at the target: {l}"
        );
        assert_eq!(u(l, "ops_in_flight_at_end"), 0, "{t}");
    }
    let m = &report["rss"]["initiator"]["vmrss"];
    assert!(u(m, "last") > 0, "no RSS samples: {m}");
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    let limit = Duration::from_secs(60);
    let (ok, _, err) = run(&["soak", "--transport", "rdma", "--duration", "1"], limit);
    assert!(
        !ok && err.contains("--transport must be tcp, fabric or both"),
        "{err}"
    );
    let (ok, _, err) = run(&["soak", "--duration", "0"], limit);
    assert!(!ok && err.contains("--duration"), "{err}");
}
